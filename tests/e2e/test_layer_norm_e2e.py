"""e2e: the BERT-family FusedLayerNorm shapes train like their Apex original with Apex gone.

The original (fixtures/e2e/bert_layer_norm.in.py) runs under the shim, where the optional
import succeeds; the migration runs natively beside an ``apex`` package that raises on import.
Float32 throughout, so the two do the same arithmetic: the same losses, state_dict keys, eps
and initial values. Run unmigrated beside the poisoned apex, the original takes its fallback
class instead (eps 1e-12): the migration must reproduce the Apex path, not that one.
"""

from __future__ import annotations

from typing import Any

import pytest
from shim_runs import REPO, shim_metrics, write_migration

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

SCRIPT = REPO / "fixtures" / "e2e" / "bert_layer_norm.in.py"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    folder = tmp_path_factory.mktemp("layer_norm")
    migrated = write_migration(SCRIPT, folder)
    assert "apex" not in migrated.read_text(encoding="utf-8")
    fallback = migrated.parent / "unmigrated.py"
    fallback.write_text(
        SCRIPT.read_text(encoding="utf-8").replace(
            "from apex.normalization.fused_layer_norm import FusedLayerNorm\n",
            "FusedLayerNorm = torch.nn.LayerNorm\n",
            1,
        ),
        encoding="utf-8",
    )
    return {
        "original": shim_metrics(SCRIPT, [], folder / "original.json", original=True),
        "migrated": shim_metrics(migrated, [], folder / "migrated.json", original=False),
        "fallback": shim_metrics(fallback, [], folder / "fallback.json", original=False),
    }


def test_the_migration_trains_like_the_apex_original(runs: dict[str, dict[str, Any]]) -> None:
    original, migrated = runs["original"], runs["migrated"]
    assert migrated["state_dict_keys"] == original["state_dict_keys"]
    assert migrated["eps"] == original["eps"] == [1e-5, 1e-6, 1e-5, 1e-6]
    # the init's isinstance checks reached the same layers (BertLayerNorm's branch came first)
    assert migrated["norm_bias"] == pytest.approx(original["norm_bias"], abs=1e-6)
    assert migrated["loss"] == pytest.approx(original["loss"], rel=1e-6)
    assert original["loss"][-1] < original["loss"][0], "the original did not train"


def test_the_fallback_path_is_not_what_the_migration_runs(runs: dict[str, dict[str, Any]]) -> None:
    """Without Apex the original took its fallback class (eps 1e-12 by default): the
    migration reproduces what ran where Apex was installed instead."""
    fallback = runs["fallback"]
    assert fallback["eps"] == [1e-12, 1e-6, 1e-12, 1e-6]
    assert fallback["state_dict_keys"] == runs["original"]["state_dict_keys"]
