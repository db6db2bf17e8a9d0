"""The ``ampmigrate`` program: the common command lines run without importing click.

A pre-commit hook runs ``ampmigrate --check FILE...`` once per commit, and click's
import (with ``uuid``, ``platform``, ``datetime``, ``gettext``) is about a sixth of such a
run on a file without Apex. Here a command line made only of paths and the flags
``--check``, ``--write``, ``--diff`` and ``--no-cache`` runs the very steps of the click
command (``migrate.cli.migrate_command``), printing as ``click.echo`` does on ordinary
streams. Anything else (another option, ``verify``, ``--help``, a usage error, an
unusual stream or platform, shell completion) goes to click, which handles it as
before.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from migrate.config import Config
    from migrate.report import Report

# A progress bar is worth drawing only when this many files need parsing (about
# 0.1 s each on one core).
PROGRESS_MIN_FILES = 40

_FLAGS = {"--check": "check", "--write": "write", "--diff": "diff", "--no-cache": "no_cache"}


def run(prog_name: str | None = None) -> None:
    """The console script (and ``python -m migrate``): the fast path when it applies, else click."""
    from migrate.quickimport import compiled_once, store_path

    # the dataclasses of the run's own modules, made with code compiled by an earlier run
    with compiled_once(store_path("main")):
        simple = _simple(sys.argv[1:])
        if simple is not None and _plain_streams():
            _run_simple(*simple)  # exits, unless the configuration needs click to report it
        from migrate.cli import main

        main(prog_name=prog_name)


def _simple(args: list[str]) -> tuple[list[str], set[str]] | None:
    """The paths and flags of a command line the fast path runs; None for anything else."""
    if not args or args[0] == "verify" or os.name != "posix":
        return None  # no paths: help; verify: its own command; elsewhere click expands wildcards
    paths: list[str] = []
    flags: set[str] = set()
    for arg in args:
        if arg in _FLAGS:
            flags.add(_FLAGS[arg])
        elif not arg or arg.startswith("-"):
            return None
        else:
            paths.append(arg)
    if not paths:
        return None
    # click answers shell completion (_AMPMIGRATE_COMPLETE and the like) before anything runs
    if any(name.startswith("_") and name.endswith("_COMPLETE") for name in os.environ):
        return None
    return paths, flags


def _plain_streams() -> bool:
    """stdout and stderr are text files click would write to as they are (not ASCII, which
    click replaces with a UTF-8 wrapper)."""
    import codecs
    import io

    for stream in (sys.stdout, sys.stderr):
        if type(stream) is not io.TextIOWrapper:
            return False
        try:
            if codecs.lookup(stream.encoding).name == "ascii":
                return False
        except LookupError:
            return False
    return True


def _run_simple(paths: list[str], flags: set[str]) -> None:
    """``migrate_command`` for these paths and flags, with click's handling of Ctrl-C and a
    closed pipe around it; returns (for click to take over) only when the configuration is
    refused or names rules to check, before anything has run."""
    try:
        try:
            _migrate([Path(path) for path in paths], flags)
        except KeyboardInterrupt:
            echo("", err=True)  # the blank line closes the terminal's ^C echo
            echo("Aborted!", err=True)
            sys.exit(1)
        except OSError as error:
            import errno

            if error.errno != errno.EPIPE:
                raise
            sys.stdout = _PacifyFlush(sys.stdout)  # type: ignore[assignment]
            sys.stderr = _PacifyFlush(sys.stderr)  # type: ignore[assignment]
            sys.exit(1)
    except KeyboardInterrupt:  # a second one, while the first was being reported
        sys.exit(1)


def _migrate(paths: list[Path], flags: set[str]) -> None:
    from migrate.config import ConfigError, OutputFormat, build_config

    try:
        config = build_config(
            list(paths),
            write="write" in flags,
            check="check" in flags,
            diff=True if "diff" in flags else None,
            output_format=OutputFormat.TEXT,
            jobs=None,
            # https://no-color.org: a set NO_COLOR turns colour off unless --color asks.
            color=False if os.environ.get("NO_COLOR") else None,
            report_path=None,
            device=None,
            dtype=None,
            scaler_name=None,
            select=None,
            exclude=None,
            extend_exclude=(),
            respect_gitignore=None,
            fused=None,
            cache="no_cache" not in flags,
        )
    except ConfigError:
        return  # click reports it, as a usage error
    if config.options.select is not None:
        return  # rules selected in the configuration: click checks their names
    run_and_exit(paths, config, echo)


def run_and_exit(paths: list[Path], config: Config, echo: Callable[..., None]) -> NoReturn:
    """Migrate ``paths`` as ``config`` says, print the report with ``echo`` (``click.echo``, or
    this module's) and exit with its code; the one run of both command lines."""
    from migrate.report import INTERRUPTED, Report
    from migrate.runner import execute

    try:
        outcome = execute(list(paths), config, progress=progress_bar)
        report = Report(outcome.results, config, outcome.notices, outcome.interrupted)
        print_report(report, config, echo)
    except KeyboardInterrupt:  # before or after the run proper, which handles its own
        echo("ampmigrate: interrupted", err=True)
        sys.exit(INTERRUPTED)
    sys.exit(report.return_code)


def print_report(report: Report, config: Config, echo: Callable[..., None]) -> None:
    """Everything the run has to say, in the format asked for; the summary last, on stderr.
    ``echo``: ``click.echo``, or this module's ``echo`` (which writes the same)."""
    from migrate.config import OutputFormat
    from migrate.report import dumps_json

    if config.output_format is OutputFormat.TEXT:
        for text, to_stderr in report.text_lines(config.color):
            echo(text, nl=not text.endswith("\n"), err=to_stderr, color=None if to_stderr else config.color)
    elif config.output_format is OutputFormat.JSON:
        echo(dumps_json(report.to_json()), nl=False)
    elif config.output_format is OutputFormat.SARIF:
        echo(dumps_json(report.to_sarif()), nl=False)
    else:
        for line in report.github_lines():
            echo(line)
    if config.report_path is not None:
        try:
            config.report_path.write_text(report.markdown(), encoding="utf-8")
        except OSError as error:
            echo(f"error: cannot write report {config.report_path}: {error.strerror or error}", err=True)
            sys.exit(2)
    echo(report.summary(), err=True)


def progress_bar(total: int) -> Iterator[None]:
    """A bar on stderr for long runs on a terminal; nothing in pipes or CI logs."""
    if total < PROGRESS_MIN_FILES or not sys.stderr.isatty() or os.environ.get("CI"):
        return iter(())
    from migrate.cli import BarTicks  # click draws it

    return BarTicks(total)


# click's pattern for the ANSI escape sequences it strips from output that is not a terminal
_ANSI = r"\033\[[0-?]*[ -/]*[@-~]"


def echo(text: str, nl: bool = True, err: bool = False, color: bool | None = None) -> None:
    """``click.echo(text, nl=nl, err=err, color=color)`` for a str on the streams
    ``_plain_streams`` accepts: colours stripped unless asked for (or, by default, unless
    the stream is a terminal), flushed."""
    stream = sys.stderr if err else sys.stdout
    if nl:
        text += "\n"
    if text and "\033" in text and (not _isatty(stream) if color is None else not color):
        import re

        text = re.sub(_ANSI, "", text)
    if text:
        stream.write(text)
    stream.flush()


def _isatty(stream: object) -> bool:
    try:
        return bool(stream.isatty())  # type: ignore[attr-defined]
    except Exception:
        return False


class _PacifyFlush:
    """A stream whose flush ignores a closed pipe (as click leaves stdout and stderr after
    EPIPE, so that the interpreter's final flush does not print a traceback)."""

    def __init__(self, wrapped: object) -> None:
        self.wrapped = wrapped

    def flush(self) -> None:
        import errno

        try:
            self.wrapped.flush()  # type: ignore[attr-defined]
        except OSError as error:
            if error.errno != errno.EPIPE:
                raise

    def __getattr__(self, name: str) -> object:
        return getattr(self.wrapped, name)
