"""Apex's ``LossScaler``: one scale per loss, updated once per non-delayed ``scale_loss`` exit.

Rule (``apex/amp/scaler.py``): a dynamic scaler starts at ``min(max_loss_scale, init_scale)``;
an overflow halves it (floored at ``min_loss_scale`` when that is truthy), resets the clean
counter and skips the step; otherwise the counter grows, and at ``scale_window`` clean passes
the scale doubles (capped at ``max_loss_scale``) and the counter resets. A static scaler never
checks for overflow and never skips, but still counts clean passes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from migrate.shim import events


class LossScaler:
    """Dynamic or static loss scale with Apex's update rule."""

    def __init__(
        self,
        loss_scale: float | str,
        init_scale: float = 2.0**16,
        scale_factor: float = 2.0,
        scale_window: int = 2000,
        min_loss_scale: float | None = None,
        max_loss_scale: float = 2.0**24,
    ) -> None:
        # ``scale_factor`` is accepted for FP16_Optimizer's ``dynamic_loss_args`` but, as in
        # Apex, the rule always halves and doubles.
        del scale_factor
        self.dynamic = loss_scale == "dynamic"
        if self.dynamic:
            self._loss_scale = min(max_loss_scale, init_scale)
        else:
            self._loss_scale = float(loss_scale)
        self._max_loss_scale = max_loss_scale
        self._min_loss_scale = min_loss_scale
        self._scale_seq_len = scale_window
        self._unskipped = 0
        self._has_overflow = False
        # A device tensor per device, written by the unscale kernel and read once per update.
        self._overflow_flags: dict[torch.device, torch.Tensor] = {}

    def loss_scale(self) -> float:
        """The current scale, a Python float."""
        return self._loss_scale

    def clear_overflow_state(self) -> None:
        """Forget overflows seen before this backward pass."""
        self._has_overflow = False
        for flag in self._overflow_flags.values():
            flag.zero_()

    def _flag(self, device: torch.device) -> torch.Tensor:
        flag = self._overflow_flags.get(device)
        if flag is None:
            flag = self._overflow_flags[device] = torch.zeros(1, device=device)
        return flag

    def _check_and_scale(self, tensors: list[torch.Tensor], factor: float) -> None:
        """Multiply ``tensors`` in place by ``factor``, flagging any non-finite element."""
        # ``ampmigrate verify`` may plant an overflow here, just before the check sees the grads.
        events.emit("check_overflow", scaler=self, tensors=tensors)
        by_device: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
        for tensor in tensors:
            by_device.setdefault((tensor.device, tensor.dtype), []).append(tensor)
        for (device, _dtype), group in by_device.items():
            inv = torch.full((1,), factor, dtype=torch.float32, device=device)
            torch._amp_foreach_non_finite_check_and_unscale_(group, self._flag(device), inv)

    def unscale(
        self,
        model_grads: Sequence[torch.Tensor],
        master_grads: Sequence[torch.Tensor],
        scale: float,
    ) -> None:
        """``master = model / scale``; overflow is judged on ``model_grads``.

        When the two lists are the same tensors this unscales in place (O0/O1/O3).
        """
        if not model_grads:
            return
        if not self.dynamic and scale == 1.0 and all(m is g for m, g in zip(model_grads, master_grads)):
            return
        # 1/scale in Python double, applied as a float, as Apex does.
        factor = 1.0 / scale
        in_place = all(m is g for m, g in zip(model_grads, master_grads))
        if in_place:
            self._check_and_scale(list(model_grads), factor)
            return
        for model, master in zip(model_grads, master_grads):
            master.copy_(model)
        self._check_and_scale(list(master_grads), factor)

    def unscale_with_stashed(
        self,
        model_grads: Sequence[torch.Tensor],
        stashed_grads: Sequence[torch.Tensor],
        out_grads: Sequence[torch.Tensor],
    ) -> None:
        """``out = model / scale + stashed``; only the new ``model_grads`` are checked."""
        if not model_grads:
            return
        scaled = [model.to(out.dtype, copy=True) for model, out in zip(model_grads, out_grads)]
        self._check_and_scale(scaled, 1.0 / self._loss_scale)
        for out, new, stashed in zip(out_grads, scaled, stashed_grads):
            out.copy_(new + stashed.to(out.dtype))

    def update_scale(self) -> bool:
        """Apply the overflow/growth rule once; return True when the step must be skipped."""
        if self.dynamic:
            self._has_overflow = any(bool(flag.item()) for flag in self._overflow_flags.values())
        if self._has_overflow and self.dynamic:
            should_skip = True
            halved = self._loss_scale / 2.0
            # Apex tests the floor for truthiness: 0 and None both mean "no floor".
            self._loss_scale = max(self._min_loss_scale, halved) if self._min_loss_scale else halved
            self._unskipped = 0
        else:
            should_skip = False
            self._unskipped += 1
        if self._unskipped == self._scale_seq_len and self.dynamic:
            self._loss_scale = min(self._max_loss_scale, self._loss_scale * 2.0)
            self._unskipped = 0
        return should_skip
