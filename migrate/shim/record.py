"""The recording harness ``ampmigrate verify`` runs each script under (one subprocess each).

``python -m migrate.shim.record --out FILE --steps N --seed S [--apex] [--fp32]
[--skip-steps I,J] [--cuda-on-cpu auto|yes|no] SCRIPT [ARGS...]`` seeds torch/random/numpy, installs the shim
(``--apex``) and the CUDA-to-CPU mapping, then runs SCRIPT as ``__main__``. It writes one JSON
line per optimizer step to FILE: the loss last seen at ``amp.scale_loss`` /
``GradScaler.scale`` (or, failing both, at ``Tensor.backward``), the loss scale, whether the
step was taken or skipped, and the norm of the optimizer's params after it. A summary line
counts matmul-class ops by result dtype (the run's precision fingerprint). After N steps the
process exits at once. ``--fp32`` forces every ``amp.initialize`` to O0 and skips the steps listed in ``--skip-steps``
(the ones the mixed run skipped): the calibration run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
from collections import Counter
from typing import Any, TextIO

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils._python_dispatch import TorchDispatchMode

# Ops whose result dtype says in which precision the heavy math ran (after autocast/O1 casts).
_MATMUL_OPS = {
    torch.ops.aten.mm,
    torch.ops.aten.addmm,
    torch.ops.aten.bmm,
    torch.ops.aten.baddbmm,
    torch.ops.aten.addbmm,
    torch.ops.aten.addmv,
    torch.ops.aten.mv,
    torch.ops.aten.convolution,
    torch.ops.aten.convolution_backward,
    torch.ops.aten._convolution,
}


class _PrecisionCounter(TorchDispatchMode):
    """Counts matmul-class ops by the dtype of their first tensor result."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket in _MATMUL_OPS:
            first = out[0] if isinstance(out, (tuple, list)) else out
            if isinstance(first, torch.Tensor):
                self.counts[str(first.dtype).replace("torch.", "")] += 1
        return out


class Recorder:
    """Collects per-step records and writes them as JSON lines."""

    def __init__(self, stream: TextIO, steps: int) -> None:
        self.stream = stream
        self.limit = steps
        self.steps = 0
        self.optimizer_ids: dict[int, int] = {}
        # (loss, scale, dynamic scale?, where it was seen)
        self.pending_loss: tuple[float, float | None, bool | None, str] | None = None
        self.pending_backward_loss: float | None = None
        self.scale_calls_since_step = 0
        self.skip_steps: frozenset[int] = frozenset()
        self.forced_o0 = 0
        self.counter = _PrecisionCounter()
        self.in_scaler_step = False
        self.finished = False

    def write(self, record: dict[str, Any]) -> None:
        self.stream.write(json.dumps(record) + "\n")
        self.stream.flush()

    def note_loss(self, loss: Any, scale: float | None, dynamic: bool | None, source: str) -> None:
        if isinstance(loss, torch.Tensor) and loss.numel() == 1:
            self.pending_loss = (float(loss.detach().float()), scale, dynamic, source)
            self.scale_calls_since_step += 1

    def note_backward(self, tensor: torch.Tensor) -> None:
        if tensor.numel() == 1:
            self.pending_backward_loss = float(tensor.detach().float())

    def note_step(self, optimizer: Any, taken: bool) -> None:
        if self.finished:
            return
        index = self.optimizer_ids.setdefault(id(optimizer), len(self.optimizer_ids))
        loss: float | None
        dynamic: bool | None
        if self.pending_loss is not None:
            loss, scale, dynamic, source = self.pending_loss
        else:
            loss, scale, dynamic, source = (
                self.pending_backward_loss,
                None,
                None,
                "backward",
            )
        self.write(
            {
                "kind": "step",
                "step": self.steps,
                "optimizer": index,
                "taken": taken,
                "loss": _finite_or_none(loss),
                "loss_source": source,
                "scale": scale,
                "dynamic": dynamic,
                "scale_calls": self.scale_calls_since_step,
                "param_norm": _finite_or_none(_param_norm(optimizer)),
            }
        )
        self.steps += 1
        self.pending_loss = None
        self.pending_backward_loss = None
        self.scale_calls_since_step = 0
        if self.steps >= self.limit:
            self.finish(stopped=True)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)

    def finish(self, stopped: bool) -> None:
        if self.finished:
            return
        self.finished = True
        self.write(
            {
                "kind": "summary",
                "steps": self.steps,
                "stopped_at_limit": stopped,
                "matmul_dtypes": dict(self.counter.counts),
                "forced_o0": self.forced_o0,
            }
        )


def _finite_or_none(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _param_norm(optimizer: Any) -> float:
    with torch.no_grad():
        total = 0.0
        for group in optimizer.param_groups:
            for param in group["params"]:
                total += float(param.detach().double().pow(2).sum())
        return math.sqrt(total)


def _hook_native(recorder: Recorder) -> None:
    """Record at GradScaler.scale/step and at every optimizer step."""
    from torch.amp.grad_scaler import GradScaler, OptState

    original_scale = GradScaler.scale
    original_step = GradScaler.step

    def scale(self: GradScaler, outputs: Any) -> Any:
        enabled = self.is_enabled()
        scale = self.get_scale() if enabled else None
        recorder.note_loss(outputs, scale, True if enabled else None, "GradScaler.scale")
        return original_scale(self, outputs)

    def step(self: GradScaler, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        if not self.is_enabled():
            return original_step(self, optimizer, *args, **kwargs)
        recorder.in_scaler_step = True
        try:
            result = original_step(self, optimizer, *args, **kwargs)
        finally:
            recorder.in_scaler_step = False
        state = self._per_optimizer_states[id(optimizer)]
        found_inf = sum(float(v) for v in state["found_inf_per_device"].values())
        if state["stage"] is OptState.STEPPED and found_inf:
            recorder.note_step(optimizer, taken=False)
        return result

    GradScaler.scale = scale  # type: ignore[method-assign]
    GradScaler.step = step  # type: ignore[method-assign]

    def after_step(optimizer: Any, args: Any, kwargs: Any) -> None:
        recorder.note_step(optimizer, taken=True)

    register_optimizer_step_post_hook(after_step)

    original_backward = torch.Tensor.backward

    def backward(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        recorder.note_backward(self)
        return original_backward(self, *args, **kwargs)

    torch.Tensor.backward = backward  # type: ignore[method-assign]


def _hook_shim(recorder: Recorder, force_fp32: bool) -> None:
    """Record the shim's scale_loss and skipped steps; for calibration, force O0."""
    from migrate.shim import amp, events

    def listener(event: str, **data: Any) -> None:
        if event == "scale_loss":
            recorder.note_loss(data["loss"], data["scale"], data["dynamic"], "amp.scale_loss")
        elif event == "step_skipped":
            recorder.note_step(data["optimizer"], taken=False)

    events.subscribe(listener)
    if not force_fp32:
        return
    original_initialize = amp.initialize

    def replay_skips(optimizer: Any) -> None:
        # The fp32 run skips the steps the mixed run skipped, so that the two differ by
        # precision alone, not by a few extra updates.
        original_step = optimizer.step

        def step(*args: Any, **kwargs: Any) -> Any:
            if recorder.steps in recorder.skip_steps:
                recorder.note_step(optimizer, taken=False)
                return None
            return original_step(*args, **kwargs)

        optimizer.step = step

    def initialize_o0(models: Any, optimizers: Any = None, **kwargs: Any) -> Any:
        for name in (
            "enabled",
            "opt_level",
            "cast_model_type",
            "patch_torch_functions",
            "keep_batchnorm_fp32",
            "master_weights",
            "loss_scale",
        ):
            kwargs.pop(name, None)
        recorder.forced_o0 += 1
        result = original_initialize(models, optimizers, opt_level="O0", **kwargs)
        if optimizers is not None:
            for optimizer in (optimizers if isinstance(optimizers, list) else [optimizers]):
                replay_skips(optimizer)
        return result

    amp.initialize = initialize_o0  # type: ignore[assignment]


def _seed(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy

        numpy.random.seed(seed)
    except ImportError:  # pragma: no cover - numpy ships with torch wheels
        pass


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m migrate.shim.record")
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--apex", action="store_true")
    parser.add_argument("--fp32", action="store_true")
    parser.add_argument("--skip-steps", default="", help="comma-separated steps to skip (--fp32)")
    parser.add_argument("--cuda-on-cpu", choices=("auto", "yes", "no"), default="auto")
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    options = parser.parse_args(argv)

    from migrate.shim.run import prepare, run_script

    # One thread: both runs then reduce in the same order, and two runs share 2 cores.
    torch.set_num_threads(1)
    mapping = {"auto": None, "yes": True, "no": False}[options.cuda_on_cpu]
    if options.cuda_on_cpu == "no" and not torch.cuda.is_available():
        print(
            "ampmigrate verify: --device cuda, but CUDA is not available",
            file=sys.stderr,
        )
        return 2
    cuda_on_cpu = prepare(apex=options.apex, cuda_on_cpu=mapping)
    # The stream is flushed after every record: a run stopped by os._exit keeps them all.
    with open(options.out, "w", encoding="utf-8") as stream:
        recorder = Recorder(stream, options.steps)
        recorder.skip_steps = frozenset(int(n) for n in options.skip_steps.split(",") if n)
        recorder.write(
            {
                "kind": "meta",
                "apex": options.apex,
                "fp32": options.fp32,
                "cuda_on_cpu": cuda_on_cpu,
                "torch": torch.__version__,
                "cuda": torch.cuda.is_available() and not cuda_on_cpu,
            }
        )
        _hook_native(recorder)
        if options.apex:
            _hook_shim(recorder, options.fp32)
        _seed(options.seed)
        recorder.counter.__enter__()
        try:
            run_script(options.script, options.args)
        except SystemExit as exit_:
            if exit_.code not in (None, 0):
                raise
        recorder.finish(stopped=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
