"""amp_init: the old Apex amp API, ``handle = amp.init(...)``, becomes a ``torch.amp.GradScaler``.

What it rewrites
    ``amp.init`` patched torch as O1 does and returned a handle whose ``scale_loss`` used one
    dynamic loss scaler: the same setup as ``amp.initialize`` at O1. The call becomes the
    GradScaler, created where the handle was (``enabled=`` and a guarding ``if`` flow into the
    scaler's ``enabled=``, as for ``amp.initialize``), and ``handle = None`` placeholders go.
    ``opt = handle.wrap_optimizer(opt, num_loss=N)`` goes too (the wrapper forwarded everything
    to the optimizer). ``with handle.scale_loss(loss, opt)`` and ``with opt.scale_loss(loss)``
    on a wrapper then migrate as ``amp.scale_loss`` does: autocast over the forward pass and
    the loss, ``scaler.scale(loss).backward()``, ``scaler.step(opt)`` and ``scaler.update()``.
    A module-level function that every caller passes the handle to gets the scaler instead,
    in a parameter renamed after it (``train(model, scaler)``, ``def train(model, scaler):``).

Before::

    import torch
    from apex import amp

    amp_handle = amp.init(enabled=args.fp16)
    for images, target in loader:
        output = model(images)
        loss = criterion(output, target)
        optimizer.zero_grad()
        with amp_handle.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()

After::

    import torch

    scaler = torch.amp.GradScaler("cuda", enabled=bool(args.fp16))
    for images, target in loader:
        with torch.autocast("cuda", dtype=torch.float16, enabled=bool(args.fp16)):
            output = model(images)
            loss = criterion(output, target)
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

Not rewritten (reported instead)
    ``amp.init`` whose handle is not assigned to a name or attribute (AMP010), given a
    second positional argument (it was ``enable_caching`` before February 2019 and
    ``loss_scale`` after: AMP010), or ``allow_banned=True`` (AMP005: Apex then ran
    ``binary_cross_entropy`` in float32, torch.autocast raises on it). A handle used any other
    way (tested, stored elsewhere, ``handle._deactivate()``) keeps the
    whole setup as it was (AMP030/AMP032, and AMP025 at the call). A model the module makes an
    optimizer for (``X.parameters()``) that receives an input cast to float16 by hand
    (``X(img.half())``) or is cast to float16 itself (``X.half()``), and an unused handle (inference)
    in a module that casts to float16 by hand, keep the call as it was (AMP005): Apex's patched
    functions cast the other side of each op to match wherever it ran, autocast would cover the
    training step alone. So does a handle passed to a
    function that some caller calls without it, or to a function of another module; a
    module-level handle that another module of the project imports is reported (AMP030).

Safety
    Exact up to autocast's op lists (AMP012), as O1 is: same dynamic scale rule (2**16, halved
    and the step skipped on overflow, doubled after 2000 clean steps), ``enabled=False`` turns
    both off. ``enable_caching`` and ``verbose`` change neither numerics nor control flow and
    go. Each wrapper kept one scaler per loss (``num_loss``); one GradScaler now serves all
    losses and optimizers (AMP004), as for ``amp.initialize(num_losses=N)``.

References
    NVIDIA/apex@cb65b8e^: apex/amp/amp.py (``init``), apex/amp/handle.py (``AmpHandle``,
    ``NoOpHandle``), apex/amp/opt.py (``OptimWrapper``), apex/amp/scaler.py; the transition
    guide in docs/source/amp.rst; ../shared/apex-semantics.md sections 1.7 and 2.5.
"""

from __future__ import annotations

import libcst as cst

from migrate.rules import _syntax as syntax
from migrate.rules._amp import AmpCall, AmpModel
from migrate.rules._context import ModuleContext
from migrate.rules._handles import Handle, Received, Wrapper
from migrate.rules.amp_initialize import SetupCall, float16_by_hand, plan_setup

RULE = "amp_init"

# amp.init's parameters from February 2019 on (before, ``loss_scale`` was not there and the
# second positional argument was ``enable_caching``: only the first is taken by position)
PARAMETERS = ("enabled", "loss_scale", "enable_caching", "verbose", "allow_banned")
_CREATE = 'create `scaler = torch.amp.GradScaler("cuda", enabled=...)` where the handle was'


def _use(model: AmpModel, call: cst.Call) -> AmpCall | None:
    return next((use for use in model.calls if use.call is call), None)


def _arguments(ctx: ModuleContext, call: cst.Call) -> dict[str, cst.Arg] | None:
    """``amp.init``'s arguments by name; None (reported) where they cannot be read safely."""
    positional = [arg for arg in call.args if arg.keyword is None]
    bound = syntax.bind_arguments(call, PARAMETERS) if len(positional) <= 1 else None
    if bound is None:
        unknown = [arg.keyword.value for arg in call.args if arg.keyword and arg.keyword.value not in PARAMETERS]
        if len(positional) > 1:
            what = (
                "a second positional argument (enable_caching before February 2019, loss_scale after): "
                "write it as a keyword"
            )
        elif unknown:
            what = f"the keyword {', '.join(unknown)} (not an amp.init argument)"
        else:
            what = "*args/**kwargs"
        ctx.report("AMP010", call, f"amp.init with {what}; then run ampmigrate again, or {_CREATE}")
        return None
    banned = bound.get("allow_banned")
    if banned is not None and syntax.literal(banned.value) is not False:
        ctx.report(
            "AMP005",
            banned,
            "allow_banned=True made Apex run F.binary_cross_entropy / nn.BCELoss in float32, and torch.autocast "
            'raises on them: compute that loss under `with torch.autocast("cuda", enabled=False):` on `.float()` '
            "inputs, delete allow_banned, then run ampmigrate again",
        )
        return None
    return bound


def _drop_wrapper(ctx: ModuleContext, wrapper: Wrapper) -> None:
    """``opt = handle.wrap_optimizer(opt, ...)`` goes; another target becomes ``target = opt``."""
    call = wrapper.call
    ctx.consumed.add(call.func.value)  # type: ignore[attr-defined]
    bound = syntax.bind_arguments(call, ("optimizer", "num_loss")) or {}
    if "num_loss" in bound and syntax.literal(bound["num_loss"].value) != 1:
        ctx.report(
            "AMP004",
            bound["num_loss"],
            "num_loss was dropped: the wrapper kept a loss scaler per loss, one GradScaler now serves every loss",
        )
    target, optimizer = wrapper.owner.target, syntax.strip_parens(wrapper.optimizer)
    if syntax.normalized(target) == syntax.normalized(optimizer):
        ctx.plan.remove.add(wrapper.statement)
    else:
        ctx.plan.replace_statement[wrapper.statement] = [syntax.assign_statement(target, optimizer.deep_clone())]


def _plan_handle(ctx: ModuleContext, model: AmpModel, handle: Handle, shared: set[str]) -> None:
    call = handle.call
    use = _use(model, call)
    if use is None or ctx.skipped(call):
        return
    if handle.owner is not None and handle.owner.key in shared:
        ctx.report("AMP010", call, f"`{handle.owner.key}` is assigned by several amp.init calls: {_CREATE}, once")
        return
    exported = ctx.options.facts.exported
    if handle.owner is not None and handle.owner.function is None and ({handle.owner.key, "*"} & exported):
        ctx.report(
            "AMP030",
            call,
            f"`{handle.owner.key}` is imported by another module of the project: the handle cannot be "
            f"followed there; {_CREATE} and import the scaler instead, then run ampmigrate again",
        )
        return
    bound = _arguments(ctx, call)
    if bound is None:
        return
    handles = ctx.handles
    references = handles.references(handle)
    if not references:
        # the handle is never used: Apex cast ops globally for inference, nothing to scale
        cast = float16_by_hand(ctx, call)
        enabled = bound["enabled"].value if "enabled" in bound else None
        if cast is not None and (enabled is None or syntax.literal(enabled) is not False):
            # the use is not consumed: the call stays as it was
            ctx.report(
                "AMP005",
                call,
                "amp.init without a loss to scale (inference) left as it was: this module casts to float16 by hand "
                f"(line {ctx.position(cast)[0]}: `{ctx.code(cast)}`), and Apex's patched ops cast the other side "
                "of each op to match wherever it ran; without the call a float16 tensor or model would meet float32 "
                "ones (a dtype mismatch where Apex ran): to migrate by hand, drop those casts and run the inference "
                'under `with torch.autocast("cuda", dtype=torch.float16):`, then run ampmigrate again',
            )
            return
        ctx.consumed.add(use.base)
        handle.migrated = True
        scope = ctx.scope_of(call)
        if any(ctx.scope_of(i.call) is scope and ctx.order(i.call) < ctx.order(call) for i in ctx.amp.of("initialize")):
            # after amp.initialize it only patched the ops again, with the casts registered before it
            # (hirofumi0810/neural_sp), which the registration rule writes as wrappers
            message = (
                "amp.init after amp.initialize only patched the ops again, applying the casts registered before "
                "it; the call was removed: the amp.initialize's autocast covers the training step"
            )
        else:
            message = (
                "amp.init without a loss to scale (inference): Apex cast every op to float16 globally; the call "
                'was removed: wrap the inference code in `with torch.autocast("cuda", dtype=torch.float16):` '
                "for float16 inference"
            )
        ctx.report("AMP011", call, message)
        ctx.plan.remove.add(handle.statement)
        ctx.plan.remove.update(handle.resets)
        return
    if handle.wrappers:
        # every OptimWrapper made its own dynamic scalers: the handle's loss_scale served nobody
        bound.pop("loss_scale", None)
    setup: dict[str, cst.Arg] = {name: bound[name] for name in ("enabled", "loss_scale") if name in bound}
    plan_setup(ctx, model, SetupCall(use, handle.statement, setup, cst.List([]), False, None))
    if use.base not in ctx.consumed:
        return
    handle.migrated = True
    ctx.plan.remove.update(handle.resets)
    for wrapper in handle.wrappers:
        _drop_wrapper(ctx, wrapper)
    for received in handle.received:
        _pass_scaler(ctx, model, received)


def _pass_scaler(ctx: ModuleContext, model: AmpModel, received: Received) -> None:
    """``train(..., amp_handle)`` passes the scaler instead, and ``def train(..., amp_handle)``
    names it as the scaler."""
    scaler = next(s for s in model.scalers if s.initialize is received.handle.call)
    name = cst.Name(scaler.name)
    ctx.plan.substitute(received.param.name, name)
    for argument in received.arguments:
        access = model.scaler_access(argument)
        if access is None:  # the caller is in the scaler's home: ruled out by _home otherwise
            continue
        ctx.consumed.add(argument.value)
        ctx.plan.substitute(argument.value, access.expression.deep_clone())
        if argument.keyword is not None:
            ctx.plan.substitute(argument.keyword, name.deep_clone())


def plan(ctx: ModuleContext) -> None:
    handles = ctx.handles
    if not handles.any and not handles.unsupported:
        return
    model = ctx.amp
    for call in handles.unsupported:
        ctx.report(
            "AMP010",
            call,
            "amp.init is not assigned to a name or `self.<name>` the tool can follow: assign its handle "
            f"(`amp_handle = amp.init(...)`) and run ampmigrate again, or {_CREATE}",
        )
    keys = [handle.owner.key for handle in handles.handles if handle.owner is not None]
    shared = {key for key in keys if keys.count(key) > 1}
    for handle in handles.handles:
        _plan_handle(ctx, model, handle, shared)
