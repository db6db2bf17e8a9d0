"""Apex's opt_level presets (O0-O3) and the validation of their overrides."""

from __future__ import annotations

from typing import Any

import torch

#: The preset table of ``apex.amp.frontend`` (O0..O3), as documented by Apex.
OPT_LEVEL_PRESETS: dict[str, dict[str, Any]] = {
    "O0": {
        "cast_model_type": torch.float32,
        "patch_torch_functions": False,
        "keep_batchnorm_fp32": None,
        "master_weights": False,
        "loss_scale": 1.0,
    },
    "O1": {
        "cast_model_type": None,
        "patch_torch_functions": True,
        "keep_batchnorm_fp32": None,
        "master_weights": None,
        "loss_scale": "dynamic",
    },
    "O2": {
        "cast_model_type": torch.float16,
        "patch_torch_functions": False,
        "keep_batchnorm_fp32": True,
        "master_weights": True,
        "loss_scale": "dynamic",
    },
    "O3": {
        "cast_model_type": torch.float16,
        "patch_torch_functions": False,
        "keep_batchnorm_fp32": False,
        "master_weights": False,
        "loss_scale": 1.0,
    },
}

OPT_LEVEL_BRIEF = {  # one line per level, for the options printout
    "O0": "FP32 everywhere",
    "O1": "per-function casts (Apex lists), FP32 weights",
    "O2": "FP16 model except affine BatchNorm, FP32 master weights",
    "O3": "FP16 everywhere",
}

#: Order in which ``amp.initialize`` applies keyword overrides (Apex's order).
OVERRIDE_ORDER = (
    "enabled",
    "opt_level",
    "cast_model_type",
    "patch_torch_functions",
    "keep_batchnorm_fp32",
    "master_weights",
    "loss_scale",
)


class Properties:
    """The option set ``amp.initialize`` builds; assignments are validated as Apex does."""

    enabled: bool
    opt_level: str | None
    cast_model_type: torch.dtype | None
    patch_torch_functions: bool
    keep_batchnorm_fp32: bool | None
    master_weights: bool | None
    loss_scale: float | str

    def __init__(self) -> None:
        defaults: dict[str, Any] = {
            "enabled": False,
            "opt_level": None,
            "cast_model_type": None,
            "patch_torch_functions": False,
            "keep_batchnorm_fp32": None,
            "master_weights": None,
            "loss_scale": 1.0,
        }
        # Bypass validation for the bare defaults, as Apex stores them directly.
        self.__dict__["options"] = defaults

    def __getattr__(self, name: str) -> Any:
        options = self.__dict__["options"]
        if name in options:
            return options[name]
        raise AttributeError(f"'Properties' object has no attribute '{name}'")

    def __setattr__(self, name: str, value: Any) -> None:
        options = self.__dict__["options"]
        if name not in options:
            super().__setattr__(name, value)
            return
        opt_level = options["opt_level"]
        if name == "cast_model_type":
            if opt_level == "O1" and value not in (None, False, torch.float32):
                raise RuntimeError(
                    f"opt_level O1 keeps the model in FP32 and casts around functions; "
                    f"cast_model_type={value} needs opt_level O2 or O3"
                )
        elif name == "patch_torch_functions":
            if opt_level != "O1" and value:
                raise RuntimeError("patch_torch_functions=True is only valid with opt_level O1")
        elif name == "keep_batchnorm_fp32":
            if opt_level == "O1" and value is not None:
                raise RuntimeError(
                    f"opt_level O1 already runs batchnorm in FP32; keep_batchnorm_fp32 must "
                    f"be None with O1, got {value}"
                )
            if value == "False":
                value = False
            elif value == "True":
                value = True
            elif value not in (True, False, None):
                raise RuntimeError(f"keep_batchnorm_fp32 takes True, False, 'True', 'False' or None, " f"got {value!r}")
        elif name == "master_weights":
            if opt_level == "O1" and value is not None:
                raise RuntimeError(
                    "master_weights has no meaning with opt_level O1: the model weights are " "already FP32"
                )
        elif name == "loss_scale":
            value = value if value == "dynamic" else float(value)
        options[name] = value

    def apply_preset(self, opt_level: str) -> None:
        """Set ``opt_level`` and its preset values (the overrides come afterwards)."""
        if opt_level not in OPT_LEVEL_PRESETS:
            raise RuntimeError(
                f"unknown opt_level {opt_level!r}: expected 'O0', 'O1', 'O2' or 'O3' " f"(the letter O, not zero)"
            )
        self.enabled = True
        self.opt_level = opt_level
        for name, value in OPT_LEVEL_PRESETS[opt_level].items():
            setattr(self, name, value)

    def as_dict(self) -> dict[str, Any]:
        """A copy of the current options."""
        return dict(self.__dict__["options"])
