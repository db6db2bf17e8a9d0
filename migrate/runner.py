"""Running the engine over files: read, pre-filter, migrate, diff/check/write.

Each file's outcome is a small picklable ``FileResult``; exceptions are caught only
at the file boundary, so one bad file never stops the run. Results come back in
sorted path order whatever the number of jobs. ``migrate.engine`` (and with it
libcst) is imported only once some file passes the byte pre-filter.
"""

from __future__ import annotations

import io
import os
import re
import stat
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

from migrate.atomic import StaleFileError, write_atomic
from migrate.config import Config
from migrate.discovery import Candidate, discover
from migrate.findings import Finding
from migrate.options import ModuleFacts, Options, ScalerInfo
from migrate.prefilter import may_need_migration

if TYPE_CHECKING:
    import multiprocessing.context

# Modules only some runs need (worker pools, diffs, notebooks) are imported where
# they are used: a pre-commit run on one clean file has a budget of 0.1 s.

# Below this much candidate source, starting worker processes costs more than it saves.
_PARALLEL_MIN_BYTES = 256 * 1024


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
    # how the file's Apex amp setup came out (project mode settles groups of files by it)
    amp_left: bool = False
    amp_migrated: bool = False
    scalers: tuple[ScalerInfo, ...] = ()
    scaler_unused: bool = False
    # the bytes to write (the main process writes, once the project is settled)
    new_data: bytes | None = field(default=None, repr=False, compare=False)

    @property
    def needs_review(self) -> bool:
        return any(not diagnostic.fixed for diagnostic in self.diagnostics)


@dataclass(frozen=True)
class _Task:
    candidate: Candidate
    data: bytes
    file_stat: os.stat_result
    options: Options
    write: bool
    want_diff: bool


def run(
    paths: list[Path],
    config: Config,
    progress: Callable[[int], Iterator[None]] | None = None,
) -> list[FileResult]:
    """Migrate every file under ``paths`` as ``config`` says; results sorted by path.

    ``progress(n)``, when given, is called with the number of files that need
    parsing and its iterator advanced once per file (the CLI draws a bar with it).
    """
    candidates, errors = discover(paths, config)
    results = [FileResult(error.display, Status.FAILED, error=error.reason) for error in errors]
    tasks: list[_Task] = []
    for candidate in candidates:
        loaded = _read(candidate)
        if isinstance(loaded, FileResult):
            results.append(loaded)
        elif not may_need_migration(loaded[0]):
            results.append(FileResult(candidate.display, Status.UNCHANGED, notebook=candidate.is_notebook))
        else:
            tasks.append(
                _Task(
                    candidate,
                    loaded[0],
                    loaded[1],
                    config.options,
                    config.write,
                    config.diff,
                )
            )
    results.extend(_write(_migrate_project(tasks, config.jobs, progress), tasks))
    return sorted(results, key=lambda result: result.path)


def _migrate_project(
    tasks: list[_Task], jobs: int, progress: Callable[[int], Iterator[None]] | None
) -> list[FileResult]:
    """Migrate the files as one project: each amp setup whole, across modules, or not at all.

    A first pass migrates every file with what the project index knows (``ModuleFacts``);
    the modules of a group that came out half migrated are then migrated again, frozen.
    """
    from migrate.project import Outcome, ProjectPlan

    by_path = {str(task.candidate.path): task for task in tasks}
    sources = {
        path: text
        for path, task in by_path.items()
        if not task.candidate.is_notebook and (text := _decoded(task.data)) is not None
    }
    project = ProjectPlan(sources, {path: by_path[path].candidate.display for path in sources}, _source_on_disk)
    results = {
        result.path: result for result in _migrate_all([_with_facts(t, project.facts) for t in tasks], jobs, progress)
    }
    # a group settles in at most three passes: as found, with its scaler shared, frozen
    for _ in range(3):
        outcome = {
            path: Outcome(result.amp_left, result.amp_migrated, result.scalers, result.scaler_unused)
            for path, task in by_path.items()
            if (result := results[task.candidate.display])
        }
        again = project.settle(outcome)
        if not again:
            break
        redo = [_with_facts(by_path[path], project.facts) for path in sorted(again)]
        results.update((result.path, result) for result in _migrate_all(redo, jobs, None))
    return list(results.values())


def _with_facts(task: _Task, facts: dict[str, ModuleFacts]) -> _Task:
    found = facts.get(str(task.candidate.path))
    return task if found is None else replace(task, options=replace(task.options, facts=found))


def _decoded(data: bytes) -> str | None:
    import tokenize

    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        return data.decode(encoding)
    except (SyntaxError, UnicodeDecodeError, LookupError):
        return None


def _source_on_disk(path: str) -> str | None:
    """The text of a project module that was not given (read only to follow imports)."""
    try:
        if not os.path.isfile(path):
            return None
        with open(path, "rb") as stream:
            return _decoded(stream.read())
    except OSError:
        return None


def _write(results: list[FileResult], tasks: list[_Task]) -> list[FileResult]:
    """Write the changed files (``--write``), now that every group is settled."""
    by_display = {task.candidate.display: task for task in tasks}
    written = []
    for result in results:
        task = by_display[result.path]
        if result.status is Status.CHANGED and task.write and result.new_data is not None:
            try:
                write_atomic(task.candidate.path, result.new_data, task.file_stat)
            except StaleFileError as error:
                result = _failed(task.candidate, str(error))
            except OSError as error:
                result = _failed(task.candidate, f"cannot write: {error.strerror or error}")
            else:
                result = replace(result, written=True)
        written.append(replace(result, new_data=None))
    return written


def _read(candidate: Candidate) -> tuple[bytes, os.stat_result] | FileResult:
    try:
        # A FIFO or device named *.py would block or never end: only regular files,
        # checked before opening (opening a FIFO already blocks).
        if not stat.S_ISREG(os.stat(candidate.path).st_mode):
            return _failed(candidate, "not a regular file")
        with open(candidate.path, "rb") as stream:
            return stream.read(), os.fstat(stream.fileno())
    except OSError as error:
        return _failed(candidate, f"cannot read: {error.strerror or error}")


def _failed(candidate: Candidate, reason: str) -> FileResult:
    return FileResult(candidate.display, Status.FAILED, error=reason, notebook=candidate.is_notebook)


def _migrate_all(tasks: list[_Task], jobs: int, progress: Callable[[int], Iterator[None]] | None) -> list[FileResult]:
    if not tasks:
        return []
    import migrate.engine  # noqa: F401 - imported once here, so forked workers share it

    ticks = progress(len(tasks)) if progress else None
    total_bytes = sum(len(task.data) for task in tasks)
    if jobs <= 1 or len(tasks) < 2 or total_bytes < _PARALLEL_MIN_BYTES:
        return [_tick(migrate_task(task), ticks) for task in tasks]
    from concurrent.futures import ProcessPoolExecutor

    workers = min(jobs, len(tasks))
    # Biggest files first, so no worker is left with a large one at the end; the
    # caller sorts results by path, so the order of work never shows.
    by_size = sorted(tasks, key=lambda task: len(task.data), reverse=True)
    with ProcessPoolExecutor(max_workers=workers, mp_context=_process_context()) as pool:
        chunk = max(1, len(tasks) // (workers * 16))
        return [_tick(result, ticks) for result in pool.map(migrate_task, by_size, chunksize=chunk)]


def _tick(result: FileResult, ticks: Iterator[None] | None) -> FileResult:
    if ticks is not None:
        next(ticks, None)
    return result


def _process_context() -> multiprocessing.context.BaseContext:
    import multiprocessing

    # fork shares the already imported engine with the workers; where it is not
    # available (Windows, macOS default) the platform's default is used.
    if sys.platform.startswith("linux"):
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context()


def migrate_task(task: _Task) -> FileResult:
    """Migrate one file's bytes; never raises for anything a file can contain."""
    candidate = task.candidate
    try:
        if candidate.is_notebook:
            return _migrate_notebook(task)
        return _migrate_python(task)
    except StaleFileError as error:
        return _failed(candidate, str(error))
    except OSError as error:
        return _failed(candidate, f"cannot write: {error.strerror or error}")
    except Exception as error:
        # Nothing was written: writes come last and raise only OSError.
        reason = f"internal error, file not written: {type(error).__name__}: {error}"
        return _failed(candidate, reason + " (please report this)")


def _migrate_python(task: _Task) -> FileResult:
    import tokenize

    from migrate.engine import InternalError, SourceSyntaxError, migrate_source

    candidate = task.candidate
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(task.data).readline)
        # bytes.decode never translates newlines, so CRLF files stay CRLF.
        text = task.data.decode(encoding)
    except (SyntaxError, UnicodeDecodeError, LookupError) as error:
        return _failed(candidate, f"cannot decode: {error}")
    try:
        result = migrate_source(text, task.options)
    except SourceSyntaxError as error:
        line, column, message = _syntax_error_position(text, error.line, error.column, error.message)
        return _failed(candidate, f"cannot parse: line {line}, column {column}: {message}")
    except InternalError as error:
        return _failed(candidate, f"internal error, file not written: {error}")
    except RecursionError:
        return _failed(candidate, "cannot parse: nested too deeply")
    diagnostics = tuple(_place(candidate.display, finding) for finding in result.findings)
    if result.skipped:
        return FileResult(candidate.display, Status.SKIPPED, diagnostics)
    if not result.changed:
        return FileResult(candidate.display, Status.UNCHANGED, diagnostics, amp_left=result.amp_left)
    check = _check_compiles(result.source, candidate.display)
    if check:
        return _failed(candidate, check)
    try:
        new_data = result.source.encode(encoding)  # utf-8-sig puts the BOM back
    except UnicodeEncodeError as error:
        return _failed(
            candidate,
            f"internal error, file not written: cannot encode as {encoding}: {error}",
        )
    diff = unified_diff(text, result.source, candidate.display) if task.want_diff else ""
    return FileResult(
        candidate.display,
        Status.CHANGED,
        diagnostics,
        diff,
        first_change=_first_change(text, result.source),
        migrated_apis=migrated_apis(text, result.source),
        amp_left=result.amp_left,
        amp_migrated=result.amp_migrated,
        scalers=result.scalers,
        scaler_unused=result.scaler_unused,
        new_data=new_data,
    )


def _syntax_error_position(text: str, line: int, column: int, message: str) -> tuple[int, int, str]:
    """Python's own parser places syntax errors better than libcst's: prefer it."""
    try:
        compile(text, "<input>", "exec", dont_inherit=True)
    except SyntaxError as error:
        if error.lineno:
            return error.lineno, error.offset or 1, error.msg
    except ValueError:  # null bytes
        pass
    return line, column, message


def _check_compiles(source: str, display: str) -> str:
    """Parse the output once more before anything is written: '' when it compiles."""
    try:
        compile(source, display, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as error:
        return f"internal error, file not written: migrated code does not compile: {error}"
    return ""


def _place(path: str, finding: Finding, cell: int | None = None, line: int | None = None) -> Diagnostic:
    return Diagnostic(
        path,
        line if line is not None else finding.line,
        finding.column,
        finding.code,
        finding.message,
        finding.fixed,
        cell,
    )


def _migrate_notebook(task: _Task) -> FileResult:
    from migrate import notebook as nb
    from migrate.engine import InternalError, SourceSyntaxError, migrate_source

    candidate = task.candidate

    def failed(reason: str) -> FileResult:
        return replace(_failed(candidate, reason), notebook=True)

    try:
        notebook = nb.load(task.data)
        if not nb.is_python(notebook):
            return FileResult(candidate.display, Status.UNCHANGED, notebook=True)
        program = nb.to_program(notebook)
    except nb.NotebookError as error:
        return failed(str(error))
    if program is None:
        return FileResult(candidate.display, Status.UNCHANGED, notebook=True)
    try:
        result = migrate_source(program.text, task.options)
    except SourceSyntaxError as error:
        position = _syntax_error_position(program.text, error.line, error.column, error.message)
        cell, line = program.locate(position[0])
        return failed(f"cannot parse: cell {cell}, line {line}, column {position[1]}: {position[2]}")
    except InternalError as error:
        return failed(f"internal error, file not written: {error}")
    except RecursionError:
        return failed("cannot parse: nested too deeply")
    diagnostics = []
    for finding in result.findings:
        cell, line = program.locate(finding.line)
        diagnostics.append(_place(candidate.display, finding, cell, line))
    found = tuple(diagnostics)
    if result.skipped:
        return FileResult(candidate.display, Status.SKIPPED, found, notebook=True)
    if not result.changed:
        return FileResult(candidate.display, Status.UNCHANGED, found, notebook=True)
    check = _check_compiles(result.source, candidate.display)
    try:
        if check:
            raise nb.NotebookError(check)
        sources = nb.from_program(notebook, program, result.source)
        originals = {index: nb.cell_source(notebook.cells[index]) for index in sources}
        new_data = nb.dump(notebook, sources)
    except nb.NotebookError as error:
        return failed(str(error) if error.args[0].startswith("internal") else f"not written: {error}")
    if not sources:
        return FileResult(candidate.display, Status.UNCHANGED, found, notebook=True)
    diff = ""
    if task.want_diff:
        diff = "".join(
            unified_diff(
                originals[index],
                sources[index],
                f"{candidate.display}:cell {index + 1}",
            )
            for index in sorted(sources)
        )
    return FileResult(
        candidate.display,
        Status.CHANGED,
        found,
        diff,
        new_data=new_data,
        notebook=True,
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
    import difflib

    # a/ and b/ prefixes let `git apply` take the diff; an absolute path has no such use.
    before, after = (name, name) if os.path.isabs(name) else (f"a/{name}", f"b/{name}")
    lines = difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True), before, after)
    return "".join(_terminate(lines))


def _terminate(lines: Iterable[str]) -> Iterator[str]:
    for line in lines:
        if line.endswith("\n"):
            yield line
        else:
            yield line + "\n\\ No newline at end of file\n"
