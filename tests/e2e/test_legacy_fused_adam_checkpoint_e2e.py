"""End-to-end: checkpoints of an ``apex.optimizers.FP16_Optimizer`` (the pre-2019 FusedAdam) script
and of its migration (``LegacyFusedAdam`` + GradScaler).

Apex kept one flat float32 master and flat Adam moments per parameter group; the migration's loader
splits them over the group's parameters. The original trains STEPS steps under the Apex shim with
overflows planted at OVERFLOWS (the dynamic scale halves twice, then doubles 1000 iterations after
the last overflow, past SAVE_AT) and saves at SAVE_AT; the migration does the same natively. Then
(a) the migration resumes from the Apex checkpoint, next to the original resuming from it: it must
hold exactly Apex's weights, moments, step counts and hyperparameters, double the scale at the same
step (Apex's iteration counters carried over) and train alike; (b) the migration resumes from its own
checkpoint and must go on bit for bit like the migration that never stopped.
"""

from __future__ import annotations

from typing import Any

import pytest
from shim_runs import REPO, original_and_migrated_runs, shim_metrics, write_migration

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

SCRIPT = REPO / "fixtures" / "e2e" / "legacy_fused_adam_checkpoint.in.py"
STEPS = 1010
SAVE_AT = 600
OVERFLOWS = "3,5"
GROWTH_STEP = 1005  # 1000 iterations after the last overflow
# the 410 resumed losses (about 1) measured within 9e-4 of Apex's (fp16 model against autocast)
LOSS_ABS_TOL = 1e-3
LOSS_REL_TOL = 2e-3


@pytest.fixture(scope="module")
def metrics(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, bool], dict[str, Any]]:
    folder = tmp_path_factory.mktemp("legacy_fused_adam_checkpoint")
    migrated = write_migration(SCRIPT, folder)
    common = ["--steps", str(STEPS), "--overflow_steps", OVERFLOWS]
    results = original_and_migrated_runs(SCRIPT, migrated, {"first": [*common, "--save_at", str(SAVE_AT)]}, folder)
    apex_checkpoint = folder / "first-original.json.pt"
    own_checkpoint = folder / "first-migrated.json.pt"
    resumed = original_and_migrated_runs(
        SCRIPT, migrated, {"apex": [*common, "--resume_file", str(apex_checkpoint)]}, folder
    )
    own = shim_metrics(migrated, [*common, "--resume_file", str(own_checkpoint)], folder / "own.json", original=False)
    return {**results, **resumed, ("own", False): own}


def test_apex_checkpoint_loads_what_apex_loads(metrics: dict[tuple[str, bool], dict[str, Any]]) -> None:
    original, migrated = metrics[("apex", True)], metrics[("apex", False)]
    assert original["loaded"] == metrics[("first", True)]["saved"]
    # per group: the flat master, both flat moments, the step count, lr / weight decay / max_grad_norm
    assert len(migrated["loaded"]) == len(original["loaded"]) == 2 * 5
    assert migrated["loaded"] == original["loaded"]
    assert migrated["loaded_scale"] == original["loaded_scale"] == 2.0**14


def test_apex_checkpoint_resumes_like_apex(metrics: dict[tuple[str, bool], dict[str, Any]]) -> None:
    original, migrated = metrics[("apex", True)], metrics[("apex", False)]
    assert original["loss_scale"] == metrics[("first", True)]["loss_scale"][SAVE_AT:]
    assert migrated["loss_scale"] == original["loss_scale"]
    scales = original["loss_scale"]
    assert scales[GROWTH_STEP - SAVE_AT - 1] * 2 == scales[GROWTH_STEP - SAVE_AT], "no growth to carry the count over"
    for step, (ours, theirs) in enumerate(zip(migrated["loss"], original["loss"]), start=SAVE_AT):
        allowed = LOSS_ABS_TOL + LOSS_REL_TOL * abs(theirs)
        assert abs(ours - theirs) <= allowed, f"step {step}: migrated loss {ours:.5f}, Apex {theirs:.5f}"


def test_own_checkpoint_resumes_bit_for_bit(metrics: dict[tuple[str, bool], dict[str, Any]]) -> None:
    first, own = metrics[("first", False)], metrics[("own", False)]
    assert own["loaded"] == first["saved"]
    assert own["loss"] == first["loss"][SAVE_AT:]
    assert own["loss_scale"] == first["loss_scale"][SAVE_AT:]
