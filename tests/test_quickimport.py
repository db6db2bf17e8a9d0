"""Importing the engine for less (issue 11): the methods ``dataclasses`` generates are
compiled once per distinct text and kept for the next run, with classes that behave
exactly as those made the usual way."""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pytest

from migrate import quickimport
from migrate.quickimport import compiled_once

ROOT = Path(__file__).resolve().parent.parent


def make_classes() -> dict[str, type]:
    """Dataclasses of every kind libcst and the engine make (frozen, ordered, with
    defaults, factories, class variables, keyword-only fields, slots, inheritance)."""

    @dataclasses.dataclass(frozen=True)
    class Node:
        name: str
        children: tuple[int, ...] = ()
        kind: ClassVar[str] = "node"

    @dataclasses.dataclass(frozen=True)
    class Leaf(Node):
        value: int = 0

    @dataclasses.dataclass(order=True)
    class Ordered:
        first: int
        rest: list[int] = dataclasses.field(default_factory=list, compare=False)

    @dataclasses.dataclass(eq=False, kw_only=True)
    class Plain:
        flag: bool = False

    @dataclasses.dataclass(frozen=True, slots=True)
    class Slotted:
        x: int
        y: int = 2

    @dataclasses.dataclass(unsafe_hash=True)
    class Hashed:
        key: str
        note: str = dataclasses.field(default="", hash=False, repr=False)

    return {cls.__name__: cls for cls in (Node, Leaf, Ordered, Plain, Slotted, Hashed)}


def behaviour(classes: dict[str, type]) -> list[Any]:
    """What one can observe of the classes: signatures, annotations, results, errors."""

    def outcome(action: Callable[[], Any]) -> Any:
        try:
            return ("ok", action())
        except Exception as error:
            return ("raised", type(error).__name__, str(error))

    Node, Leaf, Ordered, Plain, Slotted, Hashed = (classes[name] for name in classes)
    observed: list[Any] = []
    for cls in classes.values():
        for method in ("__init__", "__repr__", "__eq__", "__setattr__", "__delattr__", "__hash__", "__lt__"):
            function = cls.__dict__.get(method)
            if inspect.isfunction(function):
                observed.append((cls.__name__, method, function.__qualname__, str(inspect.signature(function))))
                observed.append((cls.__name__, method, function.__annotations__))
    leaf = Leaf("a", (1,), value=3)
    observed += [
        repr(leaf),
        leaf == Leaf("a", (1,), 3),
        leaf == Node("a", (1,)),
        hash(leaf) == hash(Leaf("a", (1,), 3)),
        outcome(lambda: setattr(leaf, "value", 4)),
        outcome(lambda: delattr(leaf, "name")),
        outcome(lambda: Node()),
        Ordered(1, [5]) < Ordered(2),
        Ordered(1, [5]) == Ordered(1, [6]),
        repr(Plain(flag=True)),
        outcome(lambda: Plain(True)),
        Plain() == Plain(),
        repr(Slotted(1)),
        outcome(lambda: setattr(Slotted(1), "x", 2)),
        hash(Hashed("k", "a")) == hash(Hashed("k", "b")),
        repr(Hashed("k", "a")),
    ]
    return observed


def test_classes_made_with_code_compiled_once_behave_as_the_usual_ones(tmp_path: Path) -> None:
    expected = behaviour(make_classes())
    store = str(tmp_path / "store")
    with compiled_once(store):
        first = make_classes()
    assert "exec" not in vars(dataclasses)  # the module is as it was
    with compiled_once(store):  # this time from the store
        second = make_classes()
    assert behaviour(first) == expected
    assert behaviour(second) == expected
    # each class has functions of its own, even where their code is shared
    assert first["Node"].__init__ is not second["Node"].__init__  # type: ignore[misc]


def test_a_text_is_compiled_once_and_the_next_run_compiles_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    compiles: list[str] = []

    def counting_compile(source: str, *args: Any, **kwargs: Any) -> Any:
        compiles.append(source)
        return compile(source, *args, **kwargs)

    monkeypatch.setattr(quickimport, "compile", counting_compile, raising=False)
    store = tmp_path / "store"

    @dataclasses.dataclass(frozen=True)
    class Reference:
        a: int

    with compiled_once(str(store)):

        @dataclasses.dataclass(frozen=True)
        class One:
            a: int

        @dataclasses.dataclass(frozen=True)
        class Two:  # the same field names and types: the same method texts as One's
            a: int

    assert compiles and len(compiles) == len(set(compiles))  # Two compiled nothing new
    assert store.is_file()
    assert store.stat().st_mode & 0o777 == os.stat(quickimport.__file__).st_mode & 0o666
    compiles.clear()
    with compiled_once(str(store)):

        @dataclasses.dataclass(frozen=True)
        class Three:
            a: int

    assert compiles == []
    assert repr(Three(1)) == repr(Reference(1)).replace("Reference", "Three")
    with pytest.raises(dataclasses.FrozenInstanceError):
        Three(1).a = 2  # type: ignore[misc]


@pytest.mark.parametrize(
    "content",
    [b"", b"garbage", importlib.util.MAGIC_NUMBER + b"\x00\x01", b"\x00\x00\x0d\x0a" + b"{"],
    ids=["empty", "garbage", "truncated", "another Python"],
)
def test_a_store_that_is_not_this_pythons_is_ignored_and_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: bytes
) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    store = tmp_path / "store"
    store.write_bytes(content)
    with compiled_once(str(store)):
        classes = make_classes()
    assert behaviour(classes) == behaviour(make_classes())
    assert store.read_bytes().startswith(importlib.util.MAGIC_NUMBER)
    assert quickimport._load(str(store))


def test_nothing_is_written_where_python_writes_no_compiled_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    with compiled_once(str(tmp_path / "store")):
        make_classes()
    assert not (tmp_path / "store").exists()


def test_an_unwritable_store_is_no_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    blocker = tmp_path / "file"
    blocker.write_text("")
    with compiled_once(str(blocker / "store")):  # its folder is a file
        classes = make_classes()
    assert behaviour(classes) == behaviour(make_classes())


def test_the_store_lives_beside_the_modules_compiled_code() -> None:
    path = quickimport.store_path("main")
    assert path is not None and path != quickimport.store_path("engine")
    assert os.path.dirname(path) == os.path.dirname(importlib.util.cache_from_source(quickimport.__file__))


def test_a_run_imports_the_engine_through_the_store_and_says_the_same(tmp_path: Path) -> None:
    """Two fresh processes import the engine: the first compiles and stores the methods,
    the second takes them from the store; both migrate a file to the same output."""
    source = (ROOT / "examples" / "train_amp.py").read_text()
    script = (
        "import sys\n"
        "from migrate import quickimport\n"
        "quickimport.store_path = lambda part: sys.argv[1]\n"
        "quickimport.import_engine()\n"
        "from migrate.engine import migrate_source\n"
        "sys.stdout.write(migrate_source(sys.stdin.read()).source)\n"
    )
    store = tmp_path / "store"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    outputs = []
    for _ in range(2):
        run = subprocess.run(
            [sys.executable, "-c", script, str(store)], input=source, env=env, capture_output=True, text=True
        )
        assert run.returncode == 0, run.stderr
        outputs.append(run.stdout)
        assert store.is_file()
    from migrate.engine import migrate_source

    assert outputs[0] == outputs[1] == migrate_source(source).source != source


def test_blocks_nest_and_each_keeps_its_own_classes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    outer, inner = tmp_path / "outer", tmp_path / "inner"
    with compiled_once(str(outer)):
        before = dataclasses.exec  # type: ignore[attr-defined]
        with compiled_once(str(inner)):

            @dataclasses.dataclass
            class Inner:
                inner_field: int

        assert dataclasses.exec is before  # type: ignore[attr-defined]

        @dataclasses.dataclass
        class Outer:
            outer_field: int

    assert "exec" not in vars(dataclasses)
    assert any("inner_field" in text for text in quickimport._load(str(inner)))
    assert not any("outer_field" in text for text in quickimport._load(str(inner)))
    assert any("outer_field" in text for text in quickimport._load(str(outer)))
    assert not any("inner_field" in text for text in quickimport._load(str(outer)))
    assert Inner(1) == Inner(1) and Outer(2).outer_field == 2


def test_a_block_ended_by_an_error_writes_nothing_and_one_ended_by_exit_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    with pytest.raises(KeyboardInterrupt), compiled_once(str(tmp_path / "interrupted")):
        make_classes()
        raise KeyboardInterrupt
    assert not (tmp_path / "interrupted").exists()
    with pytest.raises(SystemExit), compiled_once(str(tmp_path / "exited")):
        make_classes()
        sys.exit(1)
    assert quickimport._load(str(tmp_path / "exited"))
    assert "exec" not in vars(dataclasses)


def test_someone_elses_exec_in_dataclasses_is_left_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def theirs(source: str, globals: Any = None, locals: Any = None) -> None:
        calls.append(source)
        exec(source, globals, locals)

    monkeypatch.setitem(vars(dataclasses), "exec", theirs)
    with compiled_once(str(tmp_path / "store")):
        classes = make_classes()
        assert dataclasses.exec is theirs  # type: ignore[attr-defined]
    assert calls and behaviour(classes) == behaviour(make_classes())
    assert not (tmp_path / "store").exists()


def test_the_command_line_keeps_both_stores_and_says_the_same_with_them(tmp_path: Path) -> None:
    """``python -m migrate --check`` on an Apex file: the first run writes the stores (under
    the prefix Python is given for its compiled code), the second takes them; same report."""
    (tmp_path / "train.py").write_text((ROOT / "examples" / "train_amp.py").read_text())
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONPYCACHEPREFIX": str(tmp_path / "pycache")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    runs = [
        subprocess.run(
            [sys.executable, "-m", "migrate", "--check", "--no-cache", "train.py"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
        )
        for _ in range(2)
    ]
    assert runs[0].returncode == runs[1].returncode == 1, runs[0].stderr
    assert runs[0].stdout == runs[1].stdout and "AMP001" in runs[0].stdout
    assert runs[0].stderr == runs[1].stderr and "would migrate train.py" in runs[0].stderr
    stores = sorted(path.name for path in (tmp_path / "pycache").rglob("*.dataclasses"))
    tag = sys.implementation.cache_tag
    assert stores == [f"quickimport.{tag}.engine.dataclasses", f"quickimport.{tag}.main.dataclasses"]


def test_a_store_keeps_what_other_runs_made_but_not_a_library_version_ago(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    store = str(tmp_path / "store")

    def make(field: str) -> None:
        dataclasses.make_dataclass(f"Made_{field}", [(field, int)], frozen=True)

    with compiled_once(store):  # one kind of run
        make("alpha")
    with compiled_once(store):  # another kind, with classes of its own
        make("beta")
    texts = "".join(quickimport._load(store))
    assert "alpha" in texts and "beta" in texts  # neither undoes the other's work
    with compiled_once(store):  # a new version of everything: the old texts would be most
        for number in range(4):
            make(f"gamma{number}")
    texts = "".join(quickimport._load(store))
    assert "gamma0" in texts and "alpha" in texts  # still at most twice what was used
    with compiled_once(store):
        make("delta")
    texts = "".join(quickimport._load(store))
    assert "delta" in texts and "alpha" not in texts and "gamma0" not in texts
