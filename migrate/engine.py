"""The pure core: ``migrate_source(text) -> MigrationResult``. No I/O, no printing.

The runner owns files; tests call this directly.
"""

from __future__ import annotations

import ast
import warnings
from dataclasses import dataclass, replace

import libcst as cst

from migrate import pytree
from migrate.findings import Finding, make_finding
from migrate.gcpause import cycle_collector_paused
from migrate.options import Options, ScalerInfo
from migrate.rules import _factory_calls as factory_calls
from migrate.rules import run_rules
from migrate.rules._render import nodes_unvalidated, render
from migrate.skip import SKIP_COMMENT


class SourceSyntaxError(Exception):
    """The input is not valid Python; ``line``/``column`` are 1-based."""

    def __init__(self, message: str, line: int, column: int) -> None:
        super().__init__(f"line {line}, column {column}: {message}")
        self.message = message
        self.line = line
        self.column = column


class UnsupportedSyntaxError(SourceSyntaxError):
    """Valid Python (the running interpreter compiles it) that libcst cannot parse."""


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


def check_syntax(source: str) -> None:
    """Parse ``source`` with the running Python first; raise SourceSyntaxError if it cannot.

    CPython's parser bounds nesting (200 brackets, 100 indents, a recursion limit) and
    never crashes, where libcst's native parser can overflow its stack on inputs that
    deep. It also holds the grammar the output must compile under, so syntax newer than
    this interpreter is reported as unparseable rather than as an internal error after
    the rewrite. The tree is kept for the rules (``migrate.pytree``).
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escapes and the like: not ours to report
            pytree.parse(source)
    except SyntaxError as error:
        raise SourceSyntaxError(error.msg, error.lineno or 1, error.offset or 1) from None
    except ValueError as error:  # null bytes
        raise SourceSyntaxError(str(error), 1, 1) from None
    except RecursionError:
        raise SourceSyntaxError("nested too deeply", 1, 1) from None
    except MemoryError:
        raise SourceSyntaxError("too large to parse", 1, 1) from None


def _compile(source: str, name: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compile(source, name, "exec", dont_inherit=True)


def parse(source: str) -> cst.Module:
    """libcst's tree of ``source``, which ``check_syntax`` has accepted."""
    try:
        # a fifth of a parse is libcst validating each node it builds: the text is Python's
        with nodes_unvalidated():
            return cst.parse_module(source)
    except cst.ParserSyntaxError as error:
        raise UnsupportedSyntaxError(error.message, error.raw_line, error.raw_column + 1) from None


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


@dataclass(frozen=True)
class Parsed:
    """Both trees of one source text, parsed ahead of its migration (``parse_ahead``)."""

    source: str
    tree: ast.Module
    module: cst.Module


def parse_ahead(source: str) -> Parsed | None:
    """Parse ``source`` as ``migrate_source`` would, before its options are known (a worker
    does this while the project is planned); None where ``migrate_source`` would not parse
    it with libcst (an error, or a file-level skip): that path runs as usual then."""
    with cycle_collector_paused():
        try:
            check_syntax(source)
            tree = pytree.parse(source)
            if _file_skip_line(source) is not None:
                return None
            return Parsed(source, tree, parse(source))
        except Exception:  # migrate_source meets the same error again and reports it
            return None
        finally:
            pytree.forget()


_held: Parsed | None = None


def hold(parsed: Parsed | None) -> None:
    """Have the next ``migrate_source`` of this very text (the same str object) take its
    trees from ``parsed`` instead of parsing it again."""
    global _held
    _held = parsed


def migrate_source(source: str, options: Options = Options()) -> MigrationResult:
    """Migrate one module's source text. Raises SourceSyntaxError or InternalError.

    The input is parsed once by Python (``check_syntax``, whose tree the rules share)
    and once by libcst (or was, by ``parse_ahead``: see ``hold``); the output, when it
    differs, is compiled once before it is returned.
    """
    global _held
    parsed, _held = _held, None
    # libcst trees are large and acyclic (reference counting frees them): the cycle
    # collector's passes over them during one file are pure overhead (about 10%)
    with cycle_collector_paused():
        try:
            return _migrate(source, options, parsed if parsed is not None and parsed.source is source else None)
        finally:
            pytree.forget()


def _migrate(source: str, options: Options, parsed: Parsed | None = None) -> MigrationResult:
    if parsed is not None:
        pytree.keep(source, parsed.tree)  # checked and not skipped when it was parsed
        module = parsed.module
    else:
        check_syntax(source)
        skip_line = _file_skip_line(source)
        if skip_line is not None:  # decided from the text alone: no need for libcst's tree
            note = make_finding(
                "AMP050", skip_line, 1, "`# ampmigrate: skip` at the top: the whole file was left as it was"
            )
            return MigrationResult(source, False, (note,), skipped=True)
        module = parse(source)
    if options.facts.factory_setups:
        return _migrate_factory_calls(source, module, options)
    outcome = run_rules(module, source, options)
    new_module = outcome.module
    new_source = render(module, new_module, source) if new_module is not module else source
    if new_source.startswith("\n") and not source.startswith("\n"):
        # the blank lines that followed a removed first statement (an Apex import) would open the file
        new_source = new_source.lstrip("\n")
    if new_source != source:
        try:
            _compile(new_source, "<migrated>")
        except (SyntaxError, ValueError, RecursionError) as error:
            # Input Python parses but does not compile either (`return` outside a
            # function, nesting too deep for the compiler): the input's fault, not ours.
            # Checked only now, so that the input is compiled only on this path.
            try:
                _compile(source, "<input>")
            except SyntaxError as input_error:
                raise SourceSyntaxError(input_error.msg, input_error.lineno or 1, input_error.offset or 1) from None
            except (ValueError, RecursionError, MemoryError):
                raise SourceSyntaxError("nested too deeply", 1, 1) from None
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


def _migrate_factory_calls(source: str, module: cst.Module, options: Options) -> MigrationResult:
    """Migrate a module that calls project functions setting up amp for it (``hands_off`` in
    their module): as if each call were followed by the amp.initialize it stands for. Kept
    only where that leaves no Apex amp; else the module is migrated as it is, and keeps amp."""
    plain = replace(options, facts=replace(options.facts, factory_setups=()))
    synthetic = factory_calls.synthesize(module, options.facts.factory_setups)
    if synthetic is not None:
        result = _migrate(synthetic.source, plain)
        if result.amp_migrated and not result.amp_left:
            return replace(
                result,
                changed=result.source != source,
                findings=synthetic.map_findings(result.findings),
            )
    return _migrate(source, plain)
