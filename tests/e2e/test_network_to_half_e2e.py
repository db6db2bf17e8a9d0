"""End-to-end: ``apex.fp16_utils.network_to_half`` in a module with no FP16_Optimizer (fp16 inference,
then plain SGD on the float16 network) becomes the same function in plain torch, written into the
script: run under the shim (Apex's function) and natively beside an ``apex`` that raises on import,
the two give the same detections, state_dict (keys with the ``1.`` prefix, float32 affine batch
norms, float16 elsewhere) and training, bit for bit.
"""

from __future__ import annotations

from typing import Any

import pytest
from shim_runs import REPO, imported_modules, original_and_migrated_runs, write_migration

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

SCRIPT = REPO / "fixtures" / "e2e" / "network_to_half_inference.in.py"


@pytest.fixture(scope="module")
def metrics(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, bool], dict[str, Any]]:
    folder = tmp_path_factory.mktemp("network_to_half")
    migrated = write_migration(SCRIPT, folder)
    return original_and_migrated_runs(SCRIPT, migrated, {"infer": ["--steps", "3"]}, folder)


def test_migration_has_no_apex_and_the_helper() -> None:
    source = (SCRIPT.parent / "network_to_half_inference.out.py").read_text(encoding="utf-8")
    imported = imported_modules(source)
    assert imported and not [name for name in imported if (name or "").split(".")[0] == "apex"]
    assert "model = half_network(model)" in source


def test_same_network_same_results(metrics: dict[tuple[str, bool], dict[str, Any]]) -> None:
    original, migrated = metrics[("infer", True)], metrics[("infer", False)]
    assert original["output_dtype"] == migrated["output_dtype"] == "torch.float16"
    assert migrated["state"] == original["state"]
    assert original["state"]["1.backbone.1.weight"] == "torch.float32"  # an affine batch norm
    assert original["state"]["1.head.1.running_mean"] == "torch.float16"  # affine=False stays half
    assert original["state"]["1.head.0.weight"] == "torch.float16"
    assert migrated["detections"] == original["detections"]
    assert migrated["losses"] == original["losses"] and len(original["losses"]) == 3
    assert migrated["params"] == original["params"]
