"""e2e: an Apex FusedSGD stored in a variable and called through it trains the same as torch's SGD.

The original (fixtures/e2e/fused_sgd_chosen_by_flag.in.py) runs with ``--fsgd`` under the shim,
whose FusedSGD is its own plain-torch emulation of Apex's update; the migration, where the
stored class became ``torch.optim.SGD``, runs natively beside an ``apex`` package that raises on
import. Float32 throughout: per-group learning rates, weight decay and Nesterov momentum must give
the same losses.
"""

from __future__ import annotations

from typing import Any

import pytest
from shim_runs import REPO, shim_metrics, write_migration

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

SCRIPT = REPO / "fixtures" / "e2e" / "fused_sgd_chosen_by_flag.in.py"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    folder = tmp_path_factory.mktemp("fused_sgd_value")
    migrated = write_migration(SCRIPT, folder)
    assert "apex" not in migrated.read_text(encoding="utf-8").replace("apex is needed", "")
    return {
        "original": shim_metrics(SCRIPT, ["--fsgd"], folder / "original.json", original=True),
        "migrated": shim_metrics(migrated, ["--fsgd"], folder / "migrated.json", original=False),
    }


def test_the_stored_class_trains_like_apex_fused_sgd(runs: dict[str, dict[str, Any]]) -> None:
    original, migrated = runs["original"], runs["migrated"]
    assert original["optimizer"].endswith("FusedSGD")
    assert migrated["optimizer"] == "torch.optim.sgd.SGD"
    assert migrated["loss"] == pytest.approx(original["loss"], rel=1e-5)
    assert original["loss"][-1] < original["loss"][0], "the original did not train"
