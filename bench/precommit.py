"""Time one file as pre-commit runs it: `ampmigrate --check one_file.py`.

Two files: one without Apex (the common case: the pre-filter answers without
parsing) and one Apex training script. ampmigrate runs cold (an empty result cache:
the Apex file is parsed) and warm (the file unchanged since the last run: answered
from the cache, no libcst), each two ways:

  - checkout: `python -m migrate` from the source folder, with this interpreter. In a
    development environment that interpreter has the editable install's import hook
    (`__editable___ampmigrate_..._finder`), which `site` loads at every start (about
    20 ms, most of it pathlib and importlib.util): a cost users never pay;
  - installed: the `ampmigrate` script of a virtual environment made for this bench,
    with the package installed from a copy of the sources (not editable), as
    pre-commit installs a hook. Its dependencies are this interpreter's (a .pth file
    names its site-packages), so nothing is downloaded.

Beside them, on the same files: pyupgrade and `black --check` (install them for this
bench only: pip install pyupgrade black), and with --baseline-ref REF the ampmigrate of
that git commit, both ways.

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
import sysconfig
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
    """How to start ``tool``; None if absent. ampmigrate runs from a checkout (see wall_time)."""
    if tool.startswith(("ampmigrate", "before")):
        return [sys.executable, "-m", "migrate", "--check"]
    if tool == "pyupgrade":
        script = shutil.which("pyupgrade")
        return [script, "--py310-plus"] if script else None
    script = shutil.which("black")
    return [script, "--check", "--quiet"] if script else None


def install(sources: Path, venv: Path) -> list[str]:
    """A virtual environment with the package in ``sources`` installed (not editable) and
    this interpreter's site-packages for its dependencies; the command of its script."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(
        subprocess.run(
            [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    # Only the dependencies: a .pth line adds a folder, but not the .pth files in it (so
    # not this environment's editable hook, which would import the checkout instead).
    (site / "_bench_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(site),
            str(sources),
        ],
        check=True,
        capture_output=True,
    )
    # the console script the package declares (pip's --target leaves scripts out)
    import tomllib

    declared = tomllib.loads((sources / "pyproject.toml").read_text())["project"]["scripts"]["ampmigrate"]
    module, function = declared.split(":")
    script = venv / "bin" / "ampmigrate"
    script.write_text(
        f"#!{venv / 'bin' / 'python'}\nimport sys\nfrom {module} import {function}\nsys.exit({function}())\n"
    )
    script.chmod(0o755)
    return [str(script), "--check"]


def sources_of(ref: str | None, folder: Path) -> Path:
    """The files pip needs to build the package, at ``ref`` (None: this working tree), in ``folder``."""
    folder.mkdir()
    names = ["migrate", "pyproject.toml", "README.md"]
    if ref is None:
        for name in names:
            source = ROOT / name
            if source.is_dir():
                shutil.copytree(source, folder / name, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy(source, folder / name)
    else:
        archive = subprocess.run(["git", "archive", ref, *names], cwd=ROOT, check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return folder


def one_run(command: list[str], path: Path, code: Path | None = ROOT, cache: Path | None = None) -> tuple[float, float]:
    """Wall time and CPU time (user + system, children included) of one run on ``path``.

    ``code`` is the folder the ampmigrate package is imported from (None: where the
    command finds it, an installed copy); ``cache`` a result cache kept from run to run
    (warm), else the run gets an empty one (cold).
    """
    run_cache = cache or Path(tempfile.mkdtemp(prefix="ampmigrate-cold-cache-"))
    env = {**os.environ, "AMPMIGRATE_CACHE_DIR": str(run_cache)}
    if code is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(code), os.environ.get("PYTHONPATH")]))
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as installed: modules compiled once
    # Each run on a fresh copy: pyupgrade and black may rewrite or cache.
    copy = path.with_name("copy_" + path.name)
    shutil.copy(path, copy)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    # cwd: the temporary folder, not this checkout, whose migrate/ `python -m` would import
    subprocess.run([*command, str(copy)], env=env, cwd=path.parent, capture_output=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if cache is None:
        shutil.rmtree(run_cache, ignore_errors=True)
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


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
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="ampmigrate-precommit-") as name:
        folder = Path(name)
        plain = folder / "plain.py"
        plain.write_text(PLAIN)
        apex = folder / "train_amp.py"
        apex.write_text(EXAMPLE.read_text())
        # (row, command or None for command_for's, package folder for PYTHONPATH or None, warm)
        tools: list[tuple[str, list[str] | None, Path | None, bool]] = []
        for ref in [None, args.baseline_ref] if args.baseline_ref else [None]:
            label = "ampmigrate" if ref is None else f"before {ref}"
            sources = sources_of(ref, folder / f"sources-{ref or 'here'}")
            installed = install(sources, folder / f"venv-{ref or 'here'}")
            for warm in (False, True):
                state = "warm" if warm else "cold"
                tools.append((f"{label} {state} checkout", None, ROOT if ref is None else sources, warm))
                tools.append((f"{label} {state} installed", installed, None, warm))
        tools += [("pyupgrade", None, ROOT, False), ("black", None, ROOT, False)]
        runs: list[tuple[str, list[str], Path | None, Path | None]] = []  # tool, command, code, cache
        for index, (tool, command, code, warm) in enumerate(tools):
            command = command or command_for(tool)
            if command is None:
                continue
            cache = folder / f"warm-cache-{index}" if warm else None
            for path in (plain, apex):  # a first run compiles the modules (and fills a warm cache)
                one_run(command, path, code, cache)
            runs.append((tool, command, code, cache))
        # Round after round, each tool once on each file (the order reversed every other
        # round): a machine whose load changes during the bench slows every tool alike.
        times: dict[tuple[str, Path], list[tuple[float, float]]] = {}
        for number in range(args.repeat):
            for tool, command, code, cache in runs if number % 2 == 0 else runs[::-1]:
                for path in (plain, apex):
                    times.setdefault((tool, path), []).append(one_run(command, path, code, cache))
        print(f"{'tool':34} {'without Apex (wall / cpu)':>28} {'with Apex (wall / cpu)':>28}")
        for tool, _, _, _ in tools:
            if (tool, plain) not in times:
                print(f"{tool:34} {'not installed':>28}")
                continue
            cells = [
                (
                    statistics.median(wall for wall, _ in times[tool, path]),
                    statistics.median(cpu for _, cpu in times[tool, path]),
                )
                for path in (plain, apex)
            ]
            row = "".join(f"{f'{wall:.3f} s / {cpu:.3f} s':>29}" for wall, cpu in cells)
            print(f"{tool:34}{row}")
        print(
            f"medians of {args.repeat} runs each, interleaved; load average (1, 5, 15 min) before: "
            f"{', '.join(f'{value:.2f}' for value in load)}, after: {', '.join(f'{value:.2f}' for value in os.getloadavg())}"
        )
        print("targets for ampmigrate: <= 0.100 s without Apex, <= 0.500 s with it (cold)")
        print("checkout: python -m migrate with this interpreter (its editable-install hook included);")
        print("installed: the ampmigrate script of a non-editable install, as pre-commit runs it")


if __name__ == "__main__":
    main()
