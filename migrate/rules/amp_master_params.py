"""amp_master_params: ``amp.master_params(optimizer)``.

What it rewrites
    Inside gradient clipping (``clip_grad_norm_``, ``clip_grad_value_`` or a function
    whose name says it measures a gradient norm), ``scaler.unscale_(optimizer)`` goes just
    before the clip and the clip takes that optimizer's parameters. Apex had already
    unscaled the gradients when ``scale_loss`` exited; GradScaler unscales only when told,
    so without ``unscale_`` the clip threshold would act on gradients ~65536 times too
    large. Everywhere else the call becomes an expression over ``optimizer.param_groups``.
    An ``if``/``else`` that clips ``amp.master_params(opt)`` on one side and the same
    clip of other parameters on the other collapses into ``unscale_`` + that clip:
    ``unscale_`` is a no-op while the scaler is disabled.

Before::

    import torch
    from apex import amp

    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    for images, target in loader:
        loss = criterion(model(images), target)
        optimizer.zero_grad()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), max_norm)
        optimizer.step()

After::

    import torch

    scaler = torch.amp.GradScaler("cuda")
    for images, target in loader:
        with torch.autocast("cuda", dtype=torch.float16):
            loss = criterion(model(images), target)
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_((p for group in optimizer.param_groups for p in group["params"]), max_norm)
        scaler.step(optimizer)
        scaler.update()

Not rewritten (reported instead)
    A clip where no GradScaler is reachable (AMP022, AMP023).

Safety
    Exact for O1. Under O2 the master params were fp32 copies; natively the optimizer
    holds the model's own fp32 parameters, which are what it steps.

References
    NVIDIA/apex@e13873d: apex/amp/_amp_state.py, docs/source/advanced.rst;
    pytorch/pytorch: docs/source/notes/amp_examples.rst (gradient clipping).
"""

from __future__ import annotations

from typing import cast

import libcst as cst

from migrate.rules import _syntax as syntax
from migrate.rules._amp import AmpCall, AmpModel, fp32_only, is_clip, optimizer_key
from migrate.rules._bindings import dotted_name
from migrate.rules._context import ModuleContext

RULE = "amp_master_params"


def _parameters_of(optimizer: cst.BaseExpression, as_list: bool = False) -> cst.BaseExpression:
    code = f'p for group in {syntax.code(optimizer)}.param_groups for p in group["params"]'
    return cst.parse_expression(f"[{code}]" if as_list else f"({code})")


def _collapsible_else(ctx: ModuleContext, statement: cst.CSTNode) -> cst.If | None:
    """The `if` around ``statement`` when its `else` is the same clip of other parameters."""
    block = ctx.parent(statement)
    owner = ctx.parent(block) if isinstance(block, cst.IndentedBlock) else None
    if not (isinstance(owner, cst.If) and owner.body is block and len(block.body) == 1):
        return None
    if not isinstance(owner.orelse, cst.Else) or isinstance(ctx.parent(owner), cst.If):
        return None
    other_body = owner.orelse.body
    if not (isinstance(other_body, cst.IndentedBlock) and len(other_body.body) == 1):
        return None
    other = other_body.body[0]
    mine = statement
    if not (isinstance(other, cst.SimpleStatementLine) and isinstance(mine, cst.SimpleStatementLine)):
        return None

    # the two statements must differ only in the clip's first argument
    def shape(line: cst.SimpleStatementLine) -> str | None:
        calls = [n for n in ctx.walk(line) if isinstance(n, cst.Call) and is_clip(n.func)]
        if len(calls) != 1 or not calls[0].args:
            return None
        blanked = line.deep_replace(calls[0].args[0].value, cst.Name("_"))
        return "".join(syntax.code(blanked.with_changes(leading_lines=())).split())

    if shape(mine) is None or shape(mine) != shape(other):
        return None
    return owner


# calls that only collect or inspect the parameters, never their gradients
_COLLECTING = frozenset({"list", "tuple", "set", "sorted", "len", "enumerate", "zip", "dict", "id", "print"})


def _next_step(ctx: ModuleContext, model: AmpModel, node: cst.CSTNode, key: str | None) -> cst.Call | None:
    """The first migrated ``step()`` after ``node`` in its function (of ``key``, if given)."""
    function = ctx.function_of(node)
    after = ctx.order(node) if isinstance(node, cst.Call) else -1
    candidates = [
        step
        for step, stepped in model.steps.items()
        if ctx.function_of(step) is function and ctx.order(step) > after and (key is None or stepped == key)
    ]
    if key is not None:
        # `scaler.step(optimizer)` already written (a file migrated earlier): the same answer
        candidates += [
            call
            for call in ctx.nodes_of(cst.Call)
            if isinstance(call.func, cst.Attribute)
            and call.func.attr.value == "step"
            and len(call.args) == 1
            and ctx.function_of(call) is function
            and ctx.order(call) > after
            and optimizer_key(ctx, call.args[0].value, call) == key
        ]
    return min(candidates, key=ctx.order, default=None)


def _conditional_step(ctx: ModuleContext, statement: cst.CSTNode, step: cst.Call) -> bool:
    """Whether ``step`` runs under an `if` that ``statement`` is not under (accumulation)."""
    around = set(map(id, ctx.ancestors(statement)))
    for ancestor in ctx.ancestors(step):
        if id(ancestor) in around:
            return False
        if isinstance(ancestor, cst.If):
            return True
    return False


def _inside_scale_loss(ctx: ModuleContext, model: AmpModel, statement: cst.CSTNode) -> bool:
    """Whether ``statement`` runs inside the body of a ``with amp.scale_loss(...)`` being migrated."""
    sites = set(map(id, model.sites))
    return any(
        isinstance(ancestor, cst.With) and any(id(item.item) in sites for item in ancestor.items)
        for ancestor in ctx.ancestors(statement)
    )


def _report_clip_inside_scale_loss(ctx: ModuleContext, node: cst.CSTNode) -> None:
    """Freeze the setup: a clip inside the ``scale_loss`` block saw gradients Apex had not unscaled yet.

    Apex unscales when the block exits, and before the backward it set aside the gradients
    accumulated so far (O1) or left the master gradients of the last step (O2): a clip inside
    the block acted on this backward's still-scaled gradients alone. ``unscale_`` before it
    would clip the true gradients instead (about 65536 times more weakly), and with
    accumulation GradScaler's gradients hold every micro-batch: no native spelling keeps it.
    """
    argument = ctx.parent(node)
    clip = node if isinstance(node, cst.Call) and is_clip(node.func) else argument and ctx.parent(argument)
    what = f"`{syntax.code(clip.func)}(...)`" if isinstance(clip, cst.Call) else "this clip"
    ctx.report(
        "AMP024",
        node,
        f"{what} runs inside `with amp.scale_loss(...)`, where Apex had not unscaled the gradients yet: it clipped "
        "this backward's still-scaled gradients (after setting aside those accumulated before it), so its "
        "threshold acted about `loss_scale` times more strongly than written; `scaler.unscale_(optimizer)` before it "
        "would clip the true gradients and train differently: left as it was. If clipping the true gradients is what "
        "was meant, move the clip after the `with` block (then run ampmigrate again)",
    )
    ctx.unfinished.append(node)  # the setup stays as it was (AMP025)


def _unscale_before(
    ctx: ModuleContext,
    model: AmpModel,
    node: cst.CSTNode,
    optimizer: cst.BaseExpression,
    unscaled: set[tuple[int, str]],
) -> bool:
    """Plan ``scaler.unscale_(optimizer)`` before ``node``'s statement; False if impossible."""
    statement = ctx.statement_of(node)
    if _inside_scale_loss(ctx, model, statement):
        _report_clip_inside_scale_loss(ctx, node)
        return False
    key = optimizer_key(ctx, optimizer, node)
    step = _next_step(ctx, model, node, key)
    if step is not None and _conditional_step(ctx, statement, step):
        return _clip_scaled_gradients(ctx, model, node)
    found = model.scaler_access_or_report(node)
    if found is None:
        return False
    _, access = found
    if (id(ctx.block_of(statement)), key) not in unscaled:
        unscaled.add((id(ctx.block_of(statement)), key))
        ctx.plan.before[statement].append(
            syntax.expression_statement(syntax.attribute_call(access, "unscale_", [cst.Arg(optimizer.deep_clone())]))
        )
    return True


# the threshold argument of each clip that can act on scaled gradients as Apex's acted on
# unscaled ones: norms and values scale linearly with the loss scale
_SCALABLE_CLIPS = {
    "clip_grad_norm_": ("parameters", "max_norm"),
    "clip_grad_value_": ("parameters", "clip_value"),
}


def _clip_scaled_gradients(ctx: ModuleContext, model: AmpModel, node: cst.CSTNode) -> bool:
    """A clip after every micro-batch of an accumulation loop, on still-scaled gradients.

    Apex unscaled the accumulated gradients after each backward, so the clip acted on the
    partial sums; GradScaler can unscale only once per step. Between two steps the scale is
    fixed, so clipping the scaled gradients at ``threshold * scaler.get_scale()`` scales the
    same gradients by the same factor (and the norm it returns is divided back). Other
    clips are reported (AMP024) and the setup left as it was.
    """
    argument = ctx.parent(node)
    clip = node if isinstance(node, cst.Call) and is_clip(node.func) else argument and ctx.parent(argument)
    name = dotted_name(clip.func) if isinstance(clip, cst.Call) else None
    parameters = _SCALABLE_CLIPS.get((name or "").split(".")[-1])
    bound = syntax.bind_arguments(clip, parameters, partial=True) if parameters and isinstance(clip, cst.Call) else {}
    threshold = bound.get(parameters[1]) if parameters else None
    if threshold is None or not isinstance(clip, cst.Call):
        if isinstance(clip, cst.Call) and parameters is None:
            # a clipper of the project's own (a GradientClipper.step): its threshold is out of reach
            ctx.report(
                "AMP024",
                node,
                f"`{syntax.code(clip.func)}(amp.master_params(...))` runs after every backward pass while the "
                "optimizer steps only on some (gradient accumulation): Apex gave it the unscaled gradients, GradScaler "
                "unscales once per step, and it is not torch's clip_grad_norm_/clip_grad_value_ (whose threshold "
                "times `scaler.get_scale()` clips the still-scaled gradients exactly): left as it was. For a clip, "
                "call `torch.nn.utils.clip_grad_norm_(params, max_norm)` there and run ampmigrate again; for a norm, "
                "divide what it computes on the scaled gradients by `scaler.get_scale()`; or move it under the step's "
                "condition after `scaler.unscale_(optimizer)` (once per step: a clip there changes training)",
            )
        else:
            ctx.report("AMP024", node)
        return False
    found = model.scaler_access_or_report(node)
    if found is None:
        return False
    scale = syntax.attribute_call(found.expression, "get_scale")
    value = threshold.value
    if isinstance(value, (cst.BinaryOperation, cst.BooleanOperation, cst.IfExp, cst.Lambda)):
        value = value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    scaled = cst.BinaryOperation(left=value, operator=cst.Multiply(), right=scale)
    ctx.plan.substitute(threshold.value, scaled)
    ctx.report("AMP027", clip)
    owner = ctx.parent(clip)
    if name and name.endswith("clip_grad_norm_") and not isinstance(owner, cst.Expr):
        # the norm it returns is of the scaled gradients: report Apex's
        divided = scale.deep_clone()

        def unscaled_norm(updated: cst.CSTNode, divided: cst.BaseExpression = divided) -> cst.CSTNode:
            assert isinstance(updated, cst.Call)
            return cst.BinaryOperation(left=updated, operator=cst.Divide(), right=divided)

        ctx.plan.replace[clip] = unscaled_norm
    return True


def _plan_one(ctx: ModuleContext, model: AmpModel, use: AmpCall, unscaled: set[tuple[int, str]]) -> None:
    call = use.call
    if ctx.skipped(call):
        return
    bound = syntax.bind_arguments(call, ("optimizer",))
    if bound is None or "optimizer" not in bound:
        ctx.report(
            "AMP032",
            call,
            "amp.master_params takes one optimizer: write "
            '`(p for group in optimizer.param_groups for p in group["params"])`',
        )
        return
    optimizer = syntax.strip_parens(bound["optimizer"].value)
    argument = ctx.parent(call)
    outer = ctx.parent(argument) if isinstance(argument, cst.Arg) else None
    outer_name = dotted_name(outer.func) if isinstance(outer, cst.Call) else None
    reads_gradients = isinstance(outer, cst.Call) and (
        is_clip(outer.func)
        or (
            outer_name not in _COLLECTING
            and _next_step(ctx, model, call, optimizer_key(ctx, optimizer, call)) is not None
        )
    )
    if reads_gradients:
        assert isinstance(outer, cst.Call)
        statement = ctx.statement_of(call)
        collapsible = _collapsible_else(ctx, statement) if is_clip(outer.func) else None
        if collapsible is not None:
            found = model.scaler_access_or_report(call)
            if found is None:
                return
            unscale = syntax.expression_statement(
                syntax.attribute_call(found.expression, "unscale_", [cst.Arg(optimizer.deep_clone())])
            )
            other = cast(
                cst.SimpleStatementLine, cast(cst.IndentedBlock, cast(cst.Else, collapsible.orelse).body).body[0]
            )
            ctx.plan.replace_statement[collapsible] = [unscale, other.with_changes(leading_lines=())]
            ctx.consumed.add(use.base)
            return
        if not _unscale_before(ctx, model, call, optimizer, unscaled):
            return
        replacement = _parameters_of(optimizer)
        if len(outer.args) == 1:
            replacement = replacement.with_changes(lpar=[], rpar=[])
        ctx.plan.substitute(call, replacement)
    elif outer_name == "list" and len(outer.args) == 1:  # type: ignore[union-attr]
        ctx.plan.substitute(outer, _parameters_of(optimizer, as_list=True))  # type: ignore[arg-type]
    else:
        replacement = _parameters_of(optimizer)
        if isinstance(outer, cst.Call) and len(outer.args) == 1:
            replacement = replacement.with_changes(lpar=[], rpar=[])
        ctx.plan.substitute(call, replacement)
    ctx.consumed.add(use.base)


def _plan_plain_clips(ctx: ModuleContext, model: AmpModel, unscaled: set[tuple[int, str]]) -> None:
    """Clips of ``model.parameters()`` after a scaled backward also need ``unscale_``.

    Apex had unscaled the gradients when ``scale_loss`` exited, so clipping the model's
    own parameters was fine; with GradScaler they are still scaled until ``unscale_``.
    """
    if not model.sites:
        return
    site_functions = {ctx.function_of(site) for site in model.sites}
    for clip in ctx.nodes_of(cst.Call):
        if not is_clip(clip.func) or any(
            isinstance(n, cst.Call) and (found := ctx.amp_api(n.func)) is not None and found[0] == "master_params"
            for n in ctx.walk(clip)
        ):
            continue
        function = ctx.function_of(clip)
        step = _next_step(ctx, model, clip, None)
        if step is None or fp32_only(ctx, clip, model.sites):
            continue
        backward_at = [
            ctx.order(call)
            for call in ctx.nodes_of(cst.Call)
            if ctx.function_of(call) is function
            and (
                call in model.sites
                or (
                    isinstance(call.func, cst.Name)
                    and any(f is not None and f.name.value == call.func.value for f in site_functions)
                )
            )
        ]
        if not backward_at or min(backward_at) > ctx.order(clip):
            continue
        optimizer = step.func.value  # type: ignore[attr-defined]
        _unscale_before(ctx, model, clip, optimizer, unscaled)


def plan(ctx: ModuleContext) -> None:
    model = ctx.amp
    unscaled: set[tuple[int, str]] = set()
    for use in model.of("master_params"):
        _plan_one(ctx, model, use, unscaled)
    _plan_plain_clips(ctx, model, unscaled)
