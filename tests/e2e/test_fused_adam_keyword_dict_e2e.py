"""e2e: Apex's FusedAdam called with a keyword dict (``**opt_args``) trains the same as torch's.

The original (fixtures/e2e/fused_adam_keyword_dict.in.py) runs under the shim, whose FusedAdam is
its own plain-torch emulation of Apex's update; the migration, where each call became
``torch.optim.Adam`` (adam_w_mode=False) or ``torch.optim.AdamW`` with ``fused=True`` and the
same ``**opt_args``, runs natively beside an ``apex`` package that raises on import. Float32,
per-group weight decay, and the dict's optional keys (eps, betas) set in one run.
"""

from __future__ import annotations

from typing import Any

import pytest
from shim_runs import REPO, original_and_migrated_runs, write_migration

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

SCRIPT = REPO / "fixtures" / "e2e" / "fused_adam_keyword_dict.in.py"

RUNS = {
    "adam": ["--opt", "fusedadam"],
    "adamw": ["--opt", "fusedadamw", "--eps", "1e-6", "--betas", "0.8", "0.99"],
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, bool], dict[str, Any]]:
    folder = tmp_path_factory.mktemp("fused_adam_keyword_dict")
    migrated = write_migration(SCRIPT, folder)
    text = migrated.read_text(encoding="utf-8")
    assert "FusedAdam(" not in text and "torch.optim.Adam(parameters, fused=True, **opt_args)" in text
    return original_and_migrated_runs(SCRIPT, migrated, RUNS, folder)


@pytest.mark.parametrize(("run", "torch_class"), [("adam", "adam.Adam"), ("adamw", "adamw.AdamW")])
def test_the_keyword_dict_trains_like_apex_fused_adam(
    runs: dict[tuple[str, bool], dict[str, Any]], run: str, torch_class: str
) -> None:
    original, migrated = runs[(run, True)], runs[(run, False)]
    assert original["optimizer"].endswith("FusedAdam")
    assert migrated["optimizer"] == f"torch.optim.{torch_class}"
    assert migrated["loss"] == pytest.approx(original["loss"], rel=1e-5)
    assert original["loss"][-1] < original["loss"][0], "the original did not train"
