"""The old amp API under the shim: ``amp.init``, ``handle.scale_loss`` and ``wrap_optimizer``."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from migrate.shim import amp, events


def _model_and_optimizer() -> tuple[torch.nn.Linear, torch.optim.SGD]:
    """No bias, inputs of 0.25 and a float32 loss: the float16 grads stay below 65504 at a scale
    of 2**16 (the handle did not cast the loss to float32, as amp.scale_loss later did)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1, bias=False)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


@pytest.fixture
def heard() -> list[tuple[str, dict[str, Any]]]:
    """The shim's events, in order (only this test's listener is kept)."""
    seen: list[tuple[str, dict[str, Any]]] = []
    events._listeners.append(lambda event, **data: seen.append((event, data)))
    yield seen
    events._listeners.clear()


def test_handle_scale_loss_unscales_in_place_and_steps() -> None:
    model, optimizer = _model_and_optimizer()
    handle = amp.init()
    x = torch.full((8, 4), 0.25)
    loss = model(x).float().mean()
    with handle.scale_loss(loss, optimizer) as scaled:
        assert float(scaled.detach()) == pytest.approx(float(loss.detach()) * 2.0**16, rel=1e-3)
        scaled.backward()
    # unscaled on exit: the grads are the gradient of the loss itself (the batch mean of x)
    assert model.weight.grad is not None
    assert torch.allclose(model.weight.grad, torch.full((1, 4), 0.25), rtol=1e-3)
    before = model.weight.detach().clone()
    optimizer.step()
    assert not torch.equal(before, model.weight)


def test_handle_overflow_skips_one_step_and_halves(heard: list[tuple[str, dict[str, Any]]]) -> None:
    model, optimizer = _model_and_optimizer()
    handle = amp.init()
    for overflow in (True, False):
        loss = model(torch.full((8, 4), 0.25)).float().mean() * (math.inf if overflow else 1.0)
        optimizer.zero_grad()
        with handle.scale_loss(loss, optimizer) as scaled:
            scaled.backward()
        before = model.weight.detach().clone()
        optimizer.step()
        assert torch.equal(before, model.weight) is overflow
    assert handle._default_scaler().loss_scale() == 2.0**15  # type: ignore[union-attr]
    assert [event for event, _ in heard].count("step_skipped") == 1
    assert [event for event, _ in heard].count("check_overflow") == 2
    skipped = next(data for event, data in heard if event == "step_skipped")
    assert skipped["optimizer"] is optimizer


def test_disabled_handle_passes_the_loss_through_and_steps() -> None:
    model, optimizer = _model_and_optimizer()
    handle = amp.init(enabled=False)
    loss = model(torch.full((8, 4), 0.25)).float().mean()
    wrapped = handle.wrap_optimizer(optimizer)
    with handle.scale_loss(loss, optimizer) as scaled:
        assert scaled is loss
    with wrapped.scale_loss(loss) as scaled:
        assert scaled is loss
        scaled.backward()
    before = model.weight.detach().clone()
    wrapped.step()
    assert not torch.equal(before, model.weight)


def test_wrapper_keeps_a_scaler_per_loss_and_adds_earlier_grads_back() -> None:
    model, optimizer = _model_and_optimizer()
    handle = amp.init()
    wrapped = handle.wrap_optimizer(optimizer, num_loss=2)
    x = torch.full((8, 4), 0.25)
    wrapped.zero_grad()
    with wrapped.scale_loss(model(x).float().mean()) as scaled:
        scaled.backward()
    with wrapped.scale_loss(3 * model(x).float().mean()) as scaled:
        scaled.backward()
    # each loss unscaled by its own scale, then summed: d/dW of mean(Wx) + 3 mean(Wx) is (1 + 3) x 0.25
    assert torch.allclose(model.weight.grad, torch.full((1, 4), 1.0), rtol=1e-3)
    with pytest.raises(RuntimeError, match="wrap_optimizer"):
        with handle.scale_loss(model(x).float().mean(), optimizer):
            pass
    with pytest.raises(AssertionError):  # a third loss in the iteration, as in Apex
        with wrapped.scale_loss(model(x).float().mean()):
            pass


def test_wrapper_skips_when_any_loss_overflowed(heard: list[tuple[str, dict[str, Any]]]) -> None:
    model, optimizer = _model_and_optimizer()
    handle = amp.init()
    wrapped = handle.wrap_optimizer(optimizer, num_loss=2)
    x = torch.full((8, 4), 0.25)
    wrapped.zero_grad()
    with wrapped.scale_loss(model(x).float().mean() * math.inf) as scaled:
        scaled.backward()
    with wrapped.scale_loss(model(x).float().mean()) as scaled:
        scaled.backward()
    before = model.weight.detach().clone()
    assert wrapped.step() is None
    assert torch.equal(before, model.weight)
    assert [s.loss_scale() for s in wrapped._loss_scaler] == [2.0**15, 2.0**16]
    assert [data["optimizer"] for event, data in heard if event == "step_skipped"] == [optimizer]
    # the next iteration steps again
    wrapped.zero_grad()
    for _ in range(2):
        with wrapped.scale_loss(model(x).float().mean()) as scaled:
            scaled.backward()
    wrapped.step()
    assert not torch.equal(before, model.weight)


def test_wrapper_forwards_the_optimizer() -> None:
    _, optimizer = _model_and_optimizer()
    wrapped = amp.init().wrap_optimizer(optimizer)
    assert wrapped.param_groups is optimizer.param_groups
    assert wrapped.state_dict() == optimizer.state_dict()
    with pytest.raises(NotImplementedError):
        wrapped.step(lambda: 0.0)
