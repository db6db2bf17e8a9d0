'''amp_state_dict: ``amp.state_dict()`` and ``amp.load_state_dict(sd)``.

What it rewrites
    Both become the GradScaler's own methods. Loading goes through a small helper written
    once into the module, which accepts a GradScaler state dict as well as one saved by
    Apex (``{"loss_scaler0": {"loss_scale": ..., "unskipped": ...}}``), so old runs can be
    resumed.

Before::

    import torch
    from apex import amp

    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    if args.resume:
        checkpoint = torch.load(args.resume)
        amp.load_state_dict(checkpoint["amp"])
    train(model, optimizer)
    torch.save({"model": model.state_dict(), "amp": amp.state_dict()}, path)

After::

    import torch


    def grad_scaler_state(state):
        """A GradScaler state dict from one saved by GradScaler or by apex.amp.state_dict()."""
        if "loss_scaler0" not in state:
            return state
        apex_state = state["loss_scaler0"]
        unskipped = apex_state["unskipped"]
        return {
            "scale": float(apex_state["loss_scale"]),
            "growth_factor": 2.0,
            "backoff_factor": 0.5,
            "growth_interval": 2000,
            # Apex counted clean steps without bound under a static scale
            "_growth_tracker": unskipped if unskipped < 2000 else 0,
        }


    scaler = torch.amp.GradScaler("cuda")
    if args.resume:
        checkpoint = torch.load(args.resume)
        scaler.load_state_dict(grad_scaler_state(checkpoint["amp"]))
    train(model, optimizer)
    torch.save({"model": model.state_dict(), "amp": scaler.state_dict()}, path)

Not rewritten (reported instead)
    Calls where no GradScaler is reachable (AMP022, AMP023).

Safety
    An Apex checkpoint's scale and clean-step count carry over; growth factor 2, backoff
    0.5 and interval 2000 were fixed for ``amp.initialize`` users. With ``num_losses > 1``
    only ``loss_scaler0`` is used (one GradScaler serves every loss).

References
    NVIDIA/apex@e13873d: apex/amp/frontend.py (state_dict, load_state_dict);
    pytorch/pytorch: torch/amp/grad_scaler.py (state_dict); ../shared/apex-semantics.md 3.3.
'''

from __future__ import annotations

import libcst as cst

from migrate.rules import _syntax as syntax
from migrate.rules._context import ModuleContext

RULE = "amp_state_dict"

_HELPER = '''\
def {name}(state):
    """A GradScaler state dict from one saved by GradScaler or by apex.amp.state_dict()."""
    if "loss_scaler0" not in state:
        return state
    apex_state = state["loss_scaler0"]
    unskipped = apex_state["unskipped"]
    return {{
        "scale": float(apex_state["loss_scale"]),
        "growth_factor": 2.0,
        "backoff_factor": 0.5,
        "growth_interval": 2000,
        # Apex counted clean steps without bound under a static scale
        "_growth_tracker": unskipped if unskipped < 2000 else 0,
    }}
'''


def plan(ctx: ModuleContext) -> None:
    model = ctx.amp
    helper_name: str | None = None
    for use in [*model.of("state_dict"), *model.of("load_state_dict")]:
        call = use.call
        if ctx.skipped(call):
            continue
        found = model.scaler_access_or_report(call)
        if found is None:
            continue
        _, access = found
        if use.api == "state_dict":
            if call.args:
                ctx.report(
                    "AMP032",
                    call,
                    "amp.state_dict(destination) is not migrated: write `destination.update(scaler.state_dict())`",
                )
                continue
            ctx.plan.substitute(call, call.with_changes(func=cst.Attribute(access, cst.Name("state_dict"))))
        else:
            bound = syntax.bind_arguments(call, ("state_dict",))
            if bound is None or "state_dict" not in bound:
                ctx.report(
                    "AMP032",
                    call,
                    "amp.load_state_dict takes one state dict: write `scaler.load_state_dict(state)`, an Apex "
                    'checkpoint\'s state converted to `{"scale": float(state["loss_scaler0"]["loss_scale"])}`',
                )
                continue
            if helper_name is None:
                helper_name = ctx.fresh_name("grad_scaler_state")
                ctx.plan.module_helpers.append(cst.parse_statement(_HELPER.format(name=helper_name)))

            def load(updated: cst.CSTNode, a=access, helper=helper_name) -> cst.CSTNode:
                assert isinstance(updated, cst.Call)
                # `amp.load_state_dict(state_dict=sd)`: the helper takes the state positionally
                state = updated.args[0].with_changes(
                    comma=cst.MaybeSentinel.DEFAULT, keyword=None, equal=cst.MaybeSentinel.DEFAULT
                )
                converted = syntax.call(helper, [state])
                return updated.with_changes(
                    func=cst.Attribute(a, cst.Name("load_state_dict")), args=[cst.Arg(converted)]
                )

            ctx.plan.replace[call] = load
        ctx.consumed.add(use.base)
