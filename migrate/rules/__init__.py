"""The ordered registry of rewrite rules.

Each rule lives in its own module, named for the construct it removes, and only *plans*
edits on a shared ``ModuleContext``; the plan is applied in one transform at the end, so
rules never see each other's half-finished output. Order matters where a rule reads what
an earlier one decided: ``amp_initialize`` creates the scalers that the scale_loss,
master_params and state_dict rules reach, and ``amp_import`` runs last to drop the
imports nothing uses any more and to report what still uses Apex.
"""

from __future__ import annotations

import libcst as cst

from migrate.findings import Finding
from migrate.options import Options
from migrate.rules import (
    amp_disable_casts,
    amp_import,
    amp_initialize,
    amp_master_params,
    amp_scale_loss,
    amp_state_dict,
    apex_multi_tensor,
    apex_normalization,
    apex_optimizers,
    apex_parallel,
    apex_syncbn,
    torch_cuda_amp,
)
from migrate.rules._amp import AmpModel
from migrate.rules._apply import apply_plan
from migrate.rules._context import ModuleContext

RULES = (
    amp_initialize,
    amp_scale_loss,
    amp_master_params,
    amp_state_dict,
    amp_disable_casts,
    apex_optimizers,
    apex_normalization,
    apex_syncbn,
    apex_parallel,
    apex_multi_tensor,
    amp_import,
    torch_cuda_amp,
)

RULE_NAMES = tuple(rule.RULE for rule in RULES)


def run_rules(module: cst.Module, source: str, options: Options) -> tuple[cst.Module, list[Finding]]:
    """Apply every enabled rule to ``module``; return the new module and the findings."""
    ctx = ModuleContext(module, source, options)
    ctx.amp = AmpModel(ctx)  # type: ignore[attr-defined]
    for rule in RULES:
        if options.rule_enabled(rule.RULE):
            rule.plan(ctx)
    if ctx.plan.needs_torch_import and ctx.imports[ctx.module].get("torch"):
        ctx.plan.needs_torch_import = False
    findings = sorted(ctx.findings, key=lambda f: (f.line, f.column, f.code))
    if ctx.plan.empty:
        return module, findings
    return apply_plan(ctx), findings
