"""End-to-end: FP16_Optimizer and FP16_Module from the project's own copy of apex.fp16_utils.

``fixtures/project/local_fp16_copy/in`` is a project that vendored fp16_utils as ``fp16/``
(a half model wrapped in ``FP16_Module``, ``FP16_Optimizer`` with a static loss scale of 128,
``clip_master_grads``), as 2018-2019 projects did. The tree is migrated as a whole; the original
runs as it is (the copy needs no Apex; the shim only maps CUDA to the CPU), the migration natively
beside an ``apex`` package that raises on import. The copy stays in the migrated tree, unchanged.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path
from typing import Any

import pytest
from shim_runs import REPO, poison, shim_env, shim_metrics

from migrate.config import Config
from migrate.runner import Status, run

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

PROJECT = REPO / "fixtures" / "project" / "local_fp16_copy" / "in"
STEPS = 30
RUNS = {"static": ("--fp16",), "fp32": ()}
# dynamic.py: the copy's pre-2019 DynamicLossScaler from 2**32 (16 overflowing steps down to 2**16), then
# doubling after 10 clean steps (scale_window) and halving again on the next overflow
DYNAMIC_STEPS = 60
# as in test_fp16_optimizer_e2e.py: a half model with float32 masters against autocast over float32 weights
MIXED_LOSS_ABS_TOL = 5e-3
MIXED_LOSS_REL_TOL = 2e-2
MIXED_NORM_REL_TOL = 5e-2
FP32_REL_TOL = 1e-4


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[Any]]:
    base = tmp_path_factory.mktemp("local_fp16_copy")
    original, migrated = base / "original", base / "migrated"
    for tree in (original, migrated):
        shutil.copytree(PROJECT, tree, ignore=shutil.ignore_patterns("__pycache__"))
    results = run([migrated], Config(write=True, jobs=1))
    return original, migrated, results


@pytest.fixture(scope="module")
def metrics(
    trees: tuple[Path, Path, list[Any]], tmp_path_factory: pytest.TempPathFactory
) -> dict[tuple[str, bool], Any]:
    original, migrated, _ = trees
    blocked = tmp_path_factory.mktemp("no-apex")
    poison(blocked)
    native_env = shim_env()
    native_env["PYTHONPATH"] = f"{blocked}:{native_env['PYTHONPATH']}"
    found = {}
    for name, args in RUNS.items():
        for is_original, tree in ((True, original), (False, migrated)):
            out = tree / f"metrics-{name}.json"
            env = None if is_original else native_env
            found[(name, is_original)] = shim_metrics(
                tree / "main.py", [*args, "--steps", str(STEPS)], out, original=is_original, env=env
            )
    for is_original, tree in ((True, original), (False, migrated)):
        env = None if is_original else native_env
        out = tree / "metrics-dynamic.json"
        found[("dynamic", is_original)] = shim_metrics(
            tree / "dynamic.py", ["--steps", str(DYNAMIC_STEPS)], out, original=is_original, env=env
        )
    return found


def test_only_the_training_script_changes(trees: tuple[Path, Path, list[Any]]) -> None:
    original, migrated, results = trees
    changed = {Path(r.path).relative_to(migrated).as_posix() for r in results if r.status is Status.CHANGED}
    assert changed == {"main.py", "dynamic.py"}
    for copy in sorted((original / "fp16").glob("*.py")):
        assert (migrated / "fp16" / copy.name).read_text() == copy.read_text(), "the local copy is user code"
    tree = ast.parse((migrated / "main.py").read_text())
    names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for alias in node.names}
    assert not names & {"FP16_Optimizer", "FP16_Module"}


def test_fp32_runs_train_identically(metrics: dict[tuple[str, bool], Any]) -> None:
    original, migrated = metrics[("fp32", True)], metrics[("fp32", False)]
    assert migrated["loss"] == pytest.approx(original["loss"], rel=FP32_REL_TOL)
    assert migrated["grad_norm"] == pytest.approx(original["grad_norm"], rel=FP32_REL_TOL)


def test_static_scale_run_trains_like_the_copy(metrics: dict[tuple[str, bool], Any]) -> None:
    original, migrated = metrics[("static", True)], metrics[("static", False)]
    assert original["loss_scale"] == migrated["loss_scale"] == [128.0] * STEPS
    for step, (mine, theirs) in enumerate(zip(migrated["loss"], original["loss"], strict=True)):
        assert abs(mine - theirs) <= MIXED_LOSS_ABS_TOL + MIXED_LOSS_REL_TOL * abs(theirs), (step, mine, theirs)
    # the clip sees unscaled gradients in both (a scaled norm would be 128 times larger)
    assert migrated["grad_norm"][0] == pytest.approx(original["grad_norm"][0], rel=MIXED_NORM_REL_TOL)
    assert original["loss"][-1] < 0.5 * original["loss"][0], "the original did not train"


def test_pre2019_dynamic_scale_follows_the_copy(metrics: dict[tuple[str, bool], Any]) -> None:
    """The copy's pre-2019 schedule, step for step: GradScaler from the copy's 2**32 with
    growth_interval=scale_window, halving on the same overflows."""
    original, migrated = metrics[("dynamic", True)], metrics[("dynamic", False)]
    scales = original["loss_scale"]
    assert scales[0] == 2.0**31 and min(scales) < 2.0**17, "the run did not overflow down"
    assert any(later > earlier for earlier, later in zip(scales, scales[1:])), "the scale never grew"
    assert migrated["loss_scale"] == scales
    for step, (mine, theirs) in enumerate(zip(migrated["loss"], original["loss"], strict=True)):
        assert abs(mine - theirs) <= MIXED_LOSS_ABS_TOL + MIXED_LOSS_REL_TOL * abs(theirs), (step, mine, theirs)
    assert original["loss"][-1] < 0.5 * original["loss"][0], "the original did not train"
