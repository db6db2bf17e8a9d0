"""End-to-end: FP16_Optimizer whose learning rate a function nested in the set-up's function warms
up through ``optimizer.param_groups`` (ruinmessi/ASFF's ``set_lr``). Apex's ``param_groups`` was the
wrapped optimizer's list, so the migration leaves the nested function as written; the learning rates
must come out identical and the losses close (the original runs under the Apex shim with a float16
model and float32 masters, the migration natively beside an ``apex`` that raises).
"""

from __future__ import annotations

from typing import Any

import pytest
from shim_runs import REPO, original_and_migrated_runs, write_migration

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

STEPS = 30
# float16 weights with float32 masters (Apex) against autocast over float32 weights: float16
# rounding only; a learning rate the nested function failed to set would fail the lr check
LOSS_REL_TOL = 2e-2


@pytest.fixture(scope="module")
def metrics(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, bool], dict[str, Any]]:
    script = REPO / "fixtures" / "e2e" / "fp16_optimizer_nested_set_lr.in.py"
    folder = tmp_path_factory.mktemp("nested_set_lr")
    migrated = write_migration(script, folder)
    assert "def set_lr(tmp_lr):" in migrated.read_text(encoding="utf-8")
    return original_and_migrated_runs(script, migrated, {"train": ["--steps", str(STEPS), "--half"]}, folder)


def test_nested_set_lr_sets_the_same_rates_and_trains_like_apex(
    metrics: dict[tuple[str, bool], dict[str, Any]],
) -> None:
    original, migrated = metrics[("train", True)], metrics[("train", False)]
    assert original["param_dtype"] == "torch.float16"
    assert migrated["param_dtype"] == "torch.float32"
    assert migrated["lr"] == original["lr"]
    assert original["lr"][0] < original["lr"][-1] == 0.05
    assert migrated["loss"] == pytest.approx(original["loss"], rel=LOSS_REL_TOL)
    assert original["loss"][-1] < 0.5 * original["loss"][0], "the original did not train"
