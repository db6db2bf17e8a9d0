"""The pre-2019 FusedAdam, three ways: the ``LegacyFusedAdam`` class the fp16_optimizer rule writes
into migrated modules, the shim's FusedAdam stepped through the old ``step(grads=, scale=,
grad_norms=)`` API, and a direct float32 reference of the old kernel's formula written here.

The reference follows Apex's kernel element by element (see the rule's docstring): scaled
gradients divided by ``scale`` (times the clip ratio when the group's unscaled norm + 1e-6 exceeds
``max_grad_norm``), the moments, ``sqrt(v + eps)`` or ``sqrt(v) + eps``, the weight decay added to
the update and the bias correction folded into the step size.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from migrate.rules.fp16_optimizer import _LEGACY_FUSED_ADAM  # noqa: E402
from migrate.shim.legacy_fp16 import FP16_Optimizer  # noqa: E402
from migrate.shim.optimizers import FusedAdam  # noqa: E402

STEPS = 6
SCALE = 1024.0


def _legacy_class() -> Any:
    namespace: dict[str, Any] = {"torch": torch}
    exec(_LEGACY_FUSED_ADAM.format(name="LegacyFusedAdam"), namespace)
    return namespace["LegacyFusedAdam"]


def _reference(
    weights: list[list[torch.Tensor]], grads: list[list[list[torch.Tensor]]], settings: dict[str, Any]
) -> list[list[torch.Tensor]]:
    """The old update, per group and element, from true (unscaled) float32 gradients."""
    lr, (b1, b2), eps = settings["lr"], settings["betas"], settings["eps"]
    decay, max_norm = settings["weight_decay"], settings["max_grad_norm"]
    params = [[w.clone() for w in group] for group in weights]
    moments = [[(torch.zeros_like(w), torch.zeros_like(w)) for w in group] for group in weights]
    for t, step_grads in enumerate(grads, start=1):
        for group, group_grads, group_moments in zip(params, step_grads, moments):
            scaled = [g * SCALE for g in group_grads]
            grad_norm = math.sqrt(sum(float((s.double() ** 2).sum()) for s in scaled))  # norm of scaled grads
            combined = SCALE
            clip = ((grad_norm / SCALE) + 1e-6) / max_norm if max_norm > 0 else 0.0
            if clip > 1:
                combined = clip * SCALE
            step_size = lr * math.sqrt(1 - b2**t) / (1 - b1**t) if settings["bias_correction"] else lr
            for index, (p, s) in enumerate(zip(group, scaled)):
                m, v = group_moments[index]
                g = s / combined
                m = b1 * m + (1 - b1) * g
                v = b2 * v + (1 - b2) * g * g
                denom = torch.sqrt(v + eps) if settings["eps_inside_sqrt"] else torch.sqrt(v) + eps
                group[index] = p - step_size * (m / denom + decay * p)
                group_moments[index] = (m, v)
    return params


CASES = {
    "bert": {"bias_correction": False, "max_grad_norm": 1.0, "eps_inside_sqrt": False, "weight_decay": 0.01},
    "clip_inactive": {"bias_correction": True, "max_grad_norm": 1e6, "eps_inside_sqrt": False, "weight_decay": 0.0},
    "no_clip": {"bias_correction": True, "max_grad_norm": 0.0, "eps_inside_sqrt": True, "weight_decay": 0.1},
    "eps_inside": {"bias_correction": False, "max_grad_norm": 0.5, "eps_inside_sqrt": True, "weight_decay": 0.0},
}


def _problem(case: str) -> tuple[list[list[torch.Tensor]], list[list[list[torch.Tensor]]], dict[str, Any]]:
    gen = torch.Generator().manual_seed(7)
    weights = [[torch.randn(5, 3, generator=gen), torch.randn(3, generator=gen)], [torch.randn(4, generator=gen)]]
    grads = [[[torch.randn(w.shape, generator=gen) for w in group] for group in weights] for _ in range(STEPS)]
    settings = dict(lr=0.05, betas=(0.9, 0.999), eps=1e-4, **CASES[case])
    return weights, grads, settings


def _clip_active(grads: list[list[list[torch.Tensor]]], max_norm: float) -> bool:
    return any(
        max_norm > 0 and math.sqrt(sum(float((g**2).sum()) for g in group)) + 1e-6 > max_norm
        for step in grads
        for group in step
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_generated_class_matches_the_old_formula(case: str) -> None:
    weights, grads, settings = _problem(case)
    expected = _reference(weights, grads, settings)
    params = [[torch.nn.Parameter(w.clone()) for w in group] for group in weights]
    optimizer = _legacy_class()(
        [{"params": params[0]}, {"params": params[1]}],
        lr=settings["lr"],
        bias_correction=settings["bias_correction"],
        betas=settings["betas"],
        eps=settings["eps"],
        eps_inside_sqrt=settings["eps_inside_sqrt"],
        weight_decay=settings["weight_decay"],
        max_grad_norm=settings["max_grad_norm"],
    )
    for step_grads in grads:
        for group, group_grads in zip(params, step_grads):
            for p, g in zip(group, group_grads):
                p.grad = g.clone()
        optimizer.step()
    for group, reference in zip(params, expected):
        for p, r in zip(group, reference):
            torch.testing.assert_close(p.detach(), r, rtol=1e-5, atol=1e-6)
    # the cases exercise what they are named for
    assert _clip_active(grads, settings["max_grad_norm"]) == (case in ("bert", "eps_inside"))


@pytest.mark.parametrize("case", sorted(CASES))
def test_shim_old_step_api_matches_the_old_formula(case: str) -> None:
    weights, grads, settings = _problem(case)
    expected = _reference(weights, grads, settings)
    masters = [[w.clone() for w in group] for group in weights]
    optimizer = FusedAdam(
        [{"params": masters[0]}, {"params": masters[1]}],
        lr=settings["lr"],
        bias_correction=settings["bias_correction"],
        betas=settings["betas"],
        eps=settings["eps"],
        weight_decay=settings["weight_decay"],
        eps_inside_sqrt=settings["eps_inside_sqrt"],
        max_grad_norm=settings["max_grad_norm"],
    )
    assert optimizer.legacy
    for step_grads in grads:
        scaled = [[g * SCALE for g in group] for group in step_grads]
        norms = [math.sqrt(sum(float((s**2).sum()) for s in group)) for group in scaled]
        optimizer.step(grads=scaled, scale=SCALE, grad_norms=norms)
    for group, reference in zip(masters, expected):
        for p, r in zip(group, reference):
            torch.testing.assert_close(p, r, rtol=1e-5, atol=1e-6)


def test_new_fused_adam_is_untouched_by_default() -> None:
    param = torch.nn.Parameter(torch.ones(3))
    optimizer = FusedAdam([param], lr=0.1, weight_decay=0.5)
    param.grad = torch.ones(3)
    optimizer.step()
    assert not optimizer.legacy
    # AdamW: decay lr * wd * p outside the bias-corrected step
    torch.testing.assert_close(param.detach(), torch.full((3,), 1 - 0.1 * 0.5 - 0.1 / (1 + 1e-8)))


def test_new_only_settings_cannot_take_the_old_api() -> None:
    optimizer = FusedAdam([torch.nn.Parameter(torch.ones(2))], adam_w_mode=False)
    with pytest.raises(TypeError, match="pre-2019"):
        optimizer.step(grads=[torch.ones(2)], scale=2.0)


def test_fp16_optimizer_dynamic_scale_follows_apex() -> None:
    """Start 2**16; an overflow halves (never below 1) and skips; 1000 steps after the last
    overflow (counting it) the scale doubles; dynamic_loss_args raised."""
    param = torch.nn.Parameter(torch.ones(2, dtype=torch.float16))
    with pytest.raises(SystemError):
        FP16_Optimizer(FusedAdam([torch.nn.Parameter(torch.ones(1))]), 1.0, True, {"scale_window": 10})
    optimizer = FP16_Optimizer(FusedAdam([param], lr=1e-3), dynamic_loss_scale=True, verbose=False)
    assert optimizer.cur_scale == 2.0**16
    for _ in range(20):  # overflow every step: floor at 1
        param.grad = torch.tensor([float("inf"), 0.0], dtype=torch.float16)
        optimizer.step()
    assert optimizer.cur_scale == 1.0
    before = param.detach().clone()
    scales = []
    for _ in range(1000):
        param.grad = torch.tensor([1.0, 1.0], dtype=torch.float16)
        optimizer.step()
        scales.append(optimizer.cur_scale)
    assert scales[-2] == 1.0 and scales[-1] == 2.0, "grows on the 1000th clean step after the overflow"
    assert not torch.equal(param.detach(), before)


def test_fp16_optimizer_static_scale_skips_overflow() -> None:
    param = torch.nn.Parameter(torch.ones(2, dtype=torch.float16))
    optimizer = FP16_Optimizer(FusedAdam([param], lr=1e-3), static_loss_scale=8.0)
    param.grad = torch.tensor([float("nan"), 0.0], dtype=torch.float16)
    optimizer.step()
    assert torch.equal(param.detach(), torch.ones(2, dtype=torch.float16))
    assert optimizer.cur_scale == 8.0
    loss = (param.float() * 2).sum()
    optimizer.zero_grad()
    optimizer.backward(loss)
    assert param.grad is not None and torch.equal(param.grad, torch.full((2,), 16.0, dtype=torch.float16))
    optimizer.step()
    assert param.dtype == torch.float16 and not torch.equal(param.detach(), torch.ones(2, dtype=torch.float16))
    assert optimizer.optimizer.param_groups[0]["params"][0].dtype == torch.float32
