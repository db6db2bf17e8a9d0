"""amp_import: the Apex imports, once nothing uses them.

What it rewrites
    ``from apex import amp [as X]``, ``import apex.amp as X``, ``import apex`` (used as
    ``apex.amp.X``) and ``from apex.amp import ...`` go when every use was migrated.
    The optional-import pattern ``try: from apex import amp ... except ImportError: ...``
    collapses to what the ``try`` body did besides importing (``APEX_AVAILABLE = True``
    keeps working: torch.amp is always there); a ``try`` that also imports other things
    keeps its shape. ``import torch`` is added when the new code needs it.

    Other Apex names imported and never used (``from apex import amp, optimizers`` where
    ``optimizers`` is unused, ``from apex.parallel import DistributedDataParallel as DDP``
    kept only in case) go too, as ruff's F401 fix would remove them from a script: importing
    them has no effect other than failing where Apex is missing. Unless the name may be
    reached from outside the module: other given modules import it from this one (project
    mode's facts, which also find the project files that import the name without naming Apex;
    all of them for a star import), ``__all__`` lists it, or the module may look
    it up by its spelling (the name as a whole string, ``globals()``, ``eval``; not for an
    Apex-optional import, ``try: ... except ImportError: pass``, whose name no string spells:
    without Apex such a lookup never found it), or it opens a ``try`` whose other code runs
    only where Apex is, an ``except ImportError`` clause doing something else (a probe: the
    code may need Apex without naming it). A single-file
    run has no project facts and removes a module-level unused name, as F401 does outside
    ``__init__.py``; the engine is not told a module's file name, so a package's
    ``__init__.py`` re-exporting an Apex name to code outside the run is the one case it
    cannot see (run the project as a whole, or list the name in ``__all__``).

Before::

    try:
        from apex import amp
        APEX_AVAILABLE = True
    except ImportError:
        APEX_AVAILABLE = False

After::

    APEX_AVAILABLE = True

Not rewritten (reported instead)
    Whatever still uses Apex after the other rules ran: the amp module stored or passed
    as a value (AMP030), private Apex state the amp_private_state rule could not rewrite
    (AMP031), amp functions without a rewrite (AMP032), other Apex modules (AMP040; also an
    unused name that stays for one of the reasons above, and the message says which; also a
    name whose uses here were migrated but that other modules import from this one, or that
    ``__all__`` lists: its import stays and the message names them), an
    ``import apex`` that only checks that Apex is installed (AMP043; one whose ``try`` only
    imports Apex and ignores its failure, ``except ImportError: pass`` or only a message that
    Apex is missing, goes). Their imports stay so
    the code keeps running where Apex is installed.

References
    ../shared/apex-semantics.md sections 0 and 9 (first row).
"""

from __future__ import annotations

import re

import libcst as cst

from migrate.rules import _syntax as syntax
from migrate.rules import amp_private_state, apex_clip_grad, apex_normalization
from migrate.rules._amp import AmpModel
from migrate.rules._bindings import (
    Binding,
    bound_name,
    dotted_name,
    is_import_fallback,
    presence_check,
)
from migrate.rules._context import ModuleContext
from migrate.rules._exports import module_all, reached_from_outside
from migrate.rules.amp_cast_functions import APIS as CAST_APIS

RULE = "amp_import"

_MIGRATED_APIS = frozenset(
    {
        "initialize",
        "scale_loss",
        "master_params",
        "state_dict",
        "load_state_dict",
        "disable_casts",
        "wrap_optimizer",
        *CAST_APIS,
    }
)
_MENTIONS_APEX = re.compile(r"\bapex\b", re.IGNORECASE)
_IMPORT_ERRORS = frozenset({"ImportError", "ModuleNotFoundError", "Exception", "BaseException"})

# what to write instead of other Apex modules (AMP040 messages); the longest known prefix of a
# dotted path applies
_CLIP = "`torch.nn.utils.clip_grad_norm_(params, max_grad_norm)` before each `optimizer.step()`"
_FP16_RECIPE = (
    'the float32 model under `torch.autocast("cuda", dtype=torch.float16)` with '
    '`scaler = torch.amp.GradScaler("cuda")`: `scaler.scale(loss).backward()`, `scaler.step(optimizer)`, '
    "`scaler.update()`"
)
_NORM_AUTOCAST = "; under autocast Apex's output was float16, torch's is float32"
_RMS_AUTOCAST = "; under autocast Apex computed in the autocast dtype (float16 output)"
# apex.contrib's DistributedFusedAdam: AdamW with its optimizer state sharded across ranks
_ZERO_ADAMW = (
    "`torch.distributed.optim.ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW, lr=lr, "
    "betas=betas, eps=eps, weight_decay=weight_decay)`"
)
REPLACEMENTS = {
    "apex.parallel.DistributedDataParallel": "`torch.nn.parallel.DistributedDataParallel(module, "
    "broadcast_buffers=False, find_unused_parameters=True)` (Apex kept buffers per process and accepted "
    "parameters without gradients); as a type (`isinstance`, a tuple of wrapper classes) "
    "`torch.nn.parallel.DistributedDataParallel`, once the models it tests are wrapped by torch",
    "apex.parallel.distributed.DistributedDataParallel": "`torch.nn.parallel.DistributedDataParallel(module, "
    "broadcast_buffers=False, find_unused_parameters=True)`",
    "apex.parallel.SyncBatchNorm": "`torch.nn.SyncBatchNorm(num_features, eps, momentum, affine, "
    "track_running_stats, process_group)`; as a type (`isinstance`, a tuple of BN classes) `torch.nn.SyncBatchNorm`, "
    "once the layers it tests are built by torch (`torch.nn.SyncBatchNorm.convert_sync_batchnorm`)",
    "apex.parallel.convert_syncbn_model": "`torch.nn.SyncBatchNorm.convert_sync_batchnorm(module, process_group)`",
    "apex.parallel.ReduceOp": "`torch.distributed.ReduceOp`",
    "apex.parallel.LARC": "the plain-torch `class LARC` the apex_parallel rule writes into the module once no Apex "
    "amp stays there (torch has none): each gradient scaled by trust_coefficient * |w| / (|g| + weight_decay * |w| "
    "+ eps) before the step",
    "apex.parallel.Reducer": "`torch.distributed.broadcast(p.data, 0)` for each parameter once, then per reduce: "
    "`torch.distributed.all_reduce(g); g /= torch.distributed.get_world_size()` for each gradient `g`",
    "apex.parallel.create_syncbn_process_group": "`torch.distributed.new_group(ranks=list(range(start, start + "
    "group_size)))` for each start in `range(0, world_size, group_size)` on every rank, keeping the group of "
    "`torch.distributed.get_rank() // group_size`",
    "apex.parallel.distributed.flat_dist_call": "`call(tensor, *extra_args)` for each tensor, followed by "
    "`tensor /= torch.distributed.get_world_size()` when call is `torch.distributed.all_reduce`",
    "apex.parallel.multiproc": "`torchrun --nproc_per_node=N script.py`",
    # apex.reparameterization's only reparameterization is WeightNorm; torch's (pre-parametrizations)
    # weight_norm names the parameters `<name>_g` and `<name>_v` as Apex did, so checkpoints load
    "apex.reparameterization.apply_weight_norm": "`torch.nn.utils.weight_norm(m, name, dim)` on the module `m` "
    "that holds the parameter (the parameters keep Apex's names `<name>_g`, `<name>_v`); the default name='' "
    "meant every parameter of more than one dimension outside Embedding/EmbeddingBag layers: `for m in "
    "list(module.modules()):` / `for n, p in list(m.named_parameters(recurse=False)):` / `if p.dim() > 1 and not "
    "isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)): torch.nn.utils.weight_norm(m, n, dim)`",
    "apex.reparameterization.remove_weight_norm": "`torch.nn.utils.remove_weight_norm(m, name)` on each module `m` "
    "given weight norm (the default name='' meant all of them under `module`)",
    "apex.reparameterization": "`torch.nn.utils.weight_norm(m, name, dim)` / `torch.nn.utils.remove_weight_norm(m, "
    "name)` (WeightNorm is apex.reparameterization's only reparameterization)",
    "apex.parallel": "`torch.nn.parallel.DistributedDataParallel(module, broadcast_buffers=False, "
    "find_unused_parameters=True)` and `torch.nn.SyncBatchNorm`",
    "apex.optimizers.FusedAdam": "`torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, "
    "fused=True)` with weight_decay written out (AdamW's default is 0.01, FusedAdam's 0.0), or `torch.optim.Adam"
    "(...)` for adam_w_mode=False",
    "apex.optimizers.FusedSGD": "`torch.optim.SGD(params, lr, momentum, dampening, weight_decay, nesterov)`",
    "apex.optimizers.FusedAdagrad": "`torch.optim.Adagrad(params, lr=lr, eps=eps, weight_decay=weight_decay)`",
    "apex.optimizers.FusedLAMB": "no torch LAMB: keep `apex.optimizers.FusedLAMB` (current Apex still ships it); "
    "it clips the global gradient norm to max_grad_norm (default 1.0) inside step(), so with another LAMB write "
    + _CLIP,
    "apex.optimizers.FusedMixedPrecisionLamb": "no torch LAMB: keep `apex.optimizers.FusedMixedPrecisionLamb` "
    "(current Apex still ships it); with another LAMB write " + _CLIP,
    "apex.optimizers.FusedNovoGrad": "no torch NovoGrad: keep `apex.optimizers.FusedNovoGrad` (current Apex still "
    "ships it)",
    "apex.optimizers": "`torch.optim.AdamW(..., weight_decay=weight_decay, fused=True)` for FusedAdam, "
    "`torch.optim.SGD` for FusedSGD, `torch.optim.Adagrad` for FusedAdagrad",
    "apex.normalization.FusedLayerNorm": "`torch.nn.LayerNorm(normalized_shape, eps=eps, "
    "elementwise_affine=elementwise_affine)`",
    "apex.normalization.FusedRMSNorm": "`torch.nn.RMSNorm(normalized_shape, eps=1e-5, "
    "elementwise_affine=elementwise_affine)` (eps written out: torch's default is the float32 machine epsilon)",
    "apex.normalization.MixedFusedLayerNorm": "`torch.nn.LayerNorm(normalized_shape, eps=eps)`, its output cast "
    "to the parameters' dtype: `norm(x).to(norm.weight.dtype)`",
    "apex.normalization.MixedFusedRMSNorm": "`torch.nn.RMSNorm(normalized_shape, eps=1e-5)`, its output cast to "
    "the parameters' dtype: `norm(x).to(norm.weight.dtype)`",
    # the functional forms default to eps=1e-6, the layers to 1e-5; under autocast they computed in its dtype
    "apex.normalization.fused_layer_norm_affine": "`torch.nn.functional.layer_norm(input, normalized_shape, "
    "weight, bias, eps)` with eps written out (Apex's default here is 1e-6)" + _NORM_AUTOCAST,
    "apex.normalization.fused_layer_norm": "`torch.nn.functional.layer_norm(input, normalized_shape, eps=eps)` "
    "for the function, with eps written out (Apex's default here is 1e-6)" + _NORM_AUTOCAST,
    "apex.normalization.mixed_dtype_fused_layer_norm_affine": "`torch.nn.functional.layer_norm(input, "
    "normalized_shape, weight, bias, eps).to(weight.dtype)` with eps written out (Apex's default here is 1e-6)",
    "apex.normalization.fused_rms_norm_affine": "`torch.nn.functional.rms_norm(input, normalized_shape, weight, "
    "eps)` with eps written out (Apex's default here is 1e-6; torch 2.4)" + _RMS_AUTOCAST,
    "apex.normalization.fused_rms_norm": "`torch.nn.functional.rms_norm(input, normalized_shape, eps=eps)` with eps "
    "written out (Apex's default here is 1e-6; torch 2.4)" + _RMS_AUTOCAST,
    "apex.normalization.mixed_dtype_fused_rms_norm_affine": "`torch.nn.functional.rms_norm(input, normalized_shape, "
    "weight, eps).to(weight.dtype)` with eps written out (Apex's default here is 1e-6; torch 2.4)",
    "apex.normalization.FusedLayerNormAffineFunction": "`torch.nn.functional.layer_norm(input, normalized_shape, "
    "weight, bias, eps)` for `.apply(input, weight, bias, normalized_shape, eps)`",
    "apex.normalization.FusedLayerNormFunction": "`torch.nn.functional.layer_norm(input, normalized_shape, eps=eps)` "
    "for `.apply(input, normalized_shape, eps)`",
    "apex.normalization.FusedRMSNormAffineFunction": "`torch.nn.functional.rms_norm(input, normalized_shape, weight, "
    "eps)` for `.apply(input, weight, normalized_shape, eps)` (torch 2.4)",
    "apex.normalization.FusedRMSNormFunction": "`torch.nn.functional.rms_norm(input, normalized_shape, eps=eps)` for "
    "`.apply(input, normalized_shape, eps)` (torch 2.4)",
    "apex.normalization": "`torch.nn.LayerNorm(normalized_shape, eps=eps, elementwise_affine=elementwise_affine)` "
    "for FusedLayerNorm, `torch.nn.RMSNorm(normalized_shape, eps=1e-5)` for FusedRMSNorm, "
    "`torch.nn.functional.layer_norm` / `torch.nn.functional.rms_norm` for the functions",
    "apex.fp16_utils.FP16_Optimizer": "the wrapped optimizer itself with " + _FP16_RECIPE + "; "
    "`optimizer.backward(loss)` is `scaler.scale(loss).backward()`, `optimizer.clip_master_grads(n)` is "
    "`scaler.unscale_(optimizer)` then `torch.nn.utils.clip_grad_norm_(params, n)`",
    "apex.fp16_utils.fp16_optimizer": "the wrapped optimizer itself with " + _FP16_RECIPE,
    "apex.optimizers.FP16_Optimizer": "the wrapped optimizer itself with " + _FP16_RECIPE + "; it only ran with "
    "the old FusedAdam, whose step(grads=..., scale=...) API current Apex removed",
    "apex.optimizers.fp16_optimizer": "the wrapped optimizer itself with " + _FP16_RECIPE,
    "apex.contrib.optimizers.FP16_Optimizer": "the wrapped optimizer itself with " + _FP16_RECIPE + "; it drove "
    "Apex's fused optimizers through their step(grads=..., scale=...) API, so keep Apex for both or migrate both",
    "apex.fp16_utils.to_python_float": "`tensor.item()`",
    "apex.fp16_utils.clip_grad_norm": "`torch.nn.utils.clip_grad_norm_`",
    "apex.fp16_utils.network_to_half": "the model itself (delete the call) and " + _FP16_RECIPE,
    "apex.fp16_utils.FP16Model": "the model itself (delete the wrapper) and " + _FP16_RECIPE,
    "apex.fp16_utils.BN_convert_float": "the float32 model itself (delete the call and its .half()) and "
    + _FP16_RECIPE,
    "apex.fp16_utils": _FP16_RECIPE,
    "apex.multi_tensor_apply": "`torch._foreach_*` ops instead of `multi_tensor_applier(amp_C.<kernel>, ...)` "
    "(`torch._foreach_mul_(xs, scale)` for multi_tensor_scale, `torch.linalg.vector_norm(torch.stack("
    "torch._foreach_norm(xs, dtype=torch.float32)), keepdim=True)` for multi_tensor_l2norm)",
    "apex.contrib.xentropy": "`torch.nn.functional.cross_entropy(logits.float() if half_to_float else logits, labels, "
    'reduction="none", label_smoothing=smoothing, ignore_index=padding_idx)` (padding_idx defaults to 0)',
    "apex.contrib.clip_grad": "`torch.nn.utils.clip_grad_norm_`",
    "apex.contrib.group_norm": "`torch.nn.GroupNorm`",
    "apex.contrib.focal_loss": "`torchvision.ops.sigmoid_focal_loss`",
    "apex.contrib.multihead_attn": "`torch.nn.MultiheadAttention`",
    "apex.contrib.layer_norm": "`torch.nn.LayerNorm`",
    "apex.contrib.optimizers.DistributedFusedAdam": _ZERO_ADAMW + " (optimizer state sharded across ranks, as "
    "Apex's was)",
    "apex.contrib.optimizers.distributed_fused_adam": _ZERO_ADAMW,
    "apex.contrib.optimizers": "no exact torch counterpart: apex.contrib.optimizers' FusedAdam and FusedSGD are "
    "Apex's older fused optimizers, stepped by apex.contrib.optimizers.FP16_Optimizer through step(grads=..., "
    "output_params=..., scale=...): keep the pair, or replace both together by a torch optimizer under "
    '`scaler = torch.amp.GradScaler("cuda")` as the FP16_Optimizer\'s finding says; its LAMB optimizers have no '
    "torch counterpart: keep `apex.contrib.optimizers` for them",
    "apex.mlp": "a `torch.nn.Sequential` of `torch.nn.Linear` and `torch.nn.ReLU` layers",
    "apex.fused_dense": "`torch.nn.Linear`",
    "apex.RNN": "`torch.nn.LSTM` / `torch.nn.GRU`",
    "apex.amp": "the GradScaler's public API (`scaler.get_scale()`, `scaler.state_dict()`)",
}

# amp functions without an automatic rewrite (AMP032): what to write instead
_CAST_HELPER = (
    'use it only as `@amp.{api}` on a def, `amp.{api}(fn)` or in `amp.register_{api}(module, "name")`, '
    "the forms ampmigrate rewrites to its plain-torch `{api}` helper ({what})"
)
_CAST_WHAT = {
    "half": "under torch.autocast, floating-point tensor arguments cast to float16",
    "float": "under torch.autocast, floating-point tensor arguments cast to float32 and the function run with "
    "autocast off",
    "promote": "under torch.autocast, a float16/float32 mix of tensor arguments cast to float32",
}
AMP_APIS = {
    "init": 'the amp_init rule (left out of --select) migrates it: `scaler = torch.amp.GradScaler("cuda", '
    "enabled=<amp.init's enabled>)` where the handle was created, the forward pass and loss under "
    '`with torch.autocast("cuda", dtype=torch.float16):`, and for each `with handle.scale_loss(loss, optimizer)` '
    "or wrapper `optimizer.scale_loss(loss)`: `scaler.scale(loss).backward()`, then `scaler.step(optimizer)` and "
    "`scaler.update()` instead of `optimizer.step()`",
    **{
        f"{prefix}{kind}_function": _CAST_HELPER.format(api=f"{kind}_function", what=what)
        for kind, what in _CAST_WHAT.items()
        for prefix in ("", "register_")
    },
    "scale_loss": "write `scaler.scale(loss)` with the GradScaler that replaces amp.initialize",
    "master_params": 'write `(p for group in optimizer.param_groups for p in group["params"])`',
    "state_dict": "write `scaler.state_dict()`",
    "load_state_dict": "write `scaler.load_state_dict(state)`",
    "initialize": 'delete it and create `scaler = torch.amp.GradScaler("cuda")` (Apex returned the objects it got)',
    "disable_casts": 'write `torch.autocast("cuda", enabled=False)`',
}


def _replacement(path: str) -> str:
    """What to write instead of ``path``, as a phrase."""
    # the classes are also imported from the module that defines them
    path = path.replace("apex.normalization.fused_layer_norm.", "apex.normalization.")
    for module in ("optimized_sync_batchnorm", "sync_batchnorm"):
        path = path.replace(f"apex.parallel.{module}.SyncBatchNorm", "apex.parallel.SyncBatchNorm")
    while path:
        if path in REPLACEMENTS:
            advice = REPLACEMENTS[path]
            return advice if advice.startswith("no ") else f"use {advice}"
        path = path.rpartition(".")[0]
    return "no torch counterpart ampmigrate knows: keep `import apex` from an Apex build for it"


def _module_dunder(attribute: cst.Attribute) -> str | None:
    """AMP031's message for ``amp.__path__`` and the like: the module's own metadata, not amp state."""
    name = attribute.attr.value
    if not (name.startswith("__") and name.endswith("__")):
        return None
    code = syntax.code(attribute)
    if name == "__dict__":
        # timm's ApexScaler: `if 'state_dict' in amp.__dict__:`, for Apex builds without it
        return (
            f"`{code}` asks which functions the installed apex.amp has, not amp state: with Apex gone there is no "
            "such module, and torch.amp.GradScaler always has state_dict() and load_state_dict(): drop the check"
        )
    instead = f", or read `torch.amp.{name}` instead" if name in ("__path__", "__file__", "__name__") else ""
    return f"`{code}` reads the apex.amp module's own {name}, not amp state: with Apex gone there is no such module: drop it{instead}"


def _amp_api(api: str) -> str:
    advice = AMP_APIS.get(api)
    if advice is None:
        return (
            f"amp.{api} is Apex internals with no automatic rewrite: use the GradScaler's public API "
            "(`scaler.get_scale()`, `scaler.state_dict()`, `scaler.update(new_scale=...)`)"
        )
    return f"amp.{api} has no automatic rewrite: {advice}"


def _references(ctx: ModuleContext) -> dict[cst.ImportAlias, list[cst.Name]]:
    """Every Name that refers to an Apex binding, grouped by the import alias."""
    found: dict[cst.ImportAlias, list[cst.Name]] = {}
    for node in ctx.reference_names():
        binding = ctx.resolve(node.value, node)
        if binding is None or binding.kind not in ("amp", "apex", "amp_function", "other_apex"):
            continue
        if any(isinstance(a, (cst.Import, cst.ImportFrom)) for a in ctx.ancestors(node)):
            continue
        if isinstance(ctx.parent(node), cst.NameItem):
            continue  # `global amp`: a declaration, which goes with the import (_drop_global)
        found.setdefault(binding.alias, []).append(node)
    return found


def _catches_import_error(handler: cst.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    types = handler.type.elements if isinstance(handler.type, cst.Tuple) else [handler.type]
    names = {dotted_name(t.value) if isinstance(t, cst.BaseElement) else dotted_name(t) for t in types}
    return bool(names & _IMPORT_ERRORS)


def _is_simple(ctx: ModuleContext, statement: cst.CSTNode) -> bool:
    """Statements that cannot raise ImportError themselves: flag assignments, logging, and
    a ``def`` or ``class`` without imports (a class that subclasses the imported one)."""
    if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
        return not any(isinstance(node, (cst.Import, cst.ImportFrom)) for node in ctx.walk(statement))
    if not isinstance(statement, cst.SimpleStatementLine):
        return False
    return all(
        isinstance(small, (cst.Assign, cst.AnnAssign, cst.Pass, cst.Expr, cst.Global, cst.Nonlocal))
        for small in statement.body
    )


def _drop_import_statement(ctx: ModuleContext, line: cst.CSTNode, kept: bool = False) -> None:
    """Remove an import line (``kept``: it stays, rewritten to import from torch); collapse
    an optional-import ``try`` around it."""
    block = ctx.parent(line)
    owner = ctx.parent(block) if isinstance(block, cst.IndentedBlock) else None
    if isinstance(owner, cst.Try) and ctx.skipped(owner):
        return  # `try:  # ampmigrate: skip` keeps the whole optional import as it was
    if ctx.skipped(line):
        return
    if isinstance(owner, cst.Try) and owner.body is block and owner.finalbody is None:
        remaining = [s for s in block.body if s is not line and s not in ctx.plan.remove]
        if all(_is_simple(ctx, s) for s in remaining) and all(_catches_import_error(h) for h in owner.handlers):
            # `print("Using apex FusedLayerNorm")` beside the import would announce Apex where it is gone
            announced = [s for s in remaining if _announces_apex(s)]
            remaining = [s for s in remaining if s not in announced]
            keep = [*remaining, *(owner.orelse.body.body if owner.orelse is not None else ())]  # type: ignore[union-attr]
            if keep or kept:
                ctx.plan.remove.update(announced)
            if keep or kept:
                # the try gives way to its body and else, with the other rules' edits made in them
                if not kept:
                    _remove(ctx, line)
                ctx.plan.unwrap.add(owner)
                overwritten = _default_the_flags_overwrite(ctx, owner, remaining)
                if overwritten is not None:
                    ctx.plan.remove.add(overwritten)
            else:
                _remove(ctx, owner)
            return
    if not kept:
        _remove(ctx, line)


def _default_the_flags_overwrite(
    ctx: ModuleContext, owner: cst.Try, kept: list[cst.BaseStatement | cst.BaseSmallStatement]
) -> cst.BaseStatement | None:
    """``has_apex = False`` right before an optional-import ``try`` that gives way to its body,
    where that body sets the flag again (``has_apex = True``) before anything reads it: the
    default is overwritten at once, and ``has_apex = False`` then ``has_apex = True`` would
    read as a mistake. None where there is no such line."""
    block = ctx.parent(owner)
    if not isinstance(block, (cst.IndentedBlock, cst.Module)):
        return None
    statements = list(block.body)
    at = statements.index(owner)
    previous = _flag_set(statements[at - 1]) if at > 0 else None
    if previous is None:
        return None
    for statement in kept:
        flag = _flag_set(statement)
        if flag == previous:
            return statements[at - 1]
        if any(isinstance(node, cst.Name) and node.value == previous for node in ctx.walk(statement)):
            return None  # read (or set otherwise) before the body sets it again
    return None


def _flag_set(statement: cst.CSTNode) -> str | None:
    """``NAME`` for a line ``NAME = <literal>``."""
    assigned = syntax.name_assignment(statement)
    return assigned[0] if assigned is not None and syntax.literal(assigned[1]) is not ... else None


_LOG_CALLS = frozenset({"print", "debug", "info", "warning", "warn", "log"})


def _announces_apex(statement: cst.CSTNode) -> bool:
    """``print("Using apex FusedLayerNorm")`` / ``logger.info("apex found")``: a message about
    Apex, true only while the import it follows runs."""
    return _is_apex_message(syntax.sole_statement(statement))


def _is_apex_message(small: cst.BaseSmallStatement | None) -> bool:
    """The small statement of ``_announces_apex``'s line."""
    if not isinstance(small, cst.Expr) or not isinstance(small.value, cst.Call):
        return False
    name = dotted_name(small.value.func)
    if name is None or name.rpartition(".")[2] not in _LOG_CALLS:
        return False
    return any(
        isinstance(arg.value, (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString))
        and _MENTIONS_APEX.search(syntax.code(arg.value)) is not None
        for arg in small.value.args
    )


def _remove(ctx: ModuleContext, statement: cst.CSTNode) -> None:
    """Remove an Apex import statement, and the comment right above it where that speaks of
    Apex (``# use apex for mixed precision``): it would be left describing nothing."""
    ctx.plan.remove.add(statement)
    lines = getattr(statement, "leading_lines", ())
    attached = lines[syntax.comments_right_above(lines) :]
    if any(_MENTIONS_APEX.search(line.comment.value) for line in attached):
        ctx.plan.forget_comments.add(statement)


def unused_imports(
    ctx: ModuleContext, references: dict[cst.ImportAlias, list[cst.Name]], rebound: dict[int, str]
) -> tuple[dict[int, str], dict[int, str]]:
    """Apex imports (other than amp and the bare package) whose names nothing here uses, as
    ids of their aliases: those that go (-> the bound name) and those that stay because
    they may be reached from outside (-> why): a module-level name other modules import
    (project facts, ``__all__``), or one the module may look up by its spelling (the name
    as a whole string literal, ``globals()``/``locals()``/``vars()``, ``eval``/``exec``)."""
    gone: dict[int, str] = {}
    kept: dict[int, str] = {}
    for scope, scope_imports in ctx.imports.items():
        for bound, bindings in scope_imports.items():
            if bound == "*":
                continue
            for binding in bindings:
                if binding.kind != "other_apex" or binding.target in amp_private_state.STATE_TARGETS:
                    continue
                if binding.copy is not None:
                    continue  # a name from the project's own copy of Apex: importing it is its business
                if id(binding.alias) in rebound:
                    continue  # the name stays, bound to the torch class
                if any(not is_import_fallback(ctx, name) for name in references.get(binding.alias, [])):
                    continue
                why = _probe_for_code(ctx, binding.statement) or reached_from_outside(
                    ctx, scope, bound, binding.statement
                )
                if why is None:
                    gone[id(binding.alias)] = bound
                else:
                    kept[id(binding.alias)] = why
    return gone, kept


def _probe_for_code(ctx: ModuleContext, statement: cst.CSTNode) -> str | None:
    """Why an unused Apex import stays as a probe: it opens a ``try`` whose body goes on with
    other code than imports and flags (fairseq: the project's own FusedAdam, built on Apex's
    CUDA extension ``fused_adam_cuda``) while an ``except`` clause does something else
    (``except ImportError: <fallback>``). Without the import, that code would run where Apex
    is missing."""
    owner = ctx.try_around(statement)
    if owner is None:
        return None

    def plain(node: cst.CSTNode) -> bool:
        """An import, ``pass``, or a flag set to a literal (``HAS_APEX = True``)."""
        small = syntax.sole_statement(node)
        if isinstance(small, (cst.Import, cst.ImportFrom, cst.Pass)):
            return True
        return isinstance(small, cst.Assign) and syntax.literal(small.value) is not ...

    fallback = any(
        not all(plain(statement) for statement in handler.body.body)  # type: ignore[attr-defined]
        for handler in owner.handlers
    )
    code = [statement for statement in owner.body.body if not plain(statement)]
    if not (fallback and code):
        return None
    return (
        f"it checks that Apex is installed for the code after it in its `try` (line {ctx.position(code[0])[0]}), "
        "which runs only where Apex is, the except clause's code otherwise (that code may need Apex without "
        "naming it, as fairseq's FusedAdam needs Apex's fused_adam_cuda)"
    )


def _bare_probe_of_migrated_code(
    ctx: ModuleContext, binding: Binding, references: dict[cst.ImportAlias, list[cst.Name]]
) -> bool:
    """An unused ``import apex`` in a module whose Apex code this run migrated, not in a
    function: it only checked that Apex was installed for that code, and goes with it (else
    AMP043). Its ``try`` may set a flag (``has_apex = True``) that only this module reads, once
    no other Apex import of the module stays: the flag then says True, as it did where Apex
    was installed, and the code it chose there is the migrated code. So does one whose ``try``
    ignores its failure (``except ImportError: pass`` and nothing else), whatever this run
    migrated: it neither uses Apex nor stops where Apex is missing, so deleting it changes nothing."""
    if ctx.function_of(binding.statement) is not None:
        return False
    line = ctx.statement_of(binding.statement)
    if ctx.skipped(line):
        return False
    owner = ctx.try_around(binding.statement)
    ignored = owner is not None and _failure_ignored(owner)
    guarded_imports = False
    for ancestor in ctx.ancestors(line):
        if isinstance(ancestor, cst.Try):
            if ctx.skipped(ancestor):
                return False
            if not _flags_stay_here(ctx, ancestor, binding, references):
                return False  # code elsewhere reads what it found
            guarded_imports = guarded_imports or _imports_other_apex_names(ctx, ancestor, binding)
    # with nothing migrated, the probe still goes with the other Apex imports of its `try`,
    # which go too (nothing used them): it only checked they would import
    return bool(ctx.consumed) or guarded_imports or ignored


def _imports_other_apex_names(ctx: ModuleContext, owner: cst.Try, probe: Binding) -> bool:
    return any(
        binding.alias is not probe.alias
        and binding.kind in ("amp", "apex", "amp_function", "other_apex")
        and any(ancestor is owner for ancestor in ctx.ancestors(binding.statement))
        for bindings in ctx.imports.get(ctx.module, {}).values()
        for binding in bindings
    )


def _flags_stay_here(
    ctx: ModuleContext, owner: cst.Try, probe: Binding, references: dict[cst.ImportAlias, list[cst.Name]]
) -> bool:
    """Whether what the ``try`` around an Apex probe records is only read in this module, with
    no Apex import left for it to guard: plain ``NAME = <literal>`` flags, caught ImportError,
    names no other module imports from here, and every other Apex import of the module goes."""
    return _why_its_flags_matter(ctx, owner, probe, references) is None


def _why_its_flags_matter(
    ctx: ModuleContext, owner: cst.Try, probe: Binding, references: dict[cst.ImportAlias, list[cst.Name]]
) -> str | None:
    """What the ``try`` around an Apex probe records that code may still need; None: nothing."""
    recorders = (cst.AugAssign, cst.AnnAssign, cst.Return, cst.Global, cst.FunctionDef, cst.ClassDef)
    if any(isinstance(node, recorders) for node in ctx.walk(owner)):
        return "its `try` also defines or hands on what it found"
    if not all(_catches_import_error(handler) for handler in owner.handlers):
        return "its `try` catches more than ImportError"
    flags: set[str] = set()
    for node in ctx.walk(owner):
        if isinstance(node, cst.Assign):
            names = [target.target for target in node.targets]
            if syntax.literal(node.value) is ... or not all(isinstance(name, cst.Name) for name in names):
                return f"its `try` sets `{syntax.code(node).strip()}`"
            flags.update(name.value for name in names)  # type: ignore[attr-defined]
    if not flags:
        return None
    spelled = " and ".join(f"`{flag}`" for flag in sorted(flags))
    exported = ctx.options.facts.exported
    if flags & exported or "*" in exported:
        return f"other modules import the flag it sets ({spelled}) from here"
    returning = _function_returning(ctx, flags)
    if returning is not None:
        return f"`{returning}()` returns the flag it sets ({spelled}) to its callers, where code may still import Apex under it"
    for scope_imports in ctx.imports.values():
        for bindings in scope_imports.values():
            for binding in bindings:
                if binding.alias is probe.alias or binding.kind not in ("amp", "apex", "amp_function", "other_apex"):
                    continue
                left = [
                    name
                    for name in references.get(binding.alias, [])
                    if name not in ctx.consumed and not is_import_fallback(ctx, name)
                ]
                if left:
                    return (
                        f"the flag it sets ({spelled}) may still guard the Apex code left here ({binding.target} "
                        f"at line {ctx.position(left[0])[0]}), which needs it False where Apex is missing"
                    )
    return None


def _probe_kept_because(
    ctx: ModuleContext, binding: Binding, references: dict[cst.ImportAlias, list[cst.Name]]
) -> str | None:
    """Why an unused module-level ``import apex`` in a ``try`` stays, for AMP043's message."""
    for ancestor in ctx.ancestors(ctx.statement_of(binding.statement)):
        if isinstance(ancestor, cst.Try):
            why = _why_its_flags_matter(ctx, ancestor, binding, references)
            if why is not None:
                return why
    return None


def _failure_ignored(owner: cst.Try) -> bool:
    """A ``try`` whose every handler catches ImportError (or everything: ``except:``,
    ``except Exception:``) and only passes or says that Apex is missing
    (``print("No APEX!")``), without ``else`` or ``finally``: what its body imports is
    optional and nothing marks whether it was found. Once the code needs no Apex, the message
    would only announce a missing package nothing uses."""
    if owner.orelse is not None or owner.finalbody is not None or not owner.handlers:
        return False
    # its body only imports Apex: deleting one import lets no other code run where it did not
    for statement in owner.body.body:
        smalls = statement.body if isinstance(statement, cst.SimpleStatementLine) else [None]
        for small in smalls:
            if isinstance(small, cst.Import):
                modules = [dotted_name(alias.name) or "" for alias in small.names]
            elif isinstance(small, cst.ImportFrom) and not small.relative and small.module is not None:
                modules = [dotted_name(small.module) or ""]
            else:
                return False
            if not all(module == "apex" or module.startswith("apex.") for module in modules):
                return False
    for handler in owner.handlers:
        caught = handler.type
        names = [element.value for element in caught.elements] if isinstance(caught, cst.Tuple) else [caught]
        if caught is not None and not all(
            isinstance(name, cst.Name) and name.value in _IMPORT_ERRORS for name in names
        ):
            return False
        block = handler.body
        said: list[cst.BaseSmallStatement] = []
        for line in block.body if isinstance(block, cst.IndentedBlock) else [block]:
            if not isinstance(line, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
                return False
            said.extend(line.body)
        if not all(isinstance(small, cst.Pass) or _is_apex_message(small) for small in said):
            return False
    return True


def _rebind(ctx: ModuleContext, binding: Binding, torch_name: str) -> None:
    """``from apex.normalization import FusedLayerNorm as X`` -> ``from torch.nn import LayerNorm as X``."""
    module, _, name = torch_name.rpartition(".")
    bound = binding.alias.evaluated_alias or binding.alias.evaluated_name
    spelled = name if bound == name else f"{name} as {bound}"
    line_node = cst.parse_statement(f"from {module} import {spelled}\n")
    assert isinstance(line_node, cst.SimpleStatementLine)
    line = ctx.statement_of(binding.statement)
    block = ctx.parent(line)
    owner = ctx.parent(block) if isinstance(block, cst.IndentedBlock) else None
    if ctx.skipped(line) or (isinstance(owner, cst.Try) and ctx.skipped(owner)):
        return
    ctx.plan.substitute(binding.statement, line_node.body[0])
    if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
        _drop_import_statement(ctx, line, kept=True)


def _plan_imports(
    ctx: ModuleContext,
    references: dict[cst.ImportAlias, list[cst.Name]],
    unused: dict[int, str],
    rebound: dict[int, str],
) -> None:
    """Plan the removal of the Apex imports nothing uses any more (``unused``: those that
    were never used, by alias id), and the imports of Apex classes whose name stays bound
    to their torch twin (``rebound``: alias id -> the torch class)."""
    removable: dict[cst.Import | cst.ImportFrom, set[cst.ImportAlias]] = {}
    stars: list[cst.Import | cst.ImportFrom] = []
    exported = ctx.options.facts.exported
    for scope, scope_imports in ctx.imports.items():
        for bound, bindings in scope_imports.items():
            for binding in bindings:
                if binding.kind not in ("amp", "apex", "amp_function", "other_apex"):
                    continue
                uses = references.get(binding.alias, [])
                torch_name = rebound.get(id(binding.alias))
                if torch_name is not None:
                    if all(name in ctx.consumed or is_import_fallback(ctx, name) for name in uses):
                        _rebind(ctx, binding, torch_name)
                    continue
                if id(binding.alias) in unused:
                    removable.setdefault(binding.statement, set()).add(binding.alias)
                    continue
                if scope is ctx.module and (
                    bound in exported or "*" in exported or (binding.kind == "other_apex" and bound in module_all(ctx))
                ):
                    kept_by = ctx.options.facts.amp_kept_by
                    if binding.kind == "amp" and kept_by:
                        ctx.report(
                            "AMP025",
                            binding.alias,
                            f"the Apex amp import stays: {', '.join(kept_by)} import amp from here and keep "
                            "Apex amp (see their findings)",
                        )
                    continue  # other modules of the project import it from here
                if binding.kind == "amp" and not uses and _escaping_probe(ctx, binding):
                    continue  # reported as a presence check (AMP043): its flag tells code elsewhere about Apex
                if bound == "*" and binding.kind == "other_apex":
                    # `from apex.X import *`: removable once the rule that knows its names consumed it
                    if binding.alias.name in ctx.consumed:
                        stars.append(binding.statement)
                    continue
                if any(name not in ctx.consumed and not is_import_fallback(ctx, name) for name in uses):
                    continue  # still used: keep it so that code keeps running with Apex
                if (
                    binding.kind in ("apex", "other_apex")
                    and not any(name in ctx.consumed for name in uses)
                    and not (binding.target in amp_private_state.STATE_TARGETS and not uses)
                    and not (
                        binding.kind == "apex" and not uses and _bare_probe_of_migrated_code(ctx, binding, references)
                    )
                ):
                    continue  # an Apex import this run did not migrate anything of
                removable.setdefault(binding.statement, set()).add(binding.alias)
    for statement, aliases in removable.items():
        if not isinstance(statement.names, cst.ImportStar):
            for alias in aliases:
                _drop_global(ctx, statement, bound_name(alias))
            drop_aliases(ctx, statement, aliases)
    for statement in stars:
        line = ctx.statement_of(statement)
        if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
            _drop_import_statement(ctx, line)


def _drop_global(ctx: ModuleContext, statement: cst.Import | cst.ImportFrom, name: str) -> None:
    """``global amp`` beside ``from apex import amp`` in a function declared the name the import
    bound: it goes with the import (a ``global`` of other names too keeps them)."""
    function = ctx.function_of(statement)
    for declaration in ctx.global_declarations.get(function, ()) if function is not None else ():
        kept = [item for item in declaration.names if item.name.value != name]
        if len(kept) == len(declaration.names):
            continue
        line = ctx.statement_of(declaration)
        if not kept and isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
            ctx.plan.remove.add(line)
        elif kept:
            kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            ctx.plan.substitute(declaration, declaration.with_changes(names=kept))
        else:
            ctx.plan.substitute(declaration, cst.Pass())


def drop_aliases(ctx: ModuleContext, statement: cst.Import | cst.ImportFrom, aliases: set[cst.ImportAlias]) -> None:
    """Plan an import without ``aliases`` (the whole line goes when none is left)."""
    assert not isinstance(statement.names, cst.ImportStar)
    kept = [alias for alias in statement.names if alias not in aliases]
    line = ctx.statement_of(statement)
    if not kept:
        if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
            _drop_import_statement(ctx, line)
        else:
            ctx.plan.substitute(statement, cst.Pass())
        return
    kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)

    def shrink(updated: cst.CSTNode) -> cst.CSTNode:
        assert isinstance(updated, (cst.Import, cst.ImportFrom))
        if isinstance(updated, cst.ImportFrom) and updated.rpar is not None and len(kept) == 1:
            return updated.with_changes(names=kept, lpar=None, rpar=None)
        return updated.with_changes(names=kept)

    ctx.plan.replace[statement] = shrink


def _returned_flag(ctx: ModuleContext, binding: Binding) -> str | None:
    """For AMP043 on an ``import apex`` probe in a function: the function returns the flag its
    ``try`` sets (vissl's ``def is_apex_available(): try: import apex; apex_available = True ...
    return apex_available``), and its callers may import Apex under it; None otherwise."""
    owner = ctx.try_around(binding.statement)
    function = ctx.function_of(binding.statement)
    if owner is None or function is None or _function_returning(ctx, _flags_set_in(ctx, owner), function) is None:
        return None
    return (
        f"`{function.name.value}()` returns the flag it sets, and code that calls it may still import "
        "Apex under it (the flag must keep saying whether Apex is installed)"
    )


def _flags_set_in(ctx: ModuleContext, probe: cst.Try) -> set[str]:
    """The names a probe's ``try`` assigns: its flags (``apex_available = True``)."""
    return {
        name
        for node in ctx.walk(probe)
        if isinstance(node, cst.AssignTarget)
        for name in [dotted_name(node.target)]
        if name is not None
    }


def _function_returning(ctx: ModuleContext, flags: set[str], within: cst.FunctionDef | None = None) -> str | None:
    """The name of a function of the module (or ``within`` itself) that returns one of the probe's
    ``flags`` (``def is_apex_available(): return _has_apex`` in a vendored Hugging Face
    file_utils.py), or None: its callers may import Apex under it, so the flag must keep saying
    whether Apex is installed."""
    for node in ctx.walk(within or ctx.module):
        if isinstance(node, cst.Return) and node.value is not None:
            function = ctx.function_of(node)
            names = {dotted_name(name) for name in ctx.walk(node.value) if isinstance(name, (cst.Name, cst.Attribute))}
            if function is not None and (within is None or function is within) and names & flags:
                return function.name.value
    return None


def _escaping_probe(ctx: ModuleContext, binding: Binding) -> bool:
    """Whether an amp import nothing here uses only sets a flag that code elsewhere reads, and so
    reports AMP043: ``def is_apex_available(): try: from apex import amp ... return True``, or a
    module-level ``HAS_APEX`` other modules import. Such a flag still has to say whether Apex is
    installed: callers may import Apex under it, and ``True`` there would fail without Apex."""
    owner = ctx.try_around(binding.statement)
    if owner is None:
        return False
    if not all(_catches_import_error(handler) for handler in owner.handlers):
        return False
    if ctx.function_of(owner) is None:
        exported = ctx.options.facts.exported
        flags = _flags_set_in(ctx, owner)
        if not (flags & exported or "*" in exported or _function_returning(ctx, flags) is not None):
            return False
    ctx.report(
        "AMP043",
        binding.alias,
        "`from apex import amp` is only a check that Apex is installed: nothing in this module uses the name, and "
        "the flag it sets is read elsewhere (returned by a function, or imported by other modules), where code may "
        "still import Apex under it; left as it was",
    )
    return True


def _value_use(ctx: ModuleContext, name: cst.Name) -> str:
    """What AMP030 says for one use of the amp module as a value: the use, and the code to write."""
    parent = ctx.parent(name)
    if isinstance(parent, cst.Arg) and isinstance(call := ctx.parent(parent), cst.Call):
        callee = " ".join(ctx.code(call.func).split())
        keyword = f"{parent.keyword.value}=" if parent.keyword is not None else ""
        return (
            f"`{callee}(...)` is given the Apex amp module (`{keyword}{ctx.code(parent.value)}`): give it the GradScaler "
            f"that replaces amp.initialize instead (`{keyword}scaler`), and where it calls `amp.state_dict()`, "
            "`amp.load_state_dict(...)` or `amp.scale_loss(loss, optimizer)`, write `scaler.state_dict()`, "
            "`scaler.load_state_dict(...)` or `scaler.scale(loss)`; then run ampmigrate again"
        )
    statement = " ".join(ctx.code(ctx.statement_of(name)).split())
    if len(statement) > 100:
        statement = statement[:97] + "..."
    function = ctx.function_of(name)
    if isinstance(parent, cst.Return) and parent.value is name and function is not None:
        factory = {entry[0]: entry[1:] for entry in ctx.options.facts.amp_factories}.get(function.name.value)
        condition, callers = factory if factory is not None else ("", "")
        return (
            f"`return {name.value}` hands the Apex amp module"
            + (f" (None where `{condition}` is false)" if condition else " (or None)" if factory else "")
            + f" to the callers of `{function.name.value}`, where ampmigrate does not follow it"
            + (
                f": {callers}; what they call through it stays (AMP026)"
                if callers
                else " (what they call through it stays, AMP026)"
            )
            + ": have each caller make the "
            'GradScaler where it calls `.initialize(...)` (`scaler = torch.amp.GradScaler("cuda", enabled=...)`, '
            "the forward pass under `torch.autocast`) and use it for the rest (`scaler.scale(loss).backward()`, "
            "`scaler.step(optimizer)`, `scaler.update()`, `scaler.state_dict()`), with no amp module returned, then "
            "run ampmigrate again"
        )
    refused = ctx.carriers.refused.get(name)
    if refused is not None:
        return (
            f"`{statement}` stores the Apex amp module for code that scales through the attribute, which "
            f"ampmigrate would make a GradScaler, but {refused}: make the GradScaler by hand (`init_scale=`, "
            "`scaler.update(new_scale=...)` after each step where the scale is static) or pass a dynamic scale, "
            "then run ampmigrate again"
        )
    if any(isinstance(node, cst.AssignTarget) for node in ctx.ancestors(name)):
        return (
            f"`{statement}` binds the name of the Apex amp module to another value: on the paths where it holds "
            "that value, amp is not Apex's; use the GradScaler that replaces amp.initialize under its own name "
            "(`scaler`) and keep `amp` for Apex alone, then run ampmigrate again"
        )
    return (
        f"`{statement}` uses the Apex amp module as a value (stored, passed or compared): store or pass the "
        "GradScaler that replaces amp.initialize instead (or nothing: torch.amp needs no module object), then "
        "run ampmigrate again"
    )


def _quoted_check(ctx: ModuleContext, check: cst.CSTNode) -> str:
    """The code of a presence check on one line: the header of an ``if``/``while``, the
    ``assert``, or the expression (a conditional expression, an ``is None`` comparison)."""
    if isinstance(check, cst.Assert):
        text = f"assert {ctx.code(check.test)}" + (f", {ctx.code(check.msg)}" if check.msg else "")
    elif isinstance(check, (cst.If, cst.While)):
        text = f"{'while' if isinstance(check, cst.While) else 'if'} {ctx.code(check.test)}:"
    else:
        text = ctx.code(check)
    return " ".join(text.split())


def _report_leftovers(
    ctx: ModuleContext,
    model: AmpModel,
    references: dict[cst.ImportAlias, list[cst.Name]],
    unused: tuple[dict[int, str], dict[int, str]],
    rebound: dict[int, str],
) -> None:
    for name in model.value_uses:
        if name not in ctx.consumed:
            found = presence_check(ctx, name)
            if found is not None:
                check = _quoted_check(ctx, found)
                effect = "fails" if isinstance(found, cst.Assert) else "takes its no-Apex branch"
                ctx.report(
                    "AMP030",
                    name,
                    f"`{check}` only checks that Apex is installed: it keeps the Apex import, and where Apex is "
                    f"missing it still {effect}: delete it once nothing here needs Apex",
                )
            else:
                ctx.report("AMP030", name, _value_use(ctx, name))
    state = amp_private_state.state_uses(ctx)
    roots = {id(private.root) for private in state}
    for private in state:
        if private.base not in ctx.consumed:
            ctx.report("AMP031", private.root, amp_private_state.describe(ctx, private))
    for attribute in model.private_uses:
        if id(attribute) not in roots:
            ctx.report("AMP031", attribute, _module_dunder(attribute))
    for attribute in model.other_attributes:
        if attribute.attr.value in CAST_APIS and isinstance(ctx.parent(attribute), cst.Decorator):
            continue  # the amp_cast_functions rule migrated it or said why not
        if id(attribute) not in roots:
            ctx.report("AMP032", attribute, _amp_api(attribute.attr.value))
    for use in model.calls:
        if use.api not in _MIGRATED_APIS and (use.api != "init" or not ctx.options.rule_enabled("amp_init")):
            ctx.report("AMP032", use.call, _amp_api(use.api))
    if ctx.handles.any:
        _report_handle_leftovers(ctx)
    reported: set[int] = set()
    for scope, scope_imports in ctx.imports.items():
        for bound, bindings in scope_imports.items():
            for binding in bindings:
                if binding.kind == "other_apex" and binding.target in amp_private_state.STATE_TARGETS:
                    continue  # each use is reported (AMP031) with the code to write
                if binding.copy is not None:
                    continue  # the project's own copy of Apex runs without Apex (its rule says what stayed)
                if binding.kind == "other_apex" and id(binding.alias) in unused[0]:
                    continue  # nothing uses it: the import goes
                if id(binding.alias) in rebound and all(
                    name in ctx.consumed or is_import_fallback(ctx, name) for name in references.get(binding.alias, [])
                ):
                    continue  # now imports the torch class under the same name
                why = unused[1].get(id(binding.alias)) if binding.kind == "other_apex" else None
                if why is not None and id(binding.alias) not in reported:
                    reported.add(id(binding.alias))
                    ctx.report(
                        "AMP040",
                        binding.alias,
                        f"{binding.target} is not used in this module but its import stays, since {why}: delete "
                        f"it once nothing reaches it that way, else {_replacement(binding.target)}",
                    )
                    continue
                if binding.kind == "other_apex" and id(binding.alias) not in reported:
                    reported.add(id(binding.alias))
                    # `DDP = None` in the except clause of the import goes with it: not a use left
                    uses = [name for name in references.get(binding.alias, []) if not is_import_fallback(ctx, name)]
                    if binding.alias.name in ctx.consumed:
                        continue  # a star import whose names were all migrated
                    if any(name not in ctx.consumed for name in uses) or not uses:
                        # a star import has no alias of its own to point at
                        anchor = (
                            binding.statement if isinstance(binding.statement.names, cst.ImportStar) else binding.alias
                        )
                        kept = _kept_by_their_rule(ctx, [name for name in uses if name not in ctx.consumed])
                        ctx.report(
                            "AMP040",
                            anchor,
                            (
                                f"{binding.target}: {_replacement(binding.target)}"
                                if kept is None
                                else f"{binding.target} stays imported: its uses here are kept on purpose "
                                f"({kept}: see the findings there, which name the code to write); delete "
                                f"`{syntax.code(binding.statement).strip()}` once they are migrated"
                            ),
                        )
                    elif scope is ctx.module and not isinstance(binding.statement.names, cst.ImportStar):
                        _report_exported(ctx, binding, bound)
                elif binding.kind == "apex" and id(binding.alias) not in reported:
                    reported.add(id(binding.alias))
                    if references.get(binding.alias) or ctx.skipped(ctx.statement_of(binding.statement)):
                        _report_apex_package_uses(ctx, binding, references)
                    elif not _bare_probe_of_migrated_code(ctx, binding, references):
                        why = (
                            _probe_kept_because(ctx, binding, references)
                            if ctx.function_of(binding.statement) is None
                            else _returned_flag(ctx, binding)
                        )
                        ctx.report(
                            "AMP043",
                            binding.alias,
                            (
                                None
                                if why is None
                                else f"`import apex` is only a check that Apex is installed: nothing "
                                f"in this module uses the name, and it stays: {why}"
                            ),
                        )


def _kept_by_their_rule(ctx: ModuleContext, uses: list[cst.Name]) -> str | None:
    """The lines where a rule said why it kept each of ``uses`` (AMP042), or None when some
    use has no such word: then the import's own message says what to write (a generic "use
    torch.optim.AdamW" would contradict a rule that kept the optimizer for its wrapper)."""
    kept = {(finding.line, finding.column) for finding in ctx.findings if finding.code == "AMP042"}
    lines = []
    for name in uses:
        line, column = ctx.position(name)
        if (line, column) not in kept:
            return None
        lines.append(line)
    if not lines:
        return None
    shown = sorted(set(lines))
    return f"line{'s' if len(shown) > 1 else ''} {', '.join(str(line) for line in shown)}"


def _report_exported(ctx: ModuleContext, binding: Binding, bound: str) -> None:
    """An Apex name whose uses here were all migrated, kept for the project modules that import
    it from this one (``_plan_imports``): they still get Apex's class, and need Apex."""
    facts = ctx.options.facts
    importers = sorted({shown for name, shown in facts.apex_importers if name == bound})
    if importers:
        who = f"{', '.join(importers)} import{'s' if len(importers) == 1 else ''} `{bound}` from this module"
    elif bound in facts.exported or "*" in facts.exported:
        who = f"other modules of the project import `{bound}` from this one"
    elif bound in module_all(ctx):
        who = f"`__all__` lists `{bound}` (a star import of this module gets it)"
    else:
        return
    ctx.report(
        "AMP040",
        binding.alias,
        f"{binding.target} is no longer used in this module (its uses here were migrated), but its import stays, "
        f"since {who}; code that gets `{bound}` from here still gets Apex's: {_replacement(binding.target)} there, "
        "then run ampmigrate again",
    )


def _report_handle_leftovers(ctx: ModuleContext) -> None:
    """What keeps an old-API handle (``amp_handle = amp.init()``) from being migrated."""
    for node in ctx.handles.leftovers():
        what = ctx.handles.describe(node)
        parent = ctx.parent(node)
        if node in ctx.handles.foreign:
            ctx.report(
                "AMP030",
                node,
                f"{what}: keep the handle where it is used, or pass the GradScaler that replaces it (`scaler`) "
                "there, then run ampmigrate again",
            )
        elif isinstance(parent, cst.Attribute) and parent.value is node:
            ctx.report(
                "AMP032",
                node,
                f"{what}: the handle has no such native counterpart; only `.scale_loss(loss, optimizer)` and "
                "`.wrap_optimizer(optimizer)` are migrated: delete this use, then run ampmigrate again",
            )
        else:
            ctx.report(
                "AMP030",
                node,
                f"{what}: pass the GradScaler that replaces the handle (`scaler`) instead, and use "
                "`scaler.scale(loss).backward()`, `scaler.step(optimizer)`, `scaler.update()` where it scaled a "
                "loss (`scaler.is_enabled()` for a test), then run ampmigrate again",
            )


def _report_apex_package_uses(
    ctx: ModuleContext, binding: Binding, references: dict[cst.ImportAlias, list[cst.Name]]
) -> None:
    for name in references.get(binding.alias, []):
        if name in ctx.consumed:
            continue
        attribute = ctx.parent(name)
        path = "apex"
        while isinstance(attribute, cst.Attribute):
            path = f"{path}.{attribute.attr.value}"
            attribute = ctx.parent(attribute)
        if path.startswith("apex.amp"):
            continue  # reported by the amp rules
        ctx.report("AMP040", name, f"{path}: {_replacement(path)}")


def _drop_presence_asserts(ctx: ModuleContext, model: AmpModel) -> None:
    """``assert amp is not None, "amp not installed!"`` where every other use of Apex amp in the
    module was migrated: it asserts that Apex is there for code that no longer needs it, so it
    goes with the import (Swin-Transformer's ``__main__``). Where Apex is installed it passed; where
    it is not, the migration runs instead of failing. Checks that choose a branch stay (AMP030)."""
    left = [name for name in model.value_uses if name not in ctx.consumed]
    if not left or model.private_uses or model.other_attributes:
        return
    if any(use.base not in ctx.consumed for use in model.calls):
        return
    statements = []
    for name in left:
        check = presence_check(ctx, name)
        statement = ctx.parent(check) if isinstance(check, cst.Assert) else None
        test = syntax.strip_parens(check.test) if isinstance(check, cst.Assert) else None
        only_presence = test is name or (
            isinstance(test, cst.Comparison)
            and test.left is name
            and len(test.comparisons) == 1
            and isinstance(test.comparisons[0].operator, cst.IsNot)
        )
        if not (only_presence and isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1):
            return
        statements.append((name, statement))
    for name, statement in statements:
        ctx.plan.remove.add(statement)
        ctx.consumed.add(name)


def plan(ctx: ModuleContext) -> None:
    model = ctx.amp
    _drop_presence_asserts(ctx, model)
    references = _references(ctx)
    rebound = {
        alias: torch_name
        for rule in (apex_normalization, apex_clip_grad)
        if ctx.options.rule_enabled(rule.RULE)
        for alias, torch_name in rule.rebound_names(ctx).items()
    }
    unused = unused_imports(ctx, references, rebound)
    _report_leftovers(ctx, model, references, unused, rebound)
    _plan_imports(ctx, references, unused[0], rebound)
