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

The same goes for a clip of ``model.parameters()`` (or any parameters) after a scaled
backward, and for a function of the module that touches ``.grad`` given them (a norm, a
hand-made clip, a log of the largest gradient, whatever its name): Apex had unscaled them.

An ``if fp16: clip(amp.master_params(optimizer)) else: clip(model.parameters())`` folds into
``unscale_`` + the model clip only where the optimizer provably holds every parameter of the
model (built here over ``model.parameters()`` or the weight-decay split of
``model.named_parameters()``); otherwise each arm keeps its parameters, after its own ``unscale_``.

Gradients read at several places before one step (a norm logged under one condition, a
clip under another) get one ``unscale_``: before the first read of each block when those
blocks exclude each other (``if``/``else``), else right after the scaled backward of their
common block; GradScaler refuses a second ``unscale_`` before ``update``.

Not rewritten (reported instead)
    A clip where no GradScaler is reachable (AMP022, AMP023); reads before one step with no
    one place after the backward that runs before them all (AMP028).

Safety
    Exact for O1. Under O2 the master params were fp32 copies; natively the optimizer
    holds the model's own fp32 parameters, which are what it steps.

References
    NVIDIA/apex@e13873d: apex/amp/_amp_state.py, docs/source/advanced.rst;
    pytorch/pytorch: docs/source/notes/amp_examples.rst (gradient clipping).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from itertools import takewhile
from typing import cast

import libcst as cst

from migrate.rules import _syntax as syntax
from migrate.rules._amp import AmpCall, AmpModel, arm, fp32_only, is_clip, optimizer_key
from migrate.rules._bindings import dotted_name
from migrate.rules._context import ModuleContext
from migrate.rules._optimizer_coverage import holds_every_parameter
from migrate.rules.amp_initialize import PARAMETERS as INITIALIZE_PARAMETERS
from migrate.rules.amp_initialize import _assigned_literal, _bound_inside

RULE = "amp_master_params"


def _parameters_of(optimizer: cst.BaseExpression, as_list: bool = False) -> cst.BaseExpression:
    code = f'p for group in {syntax.code(optimizer)}.param_groups for p in group["params"]'
    return cst.parse_expression(f"[{code}]" if as_list else f"({code})")


def _collapsible_else(ctx: ModuleContext, statement: cst.CSTNode, optimizer: cst.BaseExpression) -> cst.If | None:
    """The `if` around ``statement`` when its `else` is the same clip of the parameters that
    ``optimizer`` provably holds all of (``model.parameters()``)."""
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
    clipped = next(n for n in ctx.walk(other) if isinstance(n, cst.Call) and is_clip(n.func)).args[0].value
    if not holds_every_parameter(ctx, optimizer, clipped, statement):
        return None  # each arm keeps its own parameters (an optimizer over part of the model)
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
    # a step in another branch of an if/else than ``node`` never runs after it (the native
    # path's `scaler.step(optimizer)` beside the Apex path's clip)
    statement = ctx.statement_of(node)
    candidates = [step for step in candidates if not _exclusive(ctx, [statement, ctx.statement_of(step)])]
    return min(candidates, key=ctx.order, default=None)


def _skipping_tests(ctx: ModuleContext, statement: cst.CSTNode, step: cst.Call) -> list[cst.BaseExpression | None]:
    """The conditions that can keep ``step`` from running after ``statement`` (accumulation, a
    skipped step): the tests of the `if`s around the step that ``statement`` is not under, and
    of the `if`s between them that leave the iteration (``continue``, ``break``, ``return``);
    None for a jump under something else (a ``try``, a ``with``)."""
    around = set(map(id, ctx.ancestors(statement)))
    tests: list[cst.BaseExpression | None] = []
    block: cst.CSTNode | None = None
    child: cst.CSTNode = step
    for ancestor in ctx.ancestors(step):
        if id(ancestor) in around:
            block = ancestor
            break
        if isinstance(ancestor, cst.If) and not _steps_otherwise(ctx, ancestor, child, step):
            tests.append(ancestor.test)
        child = ancestor
    if isinstance(block, (cst.IndentedBlock, cst.Module)):
        tops = [id(node) for node in block.body]

        def position(node: cst.CSTNode) -> int:
            """Where the statement of ``block`` that holds ``node`` stands in it."""
            return next(tops.index(id(n)) for n in (node, *ctx.ancestors(node)) if id(n) in tops)

        if statement is not block:
            for between in block.body[position(statement) + 1 : position(step)]:
                if _leaves_iteration(ctx, between):
                    tests.append(between.test if isinstance(between, cst.If) else None)
    return tests


def _steps_otherwise(ctx: ModuleContext, branch: cst.If, inside: cst.CSTNode, step: cst.Call) -> bool:
    """Whether the other arm of ``branch`` (``step`` is in the arm ``inside``) steps the same
    optimizer by other means (transformers' Trainer: ``if is_tpu_available():
    xm.optimizer_step(optimizer) else: optimizer.step()``): its test is no pass without a step."""
    if not isinstance(branch.orelse, cst.Else) or not isinstance(step.func, cst.Attribute):
        return False
    other = branch.orelse.body if inside is branch.body else branch.body
    wanted = syntax.normalized(step.func.value)
    for node in ctx.walk(other):
        if not isinstance(node, cst.Call):
            continue
        name = dotted_name(node.func) or ""
        if name.split(".")[-1].endswith("step") and any(syntax.normalized(a.value) == wanted for a in node.args):
            return True
    return False


def _leaves_iteration(ctx: ModuleContext, statement: cst.CSTNode) -> bool:
    """Whether ``statement`` holds a ``return``, or a ``continue``/``break`` of the enclosing loop
    (not of a loop inside it); nested definitions are not entered."""
    for node in ctx.walk(statement, into_definitions=False):
        if isinstance(node, cst.Return):
            return True
        if isinstance(node, (cst.Continue, cst.Break)):
            between = takewhile(lambda ancestor: ancestor is not statement, ctx.ancestors(node))
            if not any(isinstance(ancestor, (cst.For, cst.While)) for ancestor in between):
                return True
    return False


def _caller_before_conditional_step(
    ctx: ModuleContext, model: AmpModel, node: cst.CSTNode, key: str | None
) -> cst.Call | None:
    """A call of the function holding ``node`` (which steps nothing itself: a clip helper) after
    which the optimizer steps only on some passes (gradient accumulation); None if there is none.

    The helper runs once per call: ``unscale_`` in it would run after every micro-batch, and
    GradScaler refuses a second ``unscale_`` before ``update()``."""
    function = ctx.function_of(node)
    if function is None:
        return None
    name = function.name.value
    for call in ctx.nodes_of(cst.Call):
        func = call.func
        calls_it = (isinstance(func, cst.Name) and func.value == name) or (
            isinstance(func, cst.Attribute)
            and func.attr.value == name
            and isinstance(func.value, cst.Name)
            and func.value.value in ("self", "cls")
        )
        if not calls_it or any(ancestor is function for ancestor in ctx.ancestors(call)):
            continue
        step = _next_step(ctx, model, call, key)
        if step is not None and _skipping_tests(ctx, ctx.statement_of(call), step):
            return call
    return None


def _report_helper_before_conditional_step(ctx: ModuleContext, node: cst.CSTNode, caller: cst.Call) -> None:
    """Freeze the setup: a clip helper is called after every micro-batch, the step only on some."""
    function = ctx.function_of(node)
    name = function.name.value if function is not None else "the function"
    ctx.report(
        "AMP024",
        node,
        f"`{name}(...)` reads the gradients here and is called at line {ctx.position(caller)[0]} after every "
        "backward pass while the optimizer steps only on some (gradient accumulation): Apex gave it the unscaled "
        "gradients each time, GradScaler unscales once per step (a second `scaler.unscale_` before `scaler.update()` "
        "raises): left as it was. Call it under the step's condition, after the last backward of the step, and run "
        "ampmigrate again (clipping the accumulated gradients once changes training), or clip each micro-batch's "
        "still-scaled gradients at `max_norm * scaler.get_scale()` by hand",
    )
    ctx.unfinished.append(node)  # the setup stays as it was (AMP025)


def _report_step_decided_by_gradients(ctx: ModuleContext, node: cst.CSTNode, test: cst.BaseExpression) -> None:
    """Freeze the setup: whether the optimizer steps depends on the clipped norm.

    After an fp16 overflow the norm is inf or NaN. Apex lowered its scale when the backward's
    block exited, whatever the code did next; GradScaler lowers it in ``update()``, which a
    skipped step never reaches (the scale would stay too high for good, and a later
    ``unscale_`` raises), so the rewrite needs ``update()`` on the skipping path too.
    """
    ctx.report(
        "AMP024",
        node,
        f"whether the optimizer steps depends on the norm this clip returns (`{syntax.code(test).strip()}` at line "
        f"{ctx.position(test)[0]}): after an fp16 overflow it is inf or NaN; Apex lowered its loss scale at the "
        "backward whatever came next, GradScaler lowers it in `scaler.update()`, which a skipped step never reaches: "
        "left as it was. Write `scaler.unscale_(optimizer)` before the clip, `scaler.step(optimizer)` where the "
        "step was, and `scaler.update()` on every path after the clip, the skipping one included",
    )
    ctx.unfinished.append(node)


def _argument_of(ctx: ModuleContext, node: cst.CSTNode) -> cst.CSTNode | None:
    """The node holding ``node`` as an argument, through the arms of conditional expressions:
    in ``clip(amp.master_params(opt) if fp16 else model.parameters(), n)`` the clip reads the
    master params' gradients as surely as in ``clip(amp.master_params(opt), n)``."""
    current, parent = node, ctx.parent(node)
    while isinstance(parent, cst.IfExp) and current is not parent.test:
        current, parent = parent, ctx.parent(parent)
    return parent


def _call_around(ctx: ModuleContext, node: cst.CSTNode) -> cst.CSTNode | None:
    """The call ``node`` is an argument of (``clip(amp.master_params(opt), n)`` for the inner call)."""
    argument = _argument_of(ctx, node)
    return argument and ctx.parent(argument)


def _inside_scale_loss(ctx: ModuleContext, model: AmpModel, statement: cst.CSTNode) -> bool:
    """Whether ``statement`` runs inside the body of a ``with amp.scale_loss(...)`` being migrated."""
    sites = set(map(id, model.sites))
    return any(
        isinstance(ancestor, cst.With) and any(id(item.item) in sites for item in ancestor.items)
        for ancestor in ctx.ancestors(statement)
    )


def _report_clip_inside_scale_loss(ctx: ModuleContext, node: cst.CSTNode) -> None:
    """Freeze the setup: a clip (or another gradient reader) inside the ``scale_loss`` block saw
    gradients Apex had not unscaled yet.

    Apex unscales when the block exits, and before the backward it set aside the gradients
    accumulated so far (O1) or left the master gradients of the last step (O2): a clip inside
    the block acted on this backward's still-scaled gradients alone. ``unscale_`` before it
    would clip the true gradients instead (about 65536 times more weakly), and with
    accumulation GradScaler's gradients hold every micro-batch: no native spelling keeps it.
    """
    outer = _call_around(ctx, node)
    clip = node if isinstance(node, cst.Call) and is_clip(node.func) else outer
    if isinstance(clip, cst.Call) and is_clip(clip.func):
        ctx.report(
            "AMP024",
            node,
            f"`{syntax.code(clip.func)}(...)` runs inside `with amp.scale_loss(...)`, where Apex had not unscaled the "
            "gradients yet: it clipped this backward's still-scaled gradients (after setting aside those accumulated "
            "before it), so its threshold acted about `loss_scale` times more strongly than written; "
            "`scaler.unscale_(optimizer)` before it would clip the true gradients and train differently: left as it "
            "was. If clipping the true gradients is what was meant, move the clip after the `with` block (then run "
            "ampmigrate again)",
        )
    else:
        reader = node if isinstance(node, cst.Call) else outer
        what = f"`{syntax.code(reader.func)}(...)`" if isinstance(reader, cst.Call) else "this code"
        ctx.report(
            "AMP024",
            node,
            f"{what} reads the gradients inside `with amp.scale_loss(...)`, where Apex had not unscaled them yet: it "
            "saw this backward's still-scaled gradients (those accumulated before it set aside), and "
            "`scaler.unscale_(optimizer)` before it would show it the true ones: left as it was. If the true "
            "gradients are meant, move it after the `with` block (then run ampmigrate again)",
        )
    ctx.unfinished.append(node)  # the setup stays as it was (AMP025)


@dataclass
class _Unscale:
    """A statement that reads gradients after a scaled backward: ``scaler.unscale_`` must run
    before it (once per step: GradScaler refuses a second call before ``update``)."""

    statement: cst.CSTNode
    node: cst.Call  # the clip, or the amp.master_params call in it
    access: cst.BaseExpression  # the scaler, as this code reaches it
    optimizer: cst.BaseExpression
    key: str
    step: cst.Call | None
    placed: bool = False  # already written (an if/else of two clips collapsed into unscale_ + clip)


def _unscale_before(
    ctx: ModuleContext,
    model: AmpModel,
    node: cst.Call,
    optimizer: cst.BaseExpression,
    requests: list[_Unscale],
) -> bool:
    """Ask for ``scaler.unscale_(optimizer)`` before ``node``'s statement (``_place_unscales``
    writes it); False if impossible."""
    statement = ctx.statement_of(node)
    if _inside_scale_loss(ctx, model, statement):
        _report_clip_inside_scale_loss(ctx, node)
        return False
    key = optimizer_key(ctx, optimizer, node)
    step = _next_step(ctx, model, node, key)
    if step is None and (caller := _caller_before_conditional_step(ctx, model, node, key)) is not None:
        _report_helper_before_conditional_step(ctx, node, caller)
        return False
    tests = _skipping_tests(ctx, statement, step) if step is not None else []
    # what the clip's line assigns (`norm = clip_grad_norm_(...)`)
    results = _bound_inside(statement) if isinstance(statement, cst.SimpleStatementLine) else set()
    deciding = [
        test
        for test in tests
        if test is not None and any(isinstance(n, cst.Name) and n.value in results for n in ctx.walk(test))
    ]
    if deciding:
        _report_step_decided_by_gradients(ctx, node, deciding[0])
        return False
    if tests:
        return _clip_scaled_gradients(ctx, model, node)
    found = model.scaler_access_or_report(node)
    if found is None:
        return False
    requests.append(_Unscale(statement, node, found.expression, optimizer, key, step))
    return True


def _place_unscales(ctx: ModuleContext, model: AmpModel, requests: list[_Unscale]) -> None:
    """One ``unscale_`` per optimizer and step on every path: before the first statement that
    reads the gradients in each block, when no two of those blocks run in one pass (the
    branches of an ``if``/``else``); else before the statement of their common block that holds
    the first of them, provided a scaled backward runs earlier in that block. Where no such
    place exists, the later reads are reported (AMP028) and the setup stays as it was."""
    groups: dict[tuple[int, str, int], list[_Unscale]] = defaultdict(list)
    for request in requests:
        function = ctx.function_of(request.statement)
        groups[(id(function), request.key, id(request.step))].append(request)
    for group in groups.values():
        collapsed = {id(request.statement) for request in group if request.placed}
        # a read inside a collapsed if/else goes with it
        group = [
            request
            for request in group
            if request.placed or not any(id(node) in collapsed for node in ctx.ancestors(request.statement))
        ]
        group.sort(key=lambda request: ctx.order(request.node))
        by_block: dict[int, list[_Unscale]] = defaultdict(list)
        for request in group:
            by_block[id(ctx.block_of(request.statement))].append(request)
        firsts = [reads[0] for reads in by_block.values()]
        if any(request.placed for reads in by_block.values() for request in reads[1:]):
            _report_reread(ctx, group)  # a collapsed if/else clip after another read of its block
        elif len(firsts) == 1 or _exclusive(ctx, [request.statement for request in firsts]):
            for request in firsts:
                if not request.placed:
                    _write_unscale(ctx, request, request.statement)
        elif any(request.placed for request in firsts):
            _report_reread(ctx, group)
        elif (after := _common_place(ctx, model, [request.statement for request in group])) is not None:
            _write_unscale(ctx, group[0], after, after=True)
        else:
            _report_reread(ctx, group)


def _write_unscale(ctx: ModuleContext, request: _Unscale, statement: cst.CSTNode, after: bool = False) -> None:
    """``scaler.unscale_(optimizer)`` before ``statement`` (or after it)."""
    unscale = _unscale_statement(request.access, request.optimizer)
    (ctx.plan.after if after else ctx.plan.before)[statement].append(unscale)


def _unscale_statement(scaler: cst.BaseExpression, optimizer: cst.BaseExpression) -> cst.SimpleStatementLine:
    return syntax.expression_statement(syntax.attribute_call(scaler, "unscale_", [cst.Arg(optimizer.deep_clone())]))


def _exclusive(ctx: ModuleContext, statements: list[cst.CSTNode]) -> bool:
    """Whether no two of ``statements`` run in one pass: each pair sits in different branches
    of an ``if``/``elif``/``else`` or in different cases of a ``match``."""
    for index, first in enumerate(statements):
        for second in statements[index + 1 :]:
            above_second = {id(node) for node in ctx.ancestors(second)}
            common = next((node for node in ctx.ancestors(first) if id(node) in above_second), None)
            if isinstance(common, cst.Match):
                continue  # the innermost node above both: they are in different cases
            if not isinstance(common, cst.If) or {arm(ctx, common, first), arm(ctx, common, second)} != {True, False}:
                return False
    return True


def _common_place(ctx: ModuleContext, model: AmpModel, statements: list[cst.CSTNode]) -> cst.CSTNode | None:
    """The statement after which one ``unscale_`` serves all ``statements``: in the innermost
    block holding them all, the last statement with a scaled backward before the one holding
    the first of them (where Apex unscaled); None when there is none."""
    chains = [[statement, *ctx.ancestors(statement)] for statement in statements]
    holding = [{id(node) for node in chain} for chain in chains]
    block = next(
        (
            node
            for node in chains[0]
            if isinstance(node, (cst.IndentedBlock, cst.Module)) and all(id(node) in ids for ids in holding)
        ),
        None,
    )
    if block is None:
        return None
    body = [id(statement) for statement in block.body]

    def index_in_block(node: cst.CSTNode) -> int | None:
        for current in [node, *ctx.ancestors(node)]:
            if id(current) in body and ctx.parent(current) is block:
                return body.index(id(current))
        return None

    first = min(index for index in map(index_in_block, statements) if index is not None)
    backwards = [index for index in map(index_in_block, model.sites) if index is not None and index < first]
    return block.body[max(backwards)] if backwards else None


def _report_reread(ctx: ModuleContext, group: list[_Unscale]) -> None:
    """AMP028 at each read after the first; each stays as it was (and so does the setup)."""
    first = ctx.position(group[0].node)[0]
    optimizer = syntax.code(group[0].optimizer)
    for request in group[1:]:
        ctx.report(
            "AMP028",
            request.node,
            f"the gradients of `{optimizer}` are read here and at line {first} under different conditions before "
            f"the same step, and no one place after the scaled backward runs before both: GradScaler unscales once "
            f"per step (a second `unscale_` raises), so the setup was left as it was. Apex unscaled right after the "
            f"backward: call `scaler.unscale_({optimizer})` there once, and read the gradients after it",
        )
        ctx.unfinished.append(request.node)


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
    direct = isinstance(node, cst.Call) and (is_clip(node.func) or _gradient_norm(ctx, node))
    clip = node if direct else _call_around(ctx, node)
    name = dotted_name(clip.func) if isinstance(clip, cst.Call) else None
    parameters = _SCALABLE_CLIPS.get((name or "").split(".")[-1])
    bound = syntax.bind_arguments(clip, parameters, partial=True) if parameters and isinstance(clip, cst.Call) else {}
    threshold = bound.get(parameters[1]) if parameters else None
    if parameters is None and isinstance(clip, cst.Call) and _gradient_norm(ctx, clip):
        return _divide_gradient_norm(ctx, model, node, clip, name or "")
    if threshold is None or not isinstance(clip, cst.Call):
        if isinstance(clip, cst.Call) and parameters is None:
            # a clipper of the project's own (a GradientClipper.step): its threshold is out of reach
            ctx.report(
                "AMP024",
                node,
                f"`{syntax.code(clip.func)}({'...' if direct else 'amp.master_params(...)'})` runs after every "
                "backward pass while the "
                "optimizer steps only on some (gradient accumulation): Apex gave it the unscaled gradients, GradScaler "
                "unscales once per step, and it is not torch's clip_grad_norm_/clip_grad_value_ (whose threshold "
                "times `scaler.get_scale()` clips the still-scaled gradients exactly): left as it was. For a clip, "
                "call `torch.nn.utils.clip_grad_norm_(params, max_norm)` there and run ampmigrate again; for a norm, "
                "divide what it computes on the scaled gradients by `scaler.get_scale()`; or move it under the step's "
                "condition after `scaler.unscale_(optimizer)` (once per step: a clip there changes training)",
            )
        else:
            ctx.report("AMP024", node)
        ctx.unfinished.append(node)  # the setup stays as it was (AMP025), as the finding says
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
    if name and name.endswith("clip_grad_norm_"):
        _divide_by_scale(ctx, clip, scale)  # the norm it returns is of the scaled gradients: report Apex's
    return True


def _divide_by_scale(ctx: ModuleContext, call: cst.Call, scale: cst.BaseExpression) -> None:
    """``call(...)`` -> ``call(...) / scaler.get_scale()`` where its value is used."""
    if isinstance(ctx.parent(call), cst.Expr):
        return
    divided = scale.deep_clone()

    def unscaled(updated: cst.CSTNode, divided: cst.BaseExpression = divided) -> cst.CSTNode:
        assert isinstance(updated, cst.Call)
        return cst.BinaryOperation(left=updated, operator=cst.Divide(), right=divided)

    ctx.plan.replace[call] = unscaled


def _gradient_norm(ctx: ModuleContext, call: cst.Call) -> bool:
    """Whether ``call`` is of a function proven to compute a norm of the gradients of what it is
    given first: imported (``ModuleFacts.gradient_norms``) or defined here."""
    name = dotted_name(call.func)
    if name is None or not call.args or call.args[0].keyword is not None or call.args[0].star:
        return False
    if name in ctx.options.facts.gradient_norms:
        return True
    return "." not in name and name in ctx.gradient_norms


def _divide_gradient_norm(ctx: ModuleContext, model: AmpModel, node: cst.CSTNode, call: cst.Call, name: str) -> bool:
    """A norm of the gradients after every micro-batch: of the scaled ones, divided by the scale."""
    found = model.scaler_access_or_report(node)
    if found is None:
        return False
    _divide_by_scale(ctx, call, syntax.attribute_call(found.expression, "get_scale"))
    ctx.report(
        "AMP027",
        call,
        f"`{name}(...)` computes a norm of the gradients it is given (its code shows it): after every micro-batch "
        "it now reads the still-scaled gradients, and what it returns is divided by `scaler.get_scale()`, the norm "
        "Apex gave it on the unscaled ones (up to rounding)",
    )
    return True


def _plan_one(ctx: ModuleContext, model: AmpModel, use: AmpCall, requests: list[_Unscale]) -> None:
    call = use.call
    if ctx.skipped(call) or use.base in ctx.consumed:
        return  # left as the user asked, or folded away by an earlier rule (hf_trainer_apex_backend)
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
    argument = _argument_of(ctx, call)
    outer = ctx.parent(argument) if isinstance(argument, cst.Arg) else None
    direct = argument is ctx.parent(call)  # not an arm of a conditional expression
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
        collapsible = _collapsible_else(ctx, statement, optimizer) if is_clip(outer.func) else None
        if collapsible is not None and _steps_every_time(ctx, model, call, optimizer, collapsible):
            found = model.scaler_access_or_report(call)
            if found is None:
                return
            unscale = _unscale_statement(found.expression, optimizer)
            other = cast(
                cst.SimpleStatementLine, cast(cst.IndentedBlock, cast(cst.Else, collapsible.orelse).body).body[0]
            )
            ctx.plan.replace_statement[collapsible] = [unscale, other.with_changes(leading_lines=())]
            key = optimizer_key(ctx, optimizer, call)
            step = _next_step(ctx, model, call, key)
            requests.append(_Unscale(collapsible, call, found.expression, optimizer, key, step, placed=True))
            ctx.consumed.add(use.base)
            return
        if not _unscale_before(ctx, model, call, optimizer, requests):
            return
        replacement = _parameters_of(optimizer)
        if len(outer.args) == 1 and direct:
            replacement = replacement.with_changes(lpar=[], rpar=[])
        ctx.plan.substitute(call, replacement)
    elif outer_name == "list" and len(outer.args) == 1 and direct:  # type: ignore[union-attr]
        ctx.plan.substitute(outer, _parameters_of(optimizer, as_list=True))  # type: ignore[arg-type]
    else:
        replacement = _parameters_of(optimizer)
        if isinstance(outer, cst.Call) and len(outer.args) == 1 and direct:
            replacement = replacement.with_changes(lpar=[], rpar=[])
        ctx.plan.substitute(call, replacement)
    ctx.consumed.add(use.base)


def _steps_every_time(
    ctx: ModuleContext, model: AmpModel, call: cst.Call, optimizer: cst.BaseExpression, branch: cst.If
) -> bool:
    """Whether the clip's if/else can become ``unscale_`` + the fp32 clip: the optimizer steps
    after every pass through it, and it is not inside the ``scale_loss`` block. Else each arm
    goes the way of a lone clip (``_unscale_before``): a clip after every micro-batch of an
    accumulation loop clips the still-scaled gradients (``_clip_scaled_gradients``)."""
    if _inside_scale_loss(ctx, model, branch):
        return False  # reported on the way that does not collapse
    key = optimizer_key(ctx, optimizer, call)
    step = _next_step(ctx, model, call, key)
    if step is None:
        # a clip helper: each of its calls must be followed by a step every time
        return _caller_before_conditional_step(ctx, model, call, key) is None
    return not _skipping_tests(ctx, branch, step)


def _gradient_readers(ctx: ModuleContext) -> set[str]:
    """Top-level functions of the module that touch ``.grad`` (a norm, a hand-made clip, a
    log of the largest gradient): given the parameters after a scaled backward, they read
    what Apex had already unscaled."""
    return {
        statement.name.value
        for statement in ctx.module.body
        if isinstance(statement, cst.FunctionDef)
        and any(isinstance(node, cst.Attribute) and node.attr.value == "grad" for node in ctx.walk(statement))
    }


def _plan_plain_clips(ctx: ModuleContext, model: AmpModel, requests: list[_Unscale]) -> None:
    """Clips of ``model.parameters()`` after a scaled backward also need ``unscale_``.

    Apex had unscaled the gradients when ``scale_loss`` exited, so clipping the model's
    own parameters was fine; with GradScaler they are still scaled until ``unscale_``.
    Not at O2 with master weights: Apex unscaled only the float32 master copies, so a clip
    of the model's parameters met its scaled float16 gradients, which nothing stepped; that
    setup stays (AMP029).
    """
    if not model.sites:
        return
    site_functions = {ctx.function_of(site) for site in model.sites}
    readers = _gradient_readers(ctx)
    for clip in ctx.nodes_of(cst.Call):
        reads = is_clip(clip.func) or (
            isinstance(clip.func, cst.Name) and clip.func.value in readers and bool(clip.args)
        )
        if not reads or any(
            isinstance(n, cst.Call) and (found := ctx.amp_api(n.func)) is not None and found[0] == "master_params"
            for n in ctx.walk(clip)
        ):
            continue
        if any(ancestor in ctx.plan.replace_statement for ancestor in ctx.ancestors(clip)):
            continue  # the fp32 arm of a clip's if/else that became unscale_ + this clip
        function = ctx.function_of(clip)
        if any(scaler.carried and scaler.function is function for scaler in model.scalers):
            continue  # read through a carrier: amp_scale_loss unscales where Apex's block ended
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
        master = _o2_with_master_weights(ctx, model)
        if (
            master is not None
            and is_clip(clip.func)
            and _clips_module_parameters(ctx, clip)
            and not _opposite_arm_of_the_same_test(ctx, clip, model.sites)
        ):
            ctx.report(
                "AMP029",
                clip,
                f"`{syntax.code(clip.func)}(...)` clips the model's own parameters after the scaled backward of the "
                f"amp.initialize at line {master} (opt_level O2): Apex had unscaled only the float32 master copies, "
                "which the optimizer steps, so this clip acted on the model's still-scaled float16 gradients, which "
                "nothing steps (and on its float32 BatchNorm gradients, unscaled, by a factor set by the scaled norm). "
                "Natively the optimizer steps the model's own float32 parameters: `scaler.unscale_(optimizer)` before "
                "this clip would clip the gradients that are stepped and train differently, so the setup was left as "
                "it was. To keep Apex's update, drop the clip; to clip what is stepped (what Apex asked for with "
                "`amp.master_params(optimizer)`), clip after `scaler.unscale_(optimizer)`",
            )
            ctx.unfinished.append(clip)  # the setup stays as it was (AMP025), as the finding says
            continue
        _unscale_before(ctx, model, clip, optimizer, requests)


def _opposite_arm_of_the_same_test(ctx: ModuleContext, clip: cst.Call, sites: list[cst.Call]) -> bool:
    """Whether ``clip`` sits in the other arm of an ``if`` whose test also guards every scaled
    backward of its function (``if hp.fp16_run: <scaled backward>`` ... ``if hp.fp16_run:
    clip(amp.master_params(opt)) else: clip(model.parameters())``, NVIDIA/tacotron2): the fp32
    path, where no amp setup ran."""
    function = ctx.function_of(clip)
    local_sites = [site for site in sites if ctx.function_of(site) is function]
    if not local_sites:
        return False

    def tests_around(node: cst.CSTNode) -> set[tuple[str, bool]]:
        found = set()
        for ancestor in ctx.ancestors(node):
            if ancestor is function:
                break
            if isinstance(ancestor, cst.If):
                side = arm(ctx, ancestor, node)
                if side is not None:
                    found.add((syntax.normalized(ancestor.test), side))
        return found

    guards = set.intersection(*(tests_around(site) for site in local_sites))
    return any((test, not side) in guards for test, side in tests_around(clip))


def _clips_module_parameters(ctx: ModuleContext, clip: cst.Call) -> bool:
    """Whether the clip's first argument takes a module's ``parameters()`` (not the optimizer's
    param_groups, which under O2 held the float32 master copies)."""
    first = clip.args[0].value if clip.args else None
    return first is not None and any(
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value in ("parameters", "named_parameters")
        for node in ctx.walk(first)
    )


def _o2_with_master_weights(ctx: ModuleContext, model: AmpModel) -> int | None:
    """The line of an amp.initialize of this module at literal opt_level "O2" with an optimizer
    (master weights not turned off): its optimizer stepped float32 master copies of the float16
    model, so a clip of the model's own parameters did not touch what was stepped; None if none.
    traveller59/second.pytorch second/pytorch/train.py clips `net.parameters()` so."""
    for use in model.of("initialize"):
        bound = syntax.bind_arguments(use.call, INITIALIZE_PARAMETERS)
        if not bound or "optimizers" not in bound or "opt_level" not in bound:
            continue
        level = syntax.literal(bound["opt_level"].value)
        if level is ... and isinstance(bound["opt_level"].value, cst.Name):
            level = _assigned_literal(ctx, bound["opt_level"].value.value, use.call)  # `opt_level = "O2"` before
        if level != "O2":
            continue
        if "master_weights" in bound and syntax.literal(bound["master_weights"].value) is False:
            continue  # the optimizer stepped the model's float16 parameters themselves
        return ctx.position(use.call)[0]
    return None


def plan(ctx: ModuleContext) -> None:
    model = ctx.amp
    requests: list[_Unscale] = []
    for use in model.of("master_params"):
        _plan_one(ctx, model, use, requests)
    _plan_plain_clips(ctx, model, requests)
    _place_unscales(ctx, model, requests)
