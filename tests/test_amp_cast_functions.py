"""The helpers amp_cast_functions writes, run: they cast what Apex's cast functions cast.

The Apex side is the shim's emulation of ``amp.float_function`` / ``half_function`` /
``promote_function`` under an O1 handle (``migrate.shim.casting``, Apex's casting rules on any
device); the migrated side is the module ampmigrate writes with ``--device cpu``, run under
CPU autocast. Both wrap one probe function that returns what it received.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from migrate.engine import migrate_source
from migrate.options import Options

torch = pytest.importorskip("torch", reason="the helpers run on torch")

SOURCE = """\
import torch
from apex import amp


def probe(*args, **kwargs):
    return args, kwargs, torch.is_autocast_enabled("cpu")


as_float = amp.float_function(probe)
as_half = amp.half_function(probe)
as_promote = amp.promote_function(probe)
"""


def migrated(dtype: str = "float16") -> dict[str, Any]:
    result = migrate_source(SOURCE, Options(device="cpu", dtype=dtype))
    assert "from apex" not in result.source and "= float_function(probe)" in result.source
    namespace: dict[str, Any] = {"__name__": "migrated"}
    exec(compile(result.source, "migrated.py", "exec"), namespace)
    return namespace


def describe(value: Any) -> Any:
    """The structure and dtypes of a value, comparable across runs."""
    if isinstance(value, torch.Tensor):
        return str(value.dtype)
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [describe(item) for item in value])
    if isinstance(value, dict):
        return {key: describe(item) for key, item in value.items()}
    return repr(value)


def half(*shape: int) -> torch.Tensor:
    return torch.ones(*shape, dtype=torch.float16)


def single(*shape: int) -> torch.Tensor:
    return torch.ones(*shape)


# (args, kwargs): the shapes Apex's casts reach or leave alone
CASES: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    ((half(2), single(2)), {}),
    ((), {"x": half(2), "y": single(2)}),
    (([half(2), single(2)], (half(1),)), {}),  # lists and tuples of floating tensors: cast, type kept
    (([[half(2)], [single(2)]],), {}),  # nested
    (([half(2), None],), {}),  # a list with anything else: left alone
    (({"a": half(2)},), {}),  # dicts: left alone
    ((torch.ones(2, dtype=torch.int64), torch.ones(2, dtype=torch.float64)), {}),  # float64 is cast too
    ((1.5, None, "text", half(2)), {"scale": 2.0}),
]
CASE_IDS = ["positional", "keywords", "list-and-tuple", "nested", "mixed-list", "dict", "int-and-double", "scalars"]


@pytest.fixture
def apex_o1() -> Iterator[Any]:
    from migrate.shim import casting

    casting.init()
    yield casting
    casting.reset()


def apex_result(casting: Any, kind: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    def probe(*a: Any, **k: Any) -> Any:
        return a, k

    wrapped: Callable[..., Any] = getattr(casting, f"{kind}_function")(probe)
    return describe(wrapped(*args, **kwargs))


@pytest.mark.parametrize(("args", "kwargs"), CASES, ids=CASE_IDS)
@pytest.mark.parametrize("kind", ["float", "half"])
def test_casts_what_apex_casts(apex_o1: Any, kind: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    expected = apex_result(apex_o1, kind, args, dict(kwargs))
    apex_o1.reset()  # the helpers run on an unpatched torch
    helpers = migrated()
    with torch.autocast("cpu", dtype=torch.float16):
        got_args, got_kwargs, _ = helpers[f"as_{kind}"](*args, **kwargs)
    assert describe((got_args, got_kwargs)) == expected


@pytest.mark.parametrize(
    "args",
    [(half(2), single(2)), (half(2), half(2)), ([half(2), single(2)], 3), (single(2), [half(2), None])],
    ids=["mix", "one-dtype", "mix-in-a-list", "mix-with-a-mixed-list"],
)
def test_promotes_what_apex_promotes(apex_o1: Any, args: tuple[Any, ...]) -> None:
    expected = apex_result(apex_o1, "promote", args, {})
    apex_o1.reset()
    with torch.autocast("cpu", dtype=torch.float16):
        got_args, _, _ = migrated()["as_promote"](*args)
    assert describe((got_args, {})) == expected


def test_promote_passes_other_mixes_where_apex_raised(apex_o1: Any) -> None:
    args = (single(2), torch.ones(2, dtype=torch.float64))
    with pytest.raises(NotImplementedError):
        apex_result(apex_o1, "promote", args, {})
    apex_o1.reset()
    with torch.autocast("cpu", dtype=torch.float16):
        got_args, _, _ = migrated()["as_promote"](*args)
    assert describe(got_args) == describe(args)


@pytest.mark.parametrize("kind", ["float", "half", "promote"])
def test_outside_autocast_the_function_gets_its_arguments_untouched(kind: str) -> None:
    args = (half(2), [single(2)], torch.ones(2, dtype=torch.float64))
    got_args, _, inside = migrated()[f"as_{kind}"](*args)
    assert all(got is given for got, given in zip(got_args, args))
    assert inside is False


def test_float_function_runs_its_body_with_autocast_off_half_and_promote_keep_it() -> None:
    helpers = migrated()
    with torch.autocast("cpu", dtype=torch.float16):
        assert helpers["as_float"](half(2))[2] is False
        assert helpers["as_half"](single(2))[2] is True
        assert helpers["as_promote"](half(2), single(2))[2] is True
        assert torch.is_autocast_enabled("cpu")  # switched back on after the call


def test_only_tensors_on_the_device_are_cast() -> None:
    meta = torch.empty(2, dtype=torch.float16, device="meta")
    with torch.autocast("cpu", dtype=torch.float16):
        (got, cpu), _, _ = migrated()["as_float"](meta, half(2))
    assert got is meta and cpu.dtype is torch.float32


def test_half_function_casts_to_the_autocast_dtype_chosen_by_dtype() -> None:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        (got,), _, _ = migrated("bfloat16")["as_half"](single(2))
    assert got.dtype is torch.bfloat16


def test_casts_keep_the_gradient_path() -> None:
    weight = torch.ones(3, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.float16):
        (cast,), _, _ = migrated()["as_half"](weight)
    (cast.float() * 2).sum().backward()
    assert weight.grad is not None and weight.grad.tolist() == [2.0, 2.0, 2.0]
