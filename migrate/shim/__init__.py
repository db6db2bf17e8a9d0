"""Runtime emulation of NVIDIA Apex mixed precision on plain PyTorch.

``install()`` makes ``import apex`` (``apex.amp``, ``apex.fp16_utils``, ``apex.optimizers``,
``apex.parallel``, ``apex.normalization``, ``apex.multi_tensor_apply`` and their usual
submodules) and Apex's ``amp_C`` kernel module resolve to this package,
so a legacy Apex training script runs unmodified, on CUDA or, in float16, on the CPU.
``cuda_on_cpu`` maps CUDA-only code to the CPU; ``python -m migrate.shim`` runs a script with
both. Imports torch; never libcst, click or the codemod's rules.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType

__all__ = ["APEX_MODULES", "install", "is_installed"]

#: Apex module name -> the shim module that stands in for it.
APEX_MODULES = {
    "apex": "migrate.shim.apex_root",
    "apex.amp": "migrate.shim.amp",
    "apex.amp.frontend": "migrate.shim.amp",
    "apex.amp.handle": "migrate.shim.amp",
    "apex.amp.amp": "migrate.shim.casting",
    "apex.amp._amp_state": "migrate.shim.amp_state",
    "apex.amp.scaler": "migrate.shim.scaler",
    "apex.amp._initialize": "migrate.shim.initialize",
    "apex.amp._process_optimizer": "migrate.shim.optimizer_patch",
    "apex.fp16_utils": "migrate.shim.fp16_utils",
    "apex.fp16_utils.fp16_optimizer": "migrate.shim.fp16_utils",
    "apex.fp16_utils.fp16util": "migrate.shim.fp16_utils",
    "apex.fp16_utils.loss_scaler": "migrate.shim.fp16_utils",
    "apex.optimizers": "migrate.shim.optimizers",
    "apex.optimizers.fused_adam": "migrate.shim.optimizers",
    "apex.optimizers.fp16_optimizer": "migrate.shim.legacy_fp16",
    "apex.optimizers.fused_sgd": "migrate.shim.optimizers",
    "apex.optimizers.fused_lamb": "migrate.shim.optimizers",
    "apex.optimizers.fused_novograd": "migrate.shim.optimizers",
    "apex.optimizers.fused_adagrad": "migrate.shim.optimizers",
    "apex.optimizers.fused_mixed_precision_lamb": "migrate.shim.optimizers",
    "apex.parallel": "migrate.shim.parallel",
    "apex.parallel.distributed": "migrate.shim.parallel",
    "apex.parallel.sync_batchnorm": "migrate.shim.parallel",
    "apex.parallel.optimized_sync_batchnorm": "migrate.shim.parallel",
    "apex.parallel.LARC": "migrate.shim.parallel",
    "apex.normalization": "migrate.shim.normalization",
    "apex.normalization.fused_layer_norm": "migrate.shim.normalization",
    "apex.multi_tensor_apply": "migrate.shim.multi_tensor",
    "apex.multi_tensor_apply.multi_tensor_apply": "migrate.shim.multi_tensor",
    # Apex's compiled extension with the multi-tensor kernels is a top-level module.
    "amp_C": "migrate.shim.amp_c",
}

# Names that behave as packages (so ``import apex.x.y`` looks further).
_PACKAGES = {name.rpartition(".")[0] for name in APEX_MODULES if "." in name}


_MISSING = object()


class _ApexAlias(ModuleType):
    """A module named ``apex...`` whose attributes are read from the shim module behind it.

    A separate module object (rather than the shim module itself) keeps the shim's own
    ``__name__``/``__spec__`` intact and lets ``from apex.amp import scaler`` find submodules.
    """

    def __init__(self, name: str, target: ModuleType) -> None:
        super().__init__(name, target.__doc__)
        self.__dict__["_shim_target"] = target

    def __getattr__(self, name: str) -> object:
        value = getattr(self.__dict__["_shim_target"], name, _MISSING)
        child = f"{self.__name__}.{name}"
        if child in APEX_MODULES and (value is _MISSING or isinstance(value, ModuleType)):
            # Apex's packages import their submodules eagerly (``apex.fp16_utils.fp16util``);
            # going through the alias keeps ``apex.amp`` one object however it is reached.
            return importlib.import_module(child)
        if value is _MISSING:
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        return value

    def __setattr__(self, name: str, value: object) -> None:
        target = self.__dict__["_shim_target"]
        if isinstance(value, ModuleType) and not isinstance(getattr(target, name, value), ModuleType):
            # The import system binds a loaded submodule on its parent; Apex's packages
            # re-bound such names (``amp._amp_state``) to objects, so keep the object.
            return
        super().__setattr__(name, value)

    def __dir__(self) -> list[str]:
        return sorted(set(dir(self.__dict__["_shim_target"])) | set(self.__dict__))


class _ApexAliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves ``apex`` names to shim modules, ahead of any installed Apex."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "apex" and not fullname.startswith("apex.") and fullname != "amp_C":
            return None
        if fullname not in APEX_MODULES:
            # Anything else under apex (contrib, mlp, ...) is not emulated: a clear ImportError.
            raise ModuleNotFoundError(
                f"No module named {fullname!r}: the ampmigrate shim emulates "
                f"{', '.join(sorted(n for n in APEX_MODULES if n.count('.') <= 1))}",
                name=fullname,
            )
        return importlib.util.spec_from_loader(fullname, self, is_package=fullname in _PACKAGES)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return _ApexAlias(spec.name, importlib.import_module(APEX_MODULES[spec.name]))

    def exec_module(self, module: ModuleType) -> None:
        """The shim module behind the alias is already executed."""


_finder = _ApexAliasFinder()


def is_installed() -> bool:
    """Whether ``install()`` has put the Apex alias finder in place."""
    return _finder in sys.meta_path


def install() -> None:
    """Make ``import apex`` and its submodules resolve to the shim (idempotent)."""
    if is_installed():
        return
    loaded = [name for name in sys.modules if name in ("apex", "amp_C") or name.startswith("apex.")]
    foreign = [name for name in loaded if not isinstance(sys.modules[name], _ApexAlias)]
    if foreign:
        raise RuntimeError(
            "a real apex is already imported in this process; call migrate.shim.install() "
            "before anything imports apex"
        )
    sys.meta_path.insert(0, _finder)
