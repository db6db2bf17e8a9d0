"""``amp.initialize``: validate, cast the models, patch forward and the optimizers."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from migrate.shim import casting
from migrate.shim.amp_state import _amp_state, maybe_print
from migrate.shim.optimizer_patch import process_optimizer
from migrate.shim.properties import OPT_LEVEL_BRIEF, OVERRIDE_ORDER, Properties
from migrate.shim.scaler import LossScaler

try:  # numpy arrays pass through the input cast untouched, as in Apex.
    import numpy

    _NDARRAY: tuple[type, ...] = (numpy.ndarray,)
except ImportError:  # pragma: no cover - numpy ships with torch wheels
    _NDARRAY = ()


def apply_to_values(value: Any, fn: Callable[[Any], Any]) -> Any:
    """Apex's ``applier``: recurse through containers, call ``fn`` on tensors and ``.to`` owners.

    Mappings come back as plain dicts and other iterables as ``type(value)(generator)``, which
    is what Apex did (namedtuples break, generators are consumed).
    """
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, str) or (_NDARRAY and isinstance(value, _NDARRAY)):
        return value
    if hasattr(value, "to"):
        return fn(value)
    if isinstance(value, Mapping):
        return {apply_to_values(k, fn): apply_to_values(v, fn) for k, v in value.items()}
    if isinstance(value, Iterable):
        return type(value)(apply_to_values(v, fn) for v in value)  # type: ignore[call-arg]
    return value


def _to_dtype(dtype: torch.dtype, value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    return value.to(dtype)


def _is_affine_batchnorm(module: torch.nn.Module) -> bool:
    return isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and bool(module.affine)


def convert_module(module: torch.nn.Module, dtype: torch.dtype) -> None:
    """Cast this module's own floating params (and grads) and buffers to ``dtype``."""
    for param in module.parameters(recurse=False):
        if param is not None and param.is_floating_point():
            param.data = param.data.to(dtype)
            if param.grad is not None:
                param.grad.data = param.grad.data.to(dtype)
    for buffer in module.buffers(recurse=False):
        if buffer is not None and buffer.is_floating_point():
            buffer.data = buffer.data.to(dtype)


def convert_network(network: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """Cast every module except affine BatchNorm to ``dtype`` (``keep_batchnorm_fp32``)."""
    for module in network.modules():
        if _is_affine_batchnorm(module):
            continue
        convert_module(module, dtype)
        if isinstance(module, torch.nn.RNNBase):
            module.flatten_parameters()
    return network


def _fp32_state_dict_hook(
    module: torch.nn.Module,
    state_dict: dict[str, Any],
    prefix: str,
    local_metadata: Any,
) -> None:
    # Checkpoints from O2/O3 hold fp32 tensors (with fp16-rounded values), as with Apex.
    for key, value in list(state_dict.items()):
        if isinstance(value, torch.Tensor) and value.dtype is torch.float16:
            state_dict[key] = value.float()


def _patch_forward(model: torch.nn.Module, input_dtype: torch.dtype | None, output_dtype: torch.dtype) -> None:
    original_forward = model.forward
    cast_input = functools.partial(_to_dtype, input_dtype) if input_dtype else None
    cast_output = functools.partial(_to_dtype, output_dtype)

    def forward(*args: Any, **kwargs: Any) -> Any:
        if cast_input is not None:
            args = apply_to_values(args, cast_input)
            kwargs = apply_to_values(kwargs, cast_input)
        return apply_to_values(original_forward(*args, **kwargs), cast_output)

    # An instance attribute holding a plain function, as Apex installs it.
    model.forward = forward  # type: ignore[method-assign]


_PARALLEL_WRAPPERS: tuple[type, ...] = (
    torch.nn.parallel.DistributedDataParallel,
    torch.nn.DataParallel,
)


def _check_models(models: list[torch.nn.Module]) -> None:
    from migrate.shim import parallel

    for model in models:
        if isinstance(model, (*_PARALLEL_WRAPPERS, parallel.DistributedDataParallel)):
            raise RuntimeError(
                f"amp.initialize got a model wrapped in {type(model).__name__}: wrap models "
                "in parallel wrappers after amp.initialize, not before"
            )


def _check_params_fp32(models: list[torch.nn.Module]) -> None:
    if _amp_state.allow_incoming_model_not_fp32:
        return
    for model in models:
        for kind, named in (
            ("param", model.named_parameters()),
            ("buffer", model.named_buffers()),
        ):
            for name, tensor in named:
                if tensor.is_floating_point() and tensor.dtype is not torch.float32:
                    message = (
                        f"{kind} {name} is {tensor.dtype}, expected float32: amp.initialize "
                        "takes an FP32 model, do not call .half() on it yourself"
                    )
                    if not _amp_state.hard_override:
                        raise RuntimeError(message)
                    maybe_print("Warning: " + message)


def _check_optimizers(optimizers: list[Any]) -> None:
    from migrate.shim import fp16_utils

    for optimizer in optimizers:
        if isinstance(optimizer, fp16_utils.FP16_Optimizer):
            raise RuntimeError(
                "amp.initialize got an FP16_Optimizer: pass the bare optimizer, amp manages " "master weights itself"
            )


def _is_optimizer(value: Any) -> bool:
    from migrate.shim import parallel

    return isinstance(value, (torch.optim.Optimizer, parallel.LARC))


def _print_options(properties: Properties) -> None:
    if _amp_state.verbosity <= 0:
        return
    level = properties.opt_level
    print(f"Selected optimization level {level}: {OPT_LEVEL_BRIEF.get(level or '', '')}")
    print("Processing user overrides (additional kwargs that are not None)...")
    print("After processing overrides, optimization options are:")
    for name, value in properties.as_dict().items():
        if name != "enabled":
            print(f"{name:<22}: {value}")


def initialize(
    models: Any,
    optimizers: Any = None,
    enabled: bool = True,
    opt_level: str = "O1",
    cast_model_type: torch.dtype | None = None,
    patch_torch_functions: bool | None = None,
    keep_batchnorm_fp32: bool | str | None = None,
    master_weights: bool | None = None,
    loss_scale: float | str | None = None,
    cast_model_outputs: torch.dtype | None = None,
    num_losses: int = 1,
    verbosity: int = 1,
    min_loss_scale: float | None = None,
    max_loss_scale: float = 2.0**24,
) -> Any:
    """Apex's ``amp.initialize``: mutates and returns the same models and optimizers."""
    _amp_state.opt_properties = Properties()
    _amp_state.verbosity = verbosity
    if not enabled:
        return models if optimizers is None else (models, optimizers)
    if not torch.backends.cudnn.enabled:
        raise RuntimeError("amp needs torch.backends.cudnn.enabled = True")

    properties = _amp_state.opt_properties
    properties.apply_preset(opt_level)
    overrides = {
        "enabled": enabled,
        "opt_level": opt_level,
        "cast_model_type": cast_model_type,
        "patch_torch_functions": patch_torch_functions,
        "keep_batchnorm_fp32": keep_batchnorm_fp32,
        "master_weights": master_weights,
        "loss_scale": loss_scale,
    }
    for name in OVERRIDE_ORDER:
        if overrides[name] is not None:
            setattr(properties, name, overrides[name])
    _print_options(properties)
    _amp_state.min_loss_scale = min_loss_scale
    _amp_state.max_loss_scale = max_loss_scale

    if optimizers is None:
        optimizer_list: list[Any] = []
        optimizers_was_list = False
    elif isinstance(optimizers, list):
        optimizer_list = optimizers
        optimizers_was_list = True
    elif _is_optimizer(optimizers):
        optimizer_list = [optimizers]
        optimizers_was_list = False
    else:
        _check_optimizers([optimizers])  # an FP16_Optimizer gets its own explanation
        raise TypeError("optimizers must be an optimizer or a list of optimizers")

    if isinstance(models, torch.nn.Module):
        model_list = [models]
        models_was_list = False
    elif isinstance(models, list):
        model_list = models
        models_was_list = True
    else:
        raise TypeError("models must be an nn.Module or a list of nn.Modules")

    _check_models(model_list)
    _check_params_fp32(model_list)
    _check_optimizers(optimizer_list)

    if properties.cast_model_type:
        for model in model_list:
            if properties.keep_batchnorm_fp32:
                convert_network(model, properties.cast_model_type)
            else:
                model.to(properties.cast_model_type)
            _patch_forward(model, properties.cast_model_type, cast_model_outputs or torch.float32)
            for module in model.modules():
                module._register_state_dict_hook(_fp32_state_dict_hook)
        for optimizer in optimizer_list:
            optimizer.load_state_dict(optimizer.state_dict())
    elif cast_model_outputs is not None:
        for model in model_list:
            _patch_forward(model, None, cast_model_outputs)

    for optimizer in optimizer_list:
        process_optimizer(optimizer, properties)

    if properties.patch_torch_functions:
        previous = getattr(_amp_state, "handle", None)
        if previous is not None:
            # A second initialize (a resume that rebuilds model and optimizer) re-patches from
            # a clean torch instead of stacking a second layer of wrappers.
            previous._deactivate()
        _amp_state.handle = casting.init(loss_scale=properties.loss_scale, verbose=_amp_state.verbosity == 2)

    _amp_state.loss_scalers = [
        LossScaler(
            properties.loss_scale,
            min_loss_scale=min_loss_scale,
            max_loss_scale=max_loss_scale,
        )
        for _ in range(num_losses)
    ]

    if optimizers is None:
        return model_list if models_was_list else model_list[0]
    returned_models = model_list if models_was_list else model_list[0]
    returned_optimizers = optimizer_list if optimizers_was_list else optimizer_list[0]
    return returned_models, returned_optimizers
