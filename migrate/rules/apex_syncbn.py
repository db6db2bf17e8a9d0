"""apex_syncbn: ``apex.parallel.convert_syncbn_model`` and ``apex.parallel.SyncBatchNorm``.

What it rewrites
    ``convert_syncbn_model(model, process_group=pg)`` becomes
    ``torch.nn.SyncBatchNorm.convert_sync_batchnorm(model, process_group=pg)`` and
    ``apex.parallel.SyncBatchNorm(...)`` becomes ``torch.nn.SyncBatchNorm(...)``: same
    arguments, same parameter and buffer names.

Before::

    from apex.parallel import convert_syncbn_model

    model = convert_syncbn_model(model)

After::

    import torch

    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)

Not rewritten (reported instead, AMP042)
    ``channel_last=True`` and ``fuse_relu=True`` (no torch equivalent).
    ``apex.parallel.DistributedDataParallel`` needs the device ids Apex never asked for
    and is reported (AMP040).

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

REPLACEMENTS = (
    Replacement(
        apex_name="convert_syncbn_model",
        modules=("apex.parallel",),
        parameters=("module", "process_group", "channel_last"),
        target="torch.nn.SyncBatchNorm.convert_sync_batchnorm",
        positional=2,
        required={"channel_last": False},
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
    ),
)


def plan(ctx: ModuleContext) -> None:
    plan_replacements(ctx, REPLACEMENTS)
