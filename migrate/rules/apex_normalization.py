"""apex_normalization: ``apex.normalization.FusedLayerNorm`` and ``FusedRMSNorm``.

What it rewrites
    ``FusedLayerNorm`` becomes ``torch.nn.LayerNorm`` and ``FusedRMSNorm`` becomes
    ``torch.nn.RMSNorm``, with ``eps=1e-5`` written out for RMSNorm (torch's default is the
    float32 machine epsilon, Apex's 1e-5). ``memory_efficient`` goes: it only trades memory
    for recomputation. Parameter names (``weight``, ``bias``) match, so checkpoints load.

Before::

    import torch
    from apex.normalization import FusedLayerNorm


    class Block(torch.nn.Module):
        def __init__(self, hidden_size):
            super().__init__()
            self.norm = FusedLayerNorm(hidden_size, eps=1e-12)

After::

    import torch


    class Block(torch.nn.Module):
        def __init__(self, hidden_size):
            super().__init__()
            self.norm = torch.nn.LayerNorm(hidden_size, eps=1e-12)

Not rewritten
    ``MixedFusedLayerNorm`` / ``MixedFusedRMSNorm`` (output in the parameters' dtype) are
    reported (AMP040).

Safety
    Under autocast Apex's fused layer norm returned float16; torch's LayerNorm runs in
    float32 there (AMP041). ``torch.nn.RMSNorm`` needs torch 2.4.

References
    NVIDIA/apex: apex/normalization/fused_layer_norm.py; pytorch/pytorch PR #121364;
    ../shared/apex-semantics.md section 5 (apex.normalization).
"""

from __future__ import annotations

from migrate.rules._apex_classes import Replacement, plan_replacements
from migrate.rules._context import ModuleContext

RULE = "apex_normalization"

_PARAMETERS = ("normalized_shape", "eps", "elementwise_affine", "memory_efficient")

REPLACEMENTS = (
    Replacement(
        apex_name="FusedLayerNorm",
        modules=("apex.normalization",),
        parameters=_PARAMETERS,
        target="torch.nn.LayerNorm",
        positional=3,
        dropped=frozenset({"memory_efficient"}),
        note="under autocast its output is float32 where Apex's was float16",
    ),
    Replacement(
        apex_name="FusedRMSNorm",
        modules=("apex.normalization",),
        parameters=_PARAMETERS,
        target="torch.nn.RMSNorm",
        positional=3,
        dropped=frozenset({"memory_efficient"}),
        added=lambda values: {"eps": "1e-5"},
        note="eps=1e-5 is explicit (torch's default is the float32 machine epsilon)",
    ),
)


def plan(ctx: ModuleContext) -> None:
    plan_replacements(ctx, REPLACEMENTS)
