"""The Report: counts, exit code, summary line and every output format.

The CLI hands it the per-file results and prints what it renders, so no other module
does bookkeeping. Formats: text (diffs and ``path:line:col: AMPnnn message``), json,
github (workflow annotations), sarif (2.1.0, for code-scanning uploads), and a
Markdown summary for a pull request's description.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

from migrate import __version__
from migrate.config import Config
from migrate.runner import FileResult, Status

if TYPE_CHECKING:
    from migrate.records import Diagnostic

# json and the finding catalogue (migrate.findings) are imported by the formats that use
# them: a pre-commit run on a clean file prints one summary line (budget 0.1 s).

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
INFORMATION_URI = "https://github.com/ampmigrate/ampmigrate"
# The pseudo-rule for "this file would be rewritten": no finding code, as a rewrite
# with nothing to say is not a diagnostic, but code scanning and PR annotations
# should still point at the file.
PENDING_RULE = "pending-rewrite"
PENDING_MESSAGE = "ampmigrate would rewrite this file from Apex amp to torch.amp; run `ampmigrate --write`."
# Codes whose rewrite can change numerics (loss values, overflow handling) compared
# with Apex; the Markdown report lists them under their own heading.
# The exit code of a run stopped by Ctrl-C (128 + SIGINT, as shells report it).
INTERRUPTED = 130
NUMERICS_CODES = frozenset({"AMP001", "AMP002", "AMP003", "AMP004", "AMP011", "AMP012"})


@dataclass(frozen=True)
class Counts:
    scanned: int
    changed: int
    review: int
    failed: int
    skipped: int


class Report:
    """Everything the user is told about one run."""

    def __init__(
        self,
        results: list[FileResult],
        config: Config,
        notices: list[str] | None = None,
        interrupted: bool = False,
    ) -> None:
        self.results = results
        self.config = config
        # Not about a file's migration: links not followed, leftovers of killed runs.
        self.notices = notices or []
        # Ctrl-C stopped the run: the results cover only the files reached.
        self.interrupted = interrupted

    @property
    def counts(self) -> Counts:
        statuses = [result.status for result in self.results]
        return Counts(
            scanned=len(statuses),
            changed=statuses.count(Status.CHANGED),
            review=sum(result.needs_review for result in self.results),
            failed=statuses.count(Status.FAILED),
            skipped=statuses.count(Status.SKIPPED),
        )

    @property
    def return_code(self) -> int:
        """130: interrupted; 2: some file failed; 1: --check and work is pending; else 0."""
        counts = self.counts
        if self.interrupted:
            return INTERRUPTED
        if counts.failed:
            return 2
        if self.config.check and (counts.changed or counts.review):
            return 1
        return 0

    def summary(self) -> str:
        counts = self.counts
        changed = "changed" if self.config.write else "would change"
        parts = [
            _plural(counts.scanned, "file") + " scanned",
            f"{counts.changed} {changed}",
            f"{counts.review} need{'s' if counts.review == 1 else ''} review",
            f"{counts.failed} failed",
        ]
        if counts.skipped:
            parts.append(f"{counts.skipped} skipped")
        summary = "ampmigrate: " + ", ".join(parts)
        if self.interrupted:
            summary += " (interrupted: the other files were not looked at)"
        return summary

    @property
    def diagnostics(self) -> Iterator[Diagnostic]:
        for result in self.results:
            yield from result.diagnostics

    # -- text -----------------------------------------------------------------

    def text_lines(self, color: bool | None) -> Iterator[tuple[str, bool]]:
        """(text, to_stderr) pairs: diffs and findings on stdout, the rest on stderr."""
        for result in self.results:
            if result.status is Status.FAILED:
                yield f"error: {result.path}: {result.error}", True
                continue
            if self.config.diff and result.diff:
                yield (colorize_diff(result.diff) if color is not False else result.diff), False
            for diagnostic in result.diagnostics:
                yield diagnostic.format() + "\n", False
            if result.status is Status.CHANGED and not self.config.diff:
                yield ("migrated " if result.written else "would migrate ") + result.path, True
            elif result.status is Status.SKIPPED:
                yield f"skipped {result.path} (# ampmigrate: skip)", True
        for notice in self.notices:
            yield f"note: {notice}", True

    # -- json ------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        counts = self.counts
        return {
            "tool": "ampmigrate",
            "version": __version__,
            "mode": ("write" if self.config.write else "check" if self.config.check else "diff"),
            "summary": {
                "scanned": counts.scanned,
                "changed": counts.changed,
                "needs_review": counts.review,
                "failed": counts.failed,
                "skipped": counts.skipped,
            },
            "exit_code": self.return_code,
            "interrupted": self.interrupted,
            "notices": list(self.notices),
            "files": [self._file_json(result) for result in self.results],
        }

    def _file_json(self, result: FileResult) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "path": result.path,
            "status": result.status.value,
            "written": result.written,
            "notebook": result.notebook,
            "needs_review": result.needs_review,
            "migrated_apis": list(result.migrated_apis),
            "findings": [
                {
                    "code": d.code,
                    "path": d.path,
                    "cell": d.cell,
                    "line": d.line,
                    "column": d.column,
                    "message": d.message,
                    "fixed": d.fixed,
                }
                for d in result.diagnostics
            ],
        }
        if result.error:
            entry["error"] = result.error
        if self.config.diff and result.diff:
            entry["diff"] = result.diff
        return entry

    # -- github ----------------------------------------------------------------

    def github_lines(self) -> Iterator[str]:
        """GitHub Actions workflow commands, one annotation per finding or file problem."""
        for result in self.results:
            if result.status is Status.FAILED:
                yield _workflow_command("error", result.error, file=result.path, title="ampmigrate")
                continue
            if result.status is Status.CHANGED and not result.written:
                line = result.first_change
                yield _workflow_command(
                    "warning",
                    PENDING_MESSAGE,
                    file=result.path,
                    line=line,
                    title="ampmigrate",
                )
            for d in result.diagnostics:
                level = "notice" if d.fixed else "warning"
                if d.cell is None:
                    yield _workflow_command(
                        level,
                        d.message,
                        file=d.path,
                        line=d.line,
                        col=d.column,
                        title=d.code,
                    )
                else:  # a notebook's JSON lines are not its cells' lines: name the cell instead
                    message = f"cell {d.cell}, line {d.line}: {d.message}"
                    yield _workflow_command(level, message, file=d.path, title=d.code)

    # -- sarif -----------------------------------------------------------------

    def to_sarif(self) -> dict[str, Any]:
        """A SARIF 2.1.0 log with one run; findings become results of rules AMPnnn."""
        from migrate.findings import CODES

        rule_ids = [*sorted(CODES), PENDING_RULE]
        rules = [_sarif_rule(code) for code in sorted(CODES)]
        rules.append(
            {
                "id": PENDING_RULE,
                "name": "pending-rewrite",
                "shortDescription": {"text": "The file uses Apex amp and can be rewritten automatically."},
                "defaultConfiguration": {"level": "warning"},
            }
        )
        results: list[dict[str, Any]] = []
        notifications: list[dict[str, Any]] = []
        for result in self.results:
            if result.status is Status.FAILED:
                notifications.append(
                    {
                        "level": "error",
                        "message": {"text": f"{result.path}: {result.error}"},
                        "locations": [{"physicalLocation": {"artifactLocation": _artifact(result.path)}}],
                    }
                )
                continue
            if result.status is Status.CHANGED and not result.written:
                line = result.first_change
                results.append(
                    _sarif_result(
                        PENDING_RULE,
                        rule_ids.index(PENDING_RULE),
                        "warning",
                        PENDING_MESSAGE,
                        result.path,
                        line,
                    )
                )
            for d in result.diagnostics:
                message = d.message if d.cell is None else f"cell {d.cell}, line {d.line}: {d.message}"
                index = rule_ids.index(d.code) if d.code in CODES else -1
                line, column = (d.line, d.column) if d.cell is None else (None, None)
                results.append(
                    _sarif_result(
                        d.code,
                        index,
                        "note" if d.fixed else "warning",
                        message,
                        d.path,
                        line,
                        column,
                    )
                )
        return {
            "$schema": SARIF_SCHEMA,
            "version": "2.1.0",
            "runs": [
                {
                    "tool": {
                        "driver": {
                            "name": "ampmigrate",
                            "version": __version__,
                            "informationUri": INFORMATION_URI,
                            "rules": rules,
                        }
                    },
                    "invocations": [
                        {
                            "executionSuccessful": not notifications,
                            "toolExecutionNotifications": notifications,
                        }
                    ],
                    "results": results,
                }
            ],
        }

    # -- markdown ----------------------------------------------------------------

    def markdown(self) -> str:
        """A summary for a pull request's description."""
        counts = self.counts
        lines = [
            "# ampmigrate report",
            "",
            self.summary().removeprefix("ampmigrate: ") + ".",
            "",
        ]
        migrated = [r for r in self.results if r.status is Status.CHANGED]
        review = [r for r in self.results if r.needs_review]
        failed = [r for r in self.results if r.status is Status.FAILED]
        skipped = [
            r for r in self.results if r.status is Status.SKIPPED or any(d.code == "AMP050" for d in r.diagnostics)
        ]
        numerics = [d for d in self.diagnostics if d.code in NUMERICS_CODES]

        verb = "Migrated" if self.config.write else "Would be migrated"
        lines += [f"## {verb}", ""]
        if migrated:
            for result in migrated:
                notes = [d for d in result.diagnostics if d.fixed]
                apis = ", ".join(f"`{name}`" for name in result.migrated_apis)
                lines.append(f"- `{result.path}`" + (f": rewrote {apis}" if apis else ""))
                lines += [f"  - {_md_location(d)}: **{d.code}** {d.message}" for d in notes]
        else:
            lines.append("No file needed rewriting.")
        lines.append("")

        lines += ["## Needs a human", ""]
        if review:
            for result in review:
                lines.append(f"- `{result.path}`")
                lines += [
                    f"  - [ ] {_md_location(d)}: **{d.code}** {d.message}" for d in result.diagnostics if not d.fixed
                ]
        elif failed or skipped or self.interrupted:
            # Never claim a clean bill of health while some files went unchecked.
            lines.append("No finding asks for review in the files that were processed; see below for the others.")
        else:
            lines.append("Nothing: every Apex use found was migrated automatically.")
        lines.append("")

        if numerics:
            lines += ["## Where numerics can differ from Apex", ""]
            lines += [f"- {_md_location(d)}: **{d.code}** {d.message}" for d in numerics]
            lines += [
                "",
                "Run `ampmigrate verify ORIGINAL MIGRATED` to compare a few training steps of both versions.",
                "",
            ]
        if failed:
            lines += ["## Could not be processed", ""]
            lines += [f"- `{r.path}`: {r.error}" for r in failed]
            lines.append("")
        if skipped:
            lines += ["## Skipped by `# ampmigrate: skip`", ""]
            for result in skipped:
                where = [d for d in result.diagnostics if d.code == "AMP050"]
                if result.status is Status.SKIPPED:
                    lines.append(f"- `{result.path}` (whole file)")
                else:
                    lines.append(f"- `{result.path}`: " + ", ".join(_md_location(d) for d in where))
            lines.append("")
        if self.notices:
            lines += ["## Notes", ""]
            lines += [f"- {notice}" for notice in self.notices]
            lines.append("")
        if self.interrupted:
            lines += ["**Incomplete:** the run was interrupted (Ctrl-C) before every file was processed.", ""]
        if counts.failed or counts.skipped:
            lines.append(
                f"**Incomplete:** {_plural(counts.failed, 'file')} failed and "
                f"{_plural(counts.skipped, 'file')} {'was' if counts.skipped == 1 else 'were'} skipped, "
                "so this report does not cover them."
            )
            lines.append("")
        return "\n".join(lines)


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _md_location(d: Diagnostic) -> str:
    return f"`{d.location}:{d.line}`"


def colorize_diff(diff: str) -> str:
    """ANSI colours for a unified diff (click.echo strips them when not on a terminal)."""
    import click  # only for colours: the fast path (migrate.entry) prints without click

    out = []
    for line in diff.splitlines(keepends=True):
        body, ending = line.rstrip("\r\n"), line[len(line.rstrip("\r\n")) :]
        if line.startswith(("+++", "---")):
            out.append(click.style(body, bold=True) + ending)
        elif line.startswith("@@"):
            out.append(click.style(body, fg="cyan") + ending)
        elif line.startswith("+"):
            out.append(click.style(body, fg="green") + ending)
        elif line.startswith("-"):
            out.append(click.style(body, fg="red") + ending)
        else:
            out.append(line)
    return "".join(out)


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def _workflow_command(level: str, message: str, **properties: object) -> str:
    fields = ",".join(f"{key}={_escape_property(str(value))}" for key, value in properties.items() if value is not None)
    return f"::{level} {fields}::{_escape_data(message)}"


def _artifact(path: str) -> dict[str, Any]:
    posix = PurePosixPath(path.replace("\\", "/"))
    if posix.is_absolute():
        return {"uri": posix.as_uri()}
    return {"uri": str(posix).removeprefix("./"), "uriBaseId": "%SRCROOT%"}


def _sarif_rule(code: str) -> dict[str, Any]:
    from migrate.findings import CODES

    entry = CODES[code]
    return {
        "id": code,
        "name": entry.name,
        "shortDescription": {"text": entry.summary},
        "help": {"text": entry.what_to_do},
        "defaultConfiguration": {"level": "note" if entry.fixed else "warning"},
    }


def _sarif_result(
    rule: str,
    index: int,
    level: str,
    message: str,
    path: str,
    line: int | None,
    column: int | None = None,
) -> dict[str, Any]:
    location: dict[str, Any] = {"artifactLocation": _artifact(path)}
    if line is not None:
        region: dict[str, Any] = {"startLine": line}
        if column is not None:
            region["startColumn"] = column
        location["region"] = region
    result: dict[str, Any] = {
        "ruleId": rule,
        "level": level,
        "message": {"text": message},
        "locations": [{"physicalLocation": location}],
    }
    if index >= 0:
        result["ruleIndex"] = index
    return result


def dumps_json(document: dict[str, Any]) -> str:
    import json

    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"
