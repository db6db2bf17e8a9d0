"""End-to-end: an O1 training script whose evaluation casts its input (``model(x.half())``) or
the model itself (``model.half()``) to float16 by hand stays as it was.

Apex O1 patched torch's functions for the whole process, so the float32 model's ops cast both
sides to float16 wherever they ran, evaluation included. The migration's autocast covers only
the training step: this test runs the original under the Apex shim and the two native spellings
of ``o1_hand_cast_evaluation.native.py``. What ampmigrate wrote before it left the setup (the
casts kept, evaluation outside autocast) fails with a dtype error; what its AMP005 says to do
instead (drop the cast, run the evaluation under torch.autocast) scores as Apex did.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from shim_runs import REPO, run_shim, shim_metrics

from migrate.engine import migrate_source
from migrate.options import Options

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

SCRIPT = REPO / "fixtures" / "e2e" / "o1_hand_cast_evaluation.in.py"
NATIVE = REPO / "fixtures" / "e2e" / "o1_hand_cast_evaluation.native.py"
# the shim's O1 casting lists against autocast's, on the same float32 weights (measured 0.0)
SCORE_ABS_TOL = 1e-3


def test_setup_is_left_as_it_was() -> None:
    source = SCRIPT.read_text(encoding="utf-8")
    result = migrate_source(source, Options())
    assert result.source == source
    amp005 = [finding.message for finding in result.findings if finding.code == "AMP005"]
    assert len(amp005) == 1 and "`images.half()`" in amp005[0] and "opt_level O1" in amp005[0]


@pytest.mark.parametrize("cast", ["input", "model"])
def test_the_earlier_migration_crashes_where_apex_ran(tmp_path: Path, cast: str) -> None:
    apex = shim_metrics(SCRIPT, ["--eval-cast", cast], tmp_path / "apex.json", original=True)
    assert set(apex["dtypes"]) == {"torch.float16"}
    done = run_shim(NATIVE, ["--eval-cast", cast], tmp_path / "native.json", original=False)
    assert done.returncode != 0
    assert "mat1 and mat2 must have the same dtype" in done.stderr
    advised = shim_metrics(NATIVE, ["--eval-cast", cast, "--follow-advice"], tmp_path / "fixed.json", original=False)
    assert set(advised["dtypes"]) == {"torch.float16"}
    assert advised["scores"] == pytest.approx(apex["scores"], abs=SCORE_ABS_TOL)
