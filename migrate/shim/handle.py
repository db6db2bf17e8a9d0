"""The old amp API (Apex 0.1, before ``amp.initialize``): ``handle.scale_loss`` and the optimizer
wrapper ``handle.wrap_optimizer`` returns.

Apex removed the body of ``AmpHandle.scale_loss`` in April 2019 (it raises since); the scripts
that call it were written for the versions where it worked, and that is what runs here
(``apex/amp/handle.py`` and ``apex/amp/opt.py`` as of February 2019):

- ``handle.scale_loss(loss, optimizer)`` yields ``loss * scale`` (no float cast), then unscales
  the grads of the optimizer's params in place with the handle's one dynamic LossScaler, updates
  the scale and, on overflow, replaces ``optimizer.step`` by a one-shot skip;
- ``wrap_optimizer(optimizer, num_loss=N)`` returns an ``OptimWrapper`` with one dynamic scaler
  per loss: its ``scale_loss(loss)`` sets the grads of earlier losses aside (they cannot be
  unscaled twice), unscales this loss's grads and adds the earlier ones back; its ``step()``
  skips when any loss of the iteration overflowed. Losses beyond ``num_loss`` in one iteration
  fail, as they did.

With amp disabled (``amp.init(enabled=False)``) the loss passes through and ``step`` steps.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from migrate.shim import events
from migrate.shim.amp_state import master_params
from migrate.shim.scaler import LossScaler

if TYPE_CHECKING:
    from migrate.shim.casting import AmpHandle, NoOpHandle

_logger = logging.getLogger("apex.amp")


def _grads(optimizer: Any) -> list[torch.Tensor]:
    return [param.grad for param in master_params(optimizer) if param.grad is not None]


def _unscale(scaler: LossScaler, optimizer: Any, scale: float) -> bool:
    """Unscale the optimizer's grads in place; whether the step must be skipped."""
    scaler.clear_overflow_state()
    grads = _grads(optimizer)
    scaler.unscale(grads, grads, scale)
    return scaler.update_scale()


def _skip_next_step(optimizer: Any) -> None:
    """Replace ``optimizer.step`` by a one-shot skip (the handle's way to skip an overflow)."""
    original_step = optimizer.step

    def skip_step() -> None:
        _logger.warning("Gradient overflow, skipping update")
        optimizer.step = original_step
        events.emit("step_skipped", optimizer=optimizer, loss_id=0)

    optimizer.step = skip_step


@contextlib.contextmanager
def handle_scale_loss(handle: AmpHandle, loss: torch.Tensor, optimizer: Any) -> Iterator[torch.Tensor]:
    """``AmpHandle.scale_loss``: no try/finally, as in Apex (an exception skips the unscale)."""
    if not handle.is_active():
        yield loss
        return
    scaler = handle._default_scaler()
    if scaler is None:
        raise RuntimeError(
            "After calling `handle.wrap_optimizer()`, you must explicitly use `optimizer.scale_loss(loss)`."
        )
    scale = scaler.loss_scale()
    events.emit("scale_loss", loss=loss, scale=scale, loss_id=0, dynamic=scaler.dynamic)
    yield loss * scale
    if _unscale(scaler, optimizer, scale):
        _skip_next_step(optimizer)
    handle._clear_cache()


class OptimWrapper:
    """What ``handle.wrap_optimizer(optimizer, num_loss)`` returns."""

    def __init__(self, optimizer: Any, amp_handle: AmpHandle | NoOpHandle, num_loss: int) -> None:
        self._optimizer = optimizer
        self._amp_handle = amp_handle
        self._num_loss = num_loss
        self._loss_idx = 0
        self._skip_next = [False] * num_loss
        self._loss_scaler = [LossScaler("dynamic") for _ in range(num_loss)]

    def _cur_loss_scaler(self) -> LossScaler:
        assert 0 <= self._loss_idx < self._num_loss
        return self._loss_scaler[self._loss_idx]

    @contextlib.contextmanager
    def scale_loss(self, loss: torch.Tensor) -> Iterator[torch.Tensor]:
        if not self._amp_handle.is_active():
            yield loss
            return
        # The grads of earlier losses are set aside: once mixed with this loss's, neither
        # could be unscaled by its own scale.
        cached: list[torch.Tensor | None] = []
        if self._loss_idx > 0:
            cached = [
                None if param.grad is None else param.grad.detach().clone() for param in master_params(self._optimizer)
            ]
            # torch zeroed grads in place then (set_to_none came later)
            self._optimizer.zero_grad(set_to_none=False)
        scaler = self._cur_loss_scaler()
        scale = scaler.loss_scale()
        events.emit("scale_loss", loss=loss, scale=scale, loss_id=self._loss_idx, dynamic=scaler.dynamic)
        yield loss * scale
        self._skip_next[self._loss_idx] = _unscale(scaler, self._optimizer, scale)
        self._loss_idx += 1
        for param, grad in zip(master_params(self._optimizer), cached):
            if grad is not None:
                if param.grad is None:
                    param.grad = grad
                else:
                    param.grad.add_(grad)

    def step(self, closure: Any = None) -> Any:
        if not self._amp_handle.is_active():
            return self._optimizer.step(closure=closure)
        self._loss_idx = 0
        for param in master_params(self._optimizer):
            self._amp_handle.remove_cache(param)  # type: ignore[union-attr]
        if closure is not None:
            raise NotImplementedError("The `closure` argument is unsupported by the amp optimizer wrapper.")
        if any(self._skip_next):
            _logger.info("Gradient overflow, skipping update")
            self._skip_next = [False] * self._num_loss
            events.emit("step_skipped", optimizer=self._optimizer, loss_id=0)
            return None
        return self._optimizer.step(closure=closure)

    # everything else is the optimizer's
    def __getattr__(self, attr: str) -> Any:
        return getattr(self._optimizer, attr)

    def __repr__(self) -> str:
        return repr(self._optimizer)

    def state_dict(self) -> Any:
        return self._optimizer.state_dict()

    def load_state_dict(self, state_dict: Any) -> Any:
        return self._optimizer.load_state_dict(state_dict)

    def zero_grad(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.zero_grad(*args, **kwargs)

    def add_param_group(self, param_group: Any) -> Any:
        return self._optimizer.add_param_group(param_group)
