"""``import apex`` resolves to the shim; fp16_utils, optimizers, parallel, normalization."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest
import torch

from migrate.shim import fp16_utils, normalization, optimizers, parallel

# Public Apex names that training code in the wild imports (module, names).
APEX_NAMES = {
    "apex.amp": [
        "initialize",
        "scale_loss",
        "master_params",
        "state_dict",
        "load_state_dict",
        "disable_casts",
        "init",
        "half_function",
        "float_function",
        "promote_function",
        "register_half_function",
        "register_float_function",
        "register_promote_function",
        "_amp_state",
    ],
    "apex.amp.scaler": ["LossScaler"],
    "apex.fp16_utils": [
        "FP16_Optimizer",
        "network_to_half",
        "BN_convert_float",
        "FP16Model",
        "to_python_float",
        "prep_param_lists",
        "model_grads_to_master_grads",
        "master_params_to_model_params",
        "tofp16",
        "clip_grad_norm",
        "convert_network",
        "LossScaler",
        "DynamicLossScaler",
    ],
    "apex.optimizers": [
        "FusedAdam",
        "FusedSGD",
        "FusedLAMB",
        "FusedNovoGrad",
        "FusedAdagrad",
        "FusedMixedPrecisionLamb",
    ],
    "apex.parallel": [
        "DistributedDataParallel",
        "SyncBatchNorm",
        "convert_syncbn_model",
        "LARC",
        "ReduceOp",
        "create_syncbn_process_group",
        "Reducer",
    ],
    "apex.normalization": [
        "FusedLayerNorm",
        "FusedRMSNorm",
        "MixedFusedLayerNorm",
        "MixedFusedRMSNorm",
    ],
    "apex.parallel.distributed": ["DistributedDataParallel", "Reducer", "flat_dist_call", "flatten", "unflatten"],
    "apex.parallel.LARC": ["LARC"],
    "apex.multi_tensor_apply": ["multi_tensor_applier", "MultiTensorApply"],
    "amp_C": ["multi_tensor_scale", "multi_tensor_axpby", "multi_tensor_l2norm", "multi_tensor_l2norm_mp"],
}


def test_every_public_apex_name_resolves_in_a_fresh_process() -> None:
    lines = [
        "import migrate.shim",
        "migrate.shim.install()",
        "import apex",
        "from apex import amp",
        "import apex.amp as aa",
        "assert aa is amp is apex.amp",
    ]
    for module, names in APEX_NAMES.items():
        lines.append(f"from {module} import {', '.join(names)}")
    lines.append("print('ok')")
    done = subprocess.run(
        [sys.executable, "-c", "\n".join(lines)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_unemulated_apex_module_is_a_clear_import_error() -> None:
    import migrate.shim

    migrate.shim.install()
    with pytest.raises(ModuleNotFoundError, match="shim emulates"):
        importlib.import_module("apex.contrib.xentropy")


def test_shim_does_not_import_the_codemod_side() -> None:
    code = (
        "import sys, migrate.shim, migrate.shim.amp, migrate.shim.record\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('libcst', 'click')\n"
        "       or m.startswith(('migrate.rules', 'migrate.engine', 'migrate.cli'))]\n"
        "assert not bad, bad\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def quadratic_steps(optimizer_factory, steps: int = 5) -> torch.Tensor:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    weight = torch.nn.Parameter(torch.randn(5, 3))
    target = torch.randn(5, 3)
    optimizer = optimizer_factory([weight])
    for _ in range(steps):
        optimizer.zero_grad()
        ((weight - target) ** 2).sum().backward()
        optimizer.step()
    return weight.detach()


def test_fused_adam_default_is_adamw_and_l2_mode_is_adam() -> None:
    fused = quadratic_steps(lambda p: optimizers.FusedAdam(p, lr=0.1, weight_decay=0.3))
    adamw = quadratic_steps(lambda p: torch.optim.AdamW(p, lr=0.1, weight_decay=0.3))
    adam = quadratic_steps(lambda p: torch.optim.Adam(p, lr=0.1, weight_decay=0.3))
    l2 = quadratic_steps(lambda p: optimizers.FusedAdam(p, lr=0.1, weight_decay=0.3, adam_w_mode=False))
    torch.testing.assert_close(fused, adamw)
    torch.testing.assert_close(l2, adam)
    assert not torch.allclose(fused, adam, atol=1e-3)


def test_fused_sgd_and_adagrad_match_torch() -> None:
    torch.testing.assert_close(
        quadratic_steps(lambda p: optimizers.FusedSGD(p, lr=0.05, momentum=0.9, weight_decay=0.1, nesterov=True)),
        quadratic_steps(lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=0.1, nesterov=True)),
    )
    torch.testing.assert_close(
        quadratic_steps(lambda p: optimizers.FusedAdagrad(p, lr=0.1, weight_decay=0.1)),
        quadratic_steps(lambda p: torch.optim.Adagrad(p, lr=0.1, weight_decay=0.1, eps=1e-10)),
    )


def test_fused_adam_rejects_amsgrad_and_zero_grad_takes_no_arguments() -> None:
    with pytest.raises(RuntimeError, match="AMSGrad"):
        optimizers.FusedAdam([torch.nn.Parameter(torch.ones(1))], amsgrad=True)
    optimizer = optimizers.FusedAdam([torch.nn.Parameter(torch.ones(1))])
    with pytest.raises(TypeError):
        optimizer.zero_grad(set_to_none=False)  # type: ignore[call-arg]


def test_fp16_optimizer_skips_on_overflow_and_keeps_fp32_masters() -> None:
    model = fp16_utils.network_to_half(torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2)))
    assert next(iter(model.state_dict())).startswith("1.")
    assert model[1][1].weight.dtype is torch.float32 and model[1][0].weight.dtype is torch.float16
    optimizer = fp16_utils.FP16_Optimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        dynamic_loss_scale=True,
        verbose=False,
    )
    before = model[1][0].weight.detach().clone()
    optimizer.zero_grad()
    optimizer.backward(model(torch.randn(4, 3)).float().sum() * float("inf"))
    optimizer.step()
    assert optimizer.overflow and optimizer.loss_scale == 2.0**15
    assert torch.equal(before, model[1][0].weight)
    assert optimizer.clip_master_grads(1.0) == -1
    optimizer.loss_scale = 256.0
    optimizer.zero_grad()
    optimizer.backward(model(torch.randn(4, 3)).float().pow(2).sum())
    optimizer.step()
    assert not optimizer.overflow and not torch.equal(before, model[1][0].weight)
    assert all(p.dtype is torch.float32 for group in optimizer.param_groups for p in group["params"])


def test_fused_layer_norm_follows_autocast_dtype_and_rms_norm_eps() -> None:
    x = torch.randn(4, 8)
    fused, plain = normalization.FusedLayerNorm(8), torch.nn.LayerNorm(8)
    with torch.autocast("cpu", dtype=torch.float16):
        assert fused(x).dtype is torch.float16
        assert plain(x).dtype is torch.float32
    torch.testing.assert_close(fused(x), plain(x))
    rms = normalization.FusedRMSNorm(8)
    assert rms.eps == 1e-5
    torch.testing.assert_close(rms(x), torch.nn.RMSNorm(8, eps=1e-5)(x))


def test_parallel_wrappers_without_a_process_group() -> None:
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.BatchNorm2d(4), torch.nn.InstanceNorm2d(4))
    model[1].running_mean.fill_(0.5)
    converted = parallel.convert_syncbn_model(model)
    assert isinstance(converted[1], parallel.SyncBatchNorm)
    assert not isinstance(converted[2], parallel.SyncBatchNorm)
    assert torch.equal(converted[1].running_mean, torch.full((4,), 0.5))
    wrapped = parallel.DistributedDataParallel(converted)
    assert all(key.startswith("module.") for key in wrapped.state_dict())
    x = torch.randn(2, 3, 5, 5)
    torch.testing.assert_close(wrapped(x), converted(x))
