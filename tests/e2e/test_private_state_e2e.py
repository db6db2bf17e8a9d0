"""End-to-end: a script that sets the loss scale right after ``amp.initialize`` through Apex's
private state (``amp._amp_state.loss_scalers[0]._loss_scale = 2**20``) and logs it every step
(``amp._amp_state.loss_scalers[0].loss_scale()``).

The original runs under the Apex shim (``python -m migrate.shim``), the migration natively with
an ``apex`` package that raises on import placed first on ``sys.path``. The scale starts at
2**20, far above what the float16 gradients of this regression allow, so both runs overflow
and halve it step after step: the logged trajectories must be the same, value for value (the
GradScaler started where Apex did, and skipped and halved on the same steps), and the losses
must follow each other.
"""

from __future__ import annotations

from typing import Any

import pytest
from shim_runs import REPO, mixed_and_fp32_runs

from migrate.engine import migrate_source

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

SCRIPT = REPO / "fixtures" / "e2e" / "private_loss_scale.in.py"
DEFAULT_INIT_SCALE = 2.0**16
# Apex's O1 casting lists (the shim) against autocast's: the per-step losses measured within 1e-3.
MIXED_LOSS_REL_TOL = 1e-2
FP32_LOSS_REL_TOL = 1e-5


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    return mixed_and_fp32_runs(SCRIPT, tmp_path_factory.mktemp("private_state"))


def test_the_migration_uses_no_private_state() -> None:
    migrated = migrate_source(SCRIPT.read_text(encoding="utf-8"))
    assert "_amp_state" not in migrated.source and "apex" not in migrated.source
    assert "init_scale=1048576.0" in migrated.source and "scaler.get_scale()" in migrated.source


def test_loss_scale_trajectory_is_apex_s(runs: dict[str, dict[str, Any]]) -> None:
    original, migrated = runs["original-mixed"]["loss_scale"], runs["migrated-mixed"]["loss_scale"]
    assert len(original) == len(migrated) == 40
    assert migrated == original
    # the scale set after initialize took effect: it starts above the default and overflows down
    assert original[0] > DEFAULT_INIT_SCALE
    assert len(set(original)) > 5, f"the scale barely moved: {original}"


def test_mixed_precision_trains_like_the_original(runs: dict[str, dict[str, Any]]) -> None:
    original, migrated = runs["original-mixed"], runs["migrated-mixed"]
    assert set(original["output_dtype"]) == set(migrated["output_dtype"]) == {"torch.float16"}
    assert migrated["loss"] == pytest.approx(original["loss"], rel=MIXED_LOSS_REL_TOL)
    losses = migrated["loss"]
    assert sum(losses[-5:]) < 0.5 * sum(losses[:5]), f"the migrated script did not train: {losses}"


def test_fp32_run_is_unchanged(runs: dict[str, dict[str, Any]]) -> None:
    original, migrated = runs["original-fp32"], runs["migrated-fp32"]
    assert original["loss_scale"] == migrated["loss_scale"] == []
    assert set(migrated["output_dtype"]) == {"torch.float32"}
    assert migrated["loss"] == pytest.approx(original["loss"], rel=FP32_LOSS_REL_TOL)
