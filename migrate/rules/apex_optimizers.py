"""apex_optimizers: ``apex.optimizers.FusedAdam``, ``FusedSGD`` and ``FusedAdagrad``.

What it rewrites
    Each fused optimizer becomes the torch optimizer with the same update rule.
    ``FusedAdam`` defaults to ``adam_w_mode=True``, which is **AdamW** (decoupled weight
    decay), so it becomes ``torch.optim.AdamW`` with ``weight_decay`` always written out:
    torch's AdamW defaults to 0.01 where FusedAdam defaulted to 0.0. With
    ``adam_w_mode=False`` it becomes ``torch.optim.Adam``. ``FusedSGD`` becomes
    ``torch.optim.SGD`` and ``FusedAdagrad`` ``torch.optim.Adagrad``. Settings without a
    numerical effect (``set_grad_none``, ``materialize_master_grads``) go.

Before::

    from apex.optimizers import FusedAdam

    optimizer = FusedAdam(model.parameters(), lr=1e-4, betas=(0.9, 0.98))

After::

    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), weight_decay=0.0)

Not rewritten (reported instead, AMP042)
    ``bias_correction=False``, ``adam_w_mode`` chosen at run time, ``capturable`` or
    ``master_weights``, ``wd_after_momentum=True``, ``adagrad_w_mode=True``. ``FusedLAMB``,
    ``FusedNovoGrad`` and ``FusedMixedPrecisionLamb`` have no torch twin (AMP040).

Safety
    Same equations; fused kernels round differently in the last digits (AMP041). Mixing
    up Adam and AdamW is the classic silent error this rule avoids.

References
    NVIDIA/apex: apex/optimizers/fused_adam.py, fused_sgd.py, fused_adagrad.py,
    csrc/multi_tensor_adam.cu; ../shared/apex-semantics.md section 5 (apex.optimizers).
"""

from __future__ import annotations

from migrate.rules._apex_classes import Replacement, plan_replacements
from migrate.rules._context import ModuleContext

RULE = "apex_optimizers"

_NO_OP_SETTINGS = frozenset({"set_grad_none", "materialize_master_grads"})

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
        target=lambda values: "torch.optim.Adam" if values.get("adam_w_mode", True) is False else "torch.optim.AdamW",
        positional=2,
        dropped=_NO_OP_SETTINGS,
        required={
            "bias_correction": True,
            "adam_w_mode": (True, False),
            "amsgrad": False,
            "capturable": False,
            "master_weights": False,
        },
        added=lambda values: {} if values.get("adam_w_mode", True) is False else {"weight_decay": "0.0"},
        note=lambda values: (
            "adam_w_mode=False is Adam with L2 weight decay"
            if values.get("adam_w_mode", True) is False
            else "adam_w_mode=True is AdamW, and weight_decay is explicit (AdamW's default is 0.01)"
        ),
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
    ),
    Replacement(
        apex_name="FusedAdagrad",
        modules=("apex.optimizers",),
        parameters=("params", "lr", "eps", "weight_decay", "set_grad_none", "adagrad_w_mode"),
        target="torch.optim.Adagrad",
        positional=2,
        dropped=_NO_OP_SETTINGS,
        required={"adagrad_w_mode": False},
    ),
)


def plan(ctx: ModuleContext) -> None:
    plan_replacements(ctx, REPLACEMENTS)
