"""``amp_C``: Apex's multi-tensor CUDA kernels, in torch ops, for CUDA and CPU tensors.

Each kernel follows Apex's csrc: the arithmetic is done in float32 and rounded once into
the output; ``noop_flag`` (an int tensor) is set to 1 when an input is not finite (for the
norms: when a sum of squares is not finite), and never reset here. Norms come back as
float32 tensors of shape ``[1]`` plus the per-tensor norms (``[len(tensors)]``, or empty
when not asked for). The optimizer kernels are not emulated: the shim's
``apex.optimizers`` implement those updates directly.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

Tensors = Sequence[torch.Tensor]


def _flag_if_not_finite(noop_flag: torch.Tensor, tensors: Tensors) -> None:
    if tensors and not all(bool(torch.isfinite(t).all()) for t in tensors):
        noop_flag.fill_(1)


@torch.no_grad()
def multi_tensor_scale(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: Sequence[Tensors], scale: float) -> None:
    """``out = float(in) * scale`` for each pair of ``[inputs, outputs]``."""
    inputs, outputs = tensor_lists
    _flag_if_not_finite(noop_flag, inputs)
    factor = torch.tensor(scale, dtype=torch.float32).item()  # Apex receives a C float
    for source, target in zip(inputs, outputs):
        target.copy_(source.float() * factor)


@torch.no_grad()
def multi_tensor_axpby(
    chunk_size: int,
    noop_flag: torch.Tensor,
    tensor_lists: Sequence[Tensors],
    a: float,
    b: float,
    arg_to_check: int,
) -> None:
    """``out = a * float(x) + b * float(y)``; the flag checks x (0), y (1) or both (-1)."""
    xs, ys, outs = tensor_lists
    checked = {0: [xs], 1: [ys], -1: [xs, ys]}.get(arg_to_check, [])
    for tensors in checked:
        _flag_if_not_finite(noop_flag, tensors)
    a32 = torch.tensor(a, dtype=torch.float32).item()
    b32 = torch.tensor(b, dtype=torch.float32).item()
    for x, y, out in zip(xs, ys, outs):
        out.copy_(a32 * x.float() + b32 * y.float())


def _norms(tensors: Tensors, scale: torch.Tensor | float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    per_tensor = torch.stack([torch.linalg.vector_norm(t.float() * scale) for t in tensors])
    return torch.linalg.vector_norm(per_tensor).reshape(1), per_tensor


@torch.no_grad()
def multi_tensor_l2norm(
    chunk_size: int, noop_flag: torch.Tensor, tensor_lists: Sequence[Tensors], per_tensor: bool | None = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """The float32 L2 norm of all tensors together, and per tensor when asked."""
    (tensors,) = tensor_lists
    total, each = _norms(tensors)
    if not bool(torch.isfinite(total).all()):
        noop_flag.fill_(1)
    return total, each if per_tensor else total.new_empty(0)


multi_tensor_l2norm_mp = multi_tensor_l2norm


@torch.no_grad()
def multi_tensor_unscale_l2norm(
    chunk_size: int,
    noop_flag: torch.Tensor,
    tensor_lists: Sequence[Tensors],
    inv_scale: torch.Tensor,
    per_tensor: bool | None = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The norm of ``tensors * inv_scale``; the tensors are left as they are."""
    (tensors,) = tensor_lists
    total, each = _norms(tensors, inv_scale.float())
    if not bool(torch.isfinite(total).all()):
        noop_flag.fill_(1)
    return total, each if per_tensor else total.new_empty(0)


@torch.no_grad()
def multi_tensor_l2norm_scale(
    chunk_size: int,
    noop_flag: torch.Tensor,
    tensor_lists: Sequence[Tensors],
    scale: float,
    per_tensor: bool | None = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``out = float(in) * scale``, returning the norm of the inputs."""
    inputs, outputs = tensor_lists
    total, each = _norms(inputs)
    if not bool(torch.isfinite(total).all()):
        noop_flag.fill_(1)
    factor = torch.tensor(scale, dtype=torch.float32).item()
    for source, target in zip(inputs, outputs):
        target.copy_(source.float() * factor)
    return total, each if per_tensor else total.new_empty(0)


def __getattr__(name: str) -> object:
    raise AttributeError(
        f"amp_C.{name} is not emulated by the ampmigrate shim (its optimizer kernels are covered by "
        "apex.optimizers); use torch.optim or torch._foreach_* ops"
    )
