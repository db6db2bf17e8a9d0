"""End-to-end: a distiller whose ``optimize(loss)`` only divides the loss its ``step()`` built
(Hugging Face's DistilBERT Distiller). Apex O1 ran the student in float16; the migration's autocast
region must be in ``step()``, around the forward pass (before, it went around the division in
``optimize`` and the student ran in float32). The original runs under the Apex shim, the migration
natively beside an ``apex`` that raises on import.
"""

from __future__ import annotations

from typing import Any

import pytest
from shim_runs import REPO, original_and_migrated_runs, write_migration

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

SCRIPT = REPO / "fixtures" / "e2e" / "distiller_optimize_loss_parameter.in.py"
STEPS = 20
# float16 rounding in both runs, in different places (patched functions against autocast's op
# lists)
MIXED_LOSS_REL_TOL = 1e-2
FP32_LOSS_REL_TOL = 1e-5


@pytest.fixture(scope="module")
def metrics(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, bool], dict[str, Any]]:
    folder = tmp_path_factory.mktemp("distiller_loss_parameter")
    migrated = write_migration(SCRIPT, folder)
    runs = {level: ["--opt_level", level, "--steps", str(STEPS), "--accumulation", "2"] for level in ("O1", "O0")}
    return original_and_migrated_runs(SCRIPT, migrated, runs, folder)


def test_student_is_float16_as_under_apex(metrics: dict[tuple[str, bool], dict[str, Any]]) -> None:
    original, migrated = metrics[("O1", True)], metrics[("O1", False)]
    assert set(original["student_dtype"]) == {"torch.float16"}
    assert migrated["student_dtype"] == original["student_dtype"]
    assert migrated["loss"] == pytest.approx(original["loss"], rel=MIXED_LOSS_REL_TOL)
    assert original["loss"][-1] < original["loss"][0], "the original did not train"


def test_o0_runs_are_float32_and_identical(metrics: dict[tuple[str, bool], dict[str, Any]]) -> None:
    original, migrated = metrics[("O0", True)], metrics[("O0", False)]
    assert set(original["student_dtype"]) == set(migrated["student_dtype"]) == {"torch.float32"}
    assert migrated["loss"] == pytest.approx(original["loss"], rel=FP32_LOSS_REL_TOL)
