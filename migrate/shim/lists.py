"""Apex O1's cast lists (``apex/amp/lists``), by module.

Apex chose these per function at the Python API level; they differ from torch.autocast's
dispatcher lists (see the spec, section 10). ``addbmm``/``baddbmm``/``bmm`` are on the FP16 list,
as Apex put them on any CUDA >= 9.1.
"""

from __future__ import annotations

import torch
import torch.nn.functional

TORCH_FP16 = (
    "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
    "conv_tbc", "prelu", "addmm", "addmv", "addr", "matmul", "mm", "mv",
    "addbmm", "baddbmm", "bmm",
)  # fmt: skip
TORCH_FP32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "reciprocal",
    "rsqrt", "sinh", "tan", "pow", "cumprod", "cumsum", "dist", "norm", "prod", "std", "sum",
    "var", "renorm",
)  # fmt: skip
TORCH_PROMOTE = (
    "addcdiv", "addcmul", "atan2", "cross", "bilinear", "dot", "add", "div", "mul",
    "eq", "equal", "ge", "gt", "le", "lt", "ne",
)  # fmt: skip
TORCH_SEQUENCE_PROMOTE = ("cat", "stack")

FUNCTIONAL_FP16 = (
    "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
    "conv_tbc", "linear",
)  # fmt: skip
FUNCTIONAL_FP32 = (
    "interpolate", "grid_sample", "softplus", "softmin", "log_softmax", "softmax", "gelu",
    "layer_norm", "group_norm", "local_response_norm", "normalize", "cosine_similarity",
    "poisson_nll_loss", "cosine_embedding_loss", "cross_entropy", "hinge_embedding_loss",
    "kl_div", "l1_loss", "mse_loss", "margin_ranking_loss", "multilabel_margin_loss",
    "multilabel_soft_margin_loss", "multi_margin_loss", "nll_loss",
    "binary_cross_entropy_with_logits", "smooth_l1_loss", "soft_margin_loss",
    "triplet_margin_loss", "ctc_loss",
)  # fmt: skip
#: Refused with fp16 arguments (``allow_banned=False``), cast to fp32 otherwise.
FUNCTIONAL_BANNED = ("binary_cross_entropy",)

_TENSOR_OWN_FP16 = ("__matmul__",)
_TENSOR_OWN_FP32 = ("__ipow__", "__pow__", "__rpow__", "cpu")
_TENSOR_OWN_PROMOTE = (
    "__add__", "__div__", "__eq__", "__ge__", "__gt__", "__iadd__", "__idiv__", "__imul__",
    "__isub__", "__itruediv__", "__le__", "__lt__", "__mul__", "__ne__", "__radd__",
    "__rdiv__", "__rmul__", "__rsub__", "__rtruediv__", "__sub__", "__truediv__",
)  # fmt: skip


def _also_on_tensor(names: tuple[str, ...]) -> tuple[str, ...]:
    # Apex adds every torch-list name that is also a Tensor method to the Tensor lists.
    return tuple(name for name in names if hasattr(torch.Tensor, name))


TENSOR_FP16 = _TENSOR_OWN_FP16 + _also_on_tensor(TORCH_FP16)
TENSOR_FP32 = _TENSOR_OWN_FP32 + _also_on_tensor(TORCH_FP32)
TENSOR_PROMOTE = _TENSOR_OWN_PROMOTE + _also_on_tensor(TORCH_PROMOTE)

#: Recurrent kernels reached through ``torch._VF`` (what nn.LSTM/GRU/RNN and the cells call).
#: Apex redirected them so that input, hidden state and weights run in fp16.
VF_FP16 = (
    "lstm", "gru", "rnn_tanh", "rnn_relu", "lstm_cell", "gru_cell", "rnn_tanh_cell",
    "rnn_relu_cell",
)  # fmt: skip
