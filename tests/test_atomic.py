"""Atomic writes: all or nothing, mode and symlinks kept, no temporary files left."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from migrate.atomic import StaleFileError, write_atomic


def test_replaces_contents_and_keeps_mode(tmp_path: Path) -> None:
    target = tmp_path / "train.py"
    target.write_bytes(b"old\n")
    target.chmod(0o751)
    write_atomic(target, b"new\r\n")
    assert target.read_bytes() == b"new\r\n"
    assert target.stat().st_mode & 0o777 == 0o751
    assert os.listdir(tmp_path) == ["train.py"]


def test_a_failed_replace_leaves_the_original_and_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "train.py"
    target.write_bytes(b"old\n")

    def disk_full(src: str, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", disk_full)
    with pytest.raises(OSError, match="No space"):
        write_atomic(target, b"new\n")
    assert target.read_bytes() == b"old\n"
    assert os.listdir(tmp_path) == ["train.py"]


def test_a_symlink_stays_a_link_and_its_target_is_written(tmp_path: Path) -> None:
    real = tmp_path / "real.py"
    real.write_bytes(b"old\n")
    link = tmp_path / "link.py"
    link.symlink_to(real)
    write_atomic(link, b"new\n")
    assert link.is_symlink()
    assert real.read_bytes() == b"new\n"


def test_a_file_changed_since_it_was_read_is_not_overwritten(tmp_path: Path) -> None:
    target = tmp_path / "train.py"
    target.write_bytes(b"old\n")
    seen = target.stat()
    target.write_bytes(b"edited meanwhile\n")
    os.utime(target, ns=(seen.st_atime_ns, seen.st_mtime_ns + 1_000_000))
    with pytest.raises(StaleFileError):
        write_atomic(target, b"new\n", seen)
    assert target.read_bytes() == b"edited meanwhile\n"


def test_a_temporary_file_is_locked_while_it_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("fcntl")
    from migrate.atomic import leftover_state

    target = tmp_path / "train.py"
    target.write_bytes(b"old\n")
    seen = []
    real_replace = os.replace

    def look_then_replace(src: str, dst: object) -> None:
        # Another run finding this temporary file now must leave it alone.
        seen.append(leftover_state(Path(src), remove=True))
        real_replace(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "replace", look_then_replace)
    write_atomic(target, b"new\n")
    assert seen == ["busy"]
    assert target.read_bytes() == b"new\n"
    assert os.listdir(tmp_path) == ["train.py"]


def test_a_leftover_without_a_writer_is_removed_only_when_asked(tmp_path: Path) -> None:
    pytest.importorskip("fcntl")
    from migrate.atomic import is_temp_name, leftover_state

    leftover = tmp_path / ".train.py.abc123.ampmigrate-tmp"
    leftover.write_bytes(b"half")
    assert is_temp_name(leftover.name) and not is_temp_name("train.py")
    assert leftover_state(leftover, remove=False) == "left"
    assert leftover.exists()
    assert leftover_state(leftover, remove=True) == "removed"
    assert not leftover.exists()
