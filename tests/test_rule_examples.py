"""Each rule's documented example is a test: its ``Before::`` program, run through the
engine, must give exactly its ``After::`` program (as Fixit does with a rule's examples).

The blocks are reStructuredText literal blocks: ``Before::``, a blank line, then the
program indented by four spaces (blank lines inside it allowed), ending at the next
unindented line. Both are complete modules, imports included, so the docstring shows
everything the engine writes (``import torch``, helpers, the scaler).
"""

from __future__ import annotations

import re
import textwrap
from types import ModuleType

import pytest

from migrate.engine import migrate_source
from migrate.options import Options
from migrate.rules import RULE_NAMES, RULES


def example(rule: ModuleType, name: str) -> str:
    """The code of the ``name::`` literal block in the rule's docstring."""
    doc = rule.__doc__ or ""
    found = re.search(rf"^{name}::\n\n((?:    .*\n|\n)+)", doc, flags=re.MULTILINE)
    assert found is not None, f"{rule.RULE}: no {name}:: block"
    return textwrap.dedent(found.group(1)).strip("\n") + "\n"


@pytest.mark.parametrize("rule", RULES, ids=RULE_NAMES)
def test_documented_example_is_the_engine_output(rule: ModuleType) -> None:
    before, after = example(rule, "Before"), example(rule, "After")
    assert before != after, f"{rule.RULE}: the example rewrites nothing"
    result = migrate_source(before)
    assert result.source == after, f"{rule.RULE}: the engine writes\n{result.source}"
    assert migrate_source(after).source == after, f"{rule.RULE}: the After example is not a fixed point"


@pytest.mark.parametrize("rule", RULES, ids=RULE_NAMES)
def test_documented_example_needs_its_own_rule(rule: ModuleType) -> None:
    """Without this rule the example comes out differently: it documents this rule."""
    before = example(rule, "Before")
    others = Options(select=frozenset(RULE_NAMES) - {rule.RULE})
    assert migrate_source(before, others).source != migrate_source(before).source, rule.RULE
