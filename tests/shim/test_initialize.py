"""amp.initialize: argument checks, the property table, return shapes, enabled=False."""

from __future__ import annotations

import pytest
import torch

from migrate.shim import amp, parallel
from migrate.shim.amp_state import _amp_state
from migrate.shim.fp16_utils import FP16_Optimizer


def model_and_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


@pytest.mark.parametrize(
    ("level", "expected"),
    [
        ("O0", (torch.float32, False, None, False, 1.0)),
        ("O1", (None, True, None, None, "dynamic")),
        ("O2", (torch.float16, False, True, True, "dynamic")),
        ("O3", (torch.float16, False, False, False, 1.0)),
    ],
)
def test_property_table(level: str, expected: tuple[object, ...]) -> None:
    amp.initialize(*model_and_optimizer(), opt_level=level, verbosity=0)
    properties = _amp_state.opt_properties
    observed = (
        properties.cast_model_type,
        properties.patch_torch_functions,
        properties.keep_batchnorm_fp32,
        properties.master_weights,
        properties.loss_scale,
    )
    assert observed == expected


def test_overrides_are_applied_and_converted() -> None:
    amp.initialize(
        *model_and_optimizer(),
        opt_level="O2",
        keep_batchnorm_fp32="False",
        loss_scale="128",
        verbosity=0,
    )
    assert _amp_state.opt_properties.keep_batchnorm_fp32 is False
    assert _amp_state.opt_properties.loss_scale == 128.0
    assert not _amp_state.loss_scalers[0].dynamic


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"opt_level": "o1"}, "unknown opt_level"),
        ({"opt_level": "01"}, "the letter O"),
        ({"opt_level": "O1", "cast_model_type": torch.float16}, "O2 or O3"),
        ({"opt_level": "O1", "keep_batchnorm_fp32": True}, "keep_batchnorm_fp32"),
        ({"opt_level": "O1", "master_weights": True}, "master_weights"),
        (
            {"opt_level": "O2", "patch_torch_functions": True},
            "only valid with opt_level O1",
        ),
    ],
)
def test_invalid_options_raise(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(RuntimeError, match=message):
        amp.initialize(*model_and_optimizer(), verbosity=0, **kwargs)


def test_returns_the_same_objects_list_in_list_out() -> None:
    (m1, o1), (m2, o2) = model_and_optimizer(), model_and_optimizer()
    assert amp.initialize(m1, o1, opt_level="O0", verbosity=0) == (m1, o1)
    models, optimizers = amp.initialize([m2], [o2], opt_level="O0", verbosity=0)
    assert models == [m2] and models[0] is m2 and optimizers[0] is o2
    m3, _ = model_and_optimizer()
    assert amp.initialize(m3, opt_level="O0", verbosity=0) is m3
    m4, _ = model_and_optimizer()
    assert amp.initialize(m4, [], opt_level="O0", verbosity=0) == (m4, [])


def test_tuples_are_rejected() -> None:
    model, optimizer = model_and_optimizer()
    with pytest.raises(TypeError, match="models"):
        amp.initialize((model,), optimizer, verbosity=0)
    with pytest.raises(TypeError, match="optimizers"):
        amp.initialize(model, (optimizer,), verbosity=0)


def test_enabled_false_is_a_no_op() -> None:
    model, optimizer = model_and_optimizer()
    weight = model[0].weight
    assert amp.initialize(model, optimizer, enabled=False, opt_level="O2") == (
        model,
        optimizer,
    )
    assert model[0].weight is weight and weight.dtype is torch.float32
    loss = model(torch.randn(3, 4)).sum()
    with amp.scale_loss(loss, optimizer) as scaled:
        assert scaled is loss


def test_scale_loss_before_initialize_raises() -> None:
    _, optimizer = model_and_optimizer()
    with (
        pytest.raises(RuntimeError, match="before amp.initialize"),
        amp.scale_loss(torch.ones(()), optimizer),
    ):
        pass


def test_half_model_and_wrapped_model_and_fp16_optimizer_are_refused() -> None:
    model, optimizer = model_and_optimizer()
    with pytest.raises(RuntimeError, match="do not call .half"):
        amp.initialize(model.half(), optimizer, verbosity=0)
    model, optimizer = model_and_optimizer()
    with pytest.raises(RuntimeError, match="after amp.initialize"):
        amp.initialize(parallel.DistributedDataParallel(model), optimizer, verbosity=0)
    model, optimizer = model_and_optimizer()
    with pytest.raises(RuntimeError, match="FP16_Optimizer"):
        amp.initialize(model, FP16_Optimizer(optimizer), verbosity=0)


def test_an_optimizer_goes_through_once() -> None:
    model, optimizer = model_and_optimizer()
    amp.initialize(model, optimizer, opt_level="O0", verbosity=0)
    with pytest.raises(RuntimeError, match="only once"):
        amp.initialize(model, optimizer, opt_level="O0", verbosity=0)


def test_master_params_are_the_optimizer_params() -> None:
    model, optimizer = model_and_optimizer()
    amp.initialize(model, optimizer, opt_level="O0", verbosity=0)
    assert list(amp.master_params(optimizer)) == list(model.parameters())
