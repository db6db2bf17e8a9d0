"""End-to-end: FP16_Optimizer set up under `if args.cuda and args.fp16:` over a model halved
earlier under `if args.fp16:` alone (kimiyoung/transformer-xl's train.py). It was left as it was
(the halving's guard differs from the set-up's); now the `.half()` goes with the set-up, since
where `args.fp16` holds without `args.cuda` Apex's run stopped at the first `optimizer.backward`
(a plain torch optimizer has none). The original runs under the Apex shim (float16 model,
float32 masters), the migration natively beside an ``apex`` that raises: the losses and clipped
norms match up to float16 rounding, with gradient accumulation over chunks under a static scale.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from shim_runs import REPO, original_and_migrated_runs, run_shim, write_migration

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

SCRIPT = REPO / "fixtures" / "e2e" / "fp16_optimizer_wider_half_guard.in.py"
STEPS = 30
RUNS = {
    "dynamic": ["--steps", str(STEPS), "--cuda", "--fp16", "--dynamic_loss_scale"],
    # accumulation over chunks under a held scale (Apex updated a dynamic scale once per backward, so with
    # chunks its scale grew that many times sooner: a known difference, left out here)
    "static": ["--steps", str(STEPS), "--cuda", "--fp16", "--static_loss_scale", "128", "--chunks", "2"],
    "fp32": ["--steps", str(STEPS), "--cuda"],
}
# float16 weights with float32 masters (Apex) against autocast over float32 weights
LOSS_REL_TOL = 2e-2


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("wider_half_guard")


@pytest.fixture(scope="module")
def migrated(folder: Path) -> Path:
    return write_migration(SCRIPT, folder)


@pytest.fixture(scope="module")
def metrics(folder: Path, migrated: Path) -> dict[tuple[str, bool], dict[str, Any]]:
    return original_and_migrated_runs(SCRIPT, migrated, RUNS, folder)


def test_the_half_and_the_optimizer_go_together(migrated: Path) -> None:
    source = migrated.read_text(encoding="utf-8")
    assert ".half()\n" not in source and "model.half()" not in source
    assert "FP16_Optimizer(" not in source and "from apex" not in source


@pytest.mark.parametrize("run", ["dynamic", "static"])
def test_fp16_trains_like_apex(metrics: dict[tuple[str, bool], dict[str, Any]], run: str) -> None:
    original, migrated = metrics[(run, True)], metrics[(run, False)]
    assert original["param_dtype"] == "torch.float16"
    assert migrated["param_dtype"] == "torch.float32"
    assert migrated["loss"] == pytest.approx(original["loss"], rel=LOSS_REL_TOL)
    assert migrated["grad_norm"] == pytest.approx(original["grad_norm"], rel=LOSS_REL_TOL)
    assert original["loss"][-1] < 0.5 * original["loss"][0], "the original did not train"


def test_without_fp16_both_train_in_float32_alike(metrics: dict[tuple[str, bool], dict[str, Any]]) -> None:
    original, migrated = metrics[("fp32", True)], metrics[("fp32", False)]
    assert migrated["param_dtype"] == original["param_dtype"] == "torch.float32"
    assert migrated["loss"] == pytest.approx(original["loss"], rel=1e-5)


def test_the_halved_path_without_the_set_up_never_trained_under_apex(folder: Path) -> None:
    out = folder / "fp16-without-cuda-original.json"
    done = run_shim(SCRIPT, ["--steps", "3", "--fp16"], out, original=True)
    assert done.returncode != 0
    assert "AttributeError" in done.stderr and "backward" in done.stderr
