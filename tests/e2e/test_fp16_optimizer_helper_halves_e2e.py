"""End-to-end, multi-file: FP16_Optimizer over a model that an imported helper halves
(``load_model(model, checkpoint, args)`` with ``if args.fp16: model.half()`` in helpers.py, as in
microsoft/DialoGPT and PKD-for-BERT). It was left as it was (no ``.half()`` in sight); the project
run now reads the helper, leaves it as it is (inference shares it) and writes ``model.float()``
after the call under the set-up's test; ``set_lr(optimizer, ...)`` (helpers.py), which only touches
``optimizer.param_groups``, takes the wrapped optimizer. The original runs under the Apex shim (float16 model,
float32 masters), the migration natively beside an ``apex`` that raises: losses and clipped norms
match up to float16 rounding under a dynamic and a static scale, and the float32 runs match.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from shim_runs import REPO, poison, shim_metrics

from migrate.config import Config
from migrate.runner import Status, run

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

PROJECT = REPO / "fixtures" / "e2e_helper_halves"
STEPS = 30
RUNS = {
    "dynamic": ["--steps", str(STEPS), "--fp16"],
    "static": ["--steps", str(STEPS), "--fp16", "--loss_scale", "128"],
    "fp32": ["--steps", str(STEPS)],
}
LOSS_REL_TOL = 2e-2


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("helper_halves")
    original, migrated = base / "original", base / "migrated"
    for tree in (original, migrated):
        shutil.copytree(PROJECT, tree, ignore=shutil.ignore_patterns("__pycache__"))
    results = run([migrated], Config(write=True, jobs=1))
    statuses = {Path(r.path).name: r.status for r in results}
    assert statuses == {"main.py": Status.CHANGED, "helpers.py": Status.UNCHANGED}, statuses
    assert not any(result.needs_review for result in results)
    poison(migrated)
    return original, migrated


@pytest.fixture(scope="module")
def metrics(trees: tuple[Path, Path]) -> dict[tuple[str, bool], dict[str, Any]]:
    original, migrated = trees
    found = {}
    for name, args in RUNS.items():
        for is_original, tree in ((True, original), (False, migrated)):
            out = tree / f"{name}.json"
            found[(name, is_original)] = shim_metrics(tree / "main.py", args, out, original=is_original)
    return found


def test_the_helper_stays_and_the_script_needs_no_apex(trees: tuple[Path, Path]) -> None:
    original, migrated = trees
    assert (migrated / "helpers.py").read_text() == (original / "helpers.py").read_text()
    source = (migrated / "main.py").read_text()
    assert "from apex" not in source and "FP16_Optimizer(" not in source
    assert "model.float()" in source


@pytest.mark.parametrize("run_name", ["dynamic", "static"])
def test_fp16_trains_like_apex(metrics: dict[tuple[str, bool], dict[str, Any]], run_name: str) -> None:
    original, migrated = metrics[(run_name, True)], metrics[(run_name, False)]
    assert original["param_dtype"] == "torch.float16"
    assert migrated["param_dtype"] == "torch.float32"
    assert migrated["loss"] == pytest.approx(original["loss"], rel=LOSS_REL_TOL)
    # an overflowing step: Apex's clip_master_grads returned -1, torch's clip returns inf (both skip the step)
    skipped = [i for i, norm in enumerate(original["grad_norm"]) if norm == -1.0]
    assert all(migrated["grad_norm"][i] == float("inf") for i in skipped)
    kept = [i for i in range(len(original["grad_norm"])) if i not in skipped]
    assert [migrated["grad_norm"][i] for i in kept] == pytest.approx(
        [original["grad_norm"][i] for i in kept], rel=LOSS_REL_TOL
    )
    assert original["loss"][-1] < 0.5 * original["loss"][0], "the original did not train"


def test_without_fp16_both_train_in_float32_alike(metrics: dict[tuple[str, bool], dict[str, Any]]) -> None:
    original, migrated = metrics[("fp32", True)], metrics[("fp32", False)]
    assert migrated["param_dtype"] == original["param_dtype"] == "torch.float32"
    assert migrated["loss"] == pytest.approx(original["loss"], rel=1e-5)
