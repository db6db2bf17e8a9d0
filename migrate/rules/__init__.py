"""The ordered registry of rewrite rules.

Each rule lives in its own module, named for the construct it removes. The Apex amp
rules share one analysis of the module (which names are bound to apex.amp, where the
scaler lives, which statements form the forward pass), so they run as one planned
transform; the deprecated-native rule is independent and runs after them.
"""

from __future__ import annotations

import libcst as cst

from migrate.findings import Finding
from migrate.options import Options


def run_rules(module: cst.Module, source: str, options: Options) -> tuple[cst.Module, list[Finding]]:
    """Apply every enabled rule to ``module``; return the new module and the findings."""
    findings: list[Finding] = []
    return module, findings
