"""Running the original, its migration and the calibration, and putting the result together.

The order matters: the original runs first, with overflows planted at a few steps; then the
migration, given an overflow at every step the original skipped, runs beside the two fp32
calibration runs, of the original and of the migration (which skip the same steps). If the
migration overflowed on
its own where the original did not, while its scale follows GradScaler's rule (possible with
several losses or accumulation, where Apex's scales move at another cadence), the runs parted
legitimately: the original is run again with an overflow at that step too, and so on, a few
rounds at most.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from migrate.verify.judge import MIN_CALIBRATION_STEPS, Finding, Judgement, StepComparison, Tolerances, judge
from migrate.verify.launch import Handle, Launcher, RunSpec, base_environment, default_launcher
from migrate.verify.records import RunRecord

DEFAULT_STEPS = 20
DEFAULT_SEED = 0
DEFAULT_TIMEOUT_S = 600.0
#: The growth window both scalers use in a verify run (instead of 2000) when overflows are on.
GROWTH_INTERVAL = 4
#: Runs of the original at most (the first, and re-runs to re-align after a legitimate skip).
MAX_ROUNDS = 3

EXIT_MATCH, EXIT_DIVERGE, EXIT_ERROR = 0, 1, 2
_SKIP_DIRS = {".git", "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache", "node_modules", ".tox"}


#: Where overflows are planted: early (1 and 4: steps of both parities, so that with two
#: optimizers each gets one), then at 11 and every 15 steps. Never step 0, often a natural
#: overflow already. The schedule does not depend on --steps, so a short verify and a longer one
#: of the same original share its runs.
FIRST_OVERFLOWS = (1, 4, 11)
OVERFLOW_PERIOD = 15


def default_overflow_steps(steps: int) -> list[int]:
    """The steps below ``steps`` at which overflows are planted by default."""
    planted = [step for step in FIRST_OVERFLOWS if step < steps]
    step = FIRST_OVERFLOWS[-1] + OVERFLOW_PERIOD
    while step < steps:
        planted.append(step)
        step += OVERFLOW_PERIOD
    return planted


@dataclass
class Target:
    """What to run for one side: a script, from a copy of its project folder or on its own."""

    path: Path  # the file or folder given
    script: Path  # the file to run (inside ``path`` for a project)
    tree: Path | None  # the project folder, copied for each run

    def fingerprint(self) -> str:
        digest = hashlib.sha256()
        files = [self.script] if self.tree is None else sorted(_project_files(self.tree))
        for file in files:
            stat = file.stat()
            digest.update(f"{file}:{stat.st_mtime_ns}:{stat.st_size}\n".encode())
        return digest.hexdigest()


def _project_files(tree: Path) -> list[Path]:
    found = []
    for root, dirs, names in os.walk(tree):
        dirs[:] = [d for d in dirs if d not in _SKIP_DIRS and not (Path(root, d) / "pyvenv.cfg").exists()]
        found += [Path(root, name) for name in names if not name.endswith(".pyc")]
    return found


def _find_entry(tree: Path) -> str:
    candidates = sorted(
        path.name for path in tree.glob("*.py") if "__main__" in path.read_text(encoding="utf-8", errors="replace")
    )
    if len(candidates) != 1:
        listed = ", ".join(candidates) or "no top-level script with a __main__ block"
        raise ValueError(f"{tree} is a folder: name the script to run with --entry ({listed})")
    return candidates[0]


def resolve(
    original: str | os.PathLike[str], migrated: str | os.PathLike[str], entry: str | None
) -> tuple[Target, Target, str | None]:
    """Two files, or two project folders and the entry script both run."""
    left, right = Path(original), Path(migrated)
    for path in (left, right):
        if not path.exists():
            raise ValueError(f"no such file or folder: {path}")
    if left.is_dir() != right.is_dir():
        raise ValueError("give two files or two folders, not one of each")
    if left.is_file():
        if entry:
            raise ValueError("--entry is for two project folders")
        return Target(left, left.resolve(), None), Target(right, right.resolve(), None), None
    entry = entry or _find_entry(left)
    targets = []
    for path in (left, right):
        script = (path / entry).resolve()
        if not script.is_file():
            raise ValueError(f"the entry script {entry} is not in {path}")
        targets.append(Target(path, script, path.resolve()))
    return targets[0], targets[1], entry


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class VerifyResult:
    """The outcome of ``compare``: the verdict, why, and the runs behind it."""

    verdict: str  # match, diverge or error
    original: RunRecord | None
    migrated: RunRecord | None
    calibration: RunRecord | None
    migrated_calibration: RunRecord | None = None
    findings: list[Finding] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    comparisons: list[StepComparison] = field(default_factory=list)
    tolerances: Tolerances | None = None
    notes: list[str] = field(default_factory=list)
    original_path: str = ""
    migrated_path: str = ""
    entry: str | None = None
    requested_steps: int = DEFAULT_STEPS
    seed: int = DEFAULT_SEED
    device: str = "auto"
    overflow: bool = True
    planted: list[int] = field(default_factory=list)
    growth_interval: int | None = None
    rounds: int = 1
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return {"match": EXIT_MATCH, "diverge": EXIT_DIVERGE}.get(self.verdict, EXIT_ERROR)

    @property
    def matched(self) -> bool:
        return self.verdict == "match"

    @property
    def reasons(self) -> list[str]:
        return [finding.text() for finding in self.findings] or list(self.errors)

    def report(self) -> str:
        from migrate.verify.report import format_report

        return format_report(self)

    def to_json(self) -> dict[str, Any]:
        from migrate.verify.report import to_json

        return to_json(self)


@dataclass(frozen=True)
class _Settings:
    steps: int
    device: str
    script_args: tuple[str, ...]
    seed: int
    timeout: float
    growth_interval: int | None


class Session:
    """Runs verifies with one launcher (one torch import for all) and reuses original runs.

    The original and its calibration depend only on the original, its arguments and the
    overflows planted in it, so several migrations of one original share them. Close the
    session (or use it as a context manager) to stop the fork server.
    """

    def __init__(self, launcher: Launcher | None = None) -> None:
        self._launcher = launcher
        self._own_launcher = launcher is None
        self._cache: dict[tuple[Any, ...], tuple[RunRecord, RunRecord | None]] = {}
        self._scratch = Path(tempfile.mkdtemp(prefix="ampmigrate-verify-"))
        self._counter = 0
        self.startup_s = 0.0

    @property
    def launcher(self) -> Launcher:
        if self._launcher is None:
            start = time.perf_counter()
            self._launcher = default_launcher()
            self.startup_s = time.perf_counter() - start
        return self._launcher

    def close(self) -> None:
        if self._launcher is not None and self._own_launcher:
            self._launcher.close()
            self._launcher = None
        shutil.rmtree(self._scratch, ignore_errors=True)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # --- one run ----------------------------------------------------------------------------

    def _start(
        self, label: str, target: Target, settings: _Settings, *, apex: bool, extra: Sequence[str] = ()
    ) -> tuple[Handle, Path]:
        self._counter += 1
        folder = self._scratch / f"{self._counter:03d}-{label.replace(' ', '-')}"
        folder.mkdir(parents=True)
        paths: list[str] = []
        script = target.script
        cwd = folder / "work"
        if target.tree is not None:
            # A copy per run: the runs write checkpoints and logs, and never into the user's tree.
            shutil.copytree(
                target.tree,
                cwd,
                ignore=lambda root, names: [
                    n for n in names if n in _SKIP_DIRS or n.endswith(".pyc") or (Path(root, n) / "pyvenv.cfg").exists()
                ],
            )
            script = cwd / target.script.relative_to(target.tree)
            paths.append(str(cwd))
        else:
            cwd.mkdir()
        out = folder / "record.jsonl"
        argv = [
            "--out",
            str(out),
            "--steps",
            str(settings.steps),
            "--seed",
            str(settings.seed),
            "--cuda-on-cpu",
            {"auto": "auto", "cpu": "yes", "cuda": "no"}[settings.device],
        ]
        if apex:
            argv.append("--apex")
        if settings.growth_interval:
            argv += ["--growth-interval", str(settings.growth_interval)]
        for path in paths:
            argv += ["--path", path]
        argv += [*extra, str(script), *settings.script_args]
        env = base_environment()
        if settings.device == "cpu":
            # Hide GPUs so that the CUDA-to-CPU mapping applies even on a CUDA machine.
            env["CUDA_VISIBLE_DEVICES"] = ""
        # Single-process torch.distributed (gloo): a port of its own for each run, since runs
        # happen side by side.
        env.update(
            {
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(_free_port()),
                "WORLD_SIZE": "1",
                "RANK": "0",
                "LOCAL_RANK": "0",
            }
        )
        spec = RunSpec(label, argv, cwd, env, folder / "stdout.txt", folder / "stderr.txt")
        return self.launcher.start(spec), out

    @staticmethod
    def _finish(handle: Handle, out: Path, timeout: float, started: float) -> RunRecord:
        code = handle.wait(timeout)
        spec = handle.spec
        record = RunRecord.read(spec.label, spec.command, code, out, spec.stdout, spec.stderr)
        if code == -9:
            record.stderr += f"\nampmigrate verify: killed after {timeout:.0f} s"
        record.wall_s = time.perf_counter() - started
        return record

    # --- a verify -------------------------------------------------------------------------------

    def compare(
        self,
        original: str | os.PathLike[str],
        migrated: str | os.PathLike[str],
        *,
        steps: int = DEFAULT_STEPS,
        device: str = "auto",
        script_args: Sequence[str] = (),
        seed: int = DEFAULT_SEED,
        entry: str | None = None,
        overflow: bool = True,
        overflow_at: Sequence[int] | None = None,
        calibrate: bool = True,
        timeout: float = DEFAULT_TIMEOUT_S,
    ) -> VerifyResult:
        """See ``migrate.verify.compare``."""
        if device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be auto, cpu or cuda, not {device!r}")
        if steps < 1:
            raise ValueError("steps must be at least 1")
        began = time.perf_counter()
        left, right, entry = resolve(original, migrated, entry)
        settings = _Settings(steps, device, tuple(script_args), seed, timeout, GROWTH_INTERVAL if overflow else None)
        # The original and its calibration run longer than compared when the verify is short:
        # the tolerances come from their noise, and a few steps of it are not enough.
        reference = dataclasses.replace(settings, steps=max(steps, MIN_CALIBRATION_STEPS))
        planted = sorted(set(overflow_at)) if overflow_at is not None else default_overflow_steps(reference.steps)
        if not overflow:
            planted = []
        result = VerifyResult(
            "error",
            None,
            None,
            None,
            original_path=str(original),
            migrated_path=str(migrated),
            entry=entry,
            requested_steps=steps,
            seed=seed,
            device=device,
            overflow=overflow,
            planted=[step for step in planted if step < steps],
            growth_interval=settings.growth_interval,
        )
        launcher_started = time.perf_counter()
        _ = self.launcher
        timings = {"startup": time.perf_counter() - launcher_started, "original": 0.0, "migrated": 0.0, "judge": 0.0}
        inject = list(planted)
        judgement: Judgement | None = None
        handles: list[Handle] = []
        try:
            for round_ in range(1, MAX_ROUNDS + 1):
                result.rounds = round_
                started = time.perf_counter()
                key = (left.fingerprint(), str(left.script), reference, tuple(inject), calibrate)
                cached = self._cache.get(key)
                if cached is None:
                    handle, out = self._start("original", left, reference, apex=True, extra=["--inject", _ints(inject)])
                    handles.append(handle)
                    original_record = self._finish(handle, out, timeout, started)
                else:
                    original_record = cached[0]
                timings["original"] += time.perf_counter() - started
                result.original = original_record
                if original_record.failed:
                    result.errors.append(f"the original script failed (exit {original_record.returncode})")
                    return self._done(result, timings, began)
                # The migration and both calibration runs, side by side.
                started = time.perf_counter()
                skips = original_record.skipped
                replay = [
                    "--replay",
                    ",".join(f"{step}:{kind}" for step, kind in sorted(skips.items()) if step < steps),
                ]
                pending: dict[str, tuple[Handle, Path]] = {
                    "migrated": self._start("migrated", right, settings, apex=False, extra=replay)
                }
                if calibrate:
                    pending["migrated fp32"] = self._start(
                        "migrated fp32", right, settings, apex=False, extra=[*replay, "--fp32"]
                    )
                    if cached is None:
                        pending["original fp32"] = self._start(
                            "original fp32", left, reference, apex=True, extra=["--fp32", "--force-skip", _ints(skips)]
                        )
                handles += [handle for handle, _ in pending.values()]
                records = {
                    label: self._finish(handle, out, timeout, started) for label, (handle, out) in pending.items()
                }
                timings["migrated"] += time.perf_counter() - started
                calibration = records.get("original fp32", cached[1] if cached else None)
                if cached is None:
                    self._cache[key] = (original_record, calibration)
                migrated_record = records["migrated"]
                result.migrated, result.calibration = migrated_record, calibration
                result.migrated_calibration = records.get("migrated fp32")
                if migrated_record.failed:
                    result.errors.append(f"the migrated script failed (exit {migrated_record.returncode})")
                    return self._done(result, timings, began)
                if not original_record.steps and not migrated_record.steps:
                    result.errors.append("neither script reached an optimizer step")
                    return self._done(result, timings, began)
                started = time.perf_counter()
                judgement = judge(
                    original_record,
                    migrated_record,
                    calibration,
                    result.migrated_calibration,
                    steps=steps,
                    realign_allowed=round_ < MAX_ROUNDS,
                )
                timings["judge"] += time.perf_counter() - started
                if not judgement.realign or round_ == MAX_ROUNDS:
                    break
                inject = sorted(set(inject) | set(judgement.realign))
                result.notes.append(
                    f"the migration overflowed on its own at step(s) {_ints(judgement.realign)} with the loss "
                    "scale GradScaler's rule gives, where the original did not: the original was run again "
                    "with an overflow there, to compare the same steps"
                )
        finally:
            # Interrupted or failed part way: leave no training run behind.
            for handle in handles:
                handle.kill()
        assert judgement is not None
        result.verdict = judgement.verdict
        result.findings = judgement.findings
        result.comparisons = judgement.comparisons
        result.tolerances = judgement.tolerances
        result.notes += judgement.notes
        return self._done(result, timings, began)

    @staticmethod
    def _done(result: VerifyResult, timings: dict[str, float], began: float) -> VerifyResult:
        timings["total"] = time.perf_counter() - began
        result.timings = timings
        return result


def _ints(values: Sequence[int] | dict[int, str]) -> str:
    return ",".join(str(value) for value in sorted(values))


def compare(
    original: str | os.PathLike[str],
    migrated: str | os.PathLike[str],
    *,
    steps: int = DEFAULT_STEPS,
    device: str = "auto",
    script_args: Sequence[str] = (),
    seed: int = DEFAULT_SEED,
    entry: str | None = None,
    overflow: bool = True,
    overflow_at: Sequence[int] | None = None,
    calibrate: bool = True,
    timeout: float = DEFAULT_TIMEOUT_S,
    session: Session | None = None,
) -> VerifyResult:
    """Run ORIGINAL under the Apex shim and MIGRATED natively; return the verdict.

    ORIGINAL and MIGRATED are two scripts, or two project folders both run through ``entry``
    (a path inside each; found on its own when the original has one top-level script with a
    ``__main__`` block). ``device`` is ``auto`` (CUDA when present, else CUDA mapped to the CPU
    in float16), ``cpu`` (mapped even on a GPU machine) or ``cuda`` (a GPU is required).
    ``overflow`` plants an overflow at ``overflow_at`` (default: steps 1, 4, 11, then every 15th) and
    shortens the scalers' growth window, so that skipping, back-off and growth are compared.
    A single script runs in an empty scratch folder (give absolute paths in ``script_args``);
    a project runs in a scratch copy of its folder. Pass a ``Session`` to share one torch import
    and the original's runs between several verifies.
    """
    if session is not None:
        return session.compare(
            original,
            migrated,
            steps=steps,
            device=device,
            script_args=script_args,
            seed=seed,
            entry=entry,
            overflow=overflow,
            overflow_at=overflow_at,
            calibrate=calibrate,
            timeout=timeout,
        )
    with Session() as own:
        return own.compare(
            original,
            migrated,
            steps=steps,
            device=device,
            script_args=script_args,
            seed=seed,
            entry=entry,
            overflow=overflow,
            overflow_at=overflow_at,
            calibrate=calibrate,
            timeout=timeout,
        )
