"""End-to-end: amp.initialize once per objective, in a loop under ``if args.fp16:``.

``fixtures/e2e/per_objective_initialize.in.py`` (modelled on sentence-transformers' ``fit``)
steps every optimizer after the ``if``, on the fp16 and the fp32 path alike. The scaler used to
be created inside that loop, under the ``if``, with ``enabled=`` that forgot ``args.fp16``: the
fp32 path crashed with a NameError on ``scaler.step`` and its forward pass would have run under
autocast. It is now made once above the ``if``, enabled only when fp16 is on. The original runs
under the Apex shim, the migration natively beside an ``apex`` that raises on import.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from shim_runs import REPO, original_and_migrated_runs, write_migration

from migrate.engine import migrate_source

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

SCRIPT = REPO / "fixtures" / "e2e" / "per_objective_initialize.in.py"
STEPS = 30
# Apex's O1 casting lists (the shim) against autocast's
MIXED_LOSS_REL_TOL = 1e-2
RUNS = {"fp16": ["--fp16", "--steps", str(STEPS)], "fp32": ["--steps", str(STEPS)]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, bool], dict[str, Any]]:
    folder: Path = tmp_path_factory.mktemp("per_objective_initialize")
    migrated = write_migration(SCRIPT, folder)
    return original_and_migrated_runs(SCRIPT, migrated, RUNS, folder)


def test_one_scaler_above_the_fp16_guard() -> None:
    migrated = migrate_source(SCRIPT.read_text(encoding="utf-8")).source
    assert "apex" not in migrated.split("\n", 1)[1]
    assert "amp.scale_loss" not in migrated
    scaler = (
        '    scaler = torch.amp.GradScaler("cuda", enabled=args.fp16 and args.opt_level != "O0")\n    if args.fp16:\n'
    )
    assert scaler in migrated
    assert migrated.count("GradScaler(") == 1


def test_fp32_path_is_unchanged(runs: dict[tuple[str, bool], dict[str, Any]]) -> None:
    original, migrated = runs[("fp32", True)], runs[("fp32", False)]
    assert set(migrated["output_dtype"]) == {"torch.float32"}
    assert migrated["loss"] == pytest.approx(original["loss"], rel=1e-6)


def test_fp16_path_trains_like_the_original(runs: dict[tuple[str, bool], dict[str, Any]]) -> None:
    original, migrated = runs[("fp16", True)], runs[("fp16", False)]
    assert set(original["output_dtype"]) == set(migrated["output_dtype"]) == {"torch.float16"}
    assert len(migrated["loss"]) == len(original["loss"]) == 2 * STEPS
    assert migrated["loss"] == pytest.approx(original["loss"], rel=MIXED_LOSS_REL_TOL)
    # both objectives learn
    for objective in (0, 1):
        losses = migrated["loss"][objective::2]
        assert sum(losses[-3:]) < 0.5 * sum(losses[:3]), f"objective {objective} did not train: {losses}"
