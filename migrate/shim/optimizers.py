"""``apex.optimizers`` in plain PyTorch: the update rules of Apex's fused kernels, unfused.

Math is done in fp32 and written back in the param's dtype, as the kernels do. Defaults follow
Apex, notably ``FusedAdam(adam_w_mode=True)``: decoupled weight decay (AdamW), not L2.

``FP16_Optimizer`` is the pre-2019 wrapper of the old FusedAdam (``migrate.shim.legacy_fp16``).
"""

from __future__ import annotations

import math
import types
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.optim import Optimizer
from torch.optim.optimizer import required

from migrate.shim.legacy_fp16 import FP16_Optimizer as FP16_Optimizer


class _FusedBase(Optimizer):
    """``zero_grad()`` takes no arguments and honours ``set_grad_none``, as in Apex."""

    def __init__(self, params: Iterable[Any], defaults: dict[str, Any], set_grad_none: bool) -> None:
        super().__init__(params, defaults)
        self.set_grad_none = set_grad_none

    def zero_grad(self) -> None:  # type: ignore[override]
        super().zero_grad(set_to_none=self.set_grad_none)

    @staticmethod
    def _advance(group: dict[str, Any]) -> tuple[float, float]:
        """Count one more step for ``group``; its two bias corrections (1.0 when off)."""
        group["step"] = group.get("step", 0) + 1
        if not group["bias_correction"]:
            return 1.0, 1.0
        beta1, beta2 = group["betas"]
        return 1 - beta1 ** group["step"], 1 - beta2 ** group["step"]

    @staticmethod
    def _adam_update(
        group: dict[str, Any],
        grad: torch.Tensor,
        weight: torch.Tensor,
        exp_avg: torch.Tensor,
        exp_avg_sq: torch.Tensor,
        corrections: tuple[float, float],
        adam_w_mode: bool,
        first_moment_weight: float,
    ) -> torch.Tensor:
        """Adam's step direction (moments updated in place); weight decay as L2 or
        decoupled (AdamW), as ``adam_w_mode`` says. FusedAdam and FusedLAMB share it."""
        beta1, beta2 = group["betas"]
        decay = group["weight_decay"]
        if not adam_w_mode and decay != 0:
            grad = grad + decay * weight
        exp_avg.mul_(beta1).add_(grad, alpha=first_moment_weight)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        bc1, bc2 = corrections
        update = (exp_avg / bc1) / ((exp_avg_sq / bc2).sqrt() + group["eps"])
        if adam_w_mode and decay != 0:
            update = update + decay * weight
        return update

    @staticmethod
    def _closure_loss(closure: Callable[[], Any] | None) -> Any:
        if closure is None:
            return None
        with torch.enable_grad():
            return closure()


class FusedAdam(_FusedBase):
    """Adam/AdamW; ``adam_w_mode=True`` (default) decays weights decoupled, like AdamW.

    Apex's FusedAdam before its August 2019 rewrite was another optimizer under the same name:
    arguments ``eps_inside_sqrt`` and ``max_grad_norm`` (no ``adam_w_mode``), and a
    ``step(grads=, output_params=, scale=, grad_norms=)`` that ``apex.optimizers.FP16_Optimizer``
    drove. No Apex version took both, so the instance picks by what it is given: the old
    arguments (as keywords), a call of the old step API, or being wrapped by that
    FP16_Optimizer make it the old optimizer (``_legacy_step``); anything else is the current one.
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        bias_correction: bool = True,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        adam_w_mode: bool = True,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        set_grad_none: bool = True,
        capturable: bool = False,
        master_weights: bool = False,
        *,
        eps_inside_sqrt: bool | None = None,
        max_grad_norm: float | None = None,
    ) -> None:
        if amsgrad:
            raise RuntimeError("FusedAdam does not support AMSGrad")
        if master_weights and not capturable:
            raise RuntimeError("FusedAdam master_weights requires capturable=True")
        defaults = {
            "lr": lr,
            "bias_correction": bias_correction,
            "betas": betas,
            "eps": eps,
            "weight_decay": weight_decay,
        }
        super().__init__(params, defaults, set_grad_none)
        self.adam_w_mode = adam_w_mode
        self.capturable = capturable
        self.master_weights = master_weights
        self.legacy = False
        self.eps_inside_sqrt = bool(eps_inside_sqrt)
        if eps_inside_sqrt is not None or max_grad_norm is not None:
            self.use_legacy_update(max_grad_norm or 0.0)

    def use_legacy_update(self, max_grad_norm: float = 0.0) -> None:
        """Behave as Apex's pre-2019 FusedAdam from now on (see ``_legacy_step``).

        No Apex version had both the old arguments and the new ones, so an instance built with
        a setting only the new FusedAdam knew cannot turn into the old one.
        """
        if self.legacy:
            return
        if not self.adam_w_mode or self.capturable or self.master_weights:
            raise TypeError(
                "the pre-2019 FusedAdam (max_grad_norm, eps_inside_sqrt, step(grads=..., scale=...)) had no "
                "adam_w_mode, capturable or master_weights"
            )
        self.legacy = True
        self.set_grad_none = False  # torch.optim.Optimizer.zero_grad of that time zeroed the grads
        self.defaults["max_grad_norm"] = max_grad_norm
        for group in self.param_groups:
            group.setdefault("max_grad_norm", max_grad_norm)

    @torch.no_grad()
    def step(  # type: ignore[override]
        self,
        closure: Callable[[], Any] | None = None,
        grads: Any = None,
        output_params: Any = None,
        scale: float | None = None,
        grad_norms: list[float] | None = None,
    ) -> Any:
        if not self.legacy and (grads, output_params, scale, grad_norms) != (None, None, None, None):
            self.use_legacy_update()  # only the old FusedAdam took these (current Apex raises)
        if self.legacy:
            return self._legacy_step(closure, grads, output_params, 1.0 if scale is None else scale, grad_norms)
        loss = self._closure_loss(closure)
        for group in self.param_groups:
            corrections = self._advance(group)
            beta1 = group["betas"][0]
            for param in group["params"]:
                if param.grad is None:
                    continue
                if param.grad.is_sparse:
                    raise RuntimeError("FusedAdam does not support sparse gradients")
                state = self.state[param]
                if not state:
                    state["exp_avg"] = torch.zeros_like(param)
                    state["exp_avg_sq"] = torch.zeros_like(param)
                grad = param.grad.float()
                weight = param.float()
                exp_avg = state["exp_avg"].float()
                exp_avg_sq = state["exp_avg_sq"].float()
                update = self._adam_update(
                    group, grad, weight, exp_avg, exp_avg_sq, corrections, self.adam_w_mode, 1 - beta1
                )
                weight.add_(update, alpha=-group["lr"])
                param.copy_(weight)
                state["exp_avg"].copy_(exp_avg)
                state["exp_avg_sq"].copy_(exp_avg_sq)
        return loss

    @staticmethod
    def _per_group(values: Any, groups: int) -> list[Any]:
        """The old API's grads/output_params: one list per group, or one flat list for one group."""
        if values is None:
            return [None] * groups
        if isinstance(values, types.GeneratorType) or not isinstance(values[0], list):
            return [values]
        return list(values)

    def _legacy_step(
        self,
        closure: Callable[[], Any] | None,
        grads: Any,
        output_params: Any,
        scale: float,
        grad_norms: list[float] | None,
    ) -> Any:
        """Apex's pre-2019 FusedAdam update (fused_adam_cuda's kernel), in float32.

        Per group: with ``max_grad_norm > 0``, ``clip = (grad_norm / scale + 1e-6) / max_grad_norm``
        (``grad_norm`` is the norm of the *scaled* gradients, passed in ``grad_norms``) and, when
        ``clip > 1``, the gradients are divided by ``clip * scale`` instead of ``scale``. Per element:
        ``m = b1 m + (1 - b1) g``, ``v = b2 v + (1 - b2) g g``, ``denom = sqrt(v + eps)`` with
        ``eps_inside_sqrt`` else ``sqrt(v) + eps``, ``p -= step_size (m / denom + weight_decay p)`` with
        ``step_size = lr sqrt(1 - b2^t) / (1 - b1^t)`` (just ``lr`` without bias correction); the
        step count ``t`` is kept per parameter. ``output_params`` get a copy of the new values.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        groups = len(self.param_groups)
        norms = [None] * groups if grad_norms is None else grad_norms
        for group, group_grads, group_outputs, grad_norm in zip(
            self.param_groups, self._per_group(grads, groups), self._per_group(output_params, groups), norms
        ):
            params = group["params"]
            group_grads = [None] * len(params) if group_grads is None else group_grads
            group_outputs = [None] * len(params) if group_outputs is None else group_outputs
            combined_scale = scale
            if group["max_grad_norm"] > 0:
                if grad_norm is None:
                    raise TypeError("the old FusedAdam with max_grad_norm > 0 needs step(grad_norms=...)")
                clip = (grad_norm / scale + 1e-6) / group["max_grad_norm"]
                if clip > 1:
                    combined_scale = clip * scale
            beta1, beta2 = group["betas"]
            for param, grad, output in zip(params, group_grads, group_outputs):
                if grad is None:
                    grad = param.grad
                if grad is None:
                    continue
                if grad.is_sparse:
                    raise RuntimeError("FusedAdam does not support sparse gradients")
                state = self.state[param]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(param, dtype=torch.float32)
                    state["exp_avg_sq"] = torch.zeros_like(param, dtype=torch.float32)
                state["step"] += 1
                step = state["step"]
                step_size = group["lr"]
                if group["bias_correction"]:
                    step_size = group["lr"] * math.sqrt(1 - beta2**step) / (1 - beta1**step)
                weight = param.float()
                scaled = grad.float() / combined_scale
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                exp_avg.mul_(beta1).add_(scaled, alpha=1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(scaled, scaled, value=1 - beta2)
                if self.eps_inside_sqrt:
                    denom = (exp_avg_sq + group["eps"]).sqrt()
                else:
                    denom = exp_avg_sq.sqrt() + group["eps"]
                update = exp_avg / denom + group["weight_decay"] * weight
                weight.sub_(update * step_size)
                param.copy_(weight)
                if output is not None:
                    output.copy_(weight)
        return loss


class FusedSGD(_FusedBase):
    """SGD with momentum, dampening, Nesterov and L2 decay (before or after momentum)."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: Any = required,  # as in Apex: each param group may give its own instead
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        wd_after_momentum: bool = False,
        materialize_master_grads: bool = True,
        set_grad_none: bool = False,
    ) -> None:
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        defaults = {
            "lr": lr,
            "momentum": momentum,
            "dampening": dampening,
            "weight_decay": weight_decay,
            "nesterov": nesterov,
        }
        super().__init__(params, defaults, set_grad_none)
        self.wd_after_momentum = wd_after_momentum
        self.materialize_master_grads = materialize_master_grads

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        loss = self._closure_loss(closure)
        for group in self.param_groups:
            momentum, dampening = group["momentum"], group["dampening"]
            decay, nesterov = group["weight_decay"], group["nesterov"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                grad = param.grad.float()
                weight = param.float()
                if decay != 0 and not self.wd_after_momentum:
                    grad = grad + decay * weight
                if momentum != 0:
                    state = self.state[param]
                    if "momentum_buffer" not in state:
                        # First step: the buffer is the gradient itself (no dampening).
                        buffer = grad.clone()
                        state["momentum_buffer"] = buffer
                    else:
                        buffer = state["momentum_buffer"]
                        buffer.mul_(momentum).add_(grad, alpha=1 - dampening)
                    grad = grad + momentum * buffer if nesterov else buffer
                if decay != 0 and self.wd_after_momentum:
                    grad = grad + decay * weight
                weight.add_(grad, alpha=-group["lr"])
                param.copy_(weight)
        return loss


class FusedAdagrad(_FusedBase):
    """Adagrad with L2 (``adagrad_w_mode=False``) or decoupled weight decay."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-2,
        eps: float = 1e-10,
        weight_decay: float = 0.0,
        set_grad_none: bool = True,
        adagrad_w_mode: bool = False,
    ) -> None:
        super().__init__(params, {"lr": lr, "eps": eps, "weight_decay": weight_decay}, set_grad_none)
        self.adagrad_w_mode = adagrad_w_mode

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        loss = self._closure_loss(closure)
        for group in self.param_groups:
            decay = group["weight_decay"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                if not state:
                    state["sum"] = torch.zeros_like(param, dtype=torch.float32)
                grad = param.grad.float()
                weight = param.float()
                if decay != 0 and not self.adagrad_w_mode:
                    grad = grad + decay * weight
                state["sum"].addcmul_(grad, grad)
                update = grad / (state["sum"].sqrt() + group["eps"])
                if decay != 0 and self.adagrad_w_mode:
                    update = update + decay * weight
                weight.add_(update, alpha=-group["lr"])
                param.copy_(weight)
        return loss


class FusedLAMB(_FusedBase):
    """LAMB: global grad-norm clipping, Adam moments, per-tensor trust ratio."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        bias_correction: bool = True,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.01,
        amsgrad: bool = False,
        adam_w_mode: bool = True,
        grad_averaging: bool = True,
        set_grad_none: bool = True,
        max_grad_norm: float = 1.0,
        use_nvlamb: bool = False,
    ) -> None:
        if amsgrad:
            raise RuntimeError("FusedLAMB does not support AMSGrad")
        defaults = {
            "lr": lr,
            "bias_correction": bias_correction,
            "betas": betas,
            "eps": eps,
            "weight_decay": weight_decay,
            "grad_averaging": grad_averaging,
            "max_grad_norm": max_grad_norm,
        }
        super().__init__(params, defaults, set_grad_none)
        self.adam_w_mode = adam_w_mode
        self.use_nvlamb = use_nvlamb

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        loss = self._closure_loss(closure)
        grads = [p.grad.float() for g in self.param_groups for p in g["params"] if p.grad is not None]
        if not grads:
            return loss
        global_norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
        for group in self.param_groups:
            beta1 = group["betas"][0]
            beta3 = 1 - beta1 if group["grad_averaging"] else 1.0
            corrections = self._advance(group)
            max_norm, decay = group["max_grad_norm"], group["weight_decay"]
            clip = (global_norm / max_norm).clamp(min=1.0) if max_norm > 0 else torch.ones(())
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                if not state:
                    state["exp_avg"] = torch.zeros_like(param, dtype=torch.float32)
                    state["exp_avg_sq"] = torch.zeros_like(param, dtype=torch.float32)
                grad = param.grad.float() / clip
                weight = param.float()
                update = self._adam_update(
                    group, grad, weight, state["exp_avg"], state["exp_avg_sq"], corrections, self.adam_w_mode, beta3
                )
                ratio = 1.0
                if self.use_nvlamb or decay != 0:
                    weight_norm = float(torch.linalg.vector_norm(weight))
                    update_norm = float(torch.linalg.vector_norm(update))
                    if weight_norm > 0 and update_norm > 0:
                        ratio = weight_norm / update_norm
                weight.add_(update, alpha=-group["lr"] * ratio)
                param.copy_(weight)
        return loss


class FusedNovoGrad(_FusedBase):
    """NovoGrad: per-tensor second moment of the gradient norm."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        bias_correction: bool = True,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        reg_inside_moment: bool = False,
        grad_averaging: bool = True,
        norm_type: int = 2,
        init_zero: bool = False,
        set_grad_none: bool = True,
    ) -> None:
        if amsgrad:
            raise RuntimeError("FusedNovoGrad does not support AMSGrad")
        if norm_type not in (0, 2):
            raise RuntimeError("FusedNovoGrad supports norm_type 0 (max) and 2 only")
        defaults = {
            "lr": lr,
            "bias_correction": bias_correction,
            "betas": betas,
            "eps": eps,
            "weight_decay": weight_decay,
            "grad_averaging": grad_averaging,
        }
        super().__init__(params, defaults, set_grad_none)
        self.reg_inside_moment = reg_inside_moment
        self.norm_type = norm_type
        self.init_zero = init_zero

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        loss = self._closure_loss(closure)
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            beta3 = 1 - beta1 if group["grad_averaging"] else 1.0
            bc1, bc2_squared = self._advance(group)
            bc2 = math.sqrt(bc2_squared)
            decay = group["weight_decay"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                grad = param.grad.float()
                weight = param.float()
                norm = grad.abs().max() if self.norm_type == 0 else torch.linalg.vector_norm(grad)
                norm_sq = norm * norm
                state = self.state[param]
                if not state:
                    state["exp_avg"] = torch.zeros_like(param, dtype=torch.float32)
                    state["exp_avg_sq"] = torch.zeros((), dtype=torch.float32) if self.init_zero else norm_sq.clone()
                else:
                    state["exp_avg_sq"].mul_(beta2).add_(norm_sq, alpha=1 - beta2)
                denom = state["exp_avg_sq"].sqrt() / bc2 + group["eps"]
                normalized = grad / denom
                if self.reg_inside_moment and decay != 0:
                    normalized = normalized + decay * weight
                state["exp_avg"].mul_(beta1).add_(normalized, alpha=beta3)
                update = state["exp_avg"] / bc1
                if not self.reg_inside_moment and decay != 0:
                    update = update + decay * weight
                weight.add_(update, alpha=-group["lr"])
                param.copy_(weight)
        return loss


class FusedMixedPrecisionLamb(FusedLAMB):
    """LAMB that keeps its moments in fp32 for low-precision params (as FusedLAMB here does)."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, step: int = 0, **kwargs: Any) -> None:
        kwargs.pop("reduced_precision_dtype", None)
        super().__init__(params, lr=lr, **kwargs)
        for group in self.param_groups:
            group["step"] = step
