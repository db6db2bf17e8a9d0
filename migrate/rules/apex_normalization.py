"""apex_normalization: ``apex.normalization.FusedLayerNorm`` and ``FusedRMSNorm``.

What it rewrites
    ``FusedLayerNorm`` becomes ``torch.nn.LayerNorm`` and ``FusedRMSNorm`` becomes
    ``torch.nn.RMSNorm``, with ``eps=1e-5`` written out for RMSNorm (torch's default is the
    float32 machine epsilon, Apex's 1e-5). ``memory_efficient`` goes: it only trades memory
    for recomputation. Parameter names (``weight``, ``bias``) match, so checkpoints load.

    ``MixedFusedLayerNorm`` / ``MixedFusedRMSNorm`` become ``torch.nn.LayerNorm`` /
    ``torch.nn.RMSNorm`` too (eps written out for RMSNorm); their output followed the
    parameters' dtype, torch's follows the input's, and the note gives the cast that restores
    Apex's dtype where the two differ.

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

Not rewritten (reported instead, AMP042, with the code to write)
    ``elementwise_affine=False`` on a Mixed* layer (Apex raised) and unknown keywords.

Safety
    Under autocast Apex's fused layer norm returned float16; torch's LayerNorm runs in
    float32 there (AMP041). ``torch.nn.RMSNorm`` needs torch 2.4. Outside autocast, a Mixed*
    layer with half parameters returned half for float32 input, torch returns float32.

References
    NVIDIA/apex: apex/normalization/fused_layer_norm.py; pytorch/pytorch PR #121364;
    ../shared/apex-semantics.md section 5 (apex.normalization).
"""

from __future__ import annotations

from migrate.rules._apex_classes import Replacement, plan_replacements
from migrate.rules._context import ModuleContext

RULE = "apex_normalization"

_PARAMETERS = ("normalized_shape", "eps", "elementwise_affine", "memory_efficient")
# Apex's Mixed* layers: (normalized_shape, eps=1e-5, *, memory_efficient=False, **kwargs)
_MIXED_PARAMETERS = ("normalized_shape", "eps", "memory_efficient", "elementwise_affine")
_MIXED_NOTE = (
    "its output follows the input's dtype where Apex's followed the parameters': with float32 input and "
    "half parameters write `norm(x).to(norm.weight.dtype)`; under autocast it is float32 where Apex's was float16"
)


def _eps_note(values: dict[str, object]) -> str:
    if "eps" in values:
        return "eps kept as written"
    return "eps=1e-5 is written out (Apex's default; torch's is the float32 machine epsilon)"


_MIXED_ADVICE = {
    "elementwise_affine": "Apex raised for it (Mixed* layers always have parameters): use the plain "
    "`torch.nn.LayerNorm(normalized_shape, eps=eps, elementwise_affine=False)` (RMSNorm likewise)"
}

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
        note=lambda values: _eps_note(values),
    ),
    Replacement(
        apex_name="MixedFusedLayerNorm",
        modules=("apex.normalization",),
        parameters=_MIXED_PARAMETERS,
        target="torch.nn.LayerNorm",
        positional=2,
        dropped=frozenset({"memory_efficient"}),
        required={"elementwise_affine": True},
        note=_MIXED_NOTE,
        advice=_MIXED_ADVICE,
    ),
    Replacement(
        apex_name="MixedFusedRMSNorm",
        modules=("apex.normalization",),
        parameters=_MIXED_PARAMETERS,
        target="torch.nn.RMSNorm",
        positional=2,
        dropped=frozenset({"memory_efficient"}),
        required={"elementwise_affine": True},
        added=lambda values: {"eps": "1e-5"},
        note=lambda values: f"{_eps_note(values)}; {_MIXED_NOTE}",
        advice=_MIXED_ADVICE,
    ),
)


def plan(ctx: ModuleContext) -> None:
    plan_replacements(ctx, REPLACEMENTS)
