"""The README documents what the code does: every rule, every finding code, and a
before/after example that is the engine's real output."""

from __future__ import annotations

import re
from pathlib import Path

from migrate.engine import migrate_source
from migrate.findings import CODES
from migrate.rules import RULE_NAMES

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _section(title: str) -> str:
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start : end if end != -1 else None]


def test_every_rule_is_listed() -> None:
    rewrites = _section("What it rewrites")
    for rule in RULE_NAMES:
        assert f"`{rule}`" in rewrites, rule


def diagnostics_table() -> str:
    """The README's table of finding codes, as generated from ``migrate.findings.CODES``."""
    rows = [
        "| code | name | kind | what it means | what to do |",
        "|---|---|---|---|---|",
        *(
            f"| `{code}` | {entry.name} | {'note' if entry.fixed else 'review'} | {entry.summary} | {entry.what_to_do} |"
            for code, entry in CODES.items()
        ),
    ]
    return "\n".join(rows) + "\n"


def test_diagnostics_table_is_generated_from_the_registry() -> None:
    table = diagnostics_table()
    assert table in _section("Diagnostics"), f"replace the README's table of codes with:\n{table}"


def test_readme_test_command_is_the_one_ci_runs() -> None:
    quick_start = _section("Quick start")
    commands = [
        line for block in re.findall(r"```sh\n(.*?)```", quick_start, flags=re.DOTALL) for line in block.splitlines()
    ]
    tests = [command for command in commands if "pytest" in command]
    assert len(tests) == 1, tests
    ci_run = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert tests[0] in ci_run, f".ci/run must run exactly the README's test command: {tests[0]}"


def test_before_after_example_is_the_engine_output() -> None:
    before, after = re.findall(r"```python\n(.*?)```", README, flags=re.DOTALL)[:2]
    result = migrate_source("import torch\n" + before)
    assert result.source == "import torch\n\n" + after
