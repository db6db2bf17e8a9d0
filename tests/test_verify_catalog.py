"""``ampmigrate verify`` end to end: what a run records, the planted-bug catalog, the tool's own
migrations.

Every ``fixtures/verify/<name>.wrong_<bug>.py`` is the tool's migration of
``<name>.original.py`` with one bug planted by hand; verify must say DIVERGE at the default
settings, and for the right reason. The tool's own migration of every original (made by the
engine here, never a file standing in for it) must be accepted at 5 and 20 steps, and at 50 in
the slow run. One Session serves the module: one torch import, and each original's runs shared
by the migrations compared with it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from migrate import verify
from migrate.engine import migrate_source
from migrate.verify.launch import RunSpec, Subprocesses, Zygote, base_environment
from migrate.verify.records import RunRecord

# every test here runs training scripts in subprocesses
pytestmark = pytest.mark.torch

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "fixtures" / "verify"
PROJECT = FIXTURES / "project" / "original"
#: Script arguments an original needs to run in mixed precision (HF scripts default to fp32).
ARGS = {"glue": ("--fp16",)}

#: What each planted bug must be caught by: (kind of the first finding, the quantity or None).
PLANTED = {
    "dcgan.wrong_step_without_scaler": ("skip", None),
    "fused_adam.wrong_plain_adam": ("numeric", "param_norm"),
    "glue.wrong_clip_without_unscale": ("numeric", "grad_norm"),
    "glue.wrong_update_per_micro_batch": ("numeric", "grad_norm"),
    "imagenet.wrong_autocast_before_loss": ("precision", None),
    "imagenet.wrong_no_autocast": ("precision", None),
    "imagenet.wrong_scaler_recreated": ("scale", "scale"),
    "o0.wrong_mixed_precision": ("precision", None),
    "resume.wrong_scaler_not_checkpointed": ("scale", "scale"),
    "static_scale.wrong_dynamic": ("scale", "scale"),
}
#: The cause each report must name.
HINTS = {
    "dcgan.wrong_step_without_scaler": "GradScaler.step",
    "fused_adam.wrong_plain_adam": "optimizer differs",
    "glue.wrong_clip_without_unscale": "unscale_",
    "imagenet.wrong_autocast_before_loss": "outside torch.autocast",
    "imagenet.wrong_no_autocast": "autocast lost",
    "imagenet.wrong_scaler_recreated": "re-created",
    "o0.wrong_mixed_precision": "float32",
    "resume.wrong_scaler_not_checkpointed": "restored",
    "static_scale.wrong_dynamic": "static loss scale turned dynamic",
}


def originals() -> list[str]:
    return sorted(path.name.removesuffix(".original.py") for path in FIXTURES.glob("*.original.py"))


def wrong_migrations() -> list[Path]:
    return sorted(FIXTURES.glob("*.wrong_*.py"))


@pytest.fixture(scope="module")
def session() -> Iterator[verify.Session]:
    with verify.Session() as shared:
        yield shared


def compare(
    session: verify.Session, name: str, migrated: Path, steps: int = verify.DEFAULT_STEPS
) -> verify.VerifyResult:
    return session.compare(FIXTURES / f"{name}.original.py", migrated, steps=steps, script_args=ARGS.get(name, ()))


# --- what a run records -----------------------------------------------------------------------------------


ACCUMULATING = textwrap.dedent("""
    import torch
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda", init_scale=1024.0)
    for step in range(3):
        for micro in range(2):
            x = torch.full((2, 4), 0.1 * (step + micro + 1))
            with torch.autocast("cuda", dtype=torch.float16):
                loss = model(x).pow(2).mean() / 2
            print("loss", step, micro, loss.item())
            scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
    """)


def run_one(session: verify.Session, tmp_path: Path, script: str, *extra: str, steps: int = 3) -> RunRecord:
    path = tmp_path / "script.py"
    path.write_text(script)
    out = tmp_path / "record.jsonl"
    argv = ["--out", str(out), "--steps", str(steps), "--cuda-on-cpu", "yes", *extra, str(path)]
    spec = RunSpec("test", argv, tmp_path, base_environment(), tmp_path / "stdout", tmp_path / "stderr")
    handle = session.launcher.start(spec)
    return RunRecord.read("test", spec.command, handle.wait(120), out, spec.stdout, spec.stderr)


def test_the_loss_of_a_step_sums_its_micro_batches(session: verify.Session, tmp_path: Path) -> None:
    run = run_one(session, tmp_path, ACCUMULATING)
    assert not run.failed, run.stderr
    printed: dict[int, float] = {}
    for line in run.stdout.splitlines():
        _, index, _, value = line.split()
        printed[int(index)] = printed.get(int(index), 0.0) + float(value)
    assert [s.loss for s in run.steps] == pytest.approx([printed[i] for i in range(3)], rel=1e-6)
    assert all(s.taken and s.loss_count == 2 and s.scales == [1024.0, 1024.0] for s in run.steps)


def test_a_plain_backward_counts_its_loss_once(session: verify.Session, tmp_path: Path) -> None:
    """No scaler at all (an fp32 path): the loss comes from Tensor.backward, which the CUDA-on-CPU
    mode dispatches a second time; counted twice, it made every fp32 path DIVERGE by 2x."""
    plain = ACCUMULATING.replace("scaler.scale(loss).backward()", "loss.backward()")
    plain = plain.replace("scaler.step(optimizer)", "optimizer.step()").replace("scaler.update()", "")
    run = run_one(session, tmp_path, plain)
    assert not run.failed, run.stderr
    printed: dict[int, float] = {}
    for line in run.stdout.splitlines():
        _, index, _, value = line.split()
        printed[int(index)] = printed.get(int(index), 0.0) + float(value)
    assert [s.loss for s in run.steps] == pytest.approx([printed[i] for i in range(3)], rel=1e-6)
    assert all(s.loss_count == 2 and s.loss_source == "backward" for s in run.steps)


def test_a_planted_overflow_makes_gradscaler_skip_and_back_off(session: verify.Session, tmp_path: Path) -> None:
    run = run_one(session, tmp_path, ACCUMULATING, "--replay", "1:overflow", "--growth-interval", "4")
    assert not run.failed, run.stderr
    assert [s.taken for s in run.steps] == [True, False, True]
    assert run.steps[1].injected and run.steps[2].scales == [512.0, 512.0]
    assert run.scalers[0]["window"] == 4 and run.scalers[0]["configured_window"] == 2000


def test_an_optimizer_that_unscales_in_its_step_is_recorded_once_and_unscaled(
    session: verify.Session, tmp_path: Path
) -> None:
    """Fused AdamW gets scaled grads from GradScaler and skips on its own found_inf."""
    (tmp_path / "plain").mkdir()
    (tmp_path / "fused").mkdir()
    adamw = ACCUMULATING.replace("torch.optim.SGD(model.parameters(), lr=0.1)", "torch.optim.AdamW(model.parameters())")
    plain = run_one(session, tmp_path / "plain", adamw, "--replay", "1:overflow")
    fused = run_one(
        session,
        tmp_path / "fused",
        adamw.replace("model.parameters())", "model.parameters(), fused=True)"),
        "--replay",
        "1:overflow",
    )
    assert not fused.failed, fused.stderr
    assert [(s.taken, s.skip) for s in fused.steps] == [(True, None), (False, "overflow"), (True, None)]
    for left, right in zip(plain.steps, fused.steps):
        assert left.grad_norm == pytest.approx(right.grad_norm, rel=1e-6) if left.taken else right.grad_norm is None
        assert left.param_norm == pytest.approx(right.param_norm, rel=1e-5)


def test_a_forced_skip_skips_without_a_scaler(session: verify.Session, tmp_path: Path) -> None:
    plain = ACCUMULATING.replace("init_scale=1024.0", "enabled=False")
    run = run_one(session, tmp_path, plain, "--replay", "1:forced")
    assert [(s.taken, s.skip) for s in run.steps] == [(True, None), (False, "forced"), (True, None)]
    assert run.steps[1].param_norm == run.steps[0].param_norm


def test_a_migration_cannot_import_what_apex_removed(session: verify.Session, tmp_path: Path) -> None:
    run = run_one(session, tmp_path, "from apex.optimizers import FusedLAMB\nfrom apex import amp\n")
    assert run.failed and "apex.amp': removed from Apex in May 2025" in run.stderr


def test_a_run_past_its_time_is_killed(session: verify.Session, tmp_path: Path) -> None:
    path = tmp_path / "forever.py"
    path.write_text("while True:\n    pass\n")
    argv = ["--out", str(tmp_path / "o"), "--steps", "1", str(path)]
    spec = RunSpec("slow", argv, tmp_path, base_environment(), tmp_path / "1", tmp_path / "2")
    assert session.launcher.start(spec).wait(1.0) == -9


@pytest.mark.slow
def test_forked_and_fresh_processes_record_the_same(session: verify.Session, tmp_path: Path) -> None:
    """A child of the fork server records what a fresh ``python -m migrate.shim.record`` does."""
    assert isinstance(session.launcher, Zygote)
    (tmp_path / "forked").mkdir()
    (tmp_path / "fresh").mkdir()
    forked = run_one(session, tmp_path / "forked", ACCUMULATING)
    with verify.Session(Subprocesses()) as fresh:
        alone = run_one(fresh, tmp_path / "fresh", ACCUMULATING)
    assert forked.steps and [vars(s) for s in forked.steps] == [vars(s) for s in alone.steps]


# --- the catalog --------------------------------------------------------------------------------


def test_every_planted_bug_is_listed() -> None:
    planted = {path.name.removesuffix(".py") for path in wrong_migrations()} - {"clip.wrong_update_misplaced"}
    assert planted == set(PLANTED)


@pytest.mark.parametrize("wrong", sorted(PLANTED))
def test_planted_bug_is_caught_at_default_settings(session: verify.Session, wrong: str) -> None:
    name = wrong.split(".")[0]
    result = compare(session, name, FIXTURES / f"{wrong}.py")
    report = result.report()
    assert result.exit_code == 1, report
    assert report.startswith("DIVERGE: ")
    first = result.findings[0]
    assert (first.kind, first.quantity) == PLANTED[wrong], report
    if first.kind != "precision":
        assert first.step is not None and f"at step {first.step}" in report.splitlines()[0]
    assert HINTS.get(wrong, "") in first.text(), first.text()


def test_a_migration_that_crashes_is_an_error_with_its_traceback(session: verify.Session) -> None:
    # update() before step(): the next unscale_() raises.
    result = compare(session, "clip", FIXTURES / "clip.wrong_update_misplaced.py")
    report = result.report()
    assert result.exit_code == 2 and report.startswith("ERROR: the migrated script failed"), report
    assert "unscale_() is being called after step()" in report


# --- the tool's own migrations -----------------------------------------------------------------


def tools_migration(name: str, folder: Path) -> Path:
    """The engine's migration of ``<name>.original.py``."""
    original = FIXTURES / f"{name}.original.py"
    result = migrate_source(original.read_text(encoding="utf-8"))
    source = result.source
    assert "from apex" not in source and "import apex" not in source
    migrated = folder / f"{name}.migrated.py"
    migrated.write_text(source, encoding="utf-8")
    return migrated


@pytest.fixture(scope="module")
def migrations(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("migrations")
    return {name: tools_migration(name, folder) for name in originals()}


def check_accepted(result: verify.VerifyResult, name: str) -> None:
    report = result.report()
    assert result.exit_code == 0, report
    assert report.startswith("MATCH: ")
    assert result.original is not None and result.migrated is not None
    if name != "o0":
        assert result.original.low_precision_share, "the original did not run in mixed precision"
    compared = len(result.comparisons)
    planted = [step for step in result.planted if step < compared]
    assert planted, "no overflow was planted"
    # The overflows were exercised: both runs skipped every planted step.
    for step in planted:
        assert not result.original.steps[step].taken and not result.migrated.steps[step].taken, report


@pytest.mark.parametrize("steps", [5, 20])
@pytest.mark.parametrize("name", originals())
def test_tools_own_migration_is_accepted(
    session: verify.Session, migrations: dict[str, Path], name: str, steps: int
) -> None:
    check_accepted(compare(session, name, migrations[name], steps), name)


@pytest.mark.slow
@pytest.mark.parametrize("name", originals())
def test_tools_own_migration_is_accepted_at_50_steps(
    session: verify.Session, migrations: dict[str, Path], name: str
) -> None:
    check_accepted(compare(session, name, migrations[name], 50), name)


def test_gan_verdict_does_not_depend_on_the_number_of_steps(
    session: verify.Session, migrations: dict[str, Path]
) -> None:
    """The issue's false alarm: Apex's per-loss scalers skip steps one GradScaler would not have.

    Apex overflows on its own where GradScaler, whose one scale has backed off for every loss,
    would not; the migration is given those overflows too, and judged by GradScaler's rule.
    """
    for steps in (10, 16):
        result = compare(session, "dcgan", migrations["dcgan"], steps)
        assert result.exit_code == 0 and result.original is not None, result.report()
        natural = [s.index for s in result.original.steps[:steps] if not s.taken and not s.injected]
        assert natural, "Apex never overflowed on its own: the case is not exercised"


# --- projects ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def migrated_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tool's migration of the project folder (project mode: the scaler threaded across modules)."""
    tree = tmp_path_factory.mktemp("project") / "migrated"
    shutil.copytree(PROJECT, tree)
    done = subprocess.run(
        [sys.executable, "-m", "migrate", str(tree), "--write"], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "scaler" in (tree / "trainer.py").read_text() and "apex" not in (tree / "model.py").read_text()
    return tree


def test_project_migration_is_accepted(session: verify.Session, migrated_project: Path) -> None:
    result = session.compare(PROJECT, migrated_project, entry="train.py")
    assert result.exit_code == 0, result.report()
    assert result.entry == "train.py" and "entry train.py" in result.report()
    # FusedLAMB is left to current Apex; on this machine the shim stands in for it.
    assert "from apex.optimizers import FusedLAMB" in (migrated_project / "train.py").read_text()
    assert result.migrated is not None and result.migrated.meta["shim_for_current_apex"]


def test_project_with_a_planted_bug_diverges(session: verify.Session, migrated_project: Path, tmp_path: Path) -> None:
    tree = tmp_path / "wrong"
    shutil.copytree(migrated_project, tree)
    trainer = tree / "trainer.py"
    source = trainer.read_text()
    assert "            scaler.unscale_(optimizer)\n" in source
    trainer.write_text(source.replace("            scaler.unscale_(optimizer)\n", ""))
    result = session.compare(PROJECT, tree)  # the entry script is found on its own
    assert result.exit_code == 1, result.report()
    assert result.findings[0].quantity == "grad_norm"


# --- the command line ----------------------------------------------------------------------------


class _Borrowed:
    """The module's fork server, lent to a Session that would otherwise start and close its own."""

    def __init__(self, launcher: verify.launch.Launcher) -> None:
        self.launcher = launcher

    def start(self, spec: RunSpec) -> verify.launch.Handle:
        return self.launcher.start(spec)

    def close(self) -> None:
        pass


def test_cli_json_for_ci(session: verify.Session, migrations: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from migrate.cli import main

    monkeypatch.setattr("migrate.verify.session.default_launcher", lambda: _Borrowed(session.launcher))
    arguments = ["verify", str(FIXTURES / "clip.original.py"), str(migrations["clip"]), "--steps", "6", "--json"]
    done = CliRunner().invoke(main, arguments)
    data = json.loads(done.stdout)
    assert done.exit_code == 0 and data["verdict"] == "match" and data["exit_code"] == 0, done.stdout
    assert data["runs"]["migrated"]["steps"] == 6 and len(data["steps"]) == 6
    assert data["planted_overflows"] == [1, 4] and data["first_divergence"] is None
    wrong = CliRunner().invoke(main, [*arguments[:2], str(FIXTURES / "clip.wrong_update_misplaced.py"), "--json"])
    data = json.loads(wrong.stdout)
    assert (
        wrong.exit_code == 2 and data["verdict"] == "error" and "unscale_()" in data["runs"]["migrated"]["stderr_tail"]
    )


@pytest.mark.slow
def test_cli_command_prints_the_report(migrations: dict[str, Path]) -> None:
    """The whole command, in a process of its own (its own fork server)."""
    done = subprocess.run(
        [sys.executable, "-m", "migrate", "verify", str(FIXTURES / "clip.original.py"), str(migrations["clip"])],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("MATCH: the migration trains like the original (20 optimizer steps compared")


# --- CUDA ------------------------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["clip", "dcgan", "glue"])
def test_tools_own_migration_is_accepted_with_cuda_autocast(
    session: verify.Session, migrations: dict[str, Path], name: str
) -> None:
    """On a GPU: Apex O1 casts on CUDA tensors against CUDA autocast and a CUDA GradScaler."""
    result = session.compare(
        FIXTURES / f"{name}.original.py", migrations[name], steps=20, device="cuda", script_args=ARGS.get(name, ())
    )
    check_accepted(result, name)
    assert (
        result.original is not None and result.original.meta.get("cuda") and not result.original.meta.get("cuda_on_cpu")
    )
