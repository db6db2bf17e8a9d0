"""End-to-end: the scaled loss of ``with amp.scale_loss(loss, opt) as scaled:`` read after the
block, and ``optimizer.step(print_flag=True)`` on a custom optimizer, before and after migration.

Apex left ``scaled`` bound to ``loss.float() * loss_scale`` after the block; the migration binds
it to ``scaler.scale(loss)``, the same value while the scales agree (no overflow here), instead of
leaving a name that no longer exists. GradScaler.step passes the keyword on to the optimizer's
step, which sees unscaled gradients as it did under Apex. The original runs under the Apex shim,
the migration natively with an ``apex`` package that raises on import first on ``sys.path``.
"""

from __future__ import annotations

from typing import Any

import pytest
from shim_runs import REPO, shim_metrics, write_migration

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

SCRIPT = REPO / "fixtures" / "e2e" / "scaled_loss_after_block.in.py"
# Apex's O1 casting lists (the shim) against autocast's.
MIXED_REL_TOL = 2e-2
FP32_REL_TOL = 1e-5


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    folder = tmp_path_factory.mktemp("scaled_loss_after_block")
    migrated = write_migration(SCRIPT, folder)
    results = {}
    for level in ("O1", "O0"):
        args = ["--opt-level", level]
        results[f"original-{level}"] = shim_metrics(SCRIPT, args, folder / f"original-{level}.json", original=True)
        results[f"migrated-{level}"] = shim_metrics(migrated, args, folder / f"migrated-{level}.json", original=False)
    return results


@pytest.mark.parametrize("level, tolerance", [("O1", MIXED_REL_TOL), ("O0", FP32_REL_TOL)])
def test_scaled_loss_and_custom_step_match_apex(runs: dict[str, dict[str, Any]], level: str, tolerance: float) -> None:
    original, migrated = runs[f"original-{level}"], runs[f"migrated-{level}"]
    assert len(migrated["scaled_loss"]) == len(original["scaled_loss"]) == 30
    assert migrated["loss"] == pytest.approx(original["loss"], rel=tolerance)
    assert migrated["scaled_loss"] == pytest.approx(original["scaled_loss"], rel=tolerance)
    assert migrated["grad_norm"] == pytest.approx(original["grad_norm"], rel=tolerance)
    # the logged value is the scaled one: 2**16 times the loss under O1, the loss itself under O0
    ratio = migrated["scaled_loss"][0] / migrated["loss"][0]
    assert ratio == pytest.approx(2.0**16 if level == "O1" else 1.0, rel=1e-3)
