"""Time one file as pre-commit runs it: `ampmigrate --check one_file.py`.

Two files: one without Apex (the common case: the pre-filter answers without
parsing) and one Apex training script. ampmigrate runs cold (an empty result cache:
the Apex file is parsed) and warm (the file unchanged since the last run: answered
from the cache, no libcst). Beside them, on the same files: pyupgrade and
`black --check` (install them for this bench only: pip install pyupgrade black), and
with --baseline-ref REF the ampmigrate of that git commit.

    python bench/precommit.py [--repeat 10] [--baseline-ref REF]

Targets (issue 4): at most 0.1 s without Apex, at most 0.5 s with it; (issue 11) a
warm run on the Apex file costs what the file without Apex does.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "train_amp.py"

PLAIN = '''"""A data-loading module with no mixed precision in sight."""
import os
from dataclasses import dataclass

import torch
from torch.utils.data import Dataset


@dataclass
class Sample:
    image: torch.Tensor
    label: int


class FolderDataset(Dataset):
    def __init__(self, root: str) -> None:
        self.paths = sorted(os.path.join(root, name) for name in os.listdir(root))

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> Sample:
        return Sample(torch.load(self.paths[index]), index % 10)
'''


def command_for(tool: str) -> list[str] | None:
    """How to start ``tool``; None if absent. ampmigrate runs from this checkout."""
    if tool.startswith(("ampmigrate", "before")):
        return [sys.executable, "-m", "migrate", "--check"]
    if tool == "pyupgrade":
        script = shutil.which("pyupgrade")
        return [script, "--py310-plus"] if script else None
    script = shutil.which("black")
    return [script, "--check", "--quiet"] if script else None


def wall_time(
    command: list[str], path: Path, repeat: int, code: Path = ROOT, cache: Path | None = None
) -> tuple[float, float]:
    """Median wall time and median CPU time (user + system, children included).

    ``code`` is the folder the ampmigrate package is imported from; ``cache`` a result
    cache kept from run to run (warm), else each run gets an empty one (cold).
    """
    walls, cpus = [], []
    for _ in range(repeat):
        run_cache = cache or Path(tempfile.mkdtemp(prefix="ampmigrate-cold-cache-"))
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(code), os.environ.get("PYTHONPATH")])),
            "AMPMIGRATE_CACHE_DIR": str(run_cache),
        }
        env.pop("PYTHONDONTWRITEBYTECODE", None)  # as installed: modules compiled once
        # Each run on a fresh copy: pyupgrade and black may rewrite or cache.
        copy = path.with_name("copy_" + path.name)
        shutil.copy(path, copy)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        # cwd: the temporary folder, not this checkout, whose migrate/ `python -m` would import
        subprocess.run([*command, str(copy)], env=env, cwd=path.parent, capture_output=True, check=False)
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        if cache is None:
            shutil.rmtree(run_cache, ignore_errors=True)
    return statistics.median(walls), statistics.median(cpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--repeat",
        type=int,
        default=10,
        help="runs per tool and file; the median is shown",
    )
    parser.add_argument("--baseline-ref", help="also time the ampmigrate of this git commit (e.g. HEAD~3)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ampmigrate-precommit-") as folder:
        plain = Path(folder) / "plain.py"
        plain.write_text(PLAIN)
        apex = Path(folder) / "train_amp.py"
        apex.write_text(EXAMPLE.read_text())
        warm_cache = Path(folder) / "warm-cache"
        tools: list[tuple[str, Path, Path | None]] = [
            ("ampmigrate cold", ROOT, None),
            ("ampmigrate warm", ROOT, warm_cache),
        ]
        if args.baseline_ref:
            baseline = Path(folder) / "baseline"
            baseline.mkdir()
            archive = subprocess.run(
                ["git", "archive", args.baseline_ref, "migrate"], cwd=ROOT, check=True, capture_output=True
            ).stdout
            subprocess.run(["tar", "-x", "-C", str(baseline)], input=archive, check=True)
            tools.append((f"before {args.baseline_ref}", baseline, None))
        tools += [("pyupgrade", ROOT, None), ("black", ROOT, None)]
        print(f"{'tool':22} {'without Apex (wall / cpu)':>28} {'with Apex (wall / cpu)':>28}")
        for tool, code, cache in tools:
            command = command_for(tool)
            if command is None:
                print(f"{tool:22} {'not installed':>28}")
                continue
            if cache is not None:  # warm: one run fills the cache
                for path in (plain, apex):
                    wall_time(command, path, 1, code, cache)
            cells = [wall_time(command, path, args.repeat, code, cache) for path in (plain, apex)]
            row = "".join(f"{f'{wall:.3f} s / {cpu:.3f} s':>29}" for wall, cpu in cells)
            print(f"{tool:22}{row}")
        print("targets for ampmigrate: <= 0.100 s without Apex, <= 0.500 s with it")


if __name__ == "__main__":
    main()
