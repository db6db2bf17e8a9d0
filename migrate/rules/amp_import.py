"""amp_import: the Apex imports, once nothing uses them.

What it rewrites
    ``from apex import amp [as X]``, ``import apex.amp as X``, ``import apex`` (used as
    ``apex.amp.X``) and ``from apex.amp import ...`` go when every use was migrated.
    The optional-import pattern ``try: from apex import amp ... except ImportError: ...``
    collapses to what the ``try`` body did besides importing (``APEX_AVAILABLE = True``
    keeps working: torch.amp is always there); a ``try`` that also imports other things
    keeps its shape. ``import torch`` is added when the new code needs it.

Before::

    try:
        from apex import amp
        APEX_AVAILABLE = True
    except ImportError:
        APEX_AVAILABLE = False

After::

    APEX_AVAILABLE = True

Not rewritten (reported instead)
    Whatever still uses Apex after the other rules ran: the amp module stored or passed
    as a value (AMP030), private Apex state (AMP031), amp functions without a rewrite
    (AMP032), other Apex modules (AMP040). Their imports stay so the code keeps running
    where Apex is installed.

References
    ../shared/apex-semantics.md sections 0 and 9 (first row).
"""

from __future__ import annotations

import libcst as cst

from migrate.rules._amp import AmpModel
from migrate.rules._bindings import Binding, dotted_name
from migrate.rules._context import ModuleContext

RULE = "amp_import"

_MIGRATED_APIS = frozenset(
    {"initialize", "scale_loss", "master_params", "state_dict", "load_state_dict", "disable_casts"}
)
_IMPORT_ERRORS = frozenset({"ImportError", "ModuleNotFoundError", "Exception", "BaseException"})

# what to use instead of other Apex modules (AMP040 messages)
REPLACEMENTS = {
    "apex.parallel.DistributedDataParallel": "torch.nn.parallel.DistributedDataParallel "
    "(device_ids=[local_rank]; broadcast_buffers=False matches Apex)",
    "apex.parallel.SyncBatchNorm": "torch.nn.SyncBatchNorm",
    "apex.parallel.convert_syncbn_model": "torch.nn.SyncBatchNorm.convert_sync_batchnorm",
    "apex.parallel.LARC": "no torch equivalent",
    "apex.optimizers.FusedAdam": "torch.optim.AdamW with an explicit weight_decay (FusedAdam's "
    "adam_w_mode=True default is AdamW; torch AdamW defaults weight_decay=0.01, FusedAdam 0.0), "
    "or torch.optim.Adam when adam_w_mode=False",
    "apex.optimizers.FusedSGD": "torch.optim.SGD",
    "apex.optimizers.FusedAdagrad": "torch.optim.Adagrad",
    "apex.optimizers.FusedLAMB": "no torch equivalent (apex.optimizers still ships it)",
    "apex.normalization.FusedLayerNorm": "torch.nn.LayerNorm",
    "apex.normalization.FusedRMSNorm": "torch.nn.RMSNorm(..., eps=1e-5)",
    "apex.fp16_utils.FP16_Optimizer": "torch.autocast + torch.amp.GradScaler on the fp32 model",
    "apex.fp16_utils": "torch.autocast + torch.amp.GradScaler on the fp32 model",
    "apex.parallel": "torch.nn.parallel.DistributedDataParallel / torch.nn.SyncBatchNorm",
    "apex.amp": "the GradScaler's public API (scaler.get_scale(), scaler.state_dict())",
}


def _replacement(path: str) -> str:
    """What to do instead of ``path``, as a phrase."""
    while path:
        if path in REPLACEMENTS:
            advice = REPLACEMENTS[path]
            return advice if advice.startswith("no ") else f"use {advice}"
        path = path.rpartition(".")[0]
    return "use its torch equivalent"


def _references(ctx: ModuleContext) -> dict[cst.ImportAlias, list[cst.Name]]:
    """Every Name that refers to an Apex binding, grouped by the import alias."""
    found: dict[cst.ImportAlias, list[cst.Name]] = {}
    for node in ctx.nodes_of(cst.Name):
        parent = ctx.parent(node)
        if isinstance(parent, (cst.ImportAlias, cst.AsName)):
            continue
        if isinstance(parent, cst.Attribute) and parent.attr is node:
            continue
        binding = ctx.resolve(node.value, node)
        if binding is None or binding.kind not in ("amp", "apex", "amp_function", "other_apex"):
            continue
        if any(isinstance(a, (cst.Import, cst.ImportFrom)) for a in ctx.ancestors(node)):
            continue
        found.setdefault(binding.alias, []).append(node)
    return found


def _is_fallback(ctx: ModuleContext, name: cst.Name) -> bool:
    """``amp = None`` / ``del amp`` in an except clause: not a use of the module."""
    parent = ctx.parent(name)
    if isinstance(parent, (cst.AssignTarget, cst.Del)) or (
        isinstance(parent, cst.Element) and isinstance(ctx.parent(ctx.parent(parent)), cst.AssignTarget)  # type: ignore[arg-type]
    ):
        return any(isinstance(a, cst.ExceptHandler) for a in ctx.ancestors(name))
    return False


def _catches_import_error(handler: cst.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    types = handler.type.elements if isinstance(handler.type, cst.Tuple) else [handler.type]
    names = {dotted_name(t.value) if isinstance(t, cst.BaseElement) else dotted_name(t) for t in types}
    return bool(names & _IMPORT_ERRORS)


def _is_simple(statement: cst.CSTNode) -> bool:
    """Statements that cannot raise ImportError themselves (flag assignments, logging)."""
    if not isinstance(statement, cst.SimpleStatementLine):
        return False
    return all(isinstance(small, (cst.Assign, cst.AnnAssign, cst.Pass, cst.Expr)) for small in statement.body)


def _drop_import_statement(ctx: ModuleContext, line: cst.CSTNode) -> None:
    """Remove an import line; collapse an optional-import ``try`` around it."""
    block = ctx.parent(line)
    owner = ctx.parent(block) if isinstance(block, cst.IndentedBlock) else None
    if isinstance(owner, cst.Try) and ctx.skipped(owner):
        return  # `try:  # ampmigrate: skip` keeps the whole optional import as it was
    if ctx.skipped(line):
        return
    if isinstance(owner, cst.Try) and owner.body is block and owner.finalbody is None:
        remaining = [s for s in block.body if s is not line and s not in ctx.plan.remove]
        if all(_is_simple(s) for s in remaining) and all(_catches_import_error(h) for h in owner.handlers):
            keep = [*remaining, *(owner.orelse.body.body if owner.orelse is not None else ())]  # type: ignore[union-attr]
            if keep:
                keep[0] = keep[0].with_changes(leading_lines=[*owner.leading_lines, *keep[0].leading_lines])
                ctx.plan.replace_statement[owner] = keep
            else:
                ctx.plan.remove.add(owner)
            return
    ctx.plan.remove.add(line)


def _plan_imports(ctx: ModuleContext, references: dict[cst.ImportAlias, list[cst.Name]]) -> None:
    removable: dict[cst.Import | cst.ImportFrom, set[cst.ImportAlias]] = {}
    exported = ctx.options.facts.exported
    for scope, scope_imports in ctx.imports.items():
        for bound, bindings in scope_imports.items():
            for binding in bindings:
                if binding.kind not in ("amp", "apex", "amp_function", "other_apex"):
                    continue
                uses = references.get(binding.alias, [])
                if scope is ctx.module and (bound in exported or "*" in exported):
                    continue  # other modules of the project import it from here
                if any(name not in ctx.consumed and not _is_fallback(ctx, name) for name in uses):
                    continue  # still used: keep it so that code keeps running with Apex
                if binding.kind in ("apex", "other_apex") and not any(name in ctx.consumed for name in uses):
                    continue  # an Apex import this run did not migrate anything of
                removable.setdefault(binding.statement, set()).add(binding.alias)
    for statement, aliases in removable.items():
        names = statement.names
        if isinstance(names, cst.ImportStar):
            continue
        kept = [alias for alias in names if alias not in aliases]
        line = ctx.statement_of(statement)
        if not kept:
            if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
                _drop_import_statement(ctx, line)
            else:
                ctx.plan.substitute(statement, cst.Pass())
            continue
        kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)

        def shrink(updated: cst.CSTNode, kept=kept) -> cst.CSTNode:
            assert isinstance(updated, (cst.Import, cst.ImportFrom))
            if isinstance(updated, cst.ImportFrom) and updated.rpar is not None and len(kept) == 1:
                return updated.with_changes(names=kept, lpar=None, rpar=None)
            return updated.with_changes(names=kept)

        ctx.plan.replace[statement] = shrink


def _report_leftovers(ctx: ModuleContext, model: AmpModel, references: dict[cst.ImportAlias, list[cst.Name]]) -> None:
    for name in model.value_uses:
        if name not in ctx.consumed:
            ctx.report("AMP030", name)
    for attribute in model.private_uses:
        ctx.report("AMP031", attribute)
    for attribute in model.other_attributes:
        ctx.report("AMP032", attribute, f"amp.{attribute.attr.value} has no automatic rewrite")
    for use in model.calls:
        if use.api not in _MIGRATED_APIS:
            ctx.report("AMP032", use.call, f"amp.{use.api}() has no automatic rewrite")
    reported: set[int] = set()
    for scope_imports in ctx.imports.values():
        for bindings in scope_imports.values():
            for binding in bindings:
                if binding.kind == "other_apex" and id(binding.alias) not in reported:
                    reported.add(id(binding.alias))
                    uses = references.get(binding.alias, [])
                    if any(name not in ctx.consumed for name in uses) or not uses:
                        # a star import has no alias of its own to point at
                        anchor = (
                            binding.statement if isinstance(binding.statement.names, cst.ImportStar) else binding.alias
                        )
                        ctx.report("AMP040", anchor, f"{binding.target}: {_replacement(binding.target)}")
                elif binding.kind == "apex":
                    _report_apex_package_uses(ctx, binding, references)


def _report_apex_package_uses(
    ctx: ModuleContext, binding: Binding, references: dict[cst.ImportAlias, list[cst.Name]]
) -> None:
    for name in references.get(binding.alias, []):
        if name in ctx.consumed:
            continue
        attribute = ctx.parent(name)
        path = "apex"
        while isinstance(attribute, cst.Attribute):
            path = f"{path}.{attribute.attr.value}"
            attribute = ctx.parent(attribute)
        if path.startswith("apex.amp"):
            continue  # reported by the amp rules
        ctx.report("AMP040", name, f"{path}: {_replacement(path)}")


def plan(ctx: ModuleContext) -> None:
    model = ctx.amp
    references = _references(ctx)
    _report_leftovers(ctx, model, references)
    _plan_imports(ctx, references)
