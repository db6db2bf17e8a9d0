"""The command line: exit codes, --check/--write/--diff, bad files, subcommands."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from migrate import entry
from migrate.cli import main

# The engine rewrites this (no finding)...
AUTOCAST = "import torch\n\nwith torch.cuda.amp.autocast():\n    y = 1\n"
AUTOCAST_MIGRATED = 'import torch\n\nwith torch.autocast("cuda", dtype=torch.float16):\n    y = 1\n'
# ...leaves this as it is, asking for review (AMP032)...
NEEDS_REVIEW = "import torch\nfrom apex import amp\n\namp.half_function(torch.mm, torch.bmm)\n"
# ...and never touches this.
CLEAN = "import torch\n\nx = torch.ones(2)  # no apex here\n"


ROOT = Path(__file__).resolve().parents[1]


def subprocess_env() -> dict[str, str]:
    """The environment for a child Python that imports this checkout, installed or not."""
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }


def invoke(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> Result:
    monkeypatch.chdir(tmp_path)
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def make(tmp_path: Path, files: dict[str, str | bytes]) -> None:
    for name, content in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_bytes(content.encode())


def test_default_prints_diff_and_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make(tmp_path, {"train.py": AUTOCAST, "clean.py": CLEAN})
    result = invoke(tmp_path, monkeypatch, ".")
    assert result.exit_code == 0
    assert "--- a/train.py\n+++ b/train.py\n" in result.stdout
    assert '-with torch.cuda.amp.autocast():\n+with torch.autocast("cuda", dtype=torch.float16):\n' in result.stdout
    assert "clean.py" not in result.stdout
    assert (tmp_path / "train.py").read_text() == AUTOCAST
    assert result.stderr.strip().splitlines()[-1] == (
        "ampmigrate: 2 files scanned, 1 would change, 0 need review, 0 failed"
    )


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_printed_diff_applies_with_git_apply(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make(tmp_path, {"pkg/train.py": AUTOCAST})
    diff = invoke(tmp_path, monkeypatch, "pkg").stdout
    (tmp_path / "fix.patch").write_text(diff)
    subprocess.run(["git", "apply", "fix.patch"], cwd=tmp_path, check=True)
    assert (tmp_path / "pkg/train.py").read_text() == AUTOCAST_MIGRATED


def test_write_rewrites_and_a_second_run_finds_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make(tmp_path, {"train.py": AUTOCAST, "clean.py": CLEAN})
    written = invoke(tmp_path, monkeypatch, "--write", ".")
    assert written.exit_code == 0
    assert written.stdout == ""
    assert "migrated train.py" in written.stderr
    assert "1 changed" in written.stderr
    assert (tmp_path / "train.py").read_text() == AUTOCAST_MIGRATED
    assert (tmp_path / "clean.py").read_text() == CLEAN
    again = invoke(tmp_path, monkeypatch, "--check", ".")
    assert again.exit_code == 0, again.output
    assert "0 would change" in again.stderr


def test_write_with_diff_shows_what_was_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make(tmp_path, {"train.py": AUTOCAST})
    result = invoke(tmp_path, monkeypatch, "--write", "--diff", "train.py")
    assert result.exit_code == 0
    assert "+with torch.autocast" in result.stdout
    assert (tmp_path / "train.py").read_text() == AUTOCAST_MIGRATED


def test_check_exits_1_when_a_file_would_change(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make(tmp_path, {"train.py": AUTOCAST})
    result = invoke(tmp_path, monkeypatch, "--check", ".")
    assert result.exit_code == 1
    assert result.stdout == ""  # --check alone prints no diff
    assert "would migrate train.py" in result.stderr
    assert (tmp_path / "train.py").read_text() == AUTOCAST


def test_check_exits_1_when_a_file_needs_review(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make(tmp_path, {"review.py": NEEDS_REVIEW})
    result = invoke(tmp_path, monkeypatch, "--check", "review.py")
    assert result.exit_code == 1
    assert result.stdout.startswith("review.py:4:1: AMP032 ")
    assert "1 needs review" in result.stderr
    assert (tmp_path / "review.py").read_text() == NEEDS_REVIEW


def test_check_exits_0_when_nothing_is_left(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make(tmp_path, {"clean.py": CLEAN, "done.py": AUTOCAST_MIGRATED})
    result = invoke(tmp_path, monkeypatch, "--check", ".")
    assert result.exit_code == 0
    assert result.stdout == ""


def test_review_does_not_fail_without_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make(tmp_path, {"review.py": NEEDS_REVIEW})
    result = invoke(tmp_path, monkeypatch, "review.py")
    assert result.exit_code == 0
    assert "AMP032" in result.stdout


def test_syntax_error_is_reported_and_other_files_still_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = "from apex import amp\ndef f(:\n    pass\n"
    make(tmp_path, {"a_broken.py": broken, "b_train.py": AUTOCAST})
    result = invoke(tmp_path, monkeypatch, "--write", ".")
    assert result.exit_code == 2
    assert "error: a_broken.py: cannot parse: line 2" in result.stderr
    assert (tmp_path / "a_broken.py").read_text() == broken
    assert (tmp_path / "b_train.py").read_text() == AUTOCAST_MIGRATED
    assert "2 files scanned, 1 changed, 0 need review, 1 failed" in result.stderr


def test_undecodable_bytes_are_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    undecodable = b"from apex import amp\nname = '\xff\xfe'\n"  # not UTF-8, no coding cookie
    make(tmp_path, {"latin.py": undecodable})
    result = invoke(tmp_path, monkeypatch, "--write", "latin.py")
    assert result.exit_code == 2
    assert "error: latin.py: cannot decode:" in result.stderr
    assert (tmp_path / "latin.py").read_bytes() == undecodable


def test_unreadable_file_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests may run as root, for whom chmod 000 stops nothing: refuse the open instead.
    make(tmp_path, {"secret.py": AUTOCAST, "train.py": AUTOCAST})
    real_open = os.open

    def refusing_open(path: str, *args: object, **kwargs: object) -> int:
        if str(path).endswith("secret.py"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", refusing_open)
    result = invoke(tmp_path, monkeypatch, "--write", ".")
    assert result.exit_code == 2
    assert "error: secret.py: cannot read: Permission denied" in result.stderr
    assert (tmp_path / "secret.py").read_text() == AUTOCAST
    assert (tmp_path / "train.py").read_text() == AUTOCAST_MIGRATED


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root reads any file")
def test_unreadable_file_by_permissions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make(tmp_path, {"secret.py": AUTOCAST})
    (tmp_path / "secret.py").chmod(0)
    result = invoke(tmp_path, monkeypatch, "secret.py")
    assert result.exit_code == 2
    assert "cannot read" in result.stderr


def test_dangling_symlink_and_fifo_named_on_the_command_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "gone.py").symlink_to(tmp_path / "nowhere.py")
    os.mkfifo(tmp_path / "pipe.py")  # opening it would block: it must not be read
    result = invoke(tmp_path, monkeypatch, "gone.py", "pipe.py")
    assert result.exit_code == 2
    assert "error: gone.py: cannot read: No such file or directory" in result.stderr
    assert "error: pipe.py: not a regular file" in result.stderr


def test_missing_path_is_an_error_but_the_rest_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make(tmp_path, {"train.py": AUTOCAST})
    result = invoke(tmp_path, monkeypatch, "--write", "nope/", "train.py")
    assert result.exit_code == 2
    assert "error: nope: no such file or directory" in result.stderr
    assert (tmp_path / "train.py").read_text() == AUTOCAST_MIGRATED


@pytest.mark.parametrize(
    "args",
    [
        ["--write", "--check", "."],
        ["--dtype", "float64", "."],
        ["--device", "CUDA!", "."],
        ["--scaler-name", "not an identifier", "."],
        ["--jobs", "0", "."],
        ["--output-format", "xml", "."],
        ["--no-such-option", "."],
        ["--select", "torch_cuda_amp,no_such_rule", "."],
    ],
    ids=lambda args: args[0],
)
def test_usage_errors_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str]) -> None:
    make(tmp_path, {"train.py": AUTOCAST})
    result = invoke(tmp_path, monkeypatch, *args)
    assert result.exit_code == 2
    assert (tmp_path / "train.py").read_text() == AUTOCAST


def test_select_runs_only_the_named_rules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make(tmp_path, {"train.py": AUTOCAST})
    skipped = invoke(tmp_path, monkeypatch, "--check", "--select", "amp_initialize", ".")
    assert skipped.exit_code == 0, skipped.output  # the torch.cuda.amp rule was not selected
    selected = invoke(tmp_path, monkeypatch, "--check", "--select", "torch_cuda_amp", ".")
    assert selected.exit_code == 1


def test_help_names_the_default_command_and_verify(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    result = invoke(tmp_path, monkeypatch, "--help")
    assert result.exit_code == 0
    assert "ampmigrate [OPTIONS] PATH..." in result.stdout
    assert "ampmigrate verify [OPTIONS] ORIGINAL MIGRATED" in result.stdout
    assert "--check" in result.stdout and "--write" in result.stdout


def test_verify_subcommand_delegates_to_run_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import migrate.verify

    calls = []

    def fake_run_cli(
        original: str,
        migrated: str,
        steps: int,
        device: str,
        script_args: tuple[str, ...],
        **options: object,
    ) -> int:
        calls.append((original, migrated, steps, device, script_args))
        return 1

    monkeypatch.setattr(migrate.verify, "run_cli", fake_run_cli)
    make(tmp_path, {"old.py": NEEDS_REVIEW, "new.py": CLEAN})
    result = invoke(
        tmp_path,
        monkeypatch,
        "verify",
        "old.py",
        "new.py",
        "--steps",
        "3",
        "--device",
        "cpu",
        "--",
        "--lr",
        "0.1",
    )
    assert result.exit_code == 1
    assert calls == [("old.py", "new.py", 3, "cpu", ("--lr", "0.1"))]


def test_a_folder_named_verify_is_migrated_via_dot_slash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make(tmp_path, {"verify/train.py": AUTOCAST})
    result = invoke(tmp_path, monkeypatch, "--check", "./verify")
    assert result.exit_code == 1
    assert "would migrate verify/train.py" in result.stderr


def test_a_folder_named_like_the_hidden_default_command_is_a_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make(tmp_path, {"migrate/train.py": AUTOCAST})
    result = invoke(tmp_path, monkeypatch, "migrate", "--check")
    assert result.exit_code == 1
    assert "would migrate migrate/train.py" in result.stderr


def test_codemod_imports_neither_torch_nor_libcst_for_clean_files(
    tmp_path: Path,
) -> None:
    # Nor what only a file to migrate, or another output format, needs: a pre-commit run
    # on a file without Apex has a budget of 0.1 s, most of it Python's and click's start.
    # (tempfile and shutil are not checked: pruning another version's cache folder, which
    # depends on what ran before in the same cache, needs them.)
    (tmp_path / "clean.py").write_text("import numpy as np\n\nx = np.ones(2)\n")
    # older than the stat index's racy window, so that the run records it (and saves the index)
    time.sleep(2.1)
    probe = (
        "import sys\n"
        "from migrate.cli import main\n"
        "try:\n"
        "    main(['--check', 'clean.py'])\n"
        "except SystemExit as exit:\n"
        "    assert exit.code == 0, exit.code\n"
        "loaded = {name.split('.')[0] for name in sys.modules} | set(sys.modules)\n"
        "unwanted = {'torch', 'libcst', 'multiprocessing', 'difflib', 'migrate.engine', 'migrate.project',\n"
        "            'migrate.workers', 'migrate.findings', 'migrate.rules', 'migrate.notebook'}\n"
        "print(sorted(loaded & unwanted))\n"
    )
    output = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
        env=subprocess_env(),
    ).stdout
    assert output.strip() == "[]"


def test_python_dash_m_runs_the_cli(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(AUTOCAST)
    completed = subprocess.run(
        [sys.executable, "-m", "migrate", "--check", "train.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=subprocess_env(),
        check=False,
    )
    assert completed.returncode == 1
    assert "would migrate train.py" in completed.stderr


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_on_a_terminal_for_long_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    terminal = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.delenv("CI", raising=False)
    ticks = entry.progress_bar(300)
    for _ in range(300):
        next(ticks)
    assert "ampmigrate" in terminal.getvalue() and "100%" in terminal.getvalue()


@pytest.mark.parametrize("files, ci, terminal", [(300, "true", True), (300, None, False), (10, None, True)])
def test_no_progress_bar_in_ci_pipes_or_short_runs(
    monkeypatch: pytest.MonkeyPatch, files: int, ci: str | None, terminal: bool
) -> None:
    stream = FakeTerminal() if terminal else io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    assert list(entry.progress_bar(files)) == []
    assert stream.getvalue() == ""
