"""Atomic file replacement: a crash or a full disk never leaves a half-written file.

The new bytes go to ``.NAME.<random>.ampmigrate-tmp`` beside the file and replace it with
one rename. A process killed between the two leaves that temporary file behind (never a
damaged original); the writer holds an advisory lock on it for as long as it lives, so a
later run can tell such leftovers from a write in progress and remove them.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from pathlib import Path

try:  # POSIX only; elsewhere leftovers are reported, never removed
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

TEMP_SUFFIX = ".ampmigrate-tmp"
# Held for the whole of each write. A worker whose main process died takes it before
# exiting (see migrate.workers), so that no write in progress is cut short.
WRITE_LOCK = threading.Lock()


class StaleFileError(OSError):
    """The file changed on disk between reading it and writing the migrated text."""


def is_temp_name(name: str) -> bool:
    """Whether ``name`` is one of our temporary files (``.NAME.<random>.ampmigrate-tmp``)."""
    return name.startswith(".") and name.endswith(TEMP_SUFFIX)


def write_atomic(path: Path, data: bytes, expected_stat: os.stat_result | None = None) -> None:
    """Replace the contents of ``path`` with ``data``, atomically.

    The bytes go to a temporary file in the same folder (so ``os.replace`` is a rename
    on one file system), are flushed and fsynced, get the original file's mode (and
    owner, where permitted), and then replace the original in one step. A symlink is
    followed so the link stays a link. With ``expected_stat`` (taken when the file
    was read), a file modified since is left alone and StaleFileError is raised.
    """
    with WRITE_LOCK:
        _write(path, data, expected_stat)


def _write(path: Path, data: bytes, expected_stat: os.stat_result | None) -> None:
    target = Path(os.path.realpath(path))
    current = os.stat(target)
    if expected_stat is not None and (
        current.st_mtime_ns != expected_stat.st_mtime_ns or current.st_size != expected_stat.st_size
    ):
        raise StaleFileError(f"{path} changed on disk while it was being migrated")
    descriptor, temp_name = _locked_temp_file(target)
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
            # Renamed while still open, so the lock covers the whole life of the name.
            os.replace(temp_name, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp_name)
        raise
    _fsync_directory(target.parent)


def _locked_temp_file(target: Path) -> tuple[int, str]:
    """A new temporary file beside ``target``, locked against ``leftover_state``."""
    import tempfile  # only runs that write pay for it

    for _ in range(8):
        descriptor, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=TEMP_SUFFIX)
        if fcntl is None:
            return descriptor, name
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        # A cleaner may have taken the lock between mkstemp and flock and removed the
        # name: then this file is nameless, and another is needed.
        if _same_file(name, descriptor):
            return descriptor, name
        os.close(descriptor)
    raise OSError(f"cannot create a temporary file beside {target}")


def _same_file(name: str, descriptor: int) -> bool:
    try:
        on_disk = os.stat(name)
    except FileNotFoundError:
        return False
    opened = os.fstat(descriptor)
    return (on_disk.st_dev, on_disk.st_ino) == (opened.st_dev, opened.st_ino)


def leftover_state(path: Path, remove: bool) -> str:
    """Look at a temporary file found beside the files; maybe remove it.

    Returns "busy" (a running ampmigrate is writing it: left alone), "removed", or
    "left" (an earlier, killed run left it; ``remove`` was False, or this platform
    cannot tell a live writer from a dead one).
    """
    if fcntl is None:  # pragma: no cover - Windows
        return "left"
    try:
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return "busy"  # gone meanwhile, or not ours to open
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return "busy"
        if not remove:
            return "left"
        # Still the file we locked (not a new one under the same name)? Then its writer is gone.
        if not _same_file(str(path), descriptor):
            return "busy"
        try:
            os.unlink(path)
        except OSError:
            return "left"
        return "removed"
    finally:
        os.close(descriptor)


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
