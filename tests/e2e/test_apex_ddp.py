"""End-to-end: a script using all of Apex (DDP, SyncBN, fused optimizers, LARC, fused norms,
``multi_tensor_applier``) runs as a real one-process ``gloo`` group before and after migration.

The original runs under the Apex shim (``python -m migrate.shim``), the migration natively
(``python -m migrate.shim --native``, which only maps CUDA to the CPU) with an ``apex`` package
and an ``amp_C`` module that raise on import placed first on ``sys.path``: the migrated script
must not need Apex at all. In float32 (O0) both must train identically up to rounding; in
mixed precision (O1) within the gap between Apex's O1 casting lists and autocast's.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from migrate import verify
from migrate.engine import migrate_source

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "fixtures" / "e2e" / "ddp_gloo.in.py"
RUN_TIMEOUT_S = 180
POISON = "apex is not installed here (ampmigrate test)"

# O0 runs do the same float32 arithmetic; measured differences were below 2e-6 (loss) and
# 3e-7 (weight norm): fused AdamW against the shim's FusedAdam rounds differently.
FP32_REL_TOL = 1e-4
# O1: Apex's casting lists (the shim) against autocast's; measured below 3e-4 per step.
MIXED_LOSS_REL_TOL = 2e-2
MIXED_NORM_REL_TOL = 1e-3


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _poison(folder: Path) -> None:
    """An ``apex`` package and an ``amp_C`` module that fail on import."""
    (folder / "apex").mkdir()
    (folder / "apex" / "__init__.py").write_text(f"raise ImportError({POISON!r})\n", encoding="utf-8")
    (folder / "amp_C.py").write_text(f"raise ImportError({POISON!r})\n", encoding="utf-8")


def _run(script: Path, args: list[str], out: Path, *, original: bool) -> subprocess.CompletedProcess[str]:
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(_free_port()),
        WORLD_SIZE="1",
        RANK="0",
        LOCAL_RANK="0",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    )
    mode = [] if original else ["--native"]
    return subprocess.run(
        [sys.executable, "-m", "migrate.shim", *mode, str(script), *args, "--out", str(out)],
        cwd=out.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("apex_ddp")
    migrated = folder / "migrated"
    migrated.mkdir()
    (migrated / "train.py").write_text(migrate_source(SCRIPT.read_text(encoding="utf-8")).source, encoding="utf-8")
    _poison(migrated)
    return folder


def _metrics(workdir: Path, args: list[str], *, original: bool) -> dict[str, Any]:
    name = ("original" if original else "migrated") + "-" + "-".join(args).replace("--", "")
    out = workdir / f"{name}.json"
    if not out.exists():
        script = SCRIPT if original else workdir / "migrated" / "train.py"
        done = _run(script, args, out, original=original)
        assert done.returncode == 0, f"{name} failed:\n{done.stderr[-4000:]}"
    metrics: dict[str, Any] = json.loads(out.read_text())
    return metrics


def test_the_poisoned_apex_is_what_a_native_run_finds(workdir: Path) -> None:
    """The check below means something: unmigrated, the script fails on the poisoned apex."""
    copy = workdir / "migrated" / "unmigrated.py"
    copy.write_text(SCRIPT.read_text(encoding="utf-8"), encoding="utf-8")
    done = _run(copy, ["--steps", "1"], workdir / "unmigrated.json", original=False)
    assert done.returncode != 0
    assert POISON in done.stderr


OPTIMIZERS = ["adam", "larc"]


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_fp32_runs_train_identically(workdir: Path, optimizer: str) -> None:
    args = ["--opt-level", "O0", "--optimizer", optimizer]
    migrated = _metrics(workdir, args, original=False)
    original = _metrics(workdir, args, original=True)
    assert migrated["world_size"] == original["world_size"] == 1
    assert migrated["ddp"].endswith("DistributedDataParallel") and "migrate.shim.parallel" not in migrated["ddp"]
    assert original["ddp"] == "migrate.shim.parallel.DistributedDataParallel"
    assert migrated["bn_type"] == original["bn_type"] == "SyncBatchNorm"
    assert migrated["loss"] == pytest.approx(original["loss"], rel=FP32_REL_TOL)
    assert migrated["weight_norm"] == pytest.approx(original["weight_norm"], rel=FP32_REL_TOL)
    # buffers stay per process and are updated the same way (no broadcast from rank 0)
    assert migrated["running_mean"] == pytest.approx(original["running_mean"], rel=FP32_REL_TOL, abs=1e-6)
    assert original["loss"][-1] < 0.5 * original["loss"][0], "the original did not train"


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_mixed_precision_runs_train_alike(workdir: Path, optimizer: str) -> None:
    args = ["--opt-level", "O1", "--optimizer", optimizer]
    migrated = _metrics(workdir, args, original=False)
    original = _metrics(workdir, args, original=True)
    assert migrated["loss"] == pytest.approx(original["loss"], rel=MIXED_LOSS_REL_TOL)
    assert migrated["weight_norm"] == pytest.approx(original["weight_norm"], rel=MIXED_NORM_REL_TOL)
    assert migrated["loss"][-1] < 0.5 * migrated["loss"][0], "the migrated script did not train"


def test_verify_accepts_the_fused_adamw_migration_across_a_skipped_step(tmp_path: Path) -> None:
    migrated = tmp_path / "train.py"
    migrated.write_text(migrate_source(SCRIPT.read_text(encoding="utf-8")).source, encoding="utf-8")
    # the loss scale overflows at step 9 in both runs
    result = verify.compare(SCRIPT, migrated, steps=12, script_args=["--optimizer", "adam"])
    assert result.exit_code == 0, result.report()
