"""O1: Apex's per-function casts, installed by patching ``torch``, ``torch.Tensor`` and
``torch.nn.functional`` attributes, as ``apex.amp.init`` did.

Faithful to Apex: the patch is process-wide and only reaches names looked up after it (a
``from torch import mm`` bound earlier is not cast); fp16 casts of fp32 ``nn.Parameter``s are
cached until the next ``scale_loss`` exit; ``disable_casts()`` turns every wrapper into a
pass-through. Our extension: Apex only cast CUDA tensors, the shim casts floating tensors on
any device, so O1 also runs (in float16) on the CPU. RNNs are cast at ``torch._VF`` (input,
hidden state and each weight to fp16) rather than through Apex's re-flattened fp16 weight
buffer: same dtypes, different plumbing.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional

from migrate.shim import lists
from migrate.shim.scaler import LossScaler

CastFn = Callable[[torch.Tensor], torch.Tensor]

_decorator_handle: AmpHandle | NoOpHandle | None = None
_user_cast_registry: set[tuple[Any, str, str]] = set()
_user_promote_registry: set[tuple[Any, str]] = set()


def _is_float_tensor(value: object) -> bool:
    return isinstance(value, torch.Tensor) and value.is_floating_point()


def maybe_half(value: torch.Tensor) -> torch.Tensor:
    """fp16 copy of any non-fp16 floating tensor (float64 and bfloat16 included)."""
    return value if value.dtype is torch.float16 else value.half()


def maybe_float(value: torch.Tensor) -> torch.Tensor:
    """fp32 copy of any non-fp32 floating tensor (fp16, bf16 and float64 included)."""
    return value if value.dtype is torch.float32 else value.float()


class AmpHandle:
    """The O1 state: on/off switch, weight-cast cache, and what to restore on deactivation."""

    def __init__(self, enable_caching: bool = True, verbose: bool = False, loss_scale: float | str = "dynamic") -> None:
        self._enable_caching = enable_caching
        self._verbose = verbose
        self._cache: dict[torch.Tensor, torch.Tensor] = {}
        self._is_active = True
        self._patched: list[tuple[Any, str, Any]] = []
        # the old API's scaler (``handle.scale_loss``), made when first used: under
        # amp.initialize it never is, and a scaler nobody uses must not show in a verify record
        self._loss_scale = loss_scale
        self._scaler: LossScaler | None = None
        self._wrapped = False

    @property
    def verbose(self) -> bool:
        return self._verbose

    @property
    def has_cache(self) -> bool:
        return self._enable_caching

    @property
    def cache(self) -> dict[torch.Tensor, torch.Tensor]:
        return self._cache

    def is_active(self) -> bool:
        return self._is_active

    def _clear_cache(self) -> None:
        self._cache.clear()

    @contextlib.contextmanager
    def _disable_casts(self) -> Iterator[None]:
        # No try/finally, as in Apex: an exception leaves casts disabled.
        self._is_active = False
        yield
        self._is_active = True

    def _save_func(self, owner: Any, name: str, original: Any) -> None:
        self._patched.append((owner, name, original))

    def _deactivate(self) -> None:
        """Restore every patched attribute, newest first, and switch the handle off."""
        for owner, name, original in reversed(self._patched):
            setattr(owner, name, original)
        self._patched.clear()
        self._is_active = False

    def remove_cache(self, param: torch.Tensor) -> None:
        if self.has_cache:
            self._cache.pop(param, None)

    def _default_scaler(self) -> LossScaler | None:
        """The handle's loss scaler; None once ``wrap_optimizer`` was called (Apex dropped it)."""
        if self._wrapped:
            return None
        if self._scaler is None:
            self._scaler = LossScaler(self._loss_scale)
        return self._scaler

    def scale_loss(self, loss: torch.Tensor, optimizer: Any) -> contextlib.AbstractContextManager[torch.Tensor]:
        """The old API (Apex before April 2019): see ``migrate.shim.handle``."""
        from migrate.shim.handle import handle_scale_loss

        return handle_scale_loss(self, loss, optimizer)

    def wrap_optimizer(self, optimizer: Any, num_loss: int = 1) -> Any:
        from migrate.shim.handle import OptimWrapper

        self._wrapped = True
        return OptimWrapper(optimizer, self, num_loss)


class NoOpHandle:
    """The handle ``amp.init(enabled=False)`` returns: nothing is cast."""

    verbose = False
    has_cache = False

    def is_active(self) -> bool:
        return False

    def _clear_cache(self) -> None:
        pass

    @contextlib.contextmanager
    def _disable_casts(self) -> Iterator[None]:
        yield

    def _deactivate(self) -> None:
        pass

    @contextlib.contextmanager
    def scale_loss(self, loss: torch.Tensor, optimizer: Any) -> Iterator[torch.Tensor]:
        yield loss

    def wrap_optimizer(self, optimizer: Any, num_loss: int = 1) -> Any:
        from migrate.shim.handle import OptimWrapper

        return OptimWrapper(optimizer, self, num_loss)


def _is_float_value(value: object) -> bool:
    """A floating tensor, or a list or tuple of nothing else (Apex's ``is_fp_tensor``)."""
    if isinstance(value, (list, tuple)):
        return all(_is_float_value(item) for item in value)
    return _is_float_tensor(value)


def _cast_value(value: Any, cast: CastFn) -> Any:
    """Apex casts a list or tuple only when every item is a floating tensor."""
    if not _is_float_value(value):
        return value
    if isinstance(value, (list, tuple)):
        return type(value)(_cast_value(item, cast) for item in value)
    return cast(value)


def _cast_args(args: tuple[Any, ...], kwargs: dict[str, Any], cast: CastFn) -> tuple[tuple[Any, ...], dict[str, Any]]:
    return (
        tuple(_cast_value(arg, cast) for arg in args),
        {key: _cast_value(value, cast) for key, value in kwargs.items()},
    )


def _cached_cast(handle: AmpHandle, cast: CastFn, value: torch.Tensor) -> torch.Tensor:
    """Cast an fp32 Parameter once per cache window, as Apex's ``cached_cast``."""
    if not (isinstance(value, torch.nn.Parameter) and value.dtype is torch.float32):
        return cast(value)
    cache = handle.cache
    cached = cache.get(value)
    if cached is not None:
        if value.requires_grad and cached.requires_grad:
            parent = cached.grad_fn.next_functions[0][0] if cached.grad_fn else None
            if getattr(parent, "variable", value) is not value:
                raise RuntimeError(
                    "cached fp16 copy and its fp32 parameter both require grad, but the copy "
                    "was not made from that parameter"
                )
        if torch.is_grad_enabled() and value.requires_grad != cached.requires_grad:
            del cache[value]
        else:
            return cached
    casted = cast(value)
    cache[value] = casted
    return casted


def _verbose_cast(cast: CastFn, name: str, verbose: bool) -> CastFn:
    if not verbose:
        return cast

    def noisy(value: torch.Tensor) -> torch.Tensor:
        out = cast(value)
        if out is not value:
            print(f"{name}: {value.dtype} -> {out.dtype}")
        return out

    return noisy


def make_cast_wrapper(
    original: Callable[..., Any], cast: CastFn, handle: Any, try_caching: bool = False
) -> Callable[..., Any]:
    """Wrap ``original`` so its floating arguments are cast while ``handle`` is active."""

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not handle.is_active():
            return original(*args, **kwargs)
        if try_caching and handle.has_cache:

            def caching(value: torch.Tensor) -> torch.Tensor:
                return _cached_cast(handle, cast, value)

            args, kwargs = _cast_args(args, kwargs, caching)
        else:
            args, kwargs = _cast_args(args, kwargs, cast)
        return original(*args, **kwargs)

    return wrapper


def _float_dtypes(values: Any, found: set[torch.dtype]) -> set[torch.dtype]:
    for value in values:
        if _is_float_tensor(value):
            found.add(value.dtype)
        elif isinstance(value, (list, tuple)) and _is_float_value(value):
            _float_dtypes(value, found)
    return found


_HALF_AND_FLOAT = {torch.float16, torch.float32}


def make_promote_wrapper(original: Callable[..., Any], cast: CastFn, handle: Any) -> Callable[..., Any]:
    """On an fp16/fp32 mix, cast everything to fp32; other mixes are refused, as in Apex."""

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not handle.is_active():
            return original(*args, **kwargs)
        dtypes = _float_dtypes(args, set())
        if kwargs:
            _float_dtypes(kwargs.values(), dtypes)
        if len(dtypes) <= 1:
            return original(*args, **kwargs)
        if dtypes == _HALF_AND_FLOAT:
            args, kwargs = _cast_args(args, kwargs, cast)
            return original(*args, **kwargs)
        raise NotImplementedError(f"O1 does not know how to promote the mix {sorted(map(str, dtypes))}")

    return wrapper


def _make_sequence_promote_wrapper(original: Callable[..., Any], handle: Any) -> Callable[..., Any]:
    @functools.wraps(original)
    def wrapper(sequence: Any, *args: Any, **kwargs: Any) -> Any:
        if not handle.is_active():
            return original(sequence, *args, **kwargs)
        dtypes = {item.dtype for item in sequence if isinstance(item, torch.Tensor)}
        if dtypes == _HALF_AND_FLOAT:
            sequence = [maybe_float(item) for item in sequence]
        return original(sequence, *args, **kwargs)

    return wrapper


def _make_refuse_if_any_half(
    original: Callable[..., Any], name: str, handle: Any, message: str | None = None
) -> Callable[..., Any]:
    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if handle.is_active():
            values = [*args, *kwargs.values()]
            if any(_is_float_tensor(v) and v.dtype is torch.float16 for v in values):
                raise NotImplementedError(message or f"O1 refuses the in-place function {name} on fp16 arguments")
        return original(*args, **kwargs)

    return wrapper


def _make_refuse_if_self_half(original: Callable[..., Any], name: str, handle: Any) -> Callable[..., Any]:
    @functools.wraps(original)
    def wrapper(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if not handle.is_active():
            return original(self, *args, **kwargs)
        if self.dtype is torch.float16:
            raise NotImplementedError(f"O1 refuses the in-place method {name} on an fp16 tensor")
        args, kwargs = _cast_args(args, kwargs, maybe_float)
        return original(self, *args, **kwargs)

    return wrapper


def _make_match_self(original: Callable[..., Any], handle: Any) -> Callable[..., Any]:
    @functools.wraps(original)
    def wrapper(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if not handle.is_active() or not self.is_floating_point():
            return original(self, *args, **kwargs)
        if self.dtype is torch.float16:
            args, kwargs = _cast_args(args, kwargs, maybe_half)
        elif self.dtype is torch.float32:
            args, kwargs = _cast_args(args, kwargs, maybe_float)
        return original(self, *args, **kwargs)

    return wrapper


def _refuse_any_half_maker(
    original: Callable[..., Any], *, name: str, handle: Any, message: str | None = None
) -> Callable[..., Any]:
    return _make_refuse_if_any_half(original, name, handle, message)


def _refuse_self_half_maker(original: Callable[..., Any], *, name: str, handle: Any) -> Callable[..., Any]:
    return _make_refuse_if_self_half(original, name, handle)


def _patch(handle: AmpHandle, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
    if not hasattr(owner, name):
        return
    original = getattr(owner, name)
    handle._save_func(owner, name, original)
    setattr(owner, name, make(original))


def _cast_patch(handle: AmpHandle, owner: Any, name: str, cast: CastFn, try_caching: bool) -> None:
    cast = _verbose_cast(cast, name, handle.verbose)
    _patch(handle, owner, name, lambda fn: make_cast_wrapper(fn, cast, handle, try_caching))


def init(
    enabled: bool = True,
    loss_scale: float | str = "dynamic",
    enable_caching: bool = True,
    verbose: bool = False,
    allow_banned: bool = False,
) -> AmpHandle | NoOpHandle:
    """Patch torch for O1 and return the handle (``amp.init``; ``loss_scale`` serves the old
    API's ``handle.scale_loss``)."""
    global _decorator_handle
    if not enabled:
        _decorator_handle = NoOpHandle()
        return _decorator_handle
    handle = AmpHandle(enable_caching, verbose, loss_scale)
    functional = torch.nn.functional
    tensor = torch.Tensor

    # 0. The user's registrations, consumed here as Apex does.
    for owner, name, kind in _user_cast_registry:
        cast = maybe_half if kind == "half" else maybe_float
        _cast_patch(handle, owner, name, cast, try_caching=kind == "half")
    _user_cast_registry.clear()
    for owner, name in _user_promote_registry:
        _patch(
            handle,
            owner,
            name,
            lambda fn: make_promote_wrapper(fn, maybe_float, handle),
        )
    _user_promote_registry.clear()

    # 1. The FP16 and FP32 lists of the functional, torch and Tensor namespaces.
    for owner, fp16_names, fp32_names in (
        (functional, lists.FUNCTIONAL_FP16, lists.FUNCTIONAL_FP32),
        (torch, lists.TORCH_FP16, lists.TORCH_FP32),
        (tensor, lists.TENSOR_FP16, lists.TENSOR_FP32),
    ):
        for name in fp16_names:
            _cast_patch(handle, owner, name, maybe_half, try_caching=True)
        for name in fp32_names:
            _cast_patch(handle, owner, name, maybe_float, try_caching=False)

    # 2. Promotion on fp16/fp32 mixes, and sequence promotion for cat/stack.
    for owner, names in ((torch, lists.TORCH_PROMOTE), (tensor, lists.TENSOR_PROMOTE)):
        for name in names:
            _patch(
                handle,
                owner,
                name,
                lambda fn: make_promote_wrapper(fn, maybe_float, handle),
            )
    for name in lists.TORCH_SEQUENCE_PROMOTE:
        _patch(handle, torch, name, lambda fn: _make_sequence_promote_wrapper(fn, handle))

    # 3. In-place versions of FP32-list functions refuse fp16 arguments.
    for name in lists.TORCH_FP32:
        inplace = name + "_"
        _patch(
            handle,
            torch,
            inplace,
            functools.partial(_refuse_any_half_maker, name=inplace, handle=handle),
        )
    for name in lists.TENSOR_FP32:
        inplace = name + "_"
        _patch(
            handle,
            tensor,
            inplace,
            functools.partial(_refuse_self_half_maker, name=inplace, handle=handle),
        )

    # 4. Other in-place methods cast their arguments to self's dtype.
    for name in (*lists.TENSOR_FP16, *lists.TENSOR_PROMOTE):
        _patch(handle, tensor, name + "_", lambda fn: _make_match_self(fn, handle))

    # 5. RNNs: the full-sequence kernels and the cells run in fp16 (weights cached).
    for name in lists.VF_FP16:
        _cast_patch(handle, torch._VF, name, maybe_half, try_caching=True)

    # 6. Banned functions: refuse fp16 arguments, or run them in fp32 when allowed.
    for name in lists.FUNCTIONAL_BANNED:
        if allow_banned:
            _cast_patch(handle, functional, name, maybe_float, try_caching=False)
        else:
            message = (
                f"amp refuses torch.nn.functional.{name} (and torch.nn.BCELoss) on fp16 inputs: "
                "use BCEWithLogitsLoss, or register_float_function(torch, 'sigmoid') before "
                "amp.initialize"
            )
            _patch(
                handle,
                functional,
                name,
                functools.partial(_refuse_any_half_maker, name=name, handle=handle, message=message),
            )

    _decorator_handle = handle
    return handle


def current_handle() -> AmpHandle | NoOpHandle | None:
    """The handle the decorators consult (None before ``init``)."""
    return _decorator_handle


def reset() -> None:
    """Undo ``init`` (restore torch) and forget registrations; for tests and re-runs."""
    global _decorator_handle
    if _decorator_handle is not None:
        _decorator_handle._deactivate()
    _decorator_handle = None
    _user_cast_registry.clear()
    _user_promote_registry.clear()


def _check_registrable(module: Any, name: str) -> None:
    if not hasattr(module, name):
        raise ValueError(f"{module} has no function named {name}")


def register_half_function(module: Any, name: str) -> None:
    """Run ``module.name`` in fp16 under O1 (register before ``amp.initialize``)."""
    _check_registrable(module, name)
    _user_cast_registry.add((module, name, "half"))


def register_float_function(module: Any, name: str) -> None:
    """Run ``module.name`` in fp32 under O1 (register before ``amp.initialize``)."""
    _check_registrable(module, name)
    _user_cast_registry.add((module, name, "float"))


def register_promote_function(module: Any, name: str) -> None:
    """Promote ``module.name``'s fp16/fp32 mixes to fp32 under O1."""
    _check_registrable(module, name)
    _user_promote_registry.add((module, name))


def _decorate(fn: Callable[..., Any], kind: str) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        handle = _decorator_handle
        if handle is None or not handle.is_active():
            return fn(*args, **kwargs)
        if kind == "promote":
            return make_promote_wrapper(fn, maybe_float, handle)(*args, **kwargs)
        cast = maybe_half if kind == "half" else maybe_float
        return make_cast_wrapper(fn, cast, handle, try_caching=kind == "half")(*args, **kwargs)

    return wrapper


def half_function(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator: run ``fn`` on fp16 arguments while O1 is active."""
    return _decorate(fn, "half")


def float_function(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator: run ``fn`` on fp32 arguments while O1 is active."""
    return _decorate(fn, "float")


def promote_function(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator: promote ``fn``'s fp16/fp32 mixes to fp32 while O1 is active."""
    return _decorate(fn, "promote")
