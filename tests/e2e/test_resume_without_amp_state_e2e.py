"""End-to-end: a trainer class that calls amp.initialize in ``__init__`` and again in its
checkpoint restore, there only when the checkpoint holds amp state (allennlp's trainer).

``fixtures/e2e/resume_without_amp_state.in.py``: the restore's scaler used to be created above
its ``if``, enabled by that ``if``'s test, so resuming an fp16 run from a checkpoint an fp32 run
saved replaced the working scaler with a disabled one and trained in float32. It is now made
where Apex's call ran. The original runs under the Apex shim, the migration natively beside an
``apex`` that raises on import; both resume from the same fp32 checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from shim_runs import REPO, shim_metrics, write_migration

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

SCRIPT = REPO / "fixtures" / "e2e" / "resume_without_amp_state.in.py"
STEPS = 15
# Apex's O1 casting lists (the shim) against autocast's
MIXED_LOSS_REL_TOL = 1e-2


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    folder: Path = tmp_path_factory.mktemp("resume_without_amp_state")
    migrated = write_migration(SCRIPT, folder)
    checkpoint = folder / "fp32.pt"
    base = ["--steps", str(STEPS)]
    shim_metrics(SCRIPT, [*base, "--seed", "1", "--save", str(checkpoint)], folder / "fp32.json", original=True)
    resume = [*base, "--seed", "2", "--opt_level", "O1", "--resume", str(checkpoint)]
    return {
        "original": shim_metrics(SCRIPT, resume, folder / "original.json", original=True),
        "migrated": shim_metrics(migrated, resume, folder / "migrated.json", original=False),
    }


def test_resumed_fp16_run_stays_in_mixed_precision(runs: dict[str, dict[str, Any]]) -> None:
    assert set(runs["original"]["output_dtype"]) == {"torch.float16"}
    assert set(runs["migrated"]["output_dtype"]) == {"torch.float16"}


def test_resumed_run_trains_like_the_original(runs: dict[str, dict[str, Any]]) -> None:
    original, migrated = runs["original"]["loss"], runs["migrated"]["loss"]
    assert len(migrated) == len(original) == STEPS
    assert migrated == pytest.approx(original, rel=MIXED_LOSS_REL_TOL)
