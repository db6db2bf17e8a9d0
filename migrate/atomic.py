"""Atomic file replacement: a crash or a full disk never leaves a half-written file."""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path


class StaleFileError(OSError):
    """The file changed on disk between reading it and writing the migrated text."""


def write_atomic(path: Path, data: bytes, expected_stat: os.stat_result | None = None) -> None:
    """Replace the contents of ``path`` with ``data``, atomically.

    The bytes go to a temporary file in the same folder (so ``os.replace`` is a rename
    on one file system), are flushed and fsynced, get the original file's mode (and
    owner, where permitted), and then replace the original in one step. A symlink is
    followed so the link stays a link. With ``expected_stat`` (taken when the file
    was read), a file modified since is left alone and StaleFileError is raised.
    """
    import tempfile  # only runs that write pay for it

    target = Path(os.path.realpath(path))
    current = os.stat(target)
    if expected_stat is not None and (
        current.st_mtime_ns != expected_stat.st_mtime_ns or current.st_size != expected_stat.st_size
    ):
        raise StaleFileError(f"{path} changed on disk while it was being migrated")
    descriptor, temp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".ampmigrate-tmp")
    try:
        with os.fdopen(descriptor, "wb") as temp_file:
            temp_file.write(data)
            temp_file.flush()
            os.fsync(temp_file.fileno())
        os.chmod(temp_name, stat.S_IMODE(current.st_mode))
        if hasattr(os, "chown") and (current.st_uid, current.st_gid) != _owner(temp_name):
            # Only root may give a file away; for anyone else the new file keeps the
            # writer's ownership, as any editor's save would.
            with contextlib.suppress(PermissionError):
                os.chown(temp_name, current.st_uid, current.st_gid)
        os.replace(temp_name, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp_name)
        raise
    _fsync_directory(target.parent)


def _owner(path: str) -> tuple[int, int]:
    info = os.stat(path)
    return info.st_uid, info.st_gid


def _fsync_directory(directory: Path) -> None:
    """Make the rename itself durable; not every platform can open a directory."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)
