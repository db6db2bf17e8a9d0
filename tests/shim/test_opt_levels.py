"""What each opt_level does to the model, the optimizer and the math (on the CPU)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from migrate.shim import amp, casting


def net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 16),
        torch.nn.BatchNorm1d(16),
        torch.nn.ReLU(),
        torch.nn.Linear(16, 2),
    )


def batches(count: int = 5) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 6, generator=generator), torch.randn(8, 2, generator=generator)) for _ in range(count)]


def train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, use_amp: bool) -> list[float]:
    losses = []
    for x, y in batches():
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        if use_amp:
            with amp.scale_loss(loss, optimizer) as scaled:
                scaled.backward()
        else:
            loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def test_o0_reproduces_fp32_training_bit_for_bit() -> None:
    reference_model = net()
    reference = train(
        reference_model,
        torch.optim.SGD(reference_model.parameters(), lr=0.1, momentum=0.9),
        False,
    )
    model = net()
    model, optimizer = amp.initialize(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        opt_level="O0",
        verbosity=0,
    )
    assert train(model, optimizer, True) == reference
    for ours, theirs in zip(model.parameters(), reference_model.parameters()):
        assert torch.equal(ours, theirs)


def test_o2_fp16_model_fp32_batchnorm_and_fp32_masters() -> None:
    model = net()
    model, optimizer = amp.initialize(model, torch.optim.SGD(model.parameters(), lr=0.1), opt_level="O2", verbosity=0)
    assert model[0].weight.dtype is torch.float16 and model[3].weight.dtype is torch.float16
    assert model[1].weight.dtype is torch.float32 and model[1].running_mean.dtype is torch.float32
    x, y = batches(1)[0]
    out = model(x.double())  # any floating input is cast to fp16, the output back to fp32
    assert out.dtype is torch.float32
    with amp.scale_loss(F.mse_loss(out, y), optimizer) as scaled:
        scaled.backward()
    optimizer.step()
    masters = list(amp.master_params(optimizer))
    assert all(p.dtype is torch.float32 for p in masters)
    assert not any(p is model[0].weight for p in masters)
    linear_master = next(p for p in masters if p.shape == model[0].weight.shape)
    assert torch.equal(model[0].weight, linear_master.half())
    # Checkpoints hold fp32 tensors, as with Apex's state_dict hook.
    assert all(v.dtype is not torch.float16 for v in model.state_dict().values())


def test_o2_zero_grad_takes_no_arguments_and_skip_drops_master_grads() -> None:
    model = net()
    model, optimizer = amp.initialize(model, torch.optim.SGD(model.parameters(), lr=0.1), opt_level="O2", verbosity=0)
    with pytest.raises(TypeError):
        optimizer.zero_grad(set_to_none=True)
    x, y = batches(1)[0]
    before = [p.detach().clone() for p in amp.master_params(optimizer)]
    with amp.scale_loss(F.mse_loss(model(x), y) * float("inf"), optimizer) as scaled:
        scaled.backward()
    optimizer.step()  # the one-shot skip
    assert all(torch.equal(a, b) for a, b in zip(before, amp.master_params(optimizer)))
    assert all(p.grad is None for p in optimizer._amp_stash.all_fp32_from_fp16_params)


def test_o3_is_pure_fp16() -> None:
    model = net()
    model, _ = amp.initialize(model, torch.optim.SGD(model.parameters(), lr=0.1), opt_level="O3", verbosity=0)
    assert {p.dtype for p in model.parameters()} == {torch.float16}
    assert model[1].running_var.dtype is torch.float16


def o1_model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = net()
    return amp.initialize(model, torch.optim.SGD(model.parameters(), lr=0.1), opt_level="O1", verbosity=0)


def test_o1_casts_by_apex_lists() -> None:
    model, _ = o1_model()
    assert model[0].weight.dtype is torch.float32  # O1 leaves the model alone
    x = torch.randn(4, 6)
    hidden = F.linear(x, model[0].weight, model[0].bias)
    assert hidden.dtype is torch.float16  # FP16 list
    assert F.softmax(hidden, dim=1).dtype is torch.float32  # FP32 list
    assert torch.exp(hidden).dtype is torch.float32
    assert (hidden + x[:, :1].expand(4, 16)).dtype is torch.float32  # promote on a mix
    assert torch.cat([hidden, torch.zeros(4, 16)]).dtype is torch.float32  # sequence promote
    assert F.relu(hidden).dtype is torch.float16  # on no list: runs in its input's dtype
    assert torch.mm(x, x.t()).dtype is torch.float16
    assert (x.double() @ x.t().double()).dtype is torch.float16  # Apex casts fp64 too


def test_o1_refusals_and_disable_casts() -> None:
    o1_model()
    half = torch.rand(3, dtype=torch.float16)
    with pytest.raises(NotImplementedError):
        half.exp_()
    with pytest.raises(NotImplementedError, match="BCEWithLogitsLoss"):
        F.binary_cross_entropy(half, torch.ones(3, dtype=torch.float16))
    with amp.disable_casts():
        assert F.linear(torch.randn(2, 3), torch.randn(4, 3)).dtype is torch.float32


def test_o1_name_bound_before_initialize_is_not_patched() -> None:
    early_linear = F.linear
    o1_model()
    assert early_linear(torch.randn(2, 3), torch.randn(4, 3)).dtype is torch.float32
    assert F.linear(torch.randn(2, 3), torch.randn(4, 3)).dtype is torch.float16


def test_o1_weight_cast_cache_lives_until_scale_loss_exit() -> None:
    model, optimizer = o1_model()
    x, y = batches(1)[0]
    model(x)
    handle = amp._amp_state.handle
    cached = handle.cache.get(model[0].weight)
    assert cached is not None and cached.dtype is torch.float16
    model(x)
    assert handle.cache[model[0].weight] is cached  # reused, not re-cast
    with amp.scale_loss(F.mse_loss(model(x), y), optimizer) as scaled:
        scaled.backward()
    assert handle.cache == {}


def test_registration_and_decorators() -> None:
    class Ops:
        @staticmethod
        def gelu(value: torch.Tensor) -> torch.Tensor:
            return value * 1

    amp.register_float_function(torch, "relu")
    amp.register_half_function(Ops, "gelu")
    with pytest.raises(ValueError):
        amp.register_half_function(torch, "no_such_function")

    @amp.half_function
    def decorated(value: torch.Tensor) -> torch.Tensor:
        return value

    assert decorated(torch.ones(2)).dtype is torch.float32  # no O1 handle yet: unchanged
    o1_model()
    assert torch.relu(torch.ones(2, dtype=torch.float16)).dtype is torch.float32
    assert Ops.gelu(torch.ones(2)).dtype is torch.float16
    assert decorated(torch.ones(2)).dtype is torch.float16


def test_o1_patch_is_undone_by_reset() -> None:
    o1_model()
    casting.reset()
    assert F.linear(torch.randn(2, 3), torch.randn(4, 3)).dtype is torch.float32
    assert not hasattr(torch.Tensor.__add__, "__wrapped__")


def test_o1_runs_rnns_in_fp16_and_grads_reach_fp32_weights() -> None:
    lstm, cell = torch.nn.LSTM(4, 8), torch.nn.GRUCell(4, 8)
    o1_model()
    out, (hidden, _) = lstm(torch.randn(5, 2, 4))
    assert out.dtype is torch.float16 and hidden.dtype is torch.float16
    assert cell(torch.randn(2, 4)).dtype is torch.float16
    out.float().sum().backward()
    assert lstm.weight_ih_l0.dtype is torch.float32
    assert lstm.weight_ih_l0.grad is not None and lstm.weight_ih_l0.grad.dtype is torch.float32
