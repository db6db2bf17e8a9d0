"""End-to-end: two models, two optimizers, ``num_losses=2``, and each of Apex's per-loss scales
logged every step through a comprehension over ``amp._amp_state.loss_scalers``.

The migration iterates over ``[scaler] * 2``: the same keys every step, each the one scale that
serves both losses (AMP004). The original runs under the Apex shim, the migration natively
beside an ``apex`` package that raises on import. Early on one loss overflows at the default
scale: Apex halves that loss's scale only, the GradScaler its one scale, so every migrated
entry logs the lower of Apex's two (what is logged differs, as AMP033 says), and the losses
must follow the original's.
"""

from __future__ import annotations

from typing import Any

import pytest
from shim_runs import REPO, mixed_and_fp32_runs

from migrate.engine import migrate_source

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

SCRIPT = REPO / "fixtures" / "e2e" / "private_scales_two_losses.in.py"
STEPS = 30
MIXED_LOSS_REL_TOL = 1e-2
FP32_LOSS_REL_TOL = 1e-5


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    return mixed_and_fp32_runs(SCRIPT, tmp_path_factory.mktemp("private_scales_two_losses"))


def test_the_migration_keeps_one_entry_per_loss() -> None:
    migrated = migrate_source(SCRIPT.read_text(encoding="utf-8")).source
    assert "_amp_state" not in migrated and "apex" not in migrated
    assert "enumerate([scaler] * 2)" in migrated and "loss_scaler.get_scale()" in migrated


def test_every_entry_logs_the_one_scale(runs: dict[str, dict[str, Any]]) -> None:
    original, migrated = runs["original-mixed"]["loss_scale"], runs["migrated-mixed"]["loss_scale"]
    keys = ["amp/loss_scale_0", "amp/loss_scale_1"]
    assert len(original) == len(migrated) == STEPS
    assert all(list(entry) == keys for entry in original + migrated)
    assert all(entry["amp/loss_scale_0"] == entry["amp/loss_scale_1"] for entry in migrated)
    # the one scale halves when either loss overflows; within these steps (no growth) it is the
    # lower of Apex's two, and the second loss's first overflow parted Apex's scales
    assert [entry["amp/loss_scale_0"] for entry in migrated] == [min(entry.values()) for entry in original]
    assert any(len(set(entry.values())) == 2 for entry in original), "Apex's two scales never parted"


def test_mixed_precision_trains_like_the_original(runs: dict[str, dict[str, Any]]) -> None:
    original, migrated = runs["original-mixed"]["loss"], runs["migrated-mixed"]["loss"]
    assert len(original) == len(migrated) == STEPS
    for before, after in zip(original, migrated):
        assert after == pytest.approx(before, rel=MIXED_LOSS_REL_TOL)


def test_fp32_run_is_unchanged(runs: dict[str, dict[str, Any]]) -> None:
    original, migrated = runs["original-fp32"], runs["migrated-fp32"]
    assert original["loss_scale"] == migrated["loss_scale"] == []
    for before, after in zip(original["loss"], migrated["loss"]):
        assert after == pytest.approx(before, rel=FP32_LOSS_REL_TOL)
