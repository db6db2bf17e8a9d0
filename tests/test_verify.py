"""``ampmigrate verify``: the judging rules on synthetic records, the report and its JSON.

The rules (tolerances, GradScaler's scale rule, skips, precision) are tested on hand-built
records, without processes. What the recorder records, the planted-bug catalog and the
acceptance of the tool's own migrations run real scripts: ``test_verify_catalog.py``.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from migrate import verify
from migrate.verify.judge import FACTOR, RESOLUTION, UNSCALED, iterations, judge, scale_rule, tolerances
from migrate.verify.records import RunRecord, Step
from migrate.verify.session import resolve

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "fixtures" / "verify"


# --- synthetic records ------------------------------------------------------------------------


def step(index: int, **values: Any) -> Step:
    """A step with plausible defaults: taken, one loss scaled at 65536, all norms 1."""
    fields: dict[str, Any] = {
        "index": index,
        "optimizer": 0,
        "taken": True,
        "skip": None,
        "injected": False,
        "loss": 1.0,
        "loss_count": 1,
        "loss_source": "test",
        "scales": [65536.0],
        "dynamic": True,
        "grad_norm": 1.0,
        "update_norm": 1.0,
        "param_norm": 1.0,
    }
    fields.update(values)
    if not fields["taken"]:
        fields.update(grad_norm=None, update_norm=None, skip=fields["skip"] or "overflow")
    return Step(**fields)


def record(
    label: str,
    steps: list[Step],
    *,
    share: float = 1.0,
    losses: dict[str, int] | None = None,
    forced: int = 0,
    scalers: list[dict[str, Any]] | None = None,
) -> RunRecord:
    low = round(share * 10)
    summary = {
        "matmul_dtypes": {"float16": low, "float32": 10 - low},
        "loss_op_dtypes": losses or {},
        "forced_fp32": forced,
        "stopped": "limit",
    }
    return RunRecord(label, [], 0, "", "", {"apex": label == "original"}, steps, scalers or [], summary)


def scaled(values: list[float]) -> list[Step]:
    """Steps whose quantities are all ``value`` (one per step)."""
    return [step(i, loss=v, grad_norm=v, update_norm=v, param_norm=v) for i, v in enumerate(values)]


def with_noise(values: list[float], noise: float) -> list[float]:
    return [v * (1 + noise) for v in values]


BASE = [2.0, 1.8, 1.7, 1.5, 1.4, 1.3, 1.2, 1.1]


def runs(migrated_values: list[float], noise_o: float = 1e-5, noise_m: float = 1e-5) -> tuple[RunRecord, ...]:
    original = record("original", scaled(BASE))
    calibration = record("original fp32", scaled(with_noise(BASE, noise_o)), share=0.0, forced=1)
    migrated = record("migrated", scaled(migrated_values))
    migrated_fp32 = record("migrated fp32", scaled(with_noise(migrated_values, noise_m)), share=0.0, forced=1)
    return original, migrated, calibration, migrated_fp32


# --- tolerances ---------------------------------------------------------------------------------


def test_tolerance_is_factor_times_both_runs_noise_not_a_fixed_floor() -> None:
    original, migrated, calibration, migrated_fp32 = runs(BASE, noise_o=1e-5, noise_m=3e-5)
    tols = tolerances(original, calibration, len(BASE), migrated, migrated_fp32)
    assert tols.calibrated and "both runs'" in tols.note
    for quantity, per_step in tols.per_step.items():
        assert per_step == pytest.approx([FACTOR * 4e-5] * len(BASE), rel=1e-3), quantity


def test_a_difference_far_above_the_noise_is_caught_where_fixed_floors_let_it_pass() -> None:
    # The clip-without-unscale: 2.35e-3 on the loss where the noise was 9e-6. The old
    # fixed floor (2e-3) let 1.9e-3 pass; the calibrated tolerance does not.
    diverged = [BASE[0]] + [v * (1 + 1.9e-3) for v in BASE[1:]]
    judgement = judge(*runs(diverged, noise_o=9e-6, noise_m=9e-6), steps=len(BASE))
    assert judgement.verdict == "diverge"
    first = judgement.findings[0]
    assert (first.kind, first.step, first.quantity) == ("numeric", 1, "grad_norm")


def test_within_the_triangle_bound_is_a_match() -> None:
    # A migration off by 1.5x the sum of both runs' noise still lies within FACTOR x that sum.
    close = with_noise(BASE, 1.5 * 2e-5)
    judgement = judge(*runs(close, noise_o=1e-5, noise_m=1e-5), steps=len(BASE))
    assert judgement.verdict == "match", [f.text() for f in judgement.findings]


def test_noise_below_float32_resolution_gives_the_resolution() -> None:
    original, migrated, calibration, migrated_fp32 = runs(BASE, noise_o=0.0, noise_m=0.0)
    tols = tolerances(original, calibration, len(BASE), migrated, migrated_fp32)
    assert set(tols.per_step["loss"]) == {RESOLUTION}


def test_the_migrations_noise_stops_counting_once_its_fp32_run_skips_differently() -> None:
    original, migrated, calibration, _ = runs(BASE)
    # The fp32 run of the migration took step 3 where the migration skipped: from there on its
    # difference is not precision, and must not widen the tolerance.
    mixed = record("migrated", [*scaled(BASE[:3]), step(3, taken=False), *scaled(BASE)[4:]])
    fp32 = record("migrated fp32", scaled(with_noise(BASE[:3], 1e-5) + with_noise(BASE[3:], 0.5)), forced=1)
    tols = tolerances(original, calibration, len(BASE), mixed, fp32)
    assert max(tols.per_step["loss"]) == pytest.approx(FACTOR * 2e-5, rel=1e-3)


def test_the_original_is_calibrated_over_more_steps_than_compared() -> None:
    original, migrated, calibration, migrated_fp32 = runs(BASE)
    # Noise at step 6 of the calibration horizon sets the floor (the median) for the first steps.
    calibration.steps[6].loss = BASE[6] * (1 + 1e-3)
    calibration.steps[7].loss = BASE[7] * (1 + 1e-3)
    calibration.steps[5].loss = BASE[5] * (1 + 1e-3)
    calibration.steps[4].loss = BASE[4] * (1 + 1e-3)
    calibration.steps[3].loss = BASE[3] * (1 + 1e-3)
    tols = tolerances(original, calibration, 2, migrated, migrated_fp32)
    assert len(tols.per_step["loss"]) == 2
    assert tols.per_step["loss"][0] > FACTOR * 5e-4


def test_without_a_calibration_run_fixed_tolerances_are_used_and_said() -> None:
    original, migrated, _, _ = runs(BASE)
    tols = tolerances(original, None, len(BASE), migrated, None)
    assert not tols.calibrated and "no calibration" in tols.note


# --- loss scaling -----------------------------------------------------------------------------


def test_iterations_start_when_an_optimizer_steps_again() -> None:
    steps = [step(i, optimizer=i % 2) for i in range(6)]
    assert iterations(steps) == [[0, 1], [2, 3], [4, 5]]
    assert iterations([step(i) for i in range(3)]) == [[0], [1], [2]]


def test_gradscaler_rule_backs_off_once_per_iteration_and_grows_after_the_window() -> None:
    # Two optimizers (a GAN); the original skipped D at step 2. Apex's three per-loss scalers
    # are not the yardstick: one GradScaler backs off once, for the whole next iteration.
    rows = [step(i, optimizer=i % 2) for i in range(12)]
    rows[2] = step(2, optimizer=0, taken=False, scales=[65536.0, 65536.0])
    original = record("original", rows, scalers=[{"impl": "apex", "window": 2, "step": 0}])
    rule = scale_rule(original)
    assert rule.kind == "dynamic" and rule.window == 2
    assert rule.expected == [65536.0] * 4 + [32768.0] * 4 + [65536.0] * 4


def test_accumulation_is_judged_per_optimizer_step_not_per_micro_batch() -> None:
    # Apex updates its scale per backward pass: [65536, 32768] within one step. GradScaler
    # updates once per step, so the migration must show 65536 for the whole step.
    rows = [step(0, taken=False, scales=[65536.0, 32768.0]), step(1, scales=[32768.0, 32768.0])]
    original = record("original", rows)
    migrated = record("migrated", [step(0, taken=False, skip="overflow", injected=True), step(1, scales=[32768.0] * 2)])
    judgement = judge(original, migrated, None, steps=2)
    assert not [f for f in judgement.findings if f.kind == "scale"], judgement.findings


def test_static_apex_scale_must_stay_put_in_the_migration() -> None:
    original = record("original", [step(i, scales=[128.0], dynamic=False) for i in range(4)])
    original.steps[1] = step(1, scales=[128.0], dynamic=False, taken=False, skip="forced", injected=True)
    held = [step(i, scales=[128.0]) for i in range(4)]
    held[1] = step(1, taken=False, injected=True, scales=[128.0])
    assert judge(original, record("migrated", held), None, steps=4).verdict == "match"
    dynamic = [step(0, scales=[128.0]), held[1], step(2, scales=[64.0]), step(3, scales=[64.0])]
    judgement = judge(original, record("migrated", dynamic), None, steps=4)
    first = judgement.findings[0]
    assert (first.kind, first.step) == ("scale", 2) and "static loss scale turned dynamic" in first.hint


def test_no_loss_scaling_in_the_original_expects_a_disabled_scaler() -> None:
    original = record("original", [step(i, scales=[1.0], dynamic=False) for i in range(3)])
    assert scale_rule(original).expected == [UNSCALED] * 3
    disabled = record("migrated", [step(i, scales=[None], dynamic=None) for i in range(3)])
    assert judge(original, disabled, None, steps=3).verdict == "match"
    enabled = record("migrated", [step(i) for i in range(3)])
    first = judge(original, enabled, None, steps=3).findings[0]
    assert first.kind == "scale" and "enabled=False" in first.hint


def test_a_recreated_scaler_is_named_as_the_cause() -> None:
    rows = [step(0), step(1, taken=False, injected=True), step(2, scales=[32768.0]), step(3, scales=[32768.0])]
    original = record("original", rows)
    recreated = [step(0), step(1, taken=False, injected=True), step(2), step(3)]
    scalers = [{"impl": "GradScaler", "step": i} for i in range(4)]
    first = judge(original, record("migrated", recreated, scalers=scalers), None, steps=4).findings[0]
    assert (first.kind, first.step) == ("scale", 2)
    assert "created at step 1" in first.hint


# --- skips ----------------------------------------------------------------------------------


def test_an_overflow_the_migration_applied_is_a_divergence() -> None:
    original = record("original", [step(0), step(1, taken=False, injected=True), step(2, scales=[32768.0])])
    applied = record("migrated", [step(0), step(1, grad_norm=math.inf, scales=[65536.0]), step(2, param_norm=math.nan)])
    findings = judge(original, applied, None, steps=3).findings
    skip = next(f for f in findings if f.kind == "skip")
    assert skip.step == 1 and "non-finite" in skip.message


def test_a_natural_skip_by_gradscalers_rule_is_realigned_not_judged() -> None:
    original = record("original", [step(i) for i in range(4)])
    migrated = record("migrated", [step(0), step(1, taken=False), step(2, scales=[32768.0]), step(3)])
    judgement = judge(original, migrated, None, steps=4)
    assert judgement.realign == [1] and judgement.verdict == "match"
    exhausted = judge(original, migrated, None, steps=4, realign_allowed=False)
    assert exhausted.verdict == "match" and "not compared" in exhausted.notes[0]
    assert len(exhausted.comparisons) == 2


def test_a_skip_the_scale_does_not_explain_is_not_realigned() -> None:
    original = record("original", [step(0), step(1), step(2)])
    migrated = record("migrated", [step(0), step(1, taken=False, scales=[131072.0]), step(2)])
    judgement = judge(original, migrated, None, steps=3)
    assert not judgement.realign
    assert [f.kind for f in judgement.findings if f.step == 1] == ["scale", "skip"]


def test_fewer_steps_in_the_migration_is_reported_with_why_each_stopped() -> None:
    original = record("original", [step(i) for i in range(4)])
    migrated = record("migrated", [step(i) for i in range(2)])
    migrated.summary["stopped"] = "end"
    last = judge(original, migrated, None, steps=4).findings[-1]
    assert last.kind == "steps" and "stopped at --steps" in last.message and "the script ended" in last.message


# --- precision --------------------------------------------------------------------------------


def test_lost_autocast_and_a_loss_outside_autocast_are_precision_findings() -> None:
    original = record("original", [step(0)], losses={"mse_loss:float32": 4})
    fp32 = record("migrated", [step(0)], share=0.0, losses={"mse_loss:float32": 4})
    assert judge(original, fp32, None).findings[0].hint.startswith("autocast lost")
    loss_in_fp16 = record("migrated", [step(0)], losses={"mse_loss:float16": 4})
    first = judge(original, loss_in_fp16, None).findings[0]
    assert first.kind == "precision" and "mse_loss" in first.message and "outside torch.autocast" in first.hint


# --- records, report, JSON --------------------------------------------------------------------


def test_step_records_read_non_finite_numbers() -> None:
    entry = {"step": 3, "optimizer": 1, "taken": True, "loss": "nan", "grad_norm": "inf", "scales": [65536.0, None]}
    parsed = Step.from_json(entry)
    assert math.isnan(parsed.loss or 0.0) and parsed.grad_norm == math.inf and not parsed.finite_grads
    assert parsed.scales == [65536.0, None]


def diverged_result() -> verify.VerifyResult:
    original, migrated, calibration, migrated_fp32 = runs(BASE)
    # A bug that is not about precision: the fp32 run of the migration has it too.
    migrated.steps[2] = step(2, loss=math.inf, grad_norm=123456.789, update_norm=1.7, param_norm=1.7)
    migrated_fp32.steps[2] = step(2, loss=math.inf, grad_norm=123456.789, update_norm=1.7, param_norm=1.7)
    migrated.summary["stopped"] = "end"
    migrated.steps = migrated.steps[:6]
    judgement = judge(original, migrated, calibration, migrated_fp32, steps=len(BASE))
    return verify.VerifyResult(
        judgement.verdict,
        original,
        migrated,
        calibration,
        migrated_fp32,
        findings=judgement.findings,
        comparisons=judgement.comparisons,
        tolerances=judgement.tolerances,
        original_path="orig.py",
        migrated_path="migr.py",
        requested_steps=len(BASE),
        planted=[2],
        growth_interval=4,
    )


def test_report_says_the_verdict_first_and_cuts_nothing() -> None:
    result = diverged_result()
    lines = result.report().splitlines()
    assert lines[0].startswith("DIVERGE: gradient norm (after unscaling) at step 2") and "(exit 1)" in lines[0]
    table = lines[lines.index(next(line for line in lines if line.startswith("step"))) :]
    row = next(line for line in table if line.lstrip().startswith("2 "))
    assert "inf" in row and "1.0e+00" in row and "<- grad" in row
    assert "n/a (one" not in result.report()
    # The real number of steps and why each run stopped.
    assert any("migr.py, native torch.amp: 6 optimizer steps (the script ended before --steps 8)" in s for s in lines)
    assert any("orig.py, under the Apex shim: 8 optimizer steps (stopped at --steps 8)" in s for s in lines)
    assert any(s.rstrip().endswith("<- not compared") for s in table)


def test_json_is_plain_json_with_the_first_divergence() -> None:
    data = json.loads(json.dumps(diverged_result().to_json(), allow_nan=False))
    assert data["verdict"] == "diverge" and data["exit_code"] == 1
    assert data["first_divergence"]["step"] == 2 and data["first_divergence"]["quantity"] == "grad_norm"
    assert data["steps"][2]["migrated"]["loss"] == "inf"
    assert data["runs"]["migrated"]["steps"] == 6 and "before" not in data["runs"]["migrated"]["stopped"]


def test_overflow_steps_do_not_depend_on_the_length_of_the_run() -> None:
    assert verify.default_overflow_steps(20) == [1, 4, 11]
    assert verify.default_overflow_steps(50) == [1, 4, 11, 26, 41]
    assert verify.default_overflow_steps(5) == [1, 4]
    assert verify.default_overflow_steps(1) == []


def test_resolve_files_and_project_folders(tmp_path: Path) -> None:
    for side in ("a", "b"):
        (tmp_path / side).mkdir()
        (tmp_path / side / "train.py").write_text("if __name__ == '__main__':\n    pass\n")
        (tmp_path / side / "util.py").write_text("X = 1\n")
    left, right, entry = resolve(tmp_path / "a", tmp_path / "b", None)
    assert entry == "train.py" and left.tree == (tmp_path / "a").resolve() and right.script.name == "train.py"
    with pytest.raises(ValueError, match="not in"):
        resolve(tmp_path / "a", tmp_path / "b", "missing.py")
    with pytest.raises(ValueError, match="two files or two folders"):
        resolve(tmp_path / "a", tmp_path / "a" / "util.py", None)


def test_run_cli_missing_file_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert verify.run_cli(str(tmp_path / "nope.py"), str(tmp_path / "nope.py"), 3, "auto", ()) == 2
    assert "no such file" in capsys.readouterr().out
    assert verify.run_cli(str(tmp_path / "nope.py"), str(tmp_path / "nope.py"), 3, "auto", (), json_output=True) == 2
    assert json.loads(capsys.readouterr().out)["exit_code"] == 2


def test_verify_package_does_not_import_torch() -> None:
    code = "import sys, migrate.verify, migrate.cli; assert 'torch' not in sys.modules"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
