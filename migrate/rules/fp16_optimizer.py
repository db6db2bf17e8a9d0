"""fp16_optimizer: ``apex.fp16_utils.FP16_Optimizer`` and its helpers.

What it rewrites
    ``optimizer = FP16_Optimizer(optimizer, ...)`` goes (the wrapped optimizer is the
    optimizer) and a GradScaler takes its place, created before the ``if`` that guards the
    construction, with ``enabled=`` that guard. The model stays float32: ``model.half()``,
    ``model = network_to_half(model)``, ``FP16Model(model)`` and ``BN_convert_float(model.half())``
    under the same guard go (a test repeated around the set-up, ``if a: if b: model.half()`` then ``if a: if b:``
    set-up nested in ``if a:``, counts once where nothing between assigns what it reads), and the forward
    pass and loss run under ``torch.autocast``. So does a
    later ``model.half()`` of that model after the set-up under the same guard and more tests (a
    float32 checkpoint saved in the loop: ``model.float()``, save, ``if fp16: model.half()``): it
    only re-halved the model FP16_Optimizer trains, and ``model.float()`` is a no-op on the float32 model.
    So does a ``model.half()`` before the set-up under a part of its guards (``if args.fp16:`` for a
    set-up under ``if args.cuda and args.fp16:``) when the optimizer was a torch.optim one and every
    ``.backward()`` of the module is ``optimizer.backward(loss)`` under the half's test (or
    ``loss.backward()`` in its ``else``): where the half's test held alone, Apex's first
    ``optimizer.backward`` raised AttributeError, so only the set-up's path trained.
    ``optimizer.backward(loss)`` becomes ``scaler.scale(loss).backward()`` (and
    ``if fp16: optimizer.backward(loss) else: loss.backward()`` one such line),
    ``optimizer.step()`` ``scaler.step(optimizer)`` then ``scaler.update()``,
    ``optimizer.clip_master_grads(n)`` ``scaler.unscale_(optimizer)`` then a clip of that
    optimizer's parameters (its norm is kept), ``optimizer.loss_scale`` ``scaler.get_scale()``;
    ``optimizer.zero_grad()`` zeroes the gradients as FP16_Optimizer did (``set_to_none=False``
    where apex.fp16_utils' version zeroed them). ``to_python_float(t)`` becomes ``t.item()``.
    In a module with no FP16_Optimizer (fp16 inference), ``network_to_half(net)`` becomes
    ``half_network(net)``, Apex's function in plain torch written into the module (the same
    Sequential, so the same ``1.`` state_dict prefix), unless a call of it runs above the module's
    last import (a notebook importing in a later cell), where the helper would not exist yet.

    Checkpoints: ``optimizer.state_dict()`` becomes ``{"optimizer": optimizer.state_dict(), "scaler":
    scaler.state_dict()}`` (one value, wherever the old one went; under an fp16 switch only where the
    scaler is enabled, the float32 path saving the plain state dict it saved before), and ``optimizer.load_state_dict(s)``
    ``load_fp16_optimizer_state(optimizer, scaler, s)``, a helper written into the module once. It
    loads that pair, a plain optimizer state dict (the fp32 path of a guarded setup), or a checkpoint
    Apex's FP16_Optimizer wrote: apex.fp16_utils' (the wrapped optimizer's state dict, whose indices are
    the float32 model's parameters; the fp32 master copies of the float16 parameters, copied onto them
    as Apex's load copied them onto its masters; the amp LossScaler's scale and clean-step count) or
    apex.optimizers' (one flat fp32 master and flat Adam moments per group, split over the group's
    parameters; the scale, and the clean-step count ``(cur_iter - last_overflow_iter - 1) % 1000``).

    ``optimizer.step(closure)`` (apex.fp16_utils) becomes ``optimizer.step(scaled_closure(closure,
    optimizer, scaler))``, a helper written once that runs the closure as FP16_Optimizer's wrapper did:
    after each call (LBFGS calls it several times per step) the gradients are unscaled and the scale
    updated (held at S for a static scale), and while they overflow under a dynamic scale the closure
    is called again at the lowered scale; the wrapped optimizer then steps and returns its loss. The
    closure may be nested in the function of the set-up (the scaler reaches it as a closure variable).

    Loss scales, from Apex's source: ``dynamic_loss_scale=True`` is Apex's amp LossScaler
    (start ``min(2**16, max_loss_scale)``, halve on overflow and skip the step, double after
    ``scale_window`` clean steps; Apex ignores ``scale_factor``): a GradScaler with
    ``init_scale`` and ``growth_interval`` from ``dynamic_loss_args``. A static scale S never
    checked for overflow: ``static_loss_scale=1.0`` (the default) is a disabled scaler under an
    enabled autocast (exact), another S a scaler held at S (``init_scale=S``,
    ``update(new_scale=S)``; AMP002: it skips steps with inf/NaN gradients, which Apex applied).
    A project's copy of fp16_utils whose DynamicLossScaler is Apex's pre-2019 one (its default start,
    2**32 in Apex, halving on overflow but never below 1, doubling once ``scale_window`` steps have
    passed since the last overflow; no hysteresis) gives a GradScaler from that start with
    ``growth_interval=scale_window`` and the floor of 1 described below; its checkpoints and
    ``step(closure)`` (which raised) stay.
    An ``if``/``else`` choosing dynamic or static at run time (``args.loss_scale == 0``), or a
    ``dynamic_loss_scale=`` given a name or a test (``args.dynamic_loss_scale``), becomes one scaler
    whose start and held scale follow the same test (a held scale is passed through ``float()``:
    ``update(new_scale=)`` rejects an int, and configs often hold ``"loss_scale": 256``); the test is
    read again at every step, so it must be a plain read of names that do not change after the
    set-up.

    ``apex.optimizers.FP16_Optimizer`` (Dec 2018 to Aug 2019) wrapped only Apex's FusedAdam of that
    time, built in the same function (``X = FusedAdam(...)`` or inline); the two migrate together.
    The FusedAdam becomes ``LegacyFusedAdam``, a plain-torch class written into the module once that
    reproduces the old update on the unscaled float32 gradients ``scaler.step`` hands it: per group,
    ``clip = (norm + 1e-6) / max_grad_norm`` divides the gradients when above 1 (``max_grad_norm > 0``),
    ``eps`` inside or outside the square root (``eps_inside_sqrt``), the bias correction folded into
    the step size or not (``bias_correction``), ``weight_decay * p`` added to the update. The scale:
    dynamic started at 2**16 and doubled once 1000 steps had passed since the last overflow (what
    ``growth_interval=1000`` does), halving on overflow but never below 1 (after ``scaler.update()``
    a scale under 1 is put back to 1); a static S skipped overflowing steps too, so every static
    scale, 1.0 included, is a scaler held at S (no AMP002). ``optimizer.cur_scale`` reads
    ``scaler.get_scale()``; ``zero_grad()`` already set the gradients to None and is left as is.

Before::

    import torch
    from apex.fp16_utils import FP16_Optimizer

    model = Net().cuda().half()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer = FP16_Optimizer(optimizer, dynamic_loss_scale=True)
    for images, target in loader:
        output = model(images)
        loss = criterion(output, target)
        optimizer.zero_grad()
        optimizer.backward(loss)
        optimizer.step()

After::

    import torch

    model = Net().cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda")
    for images, target in loader:
        with torch.autocast("cuda", dtype=torch.float16):
            output = model(images)
            loss = criterion(output, target)
        optimizer.zero_grad(set_to_none=False)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

Not rewritten (reported instead, AMP040 with the code to write; everything FP16_Optimizer
touches stays as it was)
    A pre-2019 FusedAdam (``max_grad_norm=``) handed to a callable that is not Apex's FP16_Optimizer but
    takes its arguments (a project subclass, as VLP's ``FP16_Optimizer_State``): both stay, the
    FusedAdam with AMP042, the call with AMP040 naming the code to write.
    The optimizer passed to other functions or stored (the scaler would have to go along; for one kept
    in an attribute, ``self.optimizer = FP16_Optimizer(...)``, or returned to callers that keep it,
    ``self.optimizers = {"model": self.build("model")}``, the finding names each construction's
    GradScaler and what each use of the attribute or of the callers' container becomes, line by line),
    a read of the groups' ``"params"`` through ``optimizer.param_groups`` (Apex's float32 masters, their gradients
    unscaled; migrated, the model's parameters with scaled gradients),
    a nested function using the optimizer other than for its groups' settings (``for g in optimizer.param_groups:
    g["lr"] = lr`` stays as written: Apex's ``param_groups`` was the wrapped optimizer's list; a read of
    ``g["params"]`` reached Apex's float32 masters), an input cast to float16 by hand reaching the model
    outside the forward pass put under autocast (an evaluation's ``model(x.half())``) or a call handing the
    model the fp16 switch (``evaluator.evaluate(model, args.half)``: the callee may cast its inputs for the
    float16 model, which the float32 one would meet outside autocast),
    ``state_dict`` / ``load_state_dict`` not called on the spot, ``load_state_dict`` after a model
    halved by network_to_half / FP16Model / BN_convert_float (the masters cover only the float16
    parameters, which the float32 model cannot tell apart) or followed by the model's
    ``load_state_dict`` in the same function (its float16 weights would overwrite the masters),
    ``.overflow``, ``update_master_grads``, a closure passed to ``step`` that is not a function of
    the module calling ``optimizer.backward`` or that does not zero the gradients (the unscaled
    gradients of several calls would add up where Apex rebuilt the master gradients at each call),
    a run-time ``dynamic_loss_args``, a ``dynamic_loss_scale`` computed in the call, a ``clip_master_grads`` with no
    ``step()`` (without closure) after it in its block, a model still halved elsewhere in the
    function, or no ``.half()`` of the model in the set-up's function at all (a helper or another
    module halves it, or it stays float32, which autocast would not keep), except a project function
    proven to halve it under one of the set-up's tests (``ModuleFacts.halving_helpers``: ``model =
    load_model(model, ckpt, args)`` ending ``if args.fp16: model.half()``), called on every path to the
    set-up: the function stays (other callers share it) and ``if <set-up test>: model.float()`` follows
    each call. A torch LR scheduler built on the wrapper (``WarmupLinearSchedule(optimizer, ...)``):
    torch raised TypeError on Apex's FP16_Optimizer, a plain object, so that path never trained.
    ``apex.contrib.optimizers.FP16_Optimizer`` (around ``apex.optimizers.FusedAdam(max_grad_norm=...)``,
    a pair no Apex had, the finding says to import the pre-2019 one). For ``apex.optimizers.FP16_Optimizer`` also:
    ``step(closure)`` (it never called the closure),
    ``dynamic_loss_args`` (Apex raised SystemError), an optimizer not built by a FusedAdam call in
    the same function, FusedAdam arguments through ``*args``/``**kwargs`` or ``amsgrad=True``
    (Apex raised), ``clip_master_grads`` / ``loss_scale`` (it had neither). The FusedAdam it wraps
    stays with it (AMP042), since it drives that FusedAdam's old step API. A FusedAdam no
    FP16_Optimizer wraps is apex_optimizers' business.

Safety
    Checkpoints: Apex's load also took the checkpoint's dynamic/static mode and scale window, the
    scaler keeps the script's; an apex.fp16_utils checkpoint pickled ``apex.amp.scaler.LossScaler``,
    so ``torch.load`` needs ``weights_only=False`` and that class importable (the finding says so);
    checkpoints of apex.fp16_utils before March 2019 (its own LossScaler classes) are not read.
    Apex updated the scale once per ``backward``, GradScaler once per ``update()``: with
    gradient accumulation the scale grows after that many times fewer optimizer steps in Apex.
    Apex's dynamic scale had a cap of 2**24; GradScaler has none. ``network_to_half`` /
    ``FP16Model`` prefixed state_dict keys with ``1.`` / ``network.``; the bare model's keys
    have no prefix. ``clip_master_grads`` returned -1 on an
    overflowing step, the clip returns an inf or NaN norm (the step is skipped either way).
    apex.optimizers' FP16_Optimizer: overflow was an inf/NaN norm of the fp16 gradients of the
    fp16 model, GradScaler's an inf/NaN among the gradients of the float32 model under autocast
    (the fp16/fp32 split differs, so steps near the edge can skip differently); the clip norm is
    taken on float32 instead of fp16 gradients; Apex versions before March 2019 (NVIDIA/apex
    2f0bf59) started the dynamic scale at 2**32, later ones, followed here, at 2**16; every
    parameter needed a gradient (Apex flattened them), LegacyFusedAdam skips those without one.

References
    NVIDIA/apex@2f0bf59: apex/fp16_utils/fp16_optimizer.py (state_dict, load_state_dict, step and
    _step_with_closure included), apex/fp16_utils/fp16util.py,
    apex/amp/scaler.py (2019). The apex.optimizers pair, read at NVIDIA/apex@37795aa (the last
    commit before 690b1f7 of Aug 2019 replaced them; unchanged in substance since c8ca4bf of Dec
    2018 but for the start scale): apex/optimizers/fp16_optimizer.py (per group a flat fp16 buffer
    the model's parameters view and a flat fp32 master; backward scales ``loss.float()`` by the
    current scale; step takes each group's fp16 gradient 2-norm in fp32, any inf/NaN skips the step;
    the dynamic scale: 2**16, x2 when ``(iteration - last overflow) % 1000 == 0`` on a clean step,
    /2 with a floor of 1 on an overflow; ``dynamic_loss_args`` raises; ``zero_grad`` defaults to
    None), apex/optimizers/fused_adam.py (signature params, lr, bias_correction, betas, eps,
    eps_inside_sqrt, weight_decay, max_grad_norm, amsgrad (raises); the per-group clip from the
    passed norm, ``(norm / scale + 1e-6) / max_grad_norm``, multiplying the divisor when above 1;
    the step count per parameter), csrc/fused_adam_cuda_kernel.cu (the element update: gradient
    over the combined scale, both moments, ``sqrt(v + eps)`` or ``sqrt(v) + eps``, update
    ``m / denom + decay * p``, step size ``lr * sqrt(1 - b2^t) / (1 - b1^t)`` or ``lr``).
    pytorch/pytorch: torch/amp/grad_scaler.py; ../shared/apex-semantics.md sections 3.3, 4 and 9.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import libcst as cst

from migrate import half_inputs, pytree
from migrate.apex_copies import pre2019_dynamic
from migrate.rules import _local_copies as local_copies
from migrate.rules import _syntax as syntax
from migrate.rules._bindings import bound_name, dotted_name
from migrate.rules._context import ModuleContext, Statement
from migrate.rules._forward import forward_span
from migrate.rules.amp_initialize import _conjunction, _guards, bool_flags

RULE = "fp16_optimizer"

_FLAVORS = {
    "apex.fp16_utils.FP16_Optimizer": "fp16_utils",
    "apex.fp16_utils.fp16_optimizer.FP16_Optimizer": "fp16_utils",
    "apex.optimizers.FP16_Optimizer": "optimizers",
    "apex.optimizers.fp16_optimizer.FP16_Optimizer": "optimizers",
    "apex.contrib.optimizers.FP16_Optimizer": "contrib",
    "apex.contrib.optimizers.fp16_optimizer.FP16_Optimizer": "contrib",
}
_PARAMETERS = ("init_optimizer", "static_loss_scale", "dynamic_loss_scale", "dynamic_loss_args", "verbose")
_HALVING = frozenset(
    {"apex.fp16_utils.network_to_half", "apex.fp16_utils.FP16Model", "apex.fp16_utils.BN_convert_float"}
)
_HALVING_SHORT = {path.rpartition(".")[2] for path in _HALVING}
_FUSED_ADAM = "apex.optimizers.FusedAdam"
_DYNAMIC_KEYS = frozenset({"init_scale", "scale_factor", "scale_window", "min_loss_scale", "max_loss_scale"})
_OLD_FUSED_ADAM = (
    "apex.optimizers.FP16_Optimizer only ran with Apex's pre-2019 FusedAdam (it calls step(grads=..., "
    "output_params=..., scale=..., grad_norms=...), which later Apex removed), and no `X = FusedAdam(...)` "
    "assigned in this function is the optimizer it wraps; write instead: the float32 model, the old FusedAdam's "
    "update in plain torch (ampmigrate writes it as `LegacyFusedAdam` when the FusedAdam is built in the same "
    'function), `scaler = torch.amp.GradScaler("cuda", growth_interval=1000)` for dynamic_loss_scale=True (or '
    "`init_scale=S` with `scaler.update(new_scale=S)` for static_loss_scale=S: it skipped overflowing steps too), "
    "`scaler.scale(loss).backward()`, `scaler.step(optimizer)`, `scaler.update()`"
)
# the pre-2019 FusedAdam's signature (Apex, Dec 2018 to Aug 2019)
_OLD_FUSED_PARAMETERS = (
    "params",
    "lr",
    "bias_correction",
    "betas",
    "eps",
    "eps_inside_sqrt",
    "weight_decay",
    "max_grad_norm",
    "amsgrad",
)
# keywords of the pre-2019 FusedAdam the new one (August 2019 on) does not take
_OLD_ONLY_KEYWORDS = frozenset({"eps_inside_sqrt", "max_grad_norm"})
_LEGACY_HELPER = "LegacyFusedAdam"
_LEGACY_FUSED_ADAM = '''\
class {name}(torch.optim.Optimizer):
    """Apex's pre-2019 FusedAdam (the one apex.optimizers.FP16_Optimizer drove), in plain torch.

    Per group, when max_grad_norm > 0 and (norm + 1e-6) / max_grad_norm > 1 (norm: the group's
    gradient 2-norm) the gradients are divided by that ratio; then m = b1 * m + (1 - b1) * g,
    v = b2 * v + (1 - b2) * g * g and p -= step_size * (m / denom + weight_decay * p), with
    denom = sqrt(v + eps) if eps_inside_sqrt else sqrt(v) + eps, and
    step_size = lr * sqrt(1 - b2 ** t) / (1 - b1 ** t) (just lr without bias_correction).
    """

    def __init__(
        self,
        params,
        lr=1e-3,
        bias_correction=True,
        betas=(0.9, 0.999),
        eps=1e-8,
        eps_inside_sqrt=False,
        weight_decay=0.0,
        max_grad_norm=0.0,
    ):
        defaults = dict(
            lr=lr,
            bias_correction=bias_correction,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            max_grad_norm=max_grad_norm,
        )
        super().__init__(params, defaults)
        self.eps_inside_sqrt = eps_inside_sqrt

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            grads = [p.grad.float() for p in params]
            if group["max_grad_norm"] > 0:
                norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
                clip = torch.clamp((norm + 1e-6) / group["max_grad_norm"], min=1.0)
                grads = [g / clip for g in grads]
            beta1, beta2 = group["betas"]
            for p, grad in zip(params, grads):
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32)
                state["step"] += 1
                step_size = group["lr"]
                if group["bias_correction"]:
                    step_size = step_size * (1 - beta2 ** state["step"]) ** 0.5 / (1 - beta1 ** state["step"])
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                if self.eps_inside_sqrt:
                    denom = (exp_avg_sq + group["eps"]).sqrt()
                else:
                    denom = exp_avg_sq.sqrt().add_(group["eps"])
                update = exp_avg / denom + group["weight_decay"] * p
                p.sub_(step_size * update)
        return loss
'''
_RECIPE = (
    'the float32 model (no .half()), `scaler = torch.amp.GradScaler("cuda")`, the forward pass and loss under '
    '`with torch.autocast("cuda", dtype=torch.float16):`, `scaler.scale(loss).backward()`, '
    "`scaler.step(optimizer)` and `scaler.update()`"
)

# LambdaLR subclasses and factories of pytorch_transformers and transformers: torch LR schedulers
_LAMBDA_LR_FACTORIES = frozenset(
    {
        "LambdaLR",
        "ConstantLRSchedule",
        "WarmupConstantSchedule",
        "WarmupLinearSchedule",
        "WarmupCosineSchedule",
        "WarmupCosineWithHardRestartsSchedule",
        "get_constant_schedule",
        "get_constant_schedule_with_warmup",
        "get_linear_schedule_with_warmup",
        "get_cosine_schedule_with_warmup",
        "get_cosine_with_hard_restarts_schedule_with_warmup",
        "get_polynomial_decay_schedule_with_warmup",
        "get_scheduler",
    }
)

# the public attributes and methods of Apex's FP16_Optimizer objects (NVIDIA/apex apex/fp16_utils/fp16_optimizer.py
# before its removal; apex/optimizers/fp16_optimizer.py of 2018-2019): anything else raised AttributeError
_APEX_ATTRIBUTES = {
    "fp16_utils": frozenset(
        "all_fp16_params all_fp32_from_fp16_params all_fp32_from_fp32_params backward clip_grad_norm "
        "clip_master_grads dynamic_loss_scale first_closure_call_this_step fp16_groups fp32_from_fp16_groups "
        "fp32_from_fp32_groups inspect_master_grad_data load_state_dict loss_scale loss_scaler maybe_print "
        "multi_tensor_scale optimizer overflow param_groups state state_dict step update_master_grads verbose "
        "zero_grad".split()
    ),
    "optimizers": frozenset(
        "backward cur_iter cur_scale dynamic_loss_scale fp16_groups fp16_groups_flat fp32_groups_flat "
        "last_overflow_iter load_state_dict optimizer param_groups scale_factor scale_window state state_dict step "
        "zero_grad".split()
    ),
}

_LOAD_HELPER = "load_fp16_optimizer_state"
# both loaders first take what the migration itself saved: the pair, or a plain state dict
_LOAD_OWN = """\
    if "optimizer_state_dict" not in state:
        if "scaler" in state:
            optimizer.load_state_dict(state["optimizer"])
            scaler.load_state_dict(state["scaler"])
        else:
            optimizer.load_state_dict(state)
        return
"""
# apex.fp16_utils: FP16_Optimizer.state_dict() held the wrapped optimizer's state dict, one float32
# master per float16 parameter that required grad (in group order) and the amp LossScaler object
_LOAD_FP16_UTILS = (
    """\
def {name}(optimizer, scaler, state):
    \"\"\"Load {{"optimizer": ..., "scaler": ...}}, a plain optimizer state dict, or what
    apex.fp16_utils.FP16_Optimizer.state_dict() saved (its float32 master weights become the parameters).\"\"\"
"""
    + _LOAD_OWN
    + """\
    optimizer.load_state_dict(state["optimizer_state_dict"])
    with torch.no_grad():
        for group, masters in zip(optimizer.param_groups, state["fp32_from_fp16"]):
            params = [p for p in group["params"] if p.requires_grad]
            if len(params) != len(masters):
                raise ValueError(
                    f"this Apex checkpoint holds float32 masters of {{len(masters)}} of the {{len(params)}} parameters "
                    "of a group (the others were float32 under Apex): copy each onto the parameter it was made from"
                )
            for param, master in zip(params, masters):
                param.copy_(master)
    if scaler.is_enabled():
        apex_scaler = state["loss_scaler"]
        scaler_state = scaler.state_dict()
        scaler_state["scale"] = float(apex_scaler.loss_scale())
        # Apex's clean steps since the scale last changed (it counted them without bound under a static scale)
        scaler_state["_growth_tracker"] = apex_scaler._unskipped if state["dynamic_loss_scale"] else 0
        scaler.load_state_dict(scaler_state)
"""
)
# apex.optimizers: one flat float32 master per group, and the old FusedAdam's flat moments
_LOAD_LEGACY = (
    """\
def {name}(optimizer, scaler, state):
    \"\"\"Load {{"optimizer": ..., "scaler": ...}}, a plain optimizer state dict, or what
    apex.optimizers.FP16_Optimizer.state_dict() saved (one flat float32 master and flat Adam moments per
    group, split here over the group's parameters).\"\"\"
"""
    + _LOAD_OWN
    + """\
    saved = state["optimizer_state_dict"]
    param_state, groups, index = {{}}, [], 0
    with torch.no_grad():
        apex_groups = zip(saved["param_groups"], state["fp32_groups_flat"])
        for group, (saved_group, master) in zip(optimizer.param_groups, apex_groups):
            flat_state = saved["state"].get(saved_group["params"][0])
            indices, offset = [], 0
            for param in group["params"]:
                end = offset + param.numel()
                param.copy_(master[offset:end].view_as(param))
                if flat_state:
                    param_state[index] = {{
                        "step": flat_state["step"],
                        "exp_avg": flat_state["exp_avg"][offset:end].view_as(param).clone(),
                        "exp_avg_sq": flat_state["exp_avg_sq"][offset:end].view_as(param).clone(),
                    }}
                indices.append(index)
                index, offset = index + 1, end
            groups.append({{**group, **saved_group, "params": indices}})
    optimizer.load_state_dict({{"state": param_state, "param_groups": groups}})
    if scaler.is_enabled():
        scaler_state = scaler.state_dict()
        scaler_state["scale"] = float(state["cur_scale"])
        if state["dynamic_loss_scale"]:
            # Apex doubled the scale on a clean step once (iteration - last overflow) was a multiple of the window
            window = state["scale_window"]
            scaler_state["_growth_tracker"] = (state["cur_iter"] - state["last_overflow_iter"] - 1) % window
        scaler.load_state_dict(scaler_state)
"""
)
_CLOSURE_HELPER = "scaled_closure"
# apex.fp16_utils' step(closure) wrapped the closure: each call's backward unscaled the gradients into
# the masters and updated the scale; while the gradients overflowed (dynamic scale only) it called the
# closure again at the lowered scale, then handed the loss to the wrapped optimizer's step
_CLOSURE_RUNNER = """\
def {name}(closure, optimizer, scaler, new_scale=None):
    \"\"\"The closure for optimizer.step(), run as FP16_Optimizer ran it: after each call the gradients are
    unscaled and the scale updated (held at new_scale if given); on inf/NaN gradients under a dynamic scale
    the closure runs again at the lowered scale.\"\"\"

    def run():
        while True:
            loss = closure()
            if not scaler.is_enabled():
                return loss
            scaler.unscale_(optimizer)
            grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
            overflow = not all(bool(torch.isfinite(grad).all()) for grad in grads)
            scaler.update(new_scale)
            if not overflow or new_scale is not None:
                return loss

    return run
"""


# nn.Module methods that return the module they are called on
_SELF_RETURNING = frozenset("cuda to cpu half float double bfloat16 train eval type requires_grad_ apply".split())


# the nodes of a test that is a plain read of names (no call, no subscript): read again, it gives the same
_PLAIN_TEST_NODES: tuple[type[cst.CSTNode], ...] = (
    cst.Name, cst.Attribute, cst.Comparison, cst.ComparisonTarget, cst.BooleanOperation, cst.UnaryOperation,
    cst.Integer, cst.Float, cst.SimpleString, cst.LeftParen, cst.RightParen, cst.Dot,
    cst.BaseCompOp, cst.BaseBooleanOp, cst.BaseUnaryOp, cst.BaseParenthesizableWhitespace,
)  # fmt: skip


class _Blocked(Exception):
    """This FP16_Optimizer setup cannot be migrated exactly; the message says why."""

    def __init__(self, node: cst.CSTNode, message: str) -> None:
        super().__init__(message)
        self.node = node
        self.message = message


@dataclass
class _Construction:
    call: cst.Call
    statement: cst.SimpleStatementLine
    target: str
    inner: cst.BaseExpression
    root: cst.Name
    path: str
    flavor: str
    # the scale: a static expression (None: dynamic), the dynamic start and growth interval
    static: cst.BaseExpression | None = None
    init_scale: float | None = None
    growth_interval: int | None = None
    notes: list[tuple[str, cst.CSTNode, str | None]] = field(default_factory=list)
    # apex.optimizers: the old FusedAdam call it wraps, and that call rewritten for the helper class
    fused: cst.Call | None = None
    legacy: cst.Call | None = None
    # a dynamic scale that never went below 1 (apex.optimizers', a local copy's pre-2019 one)
    floor: bool = False
    # ``dynamic_loss_scale=D`` chosen at run time: dynamic (the settings above) where D holds, else
    # the static scale in ``static``
    dynamic_test: cst.BaseExpression | None = None


@dataclass
class _Setup:
    """One optimizer name wrapped by one FP16_Optimizer (or by one per clause of an if/else)."""

    scope: cst.CSTNode  # the function (or module) holding the construction
    constructions: list[_Construction]
    chain: cst.If | None = None  # `if T: X = FP16_Optimizer(dynamic) else: X = FP16_Optimizer(static)`

    @property
    def first(self) -> _Construction:
        return self.constructions[0]


# ---------------------------------------------------------------------------------------------- reading
def _flavor(ctx: ModuleContext, call: cst.Call) -> tuple[str, str, cst.Name] | None:
    found = ctx.apex_path(call.func)
    if found is None or found[0] not in _FLAVORS:
        return None
    return found[0], _FLAVORS[found[0]], found[1]


def _read_scale(construction: _Construction, bound: dict[str, cst.Arg]) -> None:
    """Fill the construction's scale settings from its arguments (raises _Blocked)."""
    call = construction.call
    dynamic_arg = bound.get("dynamic_loss_scale")
    dynamic = syntax.literal(dynamic_arg.value) if dynamic_arg is not None else False
    if dynamic not in (True, False):
        _runtime_choice(construction, bound)  # the static scale where the test fails, the dynamic settings below
    elif not dynamic:
        _read_static(construction, bound)
        return
    args_arg = bound.get("dynamic_loss_args")
    if args_arg is None or syntax.literal(args_arg.value) is None:
        return
    settings = _literal_dict(args_arg.value)
    if settings is None or not set(settings) <= _DYNAMIC_KEYS:
        raise _Blocked(
            call,
            "dynamic_loss_args is not a literal dict of init_scale, scale_factor, scale_window, min_loss_scale, "
            'max_loss_scale: write `torch.amp.GradScaler("cuda", init_scale=init_scale, '
            "growth_interval=scale_window)` (Apex always halved and doubled, whatever scale_factor said)",
        )
    ceiling = settings.get("max_loss_scale", 2.0**24)
    start = settings.get("init_scale", 2.0**16)
    if start != 2.0**16 or ceiling < start:
        construction.init_scale = float(min(ceiling, start))
    if "scale_window" in settings and settings["scale_window"] != 2000:
        window = settings["scale_window"]
        if window != int(window) or window < 1:
            raise _Blocked(
                args_arg,
                f"scale_window={window} is not a whole number of steps: write `growth_interval=N` with N steps",
            )
        construction.growth_interval = int(window)
    if "min_loss_scale" in settings or "max_loss_scale" in settings:
        construction.notes.append(("AMP003", args_arg, None))


def _read_static(construction: _Construction, bound: dict[str, cst.Arg]) -> None:
    """``static_loss_scale`` (1.0 when left out): a literal or a name, read again at every step."""
    static_arg = bound.get("static_loss_scale")
    construction.static = static_arg.value if static_arg is not None else cst.Float("1.0")
    value = syntax.literal(construction.static)
    if value is ... and not isinstance(construction.static, (cst.Name, cst.Attribute)):
        raise _Blocked(
            construction.call,
            "static_loss_scale is an expression computed here: assign it to a name first, then "
            '`torch.amp.GradScaler("cuda", init_scale=S)` with `scaler.update(new_scale=S)`',
        )


def _runtime_choice(construction: _Construction, bound: dict[str, cst.Arg]) -> None:
    """``dynamic_loss_scale=args.dynamic_loss_scale``: one scaler whose start and held scale follow
    that test, as for an ``if``/``else`` of two set-ups (the test must not change after the set-up:
    ``_Planner.plan_scaler`` checks it)."""
    _read_static(construction, bound)
    construction.dynamic_test = bound["dynamic_loss_scale"].value


def _literal_dict(node: cst.BaseExpression) -> dict[str, float] | None:
    """``{"init_scale": 2**10, ...}`` or ``dict(init_scale=2**10)`` with numbers, else None."""
    pairs: list[tuple[str, cst.BaseExpression]] = []
    if isinstance(node, cst.Dict):
        for element in node.elements:
            if not isinstance(element, cst.DictElement):
                return None
            key = syntax.literal(element.key)
            if not isinstance(key, str):
                return None
            pairs.append((key, element.value))
    elif isinstance(node, cst.Call) and dotted_name(node.func) == "dict":
        for arg in node.args:
            if arg.keyword is None:
                return None
            pairs.append((arg.keyword.value, arg.value))
    else:
        return None
    result: dict[str, float] = {}
    for key, value_node in pairs:
        value = syntax.literal(value_node)
        if key in ("min_loss_scale", "max_loss_scale") and value is None:
            continue
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return None
        result[key] = float(value)
    return result


def _read_construction(ctx: ModuleContext, call: cst.Call) -> _Construction:
    path, flavor, root = _flavor(ctx, call)  # type: ignore[misc]
    statement = ctx.statement_of(call)
    shape = (
        isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
        and isinstance(statement.body[0], cst.Assign)
        and statement.body[0].value is call
        and len(statement.body[0].targets) == 1
        and isinstance(statement.body[0].targets[0].target, cst.Name)
    )
    if not shape:
        raise _Blocked(call, _shape_problem(ctx, call, statement, flavor))
    assert isinstance(statement, cst.SimpleStatementLine)
    assign = statement.body[0]
    assert isinstance(assign, cst.Assign) and isinstance(assign.targets[0].target, cst.Name)
    if flavor == "contrib":
        fused = _fused_adam_of(ctx, call)
        old_keywords = (
            sorted({arg.keyword.value for arg in fused.args if arg.keyword is not None} & _OLD_ONLY_KEYWORDS)
            if fused is not None
            else []
        )
        if fused is not None and old_keywords:
            spelled = ", ".join(f"{k}=" for k in old_keywords)
            raise _Blocked(
                call,
                f"it wraps `apex.optimizers.FusedAdam(..., {spelled}...)` (line {ctx.position(fused)[0]}): every Apex "
                "that has apex.contrib.optimizers.FP16_Optimizer (October 2019 on, NVIDIA/apex 1904e48) has the new "
                f"apex.optimizers.FusedAdam, which takes no {spelled} (TypeError), and that FP16_Optimizer drives only "
                "apex.contrib.optimizers.FusedAdam, so this fp16 path could not run. It was written for the pre-2019 "
                "pair: import `FP16_Optimizer` from `apex.optimizers` instead and run ampmigrate again (it writes the "
                "old FusedAdam update as `LegacyFusedAdam` under a GradScaler), or write " + _RECIPE,
            )
        raise _Blocked(
            call,
            "apex.contrib.optimizers.FP16_Optimizer drives Apex's contrib fused optimizers through their own "
            "step(grads=..., output_params=..., scale=...) API, which torch has no twin of; write " + _RECIPE,
        )
    bound = syntax.bind_arguments(call, _PARAMETERS)
    if bound is None or "init_optimizer" not in bound:
        raise _Blocked(
            call,
            "its arguments are not spelt out (*args/**kwargs, or a keyword Apex does not take): write "
            "`FP16_Optimizer(init_optimizer, static_loss_scale=S, dynamic_loss_scale=D, dynamic_loss_args=A)`",
        )
    construction = _Construction(
        call=call,
        statement=statement,
        target=assign.targets[0].target.value,
        inner=bound["init_optimizer"].value,
        root=root,
        path=path,
        flavor=flavor,
    )
    _read_settings(ctx, construction, bound)
    return construction


def _read_settings(ctx: ModuleContext, construction: _Construction, bound: dict[str, cst.Arg]) -> None:
    """The scale (and, for apex.optimizers, the old FusedAdam) of one construction (raises _Blocked)."""
    call, root, flavor = construction.call, construction.root, construction.flavor
    dynamic = bound.get("dynamic_loss_scale")
    chosen = syntax.literal(dynamic.value) if dynamic is not None else False
    problem = local_copies.dynamic_problem(ctx, root) if dynamic is not None else ""
    pre2019 = pre2019_dynamic(problem)
    if problem and chosen is not False and pre2019 is None:
        raise _Blocked(call, problem)  # a local copy that scales otherwise
    if flavor == "optimizers":
        _read_legacy(ctx, construction, bound)
    elif pre2019 is not None and chosen is not False:
        if chosen is not True:
            _runtime_choice(construction, bound)
        _read_pre2019(construction, bound, pre2019)
    else:
        _read_scale(construction, bound)


def _shape_problem(ctx: ModuleContext, call: cst.Call, statement: cst.CSTNode, flavor: str) -> str:
    """Why the construction is not ``name = FP16_Optimizer(...)``: for ``self.optimizer = ...`` (a
    trainer class keeping it between methods), the methods that use it and the code to write."""
    target = syntax.target_of(statement, call)
    attribute = dotted_name(target) if isinstance(target, cst.Attribute) else None
    if attribute is None or attribute.count(".") != 1:
        return "not a plain `optimizer = FP16_Optimizer(optimizer, ...)` assignment"
    owner = attribute.split(".")[0]
    here = ctx.function_of(call)
    methods: dict[str, int] = {}
    for name in ctx.nodes_of(cst.Name):
        node = ctx.parent(name)
        if name.value != owner or not isinstance(node, cst.Attribute) or node.value is not name:
            continue
        function = ctx.function_of(node)
        if function is here or function is None or dotted_name(node) != attribute:
            continue
        methods.setdefault(function.name.value, ctx.position(node)[0])
    used = ", ".join(f"`{name}` (line {line})" for name, line in sorted(methods.items(), key=lambda item: item[1]))
    scaler = f"{owner}.{ctx.options.scaler_name}"
    creation, update, unknown = _scaler_recipe(ctx, call, statement, flavor, attribute)
    halves = _halves_in_class(ctx, call)
    uses = _holder_uses(ctx, attribute, None, scaler, update, flavor, skip=(statement,))
    return (
        f"FP16_Optimizer is kept in the attribute `{attribute}`"
        + (f", which other methods use: {used}" if used else "")
        + "; the rule migrates an optimizer held in a local or module name only. Write instead: "
        f"`{attribute} = <the wrapped optimizer>` with `{scaler} = {creation}` beside it{unknown}"
        + (f" ({_ENABLED_NOTE})" if "enabled=" in creation else "")
        + (f", the float32 model ({halves})" if halves else ", the float32 model (no .half())")
        + ", every forward pass and loss (evaluation included: Apex's model was float16 there too) under "
        '`with torch.autocast("cuda", dtype=torch.float16):`'
        + (f", and at its uses: {uses}" if uses else "")
        + (
            "; the pre-2019 FusedAdam it wraps goes with it, its update written in plain torch (ampmigrate writes "
            "it as `LegacyFusedAdam` for an optimizer held in a local name)"
            if flavor == "optimizers"
            else ""
        )
    )


_ENABLED_NOTE = "on both paths, so that the float32 path's steps reach a disabled scaler"


def _scaler_recipe(
    ctx: ModuleContext,
    call: cst.Call,
    statement: cst.CSTNode,
    flavor: str,
    target: str,
) -> tuple[str, str, str]:
    """The GradScaler one construction (held elsewhere than in a name) maps to: (``torch.amp.GradScaler("cuda",
    ...)``, the update after each step with ``{S}`` for the scaler, why its scale has no exact settings or "")."""
    path, _, root = _flavor(ctx, call)  # type: ignore[misc]
    bound = syntax.bind_arguments(call, _PARAMETERS)
    arguments = ['"cuda"']
    update = "`{S}.update()`"
    if bound is not None and "init_optimizer" in bound:
        construction = _Construction(
            call=call,
            statement=statement,  # type: ignore[arg-type]
            target=target,
            inner=bound["init_optimizer"].value,
            root=root,
            path=path,
            flavor=flavor,
        )
        try:
            _read_settings(ctx, construction, bound)
        except _Blocked as error:
            # its scale has no exact GradScaler settings to name: the finding says why
            return 'torch.amp.GradScaler("cuda", ...)', "`{S}.update()`", f" ({error.message})"
        static = construction.static
        held = syntax.code(_as_float(static)) if static is not None else None
        test = syntax.code(construction.dynamic_test) if construction.dynamic_test is not None else None
        start = repr(construction.init_scale or 2.0**16)
        if held is not None and test is None:
            if flavor == "fp16_utils" and static is not None and syntax.literal(static) == 1.0:
                arguments.append("enabled=False")
            else:
                arguments.append(f"init_scale={held}")
                update = f"`{{S}}.update(new_scale={held})`" + (
                    " (it skips a step with inf/NaN gradients, which Apex's static scale applied)"
                    if flavor == "fp16_utils"
                    else ""
                )
        elif held is not None and test is not None:
            arguments.append(f"init_scale={start} if {test} else {held}")
            update = f"`{{S}}.update(new_scale=None if {test} else {held})`"
        elif construction.init_scale is not None:
            arguments.append(f"init_scale={start}")
        if (held is None or test is not None) and construction.growth_interval is not None:
            arguments.append(f"growth_interval={construction.growth_interval}")
        if construction.floor and (held is None or test is not None):
            update += " then `if {S}.get_scale() < 1.0: {S}.update(new_scale=1.0)` (Apex's floor of 1)"
    enabled = _switch_of(ctx, statement, call)
    if enabled is not None and "enabled=False" not in arguments:
        arguments.append(f"enabled={enabled}")
    return f"torch.amp.GradScaler({', '.join(arguments)})", update, ""


def _switch_of(ctx: ModuleContext, statement: cst.CSTNode, call: cst.Call) -> str | None:
    """The tests guarding a construction but the clause choosing its scale (``if loss_scale == 0:`` with
    the other FP16_Optimizer in its ``else``): the scaler's ``enabled=``."""
    conditions, _ = _guards(ctx, statement)
    block = ctx.parent(statement)
    owner = ctx.parent(block) if isinstance(block, cst.IndentedBlock) else None
    chain = ctx.parent(owner) if isinstance(owner, cst.Else) else owner
    if isinstance(chain, cst.If) and isinstance(chain.orelse, cst.Else) and conditions:
        # `if loss_scale == 0: dynamic else: static`: the choice of scale, not the fp16 switch
        sides = [chain.body, chain.orelse.body]
        wrapper = syntax.normalized(call.func)
        if all(any(syntax.normalized(c.func) == wrapper for c in _calls_in(ctx, side)) for side in sides):
            conditions = conditions[:-1]
    enabled = _conjunction(conditions)
    return syntax.code(enabled).strip() if enabled is not None else None


def _calls_in(ctx: ModuleContext, node: cst.CSTNode) -> list[cst.Call]:
    return sorted((n for n in ctx.walk(node) if isinstance(n, cst.Call)), key=ctx.order)


def _halves_in_class(ctx: ModuleContext, call: cst.Call) -> str:
    """``model.half()`` (and Apex's halving wrappers) in the class holding the construction's method:
    what goes when the model stays float32."""
    function = ctx.function_of(call)
    owner = ctx.class_of_method(function) if function is not None else None
    if owner is None:
        return ""
    found: list[str] = []
    for node in _calls_in(ctx, owner):
        func = node.func
        halving = ctx.apex_path(func)
        if (isinstance(func, cst.Attribute) and func.attr.value == "half" and not node.args) or (
            halving is not None and halving[0] in _HALVING
        ):
            found.append(f"`{syntax.code(node).strip()}` at line {ctx.position(node)[0]} goes")
    return ", ".join(found)


def _holder_uses(
    ctx: ModuleContext,
    holder: str,
    scalers: str | None,
    scaler: str,
    update: str,
    flavor: str,
    skip: tuple[cst.CSTNode, ...] = (),
    scope: cst.CSTNode | None = None,
) -> str:
    """What each use of the optimizer held in ``holder`` becomes (``holder[key]`` when ``scalers``
    names the container of the scalers kept beside a container of optimizers), line by line."""
    found: list[str] = []
    seen: set[int] = set()
    base = holder.split(".")[0]
    for name in ctx.nodes_of(cst.Name):
        node: cst.CSTNode = name
        if name.value != base or any(_inside(ctx, node, name) for node in skip):
            continue
        if scope is not None and ctx.scope_of(name) is not scope:
            continue
        while dotted_name(node) != holder:  # type: ignore[arg-type]
            above = ctx.parent(node)
            if not (isinstance(above, cst.Attribute) and above.value is node):
                break
            node = above
        if dotted_name(node) != holder:  # type: ignore[arg-type]
            continue
        parent = ctx.parent(node)
        expression: cst.CSTNode = node
        here = scaler
        if scalers is not None:
            if not (isinstance(parent, cst.Subscript) and parent.value is node):
                continue
            expression = parent
            key = syntax.code(parent.slice[0]).strip() if len(parent.slice) == 1 else "..."
            here = f"{scalers}[{key}]"
            parent = ctx.parent(parent)
        held = syntax.code(expression).strip()
        step_update = update.replace("{S}", here)
        text: str | None
        outer = ctx.parent(parent) if parent is not None else None
        if isinstance(parent, cst.Attribute) and parent.value is expression:
            attribute = parent.attr.value
            call = outer if isinstance(outer, cst.Call) and outer.func is parent else None
            arguments = [syntax.code(a.value).strip() for a in call.args] if call is not None else []
            if attribute in ("param_groups", "state") or (attribute == "zero_grad" and flavor == "optimizers"):
                text = None
            elif call is None and _is_store(ctx, parent):
                text = "it goes (a GradScaler takes its settings from its constructor)"
            elif attribute == "backward" and arguments:
                text = f"`{here}.scale({arguments[0]}).backward()`"
            elif attribute == "step" and call is not None and not arguments:
                text = f"`{here}.step({held})` then {step_update}"
            elif attribute == "zero_grad" and call is not None:
                text = f"`{held}.zero_grad(set_to_none=False)`"
            elif attribute == "clip_master_grads" and arguments:
                text = (
                    f"`{here}.unscale_({held})` then `torch.nn.utils.clip_grad_norm_((p for group in "
                    f'{held}.param_groups for p in group["params"]), {", ".join(arguments)})`'
                )
            elif attribute == "state_dict" and call is not None:
                text = f'`{{"optimizer": {held}.state_dict(), "scaler": {here}.state_dict()}}`'
            elif attribute == "load_state_dict" and len(arguments) == 1:
                text = (
                    f'`{held}.load_state_dict({arguments[0]}["optimizer"])` and '
                    f'`{here}.load_state_dict({arguments[0]}["scaler"])` (a checkpoint Apex wrote holds neither)'
                )
            elif attribute in ("loss_scale", "cur_scale") and call is None:
                text = f"`{here}.get_scale()`"
            elif attribute == "overflow" and call is None:
                text = (
                    f"`{here}.get_scale() < scale_before` with `scale_before = {here}.get_scale()` taken before "
                    f"`{here}.update()` (under a dynamic scale)"
                )
            else:
                text = f"no GradScaler counterpart for `{held}.{attribute}`: " + _RECIPE
            shown = syntax.code(call if call is not None else parent).strip()
        elif isinstance(parent, cst.Arg) and isinstance(outer, cst.Call):
            shown = syntax.code(outer).strip()
            text = f"`{syntax.code(outer.func).strip()}` receives it: pass `{here}` along and write the same there"
        else:
            continue
        if text is None or id(parent) in seen:
            continue
        seen.add(id(parent))
        if len(shown) > 60:
            shown = shown[:57] + "..."
        joint = " becomes " if text.startswith("`") and " receives it" not in text else ": "
        found.append(f"line {ctx.position(expression)[0]} `{shown}`{joint}{text}")
    found.sort(key=lambda item: int(item.split()[1]))
    return "; ".join(found)


def _inside(ctx: ModuleContext, outer: cst.CSTNode, node: cst.CSTNode) -> bool:
    return any(ancestor is outer for ancestor in ctx.ancestors(node))


def _read_pre2019(construction: _Construction, bound: dict[str, cst.Arg], defaults: tuple[float, int]) -> None:
    """A local copy whose dynamic scaling is Apex's pre-2019 DynamicLossScaler (``defaults``: its
    init_scale and scale_window): start there, double after scale_window clean steps (what
    GradScaler's growth_interval counts), halve on overflow but never below 1 (raises _Blocked)."""
    start, window = defaults
    args_arg = bound.get("dynamic_loss_args")
    if args_arg is not None and syntax.literal(args_arg.value) is not None:
        settings = _literal_dict(args_arg.value)
        if settings is None or not set(settings) <= {"init_scale", "scale_factor", "scale_window"}:
            raise _Blocked(
                construction.call,
                "dynamic_loss_args is not a literal dict of this copy's DynamicLossScaler arguments (init_scale, "
                'scale_factor, scale_window): write `torch.amp.GradScaler("cuda", init_scale=init_scale, '
                "growth_interval=scale_window)` and, after each `scaler.update()`, "
                "`if scaler.get_scale() < 1.0: scaler.update(new_scale=1.0)`",
            )
        if settings.get("scale_factor", 2.0) != 2.0:
            raise _Blocked(
                args_arg,
                f"scale_factor={settings['scale_factor']}: write `torch.amp.GradScaler(\"cuda\", init_scale=..., "
                "growth_factor=f, backoff_factor=1 / f, growth_interval=scale_window)` and, after each "
                "`scaler.update()`, `if scaler.get_scale() < 1.0: scaler.update(new_scale=1.0)`",
            )
        start = settings.get("init_scale", start)
        window = settings.get("scale_window", window)  # type: ignore[assignment]
    if window != int(window) or window < 1:
        raise _Blocked(construction.call, f"scale_window={window} is not a whole number of steps")
    if start != 2.0**16:
        construction.init_scale = float(start)
    if window != 2000:
        construction.growth_interval = int(window)
    construction.floor = True


def _read_legacy(ctx: ModuleContext, construction: _Construction, bound: dict[str, cst.Arg]) -> None:
    """apex.optimizers.FP16_Optimizer: its scale (2**16 doubling after 1000 clean steps, or a held
    static one) and the old FusedAdam it wraps, rewritten for the LegacyFusedAdam helper (raises _Blocked)."""
    call = construction.call
    args_arg = bound.get("dynamic_loss_args")
    if args_arg is not None and syntax.literal(args_arg.value) is not None:
        raise _Blocked(
            args_arg,
            "this FP16_Optimizer raised SystemError for any dynamic_loss_args: remove it (its dynamic scale "
            'started at 2**16 and doubled after 1000 clean steps: `torch.amp.GradScaler("cuda", '
            "growth_interval=1000)`)",
        )
    _read_scale(construction, {k: v for k, v in bound.items() if k != "dynamic_loss_args"})
    if construction.static is None or construction.dynamic_test is not None:
        construction.growth_interval = 1000
        construction.floor = True
    fused = _fused_adam_of(ctx, call)
    if fused is None:
        raise _Blocked(call, _OLD_FUSED_ADAM)
    fused_bound = syntax.bind_arguments(fused, _OLD_FUSED_PARAMETERS)
    if fused_bound is None or "params" not in fused_bound:
        raise _Blocked(
            fused,
            "the old FusedAdam's arguments are not spelt out (*args/**kwargs, or a keyword it did not take): "
            "write `FusedAdam(params, lr=..., bias_correction=..., betas=..., eps=..., eps_inside_sqrt=..., "
            "weight_decay=..., max_grad_norm=...)`",
        )
    kept = list(fused.args)
    if "amsgrad" in fused_bound:
        if syntax.literal(fused_bound["amsgrad"].value) is not False:
            raise _Blocked(
                fused, "the old FusedAdam raised for amsgrad=True (it had no AMSGrad): remove `amsgrad=True`"
            )
        kept.remove(fused_bound["amsgrad"])
        if kept and not isinstance(fused.args[-1].comma, cst.Comma):
            kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    construction.fused = fused
    construction.legacy = fused.with_changes(func=cst.Name(_LEGACY_HELPER), args=kept)


def _collect(ctx: ModuleContext) -> tuple[list[_Setup], list[tuple[_Blocked, cst.Call]]]:
    """The setups, one per (scope, optimizer name), and the constructions that cannot be read."""
    blocked: list[tuple[_Blocked, cst.Call]] = []
    by_key: dict[tuple[int, str], list[_Construction]] = {}
    scopes: dict[tuple[int, str], cst.CSTNode] = {}
    for call in ctx.nodes_of(cst.Call):
        if _flavor(ctx, call) is None or ctx.skipped(call):
            continue
        try:
            construction = _read_construction(ctx, call)
        except _Blocked as error:
            blocked.append((error, call))
            continue
        scope = ctx.scope_of(call)
        key = (id(scope), construction.target)
        by_key.setdefault(key, []).append(construction)
        scopes[key] = scope
    setups: list[_Setup] = []
    for key, constructions in by_key.items():
        setup = _Setup(scopes[key], constructions)
        if len(constructions) > 2 or (len(constructions) == 2 and _chain_of(ctx, constructions) is None):
            for construction in constructions:
                blocked.append(
                    (
                        _Blocked(construction.call, "the optimizer is wrapped more than once; write " + _RECIPE),
                        construction.call,
                    )
                )
            continue
        if len(constructions) == 2:
            setup.chain = _chain_of(ctx, constructions)
        setups.append(setup)
    return setups, blocked


def _chain_of(ctx: ModuleContext, constructions: list[_Construction]) -> cst.If | None:
    """The `if T: <first> else: <second>` holding exactly the two constructions, if they are that."""
    first, second = (c.statement for c in constructions)
    block = ctx.parent(first)
    branch = ctx.parent(block) if isinstance(block, cst.IndentedBlock) else None
    if not isinstance(branch, cst.If) or branch.body is not block or len(block.body) != 1:
        return None
    orelse = branch.orelse
    if not isinstance(orelse, cst.Else) or not isinstance(orelse.body, cst.IndentedBlock):
        return None
    if list(orelse.body.body) != [second]:
        return None
    if syntax.normalized(constructions[0].inner) != syntax.normalized(constructions[1].inner):
        return None
    if constructions[0].flavor != constructions[1].flavor:
        return None
    return branch


# ---------------------------------------------------------------------------------------------- planning
@dataclass
class _Edits:
    """What one setup changes; committed to the plan only when the whole setup can migrate."""

    substitute: dict[cst.CSTNode, cst.CSTNode] = field(default_factory=dict)
    replace: dict[cst.CSTNode, Callable[[cst.CSTNode], cst.CSTNode]] = field(default_factory=dict)
    remove: set[cst.CSTNode] = field(default_factory=set)
    replace_statement: dict[cst.CSTNode, list[Statement]] = field(default_factory=dict)
    before: dict[cst.CSTNode, list[Statement]] = field(default_factory=dict)
    after: dict[cst.CSTNode, list[Statement]] = field(default_factory=dict)
    wraps: list[tuple[cst.CSTNode, cst.CSTNode, cst.WithItem]] = field(default_factory=list)
    consumed: set[cst.CSTNode] = field(default_factory=set)
    notes: list[tuple[str, cst.CSTNode, str | None]] = field(default_factory=list)


class _Planner:
    def __init__(self, ctx: ModuleContext, setup: _Setup) -> None:
        self.ctx = ctx
        self.setup = setup
        self.edits = _Edits()
        self.name = setup.first.target
        self.flavor = setup.first.flavor
        anchor = setup.chain if setup.chain is not None else setup.first.statement
        self.guards, self.outermost = _guards(ctx, anchor)
        # the fp16 switch as the code tests it, and as GradScaler/autocast take it (a bool: they raise on an int)
        self.switch = _conjunction(list(self.guards)) if self.guards else None
        self.enabled = _conjunction(list(self.guards), bool_flags(ctx)) if self.guards else None
        self.scaler = ctx.fresh_name(ctx.options.scaler_name)
        self.helper = _legacy_helper_name(ctx) if self.flavor == "optimizers" else _LEGACY_HELPER
        self.model_names: set[str] = set()
        # network_to_half / FP16Model / BN_convert_float kept batch norms float32 (no master copies)
        self.partly_half = False
        self.load_helper: str | None = None
        self.load_needed = False
        self.stepped = False
        self.closure_helper: str | None = None
        # the functions passed to `X.step(...)` as closures: they may use X (and the scaler) inside
        self.closures = {
            arg.value.value
            for call in ctx.nodes_of(cst.Call)
            if isinstance(call.func, cst.Attribute)
            and call.func.attr.value == "step"
            and isinstance(call.func.value, cst.Name)
            and call.func.value.value == self.name
            for arg in call.args[:1]
            if isinstance(arg.value, cst.Name)
        }
        statements = [c.statement for c in setup.constructions]
        self.start_line = min(ctx.position(s)[0] for s in statements)

    # --- the scaler
    def _scale_expression(self, pick: str) -> cst.BaseExpression | None:
        """``init_scale=`` (pick "init") or ``new_scale=`` (pick "hold") for the setup."""
        values: list[cst.BaseExpression | None] = []
        runtime = self.setup.first
        if runtime.dynamic_test is not None:
            assert runtime.static is not None
            dynamic: cst.BaseExpression = cst.Name("None")
            if pick == "init":
                dynamic = cst.Float(repr(runtime.init_scale if runtime.init_scale is not None else 2.0**16))
            static = _as_float(runtime.static) if pick == "hold" else runtime.static.deep_clone()
            return cst.IfExp(test=runtime.dynamic_test.deep_clone(), body=dynamic, orelse=static)
        for construction in self.setup.constructions:
            if construction.static is not None and pick == "hold":
                values.append(_as_float(construction.static))
            elif construction.static is not None:
                values.append(construction.static.deep_clone())
            elif pick == "init" and construction.init_scale is not None:
                values.append(cst.Float(repr(construction.init_scale)))
            elif pick == "init" and len(self.setup.constructions) == 2:
                values.append(cst.Float(repr(2.0**16)))
            else:
                values.append(None)
        if len(values) == 1 or all(v is None for v in values):
            return values[0]
        chain = self.setup.chain
        assert chain is not None
        first, second = (v if v is not None else cst.Name("None") for v in values)
        return cst.IfExp(test=chain.test.deep_clone(), body=first, orelse=second)

    def _disabled_scaler(self) -> bool:
        """apex.fp16_utils with a literal static scale of 1: no scaling, no overflow check."""
        construction = self.setup.first
        return (
            self.flavor == "fp16_utils"
            and len(self.setup.constructions) == 1
            and construction.static is not None
            and construction.dynamic_test is None
            and syntax.literal(construction.static) == 1.0
        )

    def _check_stable(self, expression: cst.BaseExpression, what: str) -> None:
        """``expression`` is evaluated again later (each step, or where autocast starts): it must be a
        plain read of names the function does not assign after the FP16_Optimizer set-up."""
        ctx = self.ctx
        allowed = _PLAIN_TEST_NODES
        read: set[str] = set()
        for node in syntax.descendants(expression):
            if not isinstance(node, allowed):
                raise _Blocked(
                    self.setup.first.call,
                    f"{what} `{syntax.code(expression).strip()}` is computed, and GradScaler reads it again at every "
                    f"step: assign it to a name first (`fp16_flag = ...`) and use that name",
                )
            name = dotted_name(node) if isinstance(node, (cst.Name, cst.Attribute)) else None
            if name is not None:
                read.add(name)
        for node, dotted in _stores_of(ctx, read, self.setup.scope):
            if ctx.position(node)[0] > self.start_line:
                raise _Blocked(
                    node,
                    f"`{dotted}` changes after the FP16_Optimizer set-up, and {what} "
                    f"`{syntax.code(expression).strip()}` is read again at every step: keep it in a name "
                    "that does not change",
                )

    def plan_scaler(self) -> None:
        ctx, setup = self.ctx, self.setup
        if self.switch is not None:
            self._check_stable(self.switch, "the fp16 switch")
        if setup.chain is not None:
            self._check_stable(setup.chain.test, "the test choosing the loss scale")
        for construction in setup.constructions:
            if construction.static is not None:
                self._check_stable(construction.static, "the static loss scale")
            if construction.dynamic_test is not None:
                self._check_stable(construction.dynamic_test, "dynamic_loss_scale")
        args = [cst.Arg(syntax.string(ctx.options.device))]
        disabled = self._disabled_scaler()
        if not disabled:
            init = self._scale_expression("init")
            if init is not None:
                args.append(syntax.keyword("init_scale", init))
            intervals = {
                c.growth_interval for c in setup.constructions if c.static is None or c.dynamic_test is not None
            }
            if len(intervals) > 1:
                raise _Blocked(setup.first.call, "the two clauses ask for different dynamic settings; write " + _RECIPE)
            interval = next(iter(intervals), None)
            if interval is not None:
                args.append(syntax.keyword("growth_interval", cst.Integer(str(interval))))
        if disabled:
            args.append(syntax.keyword("enabled", cst.Name("False")))
        elif self.enabled is not None:
            args.append(syntax.keyword("enabled", self.enabled.deep_clone()))
        creation = syntax.assign_statement(cst.Name(self.scaler), syntax.call("torch.amp.GradScaler", args))
        for construction in setup.constructions:
            replacement: list[Statement] = []
            if not (isinstance(construction.inner, cst.Name) and construction.inner.value == construction.target):
                inner = construction.inner
                if inner is construction.fused and construction.legacy is not None:
                    inner = construction.legacy.with_changes(func=cst.Name(self.helper))
                replacement.append(syntax.assign_statement(cst.Name(construction.target), inner.deep_clone()))
            if self.outermost is construction.statement:
                replacement.append(creation)
            if replacement:
                self.edits.replace_statement[construction.statement] = replacement
            else:
                self.edits.remove.add(construction.statement)
            self.edits.consumed.add(construction.root)
            self.edits.notes.extend(construction.notes)
            if construction.static is not None and not disabled and self.flavor == "fp16_utils":
                # apex.optimizers' FP16_Optimizer skipped overflowing steps at a static scale too
                self.edits.notes.append(("AMP002", construction.call, None))
        if self.outermost not in [c.statement for c in setup.constructions]:
            self.edits.before.setdefault(self.outermost, []).append(creation)

    # --- uses of the optimizer
    def _in_scope(self, node: cst.CSTNode) -> bool:
        """Whether a use of the name at ``node`` refers to this optimizer."""
        ctx, scope = self.ctx, self.setup.scope
        current: cst.CSTNode | None = ctx.scope_of(node)
        if current is scope:
            return True
        chain = []
        while current is not None and current is not scope and not isinstance(current, cst.Module):
            chain.append(current)
            current = ctx.scope_parent.get(current, ctx.module)  # type: ignore[call-overload]
        if current is not scope:
            return False  # a sibling function: its own name
        if any(self.name in ctx.locals.get(inner, set()) for inner in chain):  # type: ignore[call-overload]
            return False  # a local (or parameter) of the same name
        if not isinstance(scope, cst.Module) and not all(
            isinstance(inner, cst.FunctionDef) and inner.name.value in self.closures for inner in chain
        ):
            if self._group_setting(node, chain[0]):
                return True
            groups = ctx.parent(node)
            if isinstance(groups, cst.Attribute) and groups.value is node and groups.attr.value == "param_groups":
                raise _Blocked(
                    node,
                    f"`{self.name}.param_groups` is read in a nested function other than for a group's settings "
                    f'(`group["lr"]`): under Apex its groups\' `"params"` were FP16_Optimizer\'s float32 masters, '
                    f"whose gradients were unscaled, and migrated they are the model's parameters, whose gradients "
                    f"stay scaled until `{self.scaler}.unscale_({self.name})`: pass `{self.scaler}` to it and unscale "
                    "first, or read only the groups' settings there",
                )
            raise _Blocked(node, f"`{self.name}` is used in a nested function: pass `{self.scaler}` to it as well")
        return True

    def _reads_group_params(self, node: cst.CSTNode) -> bool:
        """Whether ``node.param_groups`` is read for its groups' ``"params"``: ``X.param_groups[i]["params"]``, or
        ``group["params"]`` in the loop or comprehension ``for group in X.param_groups``."""
        ctx = self.ctx
        groups = ctx.parent(node)
        outer = ctx.parent(groups) if groups is not None else None

        def params_of(subscript: cst.CSTNode | None, value: cst.CSTNode) -> bool:
            if not (isinstance(subscript, cst.Subscript) and subscript.value is value and len(subscript.slice) == 1):
                return False
            index = subscript.slice[0].slice
            return isinstance(index, cst.Index) and syntax.literal(index.value) == "params"

        if isinstance(outer, cst.Subscript) and outer.value is groups:
            return params_of(ctx.parent(outer), outer)
        if not (
            isinstance(outer, (cst.For, cst.CompFor)) and outer.iter is groups and isinstance(outer.target, cst.Name)
        ):
            return False
        region: cst.CSTNode | None = outer
        if isinstance(outer, cst.CompFor):
            while region is not None and not isinstance(
                region, (cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)
            ):
                region = ctx.parent(region)
        if region is None:
            return False
        group = outer.target.value
        return any(
            isinstance(other, cst.Name) and other.value == group and params_of(ctx.parent(other), other)
            for other in ctx.walk(region)
        )

    def _group_setting(self, node: cst.CSTNode, function: cst.CSTNode) -> bool:
        """A nested function's ``for group in optimizer.param_groups: group["lr"] = lr`` (or
        ``optimizer.param_groups[0]["lr"]``): Apex's FP16_Optimizer.param_groups is a property returning
        the wrapped optimizer's list, which the migrated name now is, so the same dicts are read and
        written. Only keys other than ``"params"`` (those lists held Apex's float32 masters, whose
        gradients were unscaled, where the migrated groups hold the model's parameters)."""
        ctx = self.ctx
        groups = ctx.parent(node)
        if not (isinstance(groups, cst.Attribute) and groups.value is node and groups.attr.value == "param_groups"):
            return False
        if _is_store(ctx, groups):
            return False

        def setting(subscript: cst.CSTNode | None, value: cst.CSTNode) -> bool:
            # `value[<a string literal, not "params">]`
            if not (isinstance(subscript, cst.Subscript) and subscript.value is value and len(subscript.slice) == 1):
                return False
            index = subscript.slice[0].slice
            if not isinstance(index, cst.Index) or not isinstance(index.value, cst.SimpleString):
                return False
            key = syntax.literal(index.value)
            return isinstance(key, str) and key != "params"

        outer = ctx.parent(groups)
        if isinstance(outer, cst.Subscript) and outer.value is groups:
            index = outer.slice[0].slice if len(outer.slice) == 1 else None
            if not (isinstance(index, cst.Index) and isinstance(index.value, cst.Integer)):
                return False
            return setting(ctx.parent(outer), outer)
        if not (
            isinstance(outer, (cst.For, cst.CompFor)) and outer.iter is groups and isinstance(outer.target, cst.Name)
        ):
            return False
        group = outer.target.value
        for other in ctx.walk(function):
            if isinstance(other, cst.Name) and other.value == group and other is not outer.target:
                parent = ctx.parent(other)
                if isinstance(parent, cst.Attribute) and parent.attr is other:
                    continue
                if not setting(parent, other):
                    return False
        return True

    def uses(self) -> list[cst.Name]:
        ctx = self.ctx
        skip = {id(node) for c in self.setup.constructions for node in ctx.walk(c.statement)}
        found = []
        for node in ctx.nodes_of(cst.Name):
            if node.value != self.name or id(node) in skip:
                continue
            parent = ctx.parent(node)
            if isinstance(parent, cst.Attribute) and parent.attr is node:
                continue
            if isinstance(parent, (cst.ImportAlias, cst.AsName, cst.Param)):
                continue
            if not self._in_scope(node):
                continue
            if ctx.position(node)[0] < self.start_line:
                continue  # the optimizer before it was wrapped
            found.append(node)
        return found

    def _torch_scheduler(self, node: cst.Name) -> str | None:
        """The callee, where ``node`` is the first argument of a torch LR scheduler's constructor
        (``torch.optim.lr_scheduler.*``, or a LambdaLR factory of transformers / pytorch_transformers)."""
        ctx = self.ctx
        arg = ctx.parent(node)
        call = ctx.parent(arg) if isinstance(arg, cst.Arg) else None
        if not isinstance(call, cst.Call) or not call.args or call.args[0] is not arg or arg.keyword is not None:
            return None
        callee = dotted_name(call.func)
        if callee is None:
            return None
        if ".lr_scheduler." in f".{callee}":
            return callee
        last = callee.rsplit(".", 1)[-1]
        if last not in _LAMBDA_LR_FACTORIES:
            return None
        if "." in callee:
            return callee if callee.split(".", 1)[0] in ("transformers", "pytorch_transformers") else None
        for statement in ctx.nodes_of(cst.ImportFrom):
            module = dotted_name(statement.module) if statement.module is not None else None
            if module is None or module.split(".")[0] not in ("transformers", "pytorch_transformers", "torch"):
                continue
            if isinstance(statement.names, cst.ImportStar):
                continue
            for alias in statement.names:
                bound = alias.asname.name if alias.asname is not None else alias.name
                if isinstance(bound, cst.Name) and bound.value == last and dotted_name(alias.name) == last:
                    return callee
        return None

    def plan_uses(self) -> None:
        # every use that cannot migrate, so the finding lists them all rather than the first alone
        blocked: list[_Blocked] = []
        for node in self.uses():
            try:
                self._plan_use(node)
            except _Blocked as error:
                if not any(b.message == error.message for b in blocked):
                    blocked.append(error)
        if len(blocked) == 1:
            raise blocked[0]
        if blocked:
            raise _Blocked(
                blocked[0].node,
                "; ".join(
                    (f"line {self.ctx.position(b.node)[0]}: " if i else "") + b.message for i, b in enumerate(blocked)
                ),
            )
        if not self.stepped:
            raise _Blocked(
                self.setup.first.call,
                f"no `{self.name}.step()` is found where `{self.name}` is in scope: write `{self.scaler}.step({self.name})` "
                f"and `{self.scaler}.update()` where it steps",
            )

    def _plan_use(self, node: cst.Name) -> None:
        ctx, name = self.ctx, self.name
        if _is_store(ctx, node):
            exclusive = all(_exclusive(ctx, node, c.statement) for c in self.setup.constructions)
            if self.flavor == "optimizers" and exclusive:
                # `if fp16: ...FP16_Optimizer... else: optimizer = BertAdam(...)`: the other path's optimizer
                # (its zero_grad() is left as written, so any optimizer class takes the migrated calls)
                return
            if exclusive:
                # the float32 path's optimizer meets `zero_grad(set_to_none=...)` and a disabled scaler's step
                small = syntax.sole_statement(ctx.statement_of(node))
                value = small.value if isinstance(small, cst.Assign) and len(small.targets) == 1 else None
                callee = dotted_name(value.func) if isinstance(value, cst.Call) else None
                if callee is not None and _torch_optim_path(ctx, callee, node):
                    return
                raise _Blocked(
                    node,
                    f"`{name}` is built here on the path without FP16_Optimizer by something other than a torch.optim "
                    f"class, which the migrated `{name}.zero_grad(set_to_none=...)` and `{self.scaler}.step({name})` "
                    f"would reach too: build it with `torch.optim.<Class>(...)`, or write {_RECIPE}",
                )
            raise _Blocked(node, f"`{name}` is assigned again after FP16_Optimizer wrapped it")
        parent = ctx.parent(node)
        scheduler = self._torch_scheduler(node)
        if scheduler is not None:
            raise _Blocked(
                node,
                f"`{scheduler}(...)` builds a torch LR scheduler on `{name}`, and torch's LRScheduler raises "
                "TypeError ('FP16_Optimizer is not an Optimizer') for Apex's FP16_Optimizer, a plain object: the fp16 "
                "path stopped here, so there is no Apex run to reproduce. To train it in fp16, build the scheduler on "
                "the wrapped optimizer and write " + _RECIPE,
            )
        if self._passed_to_group_reader(node):
            return
        if isinstance(parent, cst.Return):
            raise _Blocked(
                node,
                f"`return {name}` hands the optimizer to the callers, which call its backward and step: they would "
                f"need the GradScaler too; return "
                f"it with the optimizer (`return {name}, {self.scaler}`) and write `{self.scaler}.scale(loss).backward()`, "
                f"`{self.scaler}.step({name})`, `{self.scaler}.update()` where they use it" + self._callers(),
            )
        if not (isinstance(parent, cst.Attribute) and parent.value is node):
            raise _Blocked(
                node,
                f"`{name}` is passed or stored as a value here: the code that receives it would need the "
                f"GradScaler too; pass `{self.scaler}` along and write `{self.scaler}.scale(loss).backward()`, "
                f"`{self.scaler}.step({name})`, `{self.scaler}.update()` there",
            )
        attribute = parent.attr.value
        outer = ctx.parent(parent)
        if attribute == "param_groups" and self._reads_group_params(node):
            raise _Blocked(
                parent,
                f'the groups\' `"params"` of `{name}.param_groups` are read here: under Apex they were '
                "FP16_Optimizer's float32 masters, whose gradients `backward` had unscaled, and migrated they are the "
                f"model's parameters, whose gradients stay scaled until `{self.scaler}.unscale_({name})`: write "
                f"{_RECIPE}, with `{self.scaler}.unscale_({name})` after the backward and before this read (once per "
                "step)",
            )
        if attribute in ("param_groups", "state"):
            return
        if attribute == ("cur_scale" if self.flavor == "optimizers" else "loss_scale"):
            if _is_store(ctx, parent):
                raise _Blocked(parent, f"`{name}.{attribute}` is set: set the scaler's with `update(new_scale=...)`")
            self.edits.substitute[parent] = syntax.attribute_call(cst.Name(self.scaler), "get_scale")
            return
        if not (isinstance(outer, cst.Call) and outer.func is parent):
            raise _Blocked(parent, self._advice(attribute))
        handler = {
            "backward": self._backward,
            "step": self._step,
            "zero_grad": self._zero_grad,
            "clip_master_grads": self._clip if self.flavor == "fp16_utils" else None,
            "state_dict": self._state_dict,
            "load_state_dict": self._load_state_dict,
        }.get(attribute)
        if handler is None:
            raise _Blocked(outer, self._advice(attribute))
        handler(outer)

    def check_half_feeds(self) -> None:
        """The migrated model is float32; where Apex's float16 model was run outside the forward pass the
        rule puts under torch.autocast (an evaluation), an input cast to float16 by hand would meet float32
        weights (``Input type (Half) and weight type (Float)``). So: no cast to float16 reaching the model
        (``half_inputs``) and no call handing the model together with the fp16 switch (ASFF's
        ``evaluator.evaluate(model, args.half)``, whose evaluator picks ``torch.cuda.HalfTensor``) outside
        the autocast regions planned."""
        ctx = self.ctx
        names = {name.split(".")[-1] for name in self._trained_models()} | self.model_names
        if not names:
            return
        regions = []
        for first, last, _ in self.edits.wraps:
            regions.append((ctx.lines(first)[0], ctx.lines(last)[1]))

        def covered(line: int) -> bool:
            return any(start <= line <= end for start, end in regions)

        blocked: list[_Blocked] = []
        with_autocast = (
            f'under `with torch.autocast("{ctx.options.device}", dtype=torch.{ctx.options.dtype}'
            + (f", enabled={syntax.code(self.enabled).strip()}" if self.enabled is not None else "")
            + "):`"
        )
        for feed in half_inputs.feeds(pytree.parse(ctx.source), ctx.source, frozenset(names)):
            if covered(feed.call_line):
                continue
            blocked.append(
                _Blocked(
                    self.setup.first.call,
                    f"line {feed.line} casts to float16 (`{feed.cast}`) what line {feed.call_line} hands to "
                    f"`{feed.model}` outside the forward pass put under torch.autocast: the migrated model is float32, "
                    "and that float16 input would meet float32 weights (`Input type (Half) and weight type (Float)`): "
                    f"write `{feed.bare}` instead, or put line {feed.call_line} {with_autocast}, then run ampmigrate again",
                )
            )
        switches = {conjunct for guard in self.guards for conjunct in _conjuncts(guard)}
        for call in ctx.nodes_of(cst.Call) if switches else []:
            if covered(ctx.position(call)[0]):
                continue
            model = flag = None
            for arg in call.args:
                dotted = dotted_name(arg.value)
                parts = (dotted or "").split(".")
                while len(parts) > 1 and parts[-1] == "module":
                    parts.pop()
                if dotted is not None and parts[-1] in names:
                    model = dotted
                elif syntax.normalized(arg.value) in switches:
                    flag = syntax.code(arg.value).strip()
            if model is None or flag is None:
                continue
            code = syntax.code(call).strip()
            blocked.append(
                _Blocked(
                    call,
                    f"`{code if len(code) <= 80 else code[:77] + '...'}` hands `{model}` the fp16 switch `{flag}` "
                    "with it, which the callee may use to cast its inputs to float16 for the float16 model Apex trained "
                    "(an evaluator choosing `torch.cuda.HalfTensor`); the migrated model is float32, and outside "
                    "torch.autocast a float16 input would meet float32 weights: put this call "
                    f"{with_autocast}, or pass it `False` for `{flag}` (float32 inputs), then run ampmigrate again",
                )
            )
        if len(blocked) > 1:
            raise _Blocked(
                blocked[0].node,
                "; ".join(
                    (f"line {ctx.position(b.node)[0]}: " if i else "") + b.message for i, b in enumerate(blocked)
                ),
            )
        if blocked:
            raise blocked[0]

    def _callers(self) -> str:
        """Where this module's callers of the set-up's function keep what it returns, and what each use
        of it there becomes (MASS's ``self.optimizers = {"model": self.get_optimizer_fp("model")}``)."""
        ctx = self.ctx
        function = self.setup.scope
        if not isinstance(function, cst.FunctionDef):
            return ""
        owner = ctx.class_of_method(function)
        callee = f"self.{function.name.value}" if owner is not None else function.name.value
        kept: dict[str, list[int]] = {}
        scopes: dict[str, cst.CSTNode] = {}  # a name keeps it in the caller's scope only
        for call in ctx.nodes_of(cst.Call):
            if dotted_name(call.func) != callee:
                continue
            small = syntax.sole_statement(ctx.statement_of(call))
            if not (isinstance(small, cst.Assign) and len(small.targets) == 1):
                return ""
            target = dotted_name(small.targets[0].target)
            value = small.value
            if target is None:
                return ""
            if "." not in target:
                scopes[target] = ctx.scope_of(call)
            if value is call:
                kept.setdefault(target, []).append(ctx.position(call)[0])
            elif isinstance(value, cst.Dict) and any(
                isinstance(e, cst.DictElement) and e.value is call for e in value.elements
            ):
                kept.setdefault(f"{target}[...]", []).append(ctx.position(call)[0])
            else:
                return ""
        if not kept:
            return ""
        recipes = [
            (c, _scaler_recipe(ctx, c.call, c.statement, self.flavor, c.target)) for c in self.setup.constructions
        ]
        scalers_named = " or ".join(
            f"`{creation}`{unknown}" + (f" where line {ctx.position(c.call)[0]} ran" if len(recipes) > 1 else "")
            for c, (creation, _, unknown) in recipes
        )
        parts: list[str] = [
            f"the scaler: {scalers_named}, built beside the optimizer"
            + (" on both paths" if "enabled=" in scalers_named else "")
            + ", over the float32 model (no "
            "`.half()` wherever it is made float16) with every forward pass and loss under "
            '`with torch.autocast("cuda", dtype=torch.float16):`'
        ]
        update = " or ".join(
            recipe[1] + (f" where line {ctx.position(c.call)[0]} ran" if len(recipes) > 1 else "")
            for c, recipe in recipes
        )
        for holder, lines in kept.items():
            where = ("lines " if len(lines) > 1 else "line ") + ", ".join(str(line) for line in lines)
            if holder.endswith("[...]"):
                container = holder[: -len("[...]")]
                last = container.rpartition(".")[2]
                scalers = container[: len(container) - len(last)] + (
                    last.replace("optimizer", "scaler") if "optimizer" in last else f"{last}_scalers"
                )
                uses = _holder_uses(ctx, container, scalers, "", update, self.flavor, scope=scopes.get(container))
                parts.append(
                    f"{where} {'keep' if len(lines) > 1 else 'keeps'} it in `{holder}`: keep its scaler under the "
                    f"same key in `{scalers}`" + (f", and write at its uses: {uses}" if uses else "")
                )
            else:
                last = holder.rpartition(".")[2]
                scaler = holder[: len(holder) - len(last)] + self.scaler
                uses = _holder_uses(ctx, holder, None, scaler, update, self.flavor, scope=scopes.get(holder))
                parts.append(
                    f"{where} {'keep' if len(lines) > 1 else 'keeps'} it in `{holder}`: keep its scaler in `{scaler}`"
                    + (f", and write at its uses: {uses}" if uses else "")
                )
        return " (" + "; ".join(parts) + ")"

    def _passed_to_group_reader(self, node: cst.Name) -> bool:
        """Project mode: ``set_lr(optimizer, ...)`` where the imported ``set_lr`` uses that parameter only
        as ``optimizer.param_groups`` (``ModuleFacts.param_group_readers``), the same groups on the
        wrapped optimizer as on Apex's FP16_Optimizer."""
        ctx = self.ctx
        arg = ctx.parent(node)
        call = ctx.parent(arg) if isinstance(arg, cst.Arg) else None
        if not isinstance(call, cst.Call) or not isinstance(arg, cst.Arg) or arg.star:
            return False
        callee = dotted_name(call.func)
        for alias, index, parameter in ctx.options.facts.param_group_readers:
            if alias != callee:
                continue
            if arg.keyword is not None:
                return arg.keyword.value == parameter
            position = list(call.args).index(arg)
            return position == index and not any(a.star for a in call.args[:position])
        return False

    def _advice(self, attribute: str) -> str:
        name, scaler = self.name, self.scaler
        if attribute in ("state_dict", "load_state_dict"):
            return (
                f'`{name}.{attribute}` is not called here: save `{{"optimizer": {name}.state_dict(), "scaler": '
                f"{scaler}.state_dict()}}` and load both halves with `{name}.load_state_dict(...)` and "
                f"`{scaler}.load_state_dict(...)`"
            )
        if attribute == "overflow":
            return (
                f"`{name}.overflow`: GradScaler has no public flag; under a dynamic scale a skipped step is the scale "
                f"dropping: `scale_before = {scaler}.get_scale()` before `{scaler}.update()`, then "
                f"`{scaler}.get_scale() < scale_before` for the flag"
            )
        if attribute == "update_master_grads":
            return (
                f"`{name}.update_master_grads()` copied the float16 gradients, unscaled, into the float32 masters; "
                f"GradScaler keeps the gradients scaled until `{scaler}.unscale_({name})` or `{scaler}.step({name})`: "
                f"drop it with `update_master_grads=False`, write `{scaler}.scale(loss).backward()`, and clip after "
                f"`{scaler}.unscale_({name})`"
            )
        known = _APEX_ATTRIBUTES.get(self.flavor)
        binding = self.ctx.resolve(self.setup.first.root.value, self.setup.first.root)
        if known and attribute not in known and not attribute.startswith("_") and (binding and not binding.copy):
            return (
                f"Apex's {self.setup.first.path} has no `{attribute}`: where this line runs with it, it raised "
                f"AttributeError, so there is no Apex run to reproduce; to train in fp16, replace `{name}.{attribute}` "
                f"(the learning rates are in `{name}.param_groups`; a clip is `{scaler}.unscale_({name})` then "
                f"`torch.nn.utils.clip_grad_norm_`) and write {_RECIPE}"
            )
        return f"`{name}.{attribute}` has no GradScaler counterpart: {_RECIPE}"

    def _statement_line(self, call: cst.Call) -> cst.SimpleStatementLine:
        statement = self.ctx.statement_of(call)
        if not (
            isinstance(statement, cst.SimpleStatementLine)
            and len(statement.body) == 1
            and isinstance(statement.body[0], cst.Expr)
            and statement.body[0].value is call
        ):
            raise _Blocked(
                call, f"not a statement of its own: write `{syntax.code(call).strip()}` on a line of its own"
            )
        return statement

    def _backward(self, call: cst.Call) -> None:
        # apex.optimizers' FP16_Optimizer.backward took the loss alone
        parameters = ("loss",) if self.flavor == "optimizers" else ("loss", "update_master_grads", "retain_graph")
        bound = syntax.bind_arguments(call, parameters)
        if bound is None or "loss" not in bound:
            raise _Blocked(
                call,
                "backward() is called with *args/**kwargs or a keyword Apex does not take: write "
                f"`{self.name}.backward(loss)`",
            )
        if "update_master_grads" in bound:
            raise _Blocked(
                call,
                "backward(update_master_grads=...) delays the master gradients: with GradScaler accumulate with "
                f"`{self.scaler}.scale(loss).backward()` and step at the boundary",
            )
        loss = syntax.strip_parens(bound["loss"].value)
        backward_args = (
            [syntax.keyword("retain_graph", bound["retain_graph"].value.deep_clone())]
            if "retain_graph" in bound
            else []
        )
        scaled = syntax.attribute_call(
            syntax.attribute_call(cst.Name(self.scaler), "scale", [cst.Arg(loss.deep_clone())]),
            "backward",
            backward_args,
        )
        statement = self._statement_line(call)
        collapsed = self._collapse(statement, loss, backward_args, scaled)
        if not collapsed:
            self.edits.substitute[call] = scaled
        # the loss as written: a parenthesized one stripped above is a new node the context cannot walk
        self._autocast(statement, bound["loss"].value, call)

    def _collapse(
        self, statement: cst.SimpleStatementLine, loss: cst.BaseExpression, args: list[cst.Arg], scaled: cst.Call
    ) -> bool:
        """``if <guard>: opt.backward(loss) else: loss.backward()`` -> one scaled backward."""
        ctx = self.ctx
        block = ctx.parent(statement)
        branch = ctx.parent(block) if isinstance(block, cst.IndentedBlock) else None
        if self.switch is None or not isinstance(branch, cst.If) or branch.body is not block or len(block.body) != 1:
            return False
        if syntax.normalized(branch.test) != syntax.normalized(self.switch) or not isinstance(branch.orelse, cst.Else):
            return False
        other = branch.orelse.body.body if isinstance(branch.orelse.body, cst.IndentedBlock) else ()
        expected = syntax.code(syntax.attribute_call(loss, "backward", args))
        if len(other) != 1 or not isinstance(other[0], cst.SimpleStatementLine):
            return False
        fp32_line = other[0]
        if "".join(syntax.code(fp32_line.with_changes(leading_lines=())).split("#")[0].split()) != "".join(
            expected.split()
        ):
            return False
        self.edits.replace_statement[branch] = [
            cst.SimpleStatementLine([cst.Expr(scaled)], leading_lines=branch.leading_lines)
        ]
        return True

    def _autocast(self, statement: cst.CSTNode, loss: cst.BaseExpression, report_at: cst.CSTNode) -> None:
        ctx = self.ctx
        span = forward_span(ctx, statement, loss, self.model_names)
        if span is None:
            raise _Blocked(
                report_at,
                "the forward pass feeding this backward could not be found, so no torch.autocast can be added "
                "(a GradScaler over a float32 forward pass would not train like Apex's float16 model): compute "
                "the loss in this function and run ampmigrate again, or put the forward pass and the loss under "
                '`with torch.autocast("cuda", dtype=torch.float16):` where they are computed',
            )
        args = [
            cst.Arg(syntax.string(ctx.options.device)),
            syntax.keyword("dtype", syntax.dotted(f"torch.{ctx.options.dtype}")),
        ]
        if self.enabled is not None:
            if ctx.function_of(span[0]) is not ctx.function_of(self.setup.first.call):
                if self._disabled_scaler():
                    raise _Blocked(
                        report_at,
                        "autocast's enabled flag is not reachable here: write "
                        '`with torch.autocast("cuda", dtype=torch.float16, enabled=...):` around the forward pass',
                    )
                args.append(syntax.keyword("enabled", syntax.attribute_call(cst.Name(self.scaler), "is_enabled")))
            else:
                args.append(syntax.keyword("enabled", self.enabled.deep_clone()))
        self.edits.wraps.append((span[0], span[1], cst.WithItem(syntax.call("torch.autocast", args))))

    def _step(self, call: cst.Call) -> None:
        if call.args:
            self._step_with_closure(call)
            return
        self.stepped = True
        statement = self._statement_line(call)
        self.edits.substitute[call] = syntax.attribute_call(
            cst.Name(self.scaler), "step", [cst.Arg(cst.Name(self.name))]
        )
        hold = None if self._disabled_scaler() else self._scale_expression("hold")
        update_args = [syntax.keyword("new_scale", hold)] if hold is not None else []
        update = syntax.expression_statement(syntax.attribute_call(cst.Name(self.scaler), "update", update_args))
        self.edits.after.setdefault(statement, []).append(update)
        floor = self._scale_floor()
        if floor is not None:
            self.edits.after[statement].append(floor)

    def _step_with_closure(self, call: cst.Call) -> None:
        """``X.step(closure)`` -> ``X.step(scaled_closure(closure, X, scaler))``: the wrapped optimizer
        steps on what the closure leaves, unscaled after each call, as FP16_Optimizer's step did."""
        ctx, name = self.ctx, self.name
        if self.flavor == "fp16_utils" and self._pre2019():
            raise _Blocked(
                call,
                "this copy of FP16_Optimizer raised TypeError for step(closure) under dynamic loss scaling: call the "
                f"closure before the step, then `{self.scaler}.step({name})` and `{self.scaler}.update()`",
            )
        if self.flavor != "fp16_utils":
            raise _Blocked(
                call,
                "apex.optimizers' FP16_Optimizer.step ignored its closure (it never called it): call the closure "
                f"before the step yourself, or drop it, then `{self.scaler}.step({name})` and `{self.scaler}.update()`",
            )
        bound = syntax.bind_arguments(call, ("closure",))
        closure = bound.get("closure") if bound is not None else None
        wanted = closure.value.value if closure is not None and isinstance(closure.value, cst.Name) else None
        definitions = [
            scope for scope in ctx.locals if isinstance(scope, cst.FunctionDef) and scope.name.value == wanted
        ]
        backward = [
            node
            for f in definitions
            for node in syntax.descendants(f.body)
            if isinstance(node, cst.Call)
            and isinstance(node.func, cst.Attribute)
            and node.func.attr.value == "backward"
            and isinstance(node.func.value, cst.Name)
            and node.func.value.value == name
        ]
        zeroed = any(
            isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "zero_grad"
            for f in definitions
            for node in syntax.descendants(f.body)
        )
        if closure is None or len(definitions) != 1 or not backward:
            raise _Blocked(
                call,
                f"step(closure) with a closure that is not a function of this module calling `{name}.backward(loss)`: "
                f"write the closure with `{self.scaler}.scale(loss).backward()`, then unscale and update after each "
                f"call (`{self.scaler}.unscale_({name})`, `{self.scaler}.update()`) and call `{name}.step(closure)`",
            )
        if not zeroed:
            raise _Blocked(
                call,
                "the closure does not zero the gradients: the optimizer may call it more than once per step, and "
                "Apex rebuilt the master gradients from the fp16 ones at each call where the unscaled gradients "
                f"would now add up; call `{name}.zero_grad()` at the start of the closure",
            )
        self.stepped = True
        hold = None if self._disabled_scaler() else self._scale_expression("hold")
        args = [cst.Arg(closure.value.deep_clone()), cst.Arg(cst.Name(name)), cst.Arg(cst.Name(self.scaler))]
        if hold is not None:
            args.append(cst.Arg(hold))
        if self.closure_helper is None:
            self.closure_helper = self._module_helper(_CLOSURE_RUNNER, _CLOSURE_HELPER)
        wrapped = syntax.call(self.closure_helper, args)
        self.edits.substitute[call] = call.with_changes(args=[cst.Arg(wrapped)])
        self.edits.notes.append(
            (
                "AMP041",
                call,
                f"`{name}.step(closure)` became `{name}.step({self.closure_helper}(closure, {name}, {self.scaler}"
                + (", new_scale)" if hold is not None else ")")
                + ")`: after each call of the closure the gradients are unscaled and the scale updated, and an "
                "overflow under a dynamic scale calls the closure again at the lowered scale, as FP16_Optimizer did",
            )
        )

    def _module_helper(self, template: str, preferred: str) -> str:
        """The name of ``template``'s helper: one already planned in the module, else a fresh one."""
        for helper in self.ctx.plan.module_helpers:
            if isinstance(helper, cst.FunctionDef) and syntax.code(helper) == template.format(name=helper.name.value):
                return helper.name.value
        return self.ctx.fresh_name(preferred)

    def _scale_floor(self) -> Statement | None:
        """apex.optimizers' FP16_Optimizer (and the pre-2019 DynamicLossScaler of fp16_utils copies)
        halved the dynamic scale down to 1, never below; GradScaler has no floor, so the migration puts
        the scale back to 1 after an update that went under it."""
        dynamic = [c.static is None for c in self.setup.constructions]
        if not any(c.floor for c in self.setup.constructions):
            return None
        test = f"{self.scaler}.get_scale() < 1.0"
        runtime = self.setup.first.dynamic_test
        if runtime is not None:
            condition = syntax.code(runtime).strip()
            if not isinstance(syntax.strip_parens(runtime), (cst.Name, cst.Attribute, cst.Comparison)):
                condition = f"({condition})"
            return cst.parse_statement(f"if {condition} and {test}:\n    {self.scaler}.update(new_scale=1.0)\n")
        chain = self.setup.chain
        if chain is not None and not all(dynamic):
            condition = syntax.code(chain.test).strip()
            if not isinstance(syntax.strip_parens(chain.test), (cst.Name, cst.Attribute, cst.Comparison)):
                condition = f"({condition})"
            test = f"{condition if dynamic[0] else 'not ' + condition} and {test}"
        return cst.parse_statement(f"if {test}:\n    {self.scaler}.update(new_scale=1.0)\n")

    def _zero_grad(self, call: cst.Call) -> None:
        bound = syntax.bind_arguments(call, ("set_grads_to_None",))
        if bound is None:
            raise _Blocked(
                call,
                "zero_grad() is called with *args/**kwargs or a keyword Apex does not take: write "
                f"`{self.name}.zero_grad(set_grads_to_None=...)`",
            )
        if "set_grads_to_None" in bound:
            value = bound["set_grads_to_None"].value.deep_clone()
        elif self.flavor == "optimizers":
            return  # it set the grads to None by default, as torch's zero_grad() does
        elif self.enabled is None:
            value = cst.Name("False")
        else:
            # FP16_Optimizer zeroed the gradients; the plain optimizer of the fp32 path sets them to None
            assert self.switch is not None
            inner = self.switch.deep_clone()
            if isinstance(inner, (cst.BooleanOperation, cst.Comparison)):
                inner = inner.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
            value = cst.UnaryOperation(cst.Not(), inner)
        self.edits.substitute[call] = call.with_changes(args=[syntax.keyword("set_to_none", value)])

    def _state_dict(self, call: cst.Call) -> None:
        """``X.state_dict()`` -> ``{"optimizer": X.state_dict(), "scaler": scaler.state_dict()}``: one value
        wherever the old one went, which the load helper reads back."""
        if call.args:
            raise _Blocked(call, "state_dict() takes no arguments: write `" + self._checkpoint_code() + "`")
        code = self._checkpoint_code()
        if self.enabled is not None:
            # the float32 path saves what it saved before: a plain optimizer's state dict
            code = f"({code} if {self.scaler}.is_enabled() else {self.name}.state_dict())"
        self.edits.substitute[call] = cst.parse_expression(code)
        self.edits.notes.append(
            (
                "AMP041",
                call,
                f"`{self.name}.state_dict()` became `{code}`: the optimizer's and the scaler's states, which the "
                f"migrated `{self.name}.load_state_dict(...)` reads back (the float32 master weights are the model's "
                "own parameters now)",
            )
        )

    def _checkpoint_code(self) -> str:
        return f'{{"optimizer": {self.name}.state_dict(), "scaler": {self.scaler}.state_dict()}}'

    def _load_helper_name(self) -> str:
        """One loader per flavour per module, written once when the setup commits."""
        if self.load_helper is None:
            template = _LOAD_LEGACY if self.flavor == "optimizers" else _LOAD_FP16_UTILS
            self.load_helper = self._module_helper(template, _LOAD_HELPER)
        return self.load_helper

    def _pre2019(self) -> bool:
        """A local copy of apex.fp16_utils whose dynamic scaling is the pre-2019 DynamicLossScaler."""
        return self.flavor == "fp16_utils" and any(c.floor for c in self.setup.constructions)

    def _load_state_dict(self, call: cst.Call) -> None:
        """``X.load_state_dict(s)`` -> ``load_fp16_optimizer_state(X, scaler, s)``, which also takes the
        checkpoints Apex's FP16_Optimizer wrote."""
        ctx, name = self.ctx, self.name
        if self._pre2019():
            raise _Blocked(
                call,
                "the checkpoints this copy of FP16_Optimizer wrote pickle its pre-2019 DynamicLossScaler, which the "
                "load helper does not read: load `state['optimizer_state_dict']` into the optimizer, copy "
                "`state['fp32_from_fp16']` into the float16 parameters' places, and give the scaler "
                "`scaler.update(new_scale=state['loss_scaler'].cur_scale)`",
            )
        bound = syntax.bind_arguments(call, ("state_dict",))
        if bound is None or "state_dict" not in bound:
            raise _Blocked(
                call, f"load_state_dict() is not called with one state dict: write `{name}.load_state_dict(state)`"
            )
        if self.partly_half:
            raise _Blocked(
                call,
                "the model was halved by network_to_half/FP16Model/BN_convert_float, which kept batch norms float32: "
                "an Apex checkpoint's float32 master weights cover only the float16 parameters, and which ones they "
                f'were cannot be told from the float32 model: write `{name}.load_state_dict(state["optimizer_state_dict"])`, '
                'copy `state["fp32_from_fp16"][i][j]` onto the j-th parameter of group i that was float16 under Apex '
                "(batch norms excluded), and set the scale with "
                f'`{self.scaler}.update(new_scale=float(state["loss_scaler"].loss_scale()))`',
            )
        line = ctx.position(call)[0]
        function = ctx.function_of(call)
        for other in ctx.nodes_of(cst.Call):
            func = other.func
            if not (isinstance(func, cst.Attribute) and func.attr.value == "load_state_dict"):
                continue
            receiver = dotted_name(func.value)
            if receiver is None or ctx.function_of(other) is not function or ctx.position(other)[0] <= line:
                continue
            if self._model_like(receiver.split(".")[-1]):
                raise _Blocked(
                    other,
                    f"`{receiver}.load_state_dict(...)` runs after `{name}.load_state_dict(...)`: the model's "
                    "float16 weights of an Apex checkpoint would overwrite the float32 master weights the optimizer "
                    f"loaded into the now float32 model; load the model first, then `{name}`",
                )

        def load(updated: cst.CSTNode, helper: str = self._load_helper_name()) -> cst.CSTNode:
            assert isinstance(updated, cst.Call)
            # `load_state_dict(state_dict=sd)`: the helper takes the state positionally
            state = updated.args[0].with_changes(
                comma=cst.MaybeSentinel.DEFAULT, keyword=None, equal=cst.MaybeSentinel.DEFAULT
            )
            return syntax.call(helper, [cst.Arg(cst.Name(name)), cst.Arg(cst.Name(self.scaler)), state])

        self.edits.replace[call] = load
        self.load_needed = True
        pickled = (
            "; torch.load of an Apex checkpoint needs `weights_only=False` and Apex's `apex.amp.scaler.LossScaler` "
            "importable (the checkpoint pickled that object)"
            if self.flavor == "fp16_utils"
            else ""
        )
        self.edits.notes.append(
            (
                "AMP041",
                call,
                f"`{name}.load_state_dict(...)` became `{self._load_helper_name()}({name}, {self.scaler}, ...)`: it "
                f"loads what the migrated `{name}.state_dict()` saves, and a checkpoint Apex's FP16_Optimizer wrote "
                "(its float32 master weights into the model's parameters, its loss scale and clean-step count into "
                "the scaler)" + pickled,
            )
        )

    def _clip(self, call: cst.Call) -> None:
        ctx = self.ctx
        bound = syntax.bind_arguments(call, ("max_norm", "norm_type"))
        if bound is None or "max_norm" not in bound:
            raise _Blocked(
                call,
                "clip_master_grads() is called with *args/**kwargs or a keyword Apex does not take: write "
                f"`{self.name}.clip_master_grads(max_norm, norm_type)`",
            )
        statement = ctx.statement_of(call)
        if not self._step_follows(statement):
            raise _Blocked(
                call,
                f"no `{self.name}.step()` follows this clip on every path (GradScaler unscales once per step): clip "
                f"just before the step, after `{self.scaler}.unscale_({self.name})`",
            )
        params = cst.parse_expression(f'(p for group in {self.name}.param_groups for p in group["params"])')
        args = [cst.Arg(params), cst.Arg(bound["max_norm"].value.deep_clone())]
        if "norm_type" in bound:
            args.append(cst.Arg(bound["norm_type"].value.deep_clone()))
        self.edits.substitute[call] = syntax.call("torch.nn.utils.clip_grad_norm_", args)
        unscale = syntax.expression_statement(
            syntax.attribute_call(cst.Name(self.scaler), "unscale_", [cst.Arg(cst.Name(self.name))])
        )
        self.edits.before.setdefault(statement, []).append(unscale)
        if not (isinstance(ctx.parent(call), cst.Expr)):
            self.edits.notes.append(
                (
                    "AMP041",
                    call,
                    "clip_master_grads became scaler.unscale_ + torch.nn.utils.clip_grad_norm_: on a step with "
                    "inf/NaN gradients the norm is inf or NaN where Apex returned -1 (the step is skipped either way)",
                )
            )

    def _step_follows(self, statement: cst.CSTNode) -> bool:
        """Whether every run of ``statement`` is followed by one ``X.step()`` of the same iteration:
        a later statement of its block, or of a block around it reached through ifs only."""
        ctx = self.ctx
        current = statement
        while True:
            block = ctx.parent(current)
            if not isinstance(block, (cst.IndentedBlock, cst.Module)):
                return False
            body: list[cst.CSTNode] = list(block.body)
            for later in body[body.index(current) + 1 :]:
                if self._is_step_statement(later):
                    return True
            owner = _first_if_of(ctx, block)
            if owner is None:
                return False
            current = owner

    def _is_step_statement(self, statement: cst.CSTNode) -> bool:
        small = syntax.sole_statement(statement)
        call = small.value if isinstance(small, cst.Expr) else None
        return (
            isinstance(call, cst.Call)
            and not call.args  # a step(closure) recomputes the gradients the clip just clipped
            and isinstance(call.func, cst.Attribute)
            and call.func.attr.value == "step"
            and isinstance(call.func.value, cst.Name)
            and call.func.value.value == self.name
        )

    # --- the model stays float32
    def plan_model(self) -> None:
        """Remove the casts that made the model float16 for FP16_Optimizer (same guard, same scope)."""
        ctx = self.ctx
        guard_codes = [syntax.normalized(g) for g in self.guards]
        # models halved under exactly the set-up's guards before it: what FP16_Optimizer trained
        halved_before: set[str] = set()
        later: list[tuple[cst.Call, str, cst.CSTNode, list[str]]] = []
        # whether a cast of the trained model was seen here: without one it is made float16 out of
        # sight (a helper such as PKD's load_model(model, args), another module), or never is
        halved = False
        for call in ctx.nodes_of(cst.Call):
            if ctx.scope_of(call) is not self.setup.scope:
                continue
            halving = self._halving_call(call)
            if halving is None:
                continue
            statement = ctx.statement_of(call)
            if statement in self.edits.remove or statement in self.edits.replace_statement:
                halved = True
                continue
            if self._fresh_model(call, statement, halving):
                continue  # a model loaded after training (fp16 inference): it stays as it was
            halved = True
            conditions, _ = _guards(ctx, statement)
            codes = [syntax.normalized(c) for c in conditions]
            if codes != guard_codes and not self._same_tests_repeated(codes, guard_codes, statement):
                later.append((call, halving, statement, codes))
                continue
            if ctx.position(statement)[0] < self.start_line:
                halved_before.add(halving)
            self._drop_half(call, statement)
        # a helper that halves the model is kept float32 after too where a `.half()` is in sight (else the
        # model would stay float16 under the GradScaler)
        halved = self._halved_by_helpers(every_model=not halved) or halved
        held = self._model_held_elsewhere()
        if not halved and held is not None:
            raise _Blocked(
                self.setup.first.call,
                f"the model it trains is `{syntax.code(held).strip()}` (line {ctx.position(held)[0]}), which this "
                "function does not make (an attribute of the object, or an expression), so no `.half()` of it is in "
                "sight: the rule keeps float32 only a model halved where FP16_Optimizer is set up; write instead the "
                "float32 model (drop the `.half()` or network_to_half that makes it float16, wherever that is) with "
                'every forward pass and loss under `with torch.autocast("cuda", dtype=torch.float16):`',
            )
        if not halved:
            raise _Blocked(
                self.setup.first.call,
                self._source_of_models()
                + "no `.half()` of the model it trains is in sight where it is set up: that model is made float16 "
                "elsewhere (a helper such as `load_model(model, args)`, another module), and a GradScaler cannot "
                "unscale float16 gradients, or it stays float32, and autocast would compute in float16 what Apex "
                "computed in float32: make the model float16 with `.half()` beside the FP16_Optimizer (the rule "
                "then keeps it float32 under torch.autocast) and run ampmigrate again",
            )
        self._float_whatever_is_loaded(guard_codes)
        for call, halving, statement, codes in later:
            if self._halved_again(call, halving, statement, codes, guard_codes, halved_before):
                self._drop_half(call, statement)
                continue
            reason = self._halved_on_wider_guard(call, statement)
            if isinstance(reason, str):
                raise _Blocked(call, reason)
            self._drop_half(call, statement)
            self.edits.notes.append(("AMP041", call, reason[0]))

    def _float_whatever_is_loaded(self, guard_codes: list[str]) -> None:
        """``if not args.fp16: model = model.float()`` after a model is loaded whole (transformer-xl's
        restart, ``model = torch.load(f)``): under Apex the fp16 path kept a checkpoint's float16
        model for FP16_Optimizer, whose float32 masters were its weights made float; the migrated
        model must be float32 on that path too (a GradScaler cannot unscale float16 gradients), so
        the cast runs on every path. Only for a test of the set-up's guard (or a part of it), a trained
        model, no ``else``."""
        ctx = self.ctx
        models = set(self._trained_models())
        if len(self.guards) != 1 or not models:
            return
        # `if not args.fp16:` beside a set-up under `if args.cuda and args.fp16:` too: the model
        # stays float32 wherever its `.half()` went
        switches = {guard_codes[0], *_conjuncts(self.guards[0])}
        for test in ctx.walk(ctx.module):
            if not isinstance(test, cst.If) or test.orelse is not None or ctx.scope_of(test) is not self.setup.scope:
                continue
            negated = test.test
            if not (
                isinstance(negated, cst.UnaryOperation)
                and isinstance(negated.operator, cst.Not)
                and syntax.normalized(negated.expression) in switches
            ):
                continue
            body = [
                line
                for line in (test.body.body if isinstance(test.body, cst.IndentedBlock) else ())
                if isinstance(line, cst.SimpleStatementLine)
            ]
            if body and len(body) == len(test.body.body) and all(self._casts_a_model_to_float(b, models) for b in body):
                first = body[0].with_changes(leading_lines=[*test.leading_lines, *body[0].leading_lines])
                self.edits.replace_statement[test] = [first, *body[1:]]

    @staticmethod
    def _casts_a_model_to_float(line: cst.BaseStatement, models: set[str]) -> bool:
        """``model = model.float()`` or ``model.float()`` for one of ``models``."""
        if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
            return False
        small = line.body[0]
        value = small.value if isinstance(small, (cst.Assign, cst.Expr)) else None
        if not (
            isinstance(value, cst.Call)
            and not value.args
            and isinstance(value.func, cst.Attribute)
            and value.func.attr.value == "float"
        ):
            return False
        name = dotted_name(value.func.value)
        if name not in models:
            return False
        if isinstance(small, cst.Assign):
            return len(small.targets) == 1 and dotted_name(small.targets[0].target) == name
        return True

    def _trained_models(self) -> dict[str, cst.Call]:
        """The names whose ``.parameters()`` / ``.named_parameters()`` feed the optimizer (in the
        set-up's scope, before it), with the first such call."""
        ctx = self.ctx
        found: dict[str, cst.Call] = {}
        for call in ctx.nodes_of(cst.Call):
            func = call.func
            if ctx.scope_of(call) is not self.setup.scope or ctx.position(call)[0] > self.start_line:
                continue
            if isinstance(func, cst.Attribute) and func.attr.value in ("parameters", "named_parameters"):
                name = dotted_name(func.value)
                if name is not None:
                    found.setdefault(name, call)
        return found

    def _model_held_elsewhere(self) -> cst.BaseExpression | None:
        """The receiver of ``.parameters()`` feeding the optimizer when it is not a name of the set-up's
        function (``getattr(self, module)``, ``self.model``: MASS's trainer), else None."""
        ctx = self.ctx
        for call in ctx.nodes_of(cst.Call):
            func = call.func
            if ctx.scope_of(call) is not self.setup.scope or ctx.position(call)[0] > self.start_line:
                continue
            if isinstance(func, cst.Attribute) and func.attr.value in ("parameters", "named_parameters"):
                name = dotted_name(func.value)
                if name is None or "." in name:
                    return func.value
        return None

    def _source_of_models(self) -> str:
        """``(line N: `model` comes from `load_model(...)`, imported from `utils`) `` where a trained
        model is assigned from a call of an imported function before the set-up, else ""."""
        ctx = self.ctx
        for name in self._trained_models():
            for node in ctx.nodes_of(cst.Call):
                target = syntax.target_of(ctx.statement_of(node), node)
                if target is None or dotted_name(target) != name or ctx.scope_of(node) is not self.setup.scope:
                    continue
                callee = dotted_name(node.func)
                root = callee.split(".")[0] if callee else None
                imports = ctx.other_imports.get(ctx.module, {}).get(root or "", [])  # type: ignore[call-overload]
                if not imports or ctx.position(node)[0] > self.start_line:
                    continue
                statement_of_import = imports[-1]
                module = root or ""
                if isinstance(statement_of_import, cst.ImportFrom):
                    spelled = statement_of_import.module
                    module = "." * len(statement_of_import.relative) + (dotted_name(spelled) or "" if spelled else "")
                return (
                    f"`{name}` comes from `{callee}(...)` (line {ctx.position(node)[0]}, imported from `{module}`), "
                    f"which ampmigrate could not prove halves it under the set-up's test (project mode proves a "
                    "function that halves its model parameter in `if args.fp16: model.half()`, then casts nothing, "
                    "binds the model only to `torch.nn.DataParallel(model)` (not DistributedDataParallel, which a later "
                    "`.float()` would leave without gradient all-reduce) and returns it); "
                )
        return ""

    def _halved_by_helpers(self, every_model: bool = True) -> bool:
        """Project mode: every model the optimizer trains comes from an imported function that halves
        it under one of the set-up's tests (``ModuleFacts.halving_helpers``: DialoGPT's and PKD's
        ``model = load_model(model, checkpoint, args)``, shared with inference scripts, so its
        ``.half()`` stays). ``model.float()`` after each call, under the set-up's test, keeps the
        model float32 (raises _Blocked where the calls do not reach every path to the set-up, or, with
        ``every_model``, where a trained model comes from no such call)."""
        ctx = self.ctx
        facts = {fact[0]: fact for fact in ctx.options.facts.halving_helpers}
        trained = self._trained_models()
        if not facts or not trained or self.switch is None:
            return False
        setup = {c for guard in self.guards for c in _conjuncts(guard)}
        covered: set[str] = set()
        insertions: list[tuple[cst.CSTNode, str, str, cst.Call]] = []
        for call in ctx.nodes_of(cst.Call):
            callee = dotted_name(call.func)
            fact = facts.get(callee or "")
            if fact is None or ctx.scope_of(call) is not self.setup.scope:
                continue
            _, model_index, model, flag_index, flag, attribute, where = fact
            statement = ctx.statement_of(call)
            assigned = syntax.target_of(statement, call)
            if assigned is None:
                continue
            target = dotted_name(assigned)
            if target not in trained:
                continue
            names = [f"_{i}" for i in range(max(model_index, flag_index) + 1)]
            names[model_index], names[flag_index] = model, flag
            bound = syntax.bind_arguments(call, names, partial=True)
            flag_value = dotted_name(bound[flag].value) if flag in bound else None
            test = f"{flag_value}.{attribute}"
            if flag_value is None or model not in bound or test not in setup:
                shown = test if flag_value is not None else f"{flag}.{attribute}"
                raise _Blocked(
                    call,
                    f"`{callee}(...)` ({where}) halves `{target}` when `{shown}` holds, which is not "
                    f"one of the set-up's tests here: pass the flag the set-up tests, or halve `{target}` with "
                    "`.half()` under the set-up's `if`, and run ampmigrate again",
                )
            if ctx.position(call)[0] >= self.start_line or not self._on_every_path(statement, target, callee):
                raise _Blocked(
                    call,
                    f"`{target} = {callee}(...)` ({where} halves it under `{test}`) does not run on every path to the "
                    f"FP16_Optimizer set-up: halve `{target}` with `.half()` beside the set-up and run ampmigrate again",
                )
            covered.add(target)
            insertions.append((statement, target, test, call))
        missing = sorted(set(trained) - covered)
        if not insertions:
            return False
        if missing and every_model:
            raise _Blocked(
                self.setup.first.call,
                f"`{missing[0]}` is trained by it and not made float16 in sight (the others come from helpers that "
                "halve them): make it float16 with `.half()` beside the FP16_Optimizer and run ampmigrate again",
            )
        self._check_unchanged_between(min(ctx.position(s)[0] for s, *_ in insertions))
        switch = syntax.code(self.switch).strip()
        for statement, target, test, call in insertions:
            self.edits.after.setdefault(statement, []).append(
                cst.parse_statement(f"if {switch}:\n    {target}.float()\n")
            )
            self.edits.notes.append(
                (
                    "AMP041",
                    call,
                    f"`{syntax.code(call.func).strip()}(...)` halves `{target}` under `{test}` (its `.half()` stays for "
                    f"its other callers): `if {switch}: {target}.float()` after it keeps the model FP16_Optimizer "
                    "trained float32, from the float16-rounded weights Apex's float32 masters started from",
                )
            )
        return True

    def _on_every_path(self, statement: cst.CSTNode, target: str, callee: str | None) -> bool:
        """Whether ``statement`` (``target = callee(...)``) runs on every path to the set-up: it sits
        in a block around the set-up, or in a branch of an ``if``/``elif``/``else`` chain each of
        whose branches assigns ``target = callee(...)`` or ends with ``raise``, and so on up."""
        ctx = self.ctx
        around = set(ctx.ancestors(self.outermost))
        current = statement
        while True:
            block = ctx.parent(current)
            if block in around:
                return True
            if not isinstance(block, cst.IndentedBlock):
                return False
            owner = _first_if_of(ctx, block)
            if owner is None:
                return False
            clause: cst.If | cst.Else | None = owner
            while isinstance(clause, cst.If):
                if not self._clause_assigns(clause.body, target, callee):
                    return False
                clause = clause.orelse
            if not isinstance(clause, cst.Else) or not self._clause_assigns(clause.body, target, callee):
                return False
            current = owner

    def _clause_assigns(self, body: cst.BaseSuite, target: str, callee: str | None) -> bool:
        statements = list(body.body) if isinstance(body, cst.IndentedBlock) else []
        if statements and isinstance(syntax.sole_statement(statements[-1]), cst.Raise):
            return True
        for statement in statements:
            small = syntax.sole_statement(statement)
            if (
                isinstance(small, cst.Assign)
                and len(small.targets) == 1
                and dotted_name(small.targets[0].target) == target
                and isinstance(small.value, cst.Call)
                and dotted_name(small.value.func) == callee
            ):
                return True
        return False

    def _check_unchanged_between(self, first_line: int) -> None:
        """The names the set-up's switch reads are not assigned between ``first_line`` and the set-up."""
        ctx = self.ctx
        assert self.switch is not None
        read = {
            dotted_name(node)
            for node in syntax.descendants(self.switch)
            if isinstance(node, (cst.Name, cst.Attribute)) and dotted_name(node) is not None
        }
        for node in ctx.nodes_of(cst.Name):
            if ctx.scope_of(node) is not self.setup.scope or not first_line < ctx.position(node)[0] < self.start_line:
                continue
            target = ctx.parent(node)
            while isinstance(target, cst.Attribute) and target.value is node:
                node, target = target, ctx.parent(target)  # type: ignore[assignment]
            dotted = dotted_name(node)
            if dotted is not None and any(dotted == r or (r or "").startswith(dotted + ".") for r in read):
                if _is_store(ctx, node):
                    raise _Blocked(
                        node,
                        f"`{dotted}` changes between the helper that halves the model and the FP16_Optimizer set-up, "
                        f"whose test `{syntax.code(self.switch).strip()}` keeps the model float32 after that helper",
                    )

    def _halved_on_wider_guard(self, call: cst.Call, statement: cst.CSTNode) -> str | tuple[str]:
        """Whether ``model.half()`` before the set-up, under a part of its guards (transformer-xl:
        ``if args.fp16: model = model.half()``, then ``if args.cuda and args.fp16:`` around the
        FP16_Optimizer), only made float16 the model that FP16_Optimizer trains: where the half's guard
        holds without the set-up's, the model was float16 under the plain torch optimizer, and the
        first ``optimizer.backward(loss)`` raised AttributeError (every ``.backward()`` of the
        module is that call under the half's test, or ``loss.backward()`` in its ``else``), so that
        path never trained. Returns the note for the dropped half, or the reason it must stay."""
        ctx = self.ctx
        code = syntax.code(call).strip()
        move = (
            "move it under the very `if` of the set-up, before the optimizer is built (the rule then keeps the model "
            "float32 under torch.autocast; removed, no half would be in sight for the rule to keep), and run "
            "ampmigrate again"
        )
        conditions, _ = _guards(ctx, statement)
        halving = {c for condition in conditions for c in _conjuncts(condition)}
        setup = {c for guard in self.guards for c in _conjuncts(guard)}
        tests = " and ".join(f"`{c}`" for c in sorted(halving)) or "always"
        if not (halving < setup) or ctx.position(statement)[0] >= self.start_line:
            return (
                f"`{code}` makes the model float16 under other tests than the FP16_Optimizer set-up's: remove it, or "
                "put it under the very `if` of the set-up (the model stays float32 under torch.autocast), and run "
                "ampmigrate again"
            )
        wider = f"`{code}` makes the model float16 where {tests} holds, also without the set-up's other tests"
        stores = self._stores_before_setup()
        if stores and all(self._on_setup_path(node) for node in stores):
            extra = " and ".join(f"`{c}`" for c in sorted(setup - halving))
            return (
                f"{wider}, and where {extra} fails `{self.name}` is never built: nothing shows that the float16 "
                "model goes unused on that path (no optimizer there to have stopped it), and the float32 model would "
                f"take its place there; {move}"
            )
        plain = self._plain_torch_optimizer()
        if isinstance(plain, cst.CSTNode):
            return (
                f"{wider}, and `{self.name}` there is what line {ctx.position(plain)[0]} builds, not a torch.optim "
                "class: if it has no `backward`, that path stopped at the first "
                f"`{self.name}.backward(loss)` and the half can go; {move}"
            )
        backward_calls = [
            node
            for use in self.uses()
            if isinstance(attribute := ctx.parent(use), cst.Attribute)
            and attribute.attr.value == "backward"
            and isinstance(node := ctx.parent(attribute), cst.Call)
        ]
        # every backward of the module: another function's plain `loss.backward()` could train the float16 model
        offending: list[cst.Call] = []
        for node in ctx.nodes_of(cst.Call):
            func = node.func
            if not (isinstance(func, cst.Attribute) and func.attr.value == "backward"):
                continue
            branch = self._backward_branch(ctx.statement_of(node))
            own = node in backward_calls
            if branch is None or own != branch[1] or not set(_conjuncts(branch[0])) <= halving:
                offending.append(node)
        if offending or not backward_calls:
            # name a backward of the plain optimizer's path first: it is what trained the float16 model
            node = next((n for n in offending if n not in backward_calls), offending[0] if offending else call)
            if node is not call:
                return (
                    f"{wider}, where `{self.name}` is the plain optimizer and `{syntax.code(node).strip()}` (line "
                    f"{ctx.position(node)[0]}) may train that float16 model, which the float32 model would not "
                    f"reproduce: {move}"
                )
            return f"{wider}, and no `{self.name}.backward(loss)` is in sight to show that path never trained: {move}"
        return (
            f"`{code}` went too (the model stays float32 under torch.autocast): where {tests} holds without the "
            f"set-up's tests, Apex's model was float16 under the plain torch optimizer and the first "
            f"`{self.name}.backward(loss)` raised AttributeError, so only the set-up's path trained under Apex",
        )

    def _backward_branch(self, statement: cst.CSTNode) -> tuple[cst.BaseExpression, bool] | None:
        """For a statement alone in the body or the ``else`` of an ``if`` without ``elif``: the
        test, and whether it is in the body."""
        ctx = self.ctx
        block = ctx.parent(statement)
        if not isinstance(block, cst.IndentedBlock) or len(block.body) != 1:
            return None
        owner = ctx.parent(block)
        if isinstance(owner, cst.If) and owner.body is block and isinstance(owner.orelse, cst.Else):
            return owner.test, True
        if isinstance(owner, cst.Else):
            branch = ctx.parent(owner)
            if isinstance(branch, cst.If):
                return branch.test, False
        return None

    def _plain_torch_optimizer(self) -> bool | cst.CSTNode:
        """Whether every value the optimizer name holds before the set-up (in its scope) off the set-up's
        own path is built by a ``torch.optim`` class, which has no ``backward``; else the assignment that
        is not, if any (the optimizer the set-up wraps, built under all its tests, is not one of them)."""
        ctx = self.ctx
        built = False
        for node in self._stores_before_setup():
            if self._on_setup_path(node):
                continue
            small = syntax.sole_statement(ctx.statement_of(node))
            if not (isinstance(small, cst.Assign) and len(small.targets) == 1 and small.targets[0].target is node):
                return node
            value = small.value
            callee = dotted_name(value.func) if isinstance(value, cst.Call) else None
            if callee is None or not _torch_optim_path(ctx, callee, node):
                return node
            built = True
        return built

    def _stores_before_setup(self) -> list[cst.Name]:
        ctx = self.ctx
        return [
            node
            for node in ctx.nodes_of(cst.Name)
            if node.value == self.name
            and ctx.scope_of(node) is self.setup.scope
            and _is_store(ctx, node)
            and ctx.position(node)[0] < self.start_line
        ]

    def _on_setup_path(self, node: cst.CSTNode) -> bool:
        """Whether ``node``'s statement runs only where every test of the set-up holds."""
        conditions, _ = _guards(self.ctx, self.ctx.statement_of(node))
        own = {c for condition in conditions for c in _conjuncts(condition)}
        return bool(self.guards) and {c for guard in self.guards for c in _conjuncts(guard)} <= own

    def _same_tests_repeated(self, codes: list[str], guard_codes: list[str], statement: cst.CSTNode) -> bool:
        """Whether the tests around ``statement`` are the set-up's with one repeated (NLU-QNLI's ``if
        args.do_train:`` around ``model.half()``, and again around the optimizer's ``if args.do_train:``
        inside it): ``a and a and b`` is ``a and b`` where nothing between the two changes what ``a`` reads."""
        ctx = self.ctx
        if list(dict.fromkeys(codes)) != list(dict.fromkeys(guard_codes)):
            return False
        read: set[str] = set()
        for guard in self.guards:
            for node in syntax.descendants(guard):
                if isinstance(node, (cst.Name, cst.Attribute)):
                    dotted = dotted_name(node)
                    if dotted is not None:
                        read.add(dotted)
                elif not isinstance(node, _PLAIN_TEST_NODES):
                    return False  # a call, a subscript: read again, it may differ
        first, last = sorted((ctx.position(statement)[0], self.start_line))
        for node, _dotted in _stores_of(ctx, read, self.setup.scope):
            if first <= ctx.position(node)[0] <= last:
                return False
        return True

    def _halved_again(
        self,
        call: cst.Call,
        halving: str,
        statement: cst.CSTNode,
        codes: list[str],
        guard_codes: list[str],
        halved_before: set[str],
    ) -> bool:
        """Whether ``halving.half()`` only halves again the model the set-up's own ``.half()`` made
        float16: after the set-up, under its guards and more (RRC's checkpoints: ``model.float()``,
        save, ``if args.fp16: model.half()``), on a model halved under those guards before it. Such a
        call runs only where FP16_Optimizer trains that model, which the migration keeps float32 (its
        ``model.float()`` a no-op there): it goes like the first one."""
        remaining = list(codes)
        for code in guard_codes:
            if code not in remaining:
                return False
            remaining.remove(code)
        return (
            isinstance(call.func, cst.Attribute)
            and call.func.attr.value == "half"
            and halving in halved_before
            and self.ctx.position(statement)[0] > self.start_line
        )

    def _drop_half(self, call: cst.Call, statement: cst.CSTNode) -> None:
        """Remove the ``.half()`` (or Apex halving wrapper) of ``statement``, keeping the rest of it."""
        if statement in self.edits.remove or statement in self.edits.replace_statement:
            return
        kept = self._without_half(statement)
        if kept is ...:
            raise _Blocked(
                call,
                f"`{syntax.code(call).strip()}` makes the model float16 here, apart from the FP16_Optimizer set-up: "
                "remove it (the model stays float32 under torch.autocast) and run ampmigrate again",
            )
        if kept is None:
            self.edits.remove.add(statement)
        else:
            assert isinstance(kept, cst.SimpleStatementLine)
            self.edits.replace_statement[statement] = [kept]

    def _fresh_model(self, call: cst.Call, statement: cst.CSTNode, name: str) -> bool:
        """Whether ``name.half()`` halves a model bound anew after the optimizer's last use.

        SpanBERT's scripts train, then load the saved model again for the test set and halve
        that one: ``model = Bert...from_pretrained(out_dir)``, ``if args.fp16: model.half()``. The
        optimizer never sees that object, so its ``.half()`` (fp16 inference, as before) stays.
        Only a plain ``name = <expression not reading name>`` that surely runs before the call
        (an earlier statement of a block around it) and after every use of the optimizer counts.
        """
        ctx = self.ctx
        if not (isinstance(call.func, cst.Attribute) and call.func.attr.value == "half") or "." in name:
            return False
        last = max([self.start_line, *(ctx.position(node)[0] for node in self.uses())])
        current = statement
        while True:
            block = ctx.parent(current)
            if not isinstance(block, (cst.IndentedBlock, cst.Module)):
                return False
            body: list[cst.CSTNode] = list(block.body)
            for earlier in reversed(body[: body.index(current)]):
                if ctx.position(earlier)[0] <= last:
                    return False
                if _rebinds(earlier, name):
                    return True
            if isinstance(block, cst.Module) or ctx.parent(block) is self.setup.scope:
                return False
            current = ctx.statement_of(block)

    def _halving_call(self, call: cst.Call) -> str | None:
        """The model halved by this call (``m.half()``, ``network_to_half(m)``...), if it is one."""
        func = call.func
        if isinstance(func, cst.Attribute) and func.attr.value == "half" and not call.args:
            base: cst.BaseExpression = func.value
            # `model.cuda().half()`: through the methods that return the module itself, never into
            # the callee of a constructor (`torch.nn.Linear(8, 2).cuda().half()` is not `torch.nn`)
            while (
                isinstance(base, cst.Call)
                and isinstance(base.func, cst.Attribute)
                and base.func.attr.value in _SELF_RETURNING
            ):
                base = base.func.value
            name = dotted_name(base)
            if name is None:
                # `model = Net().cuda().half()`: the model is what the statement assigns
                statement = self.ctx.statement_of(call)
                small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else None
                if isinstance(small, cst.Assign) and len(small.targets) == 1:
                    name = dotted_name(small.targets[0].target)
            if name is None:
                return None
            last = name.split(".")[-1]
            return name if self._model_like(last) else None
        found = self.ctx.apex_path(func)
        if found is not None and found[0] in _HALVING and len(call.args) == 1:
            self.edits.consumed.add(found[1])
            self.partly_half = True
            return dotted_name(call.args[0].value) or ""
        return None

    def _model_like(self, last: str) -> bool:
        """Whether the last part of a dotted name looks like the model's (``model``, ``net``, ``resnet``...)."""
        lowered = last.lower()
        return lowered.endswith(("model", "net")) or lowered.startswith("net") or last in self.model_names

    def _without_half(self, statement: cst.CSTNode) -> cst.SimpleStatementLine | None | object:
        """The statement with the model left float32; None to drop it; ``...`` for a shape not handled."""
        if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1):
            return ...
        small = statement.body[0]
        value = small.value if isinstance(small, (cst.Expr, cst.Assign)) else None
        if value is None:
            return ...
        stripped = self._strip(value)
        if stripped is None or any(
            isinstance(node, cst.Call) and self._halving_call(node) is not None for node in syntax.descendants(stripped)
        ):
            return ...
        if isinstance(small, cst.Expr):
            if dotted_name(stripped) is not None:
                return None  # `model.half()` alone
            return statement.with_changes(body=[small.with_changes(value=stripped)])
        assert isinstance(small, cst.Assign)
        targets = [dotted_name(t.target) for t in small.targets]
        if len(targets) == 1 and targets[0] is not None and targets[0] == dotted_name(stripped):
            return None  # `model = network_to_half(model)`
        return statement.with_changes(body=[small.with_changes(value=stripped)])

    def _strip(self, value: cst.BaseExpression) -> cst.BaseExpression | None:
        """``value`` without its ``.half()`` and Apex halving wrappers; None if they sit deeper."""
        if isinstance(value, cst.Call):
            func = value.func
            found = self.ctx.apex_path(func)
            if found is not None and found[0] in _HALVING and len(value.args) == 1:
                inner = self._strip(value.args[0].value)
                return inner if inner is not None else None
            if isinstance(func, cst.Attribute) and func.attr.value == "half" and not value.args:
                return self._strip(func.value) or func.value
            if isinstance(func, cst.Attribute):
                inner = self._strip(func.value)
                if inner is None:
                    return None
                return value.with_changes(func=func.with_changes(value=inner))
            return value
        return value if dotted_name(value) is not None else None

    def model_names_from_setup(self) -> None:
        for call in self.ctx.nodes_of(cst.Call):
            if self.ctx.scope_of(call) is not self.setup.scope:
                continue
            found = self.ctx.apex_path(call.func)
            if found is not None and found[0] in _HALVING and call.args:
                name = dotted_name(call.args[0].value)
                if name:
                    self.model_names.add(name.split(".")[-1])
            func = call.func
            if (
                isinstance(func, cst.Attribute)
                and func.attr.value in ("parameters", "named_parameters")
                and self.ctx.position(self.ctx.statement_of(call))[0] <= self.start_line
            ):
                # `Student().parameters()` handed to the optimizer: its `student.half()` is the model's
                name = dotted_name(func.value)
                if name:
                    self.model_names.add(name.split(".")[-1])

    def commit(self) -> None:
        ctx, edits = self.ctx, self.edits
        for node, replacement in edits.substitute.items():
            ctx.plan.substitute(node, replacement)
        ctx.plan.replace.update(edits.replace)
        if self.load_needed and not any(
            isinstance(h, cst.FunctionDef) and h.name.value == self.load_helper for h in ctx.plan.module_helpers
        ):
            template = _LOAD_LEGACY if self.flavor == "optimizers" else _LOAD_FP16_UTILS
            ctx.plan.module_helpers.append(cst.parse_statement(template.format(name=self._load_helper_name())))
        closure = self.closure_helper
        if closure is not None and not any(
            isinstance(h, cst.FunctionDef) and h.name.value == closure for h in ctx.plan.module_helpers
        ):
            ctx.plan.module_helpers.append(cst.parse_statement(_CLOSURE_RUNNER.format(name=closure)))
        ctx.plan.remove |= edits.remove
        ctx.plan.replace_statement.update(edits.replace_statement)
        for node, statements in edits.before.items():
            ctx.plan.before[node].extend(statements)
        for node, statements in edits.after.items():
            ctx.plan.after[node].extend(statements)
        for first, last, item in edits.wraps:
            _wrap(ctx, first, last, item)
        ctx.consumed |= edits.consumed
        ctx.plan.needs_torch_import = True
        for code, node, message in edits.notes:
            ctx.report(code, node, message)
        self._commit_legacy()
        construction = self.setup.first
        ctx.report(
            "AMP041",
            construction.call,
            f"{local_copies.describe(ctx, construction.root, construction.path)} became torch.amp.GradScaler "
            f"`{self.scaler}` over the float32 model under "
            "torch.autocast"
            + (
                " (state_dict keys lose the `1.`/`network.` prefix network_to_half/FP16Model added)"
                if self._wrapped_model()
                else ""
            ),
        )

    def _commit_legacy(self) -> None:
        """The old FusedAdam becomes the LegacyFusedAdam helper, written into the module once."""
        ctx = self.ctx
        done: set[int] = set()
        for construction in self.setup.constructions:
            fused, legacy = construction.fused, construction.legacy
            if fused is None or legacy is None or id(fused) in done:
                continue
            done.add(id(fused))
            _drop_fused_adam_plan(ctx, fused)
            if fused is not construction.inner:
                ctx.plan.substitute(fused, legacy.with_changes(func=cst.Name(self.helper)))
            found = ctx.apex_path(fused.func)
            if found is not None:
                ctx.consumed.add(found[1])
            if not any(isinstance(h, cst.ClassDef) and h.name.value == self.helper for h in ctx.plan.module_helpers):
                ctx.plan.module_helpers.append(cst.parse_statement(_LEGACY_FUSED_ADAM.format(name=self.helper)))
            ctx.report(
                "AMP041",
                fused,
                f"apex.optimizers.FusedAdam (the pre-2019 one apex.optimizers.FP16_Optimizer drove) became "
                f"`{self.helper}`, its update in plain torch written into this module (per-group max_grad_norm "
                "clipping, eps_inside_sqrt, bias_correction, weight decay added to the update), stepped by the "
                "GradScaler on unscaled float32 gradients",
            )

    def _wrapped_model(self) -> bool:
        return any(
            isinstance(node, cst.Name) and node.value in ("network_to_half", "FP16Model")
            for node in self.edits.consumed
        )


def _first_if_of(ctx: ModuleContext, block: cst.CSTNode) -> cst.If | None:
    """The first ``if`` of the if/elif/else chain whose clause ``block`` is; None: no such chain."""
    owner = ctx.parent(block)
    if isinstance(owner, cst.Else):
        owner = ctx.parent(owner)
    while isinstance(owner, cst.If) and isinstance(ctx.parent(owner), cst.If):
        owner = ctx.parent(owner)  # an elif: up to its first if
    return owner if isinstance(owner, cst.If) else None


def _wrap(ctx: ModuleContext, first: cst.CSTNode, last: cst.CSTNode, item: cst.WithItem) -> None:
    """``with item:`` over first..last, merged with a span already planned in the same block."""
    block: list[cst.CSTNode] = list(ctx.block_of(first).body)
    for other_first, (other_last, kept) in list(ctx.plan.wrap.items()):
        if ctx.block_of(other_first) is not ctx.block_of(first):
            continue
        a, b = block.index(first), block.index(last)
        c, d = block.index(other_first), block.index(other_last)
        if a <= d and c <= b:
            ctx.plan.wrap.pop(other_first)
            ctx.plan.wrap[block[min(a, c)]] = (block[max(b, d)], kept)
            return
    ctx.plan.wrap[first] = (last, item)


def _rebinds(statement: cst.CSTNode, name: str) -> bool:
    """``name = <expression>`` where the expression does not read ``name`` (a new object)."""
    small = syntax.sole_statement(statement)
    if not (isinstance(small, cst.Assign) and len(small.targets) == 1):
        return False
    target = small.targets[0].target
    if not (isinstance(target, cst.Name) and target.value == name):
        return False
    return not any(isinstance(node, cst.Name) and node.value == name for node in syntax.descendants(small.value))


def _conjuncts(expression: cst.BaseExpression) -> list[str]:
    """The normalized parts of ``a and b and ...`` (the expression itself when it is no ``and``)."""
    expression = syntax.strip_parens(expression)
    if isinstance(expression, cst.BooleanOperation) and isinstance(expression.operator, cst.And):
        return _conjuncts(expression.left) + _conjuncts(expression.right)
    return [syntax.normalized(expression)]


def _torch_optim_path(ctx: ModuleContext, callee: str, at: cst.CSTNode) -> bool:
    """Whether ``callee`` (``optim.SGD``, ``torch.optim.Adam``, ``Adam``) names a class of
    ``torch.optim``, through the module's imports."""
    root, _, rest = callee.partition(".")
    imports = [
        statement
        for scope in (ctx.scope_of(at), ctx.module)
        for statement in ctx.other_imports.get(scope, {}).get(root, [])  # type: ignore[call-overload]
    ]
    binding = ctx.resolve(root, at)
    if binding is not None and binding.kind == "torch":
        return rest.startswith("optim.") and rest.count(".") == 1
    for statement in imports:
        if isinstance(statement.names, cst.ImportStar):
            continue
        for alias in statement.names:
            if bound_name(alias) != root:
                continue
            imported = dotted_name(alias.name) or ""
            if isinstance(statement, cst.Import):
                full = f"{imported}.{rest}" if alias.asname is not None else callee
            elif statement.relative:
                continue
            else:
                module = dotted_name(statement.module) if statement.module is not None else ""
                full = f"{module}.{imported}" + (f".{rest}" if rest else "")
            parts = full.split(".")
            if len(parts) == 3 and parts[:2] == ["torch", "optim"]:
                return True
    return False


def _exclusive(ctx: ModuleContext, a: cst.CSTNode, b: cst.CSTNode) -> bool:
    """Whether ``a`` and ``b`` sit in different branches of one ``if``/``else`` (never both run)."""
    b_ancestors = set(ctx.ancestors(b))
    child: cst.CSTNode = a
    for ancestor in ctx.ancestors(a):
        if isinstance(ancestor, cst.If) and ancestor in b_ancestors:
            a_in_body = child is ancestor.body
            b_in_body = ancestor.body in b_ancestors
            a_in_else = child is ancestor.orelse
            b_in_else = ancestor.orelse is not None and ancestor.orelse in b_ancestors
            return (a_in_body and b_in_else) or (a_in_else and b_in_body)
        child = ancestor
    return False


def _stores_of(ctx: ModuleContext, read: set[str], scope: cst.CSTNode) -> Iterator[tuple[cst.CSTNode, str]]:
    """The stores in ``scope`` to a name (or attribute chain) in ``read``, or to a prefix of one
    (``args = ...`` changes ``args.fp16``), with its dotted spelling."""
    for node in ctx.nodes_of(cst.Name):
        target = ctx.parent(node)
        chain: cst.CSTNode = node
        while isinstance(target, cst.Attribute) and target.value is chain:
            chain, target = target, ctx.parent(target)
        dotted = dotted_name(chain)  # type: ignore[arg-type]
        if dotted is None or not any(dotted == r or r.startswith(dotted + ".") for r in read):
            continue
        if ctx.scope_of(chain) is scope and _is_store(ctx, chain):
            yield chain, dotted


def _is_store(ctx: ModuleContext, node: cst.CSTNode) -> bool:
    current = node
    parent = ctx.parent(current)
    while isinstance(parent, (cst.Tuple, cst.List, cst.Element, cst.StarredElement)):
        current, parent = parent, ctx.parent(parent)
    if isinstance(parent, cst.AssignTarget):
        return True
    if isinstance(parent, (cst.AugAssign, cst.AnnAssign, cst.NamedExpr)) and parent.target is current:
        return True
    if isinstance(parent, cst.For) and parent.target is current:
        return True
    if isinstance(parent, cst.AsName):
        return True
    return isinstance(parent, cst.Del)


def _fused_adam_of(ctx: ModuleContext, construction: cst.Call) -> cst.Call | None:
    """The ``FusedAdam(...)`` call that built the optimizer an apex.optimizers FP16_Optimizer wraps."""
    bound = syntax.bind_arguments(construction, _PARAMETERS, partial=True)
    if "init_optimizer" not in bound:
        return None
    inner = bound["init_optimizer"].value
    scope = ctx.scope_of(construction)
    if isinstance(inner, cst.Call):
        found = ctx.apex_path(inner.func)
        return inner if found is not None and found[0] == _FUSED_ADAM else None
    if not isinstance(inner, cst.Name):
        return None
    line = ctx.position(construction)[0]
    latest: cst.Call | None = None
    for call in ctx.nodes_of(cst.Call):
        found = ctx.apex_path(call.func)
        if found is None or found[0] != _FUSED_ADAM or ctx.scope_of(call) is not scope:
            continue
        statement = ctx.statement_of(call)
        small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) and statement.body else None
        if not (
            isinstance(small, cst.Assign)
            and small.value is call
            and len(small.targets) == 1
            and isinstance(small.targets[0].target, cst.Name)
            and small.targets[0].target.value == inner.value
        ):
            continue
        if ctx.position(call)[0] < line:
            latest = call
    return latest


def _as_float(node: cst.BaseExpression) -> cst.BaseExpression:
    """``float(S)`` for a held scale: GradScaler.update(new_scale=) takes a float or a tensor, not an int."""
    value = syntax.literal(node)
    if isinstance(value, float):
        return node.deep_clone()
    if isinstance(value, int) and not isinstance(value, bool):
        return cst.Float(repr(float(value)))
    return syntax.call("float", [cst.Arg(node.deep_clone())])


def _legacy_helper_name(ctx: ModuleContext) -> str:
    """``LegacyFusedAdam`` unless the module binds that name to something else."""
    taken = any(_LEGACY_HELPER in names for names in ctx.locals.values())
    return ctx.fresh_name(_LEGACY_HELPER) if taken else _LEGACY_HELPER


def _drop_fused_adam_plan(ctx: ModuleContext, call: cst.Call) -> None:
    """Forget what apex_optimizers planned and reported for this (old) FusedAdam call."""
    ctx.plan.replace.pop(call, None)
    line, column = ctx.position(call)
    ctx.findings[:] = [
        f for f in ctx.findings if not (f.code in ("AMP041", "AMP042") and (f.line, f.column) == (line, column))
    ]


def _keep_fused_adam(ctx: ModuleContext, calls: list[cst.Call], at: int, contrib: bool = False) -> None:
    """The old FusedAdam of an apex.optimizers FP16_Optimizer that stays, stays too (one finding)."""
    for call in calls:
        _drop_fused_adam_plan(ctx, call)
        found = ctx.apex_path(call.func)
        if found is not None:
            ctx.consumed.discard(found[1])
        if contrib:
            ctx.report(
                "AMP042",
                call,
                f"apex.optimizers.FusedAdam kept with the apex.contrib.optimizers.FP16_Optimizer at line {at} that "
                "wraps it (the finding there says what to write); with the pre-2019 pair "
                "(`from apex.optimizers import FP16_Optimizer`) ampmigrate writes this one as `LegacyFusedAdam`",
            )
            continue
        ctx.report(
            "AMP042",
            call,
            f"apex.optimizers.FusedAdam kept: it is the pre-2019 FusedAdam the apex.optimizers.FP16_Optimizer at "
            f"line {at} drives through its old step(grads=..., scale=..., grad_norms=...) API, so the two migrate "
            f"together or not at all: once line {at} can migrate, ampmigrate writes this one as `LegacyFusedAdam`, "
            "its update in plain torch",
        )


_LOOKALIKE_KEYWORDS = frozenset({"dynamic_loss_scale", "static_loss_scale"})


def _plan_lookalikes(ctx: ModuleContext) -> None:
    """An Apex FusedAdam handed to a callable that is not Apex's FP16_Optimizer but takes its arguments
    (``FP16_Optimizer_State(optimizer, dynamic_loss_scale=True)``, a project subclass of
    apex.optimizers.FP16_Optimizer in another module, as microsoft/VLP's): that wrapper drives the
    pre-2019 FusedAdam through its old step API, so the FusedAdam stays with it (apex_optimizers'
    AdamW would break it), and the wrapper's finding names the code to write."""
    wrappers: dict[int, tuple[cst.Call, list[cst.Call]]] = {}
    for call in ctx.nodes_of(cst.Call):
        if not call.args or call.args[0].keyword is not None or call.args[0].star or ctx.skipped(call):
            continue
        if _flavor(ctx, call) is not None or ctx.apex_path(call.func) is not None:
            continue
        if not {a.keyword.value for a in call.args if a.keyword is not None} & _LOOKALIKE_KEYWORDS:
            continue
        fused = _fused_adam_of(ctx, call)
        # only the pre-2019 FusedAdam's own keywords prove it (DeepSpeed's FP16_Optimizer, which takes the
        # same arguments, steps the current FusedAdam or any torch optimizer)
        if fused is not None and {a.keyword.value for a in fused.args if a.keyword is not None} & _OLD_ONLY_KEYWORDS:
            wrappers.setdefault(id(fused), (fused, []))[1].append(call)
    for fused, calls in wrappers.values():
        _drop_fused_adam_plan(ctx, fused)
        found = ctx.apex_path(fused.func)
        if found is not None:
            ctx.consumed.discard(found[1])
        lines = ", ".join(str(ctx.position(c)[0]) for c in calls)
        ctx.report(
            "AMP042",
            fused,
            f"apex.optimizers.FusedAdam kept: `{syntax.code(calls[0].func).strip()}` (line {lines}) wraps it with "
            "apex.optimizers.FP16_Optimizer's arguments (a project subclass or copy of it), which drove the "
            "pre-2019 FusedAdam through its old step(grads=..., scale=..., grad_norms=...) API, so the two stay "
            "together (the finding there names the code to write)",
        )
        for call in calls:
            ctx.report("AMP040", call, _lookalike_recipe(ctx, call, fused, calls))


def _lookalike_recipe(ctx: ModuleContext, call: cst.Call, fused: cst.Call, calls: list[cst.Call]) -> str:
    """What to write for one FP16_Optimizer look-alike call around the pre-2019 FusedAdam."""
    wrapper = syntax.code(call.func).strip()
    bound = syntax.bind_arguments(call, _PARAMETERS, partial=True)
    dynamic = bound.get("dynamic_loss_scale")
    static = bound.get("static_loss_scale")
    scaler = ctx.options.scaler_name
    if dynamic is not None and syntax.literal(dynamic.value) is True:
        creation = 'torch.amp.GradScaler("cuda", growth_interval=1000)'
        update = "`{S}.update()` then `if {S}.get_scale() < 1.0: {S}.update(new_scale=1.0)` (Apex's floor of 1)"
    elif (dynamic is None or syntax.literal(dynamic.value) is False) and static is not None:
        held = syntax.code(_as_float(static.value)).strip()
        creation = f'torch.amp.GradScaler("cuda", init_scale={held})'
        update = f"`{{S}}.update(new_scale={held})`"
    else:
        creation = 'torch.amp.GradScaler("cuda", ...)'
        update = "`{S}.update()`"
    statement = ctx.statement_of(call)
    switch = _switch_of(ctx, statement, call)
    if switch is not None:
        creation = creation[:-1] + f", enabled={switch})"
    assigned = syntax.target_of(statement, call)
    target = dotted_name(assigned) if assigned is not None else None
    scope = ctx.scope_of(call)
    halves = [
        str(ctx.position(node)[0])
        for node in ctx.nodes_of(cst.Call)
        if isinstance(node.func, cst.Attribute)
        and node.func.attr.value == "half"
        and not node.args
        and ctx.scope_of(node) is scope
    ]
    uses = ""
    if target is not None:
        skip = tuple(ctx.statement_of(c) for c in calls) + (ctx.statement_of(fused),)
        uses = _holder_uses(
            ctx, target, None, scaler, update, "optimizers", skip=skip, scope=scope if "." not in target else None
        )
    return (
        f"`{wrapper}(...)` takes apex.optimizers.FP16_Optimizer's arguments around the pre-2019 FusedAdam at line "
        f"{ctx.position(fused)[0]} (a project subclass or copy of apex.optimizers.FP16_Optimizer, which ampmigrate "
        "does not migrate); write instead: the old FusedAdam's update in plain torch (`LegacyFusedAdam`, which "
        "ampmigrate writes for Apex's own pair) with the same arguments, "
        f"`{scaler} = {creation}`"
        + (" on both paths" if switch is not None else "")
        + ", the float32 model and inputs"
        + (
            f" (the `.half()` call{'s' if len(halves) > 1 else ''} at line{'s' if len(halves) > 1 else ''} "
            f"{', '.join(halves)} go{'' if len(halves) > 1 else 'es'})"
            if halves
            else " (no .half())"
        )
        + ', every forward pass and loss under `with torch.autocast("cuda", dtype=torch.float16):`'
        + (f", and at its uses: {uses}" if uses else "")
    )


def _is_contrib(ctx: ModuleContext, construction: cst.Call) -> bool:
    found = _flavor(ctx, construction)
    return found is not None and found[1] == "contrib"


def _wrapped_fused(ctx: ModuleContext, construction: cst.Call) -> list[cst.Call]:
    found = _flavor(ctx, construction)
    if found is None or found[1] not in ("optimizers", "contrib"):
        return []
    fused = _fused_adam_of(ctx, construction)
    return [fused] if fused is not None else []


def _halving_outside(ctx: ModuleContext, setups: list[_Setup]) -> cst.Call | None:
    """An Apex halving wrapper (``FP16Model(net)``, ``network_to_half(net)``) called outside every
    setup's function: ``get_model()`` returning ``FP16Model(net)`` for ``train()`` to wrap its
    optimizer. The rule keeps the model float32 only where it sets up the optimizer."""
    if not setups:
        return None
    scopes = [setup.scope for setup in setups]
    for call in ctx.nodes_of(cst.Call):
        found = ctx.apex_path(call.func)
        if found is not None and found[0] in _HALVING and not any(ctx.scope_of(call) is scope for scope in scopes):
            return call
    return None


def _report_blocked(ctx: ModuleContext, error: _Blocked, construction: cst.Call) -> None:
    """AMP040 at the construction: everything FP16_Optimizer touches stays as it was."""
    found = _flavor(ctx, construction)
    path = local_copies.describe(ctx, found[2], found[0]) if found is not None else "FP16_Optimizer"
    if error.node is not construction:
        line = ctx.position(error.node)[0]
        message = f"{path} left as it was, with the code it touches (line {line}: {error.message})"
    else:
        message = f"{path} left as it was, with the code it touches: {error.message}"
    ctx.report("AMP040", construction, message)


# what ``from apex.fp16_utils import *`` binds (the package's public names and its submodules)
_STAR_NAMES = frozenset(
    "FP16_Optimizer FP16Model network_to_half BN_convert_float tofp16 prep_param_lists "
    "model_grads_to_master_grads master_params_to_model_params to_python_float clip_grad_norm convert_module "
    "convert_network LossScaler DynamicLossScaler fp16util fp16_optimizer loss_scaler".split()
)


def _star_binding(ctx: ModuleContext) -> cst.Name | None:
    """The synthetic alias name of a module-level ``from apex.fp16_utils import *``, if any."""
    for binding in ctx.imports.get(ctx.module, {}).get("*", []):
        if binding.target == "apex.fp16_utils.*":
            return binding.alias.name if isinstance(binding.alias.name, cst.Name) else None
    return None


def _star_uses(ctx: ModuleContext) -> list[cst.Name]:
    """Names that can only come from ``from apex.fp16_utils import *``."""
    found = []
    for node in ctx.nodes_of(cst.Name):
        if node.value not in _STAR_NAMES:
            continue
        parent = ctx.parent(node)
        if isinstance(parent, cst.Attribute) and parent.attr is node:
            continue
        if isinstance(parent, (cst.ImportAlias, cst.AsName)) or ctx.resolve(node.value, node) is not None:
            continue
        scope: cst.CSTNode | None = ctx.scope_of(node)
        bound_here = False
        while scope is not None:
            if node.value in ctx.locals.get(scope, set()):  # type: ignore[call-overload]
                bound_here = True
                break
            scope = ctx.scope_parent.get(scope)  # type: ignore[call-overload]
        if not bound_here:
            found.append(node)
    return found


def _helper_path(ctx: ModuleContext, func: cst.BaseExpression, star: set[cst.CSTNode]) -> tuple[str, cst.Name] | None:
    found = ctx.apex_path(func)
    if found is not None:
        return found
    if func in star:
        assert isinstance(func, cst.Name)
        return f"apex.fp16_utils.{func.value}", func
    return None


def _plan_helpers(ctx: ModuleContext) -> None:
    """``to_python_float(t)`` -> ``t.item()``; fp16_utils' ``clip_grad_norm`` -> torch's; a star
    import of apex.fp16_utils goes once nothing it binds is used any more."""
    star_alias = _star_binding(ctx)
    star_uses = _star_uses(ctx) if star_alias is not None else []
    star = set[cst.CSTNode](star_uses)
    for call in ctx.nodes_of(cst.Call):
        found = _helper_path(ctx, call.func, star)
        if found is None:
            continue
        path, root = found
        if ctx.skipped(call):
            continue
        if path == "apex.fp16_utils.to_python_float" and len(call.args) == 1 and call.args[0].keyword is None:
            if call.args[0].star:
                continue
            value = call.args[0].value
            if not isinstance(value, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)):
                value = value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
            ctx.plan.substitute(call, syntax.attribute_call(value, "item"))
            ctx.consumed.add(root)
        elif path in ("apex.fp16_utils.clip_grad_norm", "apex.fp16_utils.fp16util.clip_grad_norm"):
            ctx.plan.substitute(call, call.with_changes(func=syntax.dotted("torch.nn.utils.clip_grad_norm_")))
            ctx.plan.needs_torch_import = True
            ctx.consumed.add(root)
    if star_alias is not None and all(name in ctx.consumed for name in star_uses):
        ctx.consumed.add(star_alias)  # amp_import drops the star import


_NETWORK_TO_HALF = """\
class {cls}(torch.nn.Module):
    \"\"\"Apex's tofp16: its forward returns the input cast to float16.\"\"\"

    def forward(self, input):
        return input.half()


def {name}(network):
    \"\"\"apex.fp16_utils.network_to_half in plain torch: the network cast to float16 but its affine batch
    norms (float32 again), behind a module that casts the input to float16; the Sequential gives the
    state_dict keys a `1.` prefix, as Apex's did.\"\"\"
    network.half()
    for module in network.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and module.affine is True:
            module.float()
    return torch.nn.Sequential({cls}(), network)
"""
_NETWORK_TO_HALF_PATHS = frozenset({"apex.fp16_utils.network_to_half", "apex.fp16_utils.fp16util.network_to_half"})


def _plan_network_to_half(ctx: ModuleContext) -> None:
    """``network_to_half(net)`` in a module with no FP16_Optimizer (fp16 inference, or pure fp16
    training): the same function, written into the module. Where an FP16_Optimizer is set up, the
    set-up decides (its model stays float32, or all of it stays)."""
    names: tuple[str, str] | None = None
    calls = [
        call
        for call in ctx.nodes_of(cst.Call)
        if (found := ctx.apex_path(call.func)) is not None and found[0] in _NETWORK_TO_HALF_PATHS
    ]
    for call in calls:
        found = ctx.apex_path(call.func)
        if found is None or ctx.skipped(call):
            continue
        binding = ctx.resolve(found[1].value, found[1])
        if binding is None or binding.copy is not None:
            continue  # a project's own copy: its BN_convert_float may differ from Apex's
        if len(call.args) != 1 or call.args[0].keyword is not None or call.args[0].star:
            continue
        if names is None:
            names = (ctx.fresh_name("half_network"), ctx.fresh_name("HalfInput"))
            ctx.plan.module_helpers.append(
                cst.parse_module(_NETWORK_TO_HALF.format(name=names[0], cls=names[1])).body[0]
            )
            ctx.plan.module_helpers.append(
                cst.parse_module(_NETWORK_TO_HALF.format(name=names[0], cls=names[1])).body[1]
            )
            ctx.plan.needs_torch_import = True
        ctx.plan.substitute(call.func, cst.Name(names[0]))
        ctx.consumed.add(found[1])
        ctx.report(
            "AMP041",
            call,
            f"apex.fp16_utils.network_to_half became `{names[0]}`, the same function in plain torch written into "
            "this module (float16 network, affine batch norms float32, input cast to float16, state_dict keys "
            "prefixed `1.`); Apex before January 2019 (NVIDIA/apex fe365d5) also made batch norms with "
            "affine=False float32",
        )


def _has_fp16_optimizer(ctx: ModuleContext) -> bool:
    return any(_flavor(ctx, call) is not None for call in ctx.nodes_of(cst.Call))


def plan(ctx: ModuleContext) -> None:
    _plan_helpers(ctx)
    _plan_lookalikes(ctx)
    if not _has_fp16_optimizer(ctx):
        _plan_network_to_half(ctx)
    setups, blocked = _collect(ctx)
    for error, call in blocked:
        _report_blocked(ctx, error, call)
        _keep_fused_adam(ctx, _wrapped_fused(ctx, call), ctx.position(call)[0], _is_contrib(ctx, call))
    stray = _halving_outside(ctx, setups)
    for setup in setups:
        planner = _Planner(ctx, setup)
        try:
            if stray is not None:
                raise _Blocked(
                    stray,
                    f"`{syntax.code(stray.func)}(...)` halves a model outside the function that sets up the "
                    "FP16_Optimizer, so the model it trains may be float16, which a GradScaler cannot unscale: "
                    "make the model float32 there (the model itself for the wrapper, no .half()) and run "
                    "ampmigrate again",
                )
            planner.model_names_from_setup()
            planner.plan_scaler()
            try:
                planner.plan_model()
            except _Blocked as model_error:
                # the uses that keep it too, so one run of the finding names them all
                try:
                    planner.plan_uses()
                except _Blocked as use_error:
                    if (use_error.node, use_error.message) == (model_error.node, model_error.message):
                        raise model_error from None  # the same use stopped both: say it once
                    line = ctx.position(use_error.node)[0]
                    raise _Blocked(
                        model_error.node, f"{model_error.message}; line {line}: {use_error.message}"
                    ) from None
                raise
            planner.plan_uses()
            planner.check_half_feeds()
        except _Blocked as error:
            _report_blocked(ctx, error, setup.first.call)
            at = ctx.position(setup.first.call)[0]
            for construction in setup.constructions:
                _keep_fused_adam(ctx, _wrapped_fused(ctx, construction.call), at, _is_contrib(ctx, construction.call))
            continue
        planner.commit()
