"""``apex.optimizers.FP16_Optimizer``: the wrapper Apex shipped (Dec 2018 to Aug 2019) for its old FusedAdam.

A cut-down ``apex.fp16_utils.FP16_Optimizer``: the fp16 parameters of each group become views of
one flat fp16 buffer, with one flat fp32 master copy per group in the wrapped optimizer.
``backward(loss)`` runs ``(loss.float() * cur_scale).backward()``. ``step()`` takes the 2-norm of
each group's flat fp16 gradients (accumulated in fp32); an inf/NaN norm skips the step (dynamic:
the scale halves, never below 1). Otherwise the wrapped FusedAdam steps with
``step(grads=, output_params=, scale=cur_scale, grad_norms=)``, which unscales, clips to its
``max_grad_norm`` and writes the fp16 copies. The dynamic scale starts at 2**16 and doubles when
1000 steps have passed since the last overflow (``(cur_iter - last_overflow_iter) % 1000 == 0``,
``cur_iter`` counting every step); ``dynamic_loss_args`` raised. Static scales also skip
overflowing steps. ``zero_grad`` sets the fp16 grads to None by default.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from migrate.shim import events

__all__ = ["FP16_Optimizer"]


def _flat_views(params: list[torch.Tensor]) -> torch.Tensor:
    """One flat copy of ``params``; each parameter's data becomes a view into it."""
    flat = torch.cat([param.detach().reshape(-1) for param in params]).clone()
    _repoint(params, flat)
    return flat


def _repoint(params: list[torch.Tensor], flat: torch.Tensor) -> None:
    """Make each parameter's data a view into ``flat``, in order."""
    offset = 0
    for param in params:
        count = param.numel()
        param.data = flat[offset : offset + count].view_as(param)
        offset += count


class FP16_Optimizer:
    """Apex's pre-2019 ``apex.optimizers.FP16_Optimizer`` over the old FusedAdam."""

    def __init__(
        self,
        init_optimizer: Any,
        static_loss_scale: float = 1.0,
        dynamic_loss_scale: bool = False,
        dynamic_loss_args: dict[str, Any] | None = None,
        verbose: bool = True,
    ) -> None:
        self.optimizer = init_optimizer
        switch = getattr(init_optimizer, "use_legacy_update", None)
        if switch is not None:
            switch()  # it drives the old FusedAdam: the only optimizer it ever worked with
        self.fp16_groups: list[list[torch.Tensor]] = []
        self.fp16_groups_flat: list[torch.Tensor] = []
        self.fp32_groups_flat: list[torch.Tensor] = []
        for group in self.optimizer.param_groups:
            self.fp16_groups.append(group["params"])
            flat = _flat_views(group["params"])
            self.fp16_groups_flat.append(flat)
            master = flat.detach().clone().float()
            master.requires_grad = True
            self.fp32_groups_flat.append(master)
            group["params"] = [master]
        if dynamic_loss_scale:
            if dynamic_loss_args is not None:
                raise SystemError("Do not support dynamic loss scale args for now.")
            self.dynamic_loss_scale = True
            self.cur_scale: float = 2.0**16
            self.cur_iter = 0
            self.last_overflow_iter = -1
            self.scale_factor = 2.0
            self.scale_window = 1000
        else:
            self.dynamic_loss_scale = False
            self.cur_iter = 0
            self.cur_scale = static_loss_scale
        self.verbose = verbose

    def zero_grad(self, set_grads_to_None: bool = True) -> None:
        for group in self.fp16_groups:
            for param in group:
                if set_grads_to_None:
                    param.grad = None
                elif param.grad is not None:
                    param.grad.detach_()
                    param.grad.zero_()

    @staticmethod
    def _grad_norm(flat_grads: torch.Tensor) -> float:
        """The 2-norm in float32, or -1 when it is inf or NaN (an overflow)."""
        norm = float(torch.linalg.vector_norm(flat_grads, 2.0, dtype=torch.float32))
        return norm if math.isfinite(norm) else -1

    def step(self, closure: Any = None) -> None:
        """One step; Apex took ``closure`` and ignored it."""
        # ampmigrate verify plants its overflows here, as at the amp LossScaler's check
        events.emit(
            "check_overflow", scaler=self, tensors=[param.grad for group in self.fp16_groups for param in group]
        )
        flat_grads, norms = [], []
        for group in self.fp16_groups:
            grads = [param.grad for param in group]
            if any(grad is None for grad in grads):
                raise TypeError("apex.optimizers.FP16_Optimizer flattens every parameter's gradient: one is None")
            flat = torch.cat([grad.reshape(-1) for grad in grads])  # type: ignore[union-attr]
            flat_grads.append(flat)
            norms.append(self._grad_norm(flat))
        if any(norm == -1 for norm in norms):
            events.emit("step_skipped", optimizer=self.optimizer, loss_id=0)
            self._update_scale(True)
            return
        # Apex's masters never had a .grad (the grads go in as arguments); the unscaled copy lets
        # ampmigrate verify measure the gradient this step used, as GradScaler's unscale_ shows it
        for master, flat in zip(self.fp32_groups_flat, flat_grads):
            master.grad = flat.float() / self.cur_scale
        try:
            self.optimizer.step(
                grads=[[grad] for grad in flat_grads],
                output_params=[[flat] for flat in self.fp16_groups_flat],
                scale=self.cur_scale,
                grad_norms=norms,
            )
        finally:
            for master in self.fp32_groups_flat:
                master.grad = None
        # Apex pointed the parameters at the flat buffer again after each step: a model.float() /
        # model.half() round trip (a float32 checkpoint saved mid-training) had replaced their data
        for group, flat in zip(self.fp16_groups, self.fp16_groups_flat):
            _repoint(group, flat)
        self._update_scale(False)

    def backward(self, loss: torch.Tensor) -> None:
        events.emit("scale_loss", loss=loss, scale=self.cur_scale, loss_id=0, dynamic=self.dynamic_loss_scale)
        (loss.float() * self.cur_scale).backward()

    def _update_scale(self, skip: bool) -> None:
        if self.dynamic_loss_scale:
            if skip:
                if self.verbose:
                    print("\nGrad overflow on iteration", self.cur_iter)
                    print("Using dynamic loss scale of", self.cur_scale)
                self.cur_scale = max(self.cur_scale / self.scale_factor, 1)
                self.last_overflow_iter = self.cur_iter
            elif (self.cur_iter - self.last_overflow_iter) % self.scale_window == 0:
                self.cur_scale *= self.scale_factor
        elif skip:
            print("\nGrad overflow on iteration", self.cur_iter)
            print("Using static loss scale of", self.cur_scale)
        self.cur_iter += 1

    @property
    def dynamic(self) -> bool:
        """Whether the scale is dynamic (what ``check_overflow`` listeners read)."""
        return self.dynamic_loss_scale

    @property
    def state(self) -> Any:
        return self.optimizer.state

    @state.setter
    def state(self, value: Any) -> None:
        self.optimizer.state = value

    @property
    def param_groups(self) -> Any:
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: Any) -> None:
        self.optimizer.param_groups = value

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "dynamic_loss_scale": self.dynamic_loss_scale,
            "cur_scale": self.cur_scale,
            "cur_iter": self.cur_iter,
        }
        if self.dynamic_loss_scale:
            state["last_overflow_iter"] = self.last_overflow_iter
            state["scale_factor"] = self.scale_factor
            state["scale_window"] = self.scale_window
        state["optimizer_state_dict"] = self.optimizer.state_dict()
        state["fp32_groups_flat"] = self.fp32_groups_flat
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.dynamic_loss_scale = state["dynamic_loss_scale"]
        self.cur_scale = state["cur_scale"]
        self.cur_iter = state["cur_iter"]
        if self.dynamic_loss_scale:
            self.last_overflow_iter = state["last_overflow_iter"]
            self.scale_factor = state["scale_factor"]
            self.scale_window = state["scale_window"]
        self.optimizer.load_state_dict(state["optimizer_state_dict"])
        with torch.no_grad():
            for current, saved in zip(self.fp32_groups_flat, state["fp32_groups_flat"]):
                current.copy_(saved)
