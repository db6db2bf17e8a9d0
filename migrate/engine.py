"""The pure core: ``migrate_source(text) -> MigrationResult``. No I/O, no printing.

The runner owns files; tests call this directly.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

import libcst as cst

from migrate.findings import Finding, make_finding
from migrate.options import Options, ScalerInfo
from migrate.rules import run_rules
from migrate.rules._render import render
from migrate.skip import SKIP_COMMENT


class SourceSyntaxError(Exception):
    """The input is not valid Python; ``line``/``column`` are 1-based."""

    def __init__(self, message: str, line: int, column: int) -> None:
        super().__init__(f"line {line}, column {column}: {message}")
        self.message = message
        self.line = line
        self.column = column


class InternalError(Exception):
    """The engine produced output that does not compile: a bug in ampmigrate."""


@dataclass(frozen=True)
class MigrationResult:
    source: str
    changed: bool
    findings: tuple[Finding, ...]
    skipped: bool = False  # the whole file carries `# ampmigrate: skip`
    # how the Apex amp setup came out (project mode links modules by these)
    amp_left: bool = False  # some use of Apex amp stays in the code
    amp_migrated: bool = False  # some use of Apex amp was rewritten
    scalers: tuple[ScalerInfo, ...] = ()  # the GradScalers it creates, as other modules see them
    scaler_unused: bool = False  # a training GradScaler that no backward here uses

    @property
    def needs_review(self) -> bool:
        return any(not finding.fixed for finding in self.findings)


def parse(source: str) -> cst.Module:
    try:
        return cst.parse_module(source)
    except cst.ParserSyntaxError as error:
        raise SourceSyntaxError(error.message, error.raw_line, error.raw_column + 1) from None


def _file_skip_line(source: str) -> int | None:
    """The line of a `# ampmigrate: skip` comment heading the file, if any."""
    for number, line in enumerate(source.splitlines(), start=1):
        stripped = line.strip()
        if not stripped:
            continue
        if not stripped.startswith("#"):
            return None
        if SKIP_COMMENT.search(stripped):
            return number
    return None


def migrate_source(source: str, options: Options = Options()) -> MigrationResult:
    """Migrate one module's source text. Raises SourceSyntaxError or InternalError."""
    # libcst trees are large and acyclic (reference counting frees them): the cycle
    # collector's passes over them during one file are pure overhead (about 10%)
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _migrate(source, options)
    finally:
        if collecting:
            gc.enable()


def _migrate(source: str, options: Options) -> MigrationResult:
    module = parse(source)
    skip_line = _file_skip_line(source)
    if skip_line is not None:
        note = make_finding(
            "AMP050", skip_line, 1, "`# ampmigrate: skip` at the top: the whole file was left as it was"
        )
        return MigrationResult(source, False, (note,), skipped=True)
    outcome = run_rules(module, source, options)
    new_module = outcome.module
    new_source = render(module, new_module, source) if new_module is not module else source
    if new_source != source:
        try:
            compile(new_source, "<migrated>", "exec")
        except SyntaxError as error:
            raise InternalError(f"migrated code does not compile: {error}") from None
    return MigrationResult(
        new_source,
        new_source != source,
        tuple(outcome.findings),
        amp_left=outcome.amp_left,
        amp_migrated=outcome.amp_migrated,
        scalers=outcome.scalers,
        scaler_unused=outcome.scaler_unused,
    )
