"""End-to-end: a GAN trainer that reaches the GradScaler through the model object it holds
(lucidrains/stylegan2-pytorch's shape), before and after migration.

``StyleGAN2.__init__`` calls amp.initialize (num_losses=3); the ``Trainer`` keeps that object in
``self.GAN``, binds the module-level ``loss_backwards(fp16, loss, optimizer, loss_id)`` with
``functools.partial`` and steps ``self.GAN.D_opt`` / ``self.GAN.G_opt``. The migration keeps the
GradScaler on the model object, passes ``scaler=self.GAN.scaler`` in the partial, steps through
it, and, where ``--cl-reg`` steps the discriminator twice in one iteration, updates the scaler
after the first step (GradScaler allows one step per optimizer between updates). The original
runs under the Apex shim, the migration natively beside an ``apex`` that raises on import.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from shim_runs import REPO, shim_metrics, write_migration

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

SCRIPT = REPO / "fixtures" / "e2e" / "gan_trainer_holding_the_model.in.py"
# as in test_e2e.py: the mean of the last five losses, mixed against the Apex original
FINAL_LOSS_ABS_TOL = 0.02
FINAL_LOSS_REL_TOL = 0.10
FP32_REL_TOL = 1e-5
STEPS = 20


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    folder = tmp_path_factory.mktemp("gan_trainer_holding_the_model")
    migrated = write_migration(SCRIPT, folder)
    results = {}
    for mixed in (True, False):
        for cl_reg in (True, False):
            args = ["--steps", str(STEPS), *(["--fp16"] if mixed else []), *(["--cl-reg"] if cl_reg else [])]
            key = f"{'fp16' if mixed else 'fp32'}-{'cl' if cl_reg else 'plain'}"
            for which, script in (("original", SCRIPT), ("migrated", migrated)):
                args_here = [*args, "--checkpoint", str(folder / f"{which}-{key}.pt")]
                results[f"{which}-{key}"] = shim_metrics(
                    script, args_here, folder / f"{which}-{key}.json", original=which == "original"
                )
    return results


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


@pytest.mark.parametrize("cl_reg", ["cl", "plain"])
def test_fp32_switch_trains_as_the_original(runs: dict[str, dict[str, Any]], cl_reg: str) -> None:
    original, migrated = runs[f"original-fp32-{cl_reg}"], runs[f"migrated-fp32-{cl_reg}"]
    assert set(migrated["output_dtype"]) == set(original["output_dtype"]) == {"torch.float32"}
    assert set(migrated["cl_dtype"]) == set(original["cl_dtype"]) <= {"torch.float32"}
    for key in ("d_loss", "g_loss", "cl_loss", "resumed_d_loss"):
        assert migrated[key] == pytest.approx(original[key], rel=FP32_REL_TOL, abs=1e-7), key
    assert len(migrated["d_loss"]) == STEPS
    assert len(migrated["cl_loss"]) == (STEPS if cl_reg == "cl" else 0)


@pytest.mark.parametrize("cl_reg", ["cl", "plain"])
def test_trains_like_the_original_in_mixed_precision(runs: dict[str, dict[str, Any]], cl_reg: str) -> None:
    """One GradScaler serves the three losses Apex scaled each with its own (AMP004): the first
    steps may differ by which loss overflowed, the last ones must agree as in the other e2e GANs."""
    original, migrated = runs[f"original-fp16-{cl_reg}"], runs[f"migrated-fp16-{cl_reg}"]
    assert set(migrated["output_dtype"]) == set(original["output_dtype"]) == {"torch.float16"}
    # the learner's calls made for their effect feed its loss: float16 under Apex O1, and under the
    # autocast region that starts at the first of them
    assert migrated["cl_dtype"] == original["cl_dtype"] == (["torch.float16"] * STEPS if cl_reg == "cl" else [])
    for key in ("d_loss", "g_loss", "cl_loss", "resumed_d_loss"):
        assert len(migrated[key]) == len(original[key])
        assert all(math.isfinite(value) for value in migrated[key]), key
        if not migrated[key]:
            continue
        final_migrated, final_original = mean(migrated[key][-5:]), mean(original[key][-5:])
        allowed = FINAL_LOSS_ABS_TOL + FINAL_LOSS_REL_TOL * abs(final_original)
        assert abs(final_migrated - final_original) <= allowed, (key, final_migrated, final_original)


@pytest.mark.parametrize("cl_reg, updates_per_step", [("cl", 2), ("plain", 1)])
def test_scaler_updates_after_each_step_of_the_discriminator(
    runs: dict[str, dict[str, Any]], cl_reg: str, updates_per_step: int
) -> None:
    """With --cl-reg the discriminator steps twice per iteration: an update after its first step
    (GradScaler refuses a second step of one optimizer before an update), one at the end."""
    state = runs[f"migrated-fp16-{cl_reg}"]["amp_state"]
    original = runs[f"original-fp16-{cl_reg}"]["amp_state"]
    updates = STEPS * updates_per_step
    # the checkpoint written through self.GAN holds the scaler's state
    assert math.log2(state["scale"]).is_integer() and state["scale"] <= 2.0**16
    if state["scale"] == 2.0**16:
        assert state["_growth_tracker"] == updates
    else:
        # one overflow for 2**16 / scale: the tracker restarted after the last
        assert state["_growth_tracker"] <= updates - 1
    assert state["scale"] >= min(scaler["loss_scale"] for scaler in original.values()) / 2
    assert runs[f"migrated-fp32-{cl_reg}"]["amp_state"] is None
