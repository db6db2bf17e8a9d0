"""Fixture cases: ``fixtures/<rule>/<case>.in.py`` with its expected results beside it.

- ``<case>.out.py``: the migrated source. A case without it must come out unchanged.
- ``<case>.findings``: every finding of the migration, in order, one per line, as
  ``LINE:COL CODE MESSAGE`` (1-based line and column in the *input*; the message in full,
  so a changed message shows up in review). An empty file means no findings. Every case
  has one.

Every case also checks that the output compiles, that one more pass changes nothing,
and that a second pass makes no notes about rewrites (those belong to the first; a skip
comment is reported on every pass).
``pytest --update-fixtures`` rewrites ``.out.py`` and ``.findings`` from the engine's
output, so reviewers read diffs, not code. Every finding code in ``migrate.findings.CODES``
must be produced by at least one case.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import pytest

from migrate.engine import migrate_source
from migrate.findings import CODES, Finding

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
CASES = sorted(FIXTURES.glob("*/*.in.py"))
IN, OUT, FINDINGS = ".in.py", ".out.py", ".findings"


def _read(path: Path) -> str:
    with open(path, encoding="utf-8", newline="") as handle:
        return handle.read()


def _write(path: Path, text: str) -> None:
    """Replace ``path`` at once: under xdist another worker may be reading it."""
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "w", encoding="utf-8", newline="") as handle:
        handle.write(text)
    os.replace(temporary, path)


def _beside(case: Path, suffix: str) -> Path:
    return case.with_name(case.name[: -len(IN)] + suffix)


def findings_text(findings: Iterable[Finding]) -> str:
    """The ``.findings`` file for these findings."""
    lines = []
    for finding in findings:
        assert "\n" not in finding.message, f"{finding.code}: a message must fit on one line"
        lines.append(f"{finding.line}:{finding.column} {finding.code} {finding.message}\n")
    return "".join(lines)


@pytest.mark.parametrize("case", CASES, ids=[f"{p.parent.name}/{p.name[: -len(IN)]}" for p in CASES])
def test_fixture(case: Path, request: pytest.FixtureRequest) -> None:
    source = _read(case)
    expected_path = _beside(case, OUT)
    findings_path = _beside(case, FINDINGS)
    result = migrate_source(source)

    if request.config.getoption("--update-fixtures"):
        if result.changed:
            _write(expected_path, result.source)
        elif expected_path.exists():
            expected_path.unlink()
        _write(findings_path, findings_text(result.findings))

    if expected_path.exists():
        assert result.source == _read(expected_path)
    else:
        assert result.source == source, "a case without .out.py must stay unchanged"
    assert findings_path.exists(), f"{findings_path.name} is missing: run pytest --update-fixtures and review it"
    assert findings_text(result.findings) == _read(findings_path)

    compile(result.source, str(expected_path), "exec")
    again = migrate_source(result.source)
    assert again.source == result.source, "a second pass must change nothing"
    # a skip comment stays and is reported on every pass; notes on rewrites only on the pass that rewrote
    skips = [f.message for f in result.findings if f.code == "AMP050"]
    assert [f.message for f in again.findings if f.code == "AMP050"] == skips, "a skip is reported on every pass"
    rewrite_notes = [f for f in again.findings if f.fixed and f.code != "AMP050"]
    assert not rewrite_notes or not result.changed, "notes belong to the pass that rewrote"


def test_enough_cases() -> None:
    assert len(CASES) >= 40


def test_expected_files_have_inputs() -> None:
    for suffix in (OUT, FINDINGS):
        for expected in FIXTURES.glob(f"*/*{suffix}"):
            assert expected.with_name(expected.name[: -len(suffix)] + IN).exists(), expected


def test_every_finding_code_is_produced_by_a_case() -> None:
    """The pinned findings (kept equal to the engine's by ``test_fixture``) cover every code."""
    produced = {
        line.split()[1]
        for case in CASES
        if _beside(case, FINDINGS).exists()
        for line in _read(_beside(case, FINDINGS)).splitlines()
    }
    # a code only project mode produces (AMP006: what every call of a function in the project gives)
    # is pinned by a project case (``path:line:col: CODE``, kept equal by tests/test_project.py)
    produced |= {
        line.split()[1]
        for findings in sorted((Path(__file__).parents[1] / "fixtures" / "project").glob("*/findings.txt"))
        for line in findings.read_text().splitlines()
        if line.strip()
    }
    missing = sorted(set(CODES) - produced)
    assert not missing, f"no fixture case produces {', '.join(missing)}"
    assert produced <= set(CODES), sorted(produced - set(CODES))
