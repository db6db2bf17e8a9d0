"""Optimizer patching done by ``amp.initialize`` (``apex/amp/_process_optimizer.py``).

With master weights (O2) every fp16 param is replaced *in the optimizer's param groups* by an
fp32 clone on first use; backward grads are unscaled into the masters, ``step`` updates the
masters and copies them back to the fp16 model, ``zero_grad`` takes no arguments. Without
master weights (O0/O1/O3) grads are unscaled in place, and grads already present before the
backward pass (accumulation) are stashed and added back after unscaling.
"""

from __future__ import annotations

import types
from typing import Any

import torch

from migrate.shim.amp_state import _amp_state
from migrate.shim.scaler import LossScaler

_HALF_OR_FLOAT = (torch.float16, torch.float32)


class AmpStash:
    """Per-optimizer bookkeeping (``optimizer._amp_stash``)."""

    def __init__(self) -> None:
        self.lazy_init_called = False
        self.already_patched = False
        self.params_have_scaled_gradients = False
        self.all_fp16_params: list[torch.Tensor] = []
        self.all_fp32_from_fp16_params: list[torch.Tensor] = []
        self.all_fp32_from_fp32_params: list[torch.Tensor] = []
        self.all_fp32_from_fp32_grad_stash: list[torch.Tensor | None] = []
        self.all_params: list[torch.Tensor] = []
        self.all_grad_stash: list[torch.Tensor | None] = []


def _check_dtype(param: torch.Tensor) -> None:
    if param.dtype not in _HALF_OR_FLOAT:
        raise TypeError(
            f"amp optimizers take float16 or float32 params, got {param.dtype} " f"(shape {tuple(param.shape)})"
        )


def _post_backward_models_are_masters(
    scaler: LossScaler,
    params: list[torch.Tensor],
    stashed_grads: list[torch.Tensor | None],
) -> None:
    fresh: list[torch.Tensor] = []
    fresh_with_stash: list[torch.Tensor] = []
    stashes: list[torch.Tensor] = []
    for param, stashed in zip(params, stashed_grads):
        if param.grad is None and stashed is not None:
            param.grad = stashed
        elif param.grad is not None and stashed is None:
            fresh.append(param.grad)
        elif param.grad is not None and stashed is not None:
            fresh_with_stash.append(param.grad)
            stashes.append(stashed)
    scaler.unscale(fresh, fresh, scaler.loss_scale())
    scaler.unscale_with_stashed(fresh_with_stash, stashes, fresh_with_stash)
    for index in range(len(stashed_grads)):
        stashed_grads[index] = None


# --- master weights (O2) ---------------------------------------------------------------


def _lazy_init_with_master_weights(self: Any) -> None:
    stash: AmpStash = self._amp_stash
    for group in self.param_groups:
        for index, param in enumerate(group["params"]):
            if not param.requires_grad:
                continue
            _check_dtype(param)
            if param.dtype is torch.float16:
                master = param.detach().clone().float()
                master.requires_grad = True
                group["params"][index] = master
                stash.all_fp16_params.append(param)
                stash.all_fp32_from_fp16_params.append(master)
                if param in self.state:
                    self.state[master] = self.state.pop(param)
            else:
                stash.all_fp32_from_fp32_params.append(param)
    stash.all_fp32_from_fp32_grad_stash = [None] * len(stash.all_fp32_from_fp32_params)
    for master in stash.all_fp32_from_fp16_params:
        master.grad = None
    # Re-cast existing optimizer state to the masters' dtype.
    self.load_state_dict(self.state_dict())


def _prepare_backward_with_master_weights(self: Any) -> None:
    stash: AmpStash = self._amp_stash
    self._amp_lazy_init()
    for param in stash.all_fp16_params:
        # Apex drops the fp16 grads: they are re-made by this backward and unscaled into masters.
        param.grad = None
    for index, param in enumerate(stash.all_fp32_from_fp32_params):
        stash.all_fp32_from_fp32_grad_stash[index] = param.grad
        param.grad = None


def _post_backward_with_master_weights(self: Any, scaler: LossScaler) -> None:
    stash: AmpStash = self._amp_stash
    self._amp_lazy_init()
    new_model_grads: list[torch.Tensor] = []
    new_master_grads: list[torch.Tensor] = []
    accumulate_model_grads: list[torch.Tensor] = []
    accumulate_master_grads: list[torch.Tensor] = []
    for model, master in zip(stash.all_fp16_params, stash.all_fp32_from_fp16_params):
        if model.grad is not None and master.grad is None:
            master.grad = torch.empty_like(master)
            new_model_grads.append(model.grad)
            new_master_grads.append(master.grad)
        elif model.grad is not None and master.grad is not None:
            accumulate_model_grads.append(model.grad)
            accumulate_master_grads.append(master.grad)
    scaler.unscale(new_model_grads, new_master_grads, scaler.loss_scale())
    scaler.unscale_with_stashed(accumulate_model_grads, accumulate_master_grads, accumulate_master_grads)
    _post_backward_models_are_masters(scaler, stash.all_fp32_from_fp32_params, stash.all_fp32_from_fp32_grad_stash)


def _zero_grad_with_master_weights(self: Any) -> None:
    stash: AmpStash = self._amp_stash
    self._amp_lazy_init()
    # In place, as Apex does, so grads keep their storage.
    for param in (*stash.all_fp16_params, *stash.all_fp32_from_fp32_params):
        if param.grad is not None:
            param.grad.detach_()
            param.grad.zero_()
    for master in stash.all_fp32_from_fp16_params:
        master.grad = None


# --- no master weights (O0, O1, O3) ------------------------------------------------------


def _lazy_init_no_master_weights(self: Any) -> None:
    stash: AmpStash = self._amp_stash
    for group in self.param_groups:
        for param in group["params"]:
            _check_dtype(param)
            stash.all_params.append(param)
    stash.all_grad_stash = [None] * len(stash.all_params)


def _prepare_backward_no_master_weights(self: Any) -> None:
    stash: AmpStash = self._amp_stash
    self._amp_lazy_init()
    for index, param in enumerate(stash.all_params):
        stash.all_grad_stash[index] = param.grad
        param.grad = None


def _post_backward_no_master_weights(self: Any, scaler: LossScaler) -> None:
    stash: AmpStash = self._amp_stash
    self._amp_lazy_init()
    _post_backward_models_are_masters(scaler, stash.all_params, stash.all_grad_stash)


def process_optimizer(optimizer: Any, properties: Any) -> Any:
    """Attach the amp stash and methods to ``optimizer`` (once per optimizer)."""
    if hasattr(optimizer, "_amp_stash"):
        raise RuntimeError("an optimizer can go through amp.initialize only once")
    optimizer._amp_stash = AmpStash()

    def lazy_init(self: Any) -> None:
        if not self._amp_stash.lazy_init_called:
            self._lazy_init_maybe_master_weights()
            self._amp_stash.lazy_init_called = True

    optimizer._amp_lazy_init = types.MethodType(lazy_init, optimizer)

    if properties.master_weights:
        optimizer._lazy_init_maybe_master_weights = types.MethodType(_lazy_init_with_master_weights, optimizer)
        optimizer._prepare_amp_backward = types.MethodType(_prepare_backward_with_master_weights, optimizer)
        optimizer._post_amp_backward = types.MethodType(_post_backward_with_master_weights, optimizer)
        original_step = optimizer.step

        def step_with_masters(self: Any, closure: Any = None) -> Any:
            if closure is not None:
                raise RuntimeError("amp does not support optimizer closures")
            result = original_step()
            stash: AmpStash = self._amp_stash
            with torch.no_grad():
                # Round each fp32 master to the nearest fp16 into the model.
                for model, master in zip(stash.all_fp16_params, stash.all_fp32_from_fp16_params):
                    model.copy_(master)
            for master in stash.all_fp32_from_fp16_params:
                master.grad = None
            return result

        optimizer.step = types.MethodType(step_with_masters, optimizer)
        optimizer.zero_grad = types.MethodType(_zero_grad_with_master_weights, optimizer)
        original_add_param_group = optimizer.add_param_group

        def add_param_group_with_masters(self: Any, group: dict[str, Any]) -> None:
            self._amp_lazy_init()
            stash: AmpStash = self._amp_stash
            params = group["params"]
            params = [params] if isinstance(params, torch.Tensor) else list(params)
            kept: list[torch.Tensor] = []
            for param in params:
                _check_dtype(param)
                if param.requires_grad and param.dtype is torch.float16:
                    master = param.detach().clone().float()
                    master.requires_grad = True
                    stash.all_fp16_params.append(param)
                    stash.all_fp32_from_fp16_params.append(master)
                    kept.append(master)
                else:
                    if param.requires_grad:
                        stash.all_fp32_from_fp32_params.append(param)
                        stash.all_fp32_from_fp32_grad_stash.append(None)
                    kept.append(param)
            original_add_param_group({**group, "params": kept})

        optimizer.add_param_group = types.MethodType(add_param_group_with_masters, optimizer)
    else:
        optimizer._lazy_init_maybe_master_weights = types.MethodType(_lazy_init_no_master_weights, optimizer)
        optimizer._prepare_amp_backward = types.MethodType(_prepare_backward_no_master_weights, optimizer)
        optimizer._post_amp_backward = types.MethodType(_post_backward_no_master_weights, optimizer)

    if properties.patch_torch_functions:
        # O1: the optimizer's own math must not be cast.
        step_before_o1 = optimizer.step

        def step_without_casts(self: Any, *args: Any, **kwargs: Any) -> Any:
            # Apex passes whatever the step takes (a custom optimizer's own keywords too)
            handle = getattr(_amp_state, "handle", None)
            if handle is None:
                return step_before_o1(*args, **kwargs)
            with handle._disable_casts():
                return step_before_o1(*args, **kwargs)

        optimizer.step = types.MethodType(step_without_casts, optimizer)
    return optimizer
