"""End-to-end: a project that keeps Apex as the fallback of a torch version test (issue 8).

``fixtures/e2e_project/version_fallback`` is neural_sp's shape in four modules: ``amp, scaler =
None, None``, then ``if version.parse(torch.__version__) >= version.parse("1.6.0"): scaler =
torch.cuda.amp.GradScaler()`` / ``else: from apex import amp; amp.initialize(...);
amp.register_float_function(...); amp.init()``, and ``amp`` passed to the loop (trainer.py), to a
checkpoint method (saver.py) and to the loader (utils.py), which test ``amp is not None``. The
whole tree is migrated in one run; then the original runs under the Apex shim twice, as it is
(torch 2.13: its native branch) and as it ran before torch 1.6 (``torch.__version__`` set to 1.5.0
first: amp.initialize O1, scale_loss, amp's state saved and restored), and the migration runs
natively beside an ``apex`` that raises on import. The migration must run exactly what the original
runs today, and train like the Apex fallback did.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from shim_runs import REPO, poison, run_shim, shim_env

from migrate.config import Config
from migrate.runner import Status, run

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

PROJECT = REPO / "fixtures" / "e2e_project" / "version_fallback"
STEPS = 24
# Apex O1's casting lists (the shim) against autocast's, as in test_project_e2e.py
MIXED_LOSS_REL_TOL = 0.05
MIXED_LOSS_ABS_TOL = 0.01
OLD_TORCH = """\
import runpy

import torch

torch.__version__ = "1.5.0"  # as before torch 1.6: the project's Apex fallback runs
runpy.run_path("main.py", run_name="__main__")
"""


def _metrics(script: Path, args: list[str], out: Path, *, original: bool) -> dict[str, Any]:
    done = run_shim(
        script, [*args, "--checkpoint", str(out.with_suffix(".pt"))], out, original=original, env=shim_env()
    )
    assert done.returncode == 0, done.stderr[-3000:]
    metrics: dict[str, Any] = json.loads(out.read_text())
    return metrics


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[Any]]:
    base = tmp_path_factory.mktemp("version_fallback")
    original, migrated = base / "original", base / "migrated"
    for tree in (original, migrated):
        shutil.copytree(PROJECT, tree, ignore=shutil.ignore_patterns("__pycache__"))
    results = run([migrated], Config(write=True, jobs=1))
    (original / "old_torch.py").write_text(OLD_TORCH, encoding="utf-8")
    poison(migrated)
    return original, migrated, results


def test_the_whole_project_is_migrated(trees: tuple[Path, Path, list[Any]]) -> None:
    original, migrated, results = trees
    assert all(result.status is Status.CHANGED for result in results), [(r.path, r.status) for r in results]
    assert {Path(r.path).name for r in results} == {"main.py", "trainer.py", "saver.py", "utils.py"}
    assert {d.code for r in results for d in r.diagnostics} == {"AMP034", "AMP035"}
    for path in migrated.glob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert "from apex" not in text and "amp.scale_loss" not in text and "amp.state_dict" not in text, path.name
    again = run([migrated], Config(check=True, jobs=1))
    assert all(result.status is Status.UNCHANGED and not result.diagnostics for result in again)


def test_the_migration_runs_what_the_original_runs_today(trees: tuple[Path, Path, list[Any]]) -> None:
    original, migrated, _ = trees
    args = ["--opt-level", "O1", "--steps", str(STEPS)]
    today = _metrics(original / "main.py", args, original / "today.json", original=True)
    mine = _metrics(migrated / "main.py", args, migrated / "native.json", original=False)
    assert mine["loss"] == pytest.approx(today["loss"], rel=1e-6, abs=1e-7)


def test_the_migration_trains_like_the_apex_fallback(trees: tuple[Path, Path, list[Any]]) -> None:
    original, migrated, _ = trees
    args = ["--opt-level", "O1", "--steps", str(STEPS)]
    apex = _metrics(original / "old_torch.py", args, original / "apex.json", original=True)
    # the Apex fallback ran: its checkpoint holds amp's loss scaler, which the load restored
    import torch

    assert "amp_state_dict" in torch.load(original / "apex.pt", weights_only=False)
    mine = _metrics(migrated / "main.py", args, migrated / "native-vs-apex.json", original=False)
    assert len(mine["loss"]) == len(apex["loss"]) == STEPS
    for step, (a, b) in enumerate(zip(mine["loss"], apex["loss"])):
        assert abs(a - b) <= MIXED_LOSS_ABS_TOL + MIXED_LOSS_REL_TOL * abs(b), (step, a, b)
    assert sum(mine["loss"][-5:]) < sum(mine["loss"][:5]), "the migrated project must still train"


def test_fp32_runs_are_the_same(trees: tuple[Path, Path, list[Any]]) -> None:
    original, migrated, _ = trees
    args = ["--opt-level", "O0", "--steps", str(STEPS)]
    apex = _metrics(original / "old_torch.py", args, original / "fp32.json", original=True)
    mine = _metrics(migrated / "main.py", args, migrated / "fp32.json", original=False)
    assert mine["loss"] == pytest.approx(apex["loss"], rel=1e-5, abs=1e-7)
