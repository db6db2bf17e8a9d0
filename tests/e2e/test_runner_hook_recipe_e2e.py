"""End-to-end: the code the findings of an mmcv-style setup ask for trains as Apex did.

ampmigrate leaves a setup whose optimizer goes to a library's runner, with the loss scaled in a
registered hook, as it was (AMP025 in each module, ``fixtures/project/
runner_hook_and_checkpoint_through_a_registry``), and each finding names the code to write. This
test runs a stand-in of that setup under the Apex shim and the code the findings give
(``runner_hook_through_a_registry.native.py``: the scaler on the runner, the model's forward under
autocast, ``unscale_`` before the hook's clip, ``step`` and ``update``) natively, and shows that
the ``unscale_`` the hook's finding asks for is needed.
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
