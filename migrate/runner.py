"""Running the engine over files: read, pre-filter, plan the project, migrate, write.

The main process walks the tree, reads each file and drops those the byte pre-filter
clears (with a result cache, a stat index answers such a file without reading it
again). The files that pass are migrated as one project (``migrate.project``): once
the walk is over, their text is indexed with ``ast`` (each module's summary comes from
the summary store when its bytes, or for a module only imported, its stat, are as
recorded), each file gets its facts, and
each is answered from the result cache (keyed on its bytes and its full options,
facts included) or sent to a worker process that parses it (see ``migrate.workers``).
The groups that came out half migrated are settled by migrating some files again;
only then does the main process write the changed files. Neither libcst nor the
engine is imported in the main process.

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
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

from migrate import cache as cache_module
from migrate.atomic import StaleFileError, leftover_state, write_atomic
from migrate.cache import CLEAN, NO_SUMMARY, PASSES, Cache, Entry, StatIndex, SummaryStore
from migrate.config import Config
from migrate.discovery import Candidate, iter_discover
from migrate.options import ModuleFacts, Options, ScalerInfo
from migrate.prefilter import may_need_migration

if TYPE_CHECKING:
    from migrate.ahead import Held, Prepare, Ready
    from migrate.findings import Finding
    from migrate.project import ModuleSummary, ProjectPlan
    from migrate.records import Diagnostic, Job, Leftover, Task
    from migrate.workers import Pool

# Modules only some runs need (worker pools, diffs, notebooks, the engine) are imported
# where they are used: a pre-commit run on one clean file has a budget of 0.1 s.


class Status(str, Enum):
    UNCHANGED = "unchanged"
    CHANGED = "changed"  # would change, or was written with --write
    SKIPPED = "skipped"  # a file-level `# ampmigrate: skip`
    FAILED = "failed"


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
    # how the file's Apex amp setup came out (project mode settles groups of files by it)
    amp_left: bool = False
    amp_migrated: bool = False
    scalers: tuple[ScalerInfo, ...] = ()
    scaler_unused: bool = False
    # the bytes to write (the main process writes, once the project is settled)
    new_data: bytes | None = field(default=None, repr=False, compare=False)
    # the worker (process id) that kept the file's trees: a later pass migrates it there
    held_by: int | None = field(default=None, repr=False, compare=False)

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

    A first Ctrl-C during the walk ends the walk: the files found so far are migrated
    as a project of their own (as if only they had been given). A first Ctrl-C while
    the files are migrated lets the files in progress finish and writes nothing (a group
    of modules could be left half migrated). A second Ctrl-C stops at once.
    """
    cache = Cache(config.cache_dir, config.options) if config.cache_dir is not None else None
    index = cache.index(config.project_root) if cache is not None else None
    summaries = cache.summaries(config.project_root) if cache is not None else None
    translations = cache.translations() if cache is not None else None
    listings: dict[str, set[str]] = {}  # the names in each folder discovery searched
    settings = Settings(
        config.options,
        config.write,
        config.diff,
        str(config.cache_dir) if config.cache_dir is not None else None,
        cache.fingerprint if cache is not None else None,
    )
    outcome = Outcome([])
    tasks: list[Task] = []
    pool = _LazyPool(config.jobs, settings)
    with _Interrupt() as interrupt:
        try:
            for item in iter_discover(paths, config, translations, listings):
                if interrupt.requested:
                    break
                if isinstance(item, Candidate):
                    front = _front(item, settings, index)
                    if isinstance(front, FileResult):
                        outcome.results.append(front)
                    elif front is not None:
                        tasks.append(front)
                        if not front.known and (
                            summaries is None or summaries.by_digest(item.path, summaries.digest(front.data)) is None
                        ):
                            # A file an earlier run took as it is now (by its stat, else by the
                            # bytes the summary store knows) most likely has its results in the
                            # cache: a warm run starts no worker.
                            pool.prepare(front)
                    pool.poll()  # hand the workers more files to parse ahead
                    continue
                from migrate.records import DiscoveryError, Leftover, Notice  # rare: not for every file

                if isinstance(item, DiscoveryError):
                    outcome.results.append(FileResult(item.display, Status.FAILED, error=item.reason))
                elif isinstance(item, Notice):
                    outcome.notices.append(f"{item.display}: {item.message}")
                elif isinstance(item, Leftover):
                    notice = _leftover(item, config.write)
                    if notice:
                        outcome.notices.append(notice)
            if interrupt.requested:
                outcome.interrupted = True
                interrupt.requested = False  # the files in hand are finished; a new Ctrl-C stops them
            if tasks:
                project = _Project(tasks, settings, cache, summaries, pool, interrupt, listings)
                results = project.migrate(progress)
                if interrupt.requested:
                    # Nothing of the project is written (a group could be left half migrated):
                    # a file that would have been written is not done, so it is not reported.
                    outcome.interrupted = True
                    results = [
                        replace(result, new_data=None)
                        for result in results
                        if not (settings.write and result.status is Status.CHANGED)
                    ]
                outcome.results.extend(_write(results, tasks, settings.write))
        except KeyboardInterrupt:  # the second Ctrl-C, outside pool.interrupt
            outcome.interrupted = True
            pool.interrupt(grace=0.0)
        finally:
            pool.close()
            if index is not None:
                index.save()
            if summaries is not None:
                summaries.save()
            if translations is not None:
                translations.save()
    outcome.results.sort(key=lambda result: result.path)
    outcome.notices.sort()
    return outcome


class _Project:
    """The files that passed the pre-filter, migrated as one project: each amp setup
    whole, across modules, or not at all.

    A first pass migrates every file with what the project index knows (``ModuleFacts``);
    the modules of a group that came out half migrated are then migrated again with new
    facts (at most three more passes), and only then are changed files written.

    With a cache, the run remembers its plan's outcome: which result entry each file
    ended with, under a key of every input the plan had (each given file's path and bytes,
    the options, the project roots above them), beside the stat of every other module the
    plan looked for (found or not). A later run with the same inputs, where none of those
    modules changed, appeared or went away, takes each file's entry as it is: no summaries,
    no plan, no settling.
    """

    def __init__(
        self,
        tasks: list[Task],
        settings: Settings,
        cache: Cache | None,
        store: SummaryStore | None,
        pool: _LazyPool,
        interrupt: _Interrupt,
        listings: dict[str, set[str]] | None = None,
    ) -> None:
        self.settings = settings
        self.cache = cache
        self.store = store
        self.pool = pool
        self.interrupt = interrupt
        self.listings = listings or {}
        self.by_path = {str(task.candidate.path): task for task in tasks}
        self.summaries = _Summaries(store, pool.poll)
        self.results: dict[str, FileResult] = {}
        self.keys: dict[str, str] = {}  # the cache key of the entry each file's result came from

    def _plan(self) -> ProjectPlan:
        from migrate.project import ProjectPlan

        given = [
            summary
            for path, task in self.by_path.items()
            if not task.candidate.is_notebook
            and (summary := self.summaries.of_bytes(path, task.data, task.seen, task.looked_at)) is not None
        ]
        displays = {summary.path: self.by_path[summary.path].candidate.display for summary in given}
        return ProjectPlan(given, displays, self.summaries.of_file, searched=self.listings)

    def migrate(self, progress: Callable[[int], Iterator[None]] | None) -> list[FileResult]:
        record = self._record_key()
        if record is not None and self._replay(record):
            return list(self.results.values())
        from migrate.project import Outcome as AmpOutcome  # not for a replay: a warm run does without

        self.plan = self._plan()
        self._pass(list(self.by_path), progress)
        # a group settles in at most three passes: as found, with its scaler shared, frozen
        for _ in range(3):
            if self.interrupt.requested:
                break
            outcome = {
                path: AmpOutcome(result.amp_left, result.amp_migrated, result.scalers, result.scaler_unused)
                for path, task in self.by_path.items()
                if (result := self.results.get(task.candidate.display)) is not None
            }
            again = self.plan.settle(outcome)
            if not again:
                break
            self._pass(sorted(again), None)
        if record is not None and self.store is not None and not self.interrupt.requested:
            probes, racy = self._probes()
            if not racy and len(self.keys) == len(self.by_path):
                self.store.record_plan(record, probes, self.keys)
        return list(self.results.values())

    def _probes(self) -> tuple[dict[str, list[int] | None], bool]:
        """What the plan depends on beyond the given files, each path with its stat signature (the
        modules it looked for, and the files and folders it read to decide), and whether one of
        them changed too recently for its stat to tell a later change."""
        probes = dict(self.summaries.probes)
        racy = self.summaries.racy
        now = time.time()
        for path in sorted(self.plan.reads - set(probes) - set(self.by_path)):
            try:
                info = os.stat(path)
            except OSError:
                probes[path] = None
                continue
            probes[path] = StatIndex.signature(info)
            racy = racy or now - max(info.st_mtime, info.st_ctime) < cache_module._RACY_S
        return probes, racy

    def _record_key(self) -> str | None:
        """The key of all the plan depends on, but for the modules it looks for; None without a cache."""
        if self.cache is None or self.store is None:
            return None
        from migrate.roots import project_root

        # the working folder too: findings name modules that were not given relative to it
        digest = cache_module.sha256(self.cache.salt + os.fsencode(os.getcwd()))
        for path in sorted(self.by_path):
            task = self.by_path[path]
            kind = "ipynb" if task.candidate.is_notebook else "py"
            text = f"\0{path}\0{task.candidate.display}\0{kind}\0{project_root(path)}\0"
            digest.update(text.encode("utf-8", "surrogateescape"))
            digest.update(self.store.digest(task.data).encode())
        return digest.hexdigest()

    def _replay(self, record: str) -> bool:
        """Take the results of the plan recorded under ``record``, if it still holds."""
        assert self.store is not None and self.cache is not None
        recorded = self.store.plan(record)
        if recorded is None:
            return False
        probes, keys = recorded
        if set(keys) != set(self.by_path):
            return False
        absent: dict[str, bool] = {}
        for path, signature in probes:
            if signature is None and _missing(path, self.listings, absent):
                continue  # absent then, and now
            if _signature(path) != signature:
                return False
        results = {}
        for path, key in keys.items():
            task = self.by_path[path]
            entry = _usable(self.cache.get(key), self.settings)
            if entry is None:
                return False
            results[task.candidate.display] = _finish(entry, task.candidate, self.settings)
        self.results = results
        return True

    def _options(self, path: str) -> Options:
        found: ModuleFacts | None = self.plan.facts.get(path)
        if os.path.basename(path) == "__init__.py":
            found = replace(found or ModuleFacts(), package_init=True)
        return self.settings.options if found is None else replace(self.settings.options, facts=found)

    def _pass(self, paths: list[str], progress: Callable[[int], Iterator[None]] | None) -> None:
        """Migrate ``paths`` with their current facts: from the cache, else in the workers."""
        from migrate.records import Job

        jobs: list[Job] = []
        for path in paths:
            task = self.by_path[path]
            options = self._options(path)
            if self.cache is not None:
                key = self.keys[path] = self.cache.key(task.data, task.candidate.is_notebook, options)
                entry = _usable(self.cache.get(key), self.settings)
                if entry is not None:
                    self.results[task.candidate.display] = _finish(entry, task.candidate, self.settings)
                    continue
            jobs.append(Job(task.candidate, task.data, options))
        self.pool.drop_prepared()  # a file about to be migrated is parsed then
        if not jobs:
            return
        ticks = progress(len(jobs)) if progress is not None else None

        path_of = {job.candidate.display: str(job.candidate.path) for job in jobs}

        def done(result: FileResult) -> None:
            if result.held_by is not None:
                self.pool.holders[path_of[result.path]] = result.held_by
                result = replace(result, held_by=None)
            self.results[result.path] = result
            if ticks is not None:
                next(ticks, None)

        self.pool.done = done
        for job in jobs:
            self.pool.submit(job, len(job.data), self.pool.holder(str(job.candidate.path)))
        while self.pool.busy and not self.interrupt.requested:
            self.pool.poll(timeout=1.0)
        if self.interrupt.requested:
            self.pool.interrupt()  # a second Ctrl-C in here stops the files in progress at once


class _LazyPool:
    """The worker pool, started (and ``migrate.workers`` imported) at the first file that
    needs parsing: a run answered from the cache starts no process."""

    def __init__(self, jobs: int, settings: Settings) -> None:
        self.jobs = jobs
        self.settings = settings
        self.pool: Pool | None = None
        self.done: Callable[[FileResult], None] = lambda result: None
        self.ahead = 0  # bytes sent to be parsed ahead
        self.holders: dict[str, int] = {}  # path: the worker that holds its trees
        self.frozen = False  # this process's objects are out of the cycle collector's sight

    def prepare(self, task: Task) -> None:
        """Have a worker parse ``task``'s file ahead, if the workers' room for trees allows."""
        from migrate.ahead import AHEAD_BYTES, Prepare

        if task.candidate.is_notebook or self.ahead + len(task.data) > AHEAD_BYTES * self.jobs:
            return
        self.ahead += len(task.data)
        self.submit(Prepare(task.candidate, task.data), len(task.data))

    def holder(self, path: str) -> int | None:
        return self.holders.get(path)

    def drop_prepared(self) -> None:
        if self.pool is not None:
            from migrate.ahead import Prepare

            self.pool.drop(lambda job: isinstance(job, Prepare))

    def _done(self, result: FileResult | Ready) -> None:
        if not isinstance(result, FileResult):  # a Ready
            if result.worker is not None:
                self.holders[result.path] = result.worker
        else:
            self.done(result)

    def submit(self, job: Job | Prepare, size: int, prefer: int | None = None) -> None:
        if self.pool is None:
            from migrate.workers import Pool, forks

            if forks():
                # Imported once here, so that every forked worker shares it, rather than
                # each paying for libcst again (imported, never used: nothing is parsed here).
                import gc

                from migrate.gcpause import cycle_collector_paused
                from migrate.quickimport import import_engine

                with cycle_collector_paused():
                    import_engine()
                    # What is alive now (the modules, above all) stays for the whole run: moved
                    # out of the cycle collector's sight, its passes here and in every worker
                    # skip it. Before the collector is back: its first pass would otherwise walk
                    # every object the import made (some ms) only to find them all alive.
                    self.frozen = gc.get_freeze_count() == 0  # else not ours to undo at the end
                    gc.freeze()
            self.pool = Pool(self.jobs, _setup_worker, self.settings, _lost, self._done)
        from migrate.records import Job

        # a batch of jobs is queued whole before the workers pick (see _Project._pass)
        self.pool.submit(job, size, prefer, dispatch=not isinstance(job, Job))

    @property
    def busy(self) -> bool:
        return self.pool is not None and self.pool.busy

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
        if self.frozen:
            import gc

            # back in sight for a process that goes on (a library caller, a test session)
            gc.unfreeze()
            self.frozen = False


class _Interrupt:
    """Ctrl-C as a request: the first one sets ``requested`` (the run stops taking new
    files and reports what was done), a second one raises KeyboardInterrupt."""

    def __init__(self) -> None:
        self.requested = False
        self.count = 0
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
        self.count += 1
        if self.count > 1:
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc_info: object) -> None:
        import signal

        if self.installed:
            signal.signal(signal.SIGINT, self.previous if self.previous is not None else signal.SIG_DFL)  # type: ignore[arg-type]


def _front(candidate: Candidate, settings: Settings, index: StatIndex | None) -> FileResult | Task | None:
    """Answer a file the pre-filter clears in the main process; else hand back its bytes.

    With a cache, a file the pre-filter cleared before and whose stat is unchanged is
    answered without reading (the stat index). A file that passes is always read: the
    project plan needs its text, and its cache entry depends on its facts.
    """
    info = None
    looked_at = 0.0
    verdict = None
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
    if index is not None and info is not None and verdict != PASSES:
        index.record(candidate.path, info, PASSES, looked_at)
    from migrate.records import Task

    return Task(candidate, data, file_stat, info, looked_at, known=verdict == PASSES)


def _usable(entry: Entry | None, settings: Settings) -> Entry | None:
    # An entry stored without diffs cannot serve a run that shows them.
    if entry is not None and entry.status == "changed" and entry.diffs is None and settings.want_diff:
        return None
    return entry


def _decoded(data: bytes) -> str | None:
    import tokenize

    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        return data.decode(encoding)
    except (SyntaxError, UnicodeDecodeError, LookupError):
        return None


class _Summaries:
    """Project summaries of modules (``migrate.project.summarize``), from the summary store
    when the module's bytes (or, for a module read only as context, its stat) are as
    recorded; else from its text, then stored."""

    def __init__(self, store: SummaryStore | None, tick: Callable[[], None] = lambda: None) -> None:
        self.store = store
        self.tick = tick  # called before each module is summarized (the workers get more to do)
        # Several modules import the same one, and look for it where it is not: once a path.
        self.files: dict[str, ModuleSummary | None] = {}
        # the stat signature (None: no such file) of every module looked for, and whether one
        # of them changed too recently for its stat to tell a later change
        self.probes: dict[str, list[int] | None] = {}
        self.racy = False

    def of_bytes(
        self, path: str, data: bytes, info: os.stat_result | None = None, looked_at: float = 0.0
    ) -> ModuleSummary | None:
        from migrate.project import summarize, summary_to_json

        digest = ""
        if self.store is not None:
            digest = self.store.digest(data)
            stored = self.store.by_digest(path, digest)
            if stored is not None:
                loaded = self._load(path, stored)
                if loaded is not _MISS:
                    return loaded  # type: ignore[return-value]
        self.tick()
        text = _decoded(data)
        summary = summarize(path, text) if text is not None else None
        if self.store is not None:
            document = summary_to_json(summary) if summary is not None else NO_SUMMARY
            self.store.record(path, info, digest, document, looked_at)
        return summary

    def of_file(self, path: str) -> ModuleSummary | None:
        """The summary of a module that was not given; None if it is no file or does not parse."""
        if path not in self.files:
            self.files[path] = self._of_file(path)
        return self.files[path]

    def _of_file(self, path: str) -> ModuleSummary | None:
        looked_at = time.time()
        try:
            info = os.stat(path)
        except OSError:
            info = None
        if info is None or not stat.S_ISREG(info.st_mode):
            self.probes[path] = None
            return None
        self.probes[path] = StatIndex.signature(info)
        self.racy = self.racy or looked_at - max(info.st_mtime, info.st_ctime) < cache_module._RACY_S
        if self.store is not None:
            stored = self.store.by_stat(path, info)
            if stored is not None:
                loaded = self._load(path, stored)
                if loaded is not _MISS:
                    return loaded  # type: ignore[return-value]
        try:
            with open(path, "rb") as stream:
                data = stream.read()
        except OSError:
            return None
        return self.of_bytes(path, data, info, looked_at)

    @staticmethod
    def _load(path: str, stored: object) -> ModuleSummary | None | object:
        from migrate.project import summary_from_json

        if stored == NO_SUMMARY:
            return None
        try:
            return summary_from_json(path, stored)  # type: ignore[arg-type]
        except (KeyError, TypeError, ValueError):
            return _MISS  # damaged: summarized again and stored anew


_MISS = object()


def _missing(path: str, listings: dict[str, set[str]], memo: dict[str, bool] | None = None) -> bool:
    """Whether ``path`` is certainly absent by what discovery found: the nearest folder above
    it that this run searched has no entry on the way to it (``pkg`` for ``pkg/sub/m.py``).
    ``memo`` keeps the answers for folders no search listed, for the calls of one replay (the
    modules a plan looked for and did not find share a few such folders)."""
    folder = os.path.dirname(path)
    if folder == path:
        return False  # the root: nothing above it was searched
    names = listings.get(folder)
    if names is not None:
        return os.path.basename(path) not in names
    # not searched: absent exactly when that folder is (the nearest searched folder decides)
    if memo is None:
        return _missing(folder, listings)
    known = memo.get(folder)
    if known is None:
        known = memo[folder] = _missing(folder, listings, memo)
    return known


def _signature(path: str) -> list[int] | None:
    """The stat signature of the regular file (or folder: its entries) ``path``; None if there is none."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return StatIndex.signature(info) if stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode) else None


def _write(results: list[FileResult], tasks: list[Task], write: bool) -> list[FileResult]:
    """Write the changed files (``--write``), now that every group is settled."""
    by_display = {task.candidate.display: task for task in tasks}
    written = []
    for result in results:
        task = by_display[result.path]
        if result.status is Status.CHANGED and write and result.new_data is not None:
            try:
                write_atomic(Path(task.candidate.path), result.new_data, task.file_stat)
            except StaleFileError as error:
                result = _failed(task.candidate, str(error))
            except OSError as error:
                result = _failed(task.candidate, f"cannot write: {error.strerror or error}")
            else:
                result = replace(result, written=True)
        written.append(replace(result, new_data=None))
    return written


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


def _lost(job: Job | Prepare, reason: str) -> FileResult | Ready:
    from migrate.records import Job

    if not isinstance(job, Job):  # a Prepare: its migration meets the same end, and says so
        from migrate.ahead import Ready

        return Ready(str(job.candidate.path), None)
    return _failed(job.candidate, reason)


# -- in a worker ---------------------------------------------------------------


def _setup_worker(settings: Settings) -> Callable[[Job | Prepare], FileResult | Ready]:
    from migrate.quickimport import import_engine

    import_engine()  # paid for once per worker (where not forked from a process that did)
    from migrate.records import Job

    cache = None
    if settings.cache_dir is not None:
        cache = Cache(Path(settings.cache_dir), settings.options, settings.fingerprint)
    from migrate.ahead import Prepare, prepare

    ahead: dict[str, Held] = {}  # path: its trees, parsed ahead

    def handle(job: Job | Prepare) -> FileResult | Ready:
        path = str(job.candidate.path)
        if not isinstance(job, Job):
            return prepare(job, ahead)
        held = ahead.get(path)
        if (held is None or held.data != job.data) and not job.candidate.is_notebook:
            # parsed as ahead and kept (room allowing): a pass that migrates the file again
            # with new facts (a project's group settling) takes its trees instead of parsing
            prepare(Prepare(job.candidate, job.data), ahead)
            held = ahead.get(path)
        if held is None or held.data != job.data:
            return process(job, settings, cache)
        return replace(process(job, settings, cache, held), held_by=os.getpid())

    return handle


def process(job: Job, settings: Settings, cache: Cache | None = None, held: Held | None = None) -> FileResult:
    """Migrate one file's bytes with its options; never raises, never writes (the main
    process writes once the project is settled). ``held``: its trees, parsed ahead."""
    notebook = job.candidate.is_notebook
    entry = migrate_bytes(job.data, notebook, job.options, settings.want_diff, held)
    if cache is not None and _cacheable(entry):
        cache.put(cache.key(job.data, notebook, job.options), entry)
    return _finish(entry, job.candidate, settings)


def _cacheable(entry: Entry) -> bool:
    # What the bytes say (they do not decode, do not parse) holds next time too; a crash
    # or a resource limit may not.
    return entry.status != "failed" or entry.error.startswith(("cannot decode", "cannot parse", "cannot migrate"))


def _finish(entry: Entry, candidate: Candidate, settings: Settings) -> FileResult:
    """The FileResult of ``entry`` for this file; with --write it carries the bytes to write."""
    from migrate.records import Diagnostic

    notebook = candidate.is_notebook
    if entry.status == "failed":
        return _failed(candidate, entry.error)
    diagnostics = tuple(
        Diagnostic(candidate.display, line, column, code, message, fixed, cell)
        for cell, line, column, code, message, fixed in entry.findings
    )
    if entry.status == "skipped":
        return FileResult(candidate.display, Status.SKIPPED, diagnostics, notebook=notebook)
    if entry.status != "changed":
        return FileResult(candidate.display, Status.UNCHANGED, diagnostics, notebook=notebook, amp_left=entry.amp_left)
    diff = ""
    if settings.want_diff and entry.diffs is not None:
        diff = "".join(_diff_header(candidate.display + suffix) + body for suffix, body in entry.diffs if body)
    return FileResult(
        candidate.display,
        Status.CHANGED,
        diagnostics,
        diff,
        notebook=notebook,
        first_change=entry.first_change,
        migrated_apis=entry.migrated_apis,
        amp_left=entry.amp_left,
        amp_migrated=entry.amp_migrated,
        scalers=entry.scalers,
        scaler_unused=entry.scaler_unused,
        # decoded only when it is written
        new_data=entry.new_data if settings.write else None,
    )


def migrate_bytes(data: bytes, notebook: bool, options: Options, want_diff: bool, held: Held | None = None) -> Entry:
    """What the engine makes of a file's bytes, as a path-free cache entry; never raises.
    ``held``: the trees of these very bytes, parsed ahead (Python files only)."""
    try:
        if notebook:
            return _migrate_notebook(data, options, want_diff)
        return _migrate_python(data, options, want_diff, held)
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


def _migrate_python(data: bytes, options: Options, want_diff: bool, held: Held | None = None) -> Entry:
    import tokenize

    from migrate.engine import migrate_source

    if held is not None:  # decoded as below when it was parsed ahead
        encoding, text = held.encoding, held.parsed.source
    else:
        try:
            encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
            # bytes.decode never translates newlines, so CRLF files stay CRLF.
            text = data.decode(encoding)
        except (SyntaxError, UnicodeDecodeError, LookupError) as error:
            return Entry("failed", error=f"cannot decode: {error}")
    try:
        if held is not None:
            from migrate.engine import hold

            hold(held.parsed)
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
        return Entry("unchanged", findings, amp_left=result.amp_left)
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
        amp_left=result.amp_left,
        amp_migrated=result.amp_migrated,
        scalers=result.scalers,
        scaler_unused=result.scaler_unused,
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
        # what the project plan needs to keep it beside modules that stay on Apex (a notebook is in
        # no group: its amp_left/amp_migrated are not reported)
        scalers=result.scalers,
        scaler_unused=result.scaler_unused,
    )


_API_USE = r"\btorch\.(?:cuda|cpu)\.amp\.\w+|\bamp\.\w+|\bfrom apex(?:\.\w+)* import"


def migrated_apis(old: str, new: str) -> tuple[str, ...]:
    """The Apex amp (and deprecated torch.cuda.amp) names used less after the rewrite.

    A reader's summary of what changed, for the Markdown report; findings remain the
    authority on what needs review.
    """
    from collections import Counter

    # compiled here (re caches it): a run with nothing to migrate never needs it
    before = Counter(match.group(0) for match in re.finditer(_API_USE, old))
    after = Counter(match.group(0) for match in re.finditer(_API_USE, new))
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
