"""A tiny observer hook: the shim announces loss scaling and skipped steps to listeners.

``ampmigrate verify`` listens to record what the original script did; with no listener,
``emit`` costs one truthiness test.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Listener = Callable[..., None]

_listeners: list[Listener] = []


def subscribe(listener: Listener) -> None:
    """Call ``listener(event_name, **data)`` for every event from now on."""
    _listeners.append(listener)


def emit(event: str, **data: Any) -> None:
    """Tell every listener about ``event``.

    The events: ``"scale_loss"`` (loss, scale, loss_id, dynamic: a loss is about to be scaled),
    ``"check_overflow"`` (scaler, tensors: a ``LossScaler`` is about to check these grads for
    inf/NaN; a listener may change them in place) and ``"step_skipped"`` (optimizer, loss_id).
    """
    if _listeners:
        for listener in _listeners:
            listener(event, **data)
