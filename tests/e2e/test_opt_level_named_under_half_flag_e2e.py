"""End-to-end: amp.initialize reading an opt level assigned just before it inside `if HALF:`
(yuto3o/efficientdet.pytorch's train_apex.py), before and after migration.

The name holds the literal 'O1', so the migration creates the GradScaler above the `if` with
``enabled=bool(HALF)``, runs the forward pass under autocast, unscales before the clip by value
and steps through the scaler. The original runs under the Apex shim, the migration natively
beside an ``apex`` that raises on import; with and without ``--half``.
"""

from __future__ import annotations

from typing import Any

import pytest
from shim_runs import REPO, shim_metrics, write_migration

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

SCRIPT = REPO / "fixtures" / "e2e" / "opt_level_named_under_half_flag.in.py"
# Apex's O1 casting lists (the shim) against autocast's.
MIXED_REL_TOL = 2e-2
FP32_REL_TOL = 1e-5


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    folder = tmp_path_factory.mktemp("opt_level_named_under_half_flag")
    migrated = write_migration(SCRIPT, folder)
    results = {}
    for half in (True, False):
        args = ["--half"] if half else []
        key = "half" if half else "fp32"
        results[f"original-{key}"] = shim_metrics(SCRIPT, args, folder / f"original-{key}.json", original=True)
        results[f"migrated-{key}"] = shim_metrics(migrated, args, folder / f"migrated-{key}.json", original=False)
    return results


@pytest.mark.parametrize(
    "key, tolerance, dtype", [("half", MIXED_REL_TOL, "float16"), ("fp32", FP32_REL_TOL, "float32")]
)
def test_trains_like_the_original(runs: dict[str, dict[str, Any]], key: str, tolerance: float, dtype: str) -> None:
    original, migrated = runs[f"original-{key}"], runs[f"migrated-{key}"]
    assert set(migrated["output_dtype"]) == set(original["output_dtype"]) == {f"torch.{dtype}"}
    assert len(migrated["loss"]) == len(original["loss"]) == 18
    assert migrated["loss"] == pytest.approx(original["loss"], rel=tolerance, abs=1e-4)
    # the clip read unscaled gradients, as Apex gave them after scale_loss
    assert migrated["grad_max"] == pytest.approx(original["grad_max"], rel=tolerance, abs=1e-4)
    assert max(migrated["grad_max"]) <= 2.0
