"""Project mode: functions whose only results are the Apex amp module or None (``migrate.amp_factories``),
and the findings that name where their callers keep that result."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

from migrate.amp_factories import describe_callers, factories
from migrate.config import Config
from migrate.runner import run

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "project" / "amp_module_from_a_factory_stays" / "in"

GET_AMP = """\
import torch


def get_amp(fp16):
    if fp16:
        try:
            from apex import amp

            amp.register_half_function(torch, "einsum")
        except ImportError:
            raise ImportError("install apex")
    else:
        amp = None
    return amp
"""


def test_a_flag_guarded_import_returned_or_none_is_a_factory() -> None:
    (found,) = factories(ast.parse(GET_AMP))
    assert (found.name, found.line, found.condition) == ("get_amp", 4, "fp16")


@pytest.mark.parametrize(
    "source",
    [
        # the module also returned under another value
        "def f(fp16):\n    if fp16:\n        from apex import amp\n    else:\n        amp = object()\n    return amp\n",
        # something else returned beside it
        "def f(fp16):\n    from apex import amp\n    if fp16:\n        return amp\n    return 1\n",
        # the name is a parameter: the caller's value comes back
        "def f(amp):\n    if amp is None:\n        from apex import amp\n    return amp\n",
        # amp is another library's
        "def f(fp16):\n    from mxnet.contrib import amp\n    return amp\n",
        # no import at all
        "def f():\n    amp = None\n    return amp\n",
    ],
    ids=["another_value", "another_result", "parameter", "other_library", "no_import"],
)
def test_other_functions_are_not_factories(source: str) -> None:
    assert factories(ast.parse(source)) == []


def test_the_callers_are_named_with_where_the_result_goes() -> None:
    trees = [
        (str(path.relative_to(FIXTURE)), ast.parse(path.read_text(encoding="utf-8")))
        for path in sorted(FIXTURE.rglob("*.py"))
    ]
    (factory,) = factories(dict(trees)["helpers.py"])
    text, calls = describe_callers(trees, factory, str)
    assert text == (
        "models/base.py:11 keeps it in `amp` (in `Learner.setup`), where `setup` returns it on (line 17); "
        "models/ranker.py:10 keeps it in `self.amp` (in `Ranker.fit`), where it is passed to `self.train(...)` "
        "(line 13)"
    )
    assert [(path, result.holder) for path, result in calls] == [
        ("models/base.py", "amp"),
        ("models/ranker.py", "self.amp"),
    ]


def test_a_call_whose_result_is_not_kept_is_named_as_a_value_use() -> None:
    caller = ast.parse("from helpers import get_amp\n\n\ndef train(fp16):\n    run(amp=get_amp(fp16))\n")
    (factory,) = factories(ast.parse(GET_AMP))
    text, calls = describe_callers([("train.py", caller)], factory, str)
    assert text == "train.py:5 uses `get_amp(fp16)` as a value (in `train`)"
    assert [result.holder for _, result in calls] == [""]


def test_the_findings_name_the_factory_and_its_callers(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    shutil.copytree(FIXTURE, root)
    results = run([root], Config(jobs=1))
    messages = {
        f"{Path(result.path).relative_to(root).as_posix()}:{d.line}": d.message
        for result in results
        for d in result.diagnostics
    }
    returned = messages["helpers.py:20"]
    assert "(None where `use_fp16` is false)" in returned
    assert "models/base.py:11 keeps it in `amp` (in `Learner.setup`), where `setup` returns it on (line 17)" in returned
    assert "models/ranker.py:10 keeps it in `self.amp`" in returned
    for where, name in (("models/base.py:14", "amp"), ("models/ranker.py:12", "self.amp")):
        assert f"`{name}` holds what `mixed_precision(fp16)` returns (" in messages[where]
        assert "helpers.py:9), the Apex amp module or None" in messages[where]
    # a parameter keeps its own finding: what its callers pass is not followed either
    assert "`amp` is a parameter of `train`" in messages["models/base.py:23"]
    assert messages["models/ranker.py:12"].endswith("; where `self.amp` held None, it keeps holding None")


def test_a_function_of_the_same_name_elsewhere_is_no_caller() -> None:
    home = ast.parse(GET_AMP)
    caller = ast.parse("from pytorch_utils import get_amp\n\n\ndef train(fp16):\n    amp = get_amp(fp16)\n")
    stranger = ast.parse("from other.lib import get_amp\n\n\ndef train(fp16):\n    amp = get_amp(fp16)\n")
    (factory,) = factories(home)
    trees = [("pytorch_utils.py", home), ("train.py", caller), ("other.py", stranger)]
    text, calls = describe_callers(trees, factory, str, "pytorch_utils.py")
    assert text == "train.py:5 keeps it in `amp` (in `train`)"
    assert [path for path, _ in calls] == ["train.py"]


def test_a_call_in_a_nested_function_is_named_without_reading_a_namesake() -> None:
    caller = ast.parse(
        "from u import get_amp\n\n\ndef outer(fp16):\n    def inner():\n        amp = get_amp(fp16)\n"
        "        return amp\n\n    return inner\n\n\ndef inner(amp):\n    return amp\n"
    )
    (factory,) = factories(ast.parse(GET_AMP))
    text, _ = describe_callers([("train.py", caller)], factory, str)
    assert text == "train.py:6 keeps it in `amp` (in `inner`)"
