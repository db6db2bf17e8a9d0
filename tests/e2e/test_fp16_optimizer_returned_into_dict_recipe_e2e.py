"""End-to-end: the code ampmigrate's finding names for an FP16_Optimizer a trainer method returns into
a dict of optimizers trains as Apex did.

microsoft/MASS's Trainer builds its optimizers in ``get_optimizer_fp`` (``return optimizer``) and keeps
them in ``self.optimizers[name]``; the model is halved by the project's own ``network_to_half`` outside
the trainer. The rule leaves it as it was, and its finding names where the callers keep the optimizer,
the GradScaler to keep beside it under the same key, and what each use of ``self.optimizers[...]``
becomes (``zero_grad(set_to_none=False)``, ``scale(loss).backward()``, ``unscale_`` then the clip of
the optimizer's parameters, ``step`` and ``update``, the optimizer/scaler pair in checkpoints).
``fp16_optimizer_returned_into_dict.native.py`` is that code; this test checks that the finding names
it verbatim and that it trains like the original under the Apex shim, a restart from a checkpoint and
overflowing steps included.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from shim_runs import REPO, original_and_migrated_runs

from migrate.engine import migrate_source
from migrate.options import Options

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

SCRIPT = REPO / "fixtures" / "e2e" / "fp16_optimizer_returned_into_dict.in.py"
NATIVE = REPO / "fixtures" / "e2e" / "fp16_optimizer_returned_into_dict.native.py"
STEPS = 30
RUNS = {
    "dynamic": ("--fp16",),
    "restart": ("--fp16", "--save_at", "12"),
    # the first steps overflow at 2**16 (both halve the scale and skip them), with a restart in the middle
    "overflowing": ("--fp16", "--loss_weight", "3000", "--save_at", "12"),
}
# an fp16 model with fp32 masters (Apex) against autocast over float32 weights: measured within 1%
# (the overflowing run's losses are ~50 to ~700); the clip (0.5) is active on most steps, and a clip of
# the still-scaled gradients or a step Apex skipped moves the losses far outside these bounds
LOSS_REL_TOL = 2e-2
LOSS_ABS_TOL = 1e-3


@pytest.fixture(scope="module")
def metrics(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, bool], dict[str, Any]]:
    folder: Path = tmp_path_factory.mktemp("fp16_optimizer_returned_into_dict")
    runs = {name: [*args, "--steps", str(STEPS)] for name, args in RUNS.items()}
    return original_and_migrated_runs(SCRIPT, NATIVE, runs, folder)


def test_the_rule_leaves_it_and_its_finding_names_the_native_code() -> None:
    result = migrate_source(SCRIPT.read_text(encoding="utf-8"), Options())
    assert not result.changed
    native = NATIVE.read_text(encoding="utf-8")
    [message] = [f.message for f in result.findings if "`return optimizer` hands the optimizer" in f.message]
    assert 'the scaler: `torch.amp.GradScaler("cuda", enabled=self.params.fp16)`' in message
    assert 'torch.amp.GradScaler("cuda", enabled=self.params.fp16)' in native
    assert "keeps it in `self.optimizers[...]`: keep its scaler under the same key in `self.scalers`" in message
    named = [
        "self.optimizers[module].zero_grad(set_to_none=False)",
        "self.scalers[module].scale(loss).backward()",
        "self.scalers[module].unscale_(self.optimizers[module])",
        "self.scalers[module].step(self.optimizers[module])",
        "self.scalers[module].update()",
        'self.scalers["model"].get_scale()',
        'self.optimizers["model"].load_state_dict(data["model_optimizer"]["optimizer"])',
        'self.scalers["model"].load_state_dict(data["model_optimizer"]["scaler"])',
    ]
    for code in named:
        assert f"`{code}`" in message, code
        assert code in native, code
    assert "network_to_half(model)" not in native


@pytest.mark.parametrize("name", list(RUNS))
def test_the_named_code_trains_as_apex(metrics: dict[tuple[str, bool], dict[str, Any]], name: str) -> None:
    original, native = metrics[(name, True)], metrics[(name, False)]
    assert len(original["loss"]) == len(native["loss"]) == STEPS
    for step, (theirs, ours) in enumerate(zip(original["loss"], native["loss"])):
        assert abs(ours - theirs) <= LOSS_ABS_TOL + LOSS_REL_TOL * abs(theirs), f"step {step}: {ours} vs {theirs}"
    assert native["loss_scale"] == original["loss_scale"]


def test_the_restart_resumes_where_it_stopped(metrics: dict[tuple[str, bool], dict[str, Any]]) -> None:
    for original in (True, False):
        assert metrics[("restart", original)]["loss"] == metrics[("dynamic", original)]["loss"]
    assert metrics[("overflowing", True)]["loss_scale"][:3] == [2.0**15, 2.0**14, 2.0**13]
