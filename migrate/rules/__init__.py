"""The ordered registry of rewrite rules.

Each rule lives in its own module, named for the construct it removes, and only *plans*
edits on a shared ``ModuleContext``; the plan is applied in one transform at the end, so
rules never see each other's half-finished output. Order matters where a rule reads what
an earlier one decided: ``amp_initialize`` creates the scalers that the scale_loss,
master_params and state_dict rules reach, and ``amp_import`` runs last to drop the
imports nothing uses any more and to report what still uses Apex.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from migrate.findings import Finding
from migrate.options import Options, ScalerInfo
from migrate.rules import _carriers as carriers
from migrate.rules import _local_copies as local_copies
from migrate.rules import _project_scaler as project_scaler
from migrate.rules import _setup as setup
from migrate.rules import (
    amp_cast_functions,
    amp_disable_casts,
    amp_import,
    amp_init,
    amp_initialize,
    amp_master_params,
    amp_private_state,
    amp_scale_loss,
    amp_state_dict,
    amp_version_fallback,
    apex_clip_grad,
    apex_multi_tensor,
    apex_normalization,
    apex_optimizers,
    apex_parallel,
    apex_syncbn,
    fp16_optimizer,
    hf_trainer_apex_backend,
    timm_apex_scaler,
    torch_cuda_amp,
)
from migrate.rules._apply import apply_plan
from migrate.rules._context import ModuleContext

RULES = (
    amp_version_fallback,
    timm_apex_scaler,
    hf_trainer_apex_backend,
    amp_initialize,
    amp_init,
    amp_scale_loss,
    amp_master_params,
    amp_state_dict,
    amp_private_state,
    amp_disable_casts,
    amp_cast_functions,
    apex_optimizers,
    fp16_optimizer,
    apex_normalization,
    apex_syncbn,
    apex_parallel,
    apex_multi_tensor,
    apex_clip_grad,
    amp_import,
    torch_cuda_amp,
)

RULE_NAMES = tuple(rule.RULE for rule in RULES)


@dataclass(frozen=True)
class RulesOutcome:
    """The migrated module, the findings, and how the amp setup came out."""

    module: cst.Module
    findings: list[Finding]
    amp_left: bool  # some use of Apex amp stays in the code
    amp_migrated: bool  # some use of Apex amp was rewritten
    scalers: tuple[ScalerInfo, ...] = ()  # the GradScalers created, as other modules see them
    # a GradScaler was created for training, but no backward here uses it, nor is it passed on:
    # the loop that needs it lives elsewhere (reached at run time, not through imports)
    scaler_unused: bool = False


def run_rules(module: cst.Module, source: str, options: Options) -> RulesOutcome:
    """Apply every enabled rule to ``module``; the amp setup is migrated whole or not at all."""
    frozen = options.facts.frozen
    blocked: list[Finding] = []
    probe = None
    if frozen is None and options.rule_enabled("amp_initialize"):
        probe = ModuleContext(module, source, options)
        frozen, blocked = setup.unsupported_shapes(probe), probe.findings
    # the probe binds nothing: its index is handed to the plan's context
    ctx, unshared = _plan(module, source, options, frozen=frozen is not None, handed_over=probe)
    ctx.findings.extend(blocked)
    left = setup.leftovers(ctx)
    if frozen is None and (left or unshared) and setup.migrated_any(ctx):
        # half a setup would crash or train differently: keep all of it, say why
        frozen = setup.why_left(ctx, left) if left else "the GradScaler could not be shared (see AMP022)"
        unresolved = [finding for finding in ctx.findings if not finding.fixed or finding.code == "AMP050"]
        ctx.release()
        ctx, unshared = _plan(module, source, options, frozen=True)
        # a value use the first pass explained (why its carrier's store could not hold the scaler)
        # says it once, as it said it then
        said = {(f.line, f.column) for f in unresolved if f.code == "AMP030"}
        ctx.findings[:] = [f for f in ctx.findings if not (f.code == "AMP030" and (f.line, f.column) in said)]
        ctx.findings.extend(finding for finding in unresolved if finding not in ctx.findings)
        left = setup.leftovers(ctx)
    if not left and not unshared and ctx.explains_leftovers:
        ctx.findings[:] = [finding for finding in ctx.findings if finding not in ctx.explains_leftovers]
    if frozen is not None:
        setup.report_frozen(ctx, frozen)
    unseen = setup.report_unseen_amp(ctx)
    findings = sorted(ctx.findings, key=lambda f: (f.line, f.column, f.code))
    new_module = module if ctx.plan.empty else apply_plan(ctx)
    if frozen is None and ctx.carriers.any and ctx.carriers.stored_scalers:
        new_module = carriers.inline_stored_scalers(new_module, ctx.carriers.stored_scalers)
    outcome = RulesOutcome(
        new_module,
        findings,
        bool(left) or unseen > 0 or unshared > 0,
        setup.migrated_any(ctx) and not (frozen is None and ctx.amp_folded_away),
        project_scaler.shared_scalers(ctx, ctx.amp),
        project_scaler.unused(ctx, options.facts),
    )
    ctx.release()
    if probe is not None:
        probe.release()
    return outcome


def _plan(
    module: cst.Module, source: str, options: Options, frozen: bool, handed_over: ModuleContext | None = None
) -> tuple[ModuleContext, int]:
    """Plan every rule; returns the context and how many cross-module scaler hand-overs failed."""
    ctx = ModuleContext(module, source, options, handed_over)
    setup.bind_project_amp(ctx, options.facts.amp_from)  # before the amp model resolves names
    local_copies.bind(ctx)  # names from a project's copy of apex.fp16_utils, as Apex's
    model = ctx.amp
    migrating = not frozen and options.rule_enabled("amp_initialize")
    unshared = project_scaler.receive(ctx, model, options.facts) if migrating else 0
    if migrating and options.facts.inherited_scalers:
        unshared += project_scaler.inherit(ctx, model, options.facts)
    if migrating and ctx.carriers.any:
        project_scaler.carried(ctx, model)
    if migrating and options.facts.runner_scalers:
        project_scaler.on_runner(ctx, model, options.facts)
    for rule in RULES:
        if options.rule_enabled(rule.RULE) and not (frozen and rule.RULE in setup.AMP_SETUP_RULES):
            rule.plan(ctx)
    if migrating:
        unshared += project_scaler.pass_on(ctx, model, options.facts)
        unshared += project_scaler.carry_on_runner(ctx, model, options.facts)
    local_copies.report_prefixes(ctx)
    if ctx.plan.needs_torch_import and ctx.imports[ctx.module].get("torch"):
        ctx.plan.needs_torch_import = False
    return ctx, unshared
