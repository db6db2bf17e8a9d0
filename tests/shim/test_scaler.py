"""Apex's dynamic loss-scale rule, step by step, directly and through amp.scale_loss."""

from __future__ import annotations

import math

import pytest
import torch

from migrate.shim import amp
from migrate.shim.scaler import LossScaler


def backward_pass(scaler: LossScaler, overflow: bool) -> bool:
    """One backward pass's unscale + update, with or without an inf in the grads."""
    grads = [torch.ones(3), torch.full((2,), math.inf if overflow else 2.0)]
    scaler.clear_overflow_state()
    scaler.unscale(grads, grads, scaler.loss_scale())
    return scaler.update_scale()


def reference_schedule(
    overflows: list[bool], window: int, start: float, floor: float | None, cap: float
) -> list[tuple[float, bool]]:
    """The rule as the spec states it, written independently of the shim."""
    scale, clean, out = start, 0, []
    for overflow in overflows:
        if overflow:
            scale = max(floor, scale / 2) if floor else scale / 2
            clean = 0
        else:
            clean += 1
        if clean == window:
            scale, clean = min(cap, scale * 2), 0
        out.append((scale, overflow))
    return out


@pytest.mark.parametrize(
    ("overflows", "floor", "cap"),
    [
        (
            [True, True, False, False, False, True, False, False, False, False],
            None,
            2.0**24,
        ),
        ([True] * 6 + [False] * 7, 2.0**13, 2.0**24),  # the floor stops the halving
        ([False] * 12, None, 2.0**17),  # growth stops at the cap
    ],
    ids=["halve_then_grow", "min_loss_scale_floor", "max_loss_scale_cap"],
)
def test_schedule_follows_apex_rule_under_injected_overflows(
    overflows: list[bool], floor: float | None, cap: float
) -> None:
    window = 3
    scaler = LossScaler("dynamic", scale_window=window, min_loss_scale=floor, max_loss_scale=cap)
    expected = reference_schedule(overflows, window, min(cap, 2.0**16), floor, cap)
    observed = []
    for overflow in overflows:
        skipped = backward_pass(scaler, overflow)
        observed.append((scaler.loss_scale(), skipped))
    assert observed == expected


def test_initial_scale_is_capped_by_max_loss_scale() -> None:
    assert LossScaler("dynamic", max_loss_scale=2.0**10).loss_scale() == 2.0**10
    assert LossScaler("dynamic").loss_scale() == 2.0**16


def test_static_scale_never_skips_but_counts_clean_passes() -> None:
    scaler = LossScaler(128.0)
    assert [backward_pass(scaler, True) for _ in range(3)] == [False, False, False]
    assert scaler.loss_scale() == 128.0
    assert scaler._unskipped == 3


def test_unscale_with_stashed_checks_only_new_grads() -> None:
    scaler = LossScaler("dynamic")
    scaler.clear_overflow_state()
    new, stashed, out = (
        [torch.full((2,), 4.0)],
        [torch.full((2,), math.inf)],
        [torch.zeros(2)],
    )
    scaler.unscale_with_stashed(new, stashed, out)
    assert not scaler.update_scale()
    assert torch.isinf(out[0]).all()


def make_training(level: str, max_loss_scale: float = 2.0**24) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return amp.initialize(model, optimizer, opt_level=level, verbosity=0, max_loss_scale=max_loss_scale)


def test_scale_loss_skips_step_and_halves_on_overflow_then_steps() -> None:
    model, optimizer = make_training("O1")
    x = torch.randn(8, 4)
    history = []
    for poison in (True, False):
        optimizer.zero_grad()
        loss = model(x).float().pow(2).mean() * (math.inf if poison else 1.0)
        before = model.weight.detach().clone()
        with amp.scale_loss(loss, optimizer) as scaled:
            assert scaled.dtype is torch.float32
            scaled.backward()
        optimizer.step()
        history.append((amp.state_dict()["loss_scaler0"], torch.equal(before, model.weight)))
    assert history[0] == ({"loss_scale": 2.0**15, "unskipped": 0}, True)
    assert history[1] == ({"loss_scale": 2.0**15, "unskipped": 1}, False)


def test_scale_loss_yields_scaled_fp32_loss_and_unscales_grads_in_place() -> None:
    # 2**10, not 2**16: 65536 itself overflows fp16 (max 65504) in the fp16 linear's backward.
    model, optimizer = make_training("O1", max_loss_scale=2.0**10)
    x = torch.randn(8, 4)
    loss = model(x).float().sum()
    with amp.scale_loss(loss, optimizer) as scaled:
        assert scaled.item() == pytest.approx(loss.item() * 2.0**10, rel=1e-6)
        scaled.backward()
    expected = torch.autograd.functional.jacobian(
        lambda w: torch.nn.functional.linear(x, w, model.bias).sum(),
        model.weight.detach(),
    )
    torch.testing.assert_close(model.weight.grad, expected, rtol=2e-3, atol=1e-3)


def test_delay_unscale_accumulates_scaled_then_unscales_once() -> None:
    model, optimizer = make_training("O1", max_loss_scale=2.0**10)
    x = torch.randn(8, 4)
    with amp.scale_loss(model(x).float().sum(), optimizer, delay_unscale=True) as scaled:
        scaled.backward()
    assert amp.state_dict()["loss_scaler0"]["unskipped"] == 0  # no update while delayed
    assert model.bias.grad.abs().item() == pytest.approx(8 * 2.0**10)
    with amp.scale_loss(model(x).float().sum(), optimizer) as scaled:
        scaled.backward()
    assert amp.state_dict()["loss_scaler0"]["unskipped"] == 1
    assert model.bias.grad.item() == pytest.approx(16.0)


def test_one_scaler_per_loss_id() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1", num_losses=2, verbosity=0)
    loss = model(torch.randn(2, 4)).float().sum() * math.inf
    with amp.scale_loss(loss, optimizer, loss_id=1) as scaled:
        scaled.backward()
    optimizer.step()
    state = amp.state_dict()
    assert state["loss_scaler0"] == {"loss_scale": 2.0**16, "unskipped": 0}
    assert state["loss_scaler1"] == {"loss_scale": 2.0**15, "unskipped": 0}


def test_state_dict_round_trip_and_bad_key() -> None:
    make_training("O1")
    amp.load_state_dict({"loss_scaler0": {"loss_scale": 512.0, "unskipped": 7}})
    assert amp.state_dict() == {"loss_scaler0": {"loss_scale": 512.0, "unskipped": 7}}
    with pytest.raises(RuntimeError, match="unexpected key"):
        amp.load_state_dict({"scaler": {}})


def test_o0_and_o3_short_circuit_with_static_scale() -> None:
    for level in ("O0", "O3"):
        model, optimizer = make_training(level)
        loss = model(torch.randn(2, 4).to(next(model.parameters()).dtype)).sum()
        with amp.scale_loss(loss, optimizer) as scaled:
            assert scaled.dtype is torch.float32
            assert scaled.item() == pytest.approx(loss.float().item())
