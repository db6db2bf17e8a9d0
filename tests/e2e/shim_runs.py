"""Running an Apex original under the shim and its migration natively, for the e2e tests.

The original runs unmodified under ``python -m migrate.shim`` (Apex emulated in plain torch);
the migration runs with ``--native`` next to an ``apex`` package that raises on import, so a
migration that still needs Apex fails loudly instead of borrowing the shim's.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from migrate.engine import migrate_source
from migrate.options import Options

REPO = Path(__file__).resolve().parents[2]
POISON = "apex is not installed here (ampmigrate test)"
RUN_TIMEOUT_S = 180


def poison(folder: Path, *modules: str) -> None:
    """An ``apex`` package (and the top-level ``modules``, e.g. ``amp_C``) that fail on import."""
    (folder / "apex").mkdir()
    (folder / "apex" / "__init__.py").write_text(f"raise ImportError({POISON!r})\n", encoding="utf-8")
    for module in modules:
        (folder / f"{module}.py").write_text(f"raise ImportError({POISON!r})\n", encoding="utf-8")


def write_migration(script: Path, folder: Path, options: Options | None = None, *poisoned: str) -> Path:
    """The tool's migration of ``script`` as ``folder/migrated/train.py``, beside a poisoned apex."""
    migrated = folder / "migrated"
    migrated.mkdir()
    target = migrated / "train.py"
    result = migrate_source(script.read_text(encoding="utf-8"), options or Options())
    target.write_text(result.source, encoding="utf-8")
    poison(migrated, *poisoned)
    return target


def shim_env(**extra: str) -> dict[str, str]:
    """The environment of a shim run: one thread per process, this checkout importable."""
    return dict(
        os.environ,
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        **extra,
    )


def shim_command(script: Path, args: Sequence[str], out: Path, *, original: bool) -> list[str]:
    mode = [] if original else ["--native"]
    return [sys.executable, "-m", "migrate.shim", *mode, str(script), *args, "--out", str(out)]


def run_shim(
    script: Path,
    args: Sequence[str],
    out: Path,
    *,
    original: bool,
    env: dict[str, str] | None = None,
    timeout: float = RUN_TIMEOUT_S,
) -> subprocess.CompletedProcess[str]:
    """One run, in the folder of its metrics file."""
    return subprocess.run(
        shim_command(script, args, out, original=original),
        cwd=out.parent,
        env=env or shim_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def shim_metrics(
    script: Path,
    args: Sequence[str],
    out: Path,
    *,
    original: bool,
    env: dict[str, str] | None = None,
    timeout: float = RUN_TIMEOUT_S,
) -> dict[str, Any]:
    """The metrics one run writes; the run must succeed."""
    done = run_shim(script, args, out, original=original, env=env, timeout=timeout)
    which = "original" if original else "migrated"
    assert done.returncode == 0, f"{which} {script.name} {' '.join(args)} failed:\n{done.stderr[-4000:]}"
    metrics: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return metrics


def original_and_migrated_runs(
    script: Path, migrated: Path, runs: Mapping[str, Sequence[str]], folder: Path
) -> dict[tuple[str, bool], dict[str, Any]]:
    """Each run of ``runs`` (name -> arguments) on the original under the shim and on the
    migration, two processes at a time: (run name, original?) -> the metrics it wrote."""
    env = shim_env()
    jobs = [(name, original) for name in runs for original in (True, False)]
    results: dict[tuple[str, bool], dict[str, Any]] = {}
    for start in range(0, len(jobs), 2):
        running = []
        for name, original in jobs[start : start + 2]:
            out = folder / f"{name}-{'original' if original else 'migrated'}.json"
            command = shim_command(script if original else migrated, runs[name], out, original=original)
            process = subprocess.Popen(
                command, cwd=folder, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
            )
            running.append((name, original, out, process))
        for name, original, out, process in running:
            _, stderr = process.communicate(timeout=RUN_TIMEOUT_S)
            which = "original" if original else "migrated"
            assert process.returncode == 0, f"{which} {name} run failed:\n{stderr[-4000:]}"
            results[(name, original)] = json.loads(out.read_text(encoding="utf-8"))
    return results


def mixed_and_fp32_runs(script: Path, folder: Path) -> dict[str, dict[str, Any]]:
    """The script's migration written into ``folder``, then the original under the shim and the
    migration run with ``--fp16`` and without: ``original-mixed``, ``migrated-fp32``, ... -> metrics."""
    migrated = write_migration(script, folder)
    found = original_and_migrated_runs(script, migrated, {"mixed": ["--fp16"], "fp32": []}, folder)
    return {f"{'original' if original else 'migrated'}-{name}": metrics for (name, original), metrics in found.items()}


def imported_modules(source: str) -> list[str]:
    """The modules a source imports (``from X import y`` gives X), in the order ``ast.walk`` meets them."""
    return [
        (node.module or "") if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    ]
