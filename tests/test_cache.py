"""The result cache: a warm run prints exactly what a cold one did, without parsing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from migrate import cache as cache_module
from migrate import runner, workers
from migrate.cache import ENV_VAR, Cache, Entry, default_cache_dir
from migrate.cli import main
from migrate.discovery import Candidate
from migrate.options import Options

ROOT = Path(__file__).resolve().parents[1]
AUTOCAST = "import torch\n\nwith torch.cuda.amp.autocast():\n    y = 1\n"
NOTEBOOK = {
    "cells": [
        {
            "cell_type": "code",
            "execution_count": None,
            "metadata": {},
            "outputs": [],
            "source": ["import torch\n", "%time x = 1\n", "with torch.cuda.amp.autocast():\n", "    y = 1"],
        }
    ],
    "metadata": {"kernelspec": {"language": "python", "name": "python3"}},
    "nbformat": 4,
    "nbformat_minor": 5,
}
TREE = {
    "train.py": AUTOCAST,
    "crlf.py": "from apex import amp\r\n\r\nmodel, opt = amp.initialize(model, opt, opt_level='O2')\r\n",
    "review.py": "import torch\nfrom apex import amp\n\namp.half_function(torch.mm, torch.bmm)\n",
    "skipped.py": "# ampmigrate: skip\n" + AUTOCAST,
    "broken.py": "from apex import amp\ndef f(:\n",
    "latin.py": "# -*- coding: latin-1 -*-\n# Entraîné\n" + AUTOCAST,
    "clean.py": "x = 1\n",
    "nb.ipynb": json.dumps(NOTEBOOK, indent=1) + "\n",
}


def make(root: Path, files: dict[str, str]) -> None:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode("latin-1" if "latin-1" in content else "utf-8"))


def cli(root: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> Result:
    monkeypatch.chdir(root)
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def no_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make any attempt to start a worker (the only place files are parsed) fail the test."""

    def refuse(self: object) -> None:
        raise AssertionError("a warm run started a worker")

    monkeypatch.setattr(workers.Pool, "_start", refuse)


@pytest.mark.parametrize(
    "args",
    [
        ["--diff"],
        ["--check"],
        ["--check", "--diff", "--output-format", "json"],
        ["--output-format", "github"],
        ["--check", "--output-format", "sarif"],
        ["--check", "--report", "report.md"],
    ],
    ids=lambda args: "-".join(arg.strip("-") for arg in args),
)
def test_a_warm_run_prints_exactly_what_the_cold_run_did(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    make(tmp_path, TREE)
    cold = cli(tmp_path, monkeypatch, *args, ".")
    cold_report = (tmp_path / "report.md").read_text() if "--report" in args else ""
    assert cold.exit_code in (1, 2), cold.output
    assert any(Path(os.environ[ENV_VAR]).rglob("*")), "the cold run stored nothing"
    no_parsing(monkeypatch)
    warm = cli(tmp_path, monkeypatch, *args, ".")
    assert (warm.exit_code, warm.stdout, warm.stderr) == (cold.exit_code, cold.stdout, cold.stderr)
    if "--report" in args:
        assert (tmp_path / "report.md").read_text() == cold_report


def test_a_write_from_the_cache_writes_the_same_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make(tmp_path / "cold", TREE)
    make(tmp_path / "warm", TREE)
    cold = cli(tmp_path / "cold", monkeypatch, "--write", ".")
    assert cli(tmp_path / "warm", monkeypatch, "--check", ".").exit_code == 2  # fills the cache
    no_parsing(monkeypatch)
    warm = cli(tmp_path / "warm", monkeypatch, "--write", ".")
    assert (warm.exit_code, warm.stdout, warm.stderr) == (cold.exit_code, cold.stdout, cold.stderr)
    for name in TREE:
        assert (tmp_path / "warm" / name).read_bytes() == (tmp_path / "cold" / name).read_bytes(), name


def test_no_cache_neither_reads_nor_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make(tmp_path, {"train.py": AUTOCAST})
    assert cli(tmp_path, monkeypatch, "--no-cache", "--check", ".").exit_code == 1
    assert not any(Path(os.environ[ENV_VAR]).rglob("*"))
    cli(tmp_path, monkeypatch, "--check", ".")  # fills it
    no_parsing(monkeypatch)
    with pytest.raises(AssertionError, match="started a worker"):
        cli(tmp_path, monkeypatch, "--no-cache", "--check", ".")


def test_other_options_are_other_entries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make(tmp_path, {"train.py": 'from apex import amp\n\nmodel, opt = amp.initialize(model, opt, opt_level="O1")\n'})
    assert '+scaler = torch.amp.GradScaler("cuda")' in cli(tmp_path, monkeypatch, ".").stdout
    assert '+scaler = torch.amp.GradScaler("cpu")' in cli(tmp_path, monkeypatch, "--device", "cpu", ".").stdout
    no_parsing(monkeypatch)
    assert '+scaler = torch.amp.GradScaler("cuda")' in cli(tmp_path, monkeypatch, ".").stdout


def test_a_damaged_entry_is_a_miss_and_is_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make(tmp_path, {"train.py": AUTOCAST})
    cold = cli(tmp_path, monkeypatch, ".")
    [entry] = [
        path
        for path in Path(os.environ[ENV_VAR]).rglob("*")
        if path.is_file() and path.parent.name not in ("index", "summaries")
    ]
    entry.write_text('{"status": "chan')
    again = cli(tmp_path, monkeypatch, ".")
    assert again.stdout == cold.stdout
    assert json.loads(entry.read_text())["status"] == "changed"


def test_a_warm_run_imports_no_libcst(tmp_path: Path) -> None:
    make(tmp_path, {"train.py": AUTOCAST, "review.py": TREE["review.py"]})
    probe = (
        "import sys\n"
        "from migrate.cli import main\n"
        "try:\n"
        "    main(['--check', '.'])\n"
        "except SystemExit as exit:\n"
        "    assert exit.code == 1, exit.code\n"
        "print(sorted({name.split('.')[0] for name in sys.modules} & {'libcst', 'multiprocessing'}))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}

    def loaded() -> str:
        completed = subprocess.run(
            [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, env=env, check=True
        )
        return completed.stdout.strip().splitlines()[-1]

    cold = loaded()  # a worker parsed the files (forked with libcst imported, on Linux)
    assert "multiprocessing" in cold
    assert loaded() == "[]"


def test_a_warm_run_imports_only_what_it_replays_with(tmp_path: Path) -> None:
    """No planning module, no parse-ahead, no pathspec: a warm run's start-up is its cost."""
    make(tmp_path, {"train.py": AUTOCAST, "review.py": TREE["review.py"], "clean.py": "x = 1\n"})
    (tmp_path / ".git").mkdir()
    (tmp_path / ".gitignore").write_text("*.pyc\nbuild/\n/docs/_build\n!keep.py\n")
    probe = (
        "import sys\n"
        "import migrate.cache\n"
        "migrate.cache._RACY_S = 0.0  # files written just now are indexed all the same\n"
        "read = []\n"
        "load = migrate.cache._load_dict\n"
        "kind = lambda path: path.suffix or ('summaries' if path.parent.name == 'summaries' else path.name)\n"
        "migrate.cache._load_dict = lambda path: read.append(kind(path)) or load(path)\n"
        "from migrate.cli import main\n"
        "try:\n"
        "    main(['--check', '.'])\n"
        "except SystemExit as exit:\n"
        "    assert exit.code == 1, exit.code\n"
        "print(sorted(read))\n"
        "print(sorted(set(sys.modules) & {'libcst', 'pathspec', 'migrate.project', 'migrate.ahead'}))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env[ENV_VAR] = str(tmp_path / "cache")

    def loaded() -> list[str]:
        completed = subprocess.run(
            [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, env=env, check=True
        )
        return completed.stdout.strip().splitlines()[-2:]

    # cold: all of them, and the summaries read (a first run finds none)
    assert loaded() == [
        "['.plans', 'gitignore', 'summaries']",
        "['libcst', 'migrate.ahead', 'migrate.project', 'pathspec']",
    ]
    # warm: the recorded plan and the translations only (the stat index is no _load_dict)
    assert loaded() == ["['.plans', 'gitignore']", "[]"]


def test_concurrent_runs_share_the_cache_safely(tmp_path: Path) -> None:
    make(tmp_path, {f"m{i}.py": AUTOCAST.replace("y = 1", f"y = {i}") for i in range(12)})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", "migrate", "--diff", "-j", "2", "."]
    runs = [
        subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    outputs = {run.communicate(timeout=300) for run in runs}
    assert len(outputs) == 1
    assert "12 would change" in next(iter(outputs))[1]
    leftovers = [path for path in Path(os.environ[ENV_VAR]).rglob(".*") if path.is_file()]
    assert leftovers == []


def test_the_cache_folder_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "explicit"
    monkeypatch.delenv(ENV_VAR)
    assert default_cache_dir() == tmp_path / "xdg" / "ampmigrate"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")  # the XDG spec says: ignore it
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    if sys.platform.startswith("linux"):
        assert default_cache_dir() == tmp_path / "home" / ".cache" / "ampmigrate"


def test_entries_round_trip_and_keys_depend_on_content_kind_and_options(tmp_path: Path) -> None:
    cache = Cache(tmp_path, Options(), fingerprint="f1")
    entry = Entry.changed(
        ((None, 3, 1, "AMP001", "O2 ☃", True), (2, 1, 5, "AMP032", "x", False)),
        b"\xef\xbb\xbfbytes\r\n\x00",
        encoding="utf-8-sig",
        diffs=(("", "@@ -1 +1 @@\n-a\n+b\n"),),
        first_change=3,
        migrated_apis=("amp.initialize",),
    )
    key = cache.key(b"data", notebook=False)
    cache.put(key, entry)
    assert cache.get(key) == entry
    assert entry.new_data == b"\xef\xbb\xbfbytes\r\n\x00"
    assert key != cache.key(b"data", notebook=True) != cache.key(b"dat4", notebook=True)
    assert key != Cache(tmp_path, Options(dtype="bfloat16"), fingerprint="f1").key(b"data", notebook=False)
    assert key != Cache(tmp_path, Options(), fingerprint="f2").key(b"data", notebook=False)
    assert Cache(tmp_path, Options(), fingerprint="f2").get(key) is None


def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the display names of the files the run reads."""
    read: list[str] = []
    real_read = runner._read

    def recording(candidate: Candidate, *args: object, **kwargs: object) -> object:
        read.append(candidate.display)
        return real_read(candidate, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(runner, "_read", recording)
    return read


def test_files_the_prefilter_cleared_are_not_even_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Files that pass the pre-filter are read on every run (project mode indexes their
    # text before their facts, and so their cache keys, are known); no file is parsed.
    monkeypatch.setattr(cache_module, "_RACY_S", 0.0)  # files written just now may be indexed
    make(tmp_path, {**TREE, "sub/other.py": "y = 2\n"})
    cold = cli(tmp_path, monkeypatch, "--check", "--diff", ".")
    read = reads(monkeypatch)
    no_parsing(monkeypatch)
    warm = cli(tmp_path, monkeypatch, "--check", "--diff", ".")
    assert (warm.exit_code, warm.stdout, warm.stderr) == (cold.exit_code, cold.stdout, cold.stderr)
    assert "clean.py" not in read and "sub/other.py" not in read
    assert sorted(read) == sorted(name for name in TREE if name != "clean.py")


def test_a_file_changed_in_place_is_read_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache_module, "_RACY_S", 0.0)
    make(tmp_path, {"train.py": AUTOCAST.replace(".amp.", ".AMP.")})  # cleared by the pre-filter
    assert cli(tmp_path, monkeypatch, "--check", ".").exit_code == 0
    before = (tmp_path / "train.py").stat()
    # Same size, same modification time: only the change time tells.
    (tmp_path / "train.py").write_text(AUTOCAST)
    os.utime(tmp_path / "train.py", ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (tmp_path / "train.py").stat().st_size == before.st_size
    again = cli(tmp_path, monkeypatch, "--check", ".")
    assert again.exit_code == 1, again.output


def test_a_file_changed_just_before_the_run_is_not_indexed(tmp_path: Path) -> None:
    index = Cache(tmp_path, Options(), fingerprint="f").index(tmp_path)
    (tmp_path / "m.py").write_text("x = 1\n")
    info = (tmp_path / "m.py").stat()
    index.record(str(tmp_path / "m.py"), info, "", looked_at=info.st_ctime + 0.5)
    assert index.lookup(str(tmp_path / "m.py"), info) is None
    index.record(str(tmp_path / "m.py"), info, "", looked_at=info.st_ctime + 5)
    assert index.lookup(str(tmp_path / "m.py"), info) == ""
    index.save()
    assert Cache(tmp_path, Options(), fingerprint="f").index(tmp_path).lookup(str(tmp_path / "m.py"), info) == ""


PROJECT_CASES = sorted(path for path in (ROOT / "fixtures" / "project").iterdir() if (path / "in").is_dir())


@pytest.mark.parametrize("case", PROJECT_CASES, ids=[case.name for case in PROJECT_CASES])
def test_a_warm_project_run_writes_what_the_cold_one_did(
    case: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Project mode: entries are keyed on each file's facts too, and the files a group
    # settles by migrating again are answered with the entries of their new facts.
    import shutil

    shutil.copytree(case / "in", tmp_path / "cold")
    shutil.copytree(case / "in", tmp_path / "warm")
    cold = cli(tmp_path / "cold", monkeypatch, "--write", ".")
    cli(tmp_path / "warm", monkeypatch, "--check", ".")  # fills the cache
    no_parsing(monkeypatch)
    warm = cli(tmp_path / "warm", monkeypatch, "--write", ".")
    assert (warm.exit_code, warm.stdout, warm.stderr) == (cold.exit_code, cold.stdout, cold.stderr)
    for path in (tmp_path / "cold").rglob("*.py"):
        relative = path.relative_to(tmp_path / "cold")
        assert (tmp_path / "warm" / relative).read_bytes() == path.read_bytes(), relative


def test_the_key_covers_every_option_facts_included(tmp_path: Path) -> None:
    from migrate.cache import options_key
    from migrate.options import ModuleFacts

    cache = Cache(tmp_path, Options(), fingerprint="f")
    plain = cache.key(b"data", False, Options())
    assert plain == cache.key(b"data", False)
    assert plain != cache.key(b"data", False, Options(facts=ModuleFacts(frozen="kept")))
    assert plain != cache.key(b"data", False, Options(fused_optimizers=False))
    assert plain != cache.key(b"data", False, Options(facts=ModuleFacts(exported=frozenset({"amp"}))))
    # the same options give the same text in every process, whatever the string hashing
    options = Options(select=frozenset({"b", "a", "c"}), facts=ModuleFacts(exported=frozenset({"x", "y", "z"})))
    script = "from migrate.cache import options_key; from migrate.options import *; print(options_key(eval(input())))"
    texts = {
        subprocess.run(
            [sys.executable, "-c", script],
            input=repr(options),
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
            check=True,
        ).stdout.strip()
        for seed in ("1", "2", "3")
    }
    assert texts == {options_key(options)}


TRAINER = (ROOT / "fixtures" / "project" / "initialize_in_main_loop_in_trainer" / "in").resolve()


def _project(root: Path, **extra: str) -> None:
    make(root, {name: (TRAINER / name).read_text() for name in ("main.py", "trainer.py")})
    make(root, extra)


def _check_main(root: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> tuple[int, str]:
    result = cli(root, monkeypatch, "--diff", *args, ".")
    return result.exit_code, result.stdout + result.stderr


@pytest.mark.parametrize(
    "edit",
    [
        # trainer.py (Apex) gets a module-level call of train: the scaler cannot be passed to it,
        # so main.py's setup stays as it was
        ("trainer.py", lambda text: text + "\ntrain(None, None, [], 0)\n"),
        # the loop reached through a module without Apex (read only as context) moves away
        ("engine.py", lambda text: "def train(*args, **kwargs):\n    pass\n"),
    ],
    ids=["apex-module", "context-module"],
)
def test_an_edit_that_changes_the_plan_changes_the_other_modules_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, edit: tuple[str, object]
) -> None:
    # Each file's entry is keyed on its bytes and its facts, and the facts come from the
    # project summaries: an edit of one module must reach the results of the others, also
    # when the module edited is only read as context (its summary stored, found by its stat).
    monkeypatch.setattr(cache_module, "_RACY_S", 0.0)  # files written just now may be indexed
    _project(tmp_path, **{"engine.py": '"""Re-exports the loop."""\nfrom trainer import train\n'})
    (tmp_path / "main.py").write_text((tmp_path / "main.py").read_text().replace("from trainer", "from engine"))
    before = _check_main(tmp_path, monkeypatch)
    assert "train(model, optimizer, loader, epoch, scaler=scaler)" in before[1]
    assert _check_main(tmp_path, monkeypatch) == before  # warm
    name, change = edit
    path = tmp_path / name
    path.write_text(change(path.read_text()))  # type: ignore[operator]
    after = _check_main(tmp_path, monkeypatch)
    assert after == _check_main(tmp_path, monkeypatch, "--no-cache")
    assert "scaler=scaler" not in after[1]
    assert after != before


def test_a_warm_project_run_summarizes_no_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from migrate import project

    monkeypatch.setattr(cache_module, "_RACY_S", 0.0)
    _project(tmp_path, **{"engine.py": "from trainer import train\n"})
    (tmp_path / "main.py").write_text((tmp_path / "main.py").read_text().replace("from trainer", "from engine"))
    cold = _check_main(tmp_path, monkeypatch)
    summarized: list[str] = []
    real = project.summarize
    monkeypatch.setattr(project, "summarize", lambda path, text: summarized.append(path) or real(path, text))
    assert _check_main(tmp_path, monkeypatch) == cold
    assert summarized == []
    # without the recorded plan, the project is planned again from the stored summaries
    [plans] = Path(os.environ[ENV_VAR]).rglob("summaries/*.plans")
    plans.unlink()
    assert _check_main(tmp_path, monkeypatch) == cold
    assert summarized == [] and plans.exists()
    # a damaged summary store (and plan record) is a miss: everything is summarized again, same output
    stores = sorted(Path(os.environ[ENV_VAR]).rglob("summaries/*"))
    assert [store.suffix for store in stores] == ["", ".plans"]
    for store in stores:
        store.write_text('{"x": [1, ')
    assert _check_main(tmp_path, monkeypatch) == cold
    assert sorted(Path(path).name for path in summarized) == ["engine.py", "main.py", "trainer.py"]


def test_summaries_round_trip_through_json(tmp_path: Path) -> None:
    from migrate.project import summarize, summary_from_json, summary_to_json

    for name in ("main.py", "trainer.py"):
        path = str(TRAINER / name)
        summary = summarize(path, (TRAINER / name).read_text())
        assert summary is not None
        assert summary_from_json(path, json.loads(json.dumps(summary_to_json(summary)))) == summary


def test_a_module_that_appears_where_the_plan_looked_changes_the_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The recorded plan holds for modules that were looked for and not found, too.
    monkeypatch.setattr(cache_module, "_RACY_S", 0.0)
    _project(tmp_path)
    (tmp_path / "main.py").write_text((tmp_path / "main.py").read_text().replace("from trainer", "from engine"))
    before = _check_main(tmp_path, monkeypatch)
    assert "scaler=scaler" not in before[1]
    assert _check_main(tmp_path, monkeypatch) == before
    (tmp_path / "engine.py").write_text("from trainer import train\n")
    after = _check_main(tmp_path, monkeypatch)
    assert "train(model, optimizer, loader, epoch, scaler=scaler)" in after[1]
    assert after == _check_main(tmp_path, monkeypatch, "--no-cache")


def test_a_file_out_of_the_run_that_the_plan_read_changes_the_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `ampmigrate trainer.py`: the plan reads the project files of folders the run did not search
    # for one that calls amp on the setup (a trainer subclass); the recorded plan holds only while
    # they are as they were, so an edit there reaches a warm run.
    monkeypatch.setattr(cache_module, "_RACY_S", 0.0)
    make(
        tmp_path,
        {
            "setup.py": "",
            "src/trainer.py": (
                "import torch\nfrom apex import amp\n\n\nclass Trainer:\n"
                "    def _forward(self, model, x):\n        loss = model(x).sum()\n"
                "        with amp.scale_loss(loss, self.optimizer) as scaled_loss:\n"
                "            scaled_loss.backward()\n\n"
                "    def train(self, model, loader):\n"
                "        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                '        model, self.optimizer = amp.initialize(model, self.optimizer, opt_level="O1")\n'
                "        for x in loader:\n            self._forward(model, x)\n            self.optimizer.step()\n"
            ),
            "src/meta.py": "from trainer import Trainer\n\n\nclass MetaTrainer(Trainer):\n    pass\n",
        },
    )

    def check() -> tuple[int, str]:
        result = cli(tmp_path, monkeypatch, "--diff", "src/trainer.py")
        return result.exit_code, result.stdout + result.stderr

    before = check()
    assert "GradScaler" in before[1]
    assert check() == before  # warm
    meta = tmp_path / "src" / "meta.py"
    meta.write_text(
        meta.read_text()
        .replace(
            "    pass\n",
            "    def _forward(self, model, x):\n        loss = model(x).mean()\n"
            "        with amp.scale_loss(loss, self.optimizer) as scaled_loss:\n"
            "            scaled_loss.backward()\n",
        )
        .replace("from trainer", "from apex import amp\nfrom trainer")
    )
    after = check()
    assert "AMP025" in after[1] and "meta.py (not given)" in after[1], after[1]
    assert after == (lambda r: (r.exit_code, r.stdout + r.stderr))(
        cli(tmp_path, monkeypatch, "--diff", "--no-cache", "src/trainer.py")
    )


def test_a_module_added_beside_a_script_changes_the_results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # main.py's `from utils import train` reaches lib/utils.py (amp) only while no utils.py sits
    # beside main.py: a script's own folder comes first on sys.path. That place was looked at,
    # empty, by the recorded plan; a warm run after a utils.py appears there must see it.
    monkeypatch.setattr(cache_module, "_RACY_S", 0.0)
    make(
        tmp_path,
        {
            "main.py": (
                "import torch\nfrom apex import amp\nfrom utils import train\n\n"
                "model = torch.nn.Linear(2, 1)\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                'model, optimizer = amp.initialize(model, optimizer, opt_level="O1")\n'
                "train(model, optimizer, [torch.ones(4, 2)])\n"
            ),
            "lib/utils.py": (
                "from apex import amp\n\n\ndef train(model, optimizer, loader):\n    for x in loader:\n"
                "        loss = model(x).sum()\n        with amp.scale_loss(loss, optimizer) as scaled_loss:\n"
                "            scaled_loss.backward()\n        optimizer.step()\n"
            ),
        },
    )

    def check(*options: str) -> tuple[int, str]:
        result = cli(tmp_path, monkeypatch, "--diff", *options, "main.py", "lib")
        return result.exit_code, result.stdout + result.stderr

    before = check()
    assert "scaler.scale(loss).backward()" in before[1], before[1]
    assert check() == before  # warm
    (tmp_path / "utils.py").write_text("def train(model, optimizer, loader):\n    pass\n")
    after = check()
    assert after != before
    assert after == check("--no-cache")


def test_a_warm_project_run_plans_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from migrate import project

    monkeypatch.setattr(cache_module, "_RACY_S", 0.0)
    _project(tmp_path, **{"engine.py": "from trainer import train\n"})
    (tmp_path / "main.py").write_text((tmp_path / "main.py").read_text().replace("from trainer", "from engine"))
    cold = _check_main(tmp_path, monkeypatch)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a warm run planned the project")

    monkeypatch.setattr(project.ProjectPlan, "__init__", refuse)
    no_parsing(monkeypatch)
    assert _check_main(tmp_path, monkeypatch) == cold
    # from another working folder, findings may name modules otherwise: planned again
    (tmp_path / "sub").mkdir()
    with pytest.raises(AssertionError, match="planned the project"):
        cli(tmp_path / "sub", monkeypatch, "--check", "..")


def test_a_replay_stats_no_module_missing_from_a_searched_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The plan looked for engine.py and found none; this run's walk of the folder says so
    # without a stat. A module that appears there is still seen (see the test above).
    monkeypatch.setattr(cache_module, "_RACY_S", 0.0)
    _project(tmp_path)
    (tmp_path / "main.py").write_text((tmp_path / "main.py").read_text().replace("from trainer", "from engine"))
    before = _check_main(tmp_path, monkeypatch)
    statted: list[str] = []
    signature = runner._signature

    def counted(path: str) -> list[int] | None:
        statted.append(path)
        return signature(path)

    monkeypatch.setattr(runner, "_signature", counted)
    assert _check_main(tmp_path, monkeypatch) == before
    assert statted and not any(os.path.dirname(path) == str(tmp_path) for path in statted)
    assert str(tmp_path / "engine.py") not in statted
