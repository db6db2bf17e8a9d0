"""How long ``ampmigrate verify`` takes, phase by phase, on a small script.

A verify starts a fork server (it imports torch once), runs the original under the Apex shim
(with overflows planted), then the migration beside the two fp32 calibration runs, and judges.
This prints each phase's wall time for a cold verify (a new fork server, as the command line
does) and a warm one (a ``Session`` reused, as a test suite does), and the whole command line
``ampmigrate verify`` for comparison.

    python bench/verify_phases.py [--steps 20] [--repeat 3] [--script fixtures/verify/clip.original.py]

The migration compared is the tool's own (``migrate_source``) of the script.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from migrate.engine import migrate_source  # noqa: E402
from migrate.verify import Session  # noqa: E402

PHASES = ("startup", "original", "migrated", "judge", "total")
LABELS = {
    "startup": "fork server start (import torch)",
    "original": "original run (shim, overflows planted)",
    "migrated": "migration + 2 fp32 calibration runs",
    "judge": "judge",
    "total": "total",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--script", default=str(REPO / "fixtures" / "verify" / "clip.original.py"))
    options = parser.parse_args()

    original = Path(options.script)
    folder = Path(tempfile.mkdtemp(prefix="verify-bench-"))
    migrated = folder / "migrated.py"
    migrated.write_text(migrate_source(original.read_text(encoding="utf-8")).source, encoding="utf-8")
    print(f"{original.name} vs its migration, {options.steps} steps, {os.cpu_count()} cores, best of {options.repeat}")

    cold: dict[str, list[float]] = {phase: [] for phase in PHASES}
    for _ in range(options.repeat):
        with Session() as session:
            result = session.compare(original, migrated, steps=options.steps)
            assert result.matched, result.report()
            for phase in PHASES:
                cold[phase].append(result.timings[phase])
    warm: dict[str, list[float]] = {phase: [] for phase in PHASES}
    with Session() as session:
        session.compare(original, migrated, steps=options.steps)
        for index in range(options.repeat):
            # A new seed each time: a repeated original would come from the session's cache.
            result = session.compare(original, migrated, steps=options.steps, seed=index + 1)
            for phase in PHASES:
                warm[phase].append(result.timings[phase])
    cli, cpu = [], []
    for _ in range(options.repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "migrate", "verify", str(original), str(migrated), "--steps", str(options.steps)],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=False,
        )
        cli.append(time.perf_counter() - started)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        assert done.returncode == 0, done.stdout + done.stderr

    width = max(len(label) for label in LABELS.values())
    print(f"{'phase':<{width}}  {'cold (s)':>9}  {'warm (s)':>9}")
    for phase in PHASES:
        print(f"{LABELS[phase]:<{width}}  {min(cold[phase]):>9.2f}  {min(warm[phase]):>9.2f}")
    print(f"{'ampmigrate verify (whole command)':<{width}}  {min(cli):>9.2f}  (median {statistics.median(cli):.2f})")
    print(f"{'  CPU time of all its processes':<{width}}  {min(cpu):>9.2f}  (median {statistics.median(cpu):.2f})")
    load = os.getloadavg()[0]
    print(f"load average during the run: {load:.1f} (wall times grow with it; CPU time much less)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
