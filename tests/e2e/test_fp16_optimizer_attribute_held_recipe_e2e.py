"""End-to-end: the code ampmigrate's findings name for an FP16_Optimizer kept in an attribute trains
as Apex did.

uclanlp/visualbert's ModelWrapper keeps the pre-2019 apex.optimizers pair on ``self.optimizer`` and
uses it from other methods; the rule migrates an optimizer held in a local name only, so it leaves
the class as it was, and each construction's finding names the code to write: its GradScaler (with
the held static scale or the dynamic growth interval and floor of 1), the ``.half()`` that goes and
what each use of ``self.optimizer`` becomes. ``fp16_optimizer_attribute_held.native.py`` is that code;
this test checks that the findings name it verbatim and that it trains like the original under the
Apex shim (dynamic, overflowing and static scales, the evaluation forward included).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from shim_runs import REPO, shim_command, shim_env

from migrate.engine import migrate_source
from migrate.options import Options

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

SCRIPT = REPO / "fixtures" / "e2e" / "fp16_optimizer_attribute_held.in.py"
NATIVE = REPO / "fixtures" / "e2e" / "fp16_optimizer_attribute_held.native.py"
STEPS = 30
RUNS = {
    "dynamic": ("--fp16",),
    "overflowing": ("--fp16", "--loss_weight", "4000"),
    "static": ("--fp16", "--loss_scale", "128"),
}
# the bounds of test_legacy_fused_adam_e2e (an fp16 model with flat fp32 masters against autocast
# over float32 weights, the same LegacyFusedAdam update)
LOSS_REL_TOL = {"dynamic": 1e-3, "overflowing": 5e-3, "static": 1e-3}
LOSS_ABS_TOL = 1e-3
# the evaluation forward: Apex's float16 model against autocast over the float32 one
EVAL_REL_TOL = 5e-3


@pytest.fixture(scope="module")
def metrics(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, bool], dict[str, Any]]:
    folder: Path = tmp_path_factory.mktemp("fp16_optimizer_attribute_held")
    results: dict[tuple[str, bool], dict[str, Any]] = {}
    for name, args in RUNS.items():
        running = []
        for original in (True, False):
            out = folder / f"{name}-{'original' if original else 'native'}.json"
            command = shim_command(
                SCRIPT if original else NATIVE, [*args, "--steps", str(STEPS)], out, original=original
            )
            process = subprocess.Popen(
                command, cwd=folder, env=shim_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
            )
            running.append((original, out, process))
        for original, out, process in running:
            _, stderr = process.communicate(timeout=180)
            assert process.returncode == 0, f"{name} {'original' if original else 'native'} failed:\n{stderr[-4000:]}"
            results[(name, original)] = json.loads(out.read_text(encoding="utf-8"))
    return results


def test_the_rule_leaves_it_and_its_findings_name_the_native_code() -> None:
    result = migrate_source(SCRIPT.read_text(encoding="utf-8"), Options())
    assert not result.changed
    native = NATIVE.read_text(encoding="utf-8")
    messages = [f.message for f in result.findings if "kept in the attribute `self.optimizer`" in f.message]
    assert len(messages) == 2
    dynamic, static = messages
    for message, scaler in (
        (dynamic, 'self.scaler = torch.amp.GradScaler("cuda", growth_interval=1000, enabled=args.fp16)'),
        (static, 'self.scaler = torch.amp.GradScaler("cuda", init_scale=float(args.loss_scale), enabled=args.fp16)'),
    ):
        assert f"`{scaler}`" in message and scaler in native
        assert "`model.half()` at line 37 goes" in message
        assert "`self.optimizer.backward(loss)` becomes `self.scaler.scale(loss).backward()`" in message
        assert "`self.optimizer.cur_scale` becomes `self.scaler.get_scale()`" in message
        assert "`self.scaler.step(self.optimizer)`" in message
    assert "then `if self.scaler.get_scale() < 1.0: self.scaler.update(new_scale=1.0)`" in dynamic
    assert "then `self.scaler.update(new_scale=float(args.loss_scale))`" in static
    for line in ("self.scaler.scale(loss).backward()", "self.scaler.step(self.optimizer)", "model.half()"):
        assert (line in native) == (line != "model.half()")


@pytest.mark.parametrize("name", list(RUNS))
def test_the_named_code_trains_as_apex(metrics: dict[tuple[str, bool], dict[str, Any]], name: str) -> None:
    original, native = metrics[(name, True)], metrics[(name, False)]
    assert len(original["loss"]) == len(native["loss"]) == STEPS
    for step, (theirs, ours) in enumerate(zip(original["loss"], native["loss"])):
        assert abs(ours - theirs) <= LOSS_ABS_TOL + LOSS_REL_TOL[name] * abs(theirs), f"step {step}: {ours} vs {theirs}"
    assert native["loss_scale"] == original["loss_scale"]
    for theirs, ours in zip(original["eval_loss"], native["eval_loss"]):
        assert ours == pytest.approx(theirs, rel=EVAL_REL_TOL, abs=LOSS_ABS_TOL)


def test_the_overflowing_run_skips_and_lowers_the_scale(metrics: dict[tuple[str, bool], dict[str, Any]]) -> None:
    # the first steps overflow at 2**16: both halve the scale and skip them, step for step
    scales = metrics[("overflowing", True)]["loss_scale"]
    assert scales[:3] == [2.0**15, 2.0**14, 2.0**13]
    assert metrics[("static", True)]["loss_scale"] == [128.0] * STEPS
