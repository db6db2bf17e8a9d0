"""apex_optimizers: ``apex.optimizers.FusedAdam``, ``FusedSGD`` and ``FusedAdagrad``.

What it rewrites
    Each fused optimizer becomes the torch optimizer with the same update rule.
    ``FusedAdam`` defaults to ``adam_w_mode=True``, which is **AdamW** (decoupled weight
    decay), so it becomes ``torch.optim.AdamW`` with ``weight_decay`` always written out:
    torch's AdamW defaults to 0.01 where FusedAdam defaulted to 0.0. With
    ``adam_w_mode=False`` it becomes ``torch.optim.Adam``, and with a mode chosen at run time
    ``(torch.optim.AdamW if mode else torch.optim.Adam)(...)``. Adam and AdamW get
    ``fused=True`` (torch's one-kernel implementation, on CUDA since torch 2.0 and on the CPU
    since 2.4) so they keep FusedAdam's speed; ``Options.fused_optimizers=False``
    (``--no-fused``) writes the plain form. ``capturable`` carries over (without ``fused``).
    ``FusedSGD`` becomes ``torch.optim.SGD`` and ``FusedAdagrad`` ``torch.optim.Adagrad``,
    both left on torch's default multi-tensor (foreach) path on CUDA: torch's fused SGD
    advances its momentum on a step GradScaler skips (measured on torch 2.13 when the first
    step overflows), which Apex never did. Settings without a numerical effect
    (``set_grad_none``, ``materialize_master_grads``) go.

    A class stored in a variable and called through it (``optim_name = FusedSGD`` under a
    flag, then ``optim_name(groups, momentum=0.9, nesterov=True)``) becomes the torch class
    there when every call through the variable is in the module and means the same unchanged:
    only arguments torch takes at the same positions, the ones whose defaults differ written
    out (FusedAdam's ``weight_decay``), and FusedSGD's ``lr``, which Apex required, given
    in the call or in each parameter group of a literal list. Every other use of that import
    must be migrated too.

Before::

    from apex.optimizers import FusedAdam

    optimizer = FusedAdam(model.parameters(), lr=1e-4, betas=(0.9, 0.98))

After::

    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), weight_decay=0.0, fused=True)

Not rewritten (reported instead, AMP042, with the code to write)
    ``bias_correction=False``, ``master_weights=True``, ``amsgrad=True`` (Apex raised),
    ``wd_after_momentum=True``, ``adagrad_w_mode=True``, the old ``max_grad_norm`` and
    ``eps_inside_sqrt`` arguments; a class stored as a value whose calls are not all seen
    (an attribute, a variable passed on or reachable from other modules) or would mean
    something else with the torch class; a name another library's import binds first
    (``try: from transformer_engine... import FusedAdam as Adam except ImportError: try: from
    apex.optimizers import FusedAdam as Adam ...``): a torch call there would also replace
    that library's class, so the finding on the Apex import says whether deleting it (the
    name falling to the except clause's torch class) is what ran with Apex at every use and
    for the flags the try sets. ``FusedLAMB``, ``FusedNovoGrad`` and
    ``FusedMixedPrecisionLamb`` have no torch twin (AMP040: the message says what they do
    inside, such as LAMB's clipping to ``max_grad_norm``).

Safety
    Same equations; fused kernels round differently in the last digits (AMP041). Mixing
    up Adam and AdamW is the classic silent error this rule avoids.

References
    NVIDIA/apex: apex/optimizers/fused_adam.py, fused_sgd.py, fused_adagrad.py, fused_lamb.py,
    csrc/multi_tensor_adam.cu; pytorch/pytorch PR #123074 (fused Adam/AdamW on the CPU);
    ../shared/apex-semantics.md section 5 (apex.optimizers).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import libcst as cst

from migrate.rules._apex_classes import Replacement, plan_replacements
from migrate.rules._context import ModuleContext

RULE = "apex_optimizers"

_NO_OP_SETTINGS = frozenset({"set_grad_none", "materialize_master_grads"})

# Decoupled decay through a parameter shrink just before the step: the step itself does not
# read the parameter, so this equals decaying inside the update.
_DECAY_BEFORE_STEP = (
    "construct it with weight_decay=0 and, just before each `optimizer.step()`, shrink the "
    "parameters: `with torch.no_grad(): torch._foreach_mul_(params, 1 - lr * weight_decay)` "
    "(not on a step GradScaler skips)"
)
_CLIP = "`torch.nn.utils.clip_grad_norm_(params, {norm})` before each `optimizer.step()`"


def _adam_target(values: dict[str, object], codes: dict[str, str]) -> str:
    mode = values.get("adam_w_mode", True)
    if mode is ...:
        return f"(torch.optim.AdamW if {codes['adam_w_mode']} else torch.optim.Adam)"
    return "torch.optim.Adam" if mode is False else "torch.optim.AdamW"


def _adam_added(fused: bool) -> Callable[[dict[str, object]], dict[str, str]]:
    def added(values: dict[str, object]) -> dict[str, str]:
        extra = {} if values.get("adam_w_mode", True) is False else {"weight_decay": "0.0"}
        if fused and values.get("capturable", False) is False:
            extra["fused"] = "True"
        return extra

    return added


# FusedAdam counts steps per param group; torch's Adam/AdamW keep a per-parameter state["step"]
# and their load_state_dict raises KeyError: 'step' on a state saved by FusedAdam.
_ADAM_CHECKPOINTS = (
    "; an optimizer state FusedAdam saved keeps its step count in param_groups (`group['step']`), and "
    "torch's load_state_dict raises KeyError: 'step' on it: to resume from such a checkpoint, give each "
    "parameter's state `state['step'] = torch.tensor(float(group['step']))` before loading"
)


def _adam_note(values: dict[str, object]) -> str:
    mode = values.get("adam_w_mode", True)
    if mode is False:
        return "adam_w_mode=False is Adam with L2 weight decay" + _ADAM_CHECKPOINTS
    if mode is ...:
        return "adam_w_mode chosen at run time: AdamW when true, Adam (L2 weight decay) when false" + _ADAM_CHECKPOINTS
    return "adam_w_mode=True is AdamW, and weight_decay is explicit (AdamW's default is 0.01)" + _ADAM_CHECKPOINTS


REPLACEMENTS = (
    Replacement(
        apex_name="FusedAdam",
        modules=("apex.optimizers",),
        parameters=(
            "params",
            "lr",
            "bias_correction",
            "betas",
            "eps",
            "adam_w_mode",
            "weight_decay",
            "amsgrad",
            "set_grad_none",
            "capturable",
            "master_weights",
        ),
        target=_adam_target,
        positional=2,
        dropped=_NO_OP_SETTINGS,
        required={
            "bias_correction": True,
            "adam_w_mode": (True, False, ...),
            "amsgrad": False,
            "master_weights": False,
        },
        added=_adam_added(fused=True),
        note=_adam_note,
        advice={
            "bias_correction": "torch.optim.AdamW always corrects the moment bias (no exact torch equivalent); "
            "`torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)` takes larger steps only in the first "
            "~1/(1 - beta2) steps; keep `apex.optimizers.FusedAdam` (current Apex still ships it) where that matters",
            "amsgrad": "Apex raised for it (FusedAdam has no AMSGrad); torch's variant is "
            "`torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, amsgrad=True)`",
            "master_weights": "keep the model's parameters in float32 (no .half()/.bfloat16()) under torch.autocast "
            "and use `torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, capturable=True)`",
            "max_grad_norm": "the old FusedAdam clipped the gradient norm inside step(): remove it and write "
            + _CLIP.format(norm="max_grad_norm"),
            "eps_inside_sqrt": "the old FusedAdam's eps_inside_sqrt=True put eps under the square root, which "
            "torch.optim.AdamW never does: remove it (the default, False, is torch's formula)",
        },
    ),
    Replacement(
        apex_name="FusedSGD",
        modules=("apex.optimizers",),
        parameters=(
            "params",
            "lr",
            "momentum",
            "dampening",
            "weight_decay",
            "nesterov",
            "wd_after_momentum",
            "materialize_master_grads",
            "set_grad_none",
        ),
        target="torch.optim.SGD",
        positional=6,
        dropped=_NO_OP_SETTINGS,
        required={"wd_after_momentum": False},
        no_default=frozenset({"lr"}),
        advice={
            "wd_after_momentum": "for decay applied after momentum use `torch.optim.SGD(...)` but " + _DECAY_BEFORE_STEP
        },
    ),
    Replacement(
        apex_name="FusedAdagrad",
        modules=("apex.optimizers",),
        parameters=("params", "lr", "eps", "weight_decay", "set_grad_none", "adagrad_w_mode"),
        target="torch.optim.Adagrad",
        positional=2,
        dropped=_NO_OP_SETTINGS,
        required={"adagrad_w_mode": False},
        advice={
            "adagrad_w_mode": "for decoupled weight decay use `torch.optim.Adagrad(...)` but " + _DECAY_BEFORE_STEP
        },
    ),
)
PLAIN = (dataclasses.replace(REPLACEMENTS[0], added=_adam_added(fused=False)), *REPLACEMENTS[1:])

# Apex optimizers without a torch twin: what they do inside, and what to write (AMP040).
UNMATCHED = {
    "FusedLAMB": "torch has no LAMB optimizer: keep `from apex.optimizers import FusedLAMB` (current Apex still "
    "ships it, CUDA build). It clips the global gradient norm to max_grad_norm={norm} inside step(); with another "
    "LAMB write " + _CLIP,
    "FusedMixedPrecisionLamb": "torch has no LAMB optimizer: keep `from apex.optimizers import "
    "FusedMixedPrecisionLamb` (current Apex still ships it). It clips the global gradient norm to "
    "max_grad_norm={norm} inside step(); with another LAMB write " + _CLIP,
    "FusedNovoGrad": "torch has no NovoGrad optimizer: keep `from apex.optimizers import FusedNovoGrad` (current "
    "Apex still ships it, CUDA build)",
}


def _report_unmatched(ctx: ModuleContext) -> None:
    for call in ctx.nodes_of(cst.Call):
        found = ctx.apex_path(call.func)
        if found is None:
            continue
        module, _, name = found[0].rpartition(".")
        if name not in UNMATCHED or not module.startswith("apex.optimizers"):
            continue
        norm = next(
            (ctx.code(arg.value).strip() for arg in call.args if arg.keyword and arg.keyword.value == "max_grad_norm"),
            "1.0",
        )
        ctx.report("AMP040", call, f"{found[0]}: {UNMATCHED[name].format(norm=norm)}")


def plan(ctx: ModuleContext) -> None:
    plan_replacements(ctx, REPLACEMENTS if ctx.options.fused_optimizers else PLAIN)
    _report_unmatched(ctx)
