"""End-to-end: ``amp.initialize(..., loss_scale=args.loss_scale)`` with ``--loss-scale`` a string
that defaults to None (the NVIDIA ImageNet example's argument), the loop in its own function.

The migration computes the scale to hold once (``static_loss_scale``), passes it to ``train``
with the GradScaler, and holds it at each ``scaler.update(new_scale=static_loss_scale)``. The
original runs under the Apex shim, the migration natively beside an ``apex`` that raises on
import. For each command line the logged loss-scale trajectories must be the same, value for
value: the default scales dynamically (2**16 overflows these float16 gradients, so both halve
on the same steps), ``--loss-scale 128.0`` and ``--loss-scale 1.0`` never move.
"""

from __future__ import annotations

from typing import Any

import pytest
from shim_runs import REPO, shim_metrics, write_migration

from migrate.engine import migrate_source

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

SCRIPT = REPO / "fixtures" / "e2e" / "runtime_loss_scale.in.py"
STEPS = 30
# Apex's O1 casting lists (the shim) against autocast's
MIXED_LOSS_REL_TOL = 1e-2
COMMAND_LINES = {
    "default": ["--fp16"],
    "static-128": ["--fp16", "--loss-scale", "128.0"],
    "static-1": ["--fp16", "--loss-scale", "1.0"],
    "fp32": [],
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    folder = tmp_path_factory.mktemp("runtime_loss_scale")
    migrated = write_migration(SCRIPT, folder)
    results = {}
    for key, args in COMMAND_LINES.items():
        args = [*args, "--steps", str(STEPS)]
        results[f"original-{key}"] = shim_metrics(SCRIPT, args, folder / f"original-{key}.json", original=True)
        results[f"migrated-{key}"] = shim_metrics(migrated, args, folder / f"migrated-{key}.json", original=False)
    return results


def test_the_held_scale_is_passed_with_the_scaler() -> None:
    migrated = migrate_source(SCRIPT.read_text(encoding="utf-8"))
    assert "apex" not in migrated.source and "AMP005" not in {finding.code for finding in migrated.findings}
    assert "scaler.update(new_scale=static_loss_scale)" in migrated.source
    assert "scaler=scaler, static_loss_scale=static_loss_scale)" in migrated.source


def test_default_scales_dynamically_like_apex(runs: dict[str, dict[str, Any]]) -> None:
    original, migrated = runs["original-default"]["loss_scale"], runs["migrated-default"]["loss_scale"]
    assert len(original) == len(migrated) == STEPS
    assert migrated == original
    assert original[0] < 2.0**16 and len(set(original)) > 1, f"the dynamic scale never backed off: {original}"


@pytest.mark.parametrize(("key", "scale"), [("static-128", 128.0), ("static-1", 1.0)])
def test_a_number_is_held_like_apex(runs: dict[str, dict[str, Any]], key: str, scale: float) -> None:
    original, migrated = runs[f"original-{key}"]["loss_scale"], runs[f"migrated-{key}"]["loss_scale"]
    assert original == migrated == [scale] * STEPS


@pytest.mark.parametrize("key", ["default", "static-128", "static-1"])
def test_mixed_precision_trains_like_the_original(runs: dict[str, dict[str, Any]], key: str) -> None:
    original, migrated = runs[f"original-{key}"]["loss"], runs[f"migrated-{key}"]["loss"]
    assert migrated == pytest.approx(original, rel=MIXED_LOSS_REL_TOL)
    assert sum(migrated[-5:]) < 0.5 * sum(migrated[:5]), f"the migrated script did not train: {migrated}"


def test_fp32_run_is_unchanged(runs: dict[str, dict[str, Any]]) -> None:
    original, migrated = runs["original-fp32"], runs["migrated-fp32"]
    assert original["loss_scale"] == migrated["loss_scale"] == []
    assert migrated["loss"] == pytest.approx(original["loss"], rel=1e-5)
