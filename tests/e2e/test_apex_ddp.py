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
import socket
from pathlib import Path
from typing import Any

import pytest
from shim_runs import POISON, REPO, run_shim, shim_env, shim_metrics, write_migration

from migrate import verify
from migrate.engine import migrate_source

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

SCRIPT = REPO / "fixtures" / "e2e" / "ddp_gloo.in.py"

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


def _env() -> dict[str, str]:
    """A one-process gloo group on a free port."""
    return shim_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE="1", RANK="0", LOCAL_RANK="0")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("apex_ddp")
    write_migration(SCRIPT, folder, None, "amp_C")
    return folder


def _metrics(workdir: Path, args: list[str], *, original: bool) -> dict[str, Any]:
    name = ("original" if original else "migrated") + "-" + "-".join(args).replace("--", "")
    out = workdir / f"{name}.json"
    if out.exists():
        metrics: dict[str, Any] = json.loads(out.read_text())
        return metrics
    script = SCRIPT if original else workdir / "migrated" / "train.py"
    return shim_metrics(script, args, out, original=original, env=_env())


def test_the_poisoned_apex_is_what_a_native_run_finds(workdir: Path) -> None:
    """The check below means something: unmigrated, the script fails on the poisoned apex."""
    copy = workdir / "migrated" / "unmigrated.py"
    copy.write_text(SCRIPT.read_text(encoding="utf-8"), encoding="utf-8")
    done = run_shim(copy, ["--steps", "1"], workdir / "unmigrated.json", original=False, env=_env())
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
    # the isinstance check on Apex's SyncBatchNorm still matches the converted layers
    assert migrated["bn_momentum"] == original["bn_momentum"] == 0.3
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
