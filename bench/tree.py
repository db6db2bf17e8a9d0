"""Time `ampmigrate TREE --check` on two trees beside baselines, all in the same run.

Trees:
  - synthetic (generated, deterministic): 2,500 Python files, 500,000 lines, 2% of them
    Apex training code;
  - real: NVIDIA's DeepLearningExamples at a fixed commit (2,592 .py files, 56 with
    Apex), never committed here. Give a checkout with --real PATH, or let the script
    clone it into the user cache folder (needs git and the network); without either it
    says so and times the synthetic tree only.

Rows, for each tree:
  - ampmigrate cold: --check with an empty result cache (every file that passes the
    byte pre-filter is parsed; the results are stored);
  - ampmigrate warm: the same again (answered from the cache: no parsing, no libcst);
  - ampmigrate --no-cache -j1;
  - before (with --baseline-ref REF, repeatable): the ampmigrate of that git commit, cold
    and warm (its own cache folder);
  - ruff check --select UP --no-cache (when ruff is installed): a fast linter's time to
    read and parse every file;
  - grep -rl apex: the floor of reading every file once;
  - naive libcst: parse and regenerate every file with libcst, on all cores (what a
    codemod without a pre-filter pays).

    python bench/tree.py [--repeat 3] [--real PATH] [--baseline-ref REF] [--files 2500] [--keep DIR]

Targets (issue 11): cold within 3x of ruff and at least 20x faster than naive libcst on
the real tree; warm within 2x of grep.
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
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REAL_REPOSITORY = "https://github.com/NVIDIA/DeepLearningExamples.git"
REAL_COMMIT = "729963dd47e7c8bd462ad10bfac7a7b0b604e6dd"  # [TSPP] 24.03 Release

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


def real_tree(given: Path | None) -> Path | None:
    """DeepLearningExamples at REAL_COMMIT: the given checkout, else a cached clone."""
    if given is not None:
        if not given.is_dir():
            sys.exit(f"--real {given}: no such folder")
        return given
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ampmigrate-bench"
    checkout = cache / f"DeepLearningExamples-{REAL_COMMIT[:8]}"
    if (checkout / ".done").exists():
        return checkout
    if shutil.which("git") is None:
        print("real tree: skipped (no git to fetch DeepLearningExamples; or give --real PATH)")
        return None
    print(f"real tree: fetching {REAL_REPOSITORY} at {REAL_COMMIT[:8]} into {checkout} ...")
    shutil.rmtree(checkout, ignore_errors=True)
    try:
        checkout.mkdir(parents=True)
        for command in (
            ["git", "init", "-q"],
            ["git", "fetch", "-q", "--depth", "1", REAL_REPOSITORY, REAL_COMMIT],
            ["git", "checkout", "-q", "FETCH_HEAD"],
        ):
            subprocess.run(command, cwd=checkout, check=True, capture_output=True, timeout=1800)
    except (OSError, subprocess.SubprocessError) as error:
        shutil.rmtree(checkout, ignore_errors=True)
        print(f"real tree: skipped (cannot fetch it: {error}; or give --real PATH)")
        return None
    shutil.rmtree(checkout / ".git", ignore_errors=True)  # its .gitignore files still count
    (checkout / ".done").touch()
    return checkout


def baseline_checkout(ref: str, workdir: Path) -> Path:
    """The ampmigrate package of git commit ``ref``, extracted for a side-by-side run."""
    target = workdir / f"baseline-{ref.replace('/', '_')}"
    target.mkdir()
    archive = subprocess.run(["git", "archive", ref, "migrate"], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target


def _libcst_roundtrip(path: str) -> int:
    import libcst

    try:
        source = Path(path).read_text(encoding="utf-8")
        assert libcst.parse_module(source).code == source
    except Exception:  # a real tree has files libcst or UTF-8 refuse: they cost a try too
        return 0
    return source.count("\n")


def _libcst_parse_candidate(path: str) -> int:
    """Parse ``path`` with libcst only if the tool's byte pre-filter selects it."""
    sys.path.insert(0, str(ROOT))
    import libcst

    from migrate.prefilter import may_need_migration

    data = Path(path).read_bytes()
    if not may_need_migration(data):
        return 0
    try:
        libcst.parse_module(data.decode("utf-8"))
    except Exception:
        return 0
    return 1


def libcst_pool(tree: Path, jobs: int, work: Callable[[str], int]) -> tuple[float, int]:
    """Wall time of ``work`` over every .py file of ``tree`` on ``jobs`` processes, and its sum."""
    paths = sorted(str(path) for path in tree.rglob("*.py"))
    start = time.perf_counter()
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        total = sum(pool.map(work, paths, chunksize=16))
    return time.perf_counter() - start, total


def timed(
    command: list[str], expect: set[int], env: dict[str, str], before: str | None = None, cwd: Path | None = None
) -> tuple[float, float]:
    """Wall time and CPU time (user + system, worker processes included) of one run.

    ``before``, a shell command, runs first and is not timed (emptying a cache). ``cwd``
    must not hold a ``migrate`` package: ``python -m`` imports from there first.
    """
    if before:
        subprocess.run(before, shell=True, check=True)
    start_usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    completed = subprocess.run(command, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - start
    end_usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    if completed.returncode not in expect:
        sys.exit(f"{' '.join(command)} exited {completed.returncode}: {completed.stderr[-2000:]}")
    cpu = end_usage.ru_utime - start_usage.ru_utime + end_usage.ru_stime - start_usage.ru_stime
    return elapsed, cpu


def environment(pythonpath: Path, cache: Path) -> dict[str, str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(pythonpath), os.environ.get("PYTHONPATH")])),
        "AMPMIGRATE_CACHE_DIR": str(cache),
    }
    env.pop("CI", None)
    # As installed: modules compiled once to __pycache__, not on every run.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def bench_tree(name: str, tree: Path, args: argparse.Namespace, workdir: Path, baselines: dict[str, Path]) -> None:
    cores = os.cpu_count() or 1
    cache = workdir / f"cache-{name}"
    ours = [sys.executable, "-m", "migrate", str(tree), "--check"]
    # --check exits 1 (work to do) or 2 (some files do not parse: real trees have a few)
    check = {0, 1, 2}
    empty_cache = f"rm -rf '{cache}'"
    runs: dict[str, tuple[list[str], set[int], dict[str, str], str | None]] = {
        "ampmigrate --check (cold)": (ours, check, environment(ROOT, cache), empty_cache),
        "ampmigrate --check (warm)": (ours, check, environment(ROOT, cache), None),
        "ampmigrate --check --no-cache -j1": ([*ours, "--no-cache", "-j1"], check, environment(ROOT, cache), None),
    }
    for ref, baseline in baselines.items():
        # its own cache folder, emptied for the cold row
        before_cache = workdir / f"cache-{name}-{ref.replace('/', '_')}"
        before_env = environment(baseline, before_cache)
        runs[f"before ({ref}) --check (cold)"] = (ours, check, before_env, f"rm -rf '{before_cache}'")
        runs[f"before ({ref}) --check (warm)"] = (ours, check, before_env, None)
    ruff = shutil.which("ruff")
    if ruff:
        runs["ruff check --select UP --no-cache"] = (
            [ruff, "check", "--select", "UP", "--no-cache", "--exit-zero", "--quiet", str(tree)],
            {0},
            dict(os.environ),
            None,
        )
    runs["grep -rl apex"] = (["grep", "-rl", "apex", str(tree)], {0, 1}, dict(os.environ), None)
    if args.warm_only:
        for label in [label for label in runs if "(cold)" in label]:
            timed(*runs.pop(label)[:4], cwd=workdir)  # fills the cache the warm row reads
        runs = {label: run for label, run in runs.items() if "(warm)" in label or label == "grep -rl apex"}
    # Interleaved repeats, so that a burst of load on a shared machine hits every row alike.
    best: dict[str, tuple[float, float]] = {}
    for _ in range(args.repeat):
        for label, (command, expect, env, before) in runs.items():
            wall, cpu = timed(command, expect, env, before, cwd=workdir)
            if label not in best or wall < best[label][0]:
                best[label] = (wall, cpu)
    print(f"\n{name}: load average {os.getloadavg()[0]:.2f}, {cores} cores, best of {args.repeat}")
    for label, (wall, cpu) in best.items():
        print(f"  {label:40} {wall:7.2f} s wall {cpu:7.2f} s cpu")
    if args.warm_only:
        warm, grep = best["ampmigrate --check (warm)"][0], best["grep -rl apex"][0]
        print(f"  warm: {warm / grep:.2f}x grep's time (target <= 2x)")
        for ref in baselines:
            before_warm = best[f"before ({ref}) --check (warm)"][0]
            print(f"  vs {ref}: warm {before_warm / warm:.2f}x faster ({before_warm / grep:.2f}x grep's time)")
        return
    naive, _ = libcst_pool(tree, cores, _libcst_roundtrip)
    print(f"  {'naive libcst parse+regenerate':40} {naive:7.2f} s wall")
    # What no libcst codemod can go below: parsing the files that may need migrating (each
    # of them must be parsed to be rewritten), without discovery, planning or rewriting.
    floor, candidates = libcst_pool(tree, cores, _libcst_parse_candidate)
    print(f"  {f'libcst parse of the {candidates} pre-filtered':40} {floor:7.2f} s wall")
    cold, warm = best["ampmigrate --check (cold)"][0], best["ampmigrate --check (warm)"][0]
    grep = best["grep -rl apex"][0]
    print(f"  cold: {naive / cold:.1f}x faster than naive libcst (target >= 20x", end="")
    print(f"; parsing the pre-filtered files alone is {naive / floor:.1f}x faster)", end="")
    if ruff:
        ruff_wall = best["ruff check --select UP --no-cache"][0]
        print(
            f"; {cold / ruff_wall:.2f}x ruff's time (target <= 3x; that parse alone: {floor / ruff_wall:.2f}x)", end=""
        )
    print(f"\n  warm: {warm / grep:.2f}x grep's time (target <= 2x)")
    cold_cpu = best["ampmigrate --check (cold)"][1]
    for ref in baselines:
        before_cold, before_warm = best[f"before ({ref}) --check (cold)"][0], best[f"before ({ref}) --check (warm)"][0]
        before_cpu = best[f"before ({ref}) --check (cold)"][1]
        # CPU time too: on a shared machine wall time follows the other processes' load
        print(
            f"  vs {ref}: cold {before_cold / cold:.2f}x faster ({before_cpu / cold_cpu:.2f}x less cpu), "
            f"warm {before_warm / warm:.2f}x faster"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=2500)
    parser.add_argument("--lines", type=int, default=200, help="lines per file")
    parser.add_argument("--apex-share", type=float, default=0.02)
    parser.add_argument("--repeat", type=int, default=3, help="runs of each row; the best is shown")
    parser.add_argument("--keep", type=Path, help="generate the synthetic tree here and keep it")
    parser.add_argument("--real", type=Path, help="a checkout of NVIDIA/DeepLearningExamples at " + REAL_COMMIT[:8])
    parser.add_argument("--no-real", action="store_true", help="time the synthetic tree only")
    parser.add_argument("--no-synthetic", action="store_true", help="time the real tree only")
    parser.add_argument(
        "--warm-only",
        action="store_true",
        help="time only the warm rows and grep (one untimed cold run fills each cache): minutes less on a busy machine",
    )
    parser.add_argument(
        "--baseline-ref",
        action="append",
        default=[],
        help="also time the ampmigrate of this git commit (e.g. HEAD~3), cold and warm; may be repeated",
    )
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="ampmigrate-bench-"))
    try:
        baselines = {ref: baseline_checkout(ref, workdir) for ref in args.baseline_ref}
        if not args.no_synthetic:
            tree = args.keep or workdir / "tree"
            files, lines, apex_files = generate(tree, args.files, args.lines, args.apex_share)
            print(f"synthetic tree: {files} files, {lines} lines, {apex_files} use Apex")
            bench_tree("synthetic", tree, args, workdir, baselines)
        real = None if args.no_real else real_tree(args.real)
        if real is not None:
            python_files = sum(1 for _ in real.rglob("*.py"))
            print(f"\nreal tree: DeepLearningExamples at {REAL_COMMIT[:8]} ({python_files} .py files), {real}")
            bench_tree("DeepLearningExamples", real, args, workdir, baselines)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
