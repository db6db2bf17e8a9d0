"""Apex fallbacks of a torch version test, and the names that only ever hold None without them.

``if LooseVersion(torch.__version__) >= LooseVersion("1.6.0"): <native> else: from apex import amp;
...`` never runs its ``else:`` on the torch the migrated code needs (2.3 and newer). A name that
branch binds to the amp module (``amp``), bound elsewhere in its function only to None
(``amp, scaler = None, None``), thus only ever holds None; so does a parameter that every call
in the project gives such a name, None, or nothing (its default being None). ``none_only``
finds them all (the ``amp`` of ``main``, of ``train_one_epoch(..., amp, scaler)``, of
``scheduler.save_checkpoint(..., amp=amp)`` in another module), so that ``amp_version_fallback``
can drop the code each function has for them (``if amp is not None: amp.state_dict()``). No
libcst, no torch: plain ``ast``, so the project plan can run it over every module.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from migrate.pytree import dotted, own_nodes

# the first torch release whose native API the migrated code needs (torch.amp.GradScaler("cuda"))
NEEDED = (2, 3)
_VERSION_CALLS = frozenset({"LooseVersion", "StrictVersion", "parse", "Version", "parse_version"})
_NEWER: dict[type, bool] = {ast.GtE: True, ast.Gt: True, ast.Lt: False, ast.LtE: False}
_FLIPPED: dict[type, type] = {ast.GtE: ast.LtE, ast.Gt: ast.Lt, ast.Lt: ast.Gt, ast.LtE: ast.GtE}

Function = ast.FunctionDef | ast.AsyncFunctionDef


def _version_of(node: ast.expr) -> tuple[int, int] | str | None:
    """``"torch"`` for ``F(torch.__version__)``; (major, minor) for ``F("1.6.0")``; else None."""
    if not (isinstance(node, ast.Call) and len(node.args) == 1 and not node.keywords):
        return None
    if (dotted(node.func) or "").rpartition(".")[2] not in _VERSION_CALLS:
        return None
    value = node.args[0]
    if dotted(value) == "torch.__version__":
        return "torch"
    if isinstance(value, ast.Constant) and isinstance(value.value, str):
        match = re.fullmatch(r"(\d+)\.(\d+)(\.\d+)*", value.value)
        if match:
            return (int(match.group(1)), int(match.group(2)))
    return None


def newer_torch(test: ast.expr) -> bool | None:
    """True for a test that says "torch is at least an old version" (``LooseVersion(torch.__version__)
    >= LooseVersion("1.6.0")``), False for "torch is older than it", on every torch from 2.3 on;
    None for any other test."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return None
    operator: type = type(test.ops[0])
    if operator not in _NEWER:
        return None
    left, right = _version_of(test.left), _version_of(test.comparators[0])
    if left != "torch":
        left, right, operator = right, left, _FLIPPED[operator]
    if left != "torch" or not isinstance(right, tuple) or right >= NEEDED:
        return None
    return _NEWER[operator]


def is_fallback(choice: ast.If, parent: ast.AST | None) -> bool:
    """``if <torch is new>: ... else: ...``, neither branch an ``elif``."""
    if newer_torch(choice.test) is not True or not choice.orelse:
        return False
    if len(choice.orelse) == 1 and isinstance(choice.orelse[0], ast.If):
        if choice.orelse[0].col_offset == choice.col_offset:
            return False  # `elif`
    if isinstance(parent, ast.If) and parent.orelse == [choice] and parent.col_offset == choice.col_offset:
        return False
    return True


def amp_bound(statements: list[ast.stmt]) -> set[str]:
    """The names ``from apex import amp`` (or ``import apex.amp as x``) binds in ``statements``
    (and in the functions and classes among them)."""
    names: set[str] = set()
    for node in (n for statement in statements for n in ast.walk(statement)):
        if isinstance(node, ast.ImportFrom) and node.module == "apex" and not node.level:
            names.update(alias.asname or alias.name for alias in node.names if alias.name == "amp")
        elif isinstance(node, ast.Import):
            names.update(alias.asname for alias in node.names if alias.name == "apex.amp" and alias.asname)
    return names


@dataclass(frozen=True)
class Fallback:
    """One fallback: the function (or module) it is in, its ``if``, and the amp names its ``else:`` binds."""

    scope: ast.AST
    choice: ast.If
    names: frozenset[str]


def fallbacks(tree: ast.Module) -> list[Fallback]:
    """The fallbacks of the module: their ``else:`` uses Apex's amp (and maybe more of Apex)."""
    amp = amp_bound(tree.body)
    found = []
    scopes: list[ast.AST] = [
        tree,
        *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))),
    ]
    for scope in scopes:
        parents = {id(child): node for node in own_nodes(scope) for child in ast.iter_child_nodes(node)}
        for node in own_nodes(scope):
            if isinstance(node, ast.If) and is_fallback(node, parents.get(id(node))):
                names = amp_bound(node.orelse)
                used = {n.id for statement in node.orelse for n in ast.walk(statement) if isinstance(n, ast.Name)}
                if used & amp:
                    found.append(Fallback(scope, node, frozenset(names)))
    return found


def _inside(node: ast.AST, statements: list[ast.stmt]) -> bool:
    return any(
        (s.lineno, s.col_offset) <= (node.lineno, node.col_offset) <= (s.end_lineno or s.lineno, s.end_col_offset or 0)  # type: ignore[attr-defined]
        for s in statements
    )


def _parameters(function: Function) -> list[ast.arg]:
    arguments = function.args
    return [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]


def none_bindings_only(scope: ast.AST, name: str, dead: list[ast.stmt], parameter: bool = False) -> bool:
    """Every binding of ``name`` in ``scope``'s own code outside ``dead`` stores None (``parameter``:
    the name is the function's parameter, which its body may only set to None too)."""
    if not parameter and isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        if any(a.arg == name for a in [*_parameters(scope), scope.args.vararg, scope.args.kwarg] if a is not None):
            return False
    for node in own_nodes(scope):
        if hasattr(node, "lineno") and _inside(node, dead):
            continue
        if isinstance(node, (ast.Global, ast.Nonlocal)) and name in node.names:
            return False
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if not _stores_none(target, node.value, name):
                    return False
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For, ast.AsyncFor, ast.NamedExpr, ast.comprehension)):
            if any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(node.target)):
                return False
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                if item.optional_vars is not None and any(
                    isinstance(n, ast.Name) and n.id == name for n in ast.walk(item.optional_vars)
                ):
                    return False
        elif isinstance(node, ast.ExceptHandler) and node.name == name:
            return False
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any((alias.asname or alias.name.split(".")[0]) == name for alias in node.names):
                return False
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return False
        elif isinstance(node, ast.Delete) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return False
    return True


def _is_none(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _stores_none(target: ast.expr, value: ast.expr, name: str) -> bool:
    """Whether ``target = value`` stores None in ``name`` wherever it stores into it."""
    if isinstance(target, ast.Name):
        return target.id != name or _is_none(value)
    if isinstance(target, (ast.Tuple, ast.List)):
        if not any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(target)):
            return True
        if not isinstance(value, (ast.Tuple, ast.List)) or len(value.elts) != len(target.elts):
            return False
        return all(_stores_none(t, v, name) for t, v in zip(target.elts, value.elts))
    return not any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(target))


def qualname(tree: ast.Module, function: ast.AST) -> str | None:
    """``f`` for a module-level function, ``C.f`` for a method of a module-level class."""
    for statement in tree.body:
        if statement is function and isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return function.name
        if isinstance(statement, ast.ClassDef):
            if any(member is function for member in statement.body):
                return f"{statement.name}.{function.name}"  # type: ignore[attr-defined]
    return None


@dataclass(frozen=True, eq=False)
class _Definition:
    path: str
    tree: ast.Module
    function: Function
    method: bool


def none_only(
    trees: Mapping[str, ast.Module], spelled: Callable[[str], list[tuple[str, ast.Module]] | None]
) -> dict[str, set[tuple[str, str]]]:
    """Per module path: the (function qualname, name) pairs that only ever hold None once the Apex
    fallbacks go: the fallbacks' amp names (``("main", "amp")``) and the parameters every call gives
    only those, None, or nothing (``("train_one_epoch", "amp")``). ``trees`` are the modules to look
    for fallbacks in; ``spelled(word)`` gives (path, tree) for every project file that spells
    ``word`` (None where the project could not be read whole)."""
    result: dict[str, set[tuple[str, str]]] = {}
    holds: dict[int, set[str]] = {}  # function (or module) node id -> the names that hold only None there
    holders: list[tuple[ast.AST, str]] = []
    for path, tree in trees.items():
        for fallback in fallbacks(tree):
            owner = qualname(tree, fallback.scope)
            for name in sorted(fallback.names):
                if owner is None or not none_bindings_only(fallback.scope, name, fallback.choice.orelse):
                    continue
                holds.setdefault(id(fallback.scope), set()).add(name)
                result.setdefault(path, set()).add((owner, name))
                holders.append((fallback.scope, name))
    read: dict[str, list[tuple[str, ast.Module]] | None] = {}
    changed = bool(holders)
    while changed:  # a parameter may hold only None once the callers' own parameters are known to
        changed = False
        for scope, name in list(holders):
            for callee in _callees_given(scope, name):
                if callee not in read:
                    found = spelled(callee)  # the modules already parsed keep their trees (holds is by node)
                    read[callee] = None if found is None else [(p, trees.get(p, t)) for p, t in found]
                spelling = read[callee]
                if spelling is None:
                    continue
                for definition in _definitions(spelling, callee):
                    for parameter in _parameters(definition.function):
                        if parameter.arg in holds.get(id(definition.function), ()):
                            continue
                        owner = qualname(definition.tree, definition.function)
                        if owner is None or not _holds_none(definition, parameter.arg, spelling, holds):
                            continue
                        holds.setdefault(id(definition.function), set()).add(parameter.arg)
                        result.setdefault(definition.path, set()).add((owner, parameter.arg))
                        holders.append((definition.function, parameter.arg))
                        changed = True
    return result


def _callees_given(scope: ast.AST, name: str) -> list[str]:
    """The names of the functions ``scope`` calls with ``name`` as an argument (``f`` of ``x.f(...)``)."""
    found = []
    for node in own_nodes(scope):
        if not isinstance(node, ast.Call):
            continue
        given = [*node.args, *(k.value for k in node.keywords)]
        if any(isinstance(value, ast.Name) and value.id == name for value in given):
            callee = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
            if callee is not None and callee not in found:
                found.append(callee)
    return found


def _definitions(trees: list[tuple[str, ast.Module]], name: str) -> Iterator[_Definition]:
    for path, tree in trees:
        for statement in tree.body:
            if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)) and statement.name == name:
                yield _Definition(path, tree, statement, False)
            elif isinstance(statement, ast.ClassDef):
                for member in statement.body:
                    if isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef)) and member.name == name:
                        yield _Definition(path, tree, member, True)


def _holds_none(
    definition: _Definition, parameter: str, spelling: list[tuple[str, ast.Module]], holds: dict[int, set[str]]
) -> bool:
    """Whether every use of the function's name in the project is a call that gives ``parameter``
    None, a name that holds only None where it is, or nothing (its default being None)."""
    if not none_bindings_only(definition.function, parameter, [], parameter=True):
        return False  # the body sets it to something else (`amp = amp or get_amp()`)
    given = _given(definition, parameter, spelling)
    if given is None or not given:
        return False
    default = _defaults(definition).get(parameter)
    return all(
        (
            _is_none(default)
            if value is None
            else _is_none(value) or (isinstance(value, ast.Name) and value.id in holds.get(id(scope), ()))
        )
        for scope, value in given
    )


def holds_default(definition: _Definition, parameter: str, spelling: list[tuple[str, ast.Module]]) -> bool:
    """Whether ``parameter`` of the function has a default that every use of the function's name in
    the project leaves it at (each a call that gives it nothing), and the body never rebinds it."""
    if parameter not in _defaults(definition) or not none_bindings_only(
        definition.function, parameter, [], parameter=True
    ):
        return False
    given = _given(definition, parameter, spelling)
    return given is not None and bool(given) and all(value is None for _, value in given)


def _defaults(definition: _Definition) -> dict[str, ast.expr]:
    arguments = definition.function.args
    positional = [a.arg for a in [*arguments.posonlyargs, *arguments.args]]
    defaults = dict(zip(reversed(positional), reversed(arguments.defaults)))
    defaults.update({a.arg: d for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults) if d is not None})
    return defaults


def _given(
    definition: _Definition, parameter: str, spelling: list[tuple[str, ast.Module]]
) -> list[tuple[ast.AST, ast.expr | None]] | None:
    """What each call of the function in the project gives ``parameter`` (None: nothing), with the
    scope of the call; None where some use of its name is no call that can be read so (the function
    passed as a value, imported under another name, called with ``*args``), [] where none calls it."""
    function = definition.function
    arguments = function.args
    if arguments.vararg is not None or arguments.kwarg is not None:
        return None
    positional = [a.arg for a in [*arguments.posonlyargs, *arguments.args]]
    if definition.method:
        if any(isinstance(d, ast.Name) and d.id in ("staticmethod", "classmethod") for d in function.decorator_list):
            return None
        positional = positional[1:]
    if parameter not in positional and parameter not in [a.arg for a in arguments.kwonlyargs]:
        return None
    name = function.name
    found: list[tuple[ast.AST, ast.expr | None]] = []
    for _, tree in spelling:
        # a bare `f(...)` in a module that defines its own `f` calls that one
        own = tree is not definition.tree or definition.method
        own = own and any(isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and s.name == name for s in tree.body)
        for scope, node, parent in _uses(tree, name):
            if own and isinstance(node, ast.Name):
                continue
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue  # a definition of that name
            if isinstance(node, ast.alias):
                if node.asname not in (None, name):
                    return None  # imported under another name: its calls are not seen
                continue
            if not (isinstance(parent, ast.Call) and parent.func is node):
                return None  # the function used as a value: who knows what it is given
            call = parent
            if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
                return None
            value: ast.expr | None = next((k.value for k in call.keywords if k.arg == parameter), None)
            index = positional.index(parameter) if parameter in positional else len(call.args)
            # a method called through its class (`C.f(obj, ...)`) takes one more positional argument
            if definition.method and index - 1 < len(call.args) and value is None:
                return None
            if value is None and index < len(call.args):
                value = call.args[index]
            found.append((scope, value))
    return found


def _uses(tree: ast.Module, name: str) -> Iterator[tuple[ast.AST, ast.AST, ast.AST | None]]:
    """Every node of ``tree`` that spells ``name`` (a Name, an attribute, an imported alias, a
    definition), with the function (or module) whose code holds it and its parent."""

    def visit(
        node: ast.AST, scope: ast.AST, parent: ast.AST | None
    ) -> Iterator[tuple[ast.AST, ast.AST, ast.AST | None]]:
        if (
            (isinstance(node, ast.Name) and node.id == name)
            or (isinstance(node, ast.Attribute) and node.attr == name)
            or (isinstance(node, ast.alias) and (node.asname or node.name.split(".")[-1]) == name)
            or (isinstance(node, ast.alias) and node.name.split(".")[-1] == name)
            or (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name)
            or (isinstance(node, ast.keyword) and node.arg == name)
        ):
            if not isinstance(node, ast.keyword):
                yield scope, node, parent
        inner = node if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) else scope
        for child in ast.iter_child_nodes(node):
            yield from visit(child, inner, node)

    yield from visit(tree, tree, None)


def defaults_held(
    path: str,
    tree: ast.Module,
    wanted: list[tuple[str, str]],
    spelled: Callable[[str], list[tuple[str, ast.Module]] | None],
) -> set[tuple[str, str]]:
    """Of the (top-level function, parameter) pairs ``wanted`` of the module ``tree`` at ``path``, those
    every call in the project leaves at the parameter's default (``holds_default``)."""
    found: set[tuple[str, str]] = set()
    for function, parameter in wanted:
        spelling = spelled(function)
        if spelling is None:
            continue
        if not any(other == path for other, _ in spelling):
            spelling = [(path, tree), *spelling]
        spelling = [(other, tree if other == path else parsed) for other, parsed in spelling]
        definitions = [d for d in _definitions(spelling, function) if d.path == path and not d.method]
        if len(definitions) == 1 and holds_default(definitions[0], parameter, spelling):
            found.add((function, parameter))
    return found
