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
    """Tell every listener about ``event`` (``"scale_loss"``, ``"step_skipped"``)."""
    if _listeners:
        for listener in _listeners:
            listener(event, **data)
