"""End-to-end: a script that logs each of Apex's loss scales every step by iterating over its
private state (``{...: s._loss_scale for i, s in enumerate(amp._amp_state.loss_scalers)}`` and
``for s in amp._amp_state.loss_scalers: s.loss_scale()``), with one loss.

The original runs under the Apex shim, the migration natively beside an ``apex`` package that
raises on import. The migration iterates over ``[scaler]`` and reads ``get_scale()``: the logged
dictionaries (keys and values) and the per-scaler list must be the original's, value for value,
while the scale starts at 2**20 and halves on the overflowing steps, and the losses must follow.
"""

from __future__ import annotations

from typing import Any

import pytest
from shim_runs import REPO, mixed_and_fp32_runs

from migrate.engine import migrate_source

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

SCRIPT = REPO / "fixtures" / "e2e" / "private_scales_iterated.in.py"
MIXED_LOSS_REL_TOL = 1e-2
FP32_LOSS_REL_TOL = 1e-5


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    return mixed_and_fp32_runs(SCRIPT, tmp_path_factory.mktemp("private_scales_iterated"))


def test_the_migration_iterates_over_the_grad_scaler() -> None:
    migrated = migrate_source(SCRIPT.read_text(encoding="utf-8")).source
    assert "_amp_state" not in migrated and "apex" not in migrated
    assert migrated.count("enumerate([scaler])") == 1 and migrated.count("in [scaler]:") == 1
    assert "loss_scaler.get_scale()" in migrated and "scaler_state.get_scale()" in migrated


def test_logged_scales_are_apex_s(runs: dict[str, dict[str, Any]]) -> None:
    original, migrated = runs["original-mixed"], runs["migrated-mixed"]
    assert len(original["loss_scale"]) == len(migrated["loss_scale"]) == 40
    assert migrated["loss_scale"] == original["loss_scale"]
    assert migrated["each_scale"] == original["each_scale"]
    assert [list(entry) for entry in original["loss_scale"]] == [["amp/loss_scale_0"]] * 40
    scales = [entry["amp/loss_scale_0"] for entry in original["loss_scale"]]
    assert scales == original["each_scale"]
    assert scales[0] > 2.0**16 and len(set(scales)) > 5, f"the scale barely moved: {scales}"


def test_mixed_precision_trains_like_the_original(runs: dict[str, dict[str, Any]]) -> None:
    original, migrated = runs["original-mixed"], runs["migrated-mixed"]
    assert set(original["output_dtype"]) == set(migrated["output_dtype"]) == {"torch.float16"}
    assert migrated["loss"] == pytest.approx(original["loss"], rel=MIXED_LOSS_REL_TOL)


def test_fp32_run_is_unchanged(runs: dict[str, dict[str, Any]]) -> None:
    original, migrated = runs["original-fp32"], runs["migrated-fp32"]
    assert original["loss_scale"] == migrated["loss_scale"] == []
    assert migrated["loss"] == pytest.approx(original["loss"], rel=FP32_LOSS_REL_TOL)
