"""amp_private_state: Apex's private amp state (``amp._amp_state``) and its switches.

What it rewrites
    Reading the loss scale (``amp._amp_state.loss_scalers[0].loss_scale()`` or
    ``._loss_scale``) becomes ``scaler.get_scale()`` where the GradScaler that replaces
    ``amp.initialize`` is reachable (as for ``amp.state_dict()``). Setting it
    (``..._loss_scale = 2**20``) as the statement right after ``amp.initialize`` becomes
    that GradScaler's ``init_scale``. A comprehension or loop over the loss scalers that only
    reads each scale (``{f"scale_{i}": s._loss_scale for i, s in enumerate(amp._amp_state.loss_scalers)}``)
    iterates over ``[scaler]`` and reads ``s.get_scale()`` (a loop only where its name is not used
    outside it), for an amp.initialize with one loss; with a literal ``num_losses=N``, over
    ``[scaler] * N``. The switches that only relaxed Apex's own checks or
    messages (``allow_incoming_model_not_fp32``, ``hard_override``, ``verbosity``) are
    deleted. Every spelling counts: ``amp._amp_state``, ``apex.amp._amp_state``,
    ``from apex.amp import _amp_state`` and ``from apex.amp._amp_state import _amp_state``.

Before::

    import torch
    from apex import amp

    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    amp._amp_state.loss_scalers[0]._loss_scale = 2**20
    for x, y in loader:
        loss = criterion(model(x), y)
        optimizer.zero_grad()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
        writer.add_scalar("loss_scale", amp._amp_state.loss_scalers[0].loss_scale())

After::

    import torch

    scaler = torch.amp.GradScaler("cuda", init_scale=1048576.0)
    for x, y in loader:
        with torch.autocast("cuda", dtype=torch.float16):
            loss = criterion(model(x), y)
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        writer.add_scalar("loss_scale", scaler.get_scale())

Not rewritten (reported instead, AMP031 with the code to write)
    A loss scaler other than the first, or any with ``num_losses > 1`` (one GradScaler
    replaces them all), but for the loops above where ``num_losses`` is a literal N: they
    iterate over ``[scaler] * N``, each entry the one scale (AMP033 says so); Apex's
    overflow flag (``s._has_overflow``, "this step is skipped": the message names the flag to
    compute around ``scaler.update()``); a LossScaler driven by hand (``update_scale()``,
    ``_overflow_buf``: ``scaler.step``/``scaler.update`` do that work); a scale set anywhere
    but right after ``amp.initialize``, computed at run time, above ``max_loss_scale``, or
    not a power of two where the run may be O0;
    the LossScaler object itself (``s = amp._amp_state.loss_scalers[0]``),
    ``opt_properties``, ``handle`` and other internals; any of them where no GradScaler is
    reachable. Then the whole amp setup stays as it was (AMP025).

Safety
    ``get_scale()`` returns a float as ``loss_scale()`` did, 1.0 when scaling is off (O0,
    ``loss_scale=1.0``), as Apex's static scale of 1. Apex changed the scale at the end of
    each ``scale_loss`` block, GradScaler at ``scaler.update()``: a read between the
    backward and the update can see the scale before this step's overflow halved it. A
    set scale is exact for dynamic scaling and becomes the held scale of a static one; where
    the run may be O0 (no scaling) only a power of two is exact, and only if no read reports
    it (Apex did, a disabled GradScaler says 1.0), so only that is migrated there. Without
    Apex nothing checks that the model comes in as float32 any more: a model made float16
    by hand fails in ``scaler.unscale_`` (AMP033 says so).

References
    NVIDIA/apex@e13873d: apex/amp/_amp_state.py (AmpState), apex/amp/scaler.py
    (LossScaler.loss_scale), apex/amp/_initialize.py (check_params_fp32, loss_scalers);
    pytorch/pytorch: torch/amp/grad_scaler.py (get_scale); ../shared/apex-semantics.md 3.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import libcst as cst

from migrate.rules import _syntax as syntax
from migrate.rules._amp import AmpModel, Scaler
from migrate.rules._bindings import is_import_fallback
from migrate.rules._context import ModuleContext
from migrate.rules._setup import checks_presence

RULE = "amp_private_state"

# AmpState attributes that only relax Apex's own checks or silence its messages
SWITCHES = frozenset({"allow_incoming_model_not_fp32", "hard_override", "verbosity"})
_RELAXING = frozenset({"allow_incoming_model_not_fp32", "hard_override"})
STATE_TARGETS = frozenset({"apex.amp._amp_state._amp_state"})
# amp.initialize(models, optimizers, enabled, opt_level, cast_model_type, patch_torch_functions,
# keep_batchnorm_fp32, master_weights, loss_scale, cast_model_outputs, num_losses, ...)
_NUM_LOSSES_POSITION = 10


@dataclass(frozen=True)
class StateUse:
    """One expression that stands for Apex's AmpState (or, for a switch, the amp module)."""

    root: cst.BaseExpression
    base: cst.Name  # the Name bound by the Apex import (consumed when rewritten)


@dataclass(frozen=True)
class Shape:
    """What the code around a ``StateUse`` does with it."""

    kind: str  # "read", "write", "switch", "other"
    node: cst.CSTNode  # the expression replaced ("read") or the statement ("write", "switch")
    index: int | None = None  # the loss scaler's index
    attribute: str | None = None  # the attribute set ("write", "switch")
    value: cst.BaseExpression | None = None  # what is assigned


@dataclass(frozen=True)
class Each:
    """``for s in <state>.loss_scalers`` (or ``enumerate(...)`` of it), in a loop or a comprehension."""

    loop: cst.For | cst.CompFor
    comprehension: cst.BaseExpression | None  # the comprehension around a CompFor
    name: str | None  # the name each LossScaler is bound to (None: another target)
    reads: tuple[cst.BaseExpression, ...]  # ``s._loss_scale`` and ``s.loss_scale()``
    overflows: tuple[cst.Attribute, ...]  # ``s._has_overflow``
    others: bool  # any other use of the name


_COMPREHENSIONS = (cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)
_BINDING_PARENTS = (cst.AssignTarget, cst.Param, cst.ImportAlias, cst.AsName, cst.CompFor, cst.For)


def iteration(ctx: ModuleContext, scalers: cst.Attribute) -> Each | None:
    """What a loop or comprehension over ``scalers`` (``<state>.loss_scalers``) does with each
    LossScaler; None where ``scalers`` is not what a ``for`` iterates."""
    iterated: cst.BaseExpression = scalers
    parent = ctx.parent(scalers)
    enumerated = False
    if isinstance(parent, cst.Arg):
        call = ctx.parent(parent)
        if not (
            isinstance(call, cst.Call)
            and isinstance(call.func, cst.Name)
            and call.func.value == "enumerate"
            and len(call.args) == 1
            and parent.keyword is None
            and not parent.star
            and not _enumerate_rebound(ctx)
        ):
            return None
        iterated, parent, enumerated = call, ctx.parent(call), True
    if not isinstance(parent, (cst.For, cst.CompFor)) or parent.iter is not iterated:
        return None
    target = parent.target
    if enumerated:
        elements = target.elements if isinstance(target, cst.Tuple) else ()
        second = elements[1].value if len(elements) == 2 else None
        name = second.value if isinstance(second, cst.Name) else None
    else:
        name = target.value if isinstance(target, cst.Name) else None
    comprehension = None
    if isinstance(parent, cst.CompFor):
        comprehension = next((a for a in ctx.ancestors(parent) if isinstance(a, _COMPREHENSIONS)), None)
        if comprehension is None:
            return None
        regions: list[cst.CSTNode] = [comprehension]
    else:
        regions = [parent.body] + ([parent.orelse] if parent.orelse is not None else [])
    reads: list[cst.BaseExpression] = []
    overflows: list[cst.Attribute] = []
    others = name is None
    own_target = {id(node) for node in ctx.walk(target)}
    for region in regions:
        for node in ctx.walk(region):
            if not (isinstance(node, cst.Name) and node.value == name) or id(node) in own_target:
                continue
            member = ctx.parent(node)
            if not (isinstance(member, cst.Attribute) and member.value is node):
                others = True
                continue
            call = ctx.parent(member)
            if member.attr.value == "loss_scale" and isinstance(call, cst.Call) and call.func is member:
                if call.args:
                    others = True
                else:
                    reads.append(call)
            elif member.attr.value == "_loss_scale" and _is_load(ctx, member):
                reads.append(member)
            elif member.attr.value == "_has_overflow" and _is_load(ctx, member):
                overflows.append(member)
            else:
                others = True
    return Each(parent, comprehension, name, tuple(reads), tuple(overflows), others)


def _used_outside(ctx: ModuleContext, loop: cst.For, name: str) -> bool:
    """Whether ``name`` occurs in the scope of ``loop`` (its function, or the module) outside it."""
    inside = {id(node) for node in ctx.walk(loop)}
    scope = ctx.scope_of(loop)
    return any(isinstance(node, cst.Name) and node.value == name and id(node) not in inside for node in ctx.walk(scope))


def _enumerate_rebound(ctx: ModuleContext) -> bool:
    """Whether the module binds the name ``enumerate`` itself (a def, an import, an assignment)."""
    for node in ctx.nodes_of(cst.Name):
        if node.value == "enumerate" and isinstance(
            ctx.parent(node), (*_BINDING_PARENTS, cst.FunctionDef, cst.ClassDef)
        ):
            return True
    return False


def state_uses(ctx: ModuleContext) -> list[StateUse]:
    """Every spelling of ``apex.amp._amp_state`` in code, and switches set on the amp module."""
    uses: list[StateUse] = []
    for name in ctx.reference_names():
        parent = ctx.parent(name)
        binding = ctx.resolve(name.value, name)
        if binding is None:
            continue
        root: cst.BaseExpression | None = None
        if binding.kind == "amp" and isinstance(parent, cst.Attribute):
            if parent.attr.value == "_amp_state" or (
                parent.attr.value in SWITCHES and _assigned_statement(ctx, parent) is not None
            ):
                root = parent
        elif binding.kind == "apex" and isinstance(parent, cst.Attribute) and parent.attr.value == "amp":
            outer = ctx.parent(parent)
            if isinstance(outer, cst.Attribute) and outer.value is parent and outer.attr.value == "_amp_state":
                root = outer
        elif (binding.kind == "amp_function" and binding.target == "_amp_state") or (
            binding.kind == "other_apex" and binding.target in STATE_TARGETS
        ):
            root = name
        if root is None or any(isinstance(a, (cst.Import, cst.ImportFrom)) for a in ctx.ancestors(name)):
            continue
        if root is name and (is_import_fallback(ctx, name) or checks_presence(ctx, name)):
            continue  # `_amp_state = None` after a failed import, `if _amp_state is not None:`
        uses.append(StateUse(root, name))
    return uses


def is_state_name(ctx: ModuleContext, name: cst.Name) -> bool:
    """Whether ``name`` is bound to the AmpState object itself (``from apex.amp import _amp_state``)."""
    binding = ctx.resolve(name.value, name)
    return binding is not None and (
        (binding.kind == "amp_function" and binding.target == "_amp_state")
        or (binding.kind == "other_apex" and binding.target in STATE_TARGETS)
    )


def _assigned_statement(ctx: ModuleContext, target: cst.CSTNode) -> cst.SimpleStatementLine | None:
    """The line ``target = value`` when ``target`` is its only target and the line holds nothing else."""
    assign_target = ctx.parent(target)
    assign = ctx.parent(assign_target) if isinstance(assign_target, cst.AssignTarget) else None
    line = ctx.parent(assign) if isinstance(assign, cst.Assign) else None
    if (
        isinstance(assign, cst.Assign)
        and len(assign.targets) == 1
        and isinstance(line, cst.SimpleStatementLine)
        and len(line.body) == 1
    ):
        return line
    return None


def _is_load(ctx: ModuleContext, node: cst.CSTNode) -> bool:
    """Whether ``node`` is read, not assigned, augmented or deleted."""
    parent = ctx.parent(node)
    if isinstance(parent, (cst.AssignTarget, cst.Del)) or (isinstance(parent, cst.AugAssign) and parent.target is node):
        return False
    if isinstance(parent, cst.AnnAssign) and parent.target is node:
        return False
    return not isinstance(parent, (cst.Element, cst.Tuple, cst.List)) or _is_load(ctx, parent)


def shape(ctx: ModuleContext, use: StateUse) -> Shape:
    """Classify what the code does with a use of the private state."""
    root = use.root
    parent = ctx.parent(root)
    if isinstance(root, cst.Attribute) and root.attr.value in SWITCHES:  # amp.<switch> = value
        return _switch(ctx, root)
    if not (isinstance(parent, cst.Attribute) and parent.value is root):
        return Shape("other", root)
    if parent.attr.value in SWITCHES:
        return _switch(ctx, parent)
    subscript = ctx.parent(parent)
    if parent.attr.value == "loss_scalers" and iteration(ctx, parent) is not None:
        return Shape("each", parent)
    if parent.attr.value != "loss_scalers" or not (
        isinstance(subscript, cst.Subscript) and subscript.value is parent and len(subscript.slice) == 1
    ):
        return Shape("other", root)
    element = subscript.slice[0].slice
    index = syntax.literal(element.value) if isinstance(element, cst.Index) else ...
    if not isinstance(index, int) or isinstance(index, bool):
        return Shape("other", root)
    member = ctx.parent(subscript)
    if not (isinstance(member, cst.Attribute) and member.value is subscript):
        return Shape("other", root, index)
    call = ctx.parent(member)
    if member.attr.value == "loss_scale" and isinstance(call, cst.Call) and call.func is member and not call.args:
        return Shape("read", call, index)
    if member.attr.value == "_loss_scale":
        line = _assigned_statement(ctx, member)
        if line is not None:
            assign = line.body[0]
            assert isinstance(assign, cst.Assign)
            return Shape("write", line, index, "_loss_scale", assign.value)
        if _is_load(ctx, member):
            return Shape("read", member, index)
    return Shape("other", root, index, member.attr.value)


def _switch(ctx: ModuleContext, attribute: cst.Attribute) -> Shape:
    line = _assigned_statement(ctx, attribute)
    if line is None:
        return Shape("other", attribute)
    assign = line.body[0]
    assert isinstance(assign, cst.Assign)
    return Shape("switch", line, None, attribute.attr.value, assign.value)


def _num_losses_is_one(call: cst.Call | None) -> bool:
    """Whether this amp.initialize made one loss scaler (``num_losses`` absent or 1)."""
    return _num_losses(call) == 1


def _num_losses(call: cst.Call | None) -> int | None:
    """How many loss scalers this amp.initialize made (``num_losses``, 1 when absent); None
    where that is not a literal."""
    if call is None or any(arg.star for arg in call.args):
        return None
    for position, arg in enumerate(call.args):
        if (arg.keyword is not None and arg.keyword.value == "num_losses") or (
            arg.keyword is None and position == _NUM_LOSSES_POSITION
        ):
            value = syntax.literal(arg.value)
            return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None
    return 1


def _side_effect_free(node: cst.BaseExpression) -> bool:
    """Literals, names, attributes and comparisons of them: deleting them changes nothing."""
    if syntax.literal(node) is not ...:
        return True
    if isinstance(node, (cst.Name, cst.SimpleString)):
        return True
    if isinstance(node, cst.Attribute):
        return _side_effect_free(node.value)
    if isinstance(node, cst.Comparison):
        return _side_effect_free(node.left) and all(_side_effect_free(c.comparator) for c in node.comparisons)
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Not):
        return _side_effect_free(node.expression)
    return False


# ---------------------------------------------------------------------- set right after initialize
def scale_write_after(ctx: ModuleContext, statement: cst.CSTNode) -> tuple[cst.SimpleStatementLine, float] | None:
    """``amp._amp_state.loss_scalers[0]._loss_scale = <number>`` as the statement right after
    ``statement`` (an ``amp.initialize``) in its block: (that line, the number)."""
    if not ctx.options.rule_enabled(RULE):
        return None
    block = ctx.parent(statement)
    if not isinstance(block, (cst.Module, cst.IndentedBlock)):
        return None
    body = list(block.body)
    position = next((i for i, s in enumerate(body) if s is statement), None)
    if position is None or position + 1 >= len(body):
        return None
    following = body[position + 1]
    for use in state_uses(ctx):
        found = shape(ctx, use)
        if found.kind == "write" and found.node is following and found.index == 0:
            assert isinstance(following, cst.SimpleStatementLine)
            assert found.value is not None
            value = syntax.literal(found.value)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0:
                if not ctx.skipped(following):
                    return following, float(value)
    return None


def reads_scale(ctx: ModuleContext) -> bool:
    """Whether the module reads a loss scale from Apex's private state."""
    return any(shape(ctx, use).kind == "read" for use in state_uses(ctx))


def power_of_two(value: float) -> bool:
    mantissa, _ = math.frexp(value)
    return mantissa == 0.5


# ---------------------------------------------------------------------- the rule
def plan(ctx: ModuleContext) -> None:
    model = ctx.amp
    created = [scaler for scaler in model.scalers if scaler.initialize is not None]
    for use in state_uses(ctx):
        found = shape(ctx, use)
        if ctx.skipped(found.node):
            continue
        if found.kind == "write" and found.node in model.scale_writes:
            ctx.plan.remove.add(found.node)
            ctx.consumed.add(use.base)
            value = model.scale_writes[found.node]
            ctx.report(
                "AMP033",
                found.node,
                f"`{_code(ctx, found.node)}` became the GradScaler's `init_scale={value!r}` "
                "(set right after amp.initialize, it was the scale Apex started from)",
            )
        elif found.kind == "switch" and created and found.value is not None and _side_effect_free(found.value):
            ctx.plan.remove.add(found.node)
            ctx.consumed.add(use.base)
            ctx.report("AMP033", found.node, _switch_note(ctx, found))
        elif found.kind == "each":
            _plan_each(ctx, model, use, found)
        elif found.kind == "read" and found.index == 0:
            scaler = _only_scaler(model)
            if scaler is None:
                continue
            access = model.scaler_access(found.node)
            if access is None:
                continue
            ctx.plan.substitute(found.node, syntax.attribute_call(access.expression, "get_scale"))
            ctx.consumed.add(use.base)
            ctx.report(
                "AMP033",
                found.node,
                f"`{_code(ctx, found.node)}` became `{syntax.code(access.expression)}.get_scale()`: the scale "
                "the next step uses (Apex changed it when a scale_loss block ended, GradScaler at "
                "scaler.update())",
            )


def _plan_each(ctx: ModuleContext, model: AmpModel, use: StateUse, found: Shape) -> None:
    """A comprehension or loop that reads the scale of each of Apex's loss scalers: it iterates
    over ``[scaler]`` and reads ``get_scale()``, exact where amp.initialize made one loss scaler
    (a loop only where its name is not used outside it: after the loop it would hold the
    GradScaler); where it made a literal N > 1 of them, over ``[scaler] * N``: as many entries,
    each the one scale that replaces them (AMP004), a difference only in what is read."""
    scalers = found.node
    assert isinstance(scalers, cst.Attribute)
    each = iteration(ctx, scalers)
    if (
        each is None
        or each.name is None
        or (isinstance(each.loop, cst.For) and _used_outside(ctx, each.loop, each.name))
        or not each.reads
        or each.overflows
        or each.others
        or len(model.scalers) != 1
    ):
        return
    count = _num_losses(model.scalers[0].initialize)
    if count is None:
        return
    access = model.scaler_access(scalers)
    if access is None:
        return
    replacement: cst.BaseExpression = cst.List([cst.Element(access.expression)])
    if count > 1:
        replacement = cst.BinaryOperation(replacement, cst.Multiply(), cst.Integer(str(count)))
    ctx.plan.substitute(scalers, replacement)
    for read in each.reads:
        ctx.plan.substitute(read, syntax.attribute_call(cst.Name(each.name), "get_scale"))
    ctx.consumed.add(use.base)
    became = (
        f"`{_code(ctx, scalers)}` became `{syntax.code(replacement)}` and each LossScaler's scale "
        f"`{each.name}.get_scale()`"
    )
    if count == 1:
        message = (
            f"{became}: amp.initialize made one loss scaler, and the GradScaler replaces it (the scale the next "
            "step uses: Apex changed it when a scale_loss block ended, GradScaler at scaler.update())"
        )
    else:
        message = (
            f"{became}: one GradScaler replaces Apex's {count} per-loss scalers (AMP004), so each of the {count} "
            "entries now reads that one scale where Apex had a scale per loss; only what is read (logged) "
            "differs (Apex changed a scale when a scale_loss block ended, GradScaler at scaler.update())"
        )
    ctx.report("AMP033", scalers, message)


def _only_scaler(model: AmpModel) -> Scaler | None:
    """The one GradScaler of the module, made by an amp.initialize with one loss; else None."""
    if len(model.scalers) != 1:
        return None
    scaler = model.scalers[0]
    return scaler if _num_losses_is_one(scaler.initialize) else None


def _code(ctx: ModuleContext, node: cst.CSTNode) -> str:
    return " ".join(ctx.code(node).split())


def _switch_note(ctx: ModuleContext, found: Shape) -> str:
    text = _code(ctx, found.node)
    if found.value is not None and syntax.literal(found.value) is False:
        return f"`{text}` was deleted: it set Apex's default back"
    line = found.node
    assert isinstance(line, cst.SimpleStatementLine) and isinstance(line.body[0], cst.Assign)
    target = line.body[0].targets[0].target
    owner = target.value if isinstance(target, cst.Attribute) else None
    binding = ctx.resolve(owner.value, owner) if isinstance(owner, cst.Name) else None
    if binding is not None and binding.kind == "amp":
        return f"`{text}` was deleted: Apex never read it (its switches live on amp._amp_state), so it did nothing"
    if found.attribute in _RELAXING:
        return (
            f"`{text}` was deleted: it relaxed amp.initialize's check that models come in as float32 on the "
            "GPU, and that check is gone with Apex; a model made float16 by hand (`.half()`) now fails in "
            '`scaler.unscale_` ("Attempting to unscale FP16 gradients"): keep it float32 under torch.autocast'
        )
    return f"`{text}` was deleted: it only silenced Apex's own messages"


# ---------------------------------------------------------------------- what to write instead
def describe(ctx: ModuleContext, use: StateUse) -> str:
    """The AMP031 message for a use that stays: what it is and the code to write instead."""
    found = shape(ctx, use)
    scaler = ctx.options.scaler_name
    text = _code(ctx, found.node if found.kind != "other" else _outermost(ctx, use.root))
    if found.kind == "read":
        if found.index != 0:
            return (
                f"`{text}` reads the scale of Apex's loss {found.index}: one GradScaler replaces Apex's per-loss "
                f"scalers (num_losses), so write `{scaler}.get_scale()`, the one scale every loss now shares"
            )
        if any(not _num_losses_is_one(call.call) for call in ctx.amp.of("initialize")):
            return (
                f"`{text}` reads the scale of Apex's first loss of several (num_losses): one GradScaler replaces "
                f"them all, so write `{scaler}.get_scale()`, the one scale every loss now shares"
            )
        return (
            f"`{text}` reads Apex's loss scale: write `{scaler}.get_scale()` with the GradScaler that replaces "
            "amp.initialize (pass it here)"
        )
    if found.kind == "write":
        value = _code(ctx, found.value) if found.value is not None else "value"
        return (
            f"`{text}` sets Apex's loss scale: create the GradScaler that replaces amp.initialize with "
            f'`torch.amp.GradScaler("cuda", init_scale={value})` (ampmigrate does that itself once the rest '
            "of the setup migrates, for a number set right after a one-loss amp.initialize; where the run may be "
            "O0 only for a power of two that is not read back: Apex reported it there, a disabled GradScaler "
            "reports 1.0)"
        )
    if found.kind == "each":
        message = _describe_each(ctx, found, scaler)
        if message is not None:
            return message
    if found.kind == "switch":
        return (
            f"`{text}` only relaxed amp.initialize's own checks or messages: delete it together with "
            "amp.initialize (ampmigrate does it where this file's amp.initialize is migrated)"
        )
    if found.attribute == "_scale_seq_len":
        return f'`{text}`: Apex\'s growth interval; write `torch.amp.GradScaler("cuda", growth_interval=...)`'
    if found.index is not None:
        chain = _outermost(ctx, use.root)
        assign = ctx.parent(chain)
        if isinstance(assign, cst.Assign) and assign.value is chain and len(assign.targets) == 1:
            alias = _code(ctx, assign.targets[0].target)
            first = (
                f"delete this line so that `{scaler}` is the GradScaler that replaces amp.initialize"
                if alias == scaler
                else f"write `{alias} = {scaler}` with the GradScaler that replaces amp.initialize"
            )
            settings = _alias_settings(ctx, assign, alias)
            driven = _alias_driven(ctx, assign, alias)
            if driven:
                return (
                    f"`{alias} = {text}` keeps Apex's LossScaler and drives it by hand ({driven}), work "
                    f"GradScaler does itself: {first}; all-reduce the gradients still scaled, then call `{scaler}.step(optimizer)` "
                    f"(it unscales them, checks for inf/NaN and skips the step on one) and `{scaler}.update()`; for "
                    f"Apex's overflow flag keep `scale = {scaler}.get_scale()` before the update: "
                    f"`{scaler}.get_scale() < scale` after it is True only on a skipped step (dynamic scaling lowers "
                    f"the scale then); `{alias}.get_scale()` for each `{alias}.loss_scale()`{settings}"
                )
            return (
                f"`{alias} = {text}` keeps Apex's LossScaler: {first}, and `{alias}.get_scale()` for each "
                f"`{alias}.loss_scale()` (one scale serves every loss){settings}"
            )
        return (
            f"`{text}` uses Apex's LossScaler object: use the GradScaler that replaces amp.initialize instead, "
            f"`{scaler}.get_scale()` for `.loss_scale()` and `{scaler}.state_dict()` for its state"
        )
    member = ctx.parent(use.root)
    attribute = member.attr.value if isinstance(member, cst.Attribute) and member.value is use.root else None
    if attribute == "opt_properties":
        assert isinstance(member, cst.Attribute)
        option = ctx.parent(member)
        if isinstance(option, cst.Attribute) and option.value is member and option.attr.value == "master_weights":
            return (
                f"`{text}` reads whether Apex kept float32 master copies of the weights (O2, or master_weights=True): "
                "under torch.autocast the model's own parameters stay float32 and the optimizer steps them, so no "
                "separate copies exist; code under it that reaches Apex's copies (`optimizer._amp_stash`, "
                "`amp.master_params(optimizer)`) becomes code on the model's parameters"
            )
        return (
            f"`{text}` reads the options amp.initialize settled: torch.autocast keeps none; write the values "
            "themselves (the opt_level string passed, `torch.float16` for cast_model_type)"
        )
    if attribute == "handle":
        return f"`{text}` is Apex's O1 casting handle: torch.autocast has none; delete its uses"
    return (
        f"`{text}` is Apex's private amp state with no torch counterpart: use the GradScaler's public API "
        f"(`{scaler}.get_scale()`, `{scaler}.state_dict()`, `{scaler}.load_state_dict(state)`)"
    )


def _describe_each(ctx: ModuleContext, found: Shape, scaler: str) -> str | None:
    """AMP031 for a loop or comprehension over Apex's loss scalers; None for another use of them."""
    assert isinstance(found.node, cst.Attribute)
    each = iteration(ctx, found.node)
    if each is None or each.name is None:
        return None
    text = _code(ctx, found.node)
    if each.overflows:
        return (
            f"`{each.name}._has_overflow` over `{text}` asks whether Apex skips the step that just ended (a "
            "scale_loss block found an inf/NaN gradient; only with dynamic scaling): one GradScaler replaces the "
            f"per-loss scalers and skips in `{scaler}.step(optimizer)`; where that step runs, keep `scale = "
            f"{scaler}.get_scale()` before `{scaler}.update()`, and use `{scaler}.get_scale() < scale` after it "
            "(True only on a skipped step: dynamic scaling lowers the scale then) instead of this loop"
        )
    if each.reads and not each.others:
        read = _code(ctx, each.reads[0])
        initializes = ctx.amp.of("initialize")
        several = not initializes or any(not _num_losses_is_one(call.call) for call in initializes)
        message = (
            f"`{text}` is iterated to read each of Apex's per-loss scales (`{read}`): one GradScaler replaces them "
            f"all (num_losses), so iterate over `[{scaler}]` with the GradScaler that replaces amp.initialize (pass "
            f"it here) and write `{each.name}.get_scale()`"
        )
        if several:
            message += (
                f"; with several losses one entry remains where each loss had one: `[{scaler}] * num_losses` keeps "
                "one per loss, each the one scale they share (ampmigrate writes that itself where num_losses is a "
                "literal and the GradScaler is in reach)"
            )
        if isinstance(each.loop, cst.For) and _used_outside(ctx, each.loop, each.name):
            message += (
                f"; `{each.name}` is also used outside the loop, where it would then hold the GradScaler: "
                "check those uses"
            )
        return message
    return None


# LossScaler members that code driving it by hand uses: GradScaler's step() and update() do that work
_DRIVING = ("update_scale", "_overflow_buf", "_has_overflow", "clear_overflow_state", "unscale", "unscale_with_stashed")


def _alias_driven(ctx: ModuleContext, assign: cst.Assign, alias: str) -> str:
    """```alias.update_scale()` at line 12, `alias._overflow_buf``: the members of ``_DRIVING``
    read or set on the alias in its scope, each with its first line."""
    scope = ctx.scope_of(assign)
    found: dict[str, int] = {}
    for node in ctx.walk(scope, into_definitions=False):
        if (
            isinstance(node, cst.Attribute)
            and node.attr.value in _DRIVING
            and isinstance(node.value, cst.Name)
            and node.value.value == alias
        ):
            found.setdefault(node.attr.value, ctx.position(node)[0])
    parts = []
    for member in _DRIVING:
        if member in found:
            call = "()" if not member.startswith("_") else ""
            parts.append(f"`{alias}.{member}{call}` at line {found[member]}")
    return ", ".join(parts)


# LossScaler attributes code sets, and the GradScaler argument that does the same from the start
_SETTINGS = {"_loss_scale": "init_scale", "_scale_seq_len": "growth_interval"}


def _alias_settings(ctx: ModuleContext, assign: cst.Assign, alias: str) -> str:
    """``; create it with init_scale=..., growth_interval=...`` for what the code sets on the alias."""
    scope = ctx.scope_of(assign)
    found: dict[str, str] = {}
    for node in ctx.walk(scope, into_definitions=False):
        if not (isinstance(node, cst.Assign) and len(node.targets) == 1):
            continue
        target = node.targets[0].target
        if (
            isinstance(target, cst.Attribute)
            and target.attr.value in _SETTINGS
            and isinstance(target.value, cst.Name)
            and target.value.value == alias
        ):
            found.setdefault(_SETTINGS[target.attr.value], _code(ctx, node.value))
    if not found:
        return ""
    arguments = ", ".join(f"{name}={found[name]}" for name in _SETTINGS.values() if name in found)
    return f'; what it sets goes into the GradScaler: `torch.amp.GradScaler("cuda", {arguments})`'


def _outermost(ctx: ModuleContext, node: cst.CSTNode) -> cst.CSTNode:
    """The longest attribute/subscript/call chain that starts at ``node``."""
    current = node
    parent = ctx.parent(current)
    while (
        isinstance(parent, (cst.Attribute, cst.Subscript))
        and parent.value is current
        or isinstance(parent, cst.Call)
        and parent.func is current
    ):
        current = parent
        parent = ctx.parent(current)
    return current
