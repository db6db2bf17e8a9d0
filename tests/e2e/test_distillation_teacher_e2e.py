"""End-to-end: a distillation step whose old model went into amp.initialize's list as
``model_old.to(device)`` (fcdl94/MiB). Apex O1 ran that model in float16; the migration's autocast
region must start at its call, so its outputs come out float16 there too (before, the region began
at the student's call and the old model ran in float32). The original runs under the Apex shim, the
migration natively beside an ``apex`` that raises on import.
"""

from __future__ import annotations

from typing import Any

import pytest
from shim_runs import REPO, original_and_migrated_runs, write_migration

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

SCRIPT = REPO / "fixtures" / "e2e" / "distillation_teacher_in_initialize_list.in.py"
STEPS = 20
# float16 rounding in both runs, in different places (patched functions against autocast's op
# lists): measured under 1e-3 relative per step
MIXED_LOSS_REL_TOL = 1e-2
FP32_LOSS_REL_TOL = 1e-5


@pytest.fixture(scope="module")
def metrics(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, bool], dict[str, Any]]:
    folder = tmp_path_factory.mktemp("distillation_teacher")
    migrated = write_migration(SCRIPT, folder)
    runs = {level: ["--opt_level", level, "--steps", str(STEPS)] for level in ("O1", "O0")}
    return original_and_migrated_runs(SCRIPT, migrated, runs, folder)


def test_teacher_is_float16_as_under_apex(metrics: dict[tuple[str, bool], dict[str, Any]]) -> None:
    original, migrated = metrics[("O1", True)], metrics[("O1", False)]
    assert set(original["old_dtype"]) == {"torch.float16"}
    assert migrated["old_dtype"] == original["old_dtype"]
    assert migrated["loss"] == pytest.approx(original["loss"], rel=MIXED_LOSS_REL_TOL)
    assert original["loss"][-1] < original["loss"][0], "the original did not train"


def test_o0_runs_are_float32_and_identical(metrics: dict[tuple[str, bool], dict[str, Any]]) -> None:
    original, migrated = metrics[("O0", True)], metrics[("O0", False)]
    assert set(original["old_dtype"]) == set(migrated["old_dtype"]) == {"torch.float32"}
    assert migrated["loss"] == pytest.approx(original["loss"], rel=FP32_LOSS_REL_TOL)
