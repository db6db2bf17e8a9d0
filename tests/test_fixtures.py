"""Fixture pairs: ``fixtures/<rule>/<case>.in.py`` -> ``<case>.out.py``.

A case without ``.out.py`` must come out unchanged. Every case also checks that the
output compiles, that one more pass changes nothing, and that findings of the second
pass are a subset of what is left to review. ``pytest --update-fixtures`` rewrites the
expected files from the engine's output, so reviewers read diffs, not code.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from migrate.engine import migrate_source

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
CASES = sorted(FIXTURES.glob("*/*.in.py"))


def _read(path: Path) -> str:
    with open(path, encoding="utf-8", newline="") as handle:
        return handle.read()


@pytest.mark.parametrize("case", CASES, ids=[f"{p.parent.name}/{p.name[:-6]}" for p in CASES])
def test_fixture(case: Path, request: pytest.FixtureRequest) -> None:
    source = _read(case)
    expected_path = case.with_name(case.name[: -len(".in.py")] + ".out.py")
    result = migrate_source(source)

    if request.config.getoption("--update-fixtures"):
        if result.changed:
            with open(expected_path, "w", encoding="utf-8", newline="") as handle:
                handle.write(result.source)
        elif expected_path.exists():
            expected_path.unlink()

    if expected_path.exists():
        assert result.source == _read(expected_path)
    else:
        assert result.source == source, "a case without .out.py must stay unchanged"

    compile(result.source, str(expected_path), "exec")
    again = migrate_source(result.source)
    assert again.source == result.source, "a second pass must change nothing"
    # (AMP050 says a skip comment is there, and it stays there: every pass says so)
    notes = [f for f in again.findings if f.fixed and f.code != "AMP050"]
    assert not notes or not result.changed, "notes belong to the pass that rewrote"


def test_enough_cases() -> None:
    assert len(CASES) >= 40


def test_expected_outputs_have_inputs() -> None:
    for expected in FIXTURES.glob("*/*.out.py"):
        assert expected.with_name(expected.name[: -len(".out.py")] + ".in.py").exists(), expected
