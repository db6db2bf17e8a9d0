"""A cache of per-file results, keyed on the file's bytes, the tool and the options.

A second run over unchanged files (another ``--check``, a pre-commit hook) then reads
each result back instead of parsing: no libcst import, no worker processes. An entry is
what the engine concluded about some bytes (status, findings, the migrated bytes, the
reason it failed), never about a path, so a file moved or copied still hits.

The key hashes the file's bytes together with everything that can change the answer:
ampmigrate's version and the size and time of each of its source files (an edited
checkout is a new tool), the Python version (its grammar decides what parses), the
versions of libcst and pathspec, every option (the per-file project facts included) and whether the file is a
notebook. Entries are written to a
temporary file and renamed into place, so concurrent runs never read half an entry; a
damaged or unreadable entry is a miss. The folder is ``$AMPMIGRATE_CACHE_DIR``, else
``$XDG_CACHE_HOME/ampmigrate``, else the platform's user cache folder; deleting it is
always safe.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from migrate import __version__
from migrate.options import Options, ScalerInfo

try:
    # CPython's own SHA-256, a built-in module, for the short texts every run hashes (the
    # fingerprint, the folders): importing hashlib loads OpenSSL's binding, a twentieth of a
    # pre-commit run on a file without Apex. The digests are the same.
    from _sha256 import sha256  # Python 3.11
except ImportError:  # pragma: no cover - other versions and implementations
    try:
        from _sha2 import sha256  # Python 3.12 and later
    except ImportError:
        from hashlib import sha256


def content_sha256(data: bytes = b"") -> Any:
    """A SHA-256 for file contents: OpenSSL's, several times faster on megabytes than the
    built-in one (hashlib is imported by the runs that hash files, not by every run)."""
    import hashlib

    return hashlib.sha256(data)


ENV_VAR = "AMPMIGRATE_CACHE_DIR"
# Bumped when the layout of an entry changes.
_FORMAT = 2
# Folders of other tool versions not touched for this long are removed.
_PRUNE_AFTER_S = 30 * 24 * 3600


def default_cache_dir() -> Path:
    """Where entries live: the environment's choice, else the platform's user cache folder."""
    explicit = os.environ.get(ENV_VAR)
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "ampmigrate"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "ampmigrate"
    if sys.platform == "win32":
        local = os.environ.get("LOCALAPPDATA")
        if local:
            return Path(local) / "ampmigrate" / "Cache"
    return Path.home() / ".cache" / "ampmigrate"


def tool_fingerprint() -> str:
    """A digest of what decides the results, apart from the options and the file itself."""
    digest = sha256(f"{_FORMAT}\0{__version__}\0{sys.version_info[:3]}".encode())
    # The codemod's own sources (the shim never runs here): an edited checkout must not
    # reuse the results of the code it replaced.
    folders = [os.path.dirname(os.path.abspath(__file__))]
    while folders:
        folder = folders.pop()
        with contextlib.suppress(OSError), os.scandir(folder) as scan:
            for entry in sorted(scan, key=lambda entry: entry.name):
                if entry.name.endswith(".py"):
                    info = entry.stat()
                    digest.update(f"{entry.path}\0{info.st_size}\0{info.st_mtime_ns}\0".encode())
                elif entry.is_dir() and entry.name not in ("shim", "__pycache__"):
                    folders.append(entry.path)
    # The version files of libcst (it parses) and pathspec (it translates gitignore patterns,
    # which are remembered), found on sys.path as the import system would, without importing
    # them (or importlib.util, which costs a warm run more than this loop).
    for package, version_file in (("libcst", "_version.py"), ("pathspec", "_version.py")):
        for path_entry in sys.path:
            try:
                info = os.stat(os.path.join(path_entry or ".", package, version_file))
            except OSError:
                continue
            digest.update(f"{package}\0{info.st_size}\0{info.st_mtime_ns}\0".encode())
            break
    return digest.hexdigest()[:24]


@dataclass(frozen=True)
class Entry:
    """What the engine concluded about one file's bytes; no path in it.

    ``findings`` holds (cell, line, column, code, message, fixed) tuples. ``new_data``
    is the migrated file (status "changed"); ``diffs`` the bodies of its diffs (no
    header lines, which name the path), as (suffix of the name, body) pairs, when they
    were computed.
    """

    status: str
    findings: tuple[tuple[int | None, int, int, str, str, bool], ...] = ()
    error: str = ""
    # The migrated bytes, base64-encoded: most readers (--check) never need them decoded.
    new_data_b64: str | None = None
    encoding: str = ""
    diffs: tuple[tuple[str, str], ...] | None = None
    first_change: int | None = None
    migrated_apis: tuple[str, ...] = ()
    # how the file's Apex amp setup came out (project mode settles groups of files by it)
    amp_left: bool = False
    amp_migrated: bool = False
    scalers: tuple[ScalerInfo, ...] = ()
    scaler_unused: bool = False

    @classmethod
    def changed(
        cls, findings: tuple[tuple[int | None, int, int, str, str, bool], ...], new_data: bytes, **fields: Any
    ) -> Entry:
        import base64  # here: a run whose files all pass over the pre-filter never needs it

        return cls("changed", findings, new_data_b64=base64.b64encode(new_data).decode("ascii"), **fields)

    @property
    def new_data(self) -> bytes | None:
        import base64

        return base64.b64decode(self.new_data_b64) if self.new_data_b64 is not None else None

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "findings": [list(finding) for finding in self.findings],
            "error": self.error,
            "new_data": self.new_data_b64,
            "encoding": self.encoding,
            "diffs": [list(diff) for diff in self.diffs] if self.diffs is not None else None,
            "first_change": self.first_change,
            "migrated_apis": list(self.migrated_apis),
            "amp_left": self.amp_left,
            "amp_migrated": self.amp_migrated,
            "scalers": [
                [
                    scaler.function,
                    scaler.static_scale,
                    scaler.follows,
                    list(scaler.models),
                    scaler.held_scale,
                    scaler.klass,
                    scaler.attribute,
                    list(scaler.stepped),
                ]
                for scaler in self.scalers
            ],
            "scaler_unused": self.scaler_unused,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Entry:
        new_data = data["new_data"]
        diffs = data["diffs"]
        return cls(
            status=str(data["status"]),
            findings=tuple(
                (cell, int(line), int(column), str(code), str(message), bool(fixed))
                for cell, line, column, code, message, fixed in data["findings"]
            ),
            error=str(data["error"]),
            new_data_b64=str(new_data) if new_data is not None else None,
            encoding=str(data["encoding"]),
            diffs=tuple((str(suffix), str(body)) for suffix, body in diffs) if diffs is not None else None,
            first_change=data["first_change"],
            migrated_apis=tuple(str(name) for name in data["migrated_apis"]),
            amp_left=bool(data["amp_left"]),
            amp_migrated=bool(data["amp_migrated"]),
            scalers=tuple(
                ScalerInfo(
                    function,
                    static_scale,
                    bool(follows),
                    tuple(str(model) for model in models),
                    held,
                    klass,
                    str(attribute),
                    tuple(str(key) for key in stepped),
                )
                for function, static_scale, follows, models, held, klass, attribute, stepped in data["scalers"]
            ),
            scaler_unused=bool(data["scaler_unused"]),
        )


def options_key(options: Options) -> str:
    """Every field of ``options``, facts included, as text that is the same in every
    process (a frozenset's repr follows string hashing, which differs between runs)."""
    return repr(_canonical(options))


def _canonical(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = dataclasses.fields(value)
        return (type(value).__name__, tuple((f.name, _canonical(getattr(value, f.name))) for f in fields))
    if isinstance(value, (frozenset, set)):
        return ("set", tuple(sorted(repr(_canonical(item)) for item in value)))
    if isinstance(value, (tuple, list)):
        return tuple(_canonical(item) for item in value)
    return value


class Cache:
    """Entries under one folder for one tool fingerprint; keys include the options."""

    def __init__(self, folder: Path, options: Options, fingerprint: str | None = None) -> None:
        self.root = folder
        self.fingerprint = fingerprint or tool_fingerprint()
        self.folder = folder / self.fingerprint
        self.options = options
        self.salt = self._salt(options)

    def _salt(self, options: Options) -> bytes:
        return f"{self.fingerprint}\0{options_key(options)}\0".encode()

    def key(self, data: bytes, notebook: bool, options: Options | None = None) -> str:
        """The entry of ``data`` migrated with ``options`` (default: the run's), facts included."""
        digest = content_sha256(self.salt if options is None or options == self.options else self._salt(options))
        digest.update(b"ipynb\0" if notebook else b"py\0")
        digest.update(data)
        return digest.hexdigest()

    def _path(self, key: str) -> Path:
        return self.folder / key[:2] / key[2:]

    def get(self, key: str) -> Entry | None:
        try:
            with open(self._path(key), "rb") as stream:
                return Entry.from_json(json.loads(stream.read()))
        except (OSError, ValueError, KeyError, TypeError):
            return None  # absent, or damaged: computed again and rewritten

    def put(self, key: str, entry: Entry) -> None:
        """Store ``entry`` atomically; a cache that cannot be written is no error."""
        self._store(self._path(key), entry.to_json())

    def _store(self, path: Path, document: Any) -> None:
        try:
            if not self.folder.exists():
                self._prune_others()
            path.parent.mkdir(parents=True, exist_ok=True)
            descriptor, temp = _new_temp(path.parent)
            try:
                with os.fdopen(descriptor, "w", encoding="utf-8") as stream:
                    json.dump(document, stream, ensure_ascii=False, separators=(",", ":"))
                os.replace(temp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temp)
                raise
        except (OSError, ValueError):
            pass

    def index(self, project: Path) -> StatIndex:
        """The stat index of the files under ``project`` (see StatIndex)."""
        name = sha256(self.salt + os.fsencode(os.path.realpath(project))).hexdigest()[:32]
        return StatIndex(self, self.folder / "index" / name)

    def summaries(self, project: Path) -> SummaryStore:
        """The project summaries of the modules under ``project`` (see SummaryStore)."""
        # No options in the name: a summary is what the module's text says, whatever the options.
        name = sha256(f"{self.fingerprint}\0".encode() + os.fsencode(os.path.realpath(project))).hexdigest()
        return SummaryStore(self, self.folder / "summaries" / name[:32])

    def translations(self) -> Translations:
        """pathspec's translations of gitignore patterns (see Translations)."""
        return Translations(self, self.folder / "gitignore")

    def _prune_others(self) -> None:
        """Remove the folders of other tool versions nobody has written to in a month."""
        now = time.time()
        with contextlib.suppress(OSError), os.scandir(self.root) as scan:
            for entry in scan:
                if entry.is_dir(follow_symlinks=False) and entry.name != self.fingerprint:
                    with contextlib.suppress(OSError):
                        if now - entry.stat(follow_symlinks=False).st_mtime > _PRUNE_AFTER_S:
                            import shutil  # rarely needed: a first run of a new version

                            shutil.rmtree(entry.path, ignore_errors=True)


# The verdict of a file the byte pre-filter cleared: no entry, nothing to do.
CLEAN = ""
# The verdict of a file that passed the pre-filter: it is read and planned as usual, but an
# earlier run saw it as it is now, so its results are most likely cached (nothing to parse ahead).
PASSES = "passes"
# A file changed within this many seconds of being looked at is not indexed: a change in
# the same tick of a coarse file-system clock would leave its times as they were.
_RACY_S = 2.0


class StatIndex:
    """What each file's bytes were found to be, keyed on its path and stat, as git's index.

    For a file whose size, modification and change times, inode and device are all as
    recorded, the recorded verdict stands without reading the file: CLEAN (the pre-filter
    cleared it) or PASSES (it passed; it is read all the same). A write to a file always moves its
    change time (which no tool can set back), so a changed file never matches; a file
    changed within ``_RACY_S`` of being looked at is not recorded at all. Only a hint: a
    verdict whose entry is gone is a miss, and the file is read as usual.
    """

    def __init__(self, cache: Cache, path: Path) -> None:
        self.cache = cache
        self.path = path
        self.rows: dict[str, list[Any]] = {}
        self.dirty = False
        try:
            with open(path, "rb") as stream:
                rows = json.loads(stream.read())
            if isinstance(rows, dict):
                self.rows = rows
        except (OSError, ValueError):
            pass

    @staticmethod
    def signature(info: os.stat_result) -> list[int]:
        """What of a file's stat must stay the same for its recorded verdict to stand."""
        return [info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino, info.st_dev]

    def lookup(self, path: str, info: os.stat_result) -> str | None:
        """The verdict recorded for ``path`` if its stat is unchanged, else None."""
        row = self.rows.get(path)
        if row is None or len(row) != 6 or row[:5] != self.signature(info):
            return None
        verdict = row[5]
        return verdict if isinstance(verdict, str) else None

    def record(self, path: str, info: os.stat_result, verdict: str, looked_at: float) -> None:
        """Remember ``verdict`` for ``path`` as it was at ``looked_at`` (a time.time())."""
        if looked_at - max(info.st_mtime, info.st_ctime) < _RACY_S:
            if self.rows.pop(path, None) is not None:
                self.dirty = True
            return
        row = [*self.signature(info), verdict]
        if self.rows.get(path) != row:
            self.rows[path] = row
            self.dirty = True

    def save(self) -> None:
        if self.dirty:
            self.cache._store(self.path, self.rows)
            self.dirty = False


def _new_temp(folder: Path) -> tuple[int, str]:
    """A new file of this process only in ``folder`` (``.NAME.tmp``, mode 0600), open for
    writing: what ``tempfile.mkstemp`` makes, without importing tempfile (with random and
    shutil, a tenth of a pre-commit run on a clean file)."""
    stem = f".{os.getpid()}-{time.time_ns()}"
    for attempt in range(100):
        temp = os.path.join(folder, f"{stem}-{attempt}.tmp")
        try:
            return (
                os.open(
                    temp,
                    os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0),
                    0o600,
                ),
                temp,
            )
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name in {folder}")


# How many translated groups of gitignore lines are kept (a large monorepo has a few hundred).
_TRANSLATIONS_KEPT = 4096


class Translations:
    """pathspec's translation of groups of gitignore lines into one regular expression,
    keyed on the lines themselves (``discovery.Translations``), for every tree: read at
    first use, written back when a run added to it. pathspec's version is in the
    fingerprint that names the folder."""

    def __init__(self, cache: Cache, path: Path) -> None:
        self.cache = cache
        self.path = path
        self._known: dict[str, Any] | None = None
        self.dirty = False

    @property
    def known(self) -> dict[str, Any]:
        if self._known is None:
            self._known = _load_dict(self.path)
        return self._known

    def get(self, lines: str) -> Any:
        return self.known.get(lines)

    def put(self, lines: str, translation: list[Any] | None) -> None:
        known = self.known
        while len(known) >= _TRANSLATIONS_KEPT:
            known.pop(next(iter(known)))  # the oldest first
        known[lines] = translation
        self.dirty = True

    def save(self) -> None:
        if self.dirty:
            self.cache._store(self.path, self.known)
            self.dirty = False


# How many recorded plans a project keeps.
_PLANS_KEPT = 4


def _load_dict(path: Path) -> dict[str, Any]:
    """The JSON object stored at ``path``; empty if there is none or it is damaged."""
    try:
        with open(path, "rb") as stream:
            document = json.loads(stream.read())
    except (OSError, ValueError):
        return {}
    return document if isinstance(document, dict) else {}


# A module whose project summary is "none": it does not decode or parse.
NO_SUMMARY = "none"


class SummaryStore:
    """Each module's project summary (``migrate.project``), kept with its path, its stat and
    the digest of its bytes, all in one document per project (a warm run opens one file).

    A module given to the run, whose bytes are in hand, is answered when the digest of its
    bytes matches; a module only imported (context), when its stat is unchanged (as in
    StatIndex: written, its change time moves), else when the digest of its bytes does.
    A summary depends on the module's bytes and path only (relative imports resolve against
    its folders); the tool's fingerprint names the folder, so a new tool starts afresh.
    """

    def __init__(self, cache: Cache, path: Path) -> None:
        self.cache = cache
        self.path = path
        self._rows: dict[str, list[Any]] | None = None
        self._plans: dict[str, Any] | None = None
        self.dirty = self.plans_dirty = False

    @property
    def rows(self) -> dict[str, list[Any]]:
        # Read at first use: a run whose files all pass over the pre-filter never needs it.
        if self._rows is None:
            self._rows = _load_dict(self.path)
        return self._rows

    @property
    def plans(self) -> dict[str, Any]:
        # Apart from the summaries: a run that takes a recorded plan needs no summary.
        if self._plans is None:
            self._plans = _load_dict(self.path.with_suffix(".plans"))
        return self._plans

    @staticmethod
    def digest(data: bytes) -> str:
        return content_sha256(data).hexdigest()[:32]

    def by_digest(self, path: str, digest: str) -> Any:
        """The summary stored for ``path`` with these bytes (NO_SUMMARY included), else None."""
        row = self.rows.get(path)
        if isinstance(row, list) and len(row) == 3 and row[1] == digest:
            return row[2]
        return None

    def by_stat(self, path: str, info: os.stat_result) -> Any:
        """The summary stored for ``path`` if its stat is as recorded, else None."""
        row = self.rows.get(path)
        if isinstance(row, list) and len(row) == 3 and row[0] == StatIndex.signature(info):
            return row[2]
        return None

    def record(self, path: str, info: os.stat_result | None, digest: str, summary: Any, looked_at: float) -> None:
        """Keep ``summary`` of ``path`` (NO_SUMMARY: it does not parse); its stat only when
        the file did not change within ``_RACY_S`` of ``looked_at`` (a time.time())."""
        racy = info is None or looked_at - max(info.st_mtime, info.st_ctime) < _RACY_S
        signature = None if info is None or racy else StatIndex.signature(info)
        row = [signature, digest, summary]
        if self.rows.get(path) != row:
            self.rows[path] = row
            self.dirty = True

    def plan(self, key: str) -> tuple[list[tuple[str, list[int] | None]], dict[str, str]] | None:
        """The plan recorded under ``key``: (module looked for, its stat signature or None when
        there was no such file) pairs, and the cache key of each given file's final result."""
        record: Any = self.plans.get(key)
        try:
            folders, keys = record
            probes = [
                (os.path.join(folder, name), signature)
                for folder, names in folders.items()
                for name, signature in names
            ]
            return probes, {str(path): str(entry) for path, entry in keys.items()}
        except (TypeError, ValueError, AttributeError):
            return None

    def record_plan(self, key: str, probes: dict[str, list[int] | None], keys: dict[str, str]) -> None:
        """Keep a plan (see ``plan``), with the few most recent others (runs on parts of a tree)."""
        kept = self.plans
        kept.pop(key, None)
        while len(kept) >= _PLANS_KEPT:
            kept.pop(next(iter(kept)))
        # by folder: thousands of modules looked for in a few hundred folders
        folders: dict[str, list[Any]] = {}
        for path, signature in sorted(probes.items()):
            folder, name = os.path.split(path)
            folders.setdefault(folder, []).append([name, signature])
        kept[key] = [folders, keys]
        self.plans_dirty = True

    def save(self) -> None:
        if self.dirty:
            self.cache._store(self.path, self.rows)
            self.dirty = False
        if self.plans_dirty:
            self.cache._store(self.path.with_suffix(".plans"), self.plans)
            self.plans_dirty = False
