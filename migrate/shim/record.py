"""The recording harness ``ampmigrate verify`` runs each script under (one process per run).

``python -m migrate.shim.record --out FILE --steps N [--apex] [--fp32] [--inject I,J]
[--replay I:overflow,J:forced] [--force-skip I,J] [--growth-interval W] [--path DIR]
[--cuda-on-cpu auto|yes|no] [--seed S] SCRIPT [ARGS...]`` seeds torch/random/numpy, installs
the Apex shim (``--apex``) and the CUDA-to-CPU mapping, then runs SCRIPT as ``__main__``.

It writes JSON lines to FILE: a ``meta`` line; a ``scaler`` line for every loss scaler created
(its kind, initial scale, growth window); one ``step`` line per optimizer step, taken or skipped,
with the losses scaled since the previous step (summed: the loss of the optimizer step, however
many micro-batches fed it), the loss scale of each, the norm of the gradients the optimizer was
about to apply (after unscaling and clipping), the norm of the update it made and the norm of its
params after it; and a ``summary`` line with the precision fingerprint (matmul-class ops by
result dtype, loss ops by input dtype) and why the run stopped. After N steps the process exits
at once.

Overflows, so that loss scaling is exercised and compared, not just present:

- ``--inject I,J`` (the original): just before a dynamic scaler checks the grads of step I for
  inf/NaN, one grad element becomes inf. Apex then halves its scale and skips the step. Where no
  dynamic scaler checks the grads (a static scale, O0, amp disabled), step I is skipped instead
  (``forced``): Apex would have applied the inf, and the point is to exercise the migration.
- ``--replay I:overflow,J:forced`` (the migration): the original's skipped steps. An enabled
  ``GradScaler`` gets an inf in a grad of step I when it unscales, so it must skip and back off by
  its own rule. Where nothing unscales before the step, an ``overflow`` step has the inf applied
  (what a missing scaler does with an overflow) and a ``forced`` step is skipped.
- ``--force-skip I,J`` (the fp32 calibration of the original): skip these steps, like the mixed
  run did. (The calibration of the migration gets ``--replay`` like the migration itself.)

``--growth-interval W`` replaces the default growth window (2000) of Apex's scalers and of
``GradScaler`` by W, so that growth happens within a short run too. ``--fp32`` runs the script
in float32 for calibration: autocast disabled, ``.half()`` a no-op, and under the shim every
``amp.initialize`` forced to O0 (with ``--force-skip`` for the steps the mixed run skipped); a
native script keeps its GradScaler and gets the same ``--replay`` as its mixed run.

A native run on a machine without Apex gets the shim's stand-ins for what current Apex still
ships (``apex.optimizers``, ``apex.normalization``, ...), while ``apex.amp``, ``apex.fp16_utils``
and ``apex.parallel``, removed upstream, do not import.
"""

from __future__ import annotations

import argparse
import functools
import importlib.abc
import importlib.util
import json
import math
import os
import random
import sys
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TextIO

import torch
from torch.optim import Optimizer
from torch.utils._python_dispatch import TorchDispatchMode

#: The growth window Apex's LossScaler and torch's GradScaler default to.
DEFAULT_WINDOW = 2000

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
# Loss ops that both Apex O1 and torch.autocast (CUDA and CPU lists) run in float32: one that
# sees float16 inputs was computed outside autocast.
_LOSS_OPS = {
    torch.ops.aten.mse_loss,
    torch.ops.aten.nll_loss_forward,
    torch.ops.aten.nll_loss2d_forward,
    torch.ops.aten.binary_cross_entropy_with_logits,
    torch.ops.aten.smooth_l1_loss,
    torch.ops.aten.huber_loss,
}


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


class _PrecisionCounter(TorchDispatchMode):
    """Counts matmul-class ops by result dtype and loss ops by input dtype."""

    def __init__(self) -> None:
        super().__init__()
        self.matmul: Counter[str] = Counter()
        self.losses: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        packet = func.overloadpacket
        if packet in _MATMUL_OPS:
            first = out[0] if isinstance(out, (tuple, list)) else out
            if isinstance(first, torch.Tensor):
                self.matmul[_dtype_name(first.dtype)] += 1
        elif packet in _LOSS_OPS and args and isinstance(args[0], torch.Tensor):
            self.losses[f"{packet.__name__}:{_dtype_name(args[0].dtype)}"] += 1
        return out


def _number(value: float | None) -> float | str | None:
    """A float for JSON: finite as is, otherwise ``"inf"``, ``"-inf"`` or ``"nan"``."""
    if value is None or math.isfinite(value):
        return value
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def _params(optimizer: Any) -> list[torch.Tensor]:
    return [param for group in optimizer.param_groups for param in group["params"]]


def _norm(tensors: Iterable[torch.Tensor]) -> float:
    """The 2-norm of all ``tensors`` together, in float64.

    ``linalg.vector_norm`` is on none of Apex's O1 cast lists, so O1 leaves it in float64.
    """
    total = 0.0
    with torch.no_grad():
        for tensor in tensors:
            total += float(torch.linalg.vector_norm(tensor.detach(), dtype=torch.float64)) ** 2
    return math.sqrt(total) if math.isfinite(total) else total


def _plant_inf(tensors: Iterable[torch.Tensor | None]) -> bool:
    """Set the first element of the first dense floating tensor to inf; whether one was found."""
    for tensor in tensors:
        if tensor is not None and not tensor.is_sparse and tensor.is_floating_point() and tensor.numel():
            with torch.no_grad():
                tensor.view(-1)[0] = float("inf")
            return True
    return False


@dataclass
class Plan:
    """What this run injects, replays or skips (see the module docstring)."""

    steps: int
    inject: frozenset[int] = frozenset()
    replay: dict[int, str] = field(default_factory=dict)
    force_skip: frozenset[int] = frozenset()
    fp32: bool = False
    growth_interval: int | None = None

    def planted_kind(self, step: int) -> str | None:
        """``overflow``/``forced`` when this run must see an overflow at ``step``; else None."""
        if step in self.inject:
            return "overflow"
        return self.replay.get(step)


class Recorder:
    """Collects per-step records and writes them as JSON lines."""

    def __init__(self, stream: TextIO, plan: Plan) -> None:
        self.stream = stream
        self.plan = plan
        self.steps = 0
        self.optimizer_ids: dict[int, int] = {}
        # Losses handed to the loss scaler since the last step: (value, scale, dynamic, source).
        self.scaled: list[tuple[float, float | None, bool | None, str]] = []
        self.backward_losses: list[float] = []
        self.in_backward = False  # inside the recorded Tensor.backward: count each call once
        # Steps whose planted overflow reached a scaler's check (or was applied).
        self.delivered: set[int] = set()
        self.depth = 0
        self.forced_fp32 = 0
        self.counter = _PrecisionCounter()
        self.finished = False

    def write(self, record: dict[str, Any]) -> None:
        self.stream.write(json.dumps(record) + "\n")
        self.stream.flush()

    # --- what the scripts do -------------------------------------------------------------

    def note_scaled_loss(self, loss: Any, scale: float | None, dynamic: bool | None, source: str) -> None:
        if isinstance(loss, torch.Tensor) and loss.numel() == 1:
            self.scaled.append((float(loss.detach().float()), scale, dynamic, source))

    def note_backward(self, tensor: torch.Tensor) -> None:
        if tensor.numel() == 1 and tensor.is_floating_point():
            self.backward_losses.append(float(tensor.detach().float()))

    def at_check(self, tensors: Iterable[torch.Tensor | None]) -> None:
        """A dynamic scaler is about to check grads for inf/NaN: plant the overflow if due."""
        step = self.steps
        if self.plan.planted_kind(step) and step not in self.delivered and _plant_inf(tensors):
            self.delivered.add(step)

    def before_step(self, optimizer: Any) -> bool:
        """Called before a real optimizer step; True when the step must be skipped (forced)."""
        step = self.steps
        if step in self.plan.force_skip:
            return True
        kind = self.plan.planted_kind(step)
        if kind is None or step in self.delivered:
            return False
        if step in self.plan.inject or kind == "forced":
            return True
        # The original skipped this step on an overflow, and no scaler checked these grads:
        # apply the overflow, as such a migration would.
        if _plant_inf(param.grad for param in _params(optimizer)):
            self.delivered.add(step)
        return False

    def note_step(
        self,
        optimizer: Any,
        *,
        taken: bool,
        skip: str | None = None,
        grad_norm: float | None = None,
        update_norm: float | None = None,
    ) -> None:
        if self.finished:
            return
        index = self.optimizer_ids.setdefault(id(optimizer), len(self.optimizer_ids))
        source: str | None
        if self.scaled:
            values = [value for value, _, _, _ in self.scaled]
            source = self.scaled[0][3]
        else:
            values, source = self.backward_losses, "backward" if self.backward_losses else None
        self.write(
            {
                "kind": "step",
                "step": self.steps,
                "optimizer": index,
                "taken": taken,
                "skip": skip,
                "injected": self.steps in self.delivered or skip == "forced",
                "loss": _number(math.fsum(values)) if values else None,
                "loss_count": len(values),
                "loss_source": source,
                "scales": [scale for _, scale, _, _ in self.scaled],
                "dynamic": self.scaled[0][2] if self.scaled else None,
                "grad_norm": _number(grad_norm),
                "update_norm": _number(update_norm),
                "param_norm": _number(_norm(_params(optimizer))),
            }
        )
        self.steps += 1
        self.scaled = []
        self.backward_losses = []
        if self.steps >= self.plan.steps:
            self.finish("limit")
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)

    def note_scaler(self, kind: str, init_scale: float | None, window: int, configured: int, **extra: Any) -> None:
        self.write(
            {
                "kind": "scaler",
                "step": self.steps,
                "impl": kind,
                "init_scale": init_scale,
                "window": window,
                "configured_window": configured,
                **extra,
            }
        )

    def finish(self, stopped: str) -> None:
        if self.finished:
            return
        self.finished = True
        self.write(
            {
                "kind": "summary",
                "steps": self.steps,
                "stopped": stopped,
                "matmul_dtypes": dict(self.counter.matmul),
                "loss_op_dtypes": dict(self.counter.losses),
                "forced_fp32": self.forced_fp32,
                "planted": sorted(self.delivered),
            }
        )


def _window(recorder: Recorder, configured: int) -> int:
    interval = recorder.plan.growth_interval
    return interval if interval is not None and configured == DEFAULT_WINDOW else configured


def _hook_optimizers(recorder: Recorder) -> None:
    """Wrap every optimizer class's step (as torch does for its hooks): measure, or skip."""
    torch_wrap = Optimizer.profile_hook_step

    def profile_hook_step(func: Callable[..., Any]) -> Callable[..., Any]:
        wrapped = torch_wrap(func)

        @functools.wraps(wrapped)
        def step(optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            if recorder.depth or recorder.finished:
                # A step inside a step (an optimizer built on another): the outer one counts.
                return wrapped(optimizer, *args, **kwargs)
            if recorder.before_step(optimizer):
                recorder.note_step(optimizer, taken=False, skip="forced")
                return None
            params = _params(optimizer)
            grad_norm = _norm(param.grad for param in params if param.grad is not None)
            # An optimizer that unscales inside its step (fused AdamW under GradScaler) is
            # handed scaled grads, with the scale and the inf check as attributes.
            grad_scale = getattr(optimizer, "grad_scale", None)
            if isinstance(grad_scale, torch.Tensor):
                grad_norm /= float(grad_scale)
            found_inf = getattr(optimizer, "found_inf", None)
            before = [param.detach().clone() for param in params]
            recorder.depth += 1
            try:
                result = wrapped(optimizer, *args, **kwargs)
            finally:
                recorder.depth -= 1
            if isinstance(found_inf, torch.Tensor) and float(found_inf):
                recorder.note_step(optimizer, taken=False, skip="overflow")
                return result
            update = _norm(param.detach() - old for param, old in zip(params, before))
            recorder.note_step(optimizer, taken=True, grad_norm=grad_norm, update_norm=update)
            return result

        return step

    Optimizer.profile_hook_step = staticmethod(profile_hook_step)  # type: ignore[method-assign,assignment]


def _hook_native(recorder: Recorder) -> None:
    """Record at GradScaler.scale/step; plant overflows at unscale_; record every backward."""
    from torch.amp.grad_scaler import GradScaler, OptState

    original_init = GradScaler.__init__
    original_scale = GradScaler.scale
    original_unscale = GradScaler.unscale_
    original_step = GradScaler.step

    @functools.wraps(original_init)
    def init(self: GradScaler, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        if not self._enabled:
            recorder.note_scaler("GradScaler", None, 0, 0, enabled=False)
            return
        configured = self._growth_interval
        self._growth_interval = _window(recorder, configured)
        recorder.note_scaler(
            "GradScaler",
            self._init_scale,
            self._growth_interval,
            configured,
            enabled=True,
            growth_factor=self._growth_factor,
            backoff_factor=self._backoff_factor,
        )

    def scale(self: GradScaler, outputs: Any) -> Any:
        enabled = self.is_enabled()
        recorder.note_scaled_loss(
            outputs, self.get_scale() if enabled else None, True if enabled else None, "GradScaler.scale"
        )
        return original_scale(self, outputs)

    def unscale_(self: GradScaler, optimizer: Any) -> None:
        if self.is_enabled() and self._per_optimizer_states[id(optimizer)]["stage"] is OptState.READY:
            recorder.at_check(param.grad for param in _params(optimizer))
        return original_unscale(self, optimizer)

    def step(self: GradScaler, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        recorded = recorder.steps
        result = original_step(self, optimizer, *args, **kwargs)
        if self.is_enabled() and recorder.steps == recorded:
            # Skipped: GradScaler did not call the optimizer's step.
            state = self._per_optimizer_states[id(optimizer)]
            found_inf = sum(float(v) for v in state["found_inf_per_device"].values())
            if state["stage"] is OptState.STEPPED and found_inf:
                recorder.note_step(optimizer, taken=False, skip="overflow")
        return result

    GradScaler.__init__ = init  # type: ignore[method-assign]
    GradScaler.scale = scale  # type: ignore[method-assign,assignment]
    GradScaler.unscale_ = unscale_  # type: ignore[method-assign]
    GradScaler.step = step  # type: ignore[method-assign]
    original_check = getattr(GradScaler, "_check_inf_per_device", None)
    if original_check is not None:
        # The inf check of optimizers that unscale inside their step (fused AdamW): where
        # GradScaler looks at their grads instead of unscale_.
        def check_inf_per_device(self: GradScaler, optimizer: Any) -> Any:
            recorder.at_check(param.grad for param in _params(optimizer))
            return original_check(self, optimizer)

        GradScaler._check_inf_per_device = check_inf_per_device  # type: ignore[method-assign]

    original_backward = torch.Tensor.backward

    @functools.wraps(original_backward)
    def backward(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if recorder.in_backward:
            # a torch-function mode (CUDA mapped to the CPU) dispatching this same call again
            return original_backward(self, *args, **kwargs)
        recorder.in_backward = True
        try:
            recorder.note_backward(self)
            return original_backward(self, *args, **kwargs)
        finally:
            recorder.in_backward = False

    torch.Tensor.backward = backward  # type: ignore[method-assign]


def _hook_shim(recorder: Recorder) -> None:
    """Record the shim's scale_loss and skipped steps; plant overflows at its checks."""
    from migrate.shim import events
    from migrate.shim.scaler import LossScaler

    def listener(event: str, **data: Any) -> None:
        if event == "scale_loss":
            recorder.note_scaled_loss(data["loss"], data["scale"], data["dynamic"], "amp.scale_loss")
        elif event == "check_overflow":
            if data["scaler"].dynamic:
                recorder.at_check(data["tensors"])
        elif event == "step_skipped":
            recorder.note_step(data["optimizer"], taken=False, skip="overflow")

    events.subscribe(listener)
    original_init = LossScaler.__init__

    @functools.wraps(original_init)
    def init(self: LossScaler, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        configured = self._scale_seq_len
        self._scale_seq_len = _window(recorder, configured)
        recorder.note_scaler(
            "apex", self._loss_scale, self._scale_seq_len, configured, dynamic=self.dynamic, enabled=True
        )

    LossScaler.__init__ = init  # type: ignore[method-assign]


def _force_fp32(recorder: Recorder, apex: bool) -> None:
    """A calibration run: the same script in float32, everything else as it was.

    ``torch.autocast`` is disabled and ``.half()`` (tensors and modules) becomes ``.float()``;
    under the shim ``amp.initialize`` is forced to O0 and ``amp.init`` disabled. A GradScaler is
    kept: in float32 its scaling is exact, and whatever the script does with it (right or
    wrong) happens in both precisions, so that the two runs differ by precision alone.
    """
    from torch.amp.autocast_mode import autocast

    original_autocast_init = autocast.__init__

    @functools.wraps(original_autocast_init)
    def autocast_init(self: autocast, *args: Any, **kwargs: Any) -> None:
        original_autocast_init(self, *args, **kwargs)
        if self._enabled:
            recorder.forced_fp32 += 1
            self._enabled = False

    autocast.__init__ = autocast_init  # type: ignore[method-assign]
    original_tensor_half = torch.Tensor.half

    def tensor_half(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if self.is_floating_point():
            recorder.forced_fp32 += 1
            return self.float()
        return original_tensor_half(self, *args, **kwargs)

    def module_half(self: torch.nn.Module) -> torch.nn.Module:
        recorder.forced_fp32 += 1
        return self.float()

    torch.Tensor.half = tensor_half  # type: ignore[method-assign,assignment]
    torch.nn.Module.half = module_half  # type: ignore[method-assign,assignment]
    if not apex:
        return
    from migrate.shim import amp, casting

    original_initialize = amp.initialize

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
        recorder.forced_fp32 += 1
        return original_initialize(models, optimizers, opt_level="O0", **kwargs)

    amp.initialize = initialize_o0  # type: ignore[assignment]
    original_init = casting.init

    def init_disabled(*args: Any, **kwargs: Any) -> Any:
        recorder.forced_fp32 += 1
        kwargs["enabled"] = False
        return original_init(*args[1:], **kwargs)  # `amp.init(args.fp16)`: enabled comes first

    amp.init = casting.init = init_disabled  # type: ignore[assignment]


#: Apex packages removed upstream in May 2025 (NVIDIA/apex PR #1896): a migration must not need them.
REMOVED_FROM_APEX = ("apex.amp", "apex.fp16_utils", "apex.parallel", "apex.RNN")


class _CurrentApex(importlib.abc.MetaPathFinder):
    """Ahead of the shim's finder: the packages a current Apex no longer ships do not import."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> None:
        if any(fullname == name or fullname.startswith(name + ".") for name in REMOVED_FROM_APEX):
            raise ModuleNotFoundError(
                f"No module named {fullname!r}: removed from Apex in May 2025, so a migration cannot use it",
                name=fullname,
            )
        return None


def _provide_current_apex() -> bool:
    """For a migration that still uses what Apex ships today (FusedLAMB, FusedLayerNorm, ...)
    on a machine without Apex: the shim's modules stand in, all but the removed packages.
    Whether they were installed."""
    if importlib.util.find_spec("apex") is not None:
        return False
    from migrate.shim import install

    install()
    sys.meta_path.insert(0, _CurrentApex())
    return True


def _seed(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy

        numpy.random.seed(seed)
    except ImportError:  # pragma: no cover - numpy ships with most torch installs
        pass


def _steps(text: str) -> frozenset[int]:
    return frozenset(int(item) for item in text.split(",") if item)


def _replay(text: str) -> dict[int, str]:
    replay = {}
    for item in filter(None, text.split(",")):
        step, _, kind = item.partition(":")
        replay[int(step)] = kind or "overflow"
    return replay


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m migrate.shim.record")
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--apex", action="store_true")
    parser.add_argument("--fp32", action="store_true")
    parser.add_argument("--inject", default="", help="steps at which to plant an overflow")
    parser.add_argument("--replay", default="", help="STEP:overflow|forced,... (the original's skips)")
    parser.add_argument("--force-skip", default="", help="steps to skip (the calibration run)")
    parser.add_argument("--growth-interval", type=int, default=None)
    parser.add_argument("--path", action="append", default=[], help="a folder to put on sys.path")
    parser.add_argument("--cuda-on-cpu", choices=("auto", "yes", "no"), default="auto")
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    options = parse(argv)
    from migrate.shim.run import prepare, run_script

    # One thread: both runs then reduce in the same order, and runs share the cores.
    torch.set_num_threads(1)
    mapping = {"auto": None, "yes": True, "no": False}[options.cuda_on_cpu]
    if options.cuda_on_cpu == "no" and not torch.cuda.is_available():
        print("ampmigrate verify: --device cuda, but CUDA is not available", file=sys.stderr)
        return 2
    cuda_on_cpu = prepare(apex=options.apex, cuda_on_cpu=mapping)
    current_apex = False if options.apex else _provide_current_apex()
    for folder in reversed(options.path):
        sys.path.insert(0, folder)
    plan = Plan(
        steps=options.steps,
        inject=_steps(options.inject),
        replay=_replay(options.replay),
        force_skip=_steps(options.force_skip),
        fp32=options.fp32,
        growth_interval=options.growth_interval,
    )
    # The stream is flushed after every record: a run stopped by os._exit keeps them all.
    with open(options.out, "w", encoding="utf-8") as stream:
        recorder = Recorder(stream, plan)
        recorder.write(
            {
                "kind": "meta",
                "apex": options.apex,
                "fp32": options.fp32,
                "cuda_on_cpu": cuda_on_cpu,
                "torch": torch.__version__,
                "cuda": torch.cuda.is_available() and not cuda_on_cpu,
                "shim_for_current_apex": current_apex,
            }
        )
        _hook_optimizers(recorder)
        _hook_native(recorder)
        if options.apex:
            _hook_shim(recorder)
        if options.fp32:
            _force_fp32(recorder, options.apex)
        _seed(options.seed)
        stopped = "error"
        recorder.counter.__enter__()
        try:
            run_script(options.script, options.args)
            stopped = "end"
        except SystemExit as exit_:
            if exit_.code not in (None, 0):
                raise
            stopped = "exit"
        finally:
            recorder.finish(stopped)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
