"""``apex.fp16_utils``: FP16_Optimizer, the model-halving helpers and the legacy scalers."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch.nn.utils import clip_grad_norm_

from migrate.shim import events
from migrate.shim.initialize import convert_module, convert_network
from migrate.shim.scaler import LossScaler as AmpLossScaler

__all__ = [
    "BN_convert_float",
    "DynamicLossScaler",
    "FP16Model",
    "FP16_Optimizer",
    "LossScaler",
    "clip_grad_norm",
    "convert_module",
    "convert_network",
    "master_params_to_model_params",
    "model_grads_to_master_grads",
    "network_to_half",
    "prep_param_lists",
    "to_python_float",
    "tofp16",
]

clip_grad_norm = clip_grad_norm_


def to_python_float(value: Any) -> float:
    """``value.item()`` for tensors, ``value[0]`` for old-style one-element containers."""
    if hasattr(value, "item"):
        return value.item()
    return value[0]


class tofp16(torch.nn.Module):
    """A module whose forward returns ``input.half()``."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return input.half()


def BN_convert_float(module: torch.nn.Module) -> torch.nn.Module:
    """Turn affine BatchNorm modules (recursively) back to float32."""
    if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and module.affine:
        module.float()
    for child in module.children():
        BN_convert_float(child)
    return module


def network_to_half(network: torch.nn.Module) -> torch.nn.Sequential:
    """``Sequential(tofp16(), BN_convert_float(network.half()))``: state_dict keys gain ``1.``."""
    return torch.nn.Sequential(tofp16(), BN_convert_float(network.half()))


class FP16Model(torch.nn.Module):
    """Holds ``convert_network(network, half)`` and halves every positional input."""

    def __init__(self, network: torch.nn.Module) -> None:
        super().__init__()
        self.network = convert_network(network, dtype=torch.half)

    def forward(self, *inputs: Any) -> Any:
        return self.network(*(value.half() for value in inputs))


def prep_param_lists(
    model: torch.nn.Module, flat_master: bool = False
) -> tuple[list[torch.nn.Parameter], list[torch.Tensor]]:
    """``(model params that require grad, fp32 master copies)``; optionally one flat master."""
    model_params = [param for param in model.parameters() if param.requires_grad]
    if flat_master:
        flat = torch.cat([param.detach().float().reshape(-1) for param in model_params])
        flat_parameter = torch.nn.Parameter(flat)
        flat_parameter.grad = torch.empty_like(flat_parameter)
        return model_params, [flat_parameter]
    masters = [param.detach().clone().float() for param in model_params]
    for master in masters:
        master.requires_grad = True
    return model_params, masters


def model_grads_to_master_grads(
    model_params: list[torch.Tensor],
    master_params: list[torch.Tensor],
    flat_master: bool = False,
) -> None:
    """Copy (without unscaling) model grads into master grads."""
    if flat_master:
        grads = [param.grad.reshape(-1) for param in model_params if param.grad is not None]
        flat_grad = master_params[0].grad
        assert flat_grad is not None, "prep_param_lists(flat_master=True) allocates it"
        flat_grad.copy_(torch.cat(grads))
        return
    for model, master in zip(model_params, master_params):
        if model.grad is None:
            master.grad = None
            continue
        if master.grad is None:
            master.grad = torch.empty_like(master)
        master.grad.copy_(model.grad)


def master_params_to_model_params(
    model_params: list[torch.Tensor],
    master_params: list[torch.Tensor],
    flat_master: bool = False,
) -> None:
    """Copy master values back into the (fp16) model params."""
    with torch.no_grad():
        if flat_master:
            offset = 0
            for model in model_params:
                count = model.numel()
                model.copy_(master_params[0][offset : offset + count].view_as(model))
                offset += count
            return
        for model, master in zip(model_params, master_params):
            model.copy_(master)


class LossScaler:
    """Apex's legacy *static* scaler of ``fp16_utils`` (never overflows)."""

    def __init__(self, scale: float = 1) -> None:
        self.cur_scale = scale

    def has_overflow(self, params: Any) -> bool:
        return False

    def _has_inf_or_nan(self, value: Any) -> bool:
        return False

    def update_scale(self, overflow: bool) -> None:
        pass

    @property
    def loss_scale(self) -> float:
        return self.cur_scale

    def scale_gradient(self, module: Any, grad_in: Any, grad_out: Any) -> tuple[Any, ...]:
        return tuple(self.loss_scale * g for g in grad_in)

    def backward(self, loss: torch.Tensor, retain_graph: bool = False) -> None:
        (loss * self.loss_scale).backward(retain_graph=retain_graph)


class DynamicLossScaler(LossScaler):
    """Apex's legacy dynamic scaler: start 2**32, window 1000, floor 1, no cap."""

    def __init__(
        self,
        init_scale: float = 2**32,
        scale_factor: float = 2.0,
        scale_window: int = 1000,
    ) -> None:
        super().__init__(init_scale)
        self.cur_iter = 0
        self.last_overflow_iter = -1
        self.scale_factor = scale_factor
        self.scale_window = scale_window

    def has_overflow(self, params: Iterable[torch.Tensor]) -> bool:
        return any(p.grad is not None and self._has_inf_or_nan(p.grad) for p in params)

    def _has_inf_or_nan(self, value: torch.Tensor) -> bool:
        return not math.isfinite(float(value.float().sum()))

    def update_scale(self, overflow: bool) -> None:
        if overflow:
            self.cur_scale = max(self.cur_scale / self.scale_factor, 1)
            self.last_overflow_iter = self.cur_iter
        elif (self.cur_iter - self.last_overflow_iter) % self.scale_window == 0:
            self.cur_scale *= self.scale_factor
        self.cur_iter += 1


class FP16_Optimizer:
    """Wraps an optimizer over an fp16 model with fp32 masters and Apex's amp ``LossScaler``."""

    def __init__(
        self,
        init_optimizer: torch.optim.Optimizer,
        static_loss_scale: float = 1.0,
        dynamic_loss_scale: bool = False,
        dynamic_loss_args: dict[str, Any] | None = None,
        verbose: bool = True,
    ) -> None:
        self.verbose = verbose
        self.optimizer = init_optimizer
        self.fp16_groups: list[list[torch.Tensor]] = []
        self.fp32_from_fp16_groups: list[list[torch.Tensor]] = []
        self.fp32_from_fp32_groups: list[list[torch.Tensor]] = []
        for group in self.optimizer.param_groups:
            fp16_params, masters, fp32_params = [], [], []
            for index, param in enumerate(group["params"]):
                if not param.requires_grad:
                    continue
                if param.dtype is torch.float16:
                    master = param.detach().clone().float()
                    master.requires_grad = True
                    group["params"][index] = master
                    fp16_params.append(param)
                    masters.append(master)
                    if param in self.optimizer.state:
                        self.optimizer.state[master] = self.optimizer.state.pop(param)
                elif param.dtype is torch.float32:
                    fp32_params.append(param)
                else:
                    raise TypeError(f"FP16_Optimizer takes float16 or float32 params, got {param.dtype}")
            self.fp16_groups.append(fp16_params)
            self.fp32_from_fp16_groups.append(masters)
            self.fp32_from_fp32_groups.append(fp32_params)
        self.optimizer.load_state_dict(self.optimizer.state_dict())
        if dynamic_loss_scale:
            self.dynamic_loss_scale = True
            self.loss_scaler = AmpLossScaler("dynamic", **(dynamic_loss_args or {}))
        else:
            self.dynamic_loss_scale = False
            self.loss_scaler = AmpLossScaler(static_loss_scale)
        self.overflow = False
        self.first_closure_call_this_step = True
        self.clip_grad_norm = clip_grad_norm_

    def __getstate__(self) -> Any:
        raise RuntimeError("FP16_Optimizer should be serialized using state_dict().")

    def __setstate__(self, state: Any) -> None:
        raise RuntimeError("FP16_Optimizer should be deserialized using load_state_dict().")

    def _fp16_and_masters(self) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
        for fp16_group, master_group in zip(self.fp16_groups, self.fp32_from_fp16_groups):
            yield from zip(fp16_group, master_group)

    def zero_grad(self, set_grads_to_None: bool = False) -> None:
        groups = [
            *self.optimizer.param_groups,
            *({"params": g} for g in self.fp16_groups),
        ]
        for group in groups:
            for param in group["params"]:
                if set_grads_to_None:
                    param.grad = None
                elif param.grad is not None:
                    param.grad.detach_()
                    param.grad.zero_()

    def backward(
        self,
        loss: torch.Tensor,
        update_master_grads: bool = True,
        retain_graph: bool = False,
    ) -> None:
        events.emit(
            "scale_loss",
            loss=loss,
            scale=self.loss_scaler.loss_scale(),
            loss_id=0,
            dynamic=self.loss_scaler.dynamic,
        )
        (loss.float() * self.loss_scaler.loss_scale()).backward(retain_graph=retain_graph)
        if update_master_grads:
            self.update_master_grads()

    def update_master_grads(self) -> None:
        """Write unscaled fp16 grads into the masters (overwrite), unscale fp32 grads in place."""
        scaler = self.loss_scaler
        scaler.clear_overflow_state()
        model_grads, master_grads = [], []
        for model, master in self._fp16_and_masters():
            if model.grad is None:
                continue
            if master.grad is None:
                master.grad = torch.empty_like(master)
            model_grads.append(model.grad)
            master_grads.append(master.grad)
        scaler.unscale(model_grads, master_grads, scaler.loss_scale())
        fp32_grads = [p.grad for g in self.fp32_from_fp32_groups for p in g if p.grad is not None]
        scaler.unscale(fp32_grads, fp32_grads, scaler.loss_scale())
        self.overflow = scaler.update_scale()

    def clip_master_grads(self, max_norm: float, norm_type: float = 2) -> float:
        """Clip the fp32 grads; ``-1`` when the last backward overflowed."""
        if self.overflow:
            return -1
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        return float(self.clip_grad_norm(params, max_norm, norm_type))

    def step(self, closure: Any = None) -> Any:
        if self.overflow:
            if self.verbose:
                print("Gradient overflow.  Skipping step, reducing loss scale to " f"{self.loss_scaler.loss_scale()}")
            events.emit("step_skipped", optimizer=self.optimizer, loss_id=0)
            return None
        result = self._step_with_closure(closure) if closure is not None else self.optimizer.step()
        self._masters_to_model()
        return result

    def _masters_to_model(self) -> None:
        master_params_to_model_params(
            [p for g in self.fp16_groups for p in g],
            [p for g in self.fp32_from_fp16_groups for p in g],
        )

    def _step_with_closure(self, closure: Any) -> Any:
        """The wrapped optimizer steps with a closure that refreshes the fp16 model from the masters
        before every call but the first, and calls the user's closure again while its backward
        overflowed (the dynamic scale has been lowered by then)."""

        def wrapped_closure() -> Any:
            if self.first_closure_call_this_step:
                self.first_closure_call_this_step = False
            else:
                self._masters_to_model()
            loss = closure()
            while self.overflow:
                if self.verbose:
                    print(f"OVERFLOW within closure! Skipping step, reducing loss scale to {self.loss_scale}")
                loss = closure()
            return loss

        result = self.optimizer.step(wrapped_closure)
        self.first_closure_call_this_step = True
        return result

    def inspect_master_grad_data(self) -> list[list[torch.Tensor | None]]:
        return [[p.grad for p in group["params"]] for group in self.optimizer.param_groups]

    @property
    def loss_scale(self) -> float:
        return self.loss_scaler.loss_scale()

    @loss_scale.setter
    def loss_scale(self, value: float) -> None:
        self.loss_scaler._loss_scale = value

    @property
    def state(self) -> Any:
        return self.optimizer.state

    @property
    def param_groups(self) -> Any:
        return self.optimizer.param_groups

    def state_dict(self) -> dict[str, Any]:
        return {
            "loss_scaler": self.loss_scaler,
            "dynamic_loss_scale": self.dynamic_loss_scale,
            "overflow": self.overflow,
            "first_closure_call_this_step": self.first_closure_call_this_step,
            "optimizer_state_dict": self.optimizer.state_dict(),
            "fp32_from_fp16": self.fp32_from_fp16_groups,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loss_scaler = state["loss_scaler"]
        self.dynamic_loss_scale = state["dynamic_loss_scale"]
        self.overflow = state["overflow"]
        self.first_closure_call_this_step = state["first_closure_call_this_step"]
        self.optimizer.load_state_dict(state["optimizer_state_dict"])
        with torch.no_grad():
            for current, saved in zip(self.fp32_from_fp16_groups, state["fp32_from_fp16"]):
                for master, value in zip(current, saved):
                    master.copy_(value)
