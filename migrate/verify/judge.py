"""Judging two recorded runs: does the migration train like the original?

Three kinds of evidence, each judged by its own rule:

- **Precision.** Both runs must do their matmul/conv ops in the same precision, and a loss op
  that the original ran in float32 (Apex O1 and autocast both keep losses in float32) must not
  see float16 inputs in the migration.
- **Loss scaling.** The migration replays the original's skipped steps (as planted overflows), so
  both runs skip the same steps unless the migration's scaler does not skip at all. Its loss
  scale must then follow GradScaler's rule given those skips: one back-off per iteration with an
  overflow, one growth after each window of clean iterations, or a constant for a static Apex
  scale. Apex's per-loss, per-backward cadence is not the yardstick: the GradScaler rule is, so a
  GAN with three losses or gradient accumulation is judged by what a correct migration does.
- **Numerics.** Per step: the norm of the gradients the optimizer applied (after unscaling and
  clipping), the norm of its update, the loss (summed over micro-batches) and the norm of the
  params. The tolerance of each is calibrated on the original's own float16-vs-float32 noise.

Nothing here imports torch.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from migrate.verify.records import RunRecord, Step

#: The quantities compared per step, in the order a bug shows up in them.
QUANTITIES = ("grad_norm", "update_norm", "loss", "param_norm")
NAMES = {
    "grad_norm": "gradient norm (after unscaling)",
    "update_norm": "update norm",
    "loss": "loss",
    "param_norm": "parameter norm",
    "scale": "loss scale",
    "precision": "precision",
    "skip": "skipped steps",
    "order": "order of the optimizer steps",
    "steps": "number of steps",
}
SHORT = {"grad_norm": "grad", "update_norm": "update", "loss": "loss", "param_norm": "param"}

#: A difference may reach this many times the noise measured so far (two mixed-precision runs
#: each about that far from fp32, in any direction, and some room for how it grows).
FACTOR = 4.0
#: Never below this relative difference: float32 rounding (about 1e-7 per operation, more
#: through reductions) and clip_grad_norm_'s fixed eps of 1e-6, which a clip of still-scaled
#: gradients at a scaled threshold (AMP027) meets at another magnitude, differ below it.
RESOLUTION = 1e-5
#: The original and its fp32 calibration run at least this many steps, whatever is compared.
MIN_CALIBRATION_STEPS = 20
#: Without a calibration run: fixed relative tolerances.
UNCALIBRATED = {"grad_norm": 5e-2, "update_norm": 5e-2, "loss": 5e-2, "param_norm": 1e-2}
#: Largest allowed gap between the two runs' shares of matmul-class ops in fp16/bf16.
PRECISION_SHARE_TOL = 0.25


@dataclass
class Finding:
    """One reason the runs diverge: where, in what, and a likely cause."""

    kind: str  # precision, steps, order, skip, scale, numeric
    message: str
    step: int | None = None
    quantity: str | None = None
    hint: str = ""

    def text(self) -> str:
        return self.message + (f" ({self.hint})" if self.hint else "")


@dataclass
class Cell:
    """One quantity at one step."""

    original: float | None
    migrated: float | None
    diff: float | None  # relative; inf when one side is not finite; None when not compared
    tol: float

    @property
    def ok(self) -> bool:
        return self.diff is None or self.diff <= self.tol


@dataclass
class StepComparison:
    """One step of the two runs."""

    step: int
    original: Step | None
    migrated: Step | None
    expected_scale: float | None | str = "-"  # what GradScaler's rule gives; "-": not judged
    cells: dict[str, Cell] = field(default_factory=dict)
    flags: list[str] = field(default_factory=list)


@dataclass
class Tolerances:
    per_step: dict[str, list[float]]
    calibrated: bool
    note: str
    noise: dict[str, float] = field(default_factory=dict)


@dataclass
class Judgement:
    verdict: str  # match or diverge
    findings: list[Finding]
    comparisons: list[StepComparison]
    tolerances: Tolerances
    notes: list[str]
    #: Steps the migration skipped on a natural overflow, by GradScaler's rule, where the
    #: original did not: re-run the original with an overflow there to re-align.
    realign: list[int] = field(default_factory=list)


def relative_difference(a: float | None, b: float | None) -> float | None:
    """``|a-b| / max(|a|, |b|)``; None when either is missing; inf when one is not finite."""
    if a is None or b is None:
        return None
    finite_a, finite_b = math.isfinite(a), math.isfinite(b)
    if not finite_a or not finite_b:
        return 0.0 if not finite_a and not finite_b else math.inf
    scale = max(abs(a), abs(b))
    return 0.0 if scale == 0 else abs(a - b) / scale


# --- tolerances ---------------------------------------------------------------------------


def _calibration_problem(calibration: RunRecord | None, count: int, what: str) -> str | None:
    if calibration is None:
        return f"no fp32 run of the {what}"
    if calibration.failed:
        return f"the fp32 run of the {what} failed (exit {calibration.returncode})"
    if len(calibration.steps) < count:
        return f"the fp32 run of the {what} recorded {len(calibration.steps)} steps, fewer than {count}"
    return None


def _noise(mixed: RunRecord, fp32: RunRecord, quantity: str) -> list[float | None]:
    """Relative mixed-vs-fp32 difference per step, while both runs skipped the same steps."""
    series: list[float | None] = []
    for left, right in zip(mixed.steps, fp32.steps):
        if left.taken != right.taken:
            break  # the runs parted for another reason than precision: no more noise measured
        series.append(relative_difference(left.value(quantity), right.value(quantity)))
    return series


def _running_tolerance(noise: list[float | None], count: int) -> list[float]:
    """``FACTOR`` times the largest noise so far (at least its median over the run), per step."""
    finite = [value for value in noise if value is not None and math.isfinite(value)]
    positive = [value for value in finite if value > 0]
    # The floor: the typical noise of the whole run, so that a step whose noise happens to be
    # tiny is not judged more strictly than the run's precision allows.
    typical = statistics.median(positive) if positive else 0.0
    running = 0.0
    tols = []
    for index in range(count):
        value = noise[index] if index < len(noise) else None
        if value is not None and math.isfinite(value):
            running = max(running, value)
        tols.append(FACTOR * max(running, typical))
    return tols


def tolerances(
    original: RunRecord,
    calibration: RunRecord | None,
    count: int,
    migrated: RunRecord | None = None,
    migrated_calibration: RunRecord | None = None,
) -> Tolerances:
    """Per-step tolerances for each quantity, calibrated on both runs' float16-vs-float32 noise.

    By the triangle inequality a correct migration differs from the original by at most the
    original's distance to its fp32 run plus the migration's distance to its own (the two fp32
    runs agree when the migration is correct). Each fp32 run keeps everything but precision (the
    same skipped steps, the migration's GradScaler and whatever it does right or wrong), so a
    bug that is not about precision is not counted as noise. The original's noise is measured
    over every step it ran (``MIN_CALIBRATION_STEPS`` at least), the migration's while its fp32
    run skips the same steps.
    """
    problem = _calibration_problem(calibration, count, "original")
    if not calibration or problem is None and not calibration.forced_fp32:
        problem = problem or "the original has no amp.initialize, FP16_Optimizer or .half() to force to fp32"
    if problem is not None:
        note = f"fixed tolerances (no calibration: {problem}): " + ", ".join(
            f"{NAMES[q]} {UNCALIBRATED[q]:g}" for q in QUANTITIES
        )
        return Tolerances({q: [UNCALIBRATED[q]] * count for q in QUANTITIES}, False, note)
    assert calibration is not None
    use_migrated = migrated is not None and _calibration_problem(migrated_calibration, count, "migration") is None
    per_step: dict[str, list[float]] = {}
    noise: dict[str, float] = {}
    for quantity in QUANTITIES:
        tols = _running_tolerance(_noise(original, calibration, quantity), count)
        if use_migrated:
            assert migrated is not None and migrated_calibration is not None
            own = _running_tolerance(_noise(migrated, migrated_calibration, quantity), count)
            tols = [a + b for a, b in zip(tols, own)]
        per_step[quantity] = [max(tol, RESOLUTION) for tol in tols]
        noise[quantity] = max(per_step[quantity], default=0.0) / FACTOR
    both = "both runs'" if use_migrated else "the original's"
    sources = "an fp32 run of each (amp.initialize forced to O0 for the original, autocast off for the migration"
    if not use_migrated:
        why = _calibration_problem(migrated_calibration, count, "migration") if migrated is not None else "not run"
        sources = f"an fp32 run of the original (amp.initialize forced to O0; the migration's: {why}"
    note = (
        f"calibrated on {both} own float16-vs-float32 noise ({sources}; .half() a no-op; same seed, "
        f"same steps skipped): at each step a relative difference may reach {FACTOR:g}x the sum of "
        f"the largest noise so far (at least {FACTOR:g}x its median), never below {RESOLUTION:g}. "
        "Largest tolerance: " + ", ".join(f"{SHORT[q]} {FACTOR * noise[q]:.1e}" for q in QUANTITIES)
    )
    return Tolerances(per_step, True, note, noise)


# --- loss scaling --------------------------------------------------------------------------

UNSCALED = "unscaled"  # expected: no loss scaling (no GradScaler, a disabled one, or scale 1)


def iterations(steps: Sequence[Step]) -> list[list[int]]:
    """Group steps into iterations: a new one starts when an optimizer steps again."""
    groups: list[list[int]] = []
    seen: set[int] = set()
    for position, step in enumerate(steps):
        if not groups or step.optimizer in seen:
            groups.append([])
            seen = set()
        groups[-1].append(position)
        seen.add(step.optimizer)
    return groups


@dataclass
class ScaleRule:
    """What a correct migration's GradScaler shows at each step, given the original's skips."""

    expected: list[float | str]
    kind: str  # dynamic, static, unscaled
    initial: float | None
    window: int | None


def scale_rule(original: RunRecord) -> ScaleRule:
    steps = original.steps
    scaled = [step for step in steps if step.scales]
    if not scaled:
        return ScaleRule([UNSCALED] * len(steps), "unscaled", None, None)
    first = scaled[0]
    initial = first.scales[0]
    if initial is None:
        return ScaleRule([UNSCALED] * len(steps), "unscaled", None, None)
    if first.dynamic is False:
        value: float | str = UNSCALED if initial == 1.0 else initial
        return ScaleRule([value] * len(steps), "static", initial, None)
    apex = original.first_scaler("apex")
    window = int(apex["window"]) if apex and apex.get("window") else 2000
    expected: list[float | str] = [0.0] * len(steps)
    scale, clean = initial, 0
    for group in iterations(steps):
        for position in group:
            expected[position] = scale
        if any(not steps[position].taken for position in group):
            scale, clean = scale * 0.5, 0
        else:
            clean += 1
            if clean == window:
                scale, clean = scale * 2.0, 0
    return ScaleRule(expected, "dynamic", initial, window)


def _scale_matches(expected: float | str, scales: Sequence[float | None]) -> bool:
    if expected == UNSCALED:
        return all(scale is None or scale == 1.0 for scale in scales)
    if not scales:
        return False
    return all(scale is not None and math.isclose(scale, float(expected), rel_tol=1e-9) for scale in scales)


def _fmt_scale(value: float | str | None) -> str:
    if value is None:
        return "disabled"
    if isinstance(value, str):
        return value
    return f"{value:.0f}" if value >= 1 and float(value).is_integer() else f"{value:g}"


def _scale_finding(
    position: int, rule: ScaleRule, original: RunRecord, migrated: RunRecord, got: Sequence[float | None]
) -> Finding:
    expected = rule.expected[position]
    shown = "/".join(_fmt_scale(scale) for scale in dict.fromkeys(got)) if got else "no loss scaling"
    last_skip = max((s.index for s in original.steps[:position] if not s.taken), default=None)
    recreated = [int(s["step"]) for s in migrated.scalers if s.get("impl") == "GradScaler" and int(s["step"]) > 0]
    if expected == UNSCALED:
        message = f"the migration scales its loss by {shown} at step {position}; the original has no loss scaling"
        hint = "O0, loss_scale=1.0 or amp disabled: the migration's GradScaler must be disabled (enabled=False)"
        return Finding("scale", message, position, "scale", hint)
    message = (
        f"loss scale at step {position} is {shown} in the migration; GradScaler's rule gives " f"{_fmt_scale(expected)}"
    )
    if rule.kind == "static":
        message += f" (the original's loss scale is static: {_fmt_scale(rule.initial)})"
        if not got or got[0] is None:
            hint = "loss scaling lost"
        else:
            hint = "a static loss scale turned dynamic? keep it with init_scale=S and update(new_scale=S)"
        return Finding("scale", message, position, "scale", hint)
    if last_skip is not None:
        message += f" after the overflow at step {last_skip}"
    values = [scale for scale in got if scale is not None]
    if not values:
        hint = "the migration does not scale its loss: GradScaler missing or disabled"
    elif recreated and values[0] == rule.initial:
        hint = (
            f"a new GradScaler was created at step {recreated[0]} and lost the scale: re-created "
            "every iteration, or its state not saved and restored (scaler.state_dict())?"
        )
    elif values[0] == rule.initial and float(expected) != rule.initial:
        hint = "the scaler is back at its initial scale: its state was lost (re-created, or not restored?)"
    elif values[0] > float(expected):
        hint = "it did not back off: scaler.update() missing, or the scaler re-created?"
    else:
        hint = "it backed off or grew at the wrong time: scaler.update() called more than once per iteration?"
    return Finding("scale", message, position, "scale", hint)


# --- numerics --------------------------------------------------------------------------------


def _numeric_hint(quantity: str, cells: dict[str, Cell]) -> str:
    cell = cells[quantity]
    if cell.migrated is not None and not math.isfinite(cell.migrated):
        return "non-finite in the migration"
    if quantity == "grad_norm" and cell.original and cell.migrated:
        ratio = cell.migrated / cell.original
        if ratio > 64:
            return (
                f"the gradients the optimizer applied are {ratio:.3g} times the original's, about the loss "
                "scale: still scaled when it stepped (the step does not go through scaler.step?)"
            )
        if ratio < 1 / 64:
            return (
                f"the gradients the optimizer applied are {1 / ratio:.3g} times smaller than the original's: "
                "clipped while still scaled (scaler.unscale_(optimizer) missing before the clip?)"
            )
        return "the gradients differ: how they are scaled, accumulated or clipped differs"
    if quantity in ("update_norm", "param_norm") and cells["grad_norm"].ok:
        return "same gradients, different update: the optimizer differs (torch.optim.Adam's L2 weight decay for FusedAdam's AdamW?)"
    if quantity == "loss":
        return "the forward pass or the loss differs"
    return ""


def _compare_numbers(
    position: int, left: Step, right: Step, tols: Tolerances, comparison: StepComparison
) -> Finding | None:
    first_bad: str | None = None
    for quantity in QUANTITIES:
        a, b = left.value(quantity), right.value(quantity)
        if quantity in ("grad_norm", "update_norm") and not (left.taken and right.taken):
            diff = None
        else:
            diff = relative_difference(a, b)
        cell = Cell(a, b, diff, tols.per_step[quantity][position])
        comparison.cells[quantity] = cell
        if not cell.ok and first_bad is None:
            first_bad = quantity
    if first_bad is None:
        return None
    cell = comparison.cells[first_bad]
    message = (
        f"{NAMES[first_bad]} at step {position}: {_fmt_value(cell.migrated)} in the migration, "
        f"{_fmt_value(cell.original)} in the original (relative difference {_fmt_value(cell.diff)} > "
        f"tolerance {cell.tol:.1e})"
    )
    return Finding("numeric", message, position, first_bad, _numeric_hint(first_bad, comparison.cells))


def _fmt_value(value: float | None) -> str:
    if value is None:
        return "-"
    if not math.isfinite(value):
        return str(value)
    return f"{value:.6g}" if 1e-3 <= abs(value) < 1e6 or value == 0 else f"{value:.3e}"


# --- precision --------------------------------------------------------------------------------


def precision_findings(original: RunRecord, migrated: RunRecord) -> list[Finding]:
    findings = []
    left, right = original.low_precision_share, migrated.low_precision_share
    if left is not None and right is not None and abs(left - right) > PRECISION_SHARE_TOL:
        if right < left:
            hint = "autocast lost: the forward pass runs in float32"
        elif left == 0:
            hint = "the original runs in float32 (O0, or amp disabled): the migration must not autocast"
        else:
            hint = "autocast added where the original ran in float32"
        findings.append(
            Finding(
                "precision",
                f"precision differs: {left:.0%} of the original's matmul/conv ops ran in float16/bfloat16, "
                f"{right:.0%} of the migration's",
                hint=hint,
            )
        )
    original_losses, migrated_losses = original.loss_op_shares(), migrated.loss_op_shares()
    for op, share in sorted(migrated_losses.items()):
        if op in original_losses and original_losses[op] < 0.05 and share > 0.5:
            findings.append(
                Finding(
                    "precision",
                    f"the loss op {op} ran on float16 inputs in the migration ({share:.0%} of its calls), "
                    "on float32 in the original",
                    hint="the loss is computed outside torch.autocast: does autocast end before the loss?",
                )
            )
    return findings


# --- the verdict ------------------------------------------------------------------------------

# Within a step: the loss scale explains a skip, a skip explains the numbers.
_KIND_ORDER = {"order": 0, "scale": 1, "skip": 2, "numeric": 3, "steps": 4}


def judge(
    original: RunRecord,
    migrated: RunRecord,
    calibration: RunRecord | None,
    migrated_calibration: RunRecord | None = None,
    *,
    steps: int | None = None,
    realign_allowed: bool = True,
) -> Judgement:
    """Compare the first ``steps`` steps of the two runs; see the module docstring."""
    findings: list[Finding] = precision_findings(original, migrated)
    notes: list[str] = []
    limit = steps if steps is not None else max(len(original.steps), len(migrated.steps))
    original_count, migrated_count = min(len(original.steps), limit), min(len(migrated.steps), limit)
    count = min(original_count, migrated_count)
    tols = tolerances(original, calibration, count, migrated, migrated_calibration)
    rule = scale_rule(original)
    comparisons: list[StepComparison] = []
    realign: list[int] = []
    judged_until = count
    for position in range(count):
        left, right = original.steps[position], migrated.steps[position]
        comparison = StepComparison(position, left, right)
        comparisons.append(comparison)
        comparison.expected_scale = rule.expected[position]
        if left.optimizer != right.optimizer:
            findings.append(
                Finding(
                    "order",
                    f"step {position} steps optimizer {right.optimizer} in the migration, "
                    f"optimizer {left.optimizer} in the original",
                    position,
                    hint="the optimizers step in a different order",
                )
            )
            comparison.flags.append("order")
        scale_ok = _scale_matches(rule.expected[position], right.scales)
        if not scale_ok:
            findings.append(_scale_finding(position, rule, original, migrated, right.scales))
            comparison.flags.append("scale")
        if left.taken and not right.taken:
            natural = right.skip == "overflow" and not right.injected
            if natural and scale_ok and rule.kind == "dynamic":
                # Legitimate: the same scale as GradScaler's rule gives, and the grads of this
                # migration overflowed where the original's did not. The runs part here; a
                # re-run re-aligns them, unless the runs already diverged.
                if findings or not realign_allowed:
                    notes.append(
                        f"the migration overflowed at step {position} (loss scale {_fmt_scale(right.scales[0])}, "
                        "GradScaler's rule) where the original did not: steps after it are not compared"
                    )
                else:
                    realign.append(position)
                comparison.flags.append("realign")
                judged_until = position
                break
            findings.append(
                Finding(
                    "skip",
                    f"the migration skipped step {position}, the original took it",
                    position,
                    hint="a forced skip" if right.skip == "forced" else "an overflow only the migration had",
                )
            )
            comparison.flags.append("skip")
        elif not left.taken and right.taken:
            why = "a planted overflow" if left.injected else "an overflow"
            if not right.finite_grads or (right.param_norm is not None and not math.isfinite(right.param_norm)):
                message = (
                    f"the migration applied non-finite gradients at step {position}, which the original skipped ({why})"
                )
                hint = "no GradScaler.step for this optimizer, or loss scaling lost"
            else:
                message = f"the migration took step {position}, which the original skipped ({why})"
                hint = "the step does not go through GradScaler.step"
            findings.append(Finding("skip", message, position, hint=hint))
            comparison.flags.append("skip")
        numeric = _compare_numbers(position, left, right, tols, comparison)
        if numeric is not None:
            findings.append(numeric)
            comparison.flags.append("numeric")
    if judged_until == count and original_count != migrated_count:
        findings.append(
            Finding(
                "steps",
                f"the original recorded {original_count} optimizer steps ({original.stopped}), "
                f"the migration {migrated_count} ({migrated.stopped})",
                count,
            )
        )
    findings.sort(
        key=lambda f: (
            f.step is not None,
            f.step if f.step is not None else -1,
            _KIND_ORDER.get(f.kind, 9),
            QUANTITIES.index(f.quantity) if f.quantity in QUANTITIES else 0,
        )
    )
    verdict = "diverge" if findings else "match"
    return Judgement(verdict, findings, comparisons, tols, notes, realign)
