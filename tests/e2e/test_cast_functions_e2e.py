"""End-to-end: Apex's cast functions (``amp.float_function(fn)``, ``@amp.float_function`` on a
forward, ``@amp.half_function``, ``@amp.promote_function``, ``amp.register_half_function``) on
the CPU, before and after migration.

``fixtures/e2e/cast_functions.in.py`` trains a tiny model whose wrapped functions record the
dtypes they receive; one of them stands for a compiled op that accepts float32 only and raises
otherwise. The original runs under the Apex shim (O1 casts on the CPU, in float16); its
migration, written with ``--device cpu``, runs as a plain script under CPU autocast in float16.
Both also run with ``--opt-level O0`` (fp32, the wrappers pass everything through).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from shim_runs import REPO, shim_env

from migrate.engine import migrate_source
from migrate.options import Options

pytest.importorskip("torch", reason="the e2e script trains with torch")

pytestmark = pytest.mark.slow

SCRIPT = REPO / "fixtures" / "e2e" / "cast_functions.in.py"
BATCH_RUN = Path(__file__).resolve().parent / "batch_run.py"
RUN_TIMEOUT_S = 120

# What each wrapped function receives under O1, as Apex cast it: the float32-only op and the
# float_function forward that feeds it float32, the half_function gate and the registered
# helper float16 (their callers pass float16 and float32), the promote_function blend float32
# (it gets a float16/float32 mix).
MIXED_DTYPES = {
    "roi_kernel": ["torch.float32"],
    "roi_head": ["torch.float32"],
    "fused_gate": ["torch.float16"],
    "center": ["torch.float16"],
    "blend": ["torch.float32"],
}
# Both runs start from the same weights and data; they differ only in where float16 rounding
# happens (Apex's casting lists versus autocast's), about 1e-3 relative on this model.
LOSS_REL_TOL = 2e-2


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], dict[str, Any]]:
    """Metrics of the original and the migrated script at O1 and O0."""
    workdir = tmp_path_factory.mktemp("cast_functions")
    migrated = workdir / "cast_functions.py"
    migrated.write_text(migrate_source(SCRIPT.read_text(encoding="utf-8"), Options(device="cpu")).source)
    plan = []
    for which, argv in (("original", ["--no-cuda-on-cpu", str(SCRIPT)]), ("migrated", ["--native", str(migrated)])):
        for level in ("O1", "O0"):
            out = workdir / f"{which}-{level}.json"
            plan.append(((which, level), out, [*argv, "--opt-level", level, "--out", str(out)]))
    jobs = [
        {
            "argv": argv,
            "cwd": str(workdir),
            "stdout": str(workdir / f"{index}.stdout"),
            "stderr": str(workdir / f"{index}.stderr"),
        }
        for index, (_, _, argv) in enumerate(plan)
    ]
    (workdir / "jobs.json").write_text(json.dumps(jobs), encoding="utf-8")
    env = shim_env()
    command = [sys.executable, str(BATCH_RUN), str(workdir / "jobs.json"), str(workdir / "results.json"), "2"]
    started = subprocess.run(
        [*command, str(RUN_TIMEOUT_S)], check=False, cwd=workdir, env=env, capture_output=True, text=True
    )
    assert started.returncode == 0, started.stderr[-3000:]
    codes = json.loads((workdir / "results.json").read_text(encoding="utf-8"))
    results = {}
    for code, job, (key, out, _) in zip(codes, jobs, plan):
        stderr = Path(job["stderr"]).read_text(encoding="utf-8", errors="replace")
        assert code == 0, f"{key} failed (exit {code}):\n{stderr[-3000:]}"
        results[key] = json.loads(out.read_text(encoding="utf-8"))
    return results


def test_the_migration_imports_no_apex() -> None:
    source = migrate_source(SCRIPT.read_text(encoding="utf-8"), Options(device="cpu")).source
    tree = ast.parse(source)
    modules = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    modules += [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    assert not [name for name in modules if name.split(".")[0] == "apex"]


def test_each_wrapped_function_receives_the_dtypes_apex_gave_it(runs: dict[tuple[str, str], Any]) -> None:
    assert runs["original", "O1"]["seen"] == MIXED_DTYPES
    assert runs["migrated", "O1"]["seen"] == MIXED_DTYPES


def test_o0_passes_everything_through_in_float32(runs: dict[tuple[str, str], Any]) -> None:
    for which in ("original", "migrated"):
        seen = runs[which, "O0"]["seen"]
        assert seen == {name: ["torch.float32"] for name in MIXED_DTYPES}, which


def test_trains_like_the_original(runs: dict[tuple[str, str], Any]) -> None:
    for level in ("O1", "O0"):
        original, migrated = runs["original", level]["loss"], runs["migrated", level]["loss"]
        assert len(original) == len(migrated) == 30
        assert migrated == pytest.approx(original, rel=LOSS_REL_TOL), level
        assert sum(migrated[-5:]) < 0.5 * sum(migrated[:5]), f"{level}: the loss did not go down: {migrated}"
    assert set(runs["migrated", "O1"]["output_dtype"]) == set(runs["original", "O1"]["output_dtype"])
