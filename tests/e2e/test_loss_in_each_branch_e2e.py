"""End-to-end: a loss computed in each clause of an accumulate-or-not if/else after one forward
pass (microsoft/Focal-Transformer's train_one_epoch shape), before and after migration.

Apex O1 ran the criterion in float32 wherever it was written; the migration must put autocast
over the loss statements of each clause too. With autocast over the forward pass only, the
criterion ran on float16 logits outside autocast and returned a float16 loss. The original runs
under the Apex shim, the migration natively with an ``apex`` package that raises on import first
on ``sys.path``.
"""

from __future__ import annotations

from typing import Any

import pytest
from shim_runs import REPO, shim_metrics, write_migration

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

SCRIPT = REPO / "fixtures" / "e2e" / "loss_in_each_branch.in.py"
# Apex's O1 casting lists (the shim) against autocast's.
MIXED_REL_TOL = 2e-2
FP32_REL_TOL = 1e-5


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    folder = tmp_path_factory.mktemp("loss_in_each_branch")
    migrated = write_migration(SCRIPT, folder)
    results = {}
    for level in ("O1", "O0"):
        for accumulation in ("1", "2"):
            args = ["--opt-level", level, "--accumulation-steps", accumulation]
            key = f"{level}-{accumulation}"
            results[f"original-{key}"] = shim_metrics(SCRIPT, args, folder / f"original-{key}.json", original=True)
            results[f"migrated-{key}"] = shim_metrics(migrated, args, folder / f"migrated-{key}.json", original=False)
    return results


@pytest.mark.parametrize("accumulation", ["1", "2"])
@pytest.mark.parametrize("level, tolerance", [("O1", MIXED_REL_TOL), ("O0", FP32_REL_TOL)])
def test_loss_of_each_clause_runs_as_under_apex(
    runs: dict[str, dict[str, Any]], level: str, tolerance: float, accumulation: str
) -> None:
    original, migrated = runs[f"original-{level}-{accumulation}"], runs[f"migrated-{level}-{accumulation}"]
    # the forward pass in float16 under O1, and the loss in float32 either way, as Apex computed it
    assert set(migrated["output_dtype"]) == set(original["output_dtype"])
    assert set(original["output_dtype"]) == {"torch.float16" if level == "O1" else "torch.float32"}
    assert set(migrated["loss_dtype"]) == set(original["loss_dtype"]) == {"torch.float32"}
    assert len(migrated["loss"]) == len(original["loss"]) > 0
    assert migrated["loss"] == pytest.approx(original["loss"], rel=tolerance, abs=1e-4)
