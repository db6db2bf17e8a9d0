"""One file never takes the run down: loops, crashes, deep nesting, limits, kills, links.

Each test names the failure it provokes. The engine is made to misbehave by patching
it in this process: workers are forked from it (Linux), so they run the patched code.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import migrate.engine
from migrate import workers
from migrate.cli import main
from migrate.config import build_config
from migrate.engine import MigrationResult
from migrate.runner import FileResult, Status, execute, run

AUTOCAST = "import torch\n\nwith torch.cuda.amp.autocast():\n    y = 1\n"
MIGRATED = 'import torch\n\nwith torch.autocast("cuda", dtype=torch.float16):\n    y = 1\n'
ROOT = Path(__file__).resolve().parents[1]

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork, /proc and rlimits: Linux")


def make(root: Path, files: dict[str, str]) -> None:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)


def cli(root: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> Result:
    monkeypatch.chdir(root)
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def migrate_tree(root: Path, monkeypatch: pytest.MonkeyPatch, **options: object) -> dict[str, FileResult]:
    monkeypatch.chdir(root)
    results = run([Path(".")], build_config([Path(".")], **options))  # type: ignore[arg-type]
    return {result.path: result for result in results}


def child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


# -- symlinks (issue 11, items 1 and 4) ---------------------------------------------


def test_a_symlink_loop_in_the_tree_fails_that_path_and_the_rest_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make(tmp_path, {"t/train.py": AUTOCAST})
    (tmp_path / "t/self.py").symlink_to("self.py")
    result = cli(tmp_path, monkeypatch, "--write", "t")
    assert result.exit_code == 2
    assert "error: t/self.py: cannot follow symlink: Too many levels of symbolic links" in result.stderr
    assert (tmp_path / "t/train.py").read_text() == MIGRATED
    assert "2 files scanned, 1 changed, 0 need review, 1 failed" in result.stderr


def test_a_symlink_loop_named_on_the_command_line_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make(tmp_path, {"train.py": AUTOCAST})
    (tmp_path / "self.py").symlink_to("self.py")
    result = cli(tmp_path, monkeypatch, "--write", "self.py", "train.py")
    assert result.exit_code == 2
    assert "error: self.py: cannot read: Too many levels of symbolic links" in result.stderr
    assert (tmp_path / "train.py").read_text() == MIGRATED


def test_a_symlink_to_a_file_in_the_tree_is_migrated_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make(tmp_path, {"z_real.py": AUTOCAST})
    (tmp_path / "a_link.py").symlink_to("z_real.py")  # sorts first: the real name still wins
    result = cli(tmp_path, monkeypatch, "--write", ".")
    assert result.exit_code == 0, result.output
    assert "1 file scanned, 1 changed, 0 need review, 0 failed" in result.stderr
    assert "migrated z_real.py" in result.stderr
    assert (tmp_path / "a_link.py").is_symlink()
    assert (tmp_path / "z_real.py").read_text() == MIGRATED


def test_a_symlink_leading_outside_the_paths_is_not_followed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make(tmp_path, {"outside/shared.py": AUTOCAST, "project/train.py": AUTOCAST})
    (tmp_path / "project/shared.py").symlink_to(tmp_path / "outside/shared.py")
    result = cli(tmp_path, monkeypatch, "--write", "project")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "outside/shared.py").read_text() == AUTOCAST
    assert (tmp_path / "project/train.py").read_text() == MIGRATED
    assert f"note: project/shared.py: not followed: a symlink to {tmp_path / 'outside/shared.py'}" in result.stderr
    # Named on the command line, the link is followed: the user asked for that file.
    named = cli(tmp_path, monkeypatch, "--write", "project/shared.py")
    assert named.exit_code == 0, named.output
    assert (tmp_path / "outside/shared.py").read_text() == MIGRATED


# -- input the parsers cannot take (items 2 and 5) ----------------------------------


def test_deep_nesting_fails_that_file_before_libcst_sees_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 1,500 brackets crash libcst's native parser (SIGSEGV); Python's parser refuses them.
    deep = "from apex import amp\nx = " + "(" * 1500 + "1" + ")" * 1500 + "\n"
    make(tmp_path, {"a.py": AUTOCAST, "deep.py": deep, "z.py": AUTOCAST})
    result = cli(tmp_path, monkeypatch, "--write", "-j", "2", ".")
    assert result.exit_code == 2
    assert "error: deep.py: cannot parse: line 2, column 205: too many nested parentheses" in result.stderr
    assert (tmp_path / "a.py").read_text() == MIGRATED and (tmp_path / "z.py").read_text() == MIGRATED
    assert "3 files scanned, 2 changed, 0 need review, 1 failed" in result.stderr


def test_valid_python_libcst_cannot_parse_is_not_called_unparseable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make(tmp_path, {"grammar.py": "from apex import amp\n(x): int = 1\n"})
    [result] = migrate_tree(tmp_path, monkeypatch).values()
    assert result.status is Status.FAILED
    assert result.error.startswith(
        "cannot migrate: libcst (the parser ampmigrate rewrites with) does not support this valid Python: line 2"
    )


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="the syntax is valid from Python 3.12 on")
def test_syntax_newer_than_the_running_python_cannot_parse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make(tmp_path, {"new.py": "import torch\ntype Batch = list[int]\nwith torch.cuda.amp.autocast():\n    y = 1\n"})
    [result] = migrate_tree(tmp_path, monkeypatch, write=True).values()
    assert result.status is Status.FAILED
    assert result.error == "cannot parse: line 2, column 6: invalid syntax"


def test_input_that_does_not_compile_is_not_an_internal_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Python parses it, and the compiler refuses it: the input's fault, reported as such.
    make(tmp_path, {"script.py": AUTOCAST + "return y\n"})
    [result] = migrate_tree(tmp_path, monkeypatch, write=True).values()
    assert result.status is Status.FAILED
    assert result.error == "cannot parse: line 5, column 1: 'return' outside function"
    assert (tmp_path / "script.py").read_text() == AUTOCAST + "return y\n"


# -- a worker that dies (item 2) ------------------------------------------------------


def crash_on_poison(source: str, options: object) -> MigrationResult:
    if "poison" in source:
        import faulthandler

        faulthandler.disable()  # pytest's would print this worker's stack: expected here
        os.kill(os.getpid(), signal.SIGSEGV)
    return REAL_MIGRATE(source, options)  # type: ignore[arg-type]


REAL_MIGRATE = migrate.engine.migrate_source


@linux_only
@pytest.mark.parametrize("jobs", [1, 2])
def test_a_crashing_parse_fails_its_file_and_the_worker_is_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, jobs: int
) -> None:
    monkeypatch.setattr(migrate.engine, "migrate_source", crash_on_poison)
    files = {f"m{i}.py": AUTOCAST for i in range(6)}
    files["m2.py"] = "# poison\n" + AUTOCAST
    files["m4.py"] = "# poison\n" + AUTOCAST
    make(tmp_path, files)
    results = migrate_tree(tmp_path, monkeypatch, write=True, jobs=jobs)
    for name in ("m2.py", "m4.py"):
        assert results[name].status is Status.FAILED
        assert results[name].error.startswith("the worker process crashed (SIGSEGV) on this file")
        assert (tmp_path / name).read_text() == "# poison\n" + AUTOCAST
    for name in ("m0.py", "m1.py", "m3.py", "m5.py"):
        assert results[name].status is Status.CHANGED and results[name].written
        assert (tmp_path / name).read_text() == MIGRATED


def allocate_too_much(source: str, options: object) -> MigrationResult:
    if "greedy" in source:
        bytearray(workers.MEMORY_LIMIT * 2)
    return REAL_MIGRATE(source, options)  # type: ignore[arg-type]


@linux_only
def test_a_file_that_needs_too_much_memory_fails_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers, "MEMORY_LIMIT", 256 << 20)
    monkeypatch.setattr(migrate.engine, "migrate_source", allocate_too_much)
    make(tmp_path, {"greedy.py": "# greedy\n" + AUTOCAST, "train.py": AUTOCAST})
    results = migrate_tree(tmp_path, monkeypatch, write=True, jobs=1)
    assert results["greedy.py"].status is Status.FAILED
    assert results["greedy.py"].error == "ran out of memory (limit 256 MiB a worker); not written"
    assert results["train.py"].status is Status.CHANGED


def spin_on_slow(source: str, options: object) -> MigrationResult:
    while "slow" in source:
        pass
    return REAL_MIGRATE(source, options)  # type: ignore[arg-type]


@linux_only
def test_a_file_that_takes_too_long_fails_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers, "CPU_SECONDS", 1.0)
    monkeypatch.setattr(workers, "CPU_SECONDS_PER_MB", 0.0)
    monkeypatch.setattr(migrate.engine, "migrate_source", spin_on_slow)
    make(tmp_path, {"slow.py": "# slow\n" + AUTOCAST, "train.py": AUTOCAST})
    results = migrate_tree(tmp_path, monkeypatch, write=True, jobs=1)
    assert results["slow.py"].status is Status.FAILED
    assert results["slow.py"].error == "took more CPU time than allowed for its size; stopped"
    assert results["train.py"].status is Status.CHANGED


# -- killed and interrupted runs (items 3 and 9) ------------------------------------

SLOW_DRIVER = textwrap.dedent("""
    import sys, time
    import migrate.engine
    real = migrate.engine.migrate_source

    def slow(source, options):
        time.sleep(0.4)
        return real(source, options)

    migrate.engine.migrate_source = slow
    from migrate.cli import main
    main(sys.argv[1:])
    """)


def start_slow_run(root: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", SLOW_DRIVER, *args],
        cwd=root,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_until(condition: object, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > end:
            raise AssertionError("timed out")
        time.sleep(0.05)


def migrated_count(root: Path, count: int) -> int:
    contents = [(root / f"m{i:02d}.py").read_text() for i in range(count)]
    assert all(content in (AUTOCAST, MIGRATED) for content in contents)  # never half-written
    return contents.count(MIGRATED)


@linux_only
def test_ctrl_c_while_migrating_writes_nothing_and_exits_130(tmp_path: Path) -> None:
    # Project mode writes only once every group is settled: a Ctrl-C while the workers
    # migrate leaves every file as it was, and no changed file is reported as done.
    make(tmp_path, {f"m{i:02d}.py": AUTOCAST for i in range(20)})
    child = start_slow_run(tmp_path, "--write", "-j", "1", ".")
    wait_until(lambda: len(children_of(child.pid)) >= 1)
    time.sleep(1.0)  # a few files done (0.4 s each), most not
    child.send_signal(signal.SIGINT)
    _, stderr = child.communicate(timeout=60)
    assert child.returncode == 130, stderr
    assert migrated_count(tmp_path, 20) == 0
    assert "migrated m" not in stderr
    assert "0 changed" in stderr.splitlines()[-1]
    assert "interrupted" in stderr.splitlines()[-1]
    assert not [path for path in os.listdir(tmp_path) if path.endswith(".ampmigrate-tmp")]


def children_of(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as stream:
        return [int(child) for child in stream.read().split()]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stream:
            return stream.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@linux_only
def test_workers_exit_when_the_main_process_is_killed(tmp_path: Path) -> None:
    make(tmp_path, {f"m{i:02d}.py": AUTOCAST for i in range(20)})
    child = start_slow_run(tmp_path, "--write", "-j", "2", ".")
    wait_until(lambda: len(children_of(child.pid)) == 2)
    time.sleep(1.0)  # both workers busy with files
    worker_pids = children_of(child.pid)
    child.kill()
    child.communicate(timeout=30)
    wait_until(lambda: not any(alive(pid) for pid in worker_pids), timeout=10)
    time.sleep(1.0)
    # workers never write (the main process writes once the project is settled)
    assert migrated_count(tmp_path, 20) == 0


# -- leftovers of killed runs (item 3) -----------------------------------------------


@linux_only
def test_a_leftover_temporary_file_is_removed_by_the_next_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make(tmp_path, {"pkg/train.py": AUTOCAST, "pkg/.train.py.x1y2.ampmigrate-tmp": "half"})
    checked = cli(tmp_path, monkeypatch, "--check", ".")
    assert checked.exit_code == 1
    assert (
        "note: pkg/.train.py.x1y2.ampmigrate-tmp: a temporary file left by an interrupted run "
        "(the next --write removes it)" in checked.stderr
    )
    assert (tmp_path / "pkg/.train.py.x1y2.ampmigrate-tmp").exists()
    written = cli(tmp_path, monkeypatch, "--write", "pkg/train.py")
    assert written.exit_code == 0, written.output
    assert "note: pkg/.train.py.x1y2.ampmigrate-tmp: removed" in written.stderr
    assert sorted(os.listdir(tmp_path / "pkg")) == ["train.py"]


@linux_only
def test_a_temporary_file_being_written_is_left_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import fcntl

    make(tmp_path, {"train.py": AUTOCAST, ".train.py.busy.ampmigrate-tmp": "in progress"})
    with open(tmp_path / ".train.py.busy.ampmigrate-tmp", "rb") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)  # as a live writer holds it
        result = cli(tmp_path, monkeypatch, "--write", ".")
    assert result.exit_code == 0, result.output
    assert "ampmigrate-tmp" not in result.stderr
    assert (tmp_path / ".train.py.busy.ampmigrate-tmp").read_text() == "in progress"


# -- verify without torch (item 9) ---------------------------------------------------


def test_verify_without_torch_says_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *args: None if name == "torch" else real_find_spec(name, *args)
    )
    make(tmp_path, {"old.py": AUTOCAST, "new.py": MIGRATED})
    result = cli(tmp_path, monkeypatch, "verify", "old.py", "new.py")
    assert result.exit_code == 2
    assert "`ampmigrate verify` needs torch" in result.stderr
    assert "pip install 'ampmigrate[torch]'" in result.stderr
    assert "Traceback" not in result.output


def test_interrupted_outcome_is_empty_of_unreached_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The Ctrl-C path in-process: the first candidate raises the flag; nothing else runs.
    import migrate.runner as runner

    real_front = runner._front

    def interrupt_then_front(*args: object) -> object:
        os.kill(os.getpid(), signal.SIGINT)
        return real_front(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(runner, "_front", interrupt_then_front)
    make(tmp_path, {"a.py": AUTOCAST, "b.py": AUTOCAST})
    monkeypatch.chdir(tmp_path)
    outcome = execute([Path(".")], build_config([Path(".")], write=True))
    assert outcome.interrupted
    assert len(outcome.results) == 1  # the file in hand was finished, the next never started
    assert [(tmp_path / name).read_text() for name in ("a.py", "b.py")].count(MIGRATED) == 1
