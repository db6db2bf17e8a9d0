"""Names imported from a project's own copy of Apex's fp16_utils, bound as the Apex names.

Project mode tells a module which names it imports from a local copy (``fp16/fp16.py``
defining ``FP16_Optimizer`` with Apex's shape; see ``migrate.apex_copies``). ``bind`` adds
those names to the module's tracked imports as the Apex objects they copy, so the
fp16_optimizer rule migrates ``FP16_Optimizer`` / ``FP16_Module`` / ``network_to_half`` from
a copy as it does Apex's, all or nothing. The copy itself stays as it is (user code; it may
become unused). What keeps a copy's FP16_Optimizer from being migrated is reported at its
import (AMP040) and nothing from the copy is bound then.
"""

from __future__ import annotations

import libcst as cst

from migrate.apex_copies import OPTIMIZER, looks_like_copy_module
from migrate.rules._bindings import Binding, dotted_name
from migrate.rules._context import ModuleContext

_RECIPE = (
    '; write instead the float32 model (no FP16_Module/network_to_half/.half()), `scaler = torch.amp.GradScaler("cuda")`, '
    'the forward pass and loss under `with torch.autocast("cuda", dtype=torch.float16):`, '
    "`scaler.scale(loss).backward()`, `scaler.step(optimizer)` and `scaler.update()`"
)
# the names that make the model float16: they go with the optimizer or stay with it
_HALVING = frozenset(
    {"apex.fp16_utils.FP16Model", "apex.fp16_utils.network_to_half", "apex.fp16_utils.BN_convert_float"}
)


def _spelled(node: cst.ImportFrom) -> str:
    module = dotted_name(node.module) if node.module is not None else ""
    return "." * len(node.relative) + (module or "")


def _used_names(ctx: ModuleContext) -> set[str]:
    """Names read anywhere in the module (not those an import binds, not attribute names)."""
    used = set()
    for name in ctx.nodes_of(cst.Name):
        parent = ctx.parent(name)
        if isinstance(parent, (cst.ImportAlias, cst.AsName)) or (
            isinstance(parent, cst.Attribute) and parent.attr is name
        ):
            continue
        used.add(name.value)
    return used


def _module_attribute_reads(ctx: ModuleContext, wrappers: set[str]) -> str | None:
    """``model.module`` on a model a copied FP16_Module wraps (``model = FP16_Module(model)``), or
    ``x.module.module``: code that reaches into the wrapper, which the migration removes."""
    wrapped: set[str] = set()
    for call in ctx.nodes_of(cst.Call):
        if isinstance(call.func, cst.Name) and call.func.value in wrappers:
            statement = ctx.statement_of(call)
            small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else None
            if isinstance(small, cst.Assign) and small.value is call:
                wrapped.update(filter(None, (dotted_name(t.target) for t in small.targets)))
    for name in ctx.nodes_of(cst.Name):
        parent = ctx.parent(name)
        if not (name.value == "module" and isinstance(parent, cst.Attribute) and parent.attr is name):
            continue
        base = dotted_name(parent.value)
        if base in wrapped or (base is not None and base.endswith(".module")):
            return f"`{base}.module` reaches into the FP16_Module wrapper, which the migration removes"
    return None


def _halved_elsewhere(ctx: ModuleContext, halving: set[str], optimizers: set[str]) -> str | None:
    """A model made float16 (``FP16_Module(m)``, ``network_to_half(m)``, ``model.half()``) in another
    function than every FP16_Optimizer set-up: the rule keeps the model float32 only in the set-up's
    function, and a float16 model under a GradScaler fails in ``unscale_``."""
    scopes = {
        ctx.scope_of(call)
        for call in ctx.nodes_of(cst.Call)
        if isinstance(call.func, cst.Name) and call.func.value in optimizers
    }
    for call in ctx.nodes_of(cst.Call):
        func = call.func
        if isinstance(func, cst.Name) and func.value in halving:
            what = func.value
        elif isinstance(func, cst.Attribute) and func.attr.value == "half" and not call.args:
            base = func.value
            while isinstance(base, cst.Call) and isinstance(base.func, cst.Attribute):
                base = base.func.value
            last = (dotted_name(base) or "").rsplit(".", 1)[-1].lower()
            if not (last.endswith(("model", "net")) or last.startswith("net")):
                continue
            what = "half"
        else:
            continue
        if ctx.scope_of(call) not in scopes:
            line = ctx.position(call)[0]
            return (
                f"line {line} makes the model float16 (`{what}`) in another function than the FP16_Optimizer set-up, "
                "which the migration would leave float16 under a GradScaler"
            )
    return None


def bind(ctx: ModuleContext) -> None:
    """Bind the names this module imports from a local copy of fp16_utils as Apex's (see module doc)."""
    facts = {(spelled, name): fact for spelled, name, *fact in ctx.options.facts.apex_copies}
    if not facts and "FP16_Optimizer" not in ctx.source:
        return  # nothing imported from a copy, and no FP16_Optimizer to report (most modules)
    used = _used_names(ctx)
    aliases: list[tuple[cst.ImportFrom, cst.ImportAlias, str, list[str]]] = []
    for node in ctx.nodes_of(cst.ImportFrom):
        spelled = _spelled(node)
        if isinstance(node.names, cst.ImportStar):
            star = facts.get((spelled, "*"))
            if star is not None and "FP16_Optimizer" in used:
                ctx.report(
                    "AMP040",
                    node,
                    f"FP16_Optimizer comes through `from {spelled} import *`, a local copy of {OPTIMIZER} ({star[1]}): "
                    f"import the names it uses by name (`from {spelled} import FP16_Optimizer, ...`) and run ampmigrate "
                    "again; left as it was",
                )
            continue
        for alias in node.names:
            name = dotted_name(alias.name) or ""
            bound = alias.evaluated_alias or name
            fact = facts.get((spelled, name))
            if fact is None:
                if name == "FP16_Optimizer" and bound in used and looks_like_copy_module(spelled):
                    ctx.report(
                        "AMP040",
                        alias,
                        f"FP16_Optimizer comes from `{spelled}`, a module this run did not read; if it is a local copy "
                        "of apex.fp16_utils, run ampmigrate on the project with that module included (its "
                        "FP16_Optimizer then migrates like Apex's); left as it was",
                    )
                continue
            if bound in used:
                aliases.append((node, alias, bound, [name, *fact]))
    optimizer = [entry for entry in aliases if entry[3][1] == OPTIMIZER]
    blockers = [
        (entry[3][0], entry[3][2], entry[3][3])
        for entry in aliases
        if entry[3][3] and entry[3][1] != OPTIMIZER and entry[3][1] in ("", *_HALVING)
    ]
    wrappers = {entry[2] for entry in aliases if entry[3][1] == "apex.fp16_utils.FP16Model"}
    reach = _module_attribute_reads(ctx, wrappers) if wrappers and optimizer else None
    if optimizer and reach is None:
        halving = {entry[2] for entry in aliases if entry[3][1] in _HALVING}
        reach = _halved_elsewhere(ctx, halving, {entry[2] for entry in optimizer})
    optimizer_ok = bool(optimizer)
    for _node, alias, _bound, (name, _apex, where, problem, _dynamic) in optimizer:
        reason = problem
        if not reason and blockers:
            other, other_where, why = blockers[0]
            reason = f"this module also uses `{other}` from the copy ({other_where}): {why}; migrate them by hand"
        if not reason and reach:
            reason = reach
        if reason:
            optimizer_ok = False
            recipe = "" if "was not given" in reason else _RECIPE
            ctx.report(
                "AMP040", alias, f"{name} ({where}, a local copy of {OPTIMIZER}) left as it was: {reason}{recipe}"
            )
    for node, alias, bound, (_name, apex, where, problem, dynamic) in aliases:
        if not apex or problem or (apex == OPTIMIZER or apex in _HALVING) and not optimizer_ok:
            continue
        binding = Binding("other_apex", apex, alias, node, copy=where, copy_dynamic=dynamic)  # see CopyFact
        ctx.bind_at(ctx.scope_of(node), bound, binding)


def report_prefixes(ctx: ModuleContext) -> None:
    """A copied wrapper that was migrated away and whose state_dict did not delegate to its child:
    the model's state_dict keys lose the wrapper's prefix (AMP041, as for Apex's FP16Model)."""
    if not ctx.options.facts.apex_copies:
        return
    for name in ctx.consumed:
        if not isinstance(name, cst.Name):
            continue
        binding = ctx.resolve(name.value, name)
        if binding is None or binding.copy is None or binding.target != "apex.fp16_utils.FP16Model":
            continue
        if binding.copy_dynamic:
            ctx.report(
                "AMP041",
                name,
                f"{name.value} ({binding.copy}, a local copy of Apex's FP16Model) was removed: the model's state_dict "
                f"keys lose the `{binding.copy_dynamic}.` prefix the wrapper gave them (checkpoints saved through it "
                f"load with `{{k.removeprefix('{binding.copy_dynamic}.'): v for k, v in state.items()}}`)",
            )


def describe(ctx: ModuleContext, root: cst.Name, path: str) -> str:
    """``path`` as a finding names it: with the local copy it was imported from, if it was."""
    binding = ctx.resolve(root.value, root)
    if binding is None or binding.copy is None:
        return path
    return f"{root.value} ({binding.copy}, a local copy of {path})"


def dynamic_problem(ctx: ModuleContext, root: cst.Name) -> str:
    """Why dynamic loss scaling with the FP16_Optimizer bound to ``root`` cannot be migrated ("": it can)."""
    binding = ctx.resolve(root.value, root)
    return binding.copy_dynamic if binding is not None else ""
