"""torch_cuda_amp: the deprecated ``torch.cuda.amp`` / ``torch.cpu.amp`` forms.

What it rewrites
    ``torch.cuda.amp.autocast(...)`` and ``torch.cpu.amp.autocast(...)`` to
    ``torch.autocast("cuda" | "cpu", ...)``; ``torch.cuda.amp.GradScaler(...)`` to
    ``torch.amp.GradScaler("cuda", ...)``; ``custom_fwd`` / ``custom_bwd`` to their
    ``torch.amp`` forms with ``device_type=``. Names imported with
    ``from torch.cuda.amp import autocast, GradScaler`` keep their short form: the import
    becomes ``from torch.amp import ...`` and each call gets its device.

Before::

    import torch

    with torch.cuda.amp.autocast(enabled=use_amp):
        out = model(x)
    scaler = torch.cuda.amp.GradScaler()

After::

    import torch

    with torch.autocast("cuda", dtype=torch.float16, enabled=use_amp):
        out = model(x)
    scaler = torch.amp.GradScaler("cuda")

Not rewritten
    Uses that are not calls or decorators (passing ``torch.cuda.amp.autocast`` around), and
    calls inside an ``except`` clause: those are fallbacks for torch versions that lack
    the new form.

Safety
    Exact: the old forms are thin deprecated wrappers of the new ones (PyTorch 2.4
    deprecated them). ``autocast``'s positional arguments are given their names, since
    ``torch.autocast`` takes the device first. The old ``autocast`` defaulted to
    ``dtype=torch.float16`` ("cuda") or ``torch.bfloat16`` ("cpu"), while ``torch.autocast``
    without a dtype takes the one in force where it is built: nested in an autocast of another
    dtype (model code run under a bfloat16 region), or after ``torch.set_autocast_dtype``, it
    would cast to that one. So the default is written out (not for ``enabled=False``).

References
    pytorch/pytorch: torch/cuda/amp/autocast_mode.py, torch/amp/autocast_mode.py,
    torch/amp/grad_scaler.py (PRs #126062, #126527, #126531).
"""

from __future__ import annotations

import libcst as cst

from migrate.rules import _syntax as syntax
from migrate.rules._bindings import dotted_name
from migrate.rules._context import ModuleContext

RULE = "torch_cuda_amp"

# the parameters of the deprecated autocast, in positional order
_AUTOCAST_PARAMETERS = ("enabled", "dtype", "cache_enabled")
_MOVABLE = {"autocast", "GradScaler", "custom_fwd", "custom_bwd"}
# the dtype each deprecated autocast class defaulted to
_DEFAULT_DTYPE = {"cuda": "torch.float16", "cpu": "torch.bfloat16"}


def _deprecated_target(ctx: ModuleContext, func: cst.BaseExpression) -> tuple[str, str, str] | None:
    """(device, object name, how it is spelled) for a deprecated torch amp reference.

    The spelling is "dotted" (``torch.cuda.amp.X``), "name" (``X`` from a from-import)
    or "module" (``amp.X`` with ``from torch.cuda import amp``).
    """
    name = dotted_name(func)
    if name is None:
        return None
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "torch" and parts[1] in ("cuda", "cpu") and parts[2] == "amp":
        binding = ctx.resolve("torch", func)
        if (binding is not None and binding.kind == "torch") or _torch_from_star_import(ctx):
            return parts[1], parts[3], "dotted"
        return None
    if len(parts) == 1:
        binding = ctx.resolve(parts[0], func)
        if binding is not None and binding.kind == "torch_amp" and _movable(binding.statement):
            device, _, original = binding.target.partition(".")
            return device, original, "name"
    if len(parts) == 2:
        binding = ctx.resolve(parts[0], func)
        if binding is not None and binding.kind == "torch_amp_module" and _module_import_moves(binding.statement):
            return binding.target, parts[1], "module"
    return None


def _torch_from_star_import(ctx: ModuleContext) -> bool:
    """``torch`` used but bound by no import or assignment here: a star import brings it.

    Without this, a file whose only torch comes from ``from pkg import *`` would be
    rewritten on the second pass, once the first one added ``import torch`` for another rule.
    """
    if "torch" in ctx.imports.get(ctx.module, {}) or any("torch" in names for names in ctx.locals.values()):
        return False
    return any(isinstance(statement.names, cst.ImportStar) for statement in ctx.nodes_of(cst.ImportFrom))


def _module_import_moves(statement: cst.Import | cst.ImportFrom) -> bool:
    """Whether the import of the deprecated module is itself rewritten to torch.amp (see
    ``_plan_module_imports``): ``amp.X(...)`` may only gain a device argument then."""
    return not isinstance(statement.names, cst.ImportStar) and len(statement.names) == 1


def _plan_module_imports(ctx: ModuleContext, stuck: set[cst.CSTNode]) -> None:
    """``import torch.cuda.amp as amp`` -> ``import torch.amp as amp`` (the calls gain a device)."""
    for scope_imports in ctx.imports.values():
        for bindings in scope_imports.values():
            for binding in bindings:
                statement = binding.statement
                if (
                    binding.kind == "torch_amp_module"
                    and isinstance(statement, cst.Import)
                    and _module_import_moves(statement)
                    and not ctx.skipped(statement)
                    and statement not in stuck
                ):
                    alias = binding.alias
                    ctx.plan.replace[alias] = lambda updated: updated.with_changes(name=syntax.dotted("torch.amp"))


def _movable(statement: cst.Import | cst.ImportFrom) -> bool:
    """Whether every name of this ``from torch.cuda.amp import ...`` exists in torch.amp."""
    names = statement.names
    return not isinstance(names, cst.ImportStar) and all(
        dotted_name(alias.name) in _MOVABLE for alias in names  # type: ignore[union-attr]
    )


def _pins_dtype(call: cst.Call) -> bool:
    """Whether the rewrite of this deprecated ``autocast(...)`` call writes its dtype: the old
    class defaulted to float16 ("cuda") or bfloat16 ("cpu"), while ``torch.autocast`` without
    one takes the dtype in force where it is built (an enclosing autocast's, or
    ``torch.set_autocast_dtype``'s). Not written where the call names a dtype, or is
    ``enabled=False`` (no cast to make)."""
    bound = syntax.bind_arguments(call, _AUTOCAST_PARAMETERS)
    if bound is None or "dtype" in bound:
        return False
    return "enabled" not in bound or syntax.literal(bound["enabled"].value) is not False


def _rewrite_call(device: str, obj: str, spelling: str, call: cst.Call) -> cst.Call | None:
    device_arg = syntax.string(device)
    if obj == "autocast":
        pinned = _pins_dtype(call)
        args = syntax.with_keywords(call, _AUTOCAST_PARAMETERS)
        if args is None:
            return None
        call = call.with_changes(args=args)
        func = syntax.dotted("torch.autocast") if spelling == "dotted" else call.func
        first = [cst.Arg(device_arg)]
        if pinned:
            first.append(syntax.keyword("dtype", syntax.dotted(_DEFAULT_DTYPE[device])))
        return syntax.prepend_args(call.with_changes(func=func), first)
    if obj == "GradScaler":
        if any(arg.star for arg in call.args):
            return None
        func = syntax.dotted("torch.amp.GradScaler") if spelling == "dotted" else call.func
        return syntax.prepend_args(call.with_changes(func=func), [cst.Arg(device_arg)])
    if obj in ("custom_fwd", "custom_bwd"):
        positional = [arg for arg in call.args if arg.keyword is None]
        if (
            any(arg.star for arg in call.args)
            or len(positional) > 1
            or (positional and call.args[0] is not positional[0])
        ):
            return None
        func = syntax.dotted(f"torch.amp.{obj}") if spelling == "dotted" else call.func
        if positional:
            # `custom_fwd(fn)` applied by hand: device_type is keyword-only, after the function
            return call.with_changes(func=func, args=[*call.args, syntax.keyword("device_type", device_arg)])
        return syntax.prepend_args(call.with_changes(func=func), [syntax.keyword("device_type", device_arg)])
    return None


def _stuck_imports(ctx: ModuleContext) -> set[cst.CSTNode]:
    """The imports of deprecated names (``from torch.cuda.amp import autocast``, ``from torch.cuda
    import amp``) that must stay: some use of what they bind is not a call this rule rewrites
    (``amp_autocast = autocast``, a call in an ``except`` fallback). torch.amp's autocast and
    custom_fwd/custom_bwd need a device the old ones did not, so moving the import would break
    that use."""
    stuck: set[cst.CSTNode] = set()
    for name in ctx.reference_names():
        parent = ctx.parent(name)
        binding = ctx.resolve(name.value, name)
        if binding is None or binding.kind not in ("torch_amp", "torch_amp_module") or binding.statement in stuck:
            continue
        if binding.kind == "torch_amp":
            device, _, obj = binding.target.partition(".")
            use: cst.CSTNode = name
        elif isinstance(parent, cst.Attribute) and parent.value is name:
            device, obj, use = binding.target, parent.attr.value, parent
        else:
            stuck.add(binding.statement)  # the module itself passed around
            continue
        if obj == "GradScaler":
            continue  # the class is the same; a GradScaler made without a device is a "cuda" one
        holder = ctx.parent(use)
        if isinstance(holder, cst.Decorator) and obj in ("custom_fwd", "custom_bwd"):
            continue
        if (
            isinstance(holder, cst.Call)
            and holder.func is use
            and not _fallback(ctx, holder)
            and not ctx.skipped(holder)
            and _rewrite_call(device, obj, "name", holder) is not None
        ):
            continue
        stuck.add(binding.statement)
    return stuck


def _fallback(ctx: ModuleContext, node: cst.CSTNode) -> bool:
    """Inside ``except``: a fallback for torch versions without the new form; keep it."""
    return any(isinstance(ancestor, cst.ExceptHandler) for ancestor in ctx.ancestors(node))


class _Finder:
    def __init__(self, ctx: ModuleContext) -> None:
        self.ctx = ctx
        self.stuck = _stuck_imports(ctx)

    def _stays(self, func: cst.BaseExpression) -> bool:
        """A short-form reference whose import stays: it keeps the old, device-less signature."""
        root = func.value if isinstance(func, cst.Attribute) else func
        if not isinstance(root, cst.Name):
            return False
        binding = self.ctx.resolve(root.value, root)
        return binding is not None and binding.statement in self.stuck

    def visit_Call(self, node: cst.Call) -> None:
        ctx = self.ctx
        target = _deprecated_target(ctx, node.func)
        if target is None or ctx.skipped(node) or _fallback(ctx, node):
            return
        if target[2] != "dotted" and self._stays(node.func):
            return
        device, obj, spelling = target
        if _rewrite_call(device, obj, spelling, node) is None:
            return

        def rewrite(updated: cst.CSTNode) -> cst.CSTNode:
            assert isinstance(updated, cst.Call)
            return _rewrite_call(device, obj, spelling, updated) or updated

        ctx.plan.replace[node] = rewrite
        if obj == "autocast" and _pins_dtype(node):
            ctx.plan.needs_torch_import = True  # the dtype is spelled torch.float16
        if spelling == "dotted":
            ctx.consumed.add(node.func)

    def visit_Decorator(self, node: cst.Decorator) -> None:
        ctx = self.ctx
        expression = node.decorator
        if isinstance(expression, cst.Call):
            return  # handled as a call
        target = _deprecated_target(ctx, expression)
        if target is None or target[1] not in ("custom_fwd", "custom_bwd") or ctx.skipped(node):
            return

        device, obj, spelling = target
        if spelling != "dotted" and self._stays(expression):
            return

        def decorate(updated: cst.CSTNode) -> cst.CSTNode:
            assert isinstance(updated, cst.Decorator)
            as_call = cst.Call(func=updated.decorator)
            return updated.with_changes(decorator=_rewrite_call(device, obj, spelling, as_call))

        ctx.plan.replace[node] = decorate

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        ctx = self.ctx
        module = dotted_name(node.module) if node.module is not None else None
        if isinstance(node.names, cst.ImportStar) or ctx.skipped(node):
            return
        names = [dotted_name(alias.name) for alias in node.names]
        if node in self.stuck:
            return
        if module in ("torch.cuda.amp", "torch.cpu.amp") and _movable(node):
            ctx.plan.replace[node] = lambda updated: updated.with_changes(module=syntax.dotted("torch.amp"))
        elif module in ("torch.cuda", "torch.cpu") and names == ["amp"]:
            ctx.plan.replace[node] = lambda updated: updated.with_changes(module=cst.Name("torch"))


def plan(ctx: ModuleContext) -> None:
    finder = _Finder(ctx)
    for call in ctx.nodes_of(cst.Call):
        finder.visit_Call(call)
    for decorator in ctx.nodes_of(cst.Decorator):
        finder.visit_Decorator(decorator)
    for statement in ctx.nodes_of(cst.ImportFrom):
        finder.visit_ImportFrom(statement)
    _plan_module_imports(ctx, finder.stuck)
