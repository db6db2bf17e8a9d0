"""apex_syncbn: ``apex.parallel.convert_syncbn_model`` and ``apex.parallel.SyncBatchNorm``.

What it rewrites
    ``convert_syncbn_model(model, process_group=pg)`` becomes
    ``torch.nn.SyncBatchNorm.convert_sync_batchnorm(model, process_group=pg)`` and
    ``apex.parallel.SyncBatchNorm(...)`` becomes ``torch.nn.SyncBatchNorm(...)``: same
    arguments, same parameter and buffer names.

    ``isinstance``/``issubclass`` checks on the Apex class name torch's where every
    SyncBatchNorm the module builds (``convert_syncbn_model`` builds them too) becomes
    torch's (and the module names no torch SyncBatchNorm the check would start to match);
    where such a check stays Apex's, the module's conversions stay with it, since torch's
    layers would silently stop matching it; the class stored in a variable becomes
    torch's where every call through it is seen and passes only torch's arguments
    (apex_optimizers' rule for values). In project mode it may also be handed to other
    code (``norm_layer=BatchNorm2d``, ``init_weight(model, BatchNorm2d)``) and be the class of
    an ``isinstance`` check, where no Python file of the project (a vendored copy of Apex aside)
    spells ``channel_last`` or ``fuse_relu``: that code can then only build layers from
    arguments torch's class takes the same way. In a tuple of classes that also holds torch's
    ``_BatchNorm`` (both Apex implementations derive from it) and is only ever a class test's
    argument, the Apex class is dropped: no test changes.

Before::

    from apex.parallel import convert_syncbn_model

    model = convert_syncbn_model(model)

After::

    import torch

    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)

Not rewritten (reported instead, AMP042, with the code to write)
    ``channel_last=True`` (Apex's channels-last layout: permute around torch's layer) and
    ``fuse_relu=True`` (a ReLU after the layer). The class stored in an attribute
    (``cfg.MODEL.BNFUNC = apex.parallel.SyncBatchNorm``, called in other modules), and a check
    in a module that builds none (the layers it tests come from elsewhere).
    ``apex.parallel.DistributedDataParallel`` is the apex_parallel rule's.

Safety
    Exact when distributed. Apex skipped InstanceNorm when converting; torch's converter
    only touches BatchNorm layers too.

References
    NVIDIA/apex@e13873d: apex/parallel/__init__.py, apex/parallel/sync_batchnorm.py;
    ../shared/apex-semantics.md section 5 (apex.parallel).
"""

from __future__ import annotations

from migrate.rules._apex_classes import Replacement, plan_replacements
from migrate.rules._context import ModuleContext

RULE = "apex_syncbn"

# Apex's channel_last layers took (N, H, W, C) tensors; torch's normalise dimension 1.
_CHANNEL_LAST = (
    "torch.nn.SyncBatchNorm normalises dimension 1: drop channel_last=True and call it on "
    "`x.permute(0, 3, 1, 2)`, permuting the result back with `.permute(0, 2, 3, 1)`"
)

REPLACEMENTS = (
    Replacement(
        apex_name="convert_syncbn_model",
        modules=("apex.parallel",),
        parameters=("module", "process_group", "channel_last"),
        target="torch.nn.SyncBatchNorm.convert_sync_batchnorm",
        positional=2,
        required={"channel_last": False},
        advice={"channel_last": _CHANNEL_LAST},
        builds="SyncBatchNorm",
    ),
    Replacement(
        apex_name="SyncBatchNorm",
        modules=("apex.parallel",),
        parameters=(
            "num_features",
            "eps",
            "momentum",
            "affine",
            "track_running_stats",
            "process_group",
            "channel_last",
            "fuse_relu",
        ),
        target="torch.nn.SyncBatchNorm",
        positional=6,
        required={"channel_last": False, "fuse_relu": False},
        advice={
            "channel_last": _CHANNEL_LAST,
            "fuse_relu": "drop fuse_relu=True and apply the ReLU after the layer: `torch.relu(bn(x))` "
            "(Apex's z input: `torch.relu(bn(x) + z)`)",
        },
        passable_unless=("channel_last", "fuse_relu"),
        # both implementations (apex/parallel/sync_batchnorm.py, optimized_sync_batchnorm.py)
        bases=("torch.nn.modules.batchnorm._BatchNorm",),
    ),
)


def plan(ctx: ModuleContext) -> None:
    plan_replacements(ctx, REPLACEMENTS)
