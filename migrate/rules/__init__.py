"""The ordered registry of rewrite rules.

Each rule lives in its own module, named for the Apex construct it removes, and only
*plans* edits on a shared ``ModuleContext``; the plan is applied in one transform at the
end, so rules never see each other's half-finished output. Order matters where a rule
reads what an earlier one decided: ``amp_initialize`` creates the scalers that the
scale_loss, master_params and state_dict rules use, and ``amp_import`` runs last to drop
the imports nothing uses any more.
"""

from __future__ import annotations

import libcst as cst

from migrate.findings import Finding
from migrate.options import Options
from migrate.rules import torch_cuda_amp
from migrate.rules._apply import apply_plan
from migrate.rules._context import ModuleContext

RULES = (torch_cuda_amp,)

RULE_NAMES = tuple(rule.RULE for rule in RULES)


def run_rules(module: cst.Module, source: str, options: Options) -> tuple[cst.Module, list[Finding]]:
    """Apply every enabled rule to ``module``; return the new module and the findings."""
    ctx = ModuleContext(module, source, options)
    for rule in RULES:
        if options.rule_enabled(rule.RULE):
            rule.plan(ctx)
    findings = sorted(ctx.findings, key=lambda f: (f.line, f.column, f.code))
    if ctx.plan.empty:
        return module, findings
    return apply_plan(ctx.module, ctx.plan), findings
