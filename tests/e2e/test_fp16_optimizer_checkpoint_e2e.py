"""End-to-end: checkpoints of an ``apex.fp16_utils.FP16_Optimizer`` script and of its migration.

The original trains under the Apex shim and saves ``{"model": ..., "optimizer":
optimizer.state_dict(), ...}`` after SAVE_AT of STEPS steps (the dynamic scale starts at 2**24
with a window of 10, so it skips, halves and grows); the migration does the same natively. Then
(a) the migration resumes from the Apex checkpoint, next to the original resuming from it, and
(b) the migration resumes from its own checkpoint. (a) must load exactly what Apex loads (the fp32
master weights into the float32 model, the momentum buffers, the loss scale) and go on with the
same scale history (the count of clean steps carried over) and the same losses but for fp16
rounding; (b) must go on bit for bit like the migration that never stopped. Without ``--fp16`` the
migration saves a plain optimizer state dict as the original did, and resumes from the original's.
"""

from __future__ import annotations

from typing import Any

import pytest
from shim_runs import REPO, original_and_migrated_runs, shim_metrics, write_migration

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

SCRIPT = REPO / "fixtures" / "e2e" / "fp16_optimizer_checkpoint.in.py"
STEPS = 40
SAVE_AT = 28
WINDOW = 10  # the scale_window the script passes
# the same bounds as test_fp16_optimizer_e2e (an fp16 model with fp32 masters against autocast)
FP32_REL_TOL = 1e-4  # float32 runs do the same arithmetic (test_fp16_optimizer_e2e)
MIXED_LOSS_ABS_TOL = 5e-3
MIXED_LOSS_REL_TOL = 2e-2


@pytest.fixture(scope="module")
def metrics(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, bool], dict[str, Any]]:
    """(run name, original?) -> metrics: "first" trains STEPS steps saving at SAVE_AT, "apex" resumes
    from the original's checkpoint, "own" (migration only) from the migration's."""
    folder = tmp_path_factory.mktemp("fp16_optimizer_checkpoint")
    migrated = write_migration(SCRIPT, folder)
    common = ["--fp16", "--steps", str(STEPS)]
    fp32 = ["--steps", str(STEPS)]
    first = {"first": [*common, "--save_at", str(SAVE_AT)], "fp32": [*fp32, "--save_at", str(SAVE_AT)]}
    results = original_and_migrated_runs(SCRIPT, migrated, first, folder)
    apex_checkpoint = folder / "first-original.json.pt"
    own_checkpoint = folder / "first-migrated.json.pt"
    assert apex_checkpoint.exists() and own_checkpoint.exists()
    resumed = original_and_migrated_runs(
        SCRIPT, migrated, {"apex": [*common, "--resume", str(apex_checkpoint)]}, folder
    )
    own = shim_metrics(migrated, [*common, "--resume", str(own_checkpoint)], folder / "own.json", original=False)
    # the float32 path saves a plain optimizer state dict, as the original's did: it reads the original's
    fp32_resumed = shim_metrics(
        migrated,
        [*fp32, "--resume", str(folder / "fp32-original.json.pt")],
        folder / "fp32-resumed.json",
        original=False,
    )
    return {**results, **resumed, ("own", False): own, ("fp32_resumed", False): fp32_resumed}


def test_apex_checkpoint_loads_what_apex_loads(metrics: dict[tuple[str, bool], dict[str, Any]]) -> None:
    original, migrated = metrics[("apex", True)], metrics[("apex", False)]
    # the float32 masters (not the model's float16 weights) and the momentum buffers, exactly
    assert migrated["loaded"] == original["loaded"] == metrics[("first", True)]["saved"]
    assert migrated["loaded_scale"] == original["loaded_scale"] == metrics[("first", True)]["loss_scale"][SAVE_AT - 1]


def test_apex_checkpoint_resumes_like_apex(metrics: dict[tuple[str, bool], dict[str, Any]]) -> None:
    original, migrated = metrics[("apex", True)], metrics[("apex", False)]
    assert len(migrated["loss"]) == len(original["loss"]) == STEPS - SAVE_AT
    # the Apex resume goes on as the Apex run that never stopped
    assert original["loss_scale"] == metrics[("first", True)]["loss_scale"][SAVE_AT:]
    assert migrated["loss_scale"] == original["loss_scale"]
    scales = [original["loaded_scale"], *original["loss_scale"]]
    growth = [i for i, (before, after) in enumerate(zip(scales, scales[1:])) if after > before]
    # a growth within the first window after the resume: only the carried-over clean-step count explains it
    assert growth and growth[0] < WINDOW - 1, f"the resumed run does not test the clean-step count: {scales}"
    for step, (ours, theirs) in enumerate(zip(migrated["loss"], original["loss"])):
        allowed = MIXED_LOSS_ABS_TOL + MIXED_LOSS_REL_TOL * abs(theirs)
        assert abs(ours - theirs) <= allowed, f"step {step}: migrated loss {ours:.5f}, Apex {theirs:.5f}"


def test_own_checkpoint_resumes_bit_for_bit(metrics: dict[tuple[str, bool], dict[str, Any]]) -> None:
    first, own = metrics[("first", False)], metrics[("own", False)]
    assert own["loaded"] == first["saved"]
    assert own["loaded_scale"] == first["loss_scale"][SAVE_AT - 1]
    assert own["loss"] == first["loss"][SAVE_AT:]
    assert own["loss_scale"] == first["loss_scale"][SAVE_AT:]


def test_fp32_path_reads_the_original_checkpoint(metrics: dict[tuple[str, bool], dict[str, Any]]) -> None:
    original, resumed = metrics[("fp32", True)], metrics[("fp32_resumed", False)]
    assert resumed["loaded"] == original["saved"]
    assert resumed["loss"] == pytest.approx(original["loss"][SAVE_AT:], rel=FP32_REL_TOL)
