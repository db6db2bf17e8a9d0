"""amp_scale_loss: ``with amp.scale_loss(...) as scaled: scaled.backward()``.

What it rewrites
    The ``with`` block goes and every use of the scaled loss becomes
    ``scaler.scale(loss)``, keeping backward's arguments. The forward pass and loss
    computation feeding the loss move under ``torch.autocast`` (found by following the
    loss back to the model call, also across a ``backward(self, loss)`` helper and the
    ``g = functools.partial(helper, ...)`` that binds one). Each ``step()`` of an optimizer
    passed to ``scale_loss`` becomes ``scaler.step(opt)``, followed by one
    ``scaler.update()`` after the last step of the iteration, and one more after a step of
    an optimizer that steps again later in the iteration (GradScaler allows one step per
    optimizer between updates).
    ``delay_unscale`` (gradient accumulation), ``loss_id`` and ``model`` go: the steps the
    code already guards are the accumulation boundary, and one scaler serves all losses.
    A ``step()`` right after ``zero_grad()`` has no gradients to apply and stays as it was
    (``scaler.step`` needs a scaled loss in the same iteration).

Before::

    import torch
    from apex import amp

    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    for images, target in loader:
        output = model(images)
        loss = criterion(output, target)
        optimizer.zero_grad()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()

After::

    import torch

    scaler = torch.amp.GradScaler("cuda")
    for images, target in loader:
        with torch.autocast("cuda", dtype=torch.float16):
            output = model(images)
            loss = criterion(output, target)
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

Not rewritten (reported instead)
    ``scale_loss`` entered by hand or combined with other context managers (AMP021); a
    file without ``amp.initialize`` (AMP023); a scaler out of reach (AMP022); a plain
    ``x.backward()`` in the same step as the scaled one (AMP022: Apex added its gradients
    unscaled, GradScaler would divide them by the scale; FGM adversarial training). A forward
    pass that cannot be found (AMP020) leaves the whole amp setup as it was (AMP025): a
    GradScaler over a float32 forward pass would not train like Apex's float16 one.

Safety
    Apex updated the scale once per backward pass; GradScaler once per ``update()``, i.e.
    per iteration. With one backward per step they agree; with several (GANs, multiple
    losses) GradScaler's growth is slower and an overflow skips every optimizer's step.

References
    NVIDIA/apex@e13873d: apex/amp/handle.py; pytorch/pytorch: docs/source/notes/amp_examples.rst;
    ../shared/apex-semantics.md sections 1.2, 6, 8.6, 10.
"""

from __future__ import annotations

from collections import defaultdict

import libcst as cst

from migrate.project import carrier_condition
from migrate.rules import _syntax as syntax
from migrate.rules._amp import (
    AmpCall,
    AmpModel,
    Scaler,
    fp32_only,
    optimizer_key,
)
from migrate.rules._bindings import dotted_name
from migrate.rules._context import ModuleContext
from migrate.rules._forward import (
    autocast_over_forward,
    calls_a_model,
    forward_span,
    inner_loss_spans,
    parameter_callers,
)

RULE = "amp_scale_loss"

_PARAMETERS = ("loss", "optimizers", "loss_id", "model", "delay_unscale", "delay_overflow_check")


def _optimizer_keys(ctx: ModuleContext, expression: cst.BaseExpression, at: cst.CSTNode) -> set[str]:
    """Normalised optimizer expressions, with the method's own ``self`` spelled ``self``."""
    elements = (
        [element.value for element in expression.elements]
        if isinstance(expression, (cst.List, cst.Tuple))
        else [expression]
    )
    return {optimizer_key(ctx, element, at) for element in elements}


def _scaled_loss_names(ctx: ModuleContext, with_node: cst.With, name: str) -> list[cst.Name]:
    """Name nodes in the block that refer to the ``as`` target."""
    return [
        node
        for node in ctx.walk(with_node.body, into_definitions=False)
        if isinstance(node, cst.Name)
        and node.value == name
        and not (isinstance(ctx.parent(node), cst.Attribute) and ctx.parent(node).attr is node)  # type: ignore[union-attr]
    ]


def _named_outside(ctx: ModuleContext, with_node: cst.With, name: str) -> bool:
    """Whether the function around the block names the ``as`` target outside the block (and
    outside every other ``with ... as <same name>`` block, which binds its own)."""
    scope = ctx.function_of(with_node)
    nodes = list(ctx.walk(scope.body if scope is not None else ctx.module, into_definitions=False))
    inside: set[int] = set()
    for node in nodes:
        if isinstance(node, cst.With) and any(
            item.asname is not None and isinstance(item.asname.name, cst.Name) and item.asname.name.value == name
            for item in node.items
        ):
            inside.update(id(child) for child in ctx.walk(node))
    for node in nodes:
        if isinstance(node, cst.Name) and node.value == name and id(node) not in inside:
            parent = ctx.parent(node)
            if not (isinstance(parent, cst.Attribute) and parent.attr is node):
                return True
    return False


def _plan_autocast(
    ctx: ModuleContext,
    model: AmpModel,
    scaler: Scaler,
    access: cst.BaseExpression,
    anchor: cst.CSTNode,
    loss: cst.BaseExpression,
    report_at: cst.CSTNode,
) -> bool:
    """Plan autocast over the forward pass feeding ``loss``; False (with AMP020) where it
    cannot be found: a GradScaler over a float32 forward pass trains unlike Apex."""
    span = forward_span(ctx, anchor, loss, scaler.model_names)
    callers = _parameter_callers(ctx, model, anchor, loss)
    if span is not None and callers and not calls_a_model(ctx, *span, scaler.model_names):
        # `def optimize(self, loss)` only averages or divides the loss it is given: the forward
        # pass that computed it is in the callers, and Apex O1 ran it in float16
        span = None
    spans = [(*span, access)] if span is not None else []
    if span is not None:
        # the loss computed in the branch that scales it (after the forward pass, before that branch's
        # scale_loss) runs under autocast too
        spans += [(*inner, access) for inner in inner_loss_spans(ctx, anchor, loss, span[0])]
    if span is None and _widen_autocast(ctx, model, scaler, access, anchor, loss):
        return True
    if span is None:
        # the loss may be a parameter: `def backward(self, loss)` called as `self.backward(loss)`
        # from several training steps; each caller's forward pass needs autocast
        function = ctx.function_of(anchor)
        if function is not None:
            for caller, argument in callers:
                found = forward_span(ctx, ctx.statement_of(caller), argument, scaler.model_names)
                if found is None:
                    ctx.report("AMP020", caller)
                    return False
                # the caller reaches the scaler its own way (`self.scaler` where the callee has `scaler`)
                caller_access = _caller_access(ctx, model, scaler, access, function, caller)
                if caller_access is None:
                    ctx.report("AMP022", caller)
                    return False
                spans.append((*found, caller_access))
    if not spans:
        if scaler.autocast_enabled != "off":
            ctx.report("AMP020", report_at)
            return False
        return True
    return all(_wrap(ctx, model, scaler, reach, first, last, report_at) for first, last, reach in spans)


def _parameter_callers(
    ctx: ModuleContext, model: AmpModel, anchor: cst.CSTNode, loss: cst.BaseExpression
) -> list[tuple[cst.Call, cst.BaseExpression]]:
    """Where ``loss`` comes from a parameter of the function around ``anchor``: the calls of that
    function in this file, each with the argument it gives for the parameter."""
    function = ctx.function_of(anchor)
    root = loss
    while isinstance(root, (cst.Attribute, cst.Subscript, cst.Call)):
        root = root.value if not isinstance(root, cst.Call) else root.func
    if function is None or not isinstance(root, cst.Name):
        return []
    return parameter_callers(ctx, function, root.value, model.calls_by_function_name, model.partials_by_function_name)


def _caller_access(
    ctx: ModuleContext,
    model: AmpModel,
    scaler: Scaler,
    access: cst.BaseExpression,
    callee: cst.FunctionDef,
    call: cst.Call,
) -> cst.BaseExpression | None:
    """How a caller of the function that scales the loss reaches the scaler: its own way
    (``self.scaler`` where the callee received ``scaler``), or, for ``self.optimize(loss)``
    from a subclass's method, the attribute the callee reads, on the caller's ``self``."""
    found = model.access_in(scaler, call)
    if found is not None:
        return found
    caller = ctx.function_of(call)
    owner = ctx.self_name(caller) if caller is not None else None
    if (
        owner is not None
        and isinstance(call.func, cst.Attribute)
        and isinstance(call.func.value, cst.Name)
        and call.func.value.value == owner
        and ctx.class_of_method(callee) is not None
        and isinstance(access, cst.Attribute)
        and isinstance(access.value, cst.Name)
        and access.value.value == ctx.self_name(callee)
    ):
        return access.with_changes(value=cst.Name(owner))
    return None


# (parameters in order, default device) of the autocast spellings whose region can be widened
_CUDA_AUTOCAST = (("enabled", "dtype", "cache_enabled"), "cuda")
_AUTOCAST = (("device_type", "dtype", "enabled", "cache_enabled"), None)
_AUTOCAST_SIGNATURES = {
    "torch.cuda.amp.autocast": _CUDA_AUTOCAST,
    "torch.autocast": _AUTOCAST,
    "torch.amp.autocast": _AUTOCAST,
}
_DTYPES = {"float16": ("torch.float16", "torch.half"), "bfloat16": ("torch.bfloat16",)}


def _widen_autocast(
    ctx: ModuleContext,
    model: AmpModel,
    scaler: Scaler,
    access: cst.BaseExpression,
    anchor: cst.CSTNode,
    loss: cst.BaseExpression,
) -> bool:
    """The forward pass already runs in another path's autocast region
    (``with autocast(enabled=args.amp == "native"):``): widen its switch to
    ``enabled=<switch> or <the scaler's>``, as Apex cast that forward pass whenever amp was
    on. Only for a region of the same device and dtype as ours; True when planned."""
    region = autocast_over_forward(ctx, anchor, loss, scaler.model_names)
    if region is None:
        return False
    call = region.items[0].item
    if not isinstance(call, cst.Call):
        return False
    name = dotted_name(call.func)
    binding = ctx.resolve(name, call) if name is not None and "." not in name else None
    if binding is not None and binding.kind == "torch_amp" and binding.target == "cuda.autocast":
        name = "torch.cuda.amp.autocast"
    signature = _AUTOCAST_SIGNATURES.get(name or "")
    if signature is None:
        return False
    parameters, default_device = signature
    bound = syntax.bind_arguments(call, parameters)
    if bound is None:
        return False
    device = syntax.literal(bound["device_type"].value) if "device_type" in bound else default_device
    dtype = dotted_name(bound["dtype"].value) if "dtype" in bound else None
    if device != ctx.options.device or device != "cuda":
        return False  # float16 is the default dtype of "cuda" only
    if dtype not in (None, *_DTYPES.get(ctx.options.dtype, ())) or (dtype is None and ctx.options.dtype != "float16"):
        return False
    switch = bound["enabled"].value if "enabled" in bound else None
    if switch is None or syntax.literal(switch) is True:
        return True  # always on: the forward pass already runs under autocast
    if syntax.literal(switch) is not ...:
        return False  # a region turned off on purpose
    item = model.autocast_item(scaler, access, region)
    if item is None or not isinstance(item.item, cst.Call):
        return False
    ours = next((arg.value for arg in item.item.args if arg.keyword and arg.keyword.value == "enabled"), None)
    if ours is None:
        ours = cst.Name("True")  # amp is on wherever this runs: Apex cast the forward pass always
    elif isinstance(ours, (cst.IfExp, cst.Lambda, cst.NamedExpr)):
        ours = ours.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])

    def widen(updated: cst.CSTNode) -> cst.CSTNode:
        assert isinstance(updated, cst.BaseExpression)
        left = updated
        if isinstance(left, (cst.IfExp, cst.Lambda, cst.NamedExpr)) and not left.lpar:
            left = left.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        return cst.BooleanOperation(left, cst.Or(), ours.deep_clone())

    ctx.plan.replace[switch] = widen
    return True


def _wrap(
    ctx: ModuleContext,
    model: AmpModel,
    scaler: Scaler,
    access: cst.BaseExpression,
    first: cst.CSTNode,
    last: cst.CSTNode,
    report_at: cst.CSTNode,
) -> bool:
    """Plan ``with torch.autocast(...)`` over first..last, merged with overlapping spans;
    False (with AMP022) where the autocast switch cannot be reached."""
    block: list[cst.CSTNode] = list(ctx.block_of(first).body)
    # merge with a span already planned in the same block when they overlap
    for other_first, (other_last, _) in list(ctx.plan.wrap.items()):
        if ctx.block_of(other_first) is not ctx.block_of(first):
            continue
        a, b = block.index(first), block.index(last)
        c, d = block.index(other_first), block.index(other_last)
        if a <= d and c <= b:
            kept = ctx.plan.wrap.pop(other_first)[1]
            ctx.plan.wrap[block[min(a, c)]] = (block[max(b, d)], kept)
            return True
    switched = _switchable_region_inside(ctx, block[block.index(first) : block.index(last) + 1])
    if switched is not None:
        ctx.report(
            "AMP022",
            report_at,
            f"the forward pass runs in `with {switched}:`, an autocast region bound elsewhere with an `enabled` "
            "switch of its own: where that switch is off (the Apex path), it would turn off the torch.autocast "
            "put around it, and the forward pass would run in float32 where Apex ran it in float16; the amp setup "
            f"stays as it was: write that autocast at the `with` itself, in place of `with {switched}:` "
            '(`with torch.autocast("cuda", enabled=<its switch>):`, whose switch ampmigrate widens), or make it '
            "`contextlib.nullcontext()` on the Apex path, then run ampmigrate again",
        )
        return False
    item = model.autocast_item(scaler, access, first)
    if item is None:
        if scaler.autocast_enabled != "off":
            ctx.report(
                "AMP022",
                report_at,
                "autocast's `enabled` flag is not reachable here, so the amp setup stays as it was: pass the "
                "GradScaler (or the flag) to this function, then run ampmigrate again",
            )
            return False
        return True
    ctx.plan.wrap[first] = (last, item)
    return True


def _switchable_region_inside(ctx: ModuleContext, statements: list[cst.CSTNode]) -> str | None:
    """The context expression of a ``with`` among ``statements`` that is an autocast bound elsewhere
    with an ``enabled`` switch (``ctx = torch.cuda.amp.autocast(enabled=native)``; ``with ctx:``).

    Such a region, when its switch is off, turns off any autocast around it: wrapping it would
    leave the Apex path's forward pass in float32. A region written at the ``with`` itself is
    widened instead (see _widen_autocast)."""
    opaque = [
        (item.item, bound)
        for statement in statements
        for node in ctx.walk(statement, into_definitions=False)
        if isinstance(node, cst.With)
        for item in node.items
        # `with ctx:` / `with make_ctx():`: the name of the context, or of its factory
        for bound in [item.item.func if isinstance(item.item, cst.Call) else item.item]
        if isinstance(bound, (cst.Name, cst.Attribute)) and not (dotted_name(bound) or "").startswith("torch.")
    ]
    if not opaque:
        return None
    assigns = [node for node in ctx.walk(ctx.module) if isinstance(node, cst.Assign)]
    for expression, bound in opaque:
        if _bound_to_switched_autocast(ctx, assigns, syntax.code(bound)):
            return syntax.code(expression)
    return None


def _bound_to_switched_autocast(ctx: ModuleContext, assigns: list[cst.Assign], target: str) -> bool:
    """Whether one of ``assigns`` gives ``target`` a value that makes an autocast with an ``enabled``
    argument other than a literal True (directly, or through ``functools.partial``)."""
    for assign in assigns:
        if not any(syntax.code(t.target) == target for t in assign.targets):
            continue
        for call in ctx.walk(assign.value, into_definitions=False):
            if not isinstance(call, cst.Call):
                continue
            names = [dotted_name(call.func)] + [dotted_name(arg.value) for arg in call.args if not arg.keyword]
            if not any(name is not None and name.rsplit(".", 1)[-1] == "autocast" for name in names):
                continue
            switch = next((arg.value for arg in call.args if arg.keyword and arg.keyword.value == "enabled"), None)
            if switch is None and dotted_name(call.func) in ("torch.cuda.amp.autocast", "autocast"):
                # torch.cuda.amp.autocast(enabled) takes the switch first
                switch = next((arg.value for arg in call.args if not arg.keyword), None)
            if switch is not None and syntax.literal(switch) is not True:
                return True
    return False


def _fp32_branch(
    ctx: ModuleContext, with_node: cst.With, asname: str, loss: cst.BaseExpression
) -> tuple[cst.If, cst.SimpleStatementLine] | None:
    """The `if`/`else` around ``with_node`` whose else is the same backward, unscaled."""
    block = ctx.parent(with_node)
    branch = ctx.parent(block) if isinstance(block, cst.IndentedBlock) else None
    if not (isinstance(branch, cst.If) and branch.body is block and len(block.body) == 1):
        return None
    if isinstance(ctx.parent(branch), cst.If) or not isinstance(branch.orelse, cst.Else):
        return None
    body = with_node.body.body if isinstance(with_node.body, cst.IndentedBlock) else ()
    other = branch.orelse.body.body if isinstance(branch.orelse.body, cst.IndentedBlock) else ()
    if len(body) != 1 or len(other) != 1:
        return None
    scaled_line, fp32_line = body[0], other[0]
    if not (isinstance(scaled_line, cst.SimpleStatementLine) and isinstance(fp32_line, cst.SimpleStatementLine)):
        return None
    code = syntax.code
    scaled_code = "".join(code(scaled_line.with_changes(leading_lines=())).split())
    fp32_code = "".join(code(fp32_line.with_changes(leading_lines=())).split())
    loss_code = syntax.normalized(loss)
    if not scaled_code.startswith(f"{asname}.backward(") or "#" in scaled_code:
        return None
    if (
        fp32_code != loss_code + scaled_code[len(asname) :]
        and fp32_code.split("#")[0] != loss_code + scaled_code[len(asname) :]
    ):
        return None
    return branch, fp32_line


def _collapse_fp32_branch(
    ctx: ModuleContext, with_node: cst.With, asname: str, loss: cst.BaseExpression, access: cst.BaseExpression
) -> None:
    """``if fp16: <scaled backward> else: loss.backward()`` becomes one line: a disabled
    GradScaler's scale() is the identity, so it serves both paths."""
    collapsible = _fp32_branch(ctx, with_node, asname, loss)
    if collapsible is None:
        return
    branch, fp32_line = collapsible
    backward = fp32_line.body[0].value  # type: ignore[attr-defined]
    scaled = backward.with_changes(
        func=backward.func.with_changes(
            value=syntax.attribute_call(access.deep_clone(), "scale", [cst.Arg(loss.deep_clone())])
        )
    )
    merged = fp32_line.with_changes(body=[fp32_line.body[0].with_changes(value=scaled)], leading_lines=())
    ctx.plan.replace_statement[branch] = [merged]
    # `if amp and ...:` goes with the branch: its check of the amp module no longer stays
    in_test = {id(branch.test), *(id(node) for node in ctx.walk(branch.test))}
    ctx.consumed.update(name for name in ctx.amp.value_uses if id(name) in in_test)


def _unscaled_sibling_branch(ctx: ModuleContext, with_node: cst.With) -> cst.If | None:
    """The ``if`` holding ``with_node`` in its body whose ``else`` runs a backward pass of its own."""
    child: cst.CSTNode = with_node
    for ancestor in ctx.ancestors(with_node):
        if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef, cst.For, cst.While)):
            return None
        if isinstance(ancestor, cst.If) and child is ancestor.body and ancestor.orelse is not None:
            if _calls_backward(ctx, ancestor.orelse):
                return ancestor
        child = ancestor
    return None


def _if_arms(ctx: ModuleContext, node: cst.CSTNode, stop: cst.CSTNode | None) -> list[tuple[object, bool]]:
    """The ``if``s around ``node`` below ``stop``, each as the ``if`` itself and as its test
    (``not x`` spelled as ``x`` with the other arm), with True for its body."""
    arms: list[tuple[object, bool]] = []
    child: cst.CSTNode = node
    for ancestor in ctx.ancestors(node):
        if ancestor is stop:
            break
        if isinstance(ancestor, cst.If):
            arm = child is ancestor.body
            arms.append((id(ancestor), arm))
            test, positive = ancestor.test, arm
            while isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
                test, positive = test.expression, not positive
            arms.append((syntax.normalized(test), positive))
        child = ancestor
    return arms


def _plain_backward_in_step(
    ctx: ModuleContext, model: AmpModel, with_node: cst.With, call: cst.Call, keys: set[str]
) -> tuple[cst.Call, bool] | None:
    """A plain ``x.backward()`` that may run in the same step as this scaled backward (the same
    iteration of its loop, or the same call of its function), and whether it runs after it.

    Apex's block ended with the gradients unscaled, and its next block stashed the gradients
    already there and added them back unscaled: every other backward pass added its gradients
    unscaled to unscaled ones. GradScaler unscales once, at the step: a plain backward pass
    beside ``scaler.scale(loss).backward()`` would have its gradients divided by the scale.
    ``x.backward(<argument>)`` (a helper of that name, or an explicit gradient) is not counted."""
    function = ctx.function_of(with_node)
    scope: cst.CSTNode | None = _innermost_loop(ctx, with_node)
    inside: set[int] = set()
    for use in model.of("scale_loss"):  # scaled backward passes, this one's and the others'
        block = ctx.parent(ctx.parent(use.call) or use.call)
        if isinstance(ctx.parent(use.call), cst.WithItem) and isinstance(block, cst.With):
            inside.update(id(node) for node in ctx.walk(block))
    site_arms = _if_arms(ctx, with_node, scope)
    calls = [
        node
        for node in ctx.walk(scope if scope is not None else ctx.module, into_definitions=False)
        if isinstance(node, cst.Call) and id(node) not in inside and ctx.function_of(node) is function
    ]
    calls.sort(key=ctx.order)

    def together(node: cst.CSTNode) -> bool:
        arms = dict(_if_arms(ctx, node, scope))
        return all(arms.get(key, arm) == arm for key, arm in site_arms)

    def method(node: cst.Call) -> str | None:
        return node.func.attr.value if isinstance(node.func, cst.Attribute) else None

    for index, node in enumerate(calls):
        if method(node) != "backward" or any(not arg.keyword for arg in node.args) or not together(node):
            continue
        receiver = node.func.value  # type: ignore[attr-defined]
        if isinstance(receiver, cst.Call) and method(receiver) == "scale":
            continue  # already native: scaler.scale(x).backward()
        if ctx.order(node) < ctx.order(call):
            # gradients cleared between this backward pass and the scaled one do not reach its step
            if not any(method(later) == "zero_grad" and ctx.order(later) < ctx.order(call) for later in calls[index:]):
                return node, False
            continue
        stepped = any(
            method(earlier) == "step"
            and ctx.order(call) < ctx.order(earlier)
            and optimizer_key(ctx, earlier.func.value, earlier) in keys  # type: ignore[attr-defined]
            for earlier in calls[:index]
        )
        if not stepped:
            return node, True
    return None


def _report_plain_backward(ctx: ModuleContext, call: cst.Call, backward: cst.Call, after: bool) -> None:
    """AMP022 for a plain backward pass in the step of a scaled one: the setup stays as it was."""
    receiver = ctx.code(syntax.strip_parens(backward.func.value))  # type: ignore[attr-defined]
    line = ctx.position(call)[0]
    if after:
        where = (
            f"after the scale_loss block at line {line}, before the optimizer steps: Apex had unscaled the "
            "gradients when that block ended and added these to them unscaled (and O1 kept the float16 weight "
            "copies cast for a forward pass run there until the next scale_loss block ended, so the next "
            "iteration's forward pass used the weights from before the step)"
        )
    else:
        where = (
            f"before the scale_loss block at line {line}, in the same step: Apex kept these gradients unscaled "
            "and added the unscaled new ones to them"
        )
    ctx.report(
        "AMP022",
        backward,
        f"`{ctx.code(backward)}` backpropagates without amp.scale_loss {where}; GradScaler unscales every "
        "gradient once, at the step, so it would divide these by the loss scale (2**16 at first). The amp setup "
        "stays as it was; to migrate by hand, scale this backward pass too "
        f"(`scaler.scale({receiver}).backward()`, its forward pass under the same torch.autocast)",
    )


def _calls_backward(ctx: ModuleContext, node: cst.CSTNode) -> bool:
    """Whether ``node`` runs a backward pass outside an ``amp.scale_loss`` block (one inside is
    scaled: an `else` that scales its own loss is no unscaled path)."""
    if isinstance(node, cst.With) and any(
        isinstance(item.item, cst.Call)
        and (found := ctx.amp_api(item.item.func)) is not None
        and found[0] == "scale_loss"
        for item in node.items
    ):
        return False
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "backward":
        return True
    return any(_calls_backward(ctx, child) for child in node.children)


def _calls_unscaled_backward(ctx: ModuleContext, node: cst.CSTNode) -> bool:
    """``_calls_backward``, leaving out a backward of what a GradScaler scaled
    (``self.scaler.scale(loss).backward()``: a native path with a scaler and steps of its own)."""
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "backward":
        receiver = node.func.value
        if (
            isinstance(receiver, cst.Call)
            and isinstance(receiver.func, cst.Attribute)
            and receiver.func.attr.value == "scale"
        ):
            return False
    if isinstance(node, cst.With) or (
        isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "backward"
    ):
        return _calls_backward(ctx, node)
    return any(_calls_unscaled_backward(ctx, child) for child in node.children)


def _always_on(scaler: Scaler) -> bool:
    """Whether the scaler is on in every path: an ``amp.initialize`` of this module that no
    condition guards (no ``enabled=``, no ``if``, a fixed opt level other than O0)."""
    return scaler.initialize is not None and scaler.enabled is None and not scaler.may_be_disabled


def _test_parts(expression: cst.BaseExpression) -> list[cst.BaseExpression]:
    """``a and bool(b) and (c)`` as [a, b, c]: the parts each of which holds where the whole does."""
    expression = syntax.strip_parens(expression)
    if isinstance(expression, cst.BooleanOperation) and isinstance(expression.operator, cst.And):
        return _test_parts(expression.left) + _test_parts(expression.right)
    if (
        isinstance(expression, cst.Call)
        and isinstance(expression.func, cst.Name)
        and expression.func.value == "bool"
        and len(expression.args) == 1
        and expression.args[0].keyword is None
        and not expression.args[0].star
    ):
        return _test_parts(expression.args[0].value)
    return [expression]


def _on_only_where(ctx: ModuleContext, scaler: Scaler, test: cst.BaseExpression) -> bool:
    """Whether the scaler is off wherever ``test`` is false, so that the unscaled ``else`` of
    ``if test:`` runs with a disabled scaler: each part of ``test`` is a part of the scaler's
    ``enabled=`` or of an ``if`` around amp.initialize (read through ``self.x = x``, a local
    ``x = ...`` or a parameter every caller passes the same), or tests for something only Apex's
    setup sets (the amp module, an amp handle)."""
    enabled = scaler.enabled
    if scaler.initialize is None or enabled is None:
        return True  # always on: `_always_on`; received from elsewhere: its own module checks
    if isinstance(enabled, cst.Name) and enabled.value == "False":
        return True
    conditions = [enabled]
    child: cst.CSTNode = scaler.initialize
    for ancestor in ctx.ancestors(scaler.initialize):
        if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef, cst.Module)):
            break
        if isinstance(ancestor, cst.If) and child is ancestor.body:
            conditions.append(ancestor.test)
        child = ancestor
    on: set[str] = set()
    for condition in conditions:
        for part in _test_parts(condition):
            on.add(syntax.normalized(part))
            on.update(_spelled_as(ctx, part, scaler.initialize))

    def holds(spelled: str) -> bool:
        # `x is not None` holds wherever `x` is true
        return spelled in on or (spelled.endswith("isnotNone") and spelled[: -len("isnotNone")] in on)

    for part in _test_parts(test):
        if holds(syntax.normalized(part)) or _tests_amp_presence(ctx, part, test):
            continue
        spelled = _spelled_as(ctx, part, test)
        if not spelled or not all(holds(each) for each in spelled):
            return False
    return True


def _stored_on_self(ctx: ModuleContext, klass: cst.ClassDef) -> dict[str, list[cst.BaseExpression]]:
    """The values each ``self.x = ...`` of the class assigns, by attribute."""
    stored: dict[str, list[cst.BaseExpression]] = defaultdict(list)
    for node in ctx.walk(klass):
        if isinstance(node, cst.Assign):
            for target in node.targets:
                if isinstance(target.target, cst.Attribute) and _is_self(target.target.value):
                    stored[target.target.attr.value].append(node.value)
        elif isinstance(node, (cst.AugAssign, cst.AnnAssign)):
            if isinstance(node.target, cst.Attribute) and _is_self(node.target.value):
                stored[node.target.attr.value].append(node.value or cst.Name("None"))
    return stored


def _is_self(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Name) and node.value == "self"


def _spelled_as(ctx: ModuleContext, part: cst.BaseExpression, at: cst.CSTNode, depth: int = 0) -> set[str]:
    """The parts ``part`` stands for where its names are read through what set them: ``self.fp16``
    as ``fp16`` where the class sets ``self.fp16 = fp16`` once, a local assigned once as its value
    (``with_apex`` as the parts of ``args.fp16 and args.amp == "apex"``), a parameter as what every
    caller passes (empty: nothing to read through)."""
    if depth > 3:
        return set()
    part = syntax.strip_parens(part)
    if isinstance(part, cst.Name):
        value = _name_value(ctx, part, at)
        if value is None:
            return set()
        return {spelled for sub in _test_parts(value) for spelled in _spelled_or_self(ctx, sub, value, depth)}
    klass = next((node for node in ctx.ancestors(at) if isinstance(node, cst.ClassDef)), None)
    stored = _stored_on_self(ctx, klass) if klass is not None else {}
    if isinstance(part, cst.Attribute) and _is_self(part.value) and len(stored.get(part.attr.value, [])) == 1:
        value = stored[part.attr.value][0]  # `self._use_apex = apex_opt_level is not None`
        return {spelled for sub in _test_parts(value) for spelled in _spelled_or_self(ctx, sub, value, depth)}
    replaced: dict[int, cst.BaseExpression] = {}
    for node in ctx.walk(part):
        parent = ctx.parent(node)
        if isinstance(node, cst.Attribute) and _is_self(node.value):
            values = stored.get(node.attr.value, [])
            if len(values) == 1 and dotted_name(values[0]) is not None:
                replaced[id(node)] = values[0]
        elif (
            isinstance(node, cst.Name)
            and not (isinstance(parent, cst.Attribute) and parent.attr is node)
            and not (isinstance(parent, cst.Arg) and parent.keyword is node)
        ):
            value = _name_value(ctx, node, at)
            if value is not None and dotted_name(value) is not None:
                replaced[id(node)] = value
    if not replaced:
        return set()
    originals = {id(node): node for node in ctx.walk(part)}

    class Through(cst.CSTTransformer):
        def on_leave(self, original: cst.CSTNode, updated: cst.CSTNode) -> cst.CSTNode:  # type: ignore[override]
            if id(original) in replaced and originals.get(id(original)) is original:
                return replaced[id(original)]
            return updated

    return {syntax.normalized(part.visit(Through()))}  # type: ignore[arg-type]


def _name_value(ctx: ModuleContext, name: cst.Name, at: cst.CSTNode) -> cst.BaseExpression | None:
    """What a local name assigned once in the function holds, or what every caller of a
    module-level function passes for a parameter of that name."""
    function = ctx.function_of(at)
    if function is None:
        return None
    parameters = [param.name.value for param in (*function.params.posonly_params, *function.params.params)]
    values = [
        node.value
        for node in ctx.walk(function)
        if isinstance(node, (cst.Assign, cst.AugAssign, cst.AnnAssign))
        and any(
            isinstance(target, cst.Name) and target.value == name.value
            for target in (
                [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]  # type: ignore[union-attr]
            )
        )
    ]
    if name.value not in parameters:
        return values[0] if len(values) == 1 and isinstance(values[0], cst.BaseExpression) else None
    if values or ctx.parent(function) is not ctx.module:
        return None
    return _passed_by_every_caller(ctx, function, parameters.index(name.value), name.value)


def _spelled_or_self(ctx: ModuleContext, part: cst.BaseExpression, at: cst.CSTNode, depth: int) -> set[str]:
    return {syntax.normalized(part)} | _spelled_as(ctx, part, at, depth + 1)


def _passed_by_every_caller(
    ctx: ModuleContext, function: cst.FunctionDef, index: int, name: str
) -> cst.BaseExpression | None:
    """What every call of the module-level ``function`` passes for its parameter ``name`` (at
    ``index``), when all pass the same and there is at least one call."""
    passed: list[cst.BaseExpression] = []
    calls = ctx.amp.calls_by_function_name.get(function.name.value, [])
    for seen in ctx.nodes_of(cst.Name):
        # also used as a value (a callback, `pool.map(train, ...)`): callers out of sight
        if (
            seen.value == function.name.value
            and seen is not function.name
            and not any(call.func is seen for call in calls)
        ):
            return None
    for call in calls:
        keyword = next((arg for arg in call.args if arg.keyword is not None and arg.keyword.value == name), None)
        positional = [arg for arg in call.args if arg.keyword is None]
        if any(arg.star for arg in call.args):
            return None
        if keyword is not None:
            passed.append(keyword.value)
        elif index < len(positional):
            passed.append(positional[index].value)
        else:
            return None
    if not passed or len({syntax.normalized(value) for value in passed}) != 1:
        return None
    return passed[0]


def _tests_amp_presence(ctx: ModuleContext, part: cst.BaseExpression, at: cst.CSTNode) -> bool:
    """``amp``, ``amp is not None``, ``self.amp``, ``amp_handle``: true only where Apex's setup
    ran, the amp module or what an amp call returned being all that is ever stored there
    besides None."""
    subject = syntax.strip_parens(part)
    if (
        isinstance(subject, cst.Comparison)
        and len(subject.comparisons) == 1
        and isinstance(subject.comparisons[0].operator, cst.IsNot)
        and isinstance(subject.comparisons[0].comparator, cst.Name)
        and subject.comparisons[0].comparator.value == "None"
    ):
        subject = syntax.strip_parens(subject.left)
    amp_names = {id(name) for name in ctx.amp.value_uses}
    if isinstance(subject, cst.Name) and id(subject) in amp_names:
        return True

    def from_amp(value: cst.BaseExpression) -> bool:
        if isinstance(value, cst.Name) and value.value == "None":
            return True
        if isinstance(value, cst.Name) and id(value) in amp_names:
            return True
        return isinstance(value, cst.Call) and (
            any(use.call is value for use in ctx.amp.calls)
            or any(handle.call is value for handle in ctx.handles.handles)
        )

    klass = next((node for node in ctx.ancestors(at) if isinstance(node, cst.ClassDef)), None)
    if isinstance(subject, cst.Attribute) and _is_self(subject.value) and klass is not None:
        values = _stored_on_self(ctx, klass).get(subject.attr.value, [])
    elif isinstance(subject, cst.Name):
        scope = ctx.function_of(at) or ctx.module
        values = [
            node.value
            for node in ctx.walk(scope)
            if isinstance(node, cst.Assign)
            and any(isinstance(t.target, cst.Name) and t.target.value == subject.value for t in node.targets)
        ]
    else:
        return False
    return any(not (isinstance(v, cst.Name) and v.value == "None") for v in values) and all(from_amp(v) for v in values)


def _managed_optimizers(
    ctx: ModuleContext, model: AmpModel, call: cst.Call, optimizers: cst.BaseExpression
) -> set[str]:
    """Keys of the optimizers whose steps this scale_loss governs."""
    keys = _optimizer_keys(ctx, optimizers, call)
    function = ctx.function_of(call)
    if function is not None and isinstance(optimizers, cst.Name):
        # `def backward(loss, optimizer)`: the steps are of what the callers pass
        for caller, argument in parameter_callers(
            ctx, function, optimizers.value, model.calls_by_function_name, model.partials_by_function_name
        ):
            keys |= _optimizer_keys(ctx, argument, caller)
    return keys


def _plan_one(
    ctx: ModuleContext, model: AmpModel, use: AmpCall, managed: dict[int, set[str]], sites: dict[int, list[cst.CSTNode]]
) -> None:
    call = use.call
    if ctx.skipped(call) or use.base in ctx.consumed:
        return  # left as the user asked, or folded away by an earlier rule (hf_trainer_apex_backend)
    item = ctx.parent(call)
    with_node = ctx.parent(item) if isinstance(item, cst.WithItem) else None
    if (
        not isinstance(with_node, cst.With)
        or len(with_node.items) != 1
        or with_node.items[0].asname is None
        or not isinstance(with_node.items[0].asname.name, cst.Name)
        or with_node.asynchronous is not None
    ):
        ctx.report("AMP021", call)
        return
    arguments = syntax.bind_arguments(call, _PARAMETERS, partial=True)
    loss_arg = arguments.get("loss")
    optimizers: cst.BaseExpression | None = arguments["optimizers"].value if "optimizers" in arguments else None
    if optimizers is None and ctx.handles.any:
        # the old API: `handle.scale_loss(loss, optimizer=...)`, or `wrapper.scale_loss(loss)`
        # where the wrapper steps like the optimizer it wraps
        keyword = next((arg for arg in call.args if arg.keyword and arg.keyword.value == "optimizer"), None)
        optimizers = keyword.value if keyword is not None else ctx.handles.wrapped_optimizer(call)
    if loss_arg is None or optimizers is None:
        ctx.report("AMP021", call)
        return
    found = model.scaler_access_or_report(call)
    if found is None:
        return
    scaler, access = found
    if scaler.carried and not _carrier_guard(ctx, scaler, with_node, call):
        return
    branch = _unscaled_sibling_branch(ctx, with_node)
    if branch is not None and _always_on(scaler):
        ctx.report(
            "AMP022",
            call,
            f"the `else` of `if {syntax.code(branch.test)}:` backpropagates an unscaled loss while the optimizer "
            "still steps through the scaler, which is on in that path too as far as the tool sees (amp.initialize "
            f"at line {ctx.position(scaler.initialize)[0]} has no `enabled=` and no `if` directly around it): pass "  # type: ignore[arg-type]
            "`enabled=` to amp.initialize with the same condition, or scale both paths",
        )
        return
    if (
        branch is not None
        and not scaler.carried
        and _calls_unscaled_backward(ctx, branch.orelse)  # type: ignore[arg-type]
        and not _on_only_where(ctx, scaler, branch.test)
    ):
        ctx.report(
            "AMP022",
            call,
            f"the `else` of `if {syntax.code(branch.test)}:` backpropagates an unscaled loss while the optimizer "
            f"still steps through the scaler, which is on whenever `{syntax.code(scaler.enabled)}` holds "  # type: ignore[arg-type]
            f"(amp.initialize at line {ctx.position(scaler.initialize)[0]}), a condition the tool cannot show "  # type: ignore[arg-type]
            "implies the `if`: where it holds and the `if` does not, Apex ran O1 without loss scaling, and the "
            "GradScaler would scale (or crash in `step` before any `scale`): guard amp.initialize with the "
            "`if`'s condition, or scale both paths",
        )
        return
    if not scaler.carried:  # a carrier's steps check their own backward passes
        keys = _managed_optimizers(ctx, model, call, optimizers)
        plain = _plain_backward_in_step(ctx, model, with_node, call, keys)
        if plain is not None:
            _report_plain_backward(ctx, call, *plain)
            ctx.unfinished.append(use.base)  # the setup stays as it was (AMP025)
            return
    if "loss_id" in arguments:
        ctx.report("AMP004", call)

    loss = syntax.strip_parens(loss_arg.value)
    asname = with_node.items[0].asname.name.value  # type: ignore[union-attr]
    scaled = syntax.attribute_call(access.deep_clone(), "scale", [cst.Arg(loss.deep_clone())])
    if _named_outside(ctx, with_node, asname):
        # the scaled loss is read after the block (`reduce_tensor(scaled.data)`): bind it as Apex did
        target = cst.AssignTarget(cst.Name(asname))
        ctx.plan.before[with_node].append(cst.SimpleStatementLine([cst.Assign(targets=[target], value=scaled)]))
    else:
        for name in _scaled_loss_names(ctx, with_node, asname):
            ctx.plan.substitute(name, scaled.deep_clone())
    if not scaler.carried:  # a carrier exists only where Apex scaled: its `if` stays
        _collapse_fp32_branch(ctx, with_node, asname, loss, access)
    ctx.plan.unwrap.add(with_node)
    _drop_delay_flag(ctx, arguments.get("delay_unscale"), with_node)
    ctx.consumed.add(use.base)
    model.sites.append(call)
    managed[id(scaler)] |= _managed_optimizers(ctx, model, call, optimizers)
    sites[id(scaler)].append(call)
    # the loss as written: a parenthesized one stripped above is a new node the context cannot walk
    if not _plan_autocast(ctx, model, scaler, access, with_node, loss_arg.value, call):
        ctx.unfinished.append(use.base)  # the setup stays as it was (AMP025)


def _innermost_loop(ctx: ModuleContext, node: cst.CSTNode) -> cst.CSTNode | None:
    for ancestor in ctx.ancestors(node):
        if isinstance(ancestor, (cst.For, cst.While)):
            return ancestor
        if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef)):
            return ancestor
    return None


def _site_callers(
    ctx: ModuleContext, model: AmpModel, functions: set[cst.FunctionDef | None]
) -> set[cst.FunctionDef | None]:
    """``functions`` and the module-level functions that (transitively) call them."""
    result = set(functions)
    frontier = [f for f in functions if f is not None]
    while frontier:
        function = frontier.pop()
        for call in model.callers_of(function):
            caller = ctx.function_of(call)
            if caller not in result:
                result.add(caller)
                if caller is not None:
                    frontier.append(caller)
    return result


def _plan_steps(ctx: ModuleContext, model: AmpModel, scaler: Scaler, keys: set[str], sites: list[cst.CSTNode]) -> None:
    """``opt.step()`` -> ``scaler.step(opt)``, then one ``scaler.update()`` per iteration."""
    functions = _site_callers(ctx, model, {ctx.function_of(site) for site in sites})
    if scaler.klass is not None:
        functions |= {node for node in scaler.klass.body.body if isinstance(node, cst.FunctionDef)}
    functions.add(scaler.function)
    steps = _steps_to_rewrite(ctx, model, scaler, keys, sites, functions)
    if not steps and scaler.initialize is None and scaler.klass is not None and keys <= scaler.stepped:
        return  # inherited: the base class's loop steps these optimizers with it
    if not steps:
        if not any(ctx.function_of(step) in functions for step in model.steps):
            ctx.report(
                "AMP022",
                sites[0],
                "no step() of the optimizer passed to amp.scale_loss was found where the GradScaler is "
                "reachable, so the amp setup stays as it was (a scaled backward followed by a plain step() would "
                "apply gradients still multiplied by the loss scale, and skip no overflowing step): call step() on "
                "the optimizer given to amp.scale_loss (not on a wrapper of it) where the GradScaler is reachable, "
                "or migrate this step by hand (`scaler.step(<that optimizer>)`, `scaler.update()`), then run "
                "ampmigrate again",
            )
            # a scaled backward with no scaler.step()/update() after it trains wrong: leave it all
            ctx.unfinished.extend(use.base for use in model.of("scale_loss") if use.call in sites)
        return
    scaler.stepped |= keys
    per_loop = _rewrite_steps(ctx, model, steps)
    for stepped in per_loop.values():
        anchors = _update_anchors(ctx, stepped)
        if anchors is None:
            ctx.report(
                "AMP022",
                sites[0],
                "an optimizer passed to amp.scale_loss steps twice in one iteration, once in a branch and once "
                "after it, and no step that always runs before the second one can take the `scaler.update()` "
                "GradScaler needs between them, so the amp setup stays as it was: call `scaler.update()` after the "
                "first step by hand, then run ampmigrate again",
            )
            ctx.unfinished.extend(use.base for use in model.of("scale_loss") if use.call in sites)
            return
        for anchor in anchors:
            _plan_update(ctx, model, scaler, anchor)


def _steps_to_rewrite(
    ctx: ModuleContext,
    model: AmpModel,
    scaler: Scaler,
    keys: set[str],
    sites: list[cst.CSTNode],
    functions: set[cst.FunctionDef | None],
) -> list[tuple[cst.Call, cst.BaseExpression]]:
    """The ``step()`` calls (and their optimizers) of the optimizers in ``keys``, in ``functions``."""
    created_at = ctx.order(scaler.initialize) if scaler.initialize is not None else -1

    def iterated_from(node: cst.CSTNode, optimizer: cst.BaseExpression) -> bool:
        """`for opt in optimizers: opt.step()` where `optimizers` went to scale_loss."""
        if not isinstance(optimizer, cst.Name):
            return False
        return any(
            isinstance(loop, cst.For)
            and isinstance(loop.target, cst.Name)
            and loop.target.value == optimizer.value
            and optimizer_key(ctx, loop.iter, node) in keys
            for loop in ctx.ancestors(node)
        )

    steps: list[tuple[cst.Call, cst.BaseExpression]] = []
    for node in ctx.nodes_of(cst.Call):
        func = node.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "step") or node in model.steps:
            continue
        function = ctx.function_of(node)
        if function not in functions:
            continue
        if optimizer_key(ctx, func.value, node) not in keys and not iterated_from(node, func.value):
            continue
        if function is scaler.function and ctx.order(node) < created_at:
            continue  # a step before amp.initialize: no scaler exists yet
        if fp32_only(ctx, node, sites):
            continue
        if _steps_without_gradients(ctx, node, func.value):
            continue
        steps.append((node, func.value))
    return steps


def _steps_without_gradients(ctx: ModuleContext, step: cst.Call, optimizer: cst.BaseExpression) -> bool:
    """``optimizer.zero_grad()`` right before ``optimizer.step()``: a step with no gradients.

    UNITER calls this pair once before its loop ("quick hack for amp delay_unscale bug"),
    sometimes with the step under ``if global_step == 0:``. It
    does nothing, in Apex and in torch, but ``scaler.step`` would fail: it needs a
    ``scaler.scale(...)`` in the same iteration. So it stays a plain ``optimizer.step()``.
    """
    statement = ctx.statement_of(step)
    if _single_call(statement) is not step:
        return False
    block = ctx.block_of(statement)
    while block.body.index(statement) == 0:
        # `if global_step == 0: optimizer.step()` first in an `if` without calls in its test
        owner = ctx.owner_of_block(block)
        if not (isinstance(owner, cst.If) and not any(isinstance(n, cst.Call) for n in ctx.walk(owner.test))):
            return False
        statement = owner
        block = ctx.block_of(statement)
    previous = _single_call(block.body[block.body.index(statement) - 1])
    if previous is None or not isinstance(previous.func, cst.Attribute) or previous.func.attr.value != "zero_grad":
        return False
    if any(
        not (arg.keyword and arg.keyword.value == "set_to_none" and ctx.code(arg.value) == "True")
        for arg in previous.args
    ):
        return False  # zero_grad(set_to_none=False) keeps zero gradients: Adam would still move
    return ctx.code(previous.func.value) == ctx.code(optimizer)


def _single_call(statement: cst.CSTNode) -> cst.Call | None:
    """The call of a statement line that is only that call."""
    expression = syntax.sole_statement(statement)
    if isinstance(expression, cst.Expr) and isinstance(expression.value, cst.Call):
        return expression.value
    return None


def _rewrite_steps(
    ctx: ModuleContext, model: AmpModel, steps: list[tuple[cst.Call, cst.BaseExpression]]
) -> dict[cst.CSTNode | None, list[tuple[cst.CSTNode, str]]]:
    """Plan ``scaler.step(opt)`` for each step; the stepped statements (with their optimizer
    keys) grouped by the loop whose iteration they end."""
    per_loop: dict[cst.CSTNode | None, list[tuple[cst.CSTNode, str]]] = defaultdict(list)
    for step, optimizer in steps:
        if any(arg.star or arg.keyword is None or arg.keyword.value == "closure" for arg in step.args):
            # a closure (or what may be one) runs its own backward, unscaled: the setup stays as it was
            ctx.report(
                "AMP021",
                step,
                f"`{ctx.code(step)}`: GradScaler.step takes no closure: run the closure's forward pass and "
                "`scaler.scale(loss).backward()` yourself, then `scaler.step(optimizer)` and `scaler.update()`",
            )
            ctx.unfinished.append(step)
            continue
        found = model.scaler_access_or_report(step)
        if found is None:
            continue
        # keyword arguments of a custom step(...) pass through: GradScaler.step forwards them
        passed = [arg.deep_clone() for arg in step.args]
        ctx.plan.substitute(
            step,
            syntax.attribute_call(
                found.expression.deep_clone(),
                "step",
                [cst.Arg(syntax.strip_parens(optimizer).deep_clone()), *passed],
            ),
        )
        key = optimizer_key(ctx, optimizer, step)
        model.steps[step] = key
        statement = ctx.statement_of(step)
        loop = _innermost_loop(ctx, step)
        if (
            isinstance(loop, cst.For)
            and isinstance(loop.target, cst.Name)
            and isinstance(optimizer, cst.Name)
            and loop.target.value == optimizer.value
        ):
            # `for opt in optimizers: opt.step()`: one update after the whole loop
            statement = ctx.statement_of(loop)
            loop = _innermost_loop(ctx, loop)
        per_loop[loop].append((statement, key))
    return per_loop


def _plan_update(ctx: ModuleContext, model: AmpModel, scaler: Scaler, anchor: cst.CSTNode) -> None:
    """``scaler.update()`` after ``anchor`` (once, whichever scaler asks first)."""
    if anchor in model.updated:
        return
    model.updated.add(anchor)
    found = model.scaler_access(anchor)
    assert found is not None
    update_args = []
    if scaler.held_scale is not None:
        if found.scaler is not scaler or not model.holds_scale_in(scaler, ctx.function_of(anchor)):
            _unhold(ctx, model, scaler, anchor)
            return
        update_args.append(syntax.keyword("new_scale", cst.Name(scaler.held_scale)))
    elif scaler.static_scale is not None:
        update_args.append(syntax.keyword("new_scale", cst.Float(repr(float(scaler.static_scale)))))
    update = syntax.expression_statement(syntax.attribute_call(found.expression.deep_clone(), "update", update_args))
    ctx.plan.after[anchor].append(update)


def _unhold(ctx: ModuleContext, model: AmpModel, scaler: Scaler, anchor: cst.CSTNode) -> None:
    """The held run-time scale cannot reach this update: the amp setup stays as it was."""
    ctx.report(
        "AMP005",
        scaler.initialize or anchor,
        f"loss_scale is computed at run time, and the optimizer step at line {ctx.position(anchor)[0]} is where "
        f"the scale held beside the GradScaler cannot reach: pass `{scaler.held_scale}` there with the scaler and call "
        f"`{scaler.name}.update(new_scale={scaler.held_scale})` after the step",
    )
    for use in model.of("initialize"):
        if use.call is scaler.initialize:
            ctx.consumed.discard(use.base)  # an Apex use left over: the setup is frozen


def _branch_path(ctx: ModuleContext, statement: cst.CSTNode) -> list[tuple[cst.If, bool]]:
    """The `if`s around ``statement`` (outermost first) and whether it is in their body."""
    path = []
    child: cst.CSTNode = statement
    for ancestor in ctx.ancestors(statement):
        if isinstance(ancestor, (cst.For, cst.While, cst.FunctionDef)):
            break
        if isinstance(ancestor, cst.If):
            path.append((ancestor, ancestor.body is child))
        child = ancestor
    return path[::-1]


def _update_anchors(ctx: ModuleContext, stepped: list[tuple[cst.CSTNode, str]]) -> list[cst.CSTNode] | None:
    """Where ``scaler.update()`` goes: after the last step of each iteration.

    Steps in exclusive branches of an `if` each get their own update. Steps get one
    update after the last, or one more each time an optimizer steps a second time
    (GradScaler allows one step per optimizer between updates); None where that extra
    update cannot go after a step that always runs before the second one.
    """
    statements = [statement for statement, _ in stepped]
    blocks = {id(ctx.block_of(statement)) for statement in statements}
    if len(blocks) == 1:
        return list(dict.fromkeys([*(_restepped(stepped) or []), statements[-1]]))
    paths = {statement: _branch_path(ctx, statement) for statement in statements}
    depth = 0
    while True:
        at_depth = {path[depth] for path in paths.values() if len(path) > depth}
        nodes = {node for node, _ in at_depth}
        if len(at_depth) != len(nodes) or any(len(p) <= depth for p in paths.values()) or len(nodes) != 1:
            break
        depth += 1
    # an `if` at which the steps split into body and else
    for node in {p[depth][0] for p in paths.values() if len(p) > depth}:
        sides = {p[depth][1] for p in paths.values() if len(p) > depth and p[depth][0] is node}
        if len(sides) == 2 and all(len(p) > depth and p[depth][0] is node for p in paths.values()):
            anchors = []
            for side in (True, False):
                group = [(s, k) for s, k in stepped if paths[s][depth][1] is side]
                found = _update_anchors(ctx, group)
                if found is None:
                    return None
                anchors.extend(found)
            return anchors
    # an optimizer stepped again later in the iteration (once in an `if`, once after it) needs an
    # update after the step before: GradScaler allows one step per optimizer between updates
    again = _restepped(sorted(stepped, key=lambda found: ctx.position(found[0])), ctx)
    if again is None:
        return None
    last = statements[-1]
    common = set.intersection(*[set(map(id, _blocks(ctx, s))) for s in statements])
    for block in _blocks(ctx, last):  # innermost first
        if id(block) in common:
            current = last
            while ctx.block_of(current) is not block:
                current = ctx.statement_of(ctx.owner_of_block(ctx.block_of(current)))  # type: ignore[arg-type]
            return list(dict.fromkeys([*again, current]))
    return list(dict.fromkeys([*again, last]))


def _restepped(stepped: list[tuple[cst.CSTNode, str]], ctx: ModuleContext | None = None) -> list[cst.CSTNode] | None:
    """The steps (in order) right before a step of an optimizer already stepped since the last of them.

    With ``ctx`` (steps in different blocks), such a step must run whenever the earlier step of
    that optimizer does (every block around it is around that one too); None where one does not:
    an update there would be skipped on the path that steps the optimizer twice."""
    anchors: list[cst.CSTNode] = []
    seen: dict[str, cst.CSTNode] = {}
    previous: cst.CSTNode | None = None
    for statement, key in stepped:
        if key in seen and previous is not None:
            if ctx is not None and not {id(b) for b in _blocks(ctx, previous)} <= {
                id(b) for b in _blocks(ctx, seen[key])
            }:
                return None
            anchors.append(previous)
            seen = {}
        seen[key] = statement
        previous = statement
    return anchors


def _blocks(ctx: ModuleContext, statement: cst.CSTNode) -> list[cst.CSTNode]:
    """The blocks containing ``statement``, innermost first."""
    return [a for a in ctx.ancestors(statement) if isinstance(a, (cst.IndentedBlock, cst.Module))]


def plan(ctx: ModuleContext) -> None:
    model = ctx.amp
    managed: dict[int, set[str]] = defaultdict(set)
    sites: dict[int, list[cst.CSTNode]] = defaultdict(list)
    for use in model.of("scale_loss"):
        _plan_one(ctx, model, use, managed, sites)
    for scaler in model.scalers:
        if sites.get(id(scaler)) and scaler.carried:
            _plan_carrier_steps(ctx, model, scaler, managed[id(scaler)], sites[id(scaler)])
        elif sites.get(id(scaler)):
            _plan_steps(ctx, model, scaler, managed[id(scaler)], sites[id(scaler)])


# ---------------------------------------------------------------------- plain carriers
# ``if args.fp16: with args.amp.scale_loss(loss, optimizer) as s: s.backward()`` where another
# function (often another module) stored the amp module in ``args.amp``: that attribute now holds
# the GradScaler, set only where Apex was set up. So the code reads it only where it read the amp
# module: the scaled backward stays in its ``if``, the optimizer's step becomes
# ``if args.fp16: args.amp.step(optimizer); args.amp.update()`` with the plain step in the
# ``else``, and autocast is on where ``bool(args.fp16) and args.amp.is_enabled()``.


def _drop_delay_flag(ctx: ModuleContext, argument: cst.Arg | None, with_node: cst.With) -> None:
    """``delay_unscale = i != last`` earlier in the block of the scale_loss, read by nothing but its
    ``delay_unscale=`` (which goes): the assignment goes too, when its value calls nothing."""
    if argument is None or not isinstance(argument.value, cst.Name):
        return
    name = argument.value.value
    function = ctx.function_of(with_node)
    if function is None:
        return
    spelled = [
        node
        for node in ctx.walk(function)
        if isinstance(node, cst.Name)
        and node.value == name
        and not (isinstance(ctx.parent(node), cst.Arg) and ctx.parent(node).keyword is node)  # type: ignore[union-attr]
    ]
    if len(spelled) != 2:
        return
    target = next(node for node in spelled if node is not argument.value)
    assign_target = ctx.parent(target)
    assign = ctx.parent(assign_target) if isinstance(assign_target, cst.AssignTarget) else None
    if not isinstance(assign, cst.Assign) or len(assign.targets) != 1:
        return
    statement = ctx.statement_of(assign)
    if (
        not isinstance(statement, cst.SimpleStatementLine)
        or len(statement.body) != 1
        or ctx.parent(statement) is not ctx.parent(with_node)
        or ctx.position(statement) > ctx.position(with_node)
        or any(isinstance(node, (cst.Call, cst.NamedExpr, cst.Await, cst.Yield)) for node in ctx.walk(assign.value))
    ):
        return
    ctx.plan.remove.add(statement)


def _carrier_failed(ctx: ModuleContext, at: cst.CSTNode, why: str) -> None:
    ctx.report(
        "AMP022",
        at,
        f"{why}; the GradScaler stored in place of the amp module exists only where Apex was set up, so "
        "ampmigrate migrates a call through that attribute only as `if <flag>: with <obj>.<attr>.scale_loss(loss, "
        "optimizer) as scaled: scaled.backward()` in the body of its function (or loop), followed in the same "
        "block by `optimizer.step()`: migrate it by hand (`<obj>.<attr>.scale(loss).backward()`, "
        "`<obj>.<attr>.step(optimizer)`, `<obj>.<attr>.update()` where Apex scaled), then run ampmigrate again",
    )


def _site_branch(ctx: ModuleContext, with_node: cst.CSTNode) -> cst.If | None:
    """The ``if`` whose body holds the ``with`` of a carrier's scale_loss."""
    block = ctx.parent(with_node)
    branch = ctx.parent(block) if isinstance(block, cst.IndentedBlock) else None
    if isinstance(branch, cst.If) and branch.body is block and isinstance(ctx.parent(branch), cst.IndentedBlock):
        return branch
    return None


def _assigned_in(ctx: ModuleContext, statements: list[cst.CSTNode], expression: cst.BaseExpression) -> bool:
    """Whether ``statements`` rebind ``expression`` (``args.fp16``) or the name it starts from."""
    root = expression
    while isinstance(root, cst.Attribute):
        root = root.value
    names = {syntax.normalized(expression)}
    if isinstance(root, cst.Name):
        names.add(root.value)
    for node in (node for statement in statements for node in ctx.walk(statement)):
        target: cst.CSTNode | None = None
        if isinstance(node, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign)):
            target = node.target
        elif isinstance(node, (cst.For, cst.CompFor)):
            target = node.target
        elif isinstance(node, (cst.AsName, cst.NamedExpr)):
            target = node.name if isinstance(node, cst.AsName) else node.target
        if target is None:
            continue
        for part in ctx.walk(target):
            if isinstance(part, (cst.Name, cst.Attribute)) and syntax.normalized(part) in names:
                return True
    return False


def _carrier_guard(ctx: ModuleContext, scaler: Scaler, with_node: cst.With, call: cst.Call) -> bool:
    """Check the shape a carrier's scale_loss must have (see above) and keep its flag; False (with
    AMP022) otherwise."""
    branch = _site_branch(ctx, with_node)
    if branch is None:
        _carrier_failed(ctx, call, "this scale_loss is not the body of an `if` that tests a flag")
        return False
    function = scaler.function
    found = _top_through_ifs(ctx, branch)
    if found is None or ctx.function_of(branch) is not function or function is None:
        _carrier_failed(
            ctx, call, f"`if {ctx.code(branch.test)}:` is not reached from its function or loop through `if`s only"
        )
        return False
    path = [*found[1], (branch.test, True)]
    # `if self.amp is not None:`: the attribute itself tells where it holds the GradScaler (it held
    # the amp module there, None elsewhere), whatever the tests on the way to its store
    present = scaler.access is not None and any(_tests_presence(test, scaler.access) is arm for test, arm in path)
    tests = [branch.test, *(test for test, _ in found[1])]
    if any(dotted_name(test) is None and not _is_presence_test(test, scaler.access) for test in tests):
        _carrier_failed(ctx, call, "the flags that lead to it cannot all be tested again at the step")
        return False
    if scaler.guard is not None and not scaler.guard.deep_equals(branch.test):
        _carrier_failed(ctx, call, "the function scales losses under different flags")
        return False
    # the scaled path must be where the attribute was set: there it now holds the GradScaler
    owner = scaler.access.value if isinstance(scaler.access, cst.Attribute) else None
    held = ctx.options.facts.carrier_conditions
    here = {(syntax.normalized(test), arm) for test, arm in path}
    if isinstance(owner, cst.Name):
        here = {(carrier_condition(test, owner.value), arm) for test, arm in here}
    if held is None or (here != set(held) and not present):
        stored = " and ".join(f"{'' if arm else 'not '}{test}" for test, arm in held or ()) or "always"
        _carrier_failed(
            ctx,
            call,
            f"the amp module was stored on the object where {stored.replace('<obj>', ctx.code(owner) if owner else '<obj>')},"
            " which is not exactly where this scaled backward runs",
        )
        return False
    scaler.guard = branch.test
    conditions: list[cst.BaseExpression] = []
    for test, arm in found[1]:
        parenthesized = test.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        plain = isinstance(test, (cst.Name, cst.Attribute))
        conditions.append(_as_bool(test) if arm else cst.UnaryOperation(cst.Not(), test if plain else parenthesized))
    conditions.append(_as_bool(branch.test))
    guard = conditions[0]
    for condition in conditions[1:]:
        guard = cst.BooleanOperation(guard, cst.And(), condition)
    scaler.path_guard = guard
    return True


def _as_bool(test: cst.BaseExpression) -> cst.BaseExpression:
    """``test`` as a bool for ``enabled=``: a comparison already is one, anything else in ``bool()``."""
    if isinstance(test, cst.Comparison) or (
        isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not)
    ):
        return test
    return syntax.call("bool", [cst.Arg(test)])


def _tests_presence(test: cst.BaseExpression, access: cst.BaseExpression) -> bool | None:
    """For a test of whether the carrier ``access`` holds the amp module (``self.amp``,
    ``self.amp is not None``; ``self.amp is None``, ``not self.amp``): the arm of the ``if`` on
    which it does (True: the body). None for any other test."""
    spelled = syntax.normalized(access)
    if syntax.normalized(test) == spelled:
        return True
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return False if syntax.normalized(test.expression) == spelled else None
    if (
        isinstance(test, cst.Comparison)
        and len(test.comparisons) == 1
        and syntax.normalized(test.left) == spelled
        and isinstance(test.comparisons[0].comparator, cst.Name)
        and test.comparisons[0].comparator.value == "None"
    ):
        operator = test.comparisons[0].operator
        if isinstance(operator, cst.IsNot):
            return True
        if isinstance(operator, cst.Is):
            return False
    return None


def _is_presence_test(test: cst.BaseExpression, access: cst.BaseExpression | None) -> bool:
    return access is not None and _tests_presence(test, access) is not None


IfPath = list[tuple[cst.BaseExpression, bool]]


def _top_through_ifs(ctx: ModuleContext, statement: cst.CSTNode) -> tuple[cst.CSTNode, IfPath] | None:
    """The statement of its loop's (or function's) body that holds ``statement`` and the tests of the
    ``if``s on the way (outermost first, each with True for its body, False for its else); None
    where something other than an ``if`` lies on the way."""
    path: IfPath = []
    current = statement
    while True:
        block = ctx.parent(current)
        owner = ctx.parent(block) if isinstance(block, cst.IndentedBlock) else None
        if isinstance(owner, (cst.For, cst.While, cst.FunctionDef)) and block is owner.body:
            return current, path
        arm = not isinstance(owner, cst.Else)
        if isinstance(owner, cst.Else):
            owner = ctx.parent(owner)
        if not isinstance(owner, cst.If):
            return None
        path.insert(0, (owner.test, arm))
        while isinstance(ctx.parent(owner), cst.If):  # an `elif`: the else of the `if` above it
            owner = ctx.parent(owner)  # type: ignore[assignment]
            assert isinstance(owner, cst.If)
            path.insert(0, (owner.test, False))
        current = owner


def _excludes(path: IfPath, other: IfPath) -> bool:
    """Whether code on ``path`` never runs in the same pass as code on ``other`` (opposite arms of
    an ``if`` on the same test)."""
    arms = {syntax.normalized(test): arm for test, arm in other}
    return any(arms.get(syntax.normalized(test), arm) != arm for test, arm in path)


def _plan_carrier_steps(
    ctx: ModuleContext, model: AmpModel, scaler: Scaler, keys: set[str], sites: list[cst.CSTNode]
) -> None:
    """The step of a carrier's optimizer, taken through the carrier where Apex scaled; a scaled
    backward followed by more backward passes or other code before that step is unscaled first,
    as Apex unscaled the gradients when its block ended."""
    function, access, guard = scaler.function, scaler.access, scaler.guard
    assert function is not None and access is not None and guard is not None
    site = sites[0]
    assert isinstance(site, cst.Call)
    item = ctx.parent(site)
    with_node = ctx.parent(item) if item is not None else None
    assert isinstance(with_node, cst.With)
    branch = _site_branch(ctx, with_node)
    assert branch is not None

    def fail(why: str) -> None:
        _carrier_failed(ctx, site, why)
        ctx.unfinished.append(site)

    if len(sites) != 1 or len(keys) != 1:
        fail("the function scales several losses, or for several optimizers")
        return
    site_top = _top_through_ifs(ctx, branch)
    assert site_top is not None  # checked by _carrier_guard
    top_site, site_path = site_top
    block: list[cst.CSTNode] = list(ctx.block_of(top_site).body)
    after = block[block.index(top_site) + 1 :]
    steps = [
        node
        for node in ctx.nodes_of(cst.Call)
        if isinstance(node.func, cst.Attribute)
        and node.func.attr.value == "step"
        and ctx.function_of(node) is function
        and optimizer_key(ctx, node.func.value, node) in keys
    ]
    if len(steps) != 1:
        fail("there is not exactly one step() of its optimizer in the function")
        return
    step = steps[0]
    statement = ctx.statement_of(step)
    step_top = _top_through_ifs(ctx, statement)
    # the micro-batches of one step in a loop of their own (`for chunk in split(batch): ...
    # scale_loss ...`, then the step after the loop): the scaled backward passes accumulate into
    # the gradients the one step unscales, as Apex's delay_unscale did
    owner = ctx.owner_of_block(ctx.block_of(top_site))
    loop_top = (
        _top_through_ifs(ctx, owner)
        if step_top is not None
        and not any(step_top[0] is candidate for candidate in after)
        and isinstance(owner, cst.For)
        and owner.orelse is None
        and ctx.function_of(owner) is function
        else None
    )
    lifted = loop_top is not None
    if loop_top is not None:
        top_site, site_path = loop_top[0], [*loop_top[1], *site_path]
        block = list(ctx.block_of(top_site).body)
        after = block[block.index(top_site) + 1 :]
    if (
        _single_call(statement) is not step
        or step.args
        or step_top is None
        or not any(step_top[0] is candidate for candidate in after)
    ):
        fail(f"`{ctx.code(step)}` is not a statement of its own after the scaled backward, inside `if`s only")
        return
    top_step, step_path = step_top
    step_arms = {(syntax.normalized(test), arm) for test, arm in step_path}
    if any((syntax.normalized(test), arm) not in step_arms for test, arm in site_path):
        fail(f"`{ctx.code(step)}` may run where the scaled backward did not (under other conditions)")
        return
    span = [top_site, *after[: after.index(top_step) + 1]]
    if any(_assigned_in(ctx, span, test) for test in (guard, access, *(test for test, _ in site_path))):
        fail("a flag that leads to the scaled backward may change before the step")
        return

    def runs_with(node: cst.CSTNode, other: IfPath) -> bool:
        found = _top_through_ifs(ctx, ctx.statement_of(node))
        return found is None or not _excludes(found[1], other)

    inside_branch = {id(node) for node in ctx.walk(branch)}
    calls = [
        node
        for s in span
        for node in ctx.walk(s)
        if isinstance(node, cst.Call) and id(node) not in inside_branch and ctx.function_of(node) is function
    ]
    between = [
        node for node in calls if ctx.order(site) < ctx.order(node) < ctx.order(step) and runs_with(node, step_path)
    ]
    if between and any(
        (syntax.normalized(test), arm) not in {(syntax.normalized(t), a) for t, a in site_path}
        for test, arm in step_path
    ):
        fail("code runs between the scaled backward and a step that not every iteration takes")
        return
    if lifted and between:
        fail("code runs between the scaled backward passes of the loop and the step after it")
        return
    optimizer = step.func.value  # type: ignore[attr-defined]
    for backward in between:
        if isinstance(backward.func, cst.Attribute) and backward.func.attr.value == "backward":
            _second_backward(ctx, backward, access, optimizer)
            ctx.unfinished.append(site)
            return
    earlier = [node for s in block[: block.index(top_site)] for node in ctx.walk(s) if isinstance(node, cst.Call)]
    earlier += [node for node in calls if ctx.order(node) < ctx.order(site) and runs_with(node, site_path)]
    if any(isinstance(node.func, cst.Attribute) and node.func.attr.value == "backward" for node in earlier):
        fail("another backward pass runs before the scaled one")
        return
    if between:
        # the gradients are unscaled where Apex's block ended, before any code reads or adds to them
        unscale = syntax.expression_statement(
            syntax.attribute_call(access.deep_clone(), "unscale_", [cst.Arg(optimizer.deep_clone())])
        )
        ctx.plan.after[with_node].append(unscale)
    scaled_step = [
        syntax.expression_statement(
            syntax.attribute_call(access.deep_clone(), "step", [cst.Arg(optimizer.deep_clone())])
        ),
        syntax.expression_statement(syntax.attribute_call(access.deep_clone(), "update")),
    ]
    assert isinstance(statement, cst.SimpleStatementLine)
    plain = statement.with_changes(leading_lines=())
    ctx.plan.replace_statement[statement] = [
        cst.If(
            test=guard.deep_clone(),
            body=cst.IndentedBlock(scaled_step),
            orelse=cst.Else(cst.IndentedBlock([plain])),
            leading_lines=statement.leading_lines,
        )
    ]
    model.steps[step] = next(iter(keys))


def _second_backward(
    ctx: ModuleContext, backward: cst.Call, access: cst.BaseExpression, optimizer: cst.BaseExpression
) -> None:
    """AMP022 for a forward and backward pass after the scaled one, before the step (adversarial
    training): no native code trains like Apex there."""
    ctx.report(
        "AMP022",
        backward,
        f"`{ctx.code(backward)}` backpropagates a forward pass run after the scale_loss block, before the step: "
        "Apex O1 cast the weights to float16 for that forward pass and kept the copies cached until the next "
        "scale_loss block ended, so the next iteration's forward pass used the weights from before this step; "
        "torch.autocast casts the updated weights, so the migrated code would train differently. The amp setup "
        f"stays as it was; to migrate by hand (accepting that change): `{syntax.code(access)}.unscale_("
        f"{syntax.code(optimizer)})` right after the scaled backward, that forward pass under the same "
        "torch.autocast, and the step taken through the GradScaler",
    )


def _top_statement(ctx: ModuleContext, statement: cst.CSTNode, after: list[cst.CSTNode]) -> cst.CSTNode | None:
    """The statement of ``after`` that holds ``statement``, reached through ``if``s only; None otherwise."""
    current = statement
    while not any(current is candidate for candidate in after):
        block = ctx.parent(current)
        owner = ctx.parent(block) if isinstance(block, cst.IndentedBlock) else None
        while isinstance(owner, cst.Else) or (
            isinstance(owner, cst.If) and not isinstance(ctx.parent(owner), cst.IndentedBlock)
        ):
            owner = ctx.parent(owner)
        if not isinstance(owner, cst.If):
            return None
        current = owner
    return current
