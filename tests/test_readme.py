"""The README documents what the code does: every rule, every finding code, and a
before/after example that is the engine's real output."""

from __future__ import annotations

import re
from pathlib import Path

from migrate.engine import migrate_source
from migrate.findings import CODES
from migrate.rules import RULE_NAMES

README = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")


def _section(title: str) -> str:
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start : end if end != -1 else None]


def test_every_rule_is_listed() -> None:
    rewrites = _section("What it rewrites")
    for rule in RULE_NAMES:
        assert f"`{rule}`" in rewrites, rule


def test_every_finding_code_is_documented() -> None:
    diagnostics = _section("Diagnostics")
    for code, entry in CODES.items():
        row = next((line for line in diagnostics.splitlines() if line.startswith(f"| `{code}` |")), None)
        assert row is not None, code
        assert entry.summary in row and entry.what_to_do in row, code


def test_before_after_example_is_the_engine_output() -> None:
    before, after = re.findall(r"```python\n(.*?)```", README, flags=re.DOTALL)[:2]
    result = migrate_source("import torch\n" + before)
    assert result.source == "import torch\n\n" + after
