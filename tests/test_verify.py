"""``ampmigrate verify``: rejects known-wrong migrations, accepts correct ones and the tool's own.

The end-to-end cases run three short subprocesses each (original under the shim, migration,
fp32 calibration); the judging rules are also tested on synthetic records, without processes.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from migrate import verify
from migrate.verify import RunRecord

REPO = Path(__file__).resolve().parents[1]
VERIFY_FIXTURES = REPO / "fixtures" / "verify"
E2E_FIXTURES = REPO / "fixtures" / "e2e"
STEPS = 12

# The flag that turns mixed precision on, for e2e scripts whose default is fp32.
E2E_MIXED_ARGS = {"hf_glue_accumulation": ("--fp16",), "trainer_class": ("--amp",)}


def wrong_migrations() -> list[Path]:
    return sorted(VERIFY_FIXTURES.glob("*.wrong_*.py"))


def original_of(path: Path) -> Path:
    return VERIFY_FIXTURES / f"{path.name.split('.')[0]}.original.py"


def e2e_pairs() -> list[tuple[Path, Path]]:
    pairs = []
    for source in sorted(E2E_FIXTURES.glob("*.in.py")):
        migrated = source.with_name(source.name.replace(".in.py", ".out.py"))
        if migrated.exists():
            pairs.append((source, migrated))
    return pairs


@pytest.mark.slow
@pytest.mark.parametrize("wrong", wrong_migrations(), ids=lambda p: p.name.removesuffix(".py"))
def test_verify_rejects_wrong_migration(wrong: Path) -> None:
    result = verify.compare(original_of(wrong), wrong, steps=STEPS)
    report = result.report()
    if "update_misplaced" in wrong.name:
        # update() before step(): the next unscale_() raises, so the migration cannot run.
        assert result.exit_code == 2, report
        assert "unscale_() is being called after step()" in report
    else:
        assert result.exit_code == 1, report
        assert "verdict: DIVERGE" in report


@pytest.mark.slow
@pytest.mark.parametrize(
    "correct",
    sorted(VERIFY_FIXTURES.glob("*.correct.py")),
    ids=lambda p: p.name.removesuffix(".py"),
)
def test_verify_accepts_correct_migration(correct: Path) -> None:
    result = verify.compare(original_of(correct), correct, steps=STEPS)
    assert result.exit_code == 0, result.report()


@pytest.mark.slow
@pytest.mark.parametrize("pair", e2e_pairs(), ids=lambda pair: pair[0].name.removesuffix(".in.py"))
def test_verify_accepts_the_tools_own_output(pair: tuple[Path, Path]) -> None:
    source, migrated = pair
    name = source.name.removesuffix(".in.py")
    result = verify.compare(source, migrated, steps=STEPS, script_args=E2E_MIXED_ARGS.get(name, ()))
    assert result.exit_code == 0, result.report()
    assert result.original.low_precision_share, "the original did not run in mixed precision"


@pytest.mark.slow
@pytest.mark.parametrize(
    "original",
    sorted(VERIFY_FIXTURES.glob("*.original.py")),
    ids=lambda p: p.name.removesuffix(".original.py"),
)
def test_verify_accepts_the_tools_migration_of_each_verify_original(original: Path, tmp_path: Path) -> None:
    """The engine's own migration (FusedAdam -> AdamW included) trains like the original."""
    from migrate.engine import migrate_source

    migrated = tmp_path / original.name.replace(".original.py", ".migrated.py")
    migrated.write_text(migrate_source(original.read_text(encoding="utf-8")).source, encoding="utf-8")
    result = verify.compare(original, migrated, steps=STEPS)
    assert result.exit_code == 0, result.report()


@pytest.mark.slow
def test_run_cli_prints_side_by_side_report(capsys: pytest.CaptureFixture[str]) -> None:
    code = verify.run_cli(
        str(VERIFY_FIXTURES / "clip.original.py"),
        str(VERIFY_FIXTURES / "clip.correct.py"),
        3,
        "cpu",
        (),
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "original loss" in out and "migrated loss" in out
    assert "device: CPU" in out and "float16" in out
    assert "calibrated against an fp32 run" in out
    assert "verdict: MATCH" in out


def test_run_cli_missing_file_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert verify.run_cli(str(tmp_path / "nope.py"), str(tmp_path / "nope.py"), 3, "auto", ()) == 2
    assert "no such file" in capsys.readouterr().out


def test_verify_module_does_not_import_torch() -> None:
    code = "import sys, migrate.verify; assert 'torch' not in sys.modules"
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def record(
    label: str,
    rows: list[tuple[float, float | None, bool, float]],
    share: float = 1.0,
    scale_calls: int = 1,
    forced_o0: int = 0,
    dynamic: bool = True,
) -> RunRecord:
    """A synthetic run: rows of (loss, scale, taken, param_norm)."""
    steps = [
        {
            "step": i,
            "optimizer": 0,
            "taken": taken,
            "loss": loss,
            "loss_source": "test",
            "scale": scale,
            "dynamic": dynamic,
            "scale_calls": scale_calls,
            "param_norm": norm,
        }
        for i, (loss, scale, taken, norm) in enumerate(rows)
    ]
    low = round(share * 10)
    summary = {
        "matmul_dtypes": {"float16": low, "float32": 10 - low},
        "forced_o0": forced_o0,
    }
    return RunRecord(label, [], 0, "", "", {}, steps, summary)


MIXED = [
    (2.0, 65536.0, False, 1.0),
    (2.0, 32768.0, True, 1.1),
    (1.5, 32768.0, True, 1.2),
]
FP32 = [(2.02, 1.0, False, 1.0), (2.02, 1.0, True, 1.1001), (1.515, 1.0, True, 1.2001)]


def test_tolerance_is_calibrated_on_the_fp32_run() -> None:
    close = [(loss * 1.02, scale, taken, norm) for loss, scale, taken, norm in MIXED]
    far = [(loss * 1.2, scale, taken, norm) for loss, scale, taken, norm in MIXED]
    calibration = record("fp32", FP32, share=0.0, forced_o0=1)
    verdict, _, note, comparisons = verify._judge(record("o", MIXED), record("m", close), calibration)
    assert verdict == "match" and "calibrated" in note
    assert comparisons[0].loss_tol == pytest.approx(verify.FACTOR * 0.02 / 2.02, rel=1e-6)
    verdict, reasons, _, _ = verify._judge(record("o", MIXED), record("m", far), calibration)
    assert verdict == "diverge" and "outside tolerance" in reasons[0]


def test_skips_and_scales_are_judged_only_at_the_same_cadence() -> None:
    no_skip = [(loss, 65536.0, True, norm) for loss, _, _, norm in MIXED]
    verdict, reasons, _, _ = verify._judge(record("o", MIXED), record("m", no_skip), None)
    assert verdict == "diverge" and any("skipped steps differ" in r for r in reasons)
    assert any("loss scale differs" in r for r in reasons)
    several_losses = record("o", MIXED, scale_calls=3)
    verdict, reasons, note, _ = verify._judge(several_losses, record("m", no_skip), None)
    assert not any("skipped" in r for r in reasons) and "Not judged" in note


def test_precision_mismatch_is_a_divergence() -> None:
    verdict, reasons, _, _ = verify._judge(record("o", MIXED), record("m", MIXED, share=0.0), None)
    assert verdict == "diverge" and any("precision differs" in r for r in reasons)


def test_static_apex_scale_against_gradscaler_is_judged_on_losses_not_scale_values() -> None:
    static = [(loss, 1.0, True, norm) for loss, _, _, norm in MIXED]
    dynamic = [(loss, 65536.0, True, norm) for loss, _, _, norm in MIXED]
    verdict, reasons, note, _ = verify._judge(record("o", static, dynamic=False), record("m", dynamic), None)
    assert verdict == "match", reasons
    assert "static" in note
