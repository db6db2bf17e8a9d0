"""The verify report: a plain-language verdict first, then the evidence; and its JSON form."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from migrate.verify.judge import NAMES, QUANTITIES, SHORT, UNSCALED, Cell, Finding, StepComparison, _fmt_scale
from migrate.verify.records import RunRecord, Step

if TYPE_CHECKING:
    from migrate.verify.session import VerifyResult

CPU_NOTE = (
    "CUDA is not available: torch.autocast('cuda') ran as CPU autocast in float16 (torch's CPU "
    "op lists, not CUDA's), GradScaler('cuda') as an enabled CPU GradScaler, .cuda()/.to('cuda') "
    "stayed on the CPU; Apex O1 casts ran on CPU tensors (a shim extension)"
)
#: Findings listed after the first one, at most.
MORE_FINDINGS = 6


def _steps_text(steps: list[int]) -> str:
    if not steps:
        return "none"
    return ", ".join(str(step) for step in steps)


def headline(result: VerifyResult) -> str:
    """The first line: the answer, in words."""
    if result.verdict == "error":
        return f"ERROR: {'; '.join(result.errors)}: nothing was compared (exit 2)."
    if result.verdict == "match":
        steps = len(result.comparisons)
        return f"MATCH: the migration trains like the original ({steps} optimizer steps compared; exit 0)."
    first = result.findings[0]
    return f"DIVERGE: {first.text()} (exit 1)."


def _fmt_loss(value: float | None) -> str:
    if value is None:
        return "-"
    if not math.isfinite(value):
        return str(value)
    return f"{value:.6g}"


def _scales(step: Step | None) -> str:
    if step is None:
        return ""
    if not step.scales:
        return "-"
    return "/".join(_fmt_scale(scale) for scale in dict.fromkeys(step.scales))


def _took(step: Step | None) -> str:
    if step is None:
        return ""
    if step.taken:
        return "took"
    return "SKIP*" if step.injected else "SKIP"


def _cell(cell: Cell | None) -> str:
    if cell is None or cell.diff is None:
        return "-"
    mark = "" if cell.ok else " !"
    diff = "inf" if math.isinf(cell.diff) else ("0" if cell.diff == 0 else f"{cell.diff:.1e}")
    return f"{diff} ({cell.tol:.0e}){mark}"


def _table(comparisons: list[StepComparison], original: RunRecord, migrated: RunRecord, requested: int) -> list[str]:
    header = [
        "step",
        "opt",
        "orig loss",
        "migr loss",
        "orig scale",
        "migr scale",
        "rule",
        "orig",
        "migr",
        *(f"{SHORT[q]} diff (tol)" for q in QUANTITIES),
        "",
    ]
    rows: list[list[str]] = []
    for comparison in comparisons:
        left, right = comparison.original, comparison.migrated
        either = left or right
        expected = comparison.expected_scale
        rule = "" if expected == "-" else ("none" if expected == UNSCALED else _fmt_scale(expected))
        scale_mark = " !" if "scale" in comparison.flags else ""
        flag = ""
        if comparison.flags:
            bad = [SHORT[q] for q in QUANTITIES if q in comparison.cells and not comparison.cells[q].ok]
            flag = "<- " + ", ".join([f for f in comparison.flags if f != "numeric"] + bad)
        rows.append(
            [
                str(comparison.step),
                str(either.optimizer) if either else "",
                _fmt_loss(left.loss if left else None),
                _fmt_loss(right.loss if right else None),
                _scales(left),
                _scales(right) + scale_mark,
                rule,
                _took(left),
                _took(right),
                *(_cell(comparison.cells.get(q)) for q in QUANTITIES),
                flag,
            ]
        )
    # Steps (up to --steps) only one run recorded.
    for position in range(len(comparisons), min(requested, max(len(original.steps), len(migrated.steps)))):
        left = original.steps[position] if position < len(original.steps) else None
        right = migrated.steps[position] if position < len(migrated.steps) else None
        step = left or right
        assert step is not None
        rows.append(
            [
                str(position),
                str(step.optimizer),
                _fmt_loss(left.loss) if left else "(none)",
                _fmt_loss(right.loss) if right else "(none)",
                _scales(left),
                _scales(right),
                "",
                _took(left),
                _took(right),
                *("-" for _ in QUANTITIES),
                "<- not compared",
            ]
        )
    widths = [max(len(row[index]) for row in [header, *rows]) for index in range(len(header))]
    right_aligned = {0, 1, 2, 3, 4, 5, 6}

    def line(cells: list[str]) -> str:
        parts = [cell.rjust(widths[i]) if i in right_aligned else cell.ljust(widths[i]) for i, cell in enumerate(cells)]
        return "  ".join(parts).rstrip()

    out = [line(header), "-" * len(line(header))]
    out += [line(row) for row in rows]
    return out


def _run_line(role: str, path: str, how: str, run: RunRecord | None, requested: int, compared: int) -> str:
    if run is None:
        return f"{role}: {path}, {how}: not run"
    recorded = len(run.steps)
    stopped = run.stopped
    if run.summary.get("stopped") in ("end", "exit") and recorded < requested:
        stopped += f" before --steps {requested}"
    elif run.summary.get("stopped") == "limit":
        stopped = f"stopped at {'--steps ' if recorded == requested else ''}{recorded}"
    text = f"{role}: {path}, {how}: {recorded} optimizer steps ({stopped})"
    if recorded > compared:
        text += f"; {compared} compared, all {recorded} calibrate the tolerances"
    return text


def format_report(result: VerifyResult) -> str:
    """The report printed by ``ampmigrate verify``."""
    lines = [headline(result)]
    if result.verdict == "diverge":
        groups = grouped_findings(result.findings)
        first_steps = groups[0][1]
        if len(first_steps) > 1:
            lines.append(f"  the same at step(s) {_steps_text(first_steps[1:])}")
        for finding, steps in groups[1 : 1 + MORE_FINDINGS]:
            where = f" (and at step(s) {_steps_text(steps[1:])})" if len(steps) > 1 else ""
            lines.append(f"  also: {finding.text()}{where}")
        if len(groups) > 1 + MORE_FINDINGS:
            lines.append(f"  ... and {len(groups) - 1 - MORE_FINDINGS} more kinds of difference")
    lines.append("")
    entry = f", entry {result.entry}" if result.entry else ""
    compared = len(result.comparisons)
    for role, path, how, run in (
        ("original", result.original_path, "under the Apex shim", result.original),
        ("migrated", result.migrated_path, "native torch.amp", result.migrated),
    ):
        lines.append(_run_line(role, path + entry, how, run, result.requested_steps, compared))
    meta = (result.original.meta if result.original else {}) or (result.migrated.meta if result.migrated else {})
    if meta.get("cuda_on_cpu"):
        lines.append(f"device: CPU. {CPU_NOTE}")
    elif meta.get("cuda"):
        lines.append("device: CUDA")
    if result.verdict == "error":
        for run in (result.original, result.migrated):
            if run is not None and run.failed:
                tail = "\n".join(run.stderr.rstrip().splitlines()[-40:])
                lines += [f"--- {run.label} script failed (exit {run.returncode}); its stderr:", tail]
        return "\n".join(lines)
    assert result.original is not None and result.migrated is not None
    skipped = sorted(step for step in result.original.skipped if step < result.requested_steps)
    if result.planted:
        lines.append(
            f"overflows: planted at step(s) {_steps_text(result.planted)} of the original (an inf in one "
            f"gradient; a static or disabled scale skips the step instead); the original skipped "
            f"{_steps_text(skipped)}, and the migration was given an overflow at "
            "each of those steps (SKIP* in the table)"
        )
    elif result.overflow:
        lines.append("overflows: none planted (the run is too short)")
    else:
        lines.append(f"overflows: none planted (--no-overflow); the original skipped {_steps_text(skipped)}")
    if result.growth_interval:
        lines.append(
            f"growth: both scalers grow after {result.growth_interval} clean iterations instead of 2000, "
            "so that growth happens in a short run"
        )
    lines += ["", *_table(result.comparisons, result.original, result.migrated, result.requested_steps)]
    lines.append(
        "loss: the losses scaled since the previous step, summed (micro-batches included); scale: the "
        "loss scale each loss was scaled by; rule: what GradScaler's rule gives, from the original's "
        "skips; diff: relative difference (tolerance); ! outside tolerance"
    )
    lines.append("")
    for run in (result.original, result.migrated):
        counts = run.summary.get("matmul_dtypes", {})
        share = run.low_precision_share
        share_text = "n/a" if share is None else f"{share:.0%}"
        losses = run.summary.get("loss_op_dtypes", {})
        lines.append(
            f"{run.label}: matmul/conv ops by dtype {counts or '{}'} ({share_text} in float16/bfloat16); "
            f"loss ops {losses or '{}'}"
        )
    calibration = result.calibration
    if calibration is not None and calibration.failed:
        tail = "\n".join(calibration.stderr.rstrip().splitlines()[-5:])
        lines.append(f"fp32 calibration run failed (exit {calibration.returncode}): {tail}")
    if result.tolerances is not None:
        lines.append(f"tolerance: {result.tolerances.note}")
    lines += [f"note: {note}" for note in result.notes]
    if result.verdict == "match":
        lines.append(
            "verdict: MATCH (exit 0): same precision, same skipped steps, the loss scale follows "
            "GradScaler's rule, and every step's numbers are within the calibrated noise"
        )
    else:
        first = result.findings[0]
        where = f"step {first.step}" if first.step is not None else "the whole run"
        what = NAMES.get(first.quantity or first.kind, first.quantity or first.kind)
        lines.append(
            f"verdict: DIVERGE (exit 1): first difference at {where}, in the {what}; "
            f"{len(result.findings)} finding(s) in all"
        )
    return "\n".join(lines)


def grouped_findings(findings: list[Finding]) -> list[tuple[Finding, list[int]]]:
    """Findings of the same kind, quantity and cause, in order of first appearance, with their steps."""
    groups: dict[tuple[str, str | None, str], tuple[Finding, list[int]]] = {}
    for finding in findings:
        key = (finding.kind, finding.quantity, finding.hint if finding.kind != "numeric" else finding.hint[:40])
        if key not in groups:
            groups[key] = (finding, [])
        if finding.step is not None:
            groups[key][1].append(finding.step)
    return list(groups.values())


def _json_number(value: float | None) -> float | str | None:
    if value is None or math.isfinite(value):
        return value
    return str(value)


def _json_step(step: Step | None) -> dict[str, Any] | None:
    if step is None:
        return None
    return {
        "optimizer": step.optimizer,
        "taken": step.taken,
        "skip": step.skip,
        "injected": step.injected,
        "loss": _json_number(step.loss),
        "scales": [_json_number(scale) for scale in step.scales],
        **{q: _json_number(step.value(q)) for q in QUANTITIES if q != "loss"},
    }


def _json_run(run: RunRecord | None, requested: int) -> dict[str, Any] | None:
    if run is None:
        return None
    return {
        "returncode": run.returncode,
        "steps": len(run.steps),
        "requested_steps": requested,
        "stopped": run.stopped,
        "skipped": sorted(run.skipped),
        "matmul_dtypes": run.summary.get("matmul_dtypes", {}),
        "loss_op_dtypes": run.summary.get("loss_op_dtypes", {}),
        "stderr_tail": "\n".join(run.stderr.rstrip().splitlines()[-20:]) if run.failed else "",
    }


def to_json(result: VerifyResult) -> dict[str, Any]:
    """The result as plain JSON data (``ampmigrate verify --json``)."""
    first = result.findings[0] if result.findings else None
    return {
        "verdict": result.verdict,
        "exit_code": result.exit_code,
        "summary": headline(result),
        "original": result.original_path,
        "migrated": result.migrated_path,
        "entry": result.entry,
        "first_divergence": (
            None
            if first is None
            else {"step": first.step, "kind": first.kind, "quantity": first.quantity, "message": first.message}
        ),
        "findings": [
            {"step": f.step, "kind": f.kind, "quantity": f.quantity, "message": f.message, "hint": f.hint}
            for f in result.findings
        ],
        "errors": result.errors,
        "runs": {
            "original": _json_run(result.original, result.requested_steps),
            "migrated": _json_run(result.migrated, result.requested_steps),
            "calibration": _json_run(result.calibration, result.requested_steps),
        },
        "planted_overflows": result.planted,
        "growth_interval": result.growth_interval,
        "tolerance": None if result.tolerances is None else result.tolerances.note,
        "notes": result.notes,
        "steps": [
            {
                "step": c.step,
                "original": _json_step(c.original),
                "migrated": _json_step(c.migrated),
                "expected_scale": None if c.expected_scale in ("-", UNSCALED) else c.expected_scale,
                "diffs": {
                    q: {"diff": _json_number(cell.diff), "tol": cell.tol, "ok": cell.ok} for q, cell in c.cells.items()
                },
                "flags": c.flags,
            }
            for c in result.comparisons
        ],
        "seed": result.seed,
        "device": result.device,
        "timings_s": {name: round(value, 3) for name, value in result.timings.items()},
        "names": NAMES,
    }
