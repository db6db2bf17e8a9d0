"""End-to-end: ``apex.fp16_utils.FP16_Optimizer.step(closure)`` and its migration,
``optimizer.step(scaled_closure(closure, optimizer, scaler))``.

Apex ran the closure through a wrapper: each call's backward unscaled the gradients into the fp32
masters and updated the scale, and while the gradients overflowed (dynamic scale) the closure was
called again at the lowered scale before the wrapped optimizer used its loss. The dynamic runs start
at 2**24 with a window of 5, so the first steps retry the closure several times and the scale grows
again later; LBFGS (no tolerances: always 4 iterations) calls the closure several times per step.
The number of closure calls of every step and the scale after it must match Apex's exactly, the
losses up to fp16 rounding. Dynamic LBFGS keeps overflowing near the edge of float16 (its scale
hovers about 2**19 with large gradients), where an fp16 model and autocast round differently: it is
compared over its first LBFGS_STEPS steps (measured identical over 15). LBFGS amplifies rounding:
after 10 steps the float32 run is as far from Apex's fp16 one as the migration is (measured), so the
static LBFGS run's losses are compared over those steps too, its closure calls and scale throughout.
"""

from __future__ import annotations

from typing import Any

import pytest
from shim_runs import REPO, original_and_migrated_runs, write_migration

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

SCRIPT = REPO / "fixtures" / "e2e" / "fp16_optimizer_closure.in.py"
STEPS = 30
RUNS = {
    "dynamic": ("--fp16",),
    "static": ("--fp16", "--loss_scale", "128"),
    "lbfgs": ("--fp16", "--lbfgs"),
    "lbfgs_static": ("--fp16", "--lbfgs", "--loss_scale", "1024"),
    "fp32": (),
}
LBFGS_STEPS = 10
MIXED_LOSS_ABS_TOL = 5e-3
MIXED_LOSS_REL_TOL = 2e-2


@pytest.fixture(scope="module")
def metrics(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, bool], dict[str, Any]]:
    folder = tmp_path_factory.mktemp("fp16_optimizer_closure")
    migrated = write_migration(SCRIPT, folder)
    runs = {name: [*args, "--steps", str(STEPS)] for name, args in RUNS.items()}
    return original_and_migrated_runs(SCRIPT, migrated, runs, folder)


def _compared(metrics: dict[tuple[str, bool], dict[str, Any]], name: str, what: str) -> tuple[list[Any], list[Any]]:
    """The original's and the migration's ``what`` over the steps compared."""
    original, migrated = metrics[(name, True)][what], metrics[(name, False)][what]
    assert len(migrated) == len(original) == STEPS
    if name == "lbfgs" or (name == "lbfgs_static" and what == "loss"):
        return original[:LBFGS_STEPS], migrated[:LBFGS_STEPS]
    return original, migrated


@pytest.mark.parametrize("name", list(RUNS))
def test_closure_calls_and_scales_match_apex(metrics: dict[tuple[str, bool], dict[str, Any]], name: str) -> None:
    original, migrated = _compared(metrics, name, "calls")
    assert [len(calls) for calls in migrated] == [len(calls) for calls in original]
    original, migrated = _compared(metrics, name, "loss_scale")
    assert migrated == original


def test_dynamic_runs_retry_and_grow(metrics: dict[tuple[str, bool], dict[str, Any]]) -> None:
    for name in ("dynamic", "lbfgs"):
        original = metrics[(name, True)]
        scales = original["loss_scale"]
        assert any(after > before for before, after in zip(scales, scales[1:])), f"{name}: no growth: {scales}"
    # SGD calls the closure once; the extra calls of the first steps are the retries after overflows
    assert len(metrics[("dynamic", True)]["calls"][0]) > 1
    assert all(len(calls) == 1 for calls in metrics[("static", True)]["calls"])
    assert max(len(calls) for calls in metrics[("lbfgs", True)]["calls"][1:LBFGS_STEPS]) > 4
    assert all(len(calls) == 4 for calls in metrics[("lbfgs_static", True)]["calls"])


@pytest.mark.parametrize("name", list(RUNS))
def test_losses_match_apex(metrics: dict[tuple[str, bool], dict[str, Any]], name: str) -> None:
    original, migrated = _compared(metrics, name, "loss")
    for step, (ours, theirs) in enumerate(zip(migrated, original)):
        allowed = MIXED_LOSS_ABS_TOL + MIXED_LOSS_REL_TOL * abs(theirs)
        assert abs(ours - theirs) <= allowed, f"{name} step {step}: migrated loss {ours:.5f}, Apex {theirs:.5f}"
    assert migrated[-1] < 0.5 * migrated[0], "the migrated script did not train"
