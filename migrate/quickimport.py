"""Importing the engine (libcst and the rules) for less: most of a one-file run's time.

libcst makes some 250 node classes with ``@dataclass(frozen=True)``. For each class,
``dataclasses`` writes the source of every method it generates (``__init__``,
``__repr__``, ``__eq__``, ``__setattr__``, ``__delattr__``, ...) and ``exec``s that text:
about a thousand compiles, half of libcst's import. While ``compiled_once`` is active,
each distinct text is compiled once (a third of them repeat one already compiled) and
the code kept beside the modules' own compiled code (``__pycache__``), as Python keeps
a module's: the next run executes that code instead of compiling the text again.
Executing code compiled from a text is what ``exec`` of that text does (the same file
name; no ``__future__`` flags, as ``dataclasses`` has none for its ``exec`` to pass on),
and each class still gets functions of its own, made by running that code.

Two stores: "engine" for the import of ``migrate.engine`` (libcst's classes and the
rules'), "main" for the classes of the modules every run imports (``migrate.entry``
runs the whole command line in its block), which a run on files without Apex loads
without the large engine store.
"""

from __future__ import annotations

import builtins
import dataclasses
import importlib.util
import marshal
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from types import CodeType
from typing import Any

from migrate.gcpause import cycle_collector_paused


def store_path(part: str) -> str | None:
    """Where the compiled methods of ``part`` are kept: beside this module's compiled code
    (so under ``sys.pycache_prefix`` when one is set); None where this Python keeps none."""
    try:
        compiled = importlib.util.cache_from_source(__file__)
    except NotImplementedError:  # no sys.implementation.cache_tag
        return None
    return f"{os.path.splitext(compiled)[0]}.{part}.dataclasses"


def _load(path: str) -> dict[str, CodeType]:
    """The texts and code stored at ``path`` by this very Python (its bytecode's magic
    number); nothing if the file is absent, unreadable or of another Python."""
    try:
        with open(path, "rb") as stream:
            data = stream.read()
        magic = importlib.util.MAGIC_NUMBER
        if not data.startswith(magic):
            return {}
        # from bytes: marshal.load reads a file in a small read per object, several times slower
        codes = marshal.loads(memoryview(data)[len(magic) :])
    except (OSError, EOFError, ValueError, TypeError):
        return {}
    if not isinstance(codes, dict):
        return {}
    return {text: code for text, code in codes.items() if type(text) is str and type(code) is CodeType}


def _save(path: str, codes: dict[str, CodeType]) -> None:
    """Replace the store at ``path`` with ``codes`` at once (runs side by side may each
    write theirs: a reader sees one whole store or another); a store that cannot be
    written is no error, as for Python's own compiled modules."""
    import tempfile  # not at the top: only a run that compiled something writes

    folder = os.path.dirname(path)
    try:
        os.makedirs(folder, exist_ok=True)
        descriptor, temp = tempfile.mkstemp(prefix=".dataclasses-", dir=folder)
        try:
            # readable by whoever may read the module (mkstemp makes it private), as a .pyc is
            os.chmod(temp, os.stat(__file__).st_mode & 0o666)
            with os.fdopen(descriptor, "wb") as stream:
                stream.write(importlib.util.MAGIC_NUMBER)
                marshal.dump(codes, stream)
            os.replace(temp, path)
        except BaseException:
            with suppress(OSError):
                os.unlink(temp)
            raise
    except (OSError, ValueError):
        pass


def _kept(stored: dict[str, CodeType], used: dict[str, CodeType]) -> dict[str, CodeType]:
    """What a store keeps once a block had to compile some of what it ``used``: that and what
    was stored (runs that make different classes do not undo each other's work), unless the
    store would be more than twice what the block used (a library's new version leaves the
    old one's texts behind: they go)."""
    kept = {**stored, **used}
    return kept if len(kept) <= 2 * len(used) else used


@contextmanager
def compiled_once(store: str | None = None) -> Iterator[None]:
    """Run the block with ``dataclasses`` compiling each distinct method text once.

    ``store``: a file of code compiled by earlier runs, taken where its text matches;
    rewritten (see ``_kept``) when some of what this block used had to be compiled (unless
    Python is told not to write compiled code: ``sys.dont_write_bytecode``). Blocks nest:
    the classes made in the inner one go to the inner block's store.
    """
    outer = vars(dataclasses).get("exec")
    if outer is not None and not hasattr(outer, "compiled_once"):  # someone else's: theirs to keep
        yield
        return
    stored = _load(store) if store is not None else {}
    used: dict[str, CodeType] = {}
    compiled = False

    def exec_once(source: Any, globals: Any = None, locals: Any = None, /) -> None:
        nonlocal compiled
        if type(source) is str and isinstance(globals, dict):
            code = used.get(source) or stored.get(source)
            if code is None:
                # dont_inherit: not this module's `annotations` future, which the text never had
                code = compile(source, "<string>", "exec", dont_inherit=True)
                compiled = True
            used[source] = code
            builtins.exec(code, globals, locals)
        else:  # not the call dataclasses makes: the builtin's own, with the globals it would see
            builtins.exec(source, vars(dataclasses) if globals is None else globals, locals)

    exec_once.compiled_once = True  # type: ignore[attr-defined]
    vars(dataclasses)["exec"] = exec_once  # found before the builtin by the module's own lookups
    try:
        yield
    except SystemExit:
        keep = True  # the command line's usual end
        raise
    except BaseException:
        keep = False  # an error or Ctrl-C: out at once, nothing written
        raise
    else:
        keep = True
    finally:
        if outer is None:
            del vars(dataclasses)["exec"]
        else:
            vars(dataclasses)["exec"] = outer
        if keep and store is not None and compiled and not sys.dont_write_bytecode:
            _save(store, _kept(stored, used))


def import_engine() -> None:
    """Import ``migrate.engine`` (libcst, the rules) as cheaply as it goes, if not yet done.

    The import makes some hundred thousand objects, nearly all for good: the cycle
    collector's passes over them meanwhile would only find them alive.
    """
    if "migrate.engine" in sys.modules:
        return
    with cycle_collector_paused(), compiled_once(store_path("engine")):
        import migrate.engine  # noqa: F401
