"""apex_clip_grad: ``from apex.contrib.clip_grad import clip_grad_norm_``.

What it rewrites
    Apex's fused gradient clip is a drop-in for torch's: the same parameters
    (``parameters, max_norm, norm_type=2.0, error_if_nonfinite=False``), the same clip
    coefficient (``max_norm / (total_norm + 1e-6)``, at most 1) and the same return value, the
    total norm. The import takes torch's function under the same name; the calls stay as
    they were.

Before::

    from apex.contrib.clip_grad import clip_grad_norm_

    grad_norm = clip_grad_norm_(model.parameters(), 1.0)

After::

    from torch.nn.utils import clip_grad_norm_

    grad_norm = clip_grad_norm_(model.parameters(), 1.0)

Safety
    Apex only uses its fused kernel for the 2-norm of CUDA gradients and hands every other
    case to torch's own function. For float32 gradients (a float32 model, with or without
    autocast) both sum the same squares in float32. For float16 gradients Apex's kernel
    accumulated the norm in float32 while torch computes it in float16, where a total norm
    above 65504 becomes inf and the clip zeroes the gradients: a module that calls
    ``.half()`` gets an AMP041 note saying so.

References
    NVIDIA/apex: apex/contrib/clip_grad/clip_grad.py; pytorch/pytorch: torch/nn/utils/clip_grad.py.
"""

from __future__ import annotations

import libcst as cst

from migrate.rules._bindings import Binding
from migrate.rules._context import ModuleContext

RULE = "apex_clip_grad"

_APEX_PATHS = frozenset({"apex.contrib.clip_grad.clip_grad_norm_", "apex.contrib.clip_grad.clip_grad.clip_grad_norm_"})
TORCH_FUNCTION = "torch.nn.utils.clip_grad_norm_"


def _imports(ctx: ModuleContext) -> list[Binding]:
    """``from apex.contrib.clip_grad import clip_grad_norm_ [as X]`` bindings that may be rebound."""
    found = []
    for scope_imports in ctx.imports.values():
        for bindings in scope_imports.values():
            for binding in bindings:
                if binding.kind == "other_apex" and binding.target in _APEX_PATHS and binding.copy is None:
                    found.append(binding)
    return found


def rebound_names(ctx: ModuleContext) -> dict[int, str]:
    """Imports of Apex's clip whose name stays, bound to torch's function: alias id -> its path
    (the amp_import rule rewrites the import once every use is consumed)."""
    return {id(binding.alias): TORCH_FUNCTION for binding in _imports(ctx)}


def plan(ctx: ModuleContext) -> None:
    bindings = _imports(ctx)
    if not bindings:
        return
    aliases = {id(binding.alias): binding for binding in bindings}
    kept = {key for key, binding in aliases.items() if ctx.skipped(binding.statement)}
    for name in ctx.reference_names():
        binding = ctx.resolve(name.value, name)
        if binding is not None and id(binding.alias) in aliases and id(binding.alias) not in kept:
            # torch's function under the same name does what Apex's did: every use stays as written
            ctx.consumed.add(name)
    halved = next(
        (
            call
            for call in ctx.nodes_of(cst.Call)
            if isinstance(call.func, cst.Attribute) and call.func.attr.value == "half" and not call.args
        ),
        None,
    )
    if halved is None:
        return
    for key, binding in aliases.items():
        if key not in kept:
            ctx.report(
                "AMP041",
                binding.alias,
                f"apex.contrib.clip_grad.clip_grad_norm_ became {TORCH_FUNCTION}, which computes the norm of "
                f"float16 gradients in float16 (Apex summed it in float32); this module calls `.half()` (line "
                f"{ctx.position(halved)[0]}): where gradients are float16, a total norm above 65504 is inf and the "
                "clip zeroes them; pass float32 gradients (a float32 model under torch.autocast) to keep Apex's result",
            )
