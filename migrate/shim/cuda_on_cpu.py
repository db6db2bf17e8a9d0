"""Run CUDA-only mixed-precision training code on the CPU, in float16.

``install()`` patches torch in this process so that a script written for one CUDA GPU runs
unmodified on a machine without one:

- ``torch.autocast("cuda", ...)``, ``torch.amp.autocast("cuda", ...)`` and
  ``torch.cuda.amp.autocast(...)`` become CPU autocast with ``dtype=torch.float16`` (an explicit
  ``dtype`` and ``enabled``/``cache_enabled`` are kept). The ops cast are then those of torch's
  CPU autocast lists, not its CUDA lists; ``verify`` reports this.
- ``torch.amp.GradScaler("cuda", ...)``, ``torch.GradScaler(...)`` and
  ``torch.cuda.amp.GradScaler(...)`` become an enabled CPU GradScaler with the same arguments.
- Tensors and modules asked to go to CUDA stay on the CPU: ``Tensor.cuda()``, ``Module.cuda()``,
  ``.to("cuda"...)``, ``.to(torch.device("cuda"))``, factory functions with ``device="cuda"``,
  ``.type(torch.cuda.HalfTensor)`` and ``.pin_memory()``; the legacy constructors
  (``torch.cuda.IntTensor([0])``) make CPU tensors. ``torch.device("cuda")`` itself is left
  alone, so ``device.type == "cuda"`` still holds and such a script keeps its CUDA code path.
- ``torch.cuda.synchronize``, ``set_device``, ``current_device``, ``get_device_name``,
  ``reset_peak_memory_stats`` and friends become harmless; ``torch.backends.cudnn.*`` settings
  already are on a CPU build. ``torch.cuda.Stream``/``stream()``/``current_stream()`` and
  ``Tensor.record_stream`` do nothing (CPU work is already ordered); ``torch.cuda.Event``
  measures wall-clock time for ``elapsed_time``.

- ``torch.distributed.init_process_group(backend="nccl")`` uses gloo, and
  ``torch.nn.parallel.DistributedDataParallel`` drops ``device_ids``/``output_device`` for a
  module that stayed on the CPU (torch rejects them there) and, in a one-process group,
  accepts SyncBatchNorm layers on the CPU, which run as BatchNorm there (alone in a group they
  never synchronise).

``torch.cuda.is_available()`` returns True and ``torch.cuda.device_count()`` returns 1 after
``install()``. Training scripts usually pick their device with
``"cuda" if torch.cuda.is_available() else "cpu"``; answering False would send them down their
CPU branch (bfloat16 CPU autocast, often no scaler), which is not the code a migration has to be
checked on. Only call ``install()`` when CUDA really is absent; it refuses otherwise.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["CPU_FLOAT16_NOTE", "install", "is_installed"]

_installed = False
_mode: TorchFunctionMode | None = None


def is_installed() -> bool:
    """Whether ``install()`` has patched this process."""
    return _installed


def _is_cuda_device(value: object) -> bool:
    if isinstance(value, torch.device):
        return value.type == "cuda"
    if isinstance(value, str):
        return value == "cuda" or value.startswith("cuda:")
    return False


def _cpu_if_cuda(value: Any) -> Any:
    return torch.device("cpu") if _is_cuda_device(value) else value


def _cpu_type_name(value: Any) -> Any:
    """Map ``torch.cuda.HalfTensor`` (class or name) to its CPU counterpart's name."""
    if isinstance(value, type) and getattr(value, "__module__", "") == "torch.cuda":
        return "torch." + value.__name__
    if isinstance(value, str) and value.startswith("torch.cuda."):
        return "torch." + value[len("torch.cuda.") :]
    return value


class _StayOnCpu(TorchFunctionMode):
    """Rewrites CUDA placement requests to the CPU at the torch-function layer.

    A mode sees every torch function and tensor method, factory functions included, so one
    hook covers ``x.cuda()``, ``model.cuda()`` (which calls ``Tensor.cuda`` per parameter),
    ``x.to("cuda")`` and ``torch.zeros(..., device="cuda")``.
    """

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        if kwargs is None:
            kwargs = {}
        if func is torch.Tensor.cuda or func is torch.Tensor.pin_memory:
            # Returning the tensor itself mirrors ``.to()`` on a tensor already in place.
            return args[0]
        if func is torch.Tensor.to:
            args = tuple(_cpu_if_cuda(a) for a in args)
        elif func is torch.Tensor.type:
            args = tuple(_cpu_type_name(a) for a in args)
            if "dtype" in kwargs:
                kwargs = {**kwargs, "dtype": _cpu_type_name(kwargs["dtype"])}
        if "device" in kwargs and _is_cuda_device(kwargs["device"]):
            kwargs = {**kwargs, "device": torch.device("cpu")}
        return func(*args, **kwargs)


_OriginalAutocast = torch.amp.autocast_mode.autocast
_OriginalGradScaler = torch.amp.grad_scaler.GradScaler


class CpuAutocast(_OriginalAutocast):
    """``torch.autocast`` whose ``"cuda"`` means CPU autocast in float16."""

    def __init__(
        self,
        device_type: str,
        dtype: torch.dtype | None = None,
        enabled: bool = True,
        cache_enabled: bool | None = None,
    ) -> None:
        if device_type == "cuda":
            device_type = "cpu"
            if dtype is None:
                dtype = torch.float16
        super().__init__(device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)


class CudaAmpAutocast(CpuAutocast):
    """Stand-in for the deprecated ``torch.cuda.amp.autocast(enabled, dtype, cache_enabled)``."""

    def __init__(
        self,
        enabled: bool = True,
        dtype: torch.dtype = torch.float16,
        cache_enabled: bool = True,
    ) -> None:
        super().__init__("cuda", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)


class CpuGradScaler(_OriginalGradScaler):
    """``torch.amp.GradScaler`` whose ``"cuda"`` means an enabled CPU scaler."""

    def __init__(self, device: str = "cuda", *args: Any, **kwargs: Any) -> None:
        if _is_cuda_device(device):
            device = "cpu"
        super().__init__(device, *args, **kwargs)


class CudaAmpGradScaler(CpuGradScaler):
    """Stand-in for the deprecated ``torch.cuda.amp.GradScaler`` (no device argument)."""

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
    ) -> None:
        super().__init__(
            "cuda",
            init_scale=init_scale,
            growth_factor=growth_factor,
            backoff_factor=backoff_factor,
            growth_interval=growth_interval,
            enabled=enabled,
        )


class CpuStream:
    """Stand-in for ``torch.cuda.Stream``: work on the CPU is already in order."""

    def __init__(self, device: Any = None, priority: int = 0, **_kwargs: Any) -> None:
        self.device = torch.device("cpu")
        self.priority = priority

    def wait_stream(self, stream: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def record_event(self, event: CpuEvent | None = None) -> CpuEvent:
        event = event if event is not None else CpuEvent()
        event.record(self)
        return event

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def __enter__(self) -> CpuStream:
        return self

    def __exit__(self, *_exc: object) -> None:
        pass


class CpuEvent:
    """Stand-in for ``torch.cuda.Event``: records wall-clock time for ``elapsed_time``."""

    def __init__(
        self,
        enable_timing: bool = False,
        blocking: bool = False,
        interprocess: bool = False,
    ) -> None:
        self.enable_timing = enable_timing
        self._time: float | None = None

    def record(self, stream: Any = None) -> None:
        self._time = time.perf_counter()

    def wait(self, stream: Any = None) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end_event: CpuEvent) -> float:
        """Milliseconds between this event and ``end_event``, like CUDA events."""
        if self._time is None or end_event._time is None:
            raise RuntimeError("both events must be recorded before elapsed_time()")
        return (end_event._time - self._time) * 1000.0


_CPU_STREAM = CpuStream()


def _stream_context(stream: Any = None) -> contextlib.nullcontext[Any]:
    return contextlib.nullcontext(stream)


def _returns(value: Any) -> Callable[..., Any]:
    def fake(*_args: Any, **_kwargs: Any) -> Any:
        return value

    return fake


_LEGACY_TENSOR_TYPES = (
    "FloatTensor",
    "DoubleTensor",
    "HalfTensor",
    "BFloat16Tensor",
    "ByteTensor",
    "CharTensor",
    "ShortTensor",
    "IntTensor",
    "LongTensor",
    "BoolTensor",
)


def _patch_torch_cuda() -> None:
    cuda = torch.cuda
    cuda.is_available = _returns(True)
    cuda.device_count = _returns(1)
    cuda.current_device = _returns(0)
    cuda.get_device_name = _returns("CPU (cuda_on_cpu shim)")
    cuda.get_device_capability = _returns((0, 0))
    for name in (
        "synchronize",
        "set_device",
        "reset_peak_memory_stats",
        "reset_max_memory_allocated",
        "reset_accumulated_memory_stats",
        "ipc_collect",
    ):
        setattr(cuda, name, _returns(None))
    # Prefetchers (Apex's ImageNet example) overlap copies on a side stream; on the CPU
    # everything is already ordered, so streams and events only need to exist.
    cuda.Stream = CpuStream  # type: ignore[misc,assignment]
    cuda.Event = CpuEvent  # type: ignore[misc,assignment]
    cuda.current_stream = _returns(_CPU_STREAM)
    cuda.default_stream = _returns(_CPU_STREAM)
    cuda.stream = _stream_context  # type: ignore[assignment]
    # Patched on the class: torch's argument parser rejects a non-CUDA stream before any
    # torch-function mode could see the call.
    torch.Tensor.record_stream = _returns(None)  # type: ignore[method-assign]
    # Legacy constructors (``torch.cuda.IntTensor([0])``, Apex's overflow buffers) make CPU tensors.
    for legacy in _LEGACY_TENSOR_TYPES:
        setattr(cuda, legacy, getattr(torch, legacy))
    cuda.amp.autocast = CudaAmpAutocast  # type: ignore[misc,assignment]
    cuda.amp.GradScaler = CudaAmpGradScaler  # type: ignore[misc,assignment]


def _gloo_backend(backend: Any) -> Any:
    if isinstance(backend, str) and "nccl" in backend:
        return "gloo"
    return backend


def _patch_distributed() -> None:
    """NCCL process groups become gloo ones; DDP forgets GPU ids for a module left on the CPU."""
    import torch.distributed as dist
    import torch.nn.parallel

    if not dist.is_available():
        return
    original_init = dist.init_process_group

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        if args:
            args = (_gloo_backend(args[0]), *args[1:])
        if "backend" in kwargs:
            kwargs["backend"] = _gloo_backend(kwargs["backend"])
        return original_init(*args, **kwargs)

    dist.init_process_group = init_process_group

    class CpuDistributedDataParallel(torch.nn.parallel.DistributedDataParallel):
        """torch's DDP, without device ids for a module whose parameters are on the CPU."""

        def __init__(self, module: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
            if all(p.device.type == "cpu" for p in module.parameters()):
                if args:  # device_ids, output_device are the first two after the module
                    args = (None, None, *args[2:])
                kwargs.pop("device_ids", None)
                kwargs.pop("output_device", None)
            super().__init__(module, *args, **kwargs)

        def _passing_sync_batchnorm_handle(self, module: torch.nn.Module) -> None:
            # torch refuses SyncBatchNorm in a CPU module; alone in its group a SyncBatchNorm
            # never synchronises (it is plain BatchNorm), so one CPU process can run it.
            if self.process_group.size() > 1:
                super()._passing_sync_batchnorm_handle(module)

    original_forward = torch.nn.SyncBatchNorm.forward

    def sync_batch_norm_forward(self: torch.nn.SyncBatchNorm, input: torch.Tensor) -> torch.Tensor:
        # torch asks for GPU input before it notices there is no one to synchronise with
        alone = not dist.is_initialized() or dist.get_world_size(self.process_group) == 1
        if input.device.type == "cpu" and alone:
            return torch.nn.modules.batchnorm._BatchNorm.forward(self, input)
        return original_forward(self, input)

    torch.nn.SyncBatchNorm.forward = sync_batch_norm_forward  # type: ignore[method-assign]
    torch.nn.parallel.DistributedDataParallel = CpuDistributedDataParallel  # type: ignore[misc]
    torch.nn.parallel.distributed.DistributedDataParallel = CpuDistributedDataParallel  # type: ignore[misc]


def install() -> None:
    """Patch torch so CUDA-only mixed-precision code runs on the CPU in float16 (idempotent)."""
    global _installed, _mode
    if _installed:
        return
    if torch.cuda.is_available():
        raise RuntimeError("cuda_on_cpu.install() is for machines without CUDA; CUDA is available")
    torch.autocast = CpuAutocast  # type: ignore[misc]
    torch.amp.autocast = CpuAutocast  # type: ignore[misc]
    torch.GradScaler = CpuGradScaler  # type: ignore[misc]
    torch.amp.GradScaler = CpuGradScaler  # type: ignore[misc]
    _patch_torch_cuda()
    _patch_distributed()
    _mode = _StayOnCpu()
    # Entered for the rest of the process: the script runs inside it.
    _mode.__enter__()
    _installed = True


#: One line for reports: what ran where when ``install()`` was used.
CPU_FLOAT16_NOTE = (
    "CUDA is not available: torch.autocast('cuda') ran as CPU autocast in float16 "
    "(torch's CPU op lists), GradScaler('cuda') as an enabled CPU GradScaler, "
    ".cuda()/.to('cuda') stayed on the CPU"
)
