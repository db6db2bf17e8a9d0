"""``apex.amp`` on plain PyTorch: initialize, scale_loss, state dicts and the O1 registry."""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import torch

from migrate.shim import events
from migrate.shim.amp_state import _amp_state, master_params, maybe_print
from migrate.shim.casting import (
    float_function,
    half_function,
    init,
    promote_function,
    register_float_function,
    register_half_function,
    register_promote_function,
)
from migrate.shim.initialize import initialize

__all__ = [
    "_amp_state",
    "disable_casts",
    "float_function",
    "half_function",
    "init",
    "initialize",
    "load_state_dict",
    "master_params",
    "promote_function",
    "register_float_function",
    "register_half_function",
    "register_promote_function",
    "scale_loss",
    "state_dict",
]


def _patch_step_to_skip(optimizer: Any, loss_id: int, scale_after: float) -> None:
    """Replace ``optimizer.step`` by a one-shot skip, as Apex does after an overflow."""
    original_step = optimizer.step

    def skip_step(closure: Any = None) -> None:
        if closure is not None:
            raise RuntimeError("amp does not support optimizer closures")
        maybe_print(
            f"Gradient overflow.  Skipping step, loss scaler {loss_id} reducing loss scale to " f"{scale_after}"
        )
        stash = optimizer._amp_stash
        for master in stash.all_fp32_from_fp16_params:
            master.grad = None
        optimizer.step = original_step
        stash.already_patched = False
        events.emit("step_skipped", optimizer=optimizer, loss_id=loss_id)

    optimizer.step = skip_step
    optimizer._amp_stash.already_patched = True


@contextlib.contextmanager
def scale_loss(
    loss: torch.Tensor,
    optimizers: Any,
    loss_id: int = 0,
    model: Any = None,
    delay_unscale: bool = False,
    delay_overflow_check: bool = False,
) -> Iterator[torch.Tensor]:
    """Yield ``loss.float() * scale``; on exit unscale, update the scale, maybe skip the step.

    No try/finally, as in Apex: an exception in the body skips the unscale and the update.
    """
    del model  # accepted and unused, as in Apex
    if not hasattr(_amp_state, "opt_properties"):
        raise RuntimeError(
            "amp.scale_loss was called before amp.initialize: call amp.initialize(model, " "optimizer, ...) first"
        )
    properties = _amp_state.opt_properties
    if not properties.enabled:
        yield loss
        return
    if not isinstance(optimizers, list):
        optimizers = [optimizers]
    scaler = _amp_state.loss_scalers[loss_id]
    scale = scaler.loss_scale()
    events.emit("scale_loss", loss=loss, scale=scale, loss_id=loss_id, dynamic=scaler.dynamic)

    if not properties.master_weights and not scaler.dynamic and scale == 1.0:
        yield loss.float()
        if properties.patch_torch_functions:
            _amp_state.handle._clear_cache()
        return

    if not delay_unscale:
        for optimizer in optimizers:
            if not optimizer._amp_stash.params_have_scaled_gradients:
                optimizer._prepare_amp_backward()

    yield loss.float() * scale

    if delay_unscale:
        for optimizer in optimizers:
            optimizer._amp_stash.params_have_scaled_gradients = True
    else:
        scaler.clear_overflow_state()
        for optimizer in optimizers:
            optimizer._post_amp_backward(scaler)
            optimizer._amp_stash.params_have_scaled_gradients = False
        should_skip = False if delay_overflow_check else scaler.update_scale()
        if should_skip:
            for optimizer in optimizers:
                if not optimizer._amp_stash.already_patched:
                    _patch_step_to_skip(optimizer, loss_id, scaler.loss_scale())
    if properties.patch_torch_functions:
        _amp_state.handle._clear_cache()


@contextlib.contextmanager
def disable_casts() -> Iterator[None]:
    """Run the body without O1 casts (exists only under O1, as in Apex)."""
    handle = _amp_state.handle  # AttributeError outside O1, as Apex raised
    with handle._disable_casts():
        yield


def state_dict(destination: dict[str, Any] | None = None) -> dict[str, Any]:
    """``{"loss_scaler0": {"loss_scale": float, "unskipped": int}, ...}``."""
    if destination is None:
        destination = OrderedDict()
    for index, scaler in enumerate(_amp_state.loss_scalers):
        destination[f"loss_scaler{index}"] = {
            "loss_scale": scaler.loss_scale(),
            "unskipped": scaler._unskipped,
        }
    return destination


def load_state_dict(state: dict[str, Any]) -> None:
    """Restore the scalers in key order; keys without ``loss_scaler`` are an error."""
    scalers = _amp_state.loss_scalers
    if len(state) != len(scalers):
        print(
            f"Warning: amp state dict has {len(state)} entries but amp.initialize was called "
            f"with num_losses={len(scalers)}"
        )
    unexpected = [key for key in state if "loss_scaler" not in key]
    if unexpected:
        raise RuntimeError(f"unexpected key(s) in amp state dict: {', '.join(unexpected)}")
    for index, key in enumerate(state):
        if index >= len(scalers):
            break
        scalers[index]._loss_scale = state[key]["loss_scale"]
        scalers[index]._unskipped = state[key]["unskipped"]
