"""End-to-end: migrate whole Apex training scripts, run them on the CPU, compare with the original.

Each script in ``fixtures/e2e/`` is Apex code as users wrote it. The test migrates it in-process
with ``migrate_source`` and runs the result with ``python -m migrate.shim --native`` (CUDA
autocast and GradScaler mapped to the CPU in float16), once mixed and once with the script's
fp32 switch (``--opt-level O0``, or without ``--fp16``/``--amp``). The original script runs too,
under the Apex shim (``python -m migrate.shim``), with the same options: its fp32 run is the
reference the migrated script must reproduce, its mixed run the one it must train like. The
scripts write what is checked into the ``--out`` JSON: per-step losses, the dtype of the model
output inside the forward pass, the norm returned by ``clip_grad_norm_`` and the loss-scaler
state.

The runs are started by ``batch_run.py``, which imports torch once and forks each
``python -m migrate.shim`` run from there: starting torch took ~4 s of every ~4.5 s run. The
runs happen once, in the module's fixture (xdist's ``--dist loadscope`` keeps a module on one
worker).
"""

from __future__ import annotations

import ast
import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from migrate.engine import migrate_source

pytest.importorskip("torch", reason="the e2e scripts train with torch")

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
E2E_FIXTURES = REPO / "fixtures" / "e2e"
BATCH_RUN = Path(__file__).resolve().parent / "batch_run.py"
RUN_TIMEOUT_S = 120
# Two runs at a time, one thread each: two single-threaded runs use both CI cores better than
# one at a time.
PARALLEL_RUNS = 2

# How far the mixed-precision run may end from the fp32 run: |mixed - fp32| <= ABS + REL * fp32,
# on the mean loss of the last five steps. With the same seed both runs start from the same
# weights and data, so the only difference is fp16 rounding in the forward pass (about 5e-4
# relative per op). On hand-migrated copies of these scripts the final losses differed by less
# than 1e-3, and the original under the Apex shim's O1 emulation (Apex's casting lists instead
# of autocast's) less than 1e-3 from them; the bound is ten times wider than that and still
# fails a migration that stops training, trains on wrongly scaled gradients or keeps skipping
# steps.
FINAL_LOSS_ABS_TOL = 0.02
FINAL_LOSS_REL_TOL = 0.10
# The first clipped-gradient norm is taken on identical weights and data, so it may differ from
# the fp32 one only by fp16 rounding; a norm of scaled gradients would be 2**16 times larger.
FIRST_GRAD_NORM_REL_TOL = 0.02
GRAD_NORM_RATIO_BOUNDS = (0.5, 2.0)
DEFAULT_INIT_SCALE = 2.0**16
# Both fp32 runs do the same float32 arithmetic on the same data; only the order of reductions
# inside the two programs may differ.
FP32_LOSS_REL_TOL = 1e-4


@dataclass(frozen=True)
class Case:
    """One e2e script and how to run it mixed and fp32."""

    name: str
    mixed_args: tuple[str, ...]
    fp32_args: tuple[str, ...]
    loss_keys: tuple[str, ...]
    # iterations that end in an optimizer step (one scaler update each)
    optimizer_steps: int
    converges: bool = True  # a GAN's losses need not go down
    clips: bool = False  # records the norm returned by clip_grad_norm_
    clipped_per_step: int = 1  # clip_grad_norm_ calls per optimizer step
    # Apex O2/O3 cast model outputs back to float32; autocast leaves them in float16.
    original_output_dtype: str = "torch.float16"

    @property
    def id(self) -> str:
        return " ".join((self.name, *self.mixed_args))


CASES = [
    Case(
        "imagenet_clip",
        ("--opt-level", "O1"),
        ("--opt-level", "O0"),
        ("loss",),
        30,
        clips=True,
    ),
    # O2 has no native counterpart: the migration runs it as O1 (autocast), which must still
    # train like Apex's O2 (fp16 weights with fp32 master copies).
    Case(
        "imagenet_clip",
        ("--opt-level", "O2"),
        ("--opt-level", "O0"),
        ("loss",),
        30,
        clips=True,
        original_output_dtype="torch.float32",
    ),
    # 192 examples / batch 8 = 24 micro-batches per epoch, 2 per optimizer step, 3 epochs.
    Case("hf_glue_accumulation", ("--fp16",), (), ("loss",), 36, clips=True),
    # The same data, clipped after each of the 2 backward passes of every optimizer step.
    Case("oscar_clip_every_microbatch", ("--fp16",), (), ("loss",), 36, clips=True, clipped_per_step=2),
    # The same, the accumulation written as `continue` before the step.
    Case("oscar_clip_continue_before_step", ("--fp16",), (), ("loss",), 36, clips=True, clipped_per_step=2),
    # The same, the clip in an if/else of its own after the backward's (microsoft/unilm xdoc).
    Case("if_else_clip_every_microbatch", ("--fp16",), (), ("loss",), 36, clips=True, clipped_per_step=2),
    Case(
        "dcgan_two_optimizers",
        ("--opt_level", "O1"),
        ("--opt_level", "O0"),
        ("errD", "errG"),
        25,
        converges=False,
    ),
    Case("trainer_class", ("--amp",), (), ("loss",), 40),
    # 60 micro-batches, 2 per optimizer step
    Case("mtdnn_global_amp", ("--fp16",), (), ("loss",), 30, clips=True),
    # the scaler set by a factory under `if args.fp16:`, the step reading the gradients twice
    Case("factory_runtime_switch", ("--fp16",), (), ("loss",), 30, clips=True),
    # several losses summed in the parentheses of amp.scale_loss, then a clip (LEEYOONHYUNG/BVAE-TTS)
    Case("tts_summed_losses", ("--opt_level", "O1"), ("--opt_level", "O0"), ("loss",), 40, clips=True),
]
CASE_IDS = [case.id for case in CASES]

CHECKPOINT = "checkpoint_resume"
FIRST_LEG_STEPS = 10
APEX_LEG_STEPS = 3


def apex_imports(source: str) -> list[str]:
    """The apex modules a source still imports."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.split(".")[0] == "apex"]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "apex":
            found.append(node.module or "")
    return found


Job = tuple[str, tuple[str, ...], bool]  # script name, its options, run the original?


def first_leg(workdir: Path) -> Job:
    """Train the migrated checkpoint script and save a checkpoint."""
    return (
        CHECKPOINT,
        ("--steps", str(FIRST_LEG_STEPS), "--save", str(workdir / "leg1.pt")),
        False,
    )


def straight_run() -> Job:
    """Train the migrated checkpoint script as long as both legs, without stopping."""
    return (CHECKPOINT, ("--steps", str(2 * FIRST_LEG_STEPS)), False)


def apex_leg(workdir: Path) -> Job:
    """Train the original checkpoint script under the Apex shim and save a checkpoint."""
    return (
        CHECKPOINT,
        ("--steps", str(APEX_LEG_STEPS), "--save", str(workdir / "written-by-apex.pt")),
        True,
    )


def second_leg(workdir: Path) -> Job:
    """Resume the migrated checkpoint script from the first leg's checkpoint."""
    return (CHECKPOINT, ("--steps", str(FIRST_LEG_STEPS), "--resume", str(workdir / "leg1.pt")), False)


def resumed_from_apex(workdir: Path) -> Job:
    """Resume the migrated checkpoint script from the checkpoint the Apex original wrote."""
    return (CHECKPOINT, ("--steps", "2", "--resume", str(workdir / "written-by-apex.pt")), False)


@dataclass(frozen=True)
class Done:
    """How one run ended."""

    returncode: int
    stderr: str


class Runner:
    """Migrates each e2e script once and caches every run, so the module stays fast."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self._migrated: dict[str, Path] = {}
        self._done: dict[Job, tuple[Done, Path, Path]] = {}
        self._batches = 0

    def migrated(self, name: str) -> Path:
        if name not in self._migrated:
            original = (E2E_FIXTURES / f"{name}.in.py").read_text(encoding="utf-8")
            path = self.workdir / f"{name}.py"
            path.write_text(migrate_source(original).source, encoding="utf-8")
            self._migrated[name] = path
        return self._migrated[name]

    def _execute(self, todo: list[tuple[Job, Path, Path]]) -> list[Done]:
        """``python -m migrate.shim [--native] SCRIPT ARGS --out OUT`` for each job, via batch_run.py."""
        self._batches += 1
        batch = self.workdir / f"batch-{self._batches}"
        batch.mkdir()
        jobs = []
        for index, ((_, args, original), script, out) in enumerate(todo):
            mode = [] if original else ["--native"]
            jobs.append(
                {
                    "argv": [*mode, str(script), *args, "--out", str(out)],
                    "cwd": str(self.workdir),
                    "stdout": str(batch / f"{index}.stdout"),
                    "stderr": str(batch / f"{index}.stderr"),
                }
            )
        (batch / "jobs.json").write_text(json.dumps(jobs), encoding="utf-8")
        env = dict(
            os.environ,
            OMP_NUM_THREADS="1",
            PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        )
        command = [
            sys.executable,
            str(BATCH_RUN),
            str(batch / "jobs.json"),
            str(batch / "results.json"),
            str(PARALLEL_RUNS),
            str(RUN_TIMEOUT_S),
        ]
        started = subprocess.run(command, check=False, cwd=self.workdir, env=env, capture_output=True, text=True)
        assert started.returncode == 0, f"batch_run.py failed:\n{started.stderr[-3000:]}"
        codes = json.loads((batch / "results.json").read_text(encoding="utf-8"))
        done = []
        for code, job in zip(codes, jobs):
            stderr = Path(job["stderr"]).read_text(encoding="utf-8", errors="replace")
            if code == -9:
                stderr += f"\nkilled after {RUN_TIMEOUT_S} s"
            done.append(Done(code, stderr))
        return done

    def prefetch(self, jobs: list[Job]) -> None:
        """Run independent jobs, two at a time; failures are reported by ``run``."""
        todo: list[tuple[Job, Path, Path]] = []
        for job in dict.fromkeys(jobs):
            if job not in self._done:
                name, _, original = job
                script = E2E_FIXTURES / f"{name}.in.py" if original else self.migrated(name)
                todo.append(
                    (
                        job,
                        script,
                        self.workdir / f"{name}-{len(self._done) + len(todo)}.json",
                    )
                )
        if not todo:
            return
        for (job, script, out), done in zip(todo, self._execute(todo)):
            self._done[job] = (done, script, out)

    def run(self, name: str, args: tuple[str, ...], *, original: bool = False) -> dict[str, Any]:
        """Metrics of the migrated (or, with ``original``, the Apex) script run with ``args``."""
        job = (name, args, original)
        self.prefetch([job])
        done, script, out = self._done[job]
        which = "original (under the Apex shim)" if original else "migrated"
        assert done.returncode == 0, (
            f"{which} {name} failed (exit {done.returncode}) with {' '.join(args) or 'no options'}; "
            f"script: {script}\n{done.stderr[-3000:]}"
        )
        metrics: dict[str, Any] = json.loads(out.read_text())
        return metrics


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> Runner:
    runner = Runner(tmp_path_factory.mktemp("e2e"))
    independent = [
        (case.name, args, original)
        for case in CASES
        for args in (case.mixed_args, case.fp32_args)
        for original in (False, True)
    ]
    runner.prefetch(
        [
            *independent,
            first_leg(runner.workdir),
            straight_run(),
            apex_leg(runner.workdir),
        ]
    )
    # the runs that resume from checkpoints written above
    runner.prefetch([second_leg(runner.workdir), resumed_from_apex(runner.workdir)])
    return runner


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def scaler_scale(state: dict[str, Any] | None) -> float | None:
    """The loss scale in a GradScaler or Apex state dict; None when scaling is off."""
    if not state:
        return None
    if "scale" in state:
        return float(state["scale"])
    return float(state["loss_scaler0"]["loss_scale"])


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_migrated_script_no_longer_imports_apex(case: Case) -> None:
    source = migrate_source((E2E_FIXTURES / f"{case.name}.in.py").read_text(encoding="utf-8")).source
    assert apex_imports(source) == [], f"{case.name}: the migrated script still imports apex"


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_trains_like_fp32(case: Case, runner: Runner) -> None:
    mixed = runner.run(case.name, case.mixed_args)
    fp32 = runner.run(case.name, case.fp32_args)
    for key in case.loss_keys:
        assert len(mixed[key]) == len(fp32[key]) > 5
        assert all(math.isfinite(value) for value in mixed[key]), f"{key}: non-finite loss {mixed[key]}"
        if case.converges:
            assert mean(mixed[key][-5:]) < 0.5 * mean(mixed[key][:5]), f"{key} did not go down: {mixed[key]}"
        final_mixed, final_fp32 = mean(mixed[key][-5:]), mean(fp32[key][-5:])
        allowed = FINAL_LOSS_ABS_TOL + FINAL_LOSS_REL_TOL * abs(final_fp32)
        assert (
            abs(final_mixed - final_fp32) <= allowed
        ), f"{key}: mixed precision ends at {final_mixed:.4f}, fp32 at {final_fp32:.4f} (allowed {allowed:.4f})"


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_fp32_switch_reproduces_the_original_fp32_run(case: Case, runner: Runner) -> None:
    migrated = runner.run(case.name, case.fp32_args)
    original = runner.run(case.name, case.fp32_args, original=True)
    for key in case.loss_keys:
        assert migrated[key] == pytest.approx(
            original[key], rel=FP32_LOSS_REL_TOL, abs=1e-7
        ), f"{key}: the migrated fp32 path does not train like the original fp32 run"


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_trains_like_the_original_in_mixed_precision(case: Case, runner: Runner) -> None:
    migrated = runner.run(case.name, case.mixed_args)
    original = runner.run(case.name, case.mixed_args, original=True)
    # The original ran under the shim's Apex emulation, not in fp32.
    assert set(original["output_dtype"]) == {case.original_output_dtype}
    for key in case.loss_keys:
        final_migrated, final_original = (
            mean(migrated[key][-5:]),
            mean(original[key][-5:]),
        )
        allowed = FINAL_LOSS_ABS_TOL + FINAL_LOSS_REL_TOL * abs(final_original)
        assert abs(final_migrated - final_original) <= allowed, (
            f"{key}: migrated ends at {final_migrated:.4f}, the Apex original at {final_original:.4f} "
            f"(allowed {allowed:.4f})"
        )


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_runs_in_half_precision_and_o0_in_fp32(case: Case, runner: Runner) -> None:
    mixed = runner.run(case.name, case.mixed_args)
    fp32 = runner.run(case.name, case.fp32_args)
    assert set(mixed["output_dtype"]) == {"torch.float16"}, "the forward pass did not run under fp16 autocast"
    assert set(fp32["output_dtype"]) == {"torch.float32"}, "the fp32 switch no longer gives an fp32 forward pass"


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_dynamic_scaler_updates_once_per_iteration(case: Case, runner: Runner) -> None:
    state = runner.run(case.name, case.mixed_args)["amp_state"]
    scale = scaler_scale(state)
    assert scale is not None, "loss scaling is off in the mixed-precision run"
    assert scale >= 1.0 and math.log2(scale).is_integer(), f"not a dynamic scale: {scale}"
    tracker = state["_growth_tracker"]
    # Without an overflow the scale stays at its initial 2**16 and the tracker counts updates:
    # exactly one per optimizer step (not per micro-batch, not per loss).
    if scale == DEFAULT_INIT_SCALE:
        assert tracker == case.optimizer_steps, f"{tracker} scaler updates for {case.optimizer_steps} steps"
    else:
        assert tracker < case.optimizer_steps


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_fp32_switch_turns_scaling_off(case: Case, runner: Runner) -> None:
    assert scaler_scale(runner.run(case.name, case.fp32_args).get("amp_state")) is None


def test_gradients_read_twice_per_step_are_unscaled_once(runner: Runner) -> None:
    """A gradient norm logged and a clip, each under its own condition, read what Apex gave them:
    the unscaled gradients (one ``unscale_`` serves both; a second would raise)."""
    mixed = runner.run("factory_runtime_switch", ("--fp16",))["largest_gradient"]
    fp32 = runner.run("factory_runtime_switch", ())["largest_gradient"]
    assert len(mixed) == len(fp32) == 30
    assert mixed[0] == pytest.approx(fp32[0], rel=FIRST_GRAD_NORM_REL_TOL), "the logged gradients were still scaled"


@pytest.mark.parametrize("case", [case for case in CASES if case.clips], ids=lambda case: case.name)
def test_unscales_before_clipping(case: Case, runner: Runner) -> None:
    mixed = runner.run(case.name, case.mixed_args)["grad_norm"]
    fp32 = runner.run(case.name, case.fp32_args)["grad_norm"]
    assert len(mixed) == len(fp32) == case.optimizer_steps * case.clipped_per_step
    assert mixed[0] == pytest.approx(
        fp32[0], rel=FIRST_GRAD_NORM_REL_TOL
    ), f"first clipped norm {mixed[0]:.4g} vs fp32 {fp32[0]:.4g}: gradients were clipped while still scaled"
    low, high = GRAD_NORM_RATIO_BOUNDS
    ratios = [m / f for m, f in zip(mixed, fp32)]
    assert all(low <= ratio <= high for ratio in ratios), f"clipped-norm ratios to fp32: {ratios}"


def test_checkpoint_resume_restores_scaler_state(runner: Runner) -> None:
    first = runner.run(*first_leg(runner.workdir)[:2])
    second = runner.run(*second_leg(runner.workdir)[:2])
    straight = runner.run(*straight_run()[:2])

    saved = first["saved_amp_state"]
    assert scaler_scale(saved) is not None, "the checkpoint holds no loss-scaler state"
    assert second["restored_amp_state"] == saved
    assert set(first["output_dtype"] + second["output_dtype"]) == {"torch.float16"}
    # The data depends only on the step, so the resumed leg repeats the uninterrupted run.
    assert second["loss"] == pytest.approx(straight["loss"][FIRST_LEG_STEPS:], rel=1e-3, abs=1e-5)


def test_resume_from_checkpoints_written_by_apex(runner: Runner) -> None:
    import torch

    # The original script under the Apex shim writes amp.state_dict() in Apex's own format.
    name, args, _ = apex_leg(runner.workdir)
    runner.run(name, args, original=True)
    apex_ckpt = runner.workdir / "written-by-apex.pt"
    checkpoint = torch.load(apex_ckpt, map_location="cpu")
    assert checkpoint["amp"] == {"loss_scaler0": {"loss_scale": DEFAULT_INIT_SCALE, "unskipped": APEX_LEG_STEPS}}
    resumed = runner.run(*resumed_from_apex(runner.workdir)[:2])
    assert scaler_scale(resumed["restored_amp_state"]) == DEFAULT_INIT_SCALE
    assert resumed["restored_amp_state"]["_growth_tracker"] == APEX_LEG_STEPS
    assert all(math.isfinite(loss) for loss in resumed["loss"])

    # The same checkpoint after Apex had backed off: the scale must come back exactly.
    checkpoint["amp"] = {"loss_scaler0": {"loss_scale": 1024.0, "unskipped": 7}}
    backed_off = runner.workdir / "written-by-apex-backed-off.pt"
    torch.save(checkpoint, backed_off)
    restored = runner.run(CHECKPOINT, ("--steps", "2", "--resume", str(backed_off)))["restored_amp_state"]
    assert scaler_scale(restored) == 1024.0
    assert restored["_growth_tracker"] == 7


@pytest.mark.parametrize(
    "name", ["oscar_clip_every_microbatch", "oscar_clip_continue_before_step", "if_else_clip_every_microbatch"]
)
def test_clips_every_micro_batch_as_apex_did(runner: Runner, name: str) -> None:
    """Oscar's clip after each backward pass: Apex clipped the unscaled running sum of the
    gradients each time. The migration clips the scaled sum at a scaled threshold; the norms it
    reports (and so the clipping it does, which feeds the next norm) must match Apex's."""
    migrated = runner.run(name, ("--fp16",))["grad_norm"]
    original = runner.run(name, ("--fp16",), original=True)["grad_norm"]
    threshold = 0.3  # the script's --max_grad_norm default
    assert sum(norm > threshold for norm in original) > len(original) // 4, "too few clips to prove anything"
    assert migrated == pytest.approx(original, rel=0.01)
