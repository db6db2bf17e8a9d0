"""End-to-end: a script on the old Apex amp API (``amp_handle = amp.init(...)``, an optimizer
wrapped by ``wrap_optimizer(num_loss=2)``, two scaled losses per step, a clip) runs before and
after migration.

The original runs under the Apex shim (``python -m migrate.shim``), the migration natively
(``--native``: CUDA mapped to the CPU) with an ``apex`` package that raises on import first on
``sys.path``. In float32 both must train identically up to rounding; in mixed precision within
the gap between Apex's O1 casting lists and autocast's; and ``ampmigrate verify`` must accept the
migration, overflows planted included (the wrapper's per-loss scalers against one GradScaler).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from shim_runs import POISON, REPO, run_shim, shim_metrics, write_migration

from migrate import verify

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

SCRIPT = REPO / "fixtures" / "e2e" / "handle_api.in.py"
# float32: the same arithmetic in both runs; only the order of a few reductions may differ.
FP32_REL_TOL = 1e-4
# float16: Apex's O1 lists (the shim) against autocast's CPU lists, and per-loss scales against
# one; measured below 2e-3 on the loss and 1e-4 on the weight norm over 40 steps.
MIXED_LOSS_REL_TOL = 2e-2
MIXED_NORM_REL_TOL = 2e-3


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("handle_api")
    write_migration(SCRIPT, folder)
    return folder


def _metrics(workdir: Path, args: list[str], *, original: bool) -> dict[str, Any]:
    name = ("original" if original else "migrated") + "-" + ("-".join(args).replace("--", "") or "fp32")
    out = workdir / f"{name}.json"
    if out.exists():
        metrics: dict[str, Any] = json.loads(out.read_text())
        return metrics
    script = SCRIPT if original else workdir / "migrated" / "train.py"
    return shim_metrics(script, args, out, original=original)


def test_the_migration_no_longer_needs_apex(workdir: Path) -> None:
    lines = (workdir / "migrated" / "train.py").read_text(encoding="utf-8").splitlines()
    source = "\n".join(line for line in lines if not line.startswith("#"))  # the header names them
    assert "apex" not in source and "amp_handle" not in source and "wrap_optimizer" not in source
    copy = workdir / "migrated" / "unmigrated.py"
    copy.write_text(SCRIPT.read_text(encoding="utf-8"), encoding="utf-8")
    done = run_shim(copy, ["--steps", "1"], workdir / "unmigrated.json", original=False)
    assert done.returncode != 0 and POISON in done.stderr


def test_fp32_runs_train_identically(workdir: Path) -> None:
    migrated = _metrics(workdir, [], original=False)
    original = _metrics(workdir, [], original=True)
    assert set(migrated["output_dtype"]) == set(original["output_dtype"]) == {"torch.float32"}
    assert migrated["loss"] == pytest.approx(original["loss"], rel=FP32_REL_TOL)
    assert migrated["weight_norm"] == pytest.approx(original["weight_norm"], rel=FP32_REL_TOL)
    assert original["loss"][-1] < 0.2 * original["loss"][0], "the original did not train"


def test_mixed_precision_runs_train_alike(workdir: Path) -> None:
    migrated = _metrics(workdir, ["--fp16"], original=False)
    original = _metrics(workdir, ["--fp16"], original=True)
    assert set(migrated["output_dtype"]) == set(original["output_dtype"]) == {"torch.float16"}
    assert migrated["loss"] == pytest.approx(original["loss"], rel=MIXED_LOSS_REL_TOL)
    assert migrated["penalty"] == pytest.approx(original["penalty"], rel=MIXED_LOSS_REL_TOL)
    assert migrated["weight_norm"] == pytest.approx(original["weight_norm"], rel=MIXED_NORM_REL_TOL)
    assert migrated["loss"][-1] < 0.2 * migrated["loss"][0], "the migrated script did not train"


def test_verify_accepts_the_migration(workdir: Path) -> None:
    result = verify.compare(SCRIPT, workdir / "migrated" / "train.py", script_args=["--fp16"])
    report = result.report()
    assert result.exit_code == 0 and report.startswith("MATCH: "), report
    assert result.original is not None and result.migrated is not None
    planted = [step for step in result.planted if step < len(result.comparisons)]
    assert planted, "no overflow was planted"
    for step in planted:
        assert not result.original.steps[step].taken and not result.migrated.steps[step].taken, report
