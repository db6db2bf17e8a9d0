"""End-to-end: the code ampmigrate writes for an mmcv-style setup trains as Apex did.

An amp setup whose optimizer goes to a library's runner, with the loss scaled in a registered
hook, is migrated by keeping the GradScaler on the runner (``fixtures/project/
runner_hook_and_checkpoint_through_a_registry``), or, where that cannot be done, left as it was
with findings that name the same code (``runner_hook_with_a_static_loss_scale_stays``). This test
runs a one-file stand-in of that setup under the Apex shim and that code
(``runner_hook_through_a_registry.native.py``: the scaler on the runner, the model's forward under
autocast, ``unscale_`` before the hook's clip, ``step`` and ``update``) natively, and shows that
the ``unscale_`` before the hook's clip is needed. ``fixtures/e2e_project/runner_hook_registry``
runs the tool's own multi-file migration.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from shim_runs import REPO, shim_metrics

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

SCRIPT = REPO / "fixtures" / "e2e" / "runner_hook_through_a_registry.in.py"
NATIVE = REPO / "fixtures" / "e2e" / "runner_hook_through_a_registry.native.py"
# Apex's O1 casting lists (the shim) against autocast's.
MIXED_REL_TOL = 2e-2


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    folder: Path = tmp_path_factory.mktemp("runner_hook")
    return {
        "apex": shim_metrics(SCRIPT, [], folder / "apex.json", original=True),
        "native": shim_metrics(NATIVE, [], folder / "native.json", original=False),
        "no_unscale": shim_metrics(NATIVE, ["--no-unscale"], folder / "no_unscale.json", original=False),
    }


def test_the_written_code_trains_as_apex(runs: dict[str, dict[str, Any]]) -> None:
    apex, native = runs["apex"], runs["native"]
    assert len(apex["loss"]) == len(native["loss"]) == 40
    assert native["loss"] == pytest.approx(apex["loss"], rel=MIXED_REL_TOL)
    assert native["scale"] == apex["scale"]


def test_the_clip_without_unscale_trains_differently(runs: dict[str, dict[str, Any]]) -> None:
    apex, clipped = runs["apex"]["loss"], runs["no_unscale"]["loss"]
    # the clip on the scaled gradients holds the updates near zero
    assert clipped[-1] > 2 * apex[-1]
