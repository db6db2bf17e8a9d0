"""``apex.normalization``: FusedLayerNorm and FusedRMSNorm with Apex's dtype behaviour.

Under ``torch.autocast`` Apex casts input and params to the autocast dtype, so the output is
fp16 (torch's LayerNorm gives fp32 there). Elsewhere it runs the functional form, as Apex's
non-CUDA fallback does. The ``Mixed*`` variants return the params' dtype.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


def _autocast_dtype(tensor: torch.Tensor) -> torch.dtype | None:
    device_type = tensor.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return None


def _rms_norm(x: torch.Tensor, shape: tuple[int, ...], weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    dims = tuple(range(-len(shape), 0))
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(dims, keepdim=True) + eps)
    if weight is None:
        return normed.to(x.dtype)
    if weight.dtype in (torch.float16, torch.bfloat16):
        normed = normed.to(weight.dtype)
    return weight * normed


class FusedLayerNorm(torch.nn.LayerNorm):
    """LayerNorm whose output follows the autocast dtype, as Apex's fused kernel does."""

    def __init__(
        self,
        normalized_shape: Any,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        memory_efficient: bool = False,
    ) -> None:
        super().__init__(normalized_shape, eps=eps, elementwise_affine=elementwise_affine)
        self.memory_efficient = memory_efficient

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        dtype = _autocast_dtype(input)
        if dtype is None:
            return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)
        with torch.autocast(input.device.type, enabled=False):
            weight = self.weight.to(dtype) if self.weight is not None else None
            bias = self.bias.to(dtype) if self.bias is not None else None
            return F.layer_norm(input.to(dtype), self.normalized_shape, weight, bias, self.eps)


class FusedRMSNorm(torch.nn.Module):
    """RMSNorm with Apex's default eps 1e-5 (torch.nn.RMSNorm defaults to finfo.eps)."""

    def __init__(
        self,
        normalized_shape: Any,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        memory_efficient: bool = False,
    ) -> None:
        super().__init__()
        if isinstance(normalized_shape, int):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.memory_efficient = memory_efficient
        if elementwise_affine:
            self.weight = torch.nn.Parameter(torch.ones(self.normalized_shape))
        else:
            self.register_parameter("weight", None)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        dtype = _autocast_dtype(input)
        if dtype is None:
            return _rms_norm(input, self.normalized_shape, self.weight, self.eps)
        with torch.autocast(input.device.type, enabled=False):
            weight = self.weight.to(dtype) if self.weight is not None else None
            return _rms_norm(input.to(dtype), self.normalized_shape, weight, self.eps).to(dtype)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class MixedFusedLayerNorm(FusedLayerNorm):
    """LayerNorm whose output has the params' dtype."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        out = F.layer_norm(
            input.float(),
            self.normalized_shape,
            self.weight.float(),
            self.bias.float(),
            self.eps,
        )
        return out.to(self.weight.dtype)


class MixedFusedRMSNorm(FusedRMSNorm):
    """RMSNorm whose output has the params' dtype."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return _rms_norm(input, self.normalized_shape, self.weight, self.eps).to(self.weight.dtype)
