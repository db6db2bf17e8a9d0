"""End-to-end: a script whose Apex path shares its forward pass with a native torch.cuda.amp path.

``fixtures/e2e/native_or_apex_paths.in.py`` has two loops (issue 8, lost autocast on real code).
``region``: the forward pass already runs in ``with torch.cuda.amp.autocast(enable_autocast)``,
whose switch is off on the Apex path; the migration widens it to ``enable_autocast or
grad_scaler.is_enabled()``. ``branch``: ``if with_apex: out = model(x)`` / ``else: with
autocast(): out = model(x)``; the migration puts the whole ``if`` under the scaler's autocast.
Before, both came out without any autocast on the Apex path (AMP020): a GradScaler over a
float32 forward pass. The original runs under the Apex shim, the migration natively beside an
``apex`` that raises on import: the Apex path must compute its forward pass in float16 and train
like the original; the native and fp32 paths must not change at all.
"""

from __future__ import annotations

from typing import Any

import pytest
from shim_runs import REPO, shim_metrics, write_migration

from migrate.engine import migrate_source

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

SCRIPT = REPO / "fixtures" / "e2e" / "native_or_apex_paths.in.py"
STEPS = 20
# Apex's O1 casting lists (the shim) against autocast's
MIXED_LOSS_REL_TOL = 1e-2
LOOPS = ("region", "branch")
COMMAND_LINES = {
    "apex": ["--fp16", "--amp", "apex"],
    "native": ["--fp16", "--amp", "pytorch"],
    "fp32": ["--amp", "pytorch"],
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    folder = tmp_path_factory.mktemp("native_or_apex_paths")
    migrated = write_migration(SCRIPT, folder)
    results = {}
    for loop in LOOPS:
        for key, args in COMMAND_LINES.items():
            args = [*args, "--loop", loop, "--steps", str(STEPS)]
            for which, script in (("original", SCRIPT), ("migrated", migrated)):
                out = folder / f"{which}-{loop}-{key}.json"
                results[f"{which}-{loop}-{key}"] = shim_metrics(script, args, out, original=which == "original")
    return results


def test_both_loops_are_migrated_with_autocast() -> None:
    migrated = migrate_source(SCRIPT.read_text(encoding="utf-8"))
    assert not [line for line in migrated.source.splitlines() if line.startswith(("import apex", "from apex"))]
    assert "amp.scale_loss" not in migrated.source
    assert not {"AMP020", "AMP022", "AMP025"} & {finding.code for finding in migrated.findings}
    assert (
        'torch.autocast("cuda", dtype=torch.float16, enabled=enable_autocast or grad_scaler.is_enabled())'
        in migrated.source
    )


@pytest.mark.parametrize("loop", LOOPS)
def test_apex_path_runs_its_forward_pass_in_float16(runs: dict[str, dict[str, Any]], loop: str) -> None:
    original, migrated = runs[f"original-{loop}-apex"], runs[f"migrated-{loop}-apex"]
    assert set(original["output_dtype"]) == set(migrated["output_dtype"]) == {"torch.float16"}


@pytest.mark.parametrize("loop", LOOPS)
def test_apex_path_trains_like_the_original(runs: dict[str, dict[str, Any]], loop: str) -> None:
    original, migrated = runs[f"original-{loop}-apex"]["loss"], runs[f"migrated-{loop}-apex"]["loss"]
    assert len(migrated) == len(original) == STEPS
    assert migrated == pytest.approx(original, rel=MIXED_LOSS_REL_TOL)
    assert sum(migrated[-5:]) < 0.5 * sum(migrated[:5]), f"the migrated script did not train: {migrated}"


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("key", ["native", "fp32"])
def test_other_paths_are_unchanged(runs: dict[str, dict[str, Any]], loop: str, key: str) -> None:
    original, migrated = runs[f"original-{loop}-{key}"], runs[f"migrated-{loop}-{key}"]
    assert migrated["output_dtype"] == original["output_dtype"]
    assert migrated["loss"] == pytest.approx(original["loss"], rel=1e-5)
    expected = {"native": "torch.float16", "fp32": "torch.float32"}[key]
    assert set(migrated["output_dtype"]) == {expected}
