"""Running the engine over files: read, pre-filter, look up, migrate, diff/check/write.

The main process walks the tree, reads each file and drops those the byte pre-filter
clears; a file that passes is answered from the result cache when its bytes were seen
before, and otherwise sent (by path) to a worker process that parses it (see
``migrate.workers``). Workers start as soon as the first such file is found, while the
walk goes on. Neither libcst nor the engine is imported in the main process.

Each file's outcome is a small picklable ``FileResult``; exceptions are caught only at
the file boundary, so one bad file never stops the run. Results come back in sorted
path order whatever the number of jobs. A cached result and a fresh one go through the
same code (``_finish``), so they print the same.
"""

from __future__ import annotations

import io
import os
import re
import stat
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

from migrate.atomic import StaleFileError, leftover_state, write_atomic
from migrate.cache import CLEAN, Cache, Entry, StatIndex
from migrate.config import Config
from migrate.discovery import Candidate, DiscoveryError, Leftover, Notice, iter_discover
from migrate.options import Options
from migrate.prefilter import may_need_migration

if TYPE_CHECKING:
    from migrate.findings import Finding
    from migrate.workers import Pool

# Modules only some runs need (worker pools, diffs, notebooks, the engine) are imported
# where they are used: a pre-commit run on one clean file has a budget of 0.1 s.


class Status(str, Enum):
    UNCHANGED = "unchanged"
    CHANGED = "changed"  # would change, or was written with --write
    SKIPPED = "skipped"  # a file-level `# ampmigrate: skip`
    FAILED = "failed"


@dataclass(frozen=True)
class Diagnostic:
    """A finding placed in a file (and, for notebooks, a cell) for the user."""

    path: str
    line: int
    column: int
    code: str
    message: str
    fixed: bool
    cell: int | None = None  # 1-based cell number in a notebook

    @property
    def location(self) -> str:
        return self.path if self.cell is None else f"{self.path}:cell {self.cell}"

    def format(self) -> str:
        return f"{self.location}:{self.line}:{self.column}: {self.code} {self.message}"


@dataclass(frozen=True)
class FileResult:
    """What happened to one file."""

    path: str
    status: Status
    diagnostics: tuple[Diagnostic, ...] = ()
    diff: str = ""
    error: str = ""
    written: bool = False
    notebook: bool = False
    # The first line of the original that changes (Python files only).
    first_change: int | None = None
    # Apex amp / torch.cuda.amp names the rewrite removed: a summary for readers.
    migrated_apis: tuple[str, ...] = ()

    @property
    def needs_review(self) -> bool:
        return any(not diagnostic.fixed for diagnostic in self.diagnostics)


@dataclass
class Outcome:
    """Everything a run produced: results sorted by path, notes for the user, and
    whether Ctrl-C cut it short (then some files were never looked at)."""

    results: list[FileResult]
    notices: list[str] = field(default_factory=list)
    interrupted: bool = False


@dataclass(frozen=True)
class Settings:
    """What a worker needs to know, fixed for the whole run (picklable)."""

    options: Options
    write: bool
    want_diff: bool
    cache_dir: str | None
    fingerprint: str | None


def run(
    paths: list[Path],
    config: Config,
    progress: Callable[[int], Iterator[None]] | None = None,
) -> list[FileResult]:
    """Migrate every file under ``paths`` as ``config`` says; results sorted by path."""
    return execute(paths, config, progress).results


def execute(
    paths: list[Path],
    config: Config,
    progress: Callable[[int], Iterator[None]] | None = None,
) -> Outcome:
    """Migrate every file under ``paths``; stop cleanly on Ctrl-C.

    ``progress(n)``, when given, is called once the walk is over with the number of
    files that need parsing, and its iterator advanced once per such file (the CLI
    draws a bar with it).
    """
    cache = Cache(config.cache_dir, config.options) if config.cache_dir is not None else None
    index = cache.index(config.project_root) if cache is not None else None
    settings = Settings(
        config.options,
        config.write,
        config.diff,
        str(config.cache_dir) if config.cache_dir is not None else None,
        cache.fingerprint if cache is not None else None,
    )
    outcome = Outcome([])
    ticks: list[Iterator[None] | None] = [None]

    def done(result: FileResult) -> None:
        outcome.results.append(result)
        if ticks[0] is not None:
            next(ticks[0], None)

    pool = _LazyPool(config.jobs, settings, done)
    with _Interrupt() as interrupt:
        try:
            for item in iter_discover(paths, config):
                if interrupt.requested:
                    break
                if isinstance(item, Candidate):
                    result = _front(item, settings, cache, index, pool)
                    if result is not None:
                        outcome.results.append(result)
                    if pool.busy:
                        pool.poll()
                elif isinstance(item, DiscoveryError):
                    outcome.results.append(FileResult(item.display, Status.FAILED, error=item.reason))
                elif isinstance(item, Notice):
                    outcome.notices.append(f"{item.display}: {item.message}")
                elif isinstance(item, Leftover):
                    notice = _leftover(item, config.write)
                    if notice:
                        outcome.notices.append(notice)
            if progress is not None and pool.submitted and not interrupt.requested:
                bar = ticks[0] = progress(pool.submitted)
                for _ in range(pool.submitted - pool.pending):
                    next(bar, None)
            while pool.busy and not interrupt.requested:
                pool.poll(timeout=1.0)
            if interrupt.requested:
                outcome.interrupted = True
                pool.interrupt()  # a second Ctrl-C in here stops the files in progress at once
        except KeyboardInterrupt:  # the second Ctrl-C, outside pool.interrupt
            outcome.interrupted = True
            pool.interrupt(grace=0.0)
        finally:
            pool.close()
            if index is not None:
                index.save()
    outcome.results.sort(key=lambda result: result.path)
    outcome.notices.sort()
    return outcome


class _LazyPool:
    """The worker pool, started (and ``migrate.workers`` imported) at the first file that
    needs parsing: a run answered from the cache starts no process."""

    def __init__(self, jobs: int, settings: Settings, done: Callable[[FileResult], None]) -> None:
        self.args = (jobs, settings, done)
        self.pool: Pool | None = None

    def submit(self, candidate: Candidate, size: int) -> None:
        if self.pool is None:
            from migrate.workers import Pool, forks

            if forks():
                # Imported once here, so that every forked worker shares it, rather than
                # each paying for libcst again (imported, never used: nothing is parsed here).
                import migrate.engine  # noqa: F401
            jobs, settings, done = self.args
            self.pool = Pool(jobs, _setup_worker, settings, _lost, done)
        self.pool.submit(candidate, size)

    @property
    def busy(self) -> bool:
        return self.pool is not None and self.pool.busy

    @property
    def submitted(self) -> int:
        return self.pool.submitted if self.pool is not None else 0

    @property
    def pending(self) -> int:
        return self.pool.pending if self.pool is not None else 0

    def poll(self, timeout: float = 0.0) -> None:
        if self.pool is not None:
            self.pool.poll(timeout)

    def interrupt(self, grace: float | None = None) -> None:
        if self.pool is None:
            return
        if grace is None:
            self.pool.interrupt()
        else:
            self.pool.interrupt(grace)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()


class _Interrupt:
    """Ctrl-C as a request: the first one sets ``requested`` (the run stops taking new
    files and reports what was done), a second one raises KeyboardInterrupt."""

    def __init__(self) -> None:
        self.requested = False
        self.installed = False
        self.previous: object = None

    def __enter__(self) -> _Interrupt:
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._handle)
            self.installed = True
        return self

    def _handle(self, signum: int, frame: object) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc_info: object) -> None:
        import signal

        if self.installed:
            signal.signal(signal.SIGINT, self.previous if self.previous is not None else signal.SIG_DFL)  # type: ignore[arg-type]


def _front(
    candidate: Candidate, settings: Settings, cache: Cache | None, index: StatIndex | None, pool: _LazyPool
) -> FileResult | None:
    """Answer a file in the main process when no parse is needed; else queue it.

    With a cache, an unchanged stat answers without reading (the stat index); else the
    bytes are read, pre-filtered, and looked up by content.
    """
    info = None
    looked_at = 0.0
    if index is not None:
        looked_at = time.time()
        try:
            info = os.stat(candidate.path)
        except OSError:
            info = None  # _read reports it
        if info is not None and stat.S_ISREG(info.st_mode):
            verdict = index.lookup(candidate.path, info)
            if verdict == CLEAN:
                return FileResult(candidate.display, Status.UNCHANGED, notebook=candidate.is_notebook)
            if verdict and cache is not None:
                entry = _usable(cache.get(verdict), settings)
                if entry is not None:
                    return _finish(entry, candidate, info, settings)
        else:
            info = None
    loaded = _read(candidate, want_stat=settings.write)
    if isinstance(loaded, FileResult):
        return loaded
    data, file_stat = loaded
    if not may_need_migration(data):
        if index is not None and info is not None:
            index.record(candidate.path, info, CLEAN, looked_at)
        return FileResult(candidate.display, Status.UNCHANGED, notebook=candidate.is_notebook)
    if cache is not None:
        key = cache.key(data, candidate.is_notebook)
        if index is not None and info is not None:
            index.record(candidate.path, info, key, looked_at)
        entry = _usable(cache.get(key), settings)
        if entry is not None:
            return _finish(entry, candidate, file_stat, settings)
    pool.submit(candidate, len(data))
    return None


def _usable(entry: Entry | None, settings: Settings) -> Entry | None:
    # An entry stored without diffs cannot serve a run that shows them.
    if entry is not None and entry.status == "changed" and entry.diffs is None and settings.want_diff:
        return None
    return entry


def _leftover(item: Leftover, write: bool) -> str:
    state = leftover_state(Path(item.path), remove=write)
    if state == "removed":
        return f"{item.display}: removed, a temporary file left by an interrupted run"
    if state == "left":
        hint = "" if write else " (the next --write removes it)"
        return f"{item.display}: a temporary file left by an interrupted run{hint}"
    return ""  # another run is writing it right now


def _read(candidate: Candidate, want_stat: bool = True) -> tuple[bytes, os.stat_result | None] | FileResult:
    """The file's bytes, and its stat when ``want_stat`` (for the write's staleness check)."""
    try:
        # A FIFO or device named *.py would block or never end: only regular files,
        # checked before opening (opening a FIFO already blocks).
        if not candidate.regular and not stat.S_ISREG(os.stat(candidate.path).st_mode):
            return _failed(candidate, "not a regular file")
        descriptor = os.open(candidate.path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        try:
            # Plain reads on the descriptor: no buffered file object for a read that
            # happens once, for every file of the tree.
            chunks = [os.read(descriptor, _READ_SIZE)]
            while len(chunks[-1]) == _READ_SIZE:
                chunks.append(os.read(descriptor, _READ_SIZE))
            return b"".join(chunks), os.fstat(descriptor) if want_stat else None
        finally:
            os.close(descriptor)
    except OSError as error:
        return _failed(candidate, f"cannot read: {error.strerror or error}")


_READ_SIZE = 1 << 18


def _failed(candidate: Candidate, reason: str) -> FileResult:
    return FileResult(candidate.display, Status.FAILED, error=reason, notebook=candidate.is_notebook)


def _lost(candidate: Candidate, reason: str) -> FileResult:
    return _failed(candidate, reason)


# -- in a worker ---------------------------------------------------------------


def _setup_worker(settings: Settings) -> Callable[[Candidate], FileResult]:
    import migrate.engine  # noqa: F401 - paid for once, while the main process still walks

    cache = None
    if settings.cache_dir is not None:
        cache = Cache(Path(settings.cache_dir), settings.options, settings.fingerprint)
    return lambda candidate: process(candidate, settings, cache)


def process(candidate: Candidate, settings: Settings, cache: Cache | None = None) -> FileResult:
    """Migrate one file (reading it again: workers get paths, not bytes); never raises."""
    loaded = _read(candidate)
    if isinstance(loaded, FileResult):
        return loaded
    data, file_stat = loaded
    entry = migrate_bytes(data, candidate.is_notebook, settings.options, settings.want_diff)
    if cache is not None and _cacheable(entry):
        cache.put(cache.key(data, candidate.is_notebook), entry)
    return _finish(entry, candidate, file_stat, settings)


def _cacheable(entry: Entry) -> bool:
    # What the bytes say (they do not decode, do not parse) holds next time too; a crash
    # or a resource limit may not.
    return entry.status != "failed" or entry.error.startswith(("cannot decode", "cannot parse", "cannot migrate"))


def _finish(entry: Entry, candidate: Candidate, file_stat: os.stat_result | None, settings: Settings) -> FileResult:
    """The FileResult of ``entry`` for this file; with --write, the file is written."""
    notebook = candidate.is_notebook
    if entry.status == "failed":
        return _failed(candidate, entry.error)
    diagnostics = tuple(
        Diagnostic(candidate.display, line, column, code, message, fixed, cell)
        for cell, line, column, code, message, fixed in entry.findings
    )
    if entry.status != "changed":
        status = Status.SKIPPED if entry.status == "skipped" else Status.UNCHANGED
        return FileResult(candidate.display, status, diagnostics, notebook=notebook)
    diff = ""
    if settings.want_diff and entry.diffs is not None:
        diff = "".join(_diff_header(candidate.display + suffix) + body for suffix, body in entry.diffs if body)
    if settings.write:
        assert entry.new_data is not None
        try:
            write_atomic(Path(candidate.path), entry.new_data, file_stat)
        except StaleFileError as error:
            return _failed(candidate, str(error))
        except OSError as error:
            return _failed(candidate, f"cannot write: {error.strerror or error}")
    return FileResult(
        candidate.display,
        Status.CHANGED,
        diagnostics,
        diff,
        written=settings.write,
        notebook=notebook,
        first_change=entry.first_change,
        migrated_apis=entry.migrated_apis,
    )


def migrate_bytes(data: bytes, notebook: bool, options: Options, want_diff: bool) -> Entry:
    """What the engine makes of a file's bytes, as a path-free cache entry; never raises."""
    try:
        if notebook:
            return _migrate_notebook(data, options, want_diff)
        return _migrate_python(data, options, want_diff)
    except MemoryError:
        from migrate.workers import MEMORY_LIMIT

        return Entry("failed", error=f"ran out of memory (limit {MEMORY_LIMIT >> 20} MiB a worker); not written")
    except Exception as error:
        # Nothing was written: writes come after, and only from an entry.
        reason = f"internal error, file not written: {type(error).__name__}: {error}"
        return Entry("failed", error=reason + " (please report this)")


def _parse_failure(error: Exception, where: str = "", line: int | None = None) -> Entry | None:
    """The entry for a file the parsers refused, or None when ``error`` is something else."""
    from migrate.engine import InternalError, SourceSyntaxError, UnsupportedSyntaxError

    if isinstance(error, UnsupportedSyntaxError):
        return Entry(
            "failed",
            error=f"cannot migrate: libcst (the parser ampmigrate rewrites with) does not support this valid "
            f"Python: {where}line {line or error.line}, column {error.column}: {error.message}",
        )
    if isinstance(error, SourceSyntaxError):
        position = f"{where}line {line or error.line}, column {error.column}"
        return Entry("failed", error=f"cannot parse: {position}: {error.message}")
    if isinstance(error, InternalError):
        return Entry("failed", error=f"internal error, file not written: {error}")
    if isinstance(error, RecursionError):
        return Entry("failed", error="cannot migrate: nested too deeply for libcst")
    return None


def _findings(
    findings: Iterable[Finding], locate: Callable[[int], tuple[int, int]] | None = None
) -> tuple[tuple[int | None, int, int, str, str, bool], ...]:
    placed: list[tuple[int | None, int, int, str, str, bool]] = []
    for finding in findings:
        cell: int | None = None
        line = finding.line
        if locate is not None:
            cell, line = locate(finding.line)
        placed.append((cell, line, finding.column, finding.code, finding.message, finding.fixed))
    return tuple(placed)


def _migrate_python(data: bytes, options: Options, want_diff: bool) -> Entry:
    import tokenize

    from migrate.engine import migrate_source

    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        # bytes.decode never translates newlines, so CRLF files stay CRLF.
        text = data.decode(encoding)
    except (SyntaxError, UnicodeDecodeError, LookupError) as error:
        return Entry("failed", error=f"cannot decode: {error}")
    try:
        result = migrate_source(text, options)
    except Exception as error:
        failure = _parse_failure(error)
        if failure is None:
            raise
        return failure
    findings = _findings(result.findings)
    if result.skipped:
        return Entry("skipped", findings)
    if not result.changed:
        return Entry("unchanged", findings)
    try:
        new_data = result.source.encode(encoding)  # utf-8-sig puts the BOM back
    except UnicodeEncodeError as error:
        return Entry("failed", error=f"internal error, file not written: cannot encode as {encoding}: {error}")
    return Entry.changed(
        findings,
        new_data,
        encoding=encoding,
        diffs=(("", _diff_body(text, result.source)),) if want_diff else None,
        first_change=_first_change(text, result.source),
        migrated_apis=migrated_apis(text, result.source),
    )


def _migrate_notebook(data: bytes, options: Options, want_diff: bool) -> Entry:
    from migrate import notebook as nb
    from migrate.engine import migrate_source

    try:
        notebook = nb.load(data)
        if not nb.is_python(notebook):
            return Entry("unchanged")
        program = nb.to_program(notebook)
    except nb.NotebookError as error:
        return Entry("failed", error=str(error))
    if program is None:
        return Entry("unchanged")
    try:
        result = migrate_source(program.text, options)
    except Exception as error:
        from migrate.engine import SourceSyntaxError

        if isinstance(error, SourceSyntaxError):
            cell, line = program.locate(error.line)
            failure = _parse_failure(error, f"cell {cell}, ", line)
        else:
            failure = _parse_failure(error)
        if failure is None:
            raise
        return failure
    findings = _findings(result.findings, program.locate)
    if result.skipped:
        return Entry("skipped", findings)
    if not result.changed:
        return Entry("unchanged", findings)
    try:
        sources = nb.from_program(notebook, program, result.source)
        originals = {index: nb.cell_source(notebook.cells[index]) for index in sources}
        new_data = nb.dump(notebook, sources)
    except nb.NotebookError as error:
        return Entry("failed", error=str(error) if error.args[0].startswith("internal") else f"not written: {error}")
    if not sources:
        return Entry("unchanged", findings)
    diffs = None
    if want_diff:
        diffs = tuple((f":cell {index + 1}", _diff_body(originals[index], sources[index])) for index in sorted(sources))
    return Entry.changed(
        findings,
        new_data,
        diffs=diffs,
        migrated_apis=migrated_apis(program.text, result.source),
    )


_API_USE = re.compile(r"\btorch\.(?:cuda|cpu)\.amp\.\w+|\bamp\.\w+|\bfrom apex(?:\.\w+)* import")


def migrated_apis(old: str, new: str) -> tuple[str, ...]:
    """The Apex amp (and deprecated torch.cuda.amp) names used less after the rewrite.

    A reader's summary of what changed, for the Markdown report; findings remain the
    authority on what needs review.
    """
    before = Counter(match.group(0) for match in _API_USE.finditer(old))
    after = Counter(match.group(0) for match in _API_USE.finditer(new))
    return tuple(sorted(name for name, count in before.items() if after[name] < count))


def _first_change(old: str, new: str) -> int:
    old_lines, new_lines = old.splitlines(), new.splitlines()
    for number, (before, after) in enumerate(zip(old_lines, new_lines), start=1):
        if before != after:
            return number
    return min(len(old_lines), len(new_lines)) + 1


def unified_diff(old: str, new: str, name: str) -> str:
    """A unified diff that ``git apply`` / ``patch -p1`` accept, line endings kept."""
    body = _diff_body(old, new)
    return _diff_header(name) + body if body else ""


def _diff_header(name: str) -> str:
    # a/ and b/ prefixes let `git apply` take the diff; an absolute path has no such use.
    before, after = (name, name) if os.path.isabs(name) else (f"a/{name}", f"b/{name}")
    return f"--- {before}\n+++ {after}\n"


def _diff_body(old: str, new: str) -> str:
    """The hunks of a unified diff, without the two header lines that name the file."""
    import difflib

    lines = difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True), "", "")
    next(lines, None)
    next(lines, None)
    return "".join(_terminate(lines))


def _terminate(lines: Iterable[str]) -> Iterator[str]:
    for line in lines:
        if line.endswith("\n"):
            yield line
        else:
            yield line + "\n\\ No newline at end of file\n"
