"""End-to-end: FP16_Optimizer whose scaling is picked by a flag (``dynamic_loss_scale=
args.dynamic_loss_scale``, kimiyoung/transformer-xl's set-up). It was left as it was; now one
GradScaler starts at the dynamic start or the static scale by the same flag and is held at the
static scale after each update where the flag is off. The original runs under the Apex shim
(float16 model, float32 masters), the migration natively beside an ``apex`` that raises; the
loss scale each step, dynamic (start 2**16, doubling after 10 clean steps) or held at 128, is
Apex's, and so are the losses and clipped norms up to float16 rounding.
"""

from __future__ import annotations

from typing import Any

import pytest
from shim_runs import REPO, original_and_migrated_runs, write_migration

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

SCRIPT = REPO / "fixtures" / "e2e" / "fp16_optimizer_runtime_dynamic.in.py"
STEPS = 30
RUNS = {
    "dynamic": ["--steps", str(STEPS), "--fp16", "--dynamic-loss-scale"],
    "static": ["--steps", str(STEPS), "--fp16", "--static-loss-scale", "128"],
    "fp32": ["--steps", str(STEPS)],
}
# float16 weights with float32 masters (Apex) against autocast over float32 weights
LOSS_REL_TOL = 2e-2


@pytest.fixture(scope="module")
def metrics(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, bool], dict[str, Any]]:
    folder = tmp_path_factory.mktemp("runtime_dynamic")
    migrated = write_migration(SCRIPT, folder)
    return original_and_migrated_runs(SCRIPT, migrated, RUNS, folder)


@pytest.mark.parametrize("run", ["dynamic", "static"])
def test_the_flag_picks_apexs_scale_and_training(metrics: dict[tuple[str, bool], dict[str, Any]], run: str) -> None:
    original, migrated = metrics[(run, True)], metrics[(run, False)]
    assert original["param_dtype"] == "torch.float16"
    assert migrated["param_dtype"] == "torch.float32"
    assert migrated["scale"] == original["scale"]
    if run == "dynamic":
        assert original["scale"][0] == 2.0**16 and original["scale"][-1] == 2.0**19  # doubled thrice
    else:
        assert set(original["scale"]) == {128.0}
    assert migrated["loss"] == pytest.approx(original["loss"], rel=LOSS_REL_TOL)
    assert migrated["grad_norm"] == pytest.approx(original["grad_norm"], rel=LOSS_REL_TOL)
    assert original["loss"][-1] < 0.5 * original["loss"][0], "the original did not train"


def test_without_fp16_both_train_in_float32_alike(metrics: dict[tuple[str, bool], dict[str, Any]]) -> None:
    original, migrated = metrics[("fp32", True)], metrics[("fp32", False)]
    assert migrated["param_dtype"] == original["param_dtype"] == "torch.float32"
    assert migrated["loss"] == pytest.approx(original["loss"], rel=1e-5)
