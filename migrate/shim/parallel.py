"""``apex.parallel`` on top of torch: DDP, Reducer, flat_dist_call, SyncBatchNorm, convert_syncbn_model, LARC."""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

ReduceOp = dist.ReduceOp if dist.is_available() else None


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _grouped() -> bool:
    """A process group exists (of any size, one process included)."""
    return dist.is_available() and dist.is_initialized()


def flatten(bucket: list[torch.Tensor]) -> torch.Tensor:
    """Apex's ``apex_C.flatten`` (or its Python fallback): one contiguous tensor."""
    return _flatten_dense_tensors(bucket)


def unflatten(coalesced: torch.Tensor, bucket: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    return _unflatten_dense_tensors(coalesced, bucket)  # type: ignore[no-any-return]


def flat_dist_call(tensors: list[torch.Tensor], call: Any, extra_args: Any = None) -> None:
    """Per dtype: flatten, ``call(flat, *extra_args)``, average after an all_reduce, copy back."""
    buckets: dict[Any, list[torch.Tensor]] = {}
    for tensor in tensors:
        buckets.setdefault(tensor.type(), []).append(tensor)
    for bucket in buckets.values():
        coalesced = flatten(bucket)
        if extra_args is not None:
            call(coalesced, *extra_args)
        else:
            call(coalesced)
        if call is dist.all_reduce:
            coalesced /= dist.get_world_size()
        for buffer, synced in zip(bucket, unflatten(coalesced, bucket)):
            buffer.copy_(synced)


def _tensors_in(value: Any, found: list[torch.Tensor]) -> None:
    if torch.is_tensor(value):
        found.append(value)
        return
    try:
        for item in value:
            _tensors_in(item, found)
    except TypeError:
        return


class Reducer:
    """``apex.parallel.Reducer``: averages gradients over the processes when ``reduce()`` is called."""

    def __init__(self, module_or_grads_list: Any) -> None:
        if isinstance(module_or_grads_list, torch.nn.Module):
            self.module: torch.nn.Module | None = module_or_grads_list
            flat_dist_call([param.data for param in module_or_grads_list.parameters()], dist.broadcast, (0,))
        else:
            self.module = None
            self.grads: list[torch.Tensor] = []
            _tensors_in(module_or_grads_list, self.grads)

    def reduce(self) -> None:
        if self.module:
            grads = [param.grad.data for param in self.module.parameters() if param.grad is not None]
            flat_dist_call(grads, dist.all_reduce)
        else:
            flat_dist_call(self.grads, dist.all_reduce)


def _apex_allreduce_hook(predivide: float, average: bool) -> Any:
    """A DDP communication hook with Apex's arithmetic: ``* 1/f``, all-reduce, ``* f/world``.

    A lambda, because torch rejects a hook whose ``bucket`` annotation is not the GradBucket
    class itself (postponed annotations are strings).
    """

    def scaled(buffer: torch.Tensor) -> torch.Tensor:
        return buffer.mul_(1.0 / predivide) if predivide != 1.0 else buffer

    def finish(future: Any) -> torch.Tensor:
        reduced: torch.Tensor = future.value()[0]
        if average:
            reduced.mul_(predivide / dist.get_world_size())
        return reduced

    return lambda state, bucket: dist.all_reduce(scaled(bucket.buffer()), async_op=True).get_future().then(finish)


class DistributedDataParallel(torch.nn.Module):
    """Apex DDP semantics on torch DDP: params broadcast once, buffers never synced.

    With a process group (one process included) it runs torch's DDP with Apex's settings:
    no buffer broadcast, parameters without gradients allowed, and Apex's averaging
    arithmetic (``gradient_predivide_factor``, ``gradient_average``) in a communication
    hook. Without a group it forwards straight to the module (Apex itself required a group).
    ``state_dict`` keys carry ``module.`` either way.
    """

    def __init__(
        self,
        module: torch.nn.Module,
        message_size: int = 10_000_000,
        delay_allreduce: bool = False,
        shared_param: Any = None,
        allreduce_trigger_params: Any = None,
        retain_allreduce_buffers: bool = False,
        allreduce_always_fp32: bool = False,
        num_allreduce_streams: int = 1,
        allreduce_communicators: Any = None,
        gradient_average: bool = True,
        gradient_predivide_factor: float = 1.0,
        gradient_average_split_factor: Any = None,
        prof: bool = False,
    ) -> None:
        super().__init__()
        if shared_param is not None:
            raise ValueError("shared_param is no longer supported as an option (apex DDP)")
        if num_allreduce_streams > 1 and delay_allreduce:
            raise ValueError("allreduce_different_streams may only be used if delay_allreduce=False.")
        if allreduce_trigger_params is not None and delay_allreduce:
            raise ValueError("Setting allreduce_trigger_params is only valid if delay_allreduce=False.")
        self.module = module
        self.delay_allreduce = delay_allreduce
        self.message_size = message_size
        self.gradient_average = gradient_average
        self.gradient_predivide_factor = gradient_predivide_factor
        bytes_per_element = next((p.element_size() for p in module.parameters()), 4)
        bucket_cap_mb = max(1.0, message_size * bytes_per_element / 2**20)
        torch_ddp = None
        if _grouped():
            device_ids = [torch.cuda.current_device()] if next(module.parameters()).is_cuda else None
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)  # broadcast_buffers is deprecated in 2.13
                torch_ddp = torch.nn.parallel.DistributedDataParallel(
                    module,
                    device_ids=device_ids,
                    broadcast_buffers=False,
                    bucket_cap_mb=bucket_cap_mb,
                    find_unused_parameters=True,
                )
            if gradient_predivide_factor != 1.0 or not gradient_average:
                torch_ddp.register_comm_hook(None, _apex_allreduce_hook(gradient_predivide_factor, gradient_average))
        # Kept out of the module tree so state_dict keys stay ``module.*``, as with Apex.
        self.__dict__["_torch_ddp"] = torch_ddp

    @property
    def _ddp(self) -> torch.nn.parallel.DistributedDataParallel | None:
        ddp: torch.nn.parallel.DistributedDataParallel | None = self.__dict__["_torch_ddp"]
        return ddp

    def enable_allreduce(self) -> None:
        if self._ddp is not None:
            self._ddp.require_backward_grad_sync = True

    def disable_allreduce(self) -> None:
        if self._ddp is not None:
            self._ddp.require_backward_grad_sync = False

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        runner: torch.nn.Module = self._ddp if self._ddp is not None else self.module
        return runner(*args, **kwargs)


class SyncBatchNorm(torch.nn.SyncBatchNorm):
    """``apex.parallel.SyncBatchNorm``; plain BatchNorm outside a multi-process group."""

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        process_group: Any = None,
        channel_last: bool = False,
        fuse_relu: bool = False,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, process_group)
        if channel_last:
            raise NotImplementedError("channel_last SyncBatchNorm has no torch equivalent")
        self.channel_last = channel_last
        self.fuse_relu = fuse_relu

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor, z: torch.Tensor | None = None) -> torch.Tensor:
        if _distributed():
            out = super().forward(input)
        else:
            out = torch.nn.functional.batch_norm(
                input,
                self.running_mean,
                self.running_var,
                self.weight,
                self.bias,
                self.training or not self.track_running_stats,
                self.momentum if self.momentum is not None else 0.0,
                self.eps,
            )
            if self.training and self.track_running_stats and self.num_batches_tracked is not None:
                self.num_batches_tracked.add_(1)
        if z is not None:
            out = out + z
        return torch.relu(out) if self.fuse_relu else out


def convert_syncbn_model(
    module: torch.nn.Module, process_group: Any = None, channel_last: bool = False
) -> torch.nn.Module:
    """Replace every BatchNorm (not InstanceNorm) by ``SyncBatchNorm``, keeping its state."""
    converted = module
    if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and not isinstance(
        module, torch.nn.modules.instancenorm._InstanceNorm
    ):
        converted = SyncBatchNorm(
            module.num_features,
            module.eps,
            module.momentum,  # type: ignore[arg-type]
            module.affine,
            module.track_running_stats,
            process_group,
            channel_last=channel_last,
        )
        converted.load_state_dict(module.state_dict())
        converted.to(next(iter(module.state_dict().values())).device)
    for name, child in module.named_children():
        converted.add_module(name, convert_syncbn_model(child, process_group, channel_last))
    return converted


def create_syncbn_process_group(group_size: int) -> Any:
    """Split the world into consecutive groups of ``group_size`` ranks; return this rank's."""
    if group_size == 0:
        return None
    world_size = dist.get_world_size()
    if world_size % group_size:
        raise ValueError("world size must be a multiple of group_size")
    rank = dist.get_rank()
    mine = None
    for start in range(0, world_size, group_size):
        group = dist.new_group(list(range(start, start + group_size)))
        if start <= rank < start + group_size:
            mine = group
    return mine


class LARC:
    """Layer-wise adaptive rate control around an optimizer (clip or scale mode)."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        trust_coefficient: float = 0.02,
        clip: bool = True,
        eps: float = 1e-8,
    ) -> None:
        self.optim = optimizer
        self.trust_coefficient = trust_coefficient
        self.clip = clip
        self.eps = eps

    def __getstate__(self) -> dict[str, Any]:
        return self.optim.__getstate__()  # type: ignore[no-any-return]

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.optim.__setstate__(state)

    @property
    def state(self) -> Any:
        return self.optim.state

    @property
    def param_groups(self) -> Any:
        return self.optim.param_groups

    @param_groups.setter
    def param_groups(self, value: Any) -> None:
        self.optim.param_groups = value

    def __repr__(self) -> str:
        return f"LARC({self.optim!r})"

    def state_dict(self) -> dict[str, Any]:
        return self.optim.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optim.load_state_dict(state_dict)

    def zero_grad(self, *args: Any, **kwargs: Any) -> None:
        self.optim.zero_grad(*args, **kwargs)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self.optim.add_param_group(param_group)

    def step(self, closure: Any = None) -> Any:
        with torch.no_grad():
            decays = []
            for group in self.optim.param_groups:
                decay = group.get("weight_decay", 0)
                decays.append(decay)
                group["weight_decay"] = 0
                for param in group["params"]:
                    if param.grad is None:
                        continue
                    param_norm = torch.linalg.vector_norm(param.data)
                    grad_norm = torch.linalg.vector_norm(param.grad.data)
                    if param_norm != 0 and grad_norm != 0:
                        adaptive = self.trust_coefficient * param_norm / (grad_norm + param_norm * decay + self.eps)
                        if self.clip:
                            adaptive = torch.clamp(adaptive / group["lr"], max=1)
                        param.grad.data += decay * param.data
                        param.grad.data *= adaptive
        result = self.optim.step(closure) if closure is not None else self.optim.step()
        for group, decay in zip(self.optim.param_groups, decays):
            group["weight_decay"] = decay
        return result
