"""Pausing Python's cycle collector around work that makes many objects and no cycles."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def cycle_collector_paused() -> Iterator[None]:
    """Run the block with the cycle collector off (as it was before, after): its passes over
    syntax trees being built only find them all alive, and cost as much as the parse."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()
