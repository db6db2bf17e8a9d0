"""End-to-end: a gradient clip inside ``with amp.scale_loss(...)`` stays as it was.

Apex unscales the gradients when the block exits, so a clip inside it acted on the scaled
gradients. ampmigrate leaves that setup alone (AMP024, AMP025); this test shows why, with the
original run under the Apex shim and the two native spellings of ``clip_inside_scale_loss.native.py``:
clipping the still-scaled gradients trains as Apex did, while ``scaler.unscale_`` before the clip
(what a migration that ignored the block wrote) trains differently.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from shim_runs import REPO, shim_metrics

from migrate.engine import migrate_source
from migrate.options import Options

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

SCRIPT = REPO / "fixtures" / "e2e" / "clip_inside_scale_loss.in.py"
NATIVE = REPO / "fixtures" / "e2e" / "clip_inside_scale_loss.native.py"
# Apex's O1 casting lists (the shim) against autocast's.
MIXED_REL_TOL = 2e-2


def test_setup_is_left_as_it_was() -> None:
    source = SCRIPT.read_text(encoding="utf-8")
    result = migrate_source(source, Options())
    assert result.source == source
    assert {"AMP024", "AMP025"} <= {finding.code for finding in result.findings}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    folder: Path = tmp_path_factory.mktemp("clip_inside_scale_loss")
    return {
        "apex": shim_metrics(SCRIPT, [], folder / "apex.json", original=True),
        "scaled_clip": shim_metrics(NATIVE, [], folder / "scaled_clip.json", original=False),
        "unscaled_clip": shim_metrics(NATIVE, ["--unscale-before-clip"], folder / "unscaled_clip.json", original=False),
    }


def test_clip_on_scaled_gradients_trains_as_apex(runs: dict[str, dict[str, Any]]) -> None:
    apex, native = runs["apex"]["loss"], runs["scaled_clip"]["loss"]
    assert len(apex) == len(native) == 30
    assert native == pytest.approx(apex, rel=MIXED_REL_TOL)


def test_unscale_before_the_clip_trains_differently(runs: dict[str, dict[str, Any]]) -> None:
    apex, unscaled = runs["apex"]["loss"], runs["unscaled_clip"]["loss"]
    # Apex's clip held the update near zero; clipping the true gradients lets it train
    assert unscaled[-1] < 0.5 * apex[-1]
