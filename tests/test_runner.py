"""The runner: discovery, bytes kept exactly, never writing bad output, jobs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import migrate.engine
from migrate import runner
from migrate.config import build_config
from migrate.engine import InternalError, MigrationResult
from migrate.runner import Status, run

AUTOCAST = "import torch\n\nwith torch.cuda.amp.autocast():\n    y = 1\n"
MIGRATED_LINE = 'with torch.autocast("cuda", dtype=torch.float16):'


def write_tree(root: Path, files: dict[str, bytes | str]) -> None:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())


def migrate_tree(root: Path, monkeypatch: pytest.MonkeyPatch, **options: object) -> list[runner.FileResult]:
    monkeypatch.chdir(root)
    return run([Path(".")], build_config([Path(".")], **options))  # type: ignore[arg-type]


def test_discovery_skips_vcs_virtualenvs_builds_and_sorts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_tree(
        tmp_path,
        {
            "b.py": AUTOCAST,
            "a/z.py": AUTOCAST,
            "a/notes.txt": AUTOCAST,
            ".git/hooks/x.py": AUTOCAST,
            ".venv/lib/x.py": AUTOCAST,
            "env-with-odd-name/pyvenv.cfg": "home = /usr\n",
            "env-with-odd-name/lib/x.py": AUTOCAST,
            "build/lib/x.py": AUTOCAST,
            "node_modules/x.py": AUTOCAST,
            "pkg/__pycache__/x.py": AUTOCAST,
        },
    )
    results = migrate_tree(tmp_path, monkeypatch)
    assert [result.path for result in results] == ["a/z.py", "b.py"]


def test_crlf_line_endings_are_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_tree(tmp_path, {"train.py": AUTOCAST.replace("\n", "\r\n")})
    migrate_tree(tmp_path, monkeypatch, write=True)
    data = (tmp_path / "train.py").read_bytes()
    assert MIGRATED_LINE.encode() + b"\r\n" in data
    assert b"\n" not in data.replace(b"\r\n", b"")


def test_bom_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_tree(tmp_path, {"train.py": b"\xef\xbb\xbf" + AUTOCAST.encode()})
    migrate_tree(tmp_path, monkeypatch, write=True)
    data = (tmp_path / "train.py").read_bytes()
    assert data.startswith(b"\xef\xbb\xbfimport torch\n")
    assert MIGRATED_LINE.encode() in data


def test_pep263_encoding_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = "# -*- coding: latin-1 -*-\n# Entraîné en demi-précision\n" + AUTOCAST
    write_tree(tmp_path, {"train.py": source.encode("latin-1")})
    migrate_tree(tmp_path, monkeypatch, write=True)
    data = (tmp_path / "train.py").read_bytes()
    assert data.decode("latin-1") == source.replace("with torch.cuda.amp.autocast():", MIGRATED_LINE)


def test_file_without_apex_is_never_parsed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def must_not_run(*args: object) -> None:
        raise AssertionError("the pre-filter should have skipped this file")

    monkeypatch.setattr(migrate.engine, "migrate_source", must_not_run)
    write_tree(tmp_path, {"model.py": "import torch\nx = torch.zeros(1)\n"})
    [result] = migrate_tree(tmp_path, monkeypatch, write=True)
    assert result.status is Status.UNCHANGED


def test_internal_error_names_the_file_and_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_engine(source: str, options: object) -> MigrationResult:
        raise InternalError("migrated code does not compile")

    monkeypatch.setattr(migrate.engine, "migrate_source", broken_engine)
    write_tree(tmp_path, {"train.py": AUTOCAST})
    [result] = migrate_tree(tmp_path, monkeypatch, write=True)
    assert result.status is Status.FAILED
    assert result.path == "train.py"
    assert result.error.startswith("internal error, file not written")
    assert (tmp_path / "train.py").read_text() == AUTOCAST


def test_an_engine_bug_on_one_file_fails_that_file_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = migrate.engine.migrate_source

    def buggy_on_one_file(source: str, options: object) -> MigrationResult:
        if "poison" in source:
            raise KeyError("scope")
        return real(source, options)  # type: ignore[arg-type]

    monkeypatch.setattr(migrate.engine, "migrate_source", buggy_on_one_file)
    write_tree(tmp_path, {"a.py": "# poison\n" + AUTOCAST, "b.py": AUTOCAST})
    first, second = migrate_tree(tmp_path, monkeypatch, write=True)
    assert first.status is Status.FAILED
    assert first.error.startswith("internal error, file not written: KeyError: 'scope'")
    assert (tmp_path / "a.py").read_text() == "# poison\n" + AUTOCAST
    assert second.status is Status.CHANGED and second.written


def test_output_that_does_not_compile_is_never_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A rewrite that produced broken code: the engine compiles its output (once) and refuses it.
    monkeypatch.setattr(migrate.engine, "render", lambda original, updated, source: "def (:\n")
    write_tree(tmp_path, {"train.py": AUTOCAST})
    [result] = migrate_tree(tmp_path, monkeypatch, write=True)
    assert result.status is Status.FAILED
    assert result.error.startswith("internal error, file not written: migrated code does not compile")
    assert (tmp_path / "train.py").read_text() == AUTOCAST


def test_file_level_skip_is_reported_as_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_tree(tmp_path, {"train.py": "# ampmigrate: skip\n" + AUTOCAST})
    [result] = migrate_tree(tmp_path, monkeypatch, write=True)
    assert result.status is Status.SKIPPED
    assert (tmp_path / "train.py").read_text() == "# ampmigrate: skip\n" + AUTOCAST


def test_parallel_results_equal_serial_results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files: dict[str, bytes | str] = {f"pkg{i % 3}/m{i:02d}.py": AUTOCAST for i in range(12)}
    files["pkg0/broken.py"] = "from apex import amp\nif True\n"
    files["pkg1/clean.py"] = "x = 1\n"
    write_tree(tmp_path, files)
    serial = migrate_tree(tmp_path, monkeypatch, jobs=1)
    parallel = migrate_tree(tmp_path, monkeypatch, jobs=2)
    assert parallel == serial
    assert [result.path for result in serial] == sorted(result.path for result in serial)
    assert sum(result.status is Status.CHANGED for result in serial) == 12


def test_parallel_write_is_idempotent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_tree(tmp_path, {f"m{i}.py": AUTOCAST for i in range(6)})
    migrate_tree(tmp_path, monkeypatch, write=True, jobs=2)
    snapshot = {path.name: path.read_bytes() for path in tmp_path.iterdir()}
    again = migrate_tree(tmp_path, monkeypatch, write=True, jobs=2)
    assert all(result.status is Status.UNCHANGED for result in again)
    assert {path.name: path.read_bytes() for path in tmp_path.iterdir()} == snapshot


def test_unified_diff_marks_a_missing_final_newline() -> None:
    diff = runner.unified_diff("a\nb", "a\nc", "f.py")
    assert diff.endswith("-b\n\\ No newline at end of file\n+c\n\\ No newline at end of file\n")


def test_symlinked_folders_are_not_followed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_tree(tmp_path, {"real/train.py": AUTOCAST})
    os.symlink(tmp_path / "real", tmp_path / "loop")
    results = migrate_tree(tmp_path, monkeypatch)
    assert [result.path for result in results] == ["real/train.py"]


def test_migrated_apis_names_what_the_rewrite_removed() -> None:
    old = "from apex import amp\nwith amp.scale_loss(l, o) as s:\n    s.backward()\namp.state_dict()\n"
    new = "scaler.scale(l).backward()\namp.state_dict()\n"
    assert runner.migrated_apis(old, new) == ("amp.scale_loss", "from apex import")


def test_missing_says_the_same_with_a_memo_as_without() -> None:
    from migrate.runner import _missing

    listings = {"/r": {"pkg", "a.py"}, "/r/pkg": {"m.py", "sub"}, "/r/pkg/sub": set()}

    def reference(path: str) -> bool:  # walk up to the nearest searched folder
        child, folder = path, os.path.dirname(path)
        while folder != child:
            if folder in listings:
                return os.path.basename(child) not in listings[folder]
            child, folder = folder, os.path.dirname(folder)
        return False

    paths = [
        "/r/a.py",
        "/r/b.py",
        "/r/pkg/m.py",
        "/r/pkg/n.py",
        "/r/pkg/sub/x.py",
        "/r/pkg/gone/x.py",
        "/r/pkg/gone/deeper/y.py",
        "/r/pkg/sub/inner/z.py",
        "/r/other/x.py",
        "/elsewhere/x.py",
        "/x.py",
        "/",
    ]
    memo: dict[str, bool] = {}
    for path in paths * 2:  # the second time from the memo
        assert _missing(path, listings, memo) == _missing(path, listings) == reference(path), path
    assert memo  # the folders not searched were remembered
