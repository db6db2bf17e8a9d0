"""End-to-end: a vendored Hugging Face Trainer's Apex backend against its migration.

``fixtures/e2e/hf_trainer_apex_backend.in.py`` is transformers 4.4's Trainer in small: the fp16
backend choice, ``amp.initialize`` in ``_wrap_model``, the ``elif self.use_apex:`` scaled backward
and the clip of ``amp.master_params``. The original runs its Apex backend under the Apex shim; the
migration (whose Apex branch became the native one) runs natively beside an ``apex`` that raises
on import, with the same arguments. The forward pass must be float16 in both, the losses must
match, and so must the clipped norms (of unscaled gradients in both).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from shim_runs import REPO, imported_modules, original_and_migrated_runs, write_migration

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

SCRIPT = REPO / "fixtures" / "e2e" / "hf_trainer_apex_backend.in.py"
STEPS = 25
MIXED_LOSS_REL_TOL = 1e-2  # Apex's O1 casting lists (the shim) against autocast's
RUNS = {
    "apex": ["--fp16", "--fp16-backend", "apex", "--steps", str(STEPS)],
    "apex-clip": ["--fp16", "--fp16-backend", "apex", "--max-grad-norm", "0.5", "--steps", str(STEPS)],
}


@pytest.fixture(scope="module")
def migrated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("hf_trainer_apex_backend")
    return folder, write_migration(SCRIPT, folder)


@pytest.fixture(scope="module")
def runs(migrated: tuple[Path, Path]) -> dict[tuple[str, bool], dict[str, Any]]:
    folder, script = migrated
    return original_and_migrated_runs(SCRIPT, script, RUNS, folder)


def test_the_migration_imports_no_apex(migrated: tuple[Path, Path]) -> None:
    source = migrated[1].read_text(encoding="utf-8")
    assert not [m for m in imported_modules(source) if m == "apex" or m.startswith("apex.")]
    assert "use_apex = True" not in source and "self.use_amp = True" in source


@pytest.mark.parametrize("name", RUNS)
def test_forward_pass_runs_in_float16(runs: dict[tuple[str, bool], dict[str, Any]], name: str) -> None:
    assert set(runs[(name, True)]["hidden_dtype"]) == set(runs[(name, False)]["hidden_dtype"]) == {"torch.float16"}


@pytest.mark.parametrize("name", RUNS)
def test_trains_like_the_original(runs: dict[tuple[str, bool], dict[str, Any]], name: str) -> None:
    original, migrated = runs[(name, True)]["loss"], runs[(name, False)]["loss"]
    assert len(migrated) == len(original) == STEPS
    assert migrated == pytest.approx(original, rel=MIXED_LOSS_REL_TOL)
    assert sum(migrated[-5:]) < 0.5 * sum(migrated[:5]), f"the migrated script did not train: {migrated}"


def test_clips_the_unscaled_gradients(runs: dict[tuple[str, bool], dict[str, Any]]) -> None:
    original, migrated = runs[("apex-clip", True)]["grad_norm"], runs[("apex-clip", False)]["grad_norm"]
    assert len(migrated) == len(original) == STEPS
    assert migrated[0] == pytest.approx(original[0], rel=0.02)  # same weights and data, fp16 rounding only
    assert all(norm < 1e3 for norm in migrated), "a norm of scaled gradients"
