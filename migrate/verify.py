"""``ampmigrate verify``: run the Apex original and its migration side by side, compare them.

The original runs under the Apex shim, the migration natively, each in its own subprocess
(``python -m migrate.shim.record``), with the same seed and arguments, for N optimizer steps.
Each run records, per step, the loss seen at ``amp.scale_loss`` / ``GradScaler.scale``, the
loss scale, whether the step was taken or skipped, and the norm of the stepped params. A third
run, the original with ``amp.initialize`` forced to O0 (fp32) and the same steps skipped,
calibrates the tolerance: two correct mixed-precision runs may differ by about as much as each
differs from fp32, so the per-step tolerance is ``FACTOR`` times the largest original-vs-fp32
difference seen so far (never below a floor).

Verdict: match (exit 0) when losses and param norms stay within tolerance, the loss scales and
skipped steps agree (when both scale once per step: Apex updates per backward pass, GradScaler
per step, so with several losses per step only the losses are judged) and both ran their
matmuls in the same precision;
diverge (exit 1) otherwise; error (exit 2) when a script fails.

This module does not import torch: everything torch-related runs in the subprocesses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["RunRecord", "VerifyResult", "compare", "run_cli"]

DEFAULT_STEPS = 20
DEFAULT_SEED = 0
DEFAULT_TIMEOUT_S = 600.0

#: A correct migration may differ from the original by up to this many times the
#: original-vs-fp32 difference (each mixed run is about that far from fp32, in any direction).
FACTOR = 4.0
#: Relative floors, for runs where mixed precision barely moves the numbers.
LOSS_FLOOR = 2e-3
NORM_FLOOR = 5e-4
#: Without a calibration run (no amp.initialize to force to O0): fixed relative tolerances.
UNCALIBRATED_LOSS_TOL = 5e-2
UNCALIBRATED_NORM_TOL = 1e-2
#: Largest allowed gap between the two runs' shares of matmul-class ops in fp16/bf16.
PRECISION_SHARE_TOL = 0.25

EXIT_MATCH, EXIT_DIVERGE, EXIT_ERROR = 0, 1, 2
_LOW_PRECISION = ("float16", "bfloat16")
CPU_NOTE = (
    "CUDA is not available: torch.autocast('cuda') ran as CPU autocast in float16 (torch's CPU "
    "op lists), GradScaler('cuda') as an enabled CPU GradScaler, .cuda()/.to('cuda') stayed on "
    "the CPU; Apex O1 casts ran on CPU tensors (a shim extension)"
)


@dataclass
class RunRecord:
    """What one recorded run produced."""

    label: str
    command: list[str]
    returncode: int
    stdout: str
    stderr: str
    meta: dict[str, Any] = field(default_factory=dict)
    steps: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.returncode != 0

    @property
    def skipped_steps(self) -> list[int]:
        return [record["step"] for record in self.steps if not record["taken"]]

    @property
    def low_precision_share(self) -> float | None:
        counts = self.summary.get("matmul_dtypes", {})
        total = sum(counts.values())
        if not total:
            return None
        return sum(counts.get(name, 0) for name in _LOW_PRECISION) / total

    @property
    def scales_once_per_step(self) -> bool:
        """Whether every step saw at most one loss-scaling call (Apex's cadence = torch's)."""
        return all(record.get("scale_calls", 0) <= 1 for record in self.steps)


@dataclass
class StepComparison:
    """One step of the two runs, with the tolerance applied to it."""

    step: int
    loss_diff: float | None
    loss_tol: float
    norm_diff: float | None
    norm_tol: float
    ok: bool


@dataclass
class VerifyResult:
    """The outcome of ``compare``: verdict, exit code, reasons and the runs behind them."""

    original: RunRecord
    migrated: RunRecord
    calibration: RunRecord | None
    verdict: str  # "match", "diverge" or "error"
    reasons: list[str]
    tolerance_note: str
    comparisons: list[StepComparison] = field(default_factory=list)
    original_path: str = ""
    migrated_path: str = ""
    requested_steps: int = DEFAULT_STEPS
    seed: int = DEFAULT_SEED

    @property
    def exit_code(self) -> int:
        return {"match": EXIT_MATCH, "diverge": EXIT_DIVERGE}.get(self.verdict, EXIT_ERROR)

    @property
    def matched(self) -> bool:
        return self.verdict == "match"

    def report(self) -> str:
        """The side-by-side table, notes and verdict, as printed by the CLI."""
        return _format_report(self)


def _relative_difference(a: float | None, b: float | None) -> float | None:
    """``|a-b| / max(|a|, |b|)``; 0 when both are missing (both non-finite), None when one is."""
    if a is None and b is None:
        return 0.0
    if a is None or b is None:
        return None
    scale = max(abs(a), abs(b), 1e-12)
    return abs(a - b) / scale


def _package_root() -> str:
    return str(Path(__file__).resolve().parent.parent)


def _record_command(
    script: str,
    script_args: Sequence[str],
    out: Path,
    *,
    apex: bool,
    fp32: bool,
    steps: int,
    seed: int,
    device: str,
    skip_steps: Sequence[int] = (),
) -> list[str]:
    cuda_on_cpu = {"auto": "auto", "cpu": "yes", "cuda": "no"}[device]
    command = [
        sys.executable,
        "-m",
        "migrate.shim.record",
        "--out",
        str(out),
        "--steps",
        str(steps),
        "--seed",
        str(seed),
        "--cuda-on-cpu",
        cuda_on_cpu,
    ]
    if apex:
        command.append("--apex")
    if fp32:
        command += [
            "--fp32",
            "--skip-steps",
            ",".join(str(step) for step in skip_steps),
        ]
    return [*command, str(Path(script).resolve()), *script_args]


def _environment(device: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_package_root(), env.get("PYTHONPATH")]))
    if device == "cpu":
        # Hide GPUs so that the CUDA-to-CPU mapping applies even on a CUDA machine.
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


class _PendingRun:
    """A recording subprocess in flight, in a scratch working directory of its own."""

    def __init__(self, label: str, command: list[str], out: Path, workdir: Path, device: str) -> None:
        self.label = label
        self.command = command
        self.out = out
        workdir.mkdir(parents=True, exist_ok=True)
        # Output goes to files, not pipes: a chatty script never blocks on a full pipe while
        # the other run is being waited for.
        self.stdout_path = out.with_suffix(".stdout")
        self.stderr_path = out.with_suffix(".stderr")
        with (
            open(self.stdout_path, "wb") as stdout,
            open(self.stderr_path, "wb") as stderr,
        ):
            self.process = subprocess.Popen(
                command,
                cwd=workdir,
                env=_environment(device),
                stdout=stdout,
                stderr=stderr,
            )

    def wait(self, timeout: float) -> RunRecord:
        try:
            returncode = self.process.wait(timeout=timeout)
            killed = ""
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            returncode, killed = (
                -9,
                f"\nampmigrate verify: killed after {timeout:.0f} s",
            )
        stdout = self.stdout_path.read_text(encoding="utf-8", errors="replace")
        stderr = self.stderr_path.read_text(encoding="utf-8", errors="replace") + killed
        record = RunRecord(self.label, self.command, returncode, stdout, stderr)
        if self.out.exists():
            for line in self.out.read_text(encoding="utf-8").splitlines():
                entry = json.loads(line)
                kind = entry.pop("kind")
                if kind == "meta":
                    record.meta = entry
                elif kind == "step":
                    record.steps.append(entry)
                elif kind == "summary":
                    record.summary = entry
        return record


def _tolerances(original: RunRecord, calibration: RunRecord | None, count: int) -> tuple[list[float], list[float], str]:
    """Per-step (loss, norm) tolerances and a sentence saying where they come from."""
    usable = (
        calibration is not None
        and not calibration.failed
        and calibration.summary.get("forced_o0", 0) > 0
        and len(calibration.steps) >= count
    )
    if not usable:
        if calibration is None:
            why = "not run"
        elif calibration.failed:
            why = "the fp32 run failed"
        elif not calibration.summary.get("forced_o0"):
            why = "the original never called amp.initialize"
        else:
            why = "the fp32 run recorded fewer steps"
        note = (
            f"fixed tolerance (no calibration: {why}): relative loss difference <= "
            f"{UNCALIBRATED_LOSS_TOL:g}, relative param-norm difference <= {UNCALIBRATED_NORM_TOL:g}"
        )
        return [UNCALIBRATED_LOSS_TOL] * count, [UNCALIBRATED_NORM_TOL] * count, note
    assert calibration is not None
    loss_tols, norm_tols = [], []
    worst_loss = worst_norm = 0.0
    for mixed, fp32 in zip(original.steps[:count], calibration.steps[:count]):
        loss_diff = _relative_difference(mixed["loss"], fp32["loss"])
        norm_diff = _relative_difference(mixed["param_norm"], fp32["param_norm"])
        worst_loss = max(worst_loss, loss_diff if loss_diff is not None else 0.0)
        worst_norm = max(worst_norm, norm_diff if norm_diff is not None else 0.0)
        loss_tols.append(max(LOSS_FLOOR, FACTOR * worst_loss))
        norm_tols.append(max(NORM_FLOOR, FACTOR * worst_norm))
    note = (
        f"calibrated against an fp32 run of the original (amp.initialize forced to O0, same "
        f"seed, same steps skipped): at each step a relative difference may reach {FACTOR:g}x "
        f"the largest original-vs-fp32 difference so far (loss: up to {worst_loss:.2e}, param "
        f"norm: up to {worst_norm:.2e}), never less than {LOSS_FLOOR:g} (loss) and "
        f"{NORM_FLOOR:g} (param norm)"
    )
    return loss_tols, norm_tols, note


def _judge(
    original: RunRecord, migrated: RunRecord, calibration: RunRecord | None
) -> tuple[str, list[str], str, list[StepComparison]]:
    reasons: list[str] = []
    if not original.steps and not migrated.steps:
        return "error", ["neither script reached an optimizer step"], "", []
    count = min(len(original.steps), len(migrated.steps))
    if len(original.steps) != len(migrated.steps):
        reasons.append(
            f"the original recorded {len(original.steps)} optimizer steps, the migration " f"{len(migrated.steps)}"
        )
    loss_tols, norm_tols, note = _tolerances(original, calibration, count)
    comparisons: list[StepComparison] = []
    for index in range(count):
        left, right = original.steps[index], migrated.steps[index]
        loss_diff = _relative_difference(left["loss"], right["loss"])
        norm_diff = _relative_difference(left["param_norm"], right["param_norm"])
        ok = (
            loss_diff is not None
            and loss_diff <= loss_tols[index]
            and norm_diff is not None
            and norm_diff <= norm_tols[index]
        )
        comparisons.append(StepComparison(index, loss_diff, loss_tols[index], norm_diff, norm_tols[index], ok))
    bad = [c for c in comparisons if not c.ok]
    if bad:
        first = bad[0]
        what = []
        if first.loss_diff is None or first.loss_diff > first.loss_tol:
            what.append(f"loss differs by {_fmt_diff(first.loss_diff)} > {first.loss_tol:.2e}")
        if first.norm_diff is None or first.norm_diff > first.norm_tol:
            what.append(f"param norm differs by {_fmt_diff(first.norm_diff)} > {first.norm_tol:.2e}")
        reasons.append(f"{len(bad)} of {count} steps outside tolerance, first at step {first.step}: " + "; ".join(what))
    same_cadence = original.scales_once_per_step and migrated.scales_once_per_step
    skipped_left = [s for s in original.skipped_steps if s < count]
    skipped_right = [s for s in migrated.skipped_steps if s < count]
    if skipped_left != skipped_right:
        text = f"skipped steps differ: original {skipped_left or 'none'}, migrated {skipped_right or 'none'}"
        if same_cadence:
            reasons.append(text)
        else:
            note += (
                f". Not judged: {text}; the original scales several losses per step, and Apex "
                "updates its scales per backward pass while GradScaler updates once per step"
            )
    if same_cadence:
        # Scales are compared only where both are dynamic: against a static Apex scale (O0,
        # O3, loss_scale=N) a scale value alone changes nothing unless it makes steps skip,
        # and skipped steps and their effect on the losses are judged above.
        both_dynamic = [
            index
            for index in range(count)
            if original.steps[index].get("dynamic") and migrated.steps[index].get("dynamic")
        ]
        scale_mismatch = [
            index for index in both_dynamic if original.steps[index]["scale"] != migrated.steps[index]["scale"]
        ]
        static = [
            index
            for index in range(count)
            if original.steps[index].get("dynamic") is False and migrated.steps[index].get("dynamic")
        ]
        if static:
            note += (
                ". The original's loss scale is static (Apex never skips a step with it), the "
                "migration's is a dynamic GradScaler: scales not compared"
            )
        if scale_mismatch:
            at = scale_mismatch[0]
            reasons.append(
                f"loss scale differs at {len(scale_mismatch)} steps, first at step {at}: "
                f"{_fmt_scale(original.steps[at]['scale'])} vs "
                f"{_fmt_scale(migrated.steps[at]['scale'])} (scaler state lost or updated "
                "at the wrong time?)"
            )
    share_left, share_right = original.low_precision_share, migrated.low_precision_share
    if share_left is not None and share_right is not None and abs(share_left - share_right) > PRECISION_SHARE_TOL:
        reasons.append(
            f"precision differs: {share_left:.0%} of the original's matmul/conv ops ran in "
            f"fp16/bf16, {share_right:.0%} of the migration's (autocast lost or added?)"
        )
    return ("diverge" if reasons else "match"), reasons, note, comparisons


def compare(
    original: str | os.PathLike[str],
    migrated: str | os.PathLike[str],
    *,
    steps: int = DEFAULT_STEPS,
    device: str = "auto",
    script_args: Sequence[str] = (),
    seed: int = DEFAULT_SEED,
    calibrate: bool = True,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> VerifyResult:
    """Run ORIGINAL under the Apex shim and MIGRATED natively; return the verdict.

    ``device`` is ``auto`` (CUDA when present, else CUDA mapped to the CPU in float16),
    ``cpu`` (CUDA mapped to the CPU even on a GPU machine) or ``cuda`` (a GPU is required).
    Each run starts in its own empty scratch directory, so relative paths in
    ``script_args`` must not point at the caller's files; give absolute paths.
    """
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device must be auto, cpu or cuda, not {device!r}")
    if steps < 1:
        raise ValueError("steps must be at least 1")
    original_path, migrated_path = str(original), str(migrated)
    with tempfile.TemporaryDirectory(prefix="ampmigrate-verify-") as scratch:
        root = Path(scratch)

        def start(label: str, script: str, **kwargs: Any) -> _PendingRun:
            out = root / f"{label}.jsonl"
            command = _record_command(
                script,
                script_args,
                out,
                steps=steps,
                seed=seed,
                device=device,
                **kwargs,
            )
            return _PendingRun(label, command, out, root / label, device)

        runs: list[_PendingRun] = []
        try:
            original_run = start("original", original_path, apex=True, fp32=False)
            runs.append(original_run)
            migrated_run = start("migrated", migrated_path, apex=False, fp32=False)
            runs.append(migrated_run)
            original_record = original_run.wait(timeout)
            calibration_run = None
            if calibrate and not original_record.failed:
                # Started once the original is done: it replays the original's skipped steps.
                calibration_run = start(
                    "fp32",
                    original_path,
                    apex=True,
                    fp32=True,
                    skip_steps=original_record.skipped_steps,
                )
                runs.append(calibration_run)
            migrated_record = migrated_run.wait(timeout)
            calibration_record = calibration_run.wait(timeout) if calibration_run else None
        finally:
            # Interrupted (Ctrl-C, timeout in a caller): leave no training run behind.
            for run in runs:
                if run.process.poll() is None:
                    run.process.kill()
                    run.process.wait()

    failures = [run for run in (original_record, migrated_record) if run.failed]
    if failures:
        verdict, note = "error", ""
        comparisons: list[StepComparison] = []
        reasons = [f"the {run.label} script failed (exit {run.returncode})" for run in failures]
    else:
        verdict, reasons, note, comparisons = _judge(original_record, migrated_record, calibration_record)
    return VerifyResult(
        original=original_record,
        migrated=migrated_record,
        calibration=calibration_record,
        verdict=verdict,
        reasons=reasons,
        tolerance_note=note,
        comparisons=comparisons,
        original_path=original_path,
        migrated_path=migrated_path,
        requested_steps=steps,
        seed=seed,
    )


def _fmt_diff(value: float | None) -> str:
    return "n/a (one side non-finite)" if value is None else f"{value:.2e}"


def _fmt_loss(value: float | None) -> str:
    return "non-finite" if value is None else f"{value:.6g}"


def _fmt_scale(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if value >= 1 and float(value).is_integer() else f"{value:g}"


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _format_report(result: VerifyResult) -> str:
    original, migrated = result.original, result.migrated
    lines = [
        (
            f"ampmigrate verify: {result.original_path} (under the Apex shim) vs "
            f"{result.migrated_path} (native), seed {result.seed}, up to "
            f"{result.requested_steps} optimizer steps"
        ),
    ]
    if original.meta.get("cuda_on_cpu") or migrated.meta.get("cuda_on_cpu"):
        lines.append(f"device: CPU. {CPU_NOTE}")
    elif original.meta.get("cuda"):
        lines.append("device: CUDA")
    if result.verdict == "error":
        for run in (original, migrated):
            if run.failed:
                lines += [
                    f"--- {run.label} script failed (exit {run.returncode}); its stderr:",
                    _tail(run.stderr),
                ]
        lines.append("verdict: ERROR (exit 2): " + "; ".join(result.reasons))
        return "\n".join(lines)

    header = (
        f"{'step':>4} {'opt':>3} | {'original loss':>13} {'scale':>7} {'step':>5} | "
        f"{'migrated loss':>13} {'scale':>7} {'step':>5} | {'loss diff':>9} {'tol':>8} | "
        f"{'norm diff':>9} {'tol':>8}"
    )
    lines += ["", header, "-" * len(header)]
    count = max(len(original.steps), len(migrated.steps))
    for index in range(count):
        left = original.steps[index] if index < len(original.steps) else None
        right = migrated.steps[index] if index < len(migrated.steps) else None
        comparison = result.comparisons[index] if index < len(result.comparisons) else None

        def side(record: dict[str, Any] | None) -> str:
            if record is None:
                return f"{'(no step)':>13} {'':>7} {'':>5}"
            taken = "took" if record["taken"] else "SKIP"
            return f"{_fmt_loss(record['loss']):>13} {_fmt_scale(record['scale']):>7} {taken:>5}"

        opt = (left or right or {}).get("optimizer", 0)
        row = f"{index:>4} {opt:>3} | {side(left)} | {side(right)} |"
        if comparison is not None:
            flag = "" if comparison.ok else "  <-- outside tolerance"
            row += (
                f" {_fmt_diff(comparison.loss_diff)[:9]:>9} {comparison.loss_tol:>8.1e} |"
                f" {_fmt_diff(comparison.norm_diff)[:9]:>9} {comparison.norm_tol:>8.1e}{flag}"
            )
        lines.append(row)
    lines.append("")
    for run in (original, migrated):
        counts = run.summary.get("matmul_dtypes", {})
        share = run.low_precision_share
        share_text = "n/a" if share is None else f"{share:.0%}"
        lines.append(
            f"{run.label}: matmul/conv ops by dtype {counts or '{}'} ({share_text} in fp16/bf16); "
            f"loss recorded at {', '.join(sorted({s['loss_source'] for s in run.steps})) or '-'}"
        )
    if result.calibration is not None and result.calibration.failed:
        lines.append(
            f"fp32 calibration run failed (exit {result.calibration.returncode}): {_tail(result.calibration.stderr, 5)}"
        )
    lines.append(f"tolerance: {result.tolerance_note}")
    if result.verdict == "match":
        lines.append("verdict: MATCH (exit 0): the migration trains like the original")
    else:
        lines.append("verdict: DIVERGE (exit 1):")
        lines += [f"  - {reason}" for reason in result.reasons]
    return "\n".join(lines)


def run_cli(original: str, migrated: str, steps: int, device: str, script_args: tuple[str, ...]) -> int:
    """Entry point of ``ampmigrate verify``: print the report, return the exit code (0/1/2)."""
    for path in (original, migrated):
        if not Path(path).is_file():
            print(f"ampmigrate verify: no such file: {path}")
            return EXIT_ERROR
    try:
        result = compare(original, migrated, steps=steps, device=device, script_args=script_args)
    except ValueError as error:
        print(f"ampmigrate verify: {error}")
        return EXIT_ERROR
    print(result.report())
    return result.exit_code
