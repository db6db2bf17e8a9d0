"""Time `ampmigrate TREE --check` on a monorepo-sized tree beside two baselines.

The tree (generated, deterministic): 2,500 Python files, 500,000 lines, 2% of them
Apex training code. Baselines measured in the same run:
  - naive libcst: parse and regenerate every file with libcst, on all cores (what a
    codemod without a pre-filter pays);
  - grep -rl apex: the floor of reading every file once.

    python bench/tree.py [--files 2500] [--lines 200] [--apex-share 0.02] [--keep DIR]

Targets (issue 4): ampmigrate within 3 s on a 2-core machine, and at least 20x
faster than the naive libcst baseline.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

APEX_HEADER = '''"""Training entry point {index} (uses Apex amp)."""
import torch
import torch.nn as nn
from apex import amp


def train_{index}(model, loader, lr=0.1, opt_level="O1"):
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    model, optimizer = amp.initialize(model, optimizer, opt_level=opt_level)
    for inputs, targets in loader:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(inputs), targets)
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
    return model

'''

PLAIN_HEADER = '''"""Module {index}: ordinary model and data code, no mixed precision."""
import math
import os

import torch
import torch.nn as nn

'''

# One filler block is 10 lines; files are headers plus as many blocks as fit.
FILLER = '''

class Block{index}_{block}(nn.Module):
    """A residual block ({block})."""

    def __init__(self, width: int = {width}) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.scale = math.sqrt(width) + {block}  # keeps the output variance near one

    def forward(self, x):
        return x + torch.relu(self.linear(x)) / self.scale
'''


def generate(tree: Path, files: int, lines: int, apex_share: float) -> tuple[int, int, int]:
    """Write the tree; return (files, lines, files using Apex)."""
    every = max(1, round(1 / apex_share)) if apex_share > 0 else files + 1
    total_lines = apex_files = 0
    for index in range(files):
        uses_apex = index % every == every // 2
        header = (APEX_HEADER if uses_apex else PLAIN_HEADER).format(index=index)
        if uses_apex:
            header = header.replace("import torch\n", "import math\nimport torch\n", 1)
        parts = [header]
        count = header.count("\n")
        block = 0
        while count + 11 <= lines:
            chunk = FILLER.format(index=index, block=block, width=16 + block % 8)
            parts.append(chunk)
            count += chunk.count("\n")
            block += 1
        text = "".join(parts)
        path = tree / f"pkg{index // 100:02d}" / f"sub{index // 10 % 10}" / f"module_{index:05d}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        total_lines += text.count("\n")
        apex_files += uses_apex
    return files, total_lines, apex_files


def _libcst_roundtrip(path: str) -> int:
    import libcst

    source = Path(path).read_text()
    assert libcst.parse_module(source).code == source
    return source.count("\n")


def naive_libcst(tree: Path, jobs: int) -> float:
    paths = sorted(str(path) for path in tree.rglob("*.py"))
    start = time.perf_counter()
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        sum(pool.map(_libcst_roundtrip, paths, chunksize=16))
    return time.perf_counter() - start


def timed(command: list[str], expect: set[int]) -> tuple[float, float]:
    """Wall time and CPU time (user + system, worker processes included) of one run."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    env.pop("CI", None)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    completed = subprocess.run(
        command,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        check=False,
    )
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if completed.returncode not in expect:
        sys.exit(f"{' '.join(command)} exited {completed.returncode}: {completed.stderr[-2000:]}")
    return elapsed, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=2500)
    parser.add_argument("--lines", type=int, default=200, help="lines per file")
    parser.add_argument("--apex-share", type=float, default=0.02)
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="runs of ampmigrate and grep; the best is shown",
    )
    parser.add_argument("--keep", type=Path, help="generate the tree here and keep it")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="ampmigrate-bench-"))
    tree = args.keep or workdir / "tree"
    try:
        files, lines, apex_files = generate(tree, args.files, args.lines, args.apex_share)
        cores = os.cpu_count() or 1
        print(f"tree: {files} files, {lines} lines, {apex_files} use Apex; {cores} cores")
        ours = [sys.executable, "-m", "migrate", str(tree), "--check"]
        runs = {
            "ampmigrate TREE --check": (ours, {1}),
            "ampmigrate TREE --check -j1": ([*ours, "-j1"], {1}),
            "grep -rl apex TREE": (["grep", "-rl", "apex", str(tree)], {0}),
        }
        best = {name: min(timed(*run) for _ in range(args.repeat)) for name, run in runs.items()}
        naive = naive_libcst(tree, cores)
        print(f"load average before the naive baseline: {os.getloadavg()[0]:.2f}")
        for name, (wall, cpu) in best.items():
            print(f"{name:34} {wall:7.2f} s wall {cpu:7.2f} s cpu")
        rate = lines / naive
        print(f"{'naive libcst parse+regenerate':34} {naive:7.2f} s wall  ({rate:,.0f} lines/s, {cores} cores)")
        speedup = naive / best["ampmigrate TREE --check"][0]
        print(f"speed-up over naive libcst: {speedup:.1f}x (target >= 20x); target wall time <= 3 s")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
