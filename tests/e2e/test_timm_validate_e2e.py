"""End-to-end: timm's validation script with ``--apex-amp`` against its migration.

``fixtures/e2e/timm_validate.in.py`` is timm's validate.py in small: ``--apex-amp`` (or
``--amp`` where Apex imports) runs ``amp.initialize(model, opt_level="O1")`` on the model
alone, and the loop enters the autocast factory the native choice sets. The migration sets
that factory in the Apex clause too. The original runs under the Apex shim, the migration
natively beside an ``apex`` that raises on import: the forward pass must be float16 in both
(not float32, as dropping the initialize alone would leave it) and the outputs must match.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from shim_runs import REPO, run_shim, write_migration

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

SCRIPT = REPO / "fixtures" / "e2e" / "timm_validate.in.py"
STEPS = 5
MIXED_REL_TOL = 1e-2  # Apex's O1 casting lists (the shim) against autocast's
RUNS = {"apex-amp": ["--apex-amp"], "amp": ["--amp"]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, bool], dict[str, Any]]:
    folder = tmp_path_factory.mktemp("timm_validate")
    migrated = write_migration(SCRIPT, folder)
    results = {}
    for name, args in RUNS.items():
        for original in (True, False):
            out = folder / f"{name}-{'original' if original else 'migrated'}.json"
            done = run_shim(SCRIPT if original else migrated, [*args, "--steps", str(STEPS)], out, original=original)
            assert done.returncode == 0, f"{name} ({'original' if original else 'migrated'}):\n{done.stderr[-4000:]}"
            results[(name, original)] = json.loads(Path(out).read_text(encoding="utf-8"))
    return results


@pytest.mark.parametrize("name", RUNS)
def test_forward_pass_runs_in_float16(runs: dict[tuple[str, bool], dict[str, Any]], name: str) -> None:
    assert set(runs[(name, True)]["hidden_dtype"]) == set(runs[(name, False)]["hidden_dtype"]) == {"torch.float16"}


@pytest.mark.parametrize("name", RUNS)
def test_outputs_match_the_original(runs: dict[tuple[str, bool], dict[str, Any]], name: str) -> None:
    original, migrated = runs[(name, True)], runs[(name, False)]
    assert len(migrated["loss"]) == len(original["loss"]) == STEPS
    assert migrated["logits"] == pytest.approx(original["logits"], rel=MIXED_REL_TOL, abs=1e-2)
    assert migrated["loss"] == pytest.approx(original["loss"], rel=MIXED_REL_TOL)
