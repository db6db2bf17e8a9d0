"""End-to-end: timm's Apex branch (amp.initialize O1 + ApexScaler) against its migration.

``fixtures/e2e/timm_apex_scaler.in.py`` is timm's training script in small: ``--apex-amp``
runs ``amp.initialize`` and ``ApexScaler``, ``--native-amp`` the autocast factory and
``NativeScaler``. The migration turns the Apex branch into the native recipe. timm itself is
not installed here: the test writes a ``timm.utils`` with both scalers as timm defines them
(``timm/utils/cuda.py``: ApexScaler scales with ``amp.scale_loss`` and clips
``amp.master_params(optimizer)``; NativeScaler scales with a GradScaler, unscales and clips the
``parameters`` it is given). The original runs under the Apex shim, the migration natively
beside an ``apex`` that raises on import: the forward pass must be float16 in both and the
losses must match, with and without clipping.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from shim_runs import REPO, run_shim, shim_env, write_migration

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

SCRIPT = REPO / "fixtures" / "e2e" / "timm_apex_scaler.in.py"
STEPS = 25
MIXED_LOSS_REL_TOL = 1e-2  # Apex's O1 casting lists (the shim) against autocast's
RUNS = {
    "apex": ["--apex-amp"],
    "apex-clip": ["--apex-amp", "--clip-grad", "0.5"],
}

TIMM_UTILS = """
import torch

try:
    from apex import amp
except ImportError:
    amp = None


class ApexScaler:
    state_dict_key = "amp"

    def __call__(self, loss, optimizer, clip_grad=None, clip_mode="norm", parameters=None, create_graph=False):
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward(create_graph=create_graph)
        if clip_grad is not None:
            torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), clip_grad)
        optimizer.step()


class NativeScaler:
    state_dict_key = "amp_scaler"

    def __init__(self):
        self._scaler = torch.amp.GradScaler("cuda")

    def __call__(self, loss, optimizer, clip_grad=None, clip_mode="norm", parameters=None, create_graph=False):
        self._scaler.scale(loss).backward(create_graph=create_graph)
        if clip_grad is not None:
            assert parameters is not None
            self._scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(parameters, clip_grad)
        self._scaler.step(optimizer)
        self._scaler.update()
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, bool], dict[str, Any]]:
    folder = tmp_path_factory.mktemp("timm_apex_scaler")
    migrated = write_migration(SCRIPT, folder)
    libraries = folder / "site"
    (libraries / "timm").mkdir(parents=True)
    (libraries / "timm" / "__init__.py").write_text("", encoding="utf-8")
    (libraries / "timm" / "utils.py").write_text(TIMM_UTILS, encoding="utf-8")
    env = shim_env()
    env["PYTHONPATH"] = os.pathsep.join([str(libraries), env["PYTHONPATH"]])
    results = {}
    for name, args in RUNS.items():
        for original in (True, False):
            out = folder / f"{name}-{'original' if original else 'migrated'}.json"
            done = run_shim(
                SCRIPT if original else migrated, [*args, "--steps", str(STEPS)], out, original=original, env=env
            )
            assert (
                done.returncode == 0
            ), f"{name} ({'original' if original else 'migrated'}) failed:\n{done.stderr[-4000:]}"
            results[(name, original)] = json.loads(Path(out).read_text(encoding="utf-8"))
    return results


@pytest.mark.parametrize("name", RUNS)
def test_forward_pass_runs_in_float16(runs: dict[tuple[str, bool], dict[str, Any]], name: str) -> None:
    assert set(runs[(name, True)]["hidden_dtype"]) == set(runs[(name, False)]["hidden_dtype"]) == {"torch.float16"}


@pytest.mark.parametrize("name", RUNS)
def test_trains_like_the_original(runs: dict[tuple[str, bool], dict[str, Any]], name: str) -> None:
    original, migrated = runs[(name, True)]["loss"], runs[(name, False)]["loss"]
    assert len(migrated) == len(original) == STEPS
    assert migrated == pytest.approx(original, rel=MIXED_LOSS_REL_TOL)
    assert sum(migrated[-5:]) < 0.5 * sum(migrated[:5]), f"the migrated script did not train: {migrated}"
