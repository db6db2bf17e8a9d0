"""``apex.multi_tensor_apply``: ``multi_tensor_applier``, which hands tensor lists to an ``amp_C`` kernel.

Apex's applier only passes its chunk size (2048 * 32) in front of the arguments; the
kernels themselves are in ``migrate.shim.amp_c``, written with torch ops.
"""

from __future__ import annotations

from typing import Any


class MultiTensorApply:
    """Calls ``op(chunk_size, noop_flag_buffer, tensor_lists, *args)``, as Apex's applier does."""

    available = True  # the kernels below need no CUDA build
    warned = False

    def __init__(self, chunk_size: int) -> None:
        self.chunk_size = chunk_size

    def check_avail(self) -> None:
        """Apex raised here when its extension was not built; the shim's kernels always are."""

    def __call__(self, op: Any, noop_flag_buffer: Any, tensor_lists: Any, *args: Any) -> Any:
        return op(self.chunk_size, noop_flag_buffer, tensor_lists, *args)


multi_tensor_applier = MultiTensorApply(2048 * 32)
