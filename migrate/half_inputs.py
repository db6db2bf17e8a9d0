"""Inputs cast to float16 by hand on their way to a model (``model(x.half())``).

Under Apex O2/O3 the model's weights are float16, and code that calls it outside the patched
``forward`` (or out of habit) casts its inputs to match. The migration keeps the model in float32
(autocast stands for O2/O3): outside a torch.autocast region such an input meets float32 weights,
a dtype error (``Input type (Half) and weight type (Float)``). ``amp_initialize`` proves some of
these casts can go with the setup (``rules._hand_casts``); this module finds the others, by
name and without proof, so that an O2/O3 setup whose model may receive one stays as it was.

A cast is ``X.half()``, ``X.to(torch.float16)``, ``X.to(dtype=torch.half)``,
``X.type(torch.half)`` or ``X.type(torch.cuda.HalfTensor)``. It reaches a call on a model
``M`` where it sits in an argument of ``M(...)``, ``M.method(...)`` or ``helper(M, ...)``
(inline), or where an assignment stores it in a name (or ``D[key]``, ``D`` a name) that such a
call's arguments mention anywhere in the same function (or at module level).
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from migrate import pytree

_FLOAT16 = frozenset({"torch.float16", "torch.half"})
_HALF_TYPES = _FLOAT16 | {"torch.cuda.HalfTensor", "torch.HalfTensor", "HalfTensor"}

# methods of a module that store what they are given without running the model on it
_NOT_RUN = frozenset(
    {"load_state_dict", "register_buffer", "register_parameter", "add_module", "to", "type", "copy_", "apply"}
)


@dataclass(frozen=True)
class Feed:
    """A cast to float16 whose value reaches a call on a model."""

    line: int
    column: int  # 0-based, as ``ast`` counts
    cast: str  # the cast as written (``x.half()``)
    bare: str  # what it casts (``x``): the code to write instead
    call_line: int  # the call on the model it reaches
    model: str  # the model's name there (a parameter for ``feeders``)
    function: str | None  # the top-level function it sits in; None: elsewhere
    index: int | None = None  # ``feeders``: the model parameter's position (None: keyword-only)


def is_float16_cast(node: ast.AST) -> bool:
    """``X.half()``, ``X.to(torch.float16)``/``X.to(dtype=torch.half)``, ``X.type(torch.half)``."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return False
    method = node.func.attr
    if method == "half":
        return not node.args and not node.keywords
    values = [*node.args, *(k.value for k in node.keywords if k.arg in ("dtype", None))]
    if method == "to":
        return any(pytree.dotted(v) in _FLOAT16 for v in values)
    if method == "type":
        return any(
            pytree.dotted(v) in _HALF_TYPES
            or (isinstance(v, ast.Constant) and isinstance(v.value, str) and v.value.endswith("HalfTensor"))
            for v in values
        )
    return False


def _parents(scope: ast.AST) -> dict[int, ast.AST]:
    parents: dict[int, ast.AST] = {}
    for node in ast.walk(scope):
        for child in ast.iter_child_nodes(node):
            parents[id(child)] = node
    return parents


def _targets(statement: ast.stmt) -> set[str]:
    """The names an assignment stores into: ``x`` for ``x``, ``d`` for ``d[k]``, each of a tuple."""
    if isinstance(statement, ast.Assign):
        targets: list[ast.expr] = list(statement.targets)
    elif isinstance(statement, (ast.AnnAssign, ast.AugAssign)):
        targets = [statement.target]
    else:
        return set()
    names: set[str] = set()
    while targets:
        target = targets.pop()
        if isinstance(target, ast.Name):
            names.add(target.id)
        elif isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
            names.add(target.value.id)
        elif isinstance(target, (ast.Tuple, ast.List)):
            targets.extend(target.elts)
        elif isinstance(target, ast.Starred):
            targets.append(target.value)
    return names


def _arguments(call: ast.Call) -> list[ast.expr]:
    return [*call.args, *(k.value for k in call.keywords)]


def _scope_feeds(
    scope: ast.AST,
    body: list[ast.stmt],
    source: str,
    model_of: Callable[[ast.expr], str | None],
    function: str | None,
) -> Iterator[Feed]:
    """The casts in ``body`` (walked whole, nested definitions aside) whose value reaches a call
    on a model (``model_of`` names the model an expression is, or None)."""
    definitions = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    nodes = [node for statement in body if not isinstance(statement, definitions) for node in _own_walk(statement)]
    parents = _parents(scope)

    def on_model(call: ast.Call) -> str | None:
        """The model ``call`` runs: ``M(...)``, ``M.method(...)``, ``helper(..., M, ...)``."""
        model = model_of(call.func)
        if model is None and isinstance(call.func, ast.Attribute) and call.func.attr not in _NOT_RUN:
            model = model_of(call.func.value)
        if model is None:
            model = next((m for m in map(model_of, _arguments(call)) if m is not None), None)
        return model

    calls = [node for node in nodes if isinstance(node, ast.Call)]
    for cast in calls:
        if not is_float16_cast(cast):
            continue
        assert isinstance(cast.func, ast.Attribute)
        receiver = cast.func.value
        if model_of(receiver) is not None:
            continue  # `model.half()`: the model itself, not its input
        found: list[tuple[ast.Call, str]] = []
        node: ast.AST = cast
        parent = parents.get(id(node))
        while parent is not None and not isinstance(parent, (ast.stmt, ast.Lambda)):
            if _leaves_float16(node, parent, parents):
                break
            if isinstance(parent, ast.Call) and node is not parent.func:
                model = on_model(parent)
                if model is not None:
                    found.append((parent, model))
                    break
            node, parent = parent, parents.get(id(parent))
        if not found and isinstance(parent, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            # (a value cast back, `extractor(x.half()).float()`, breaks out above with a
            # parent that is no assignment)
            carriers = {name for name in _targets(parent) if model_of(ast.Name(id=name)) is None}
            for call in calls:
                model = on_model(call)
                mentioned = {n.id for a in _arguments(call) for n in ast.walk(a) if isinstance(n, ast.Name)}
                if model is not None and mentioned & carriers:
                    found.append((call, model))  # each call it may reach, in source order
        for call, model in found:
            yield Feed(
                line=cast.lineno,
                column=cast.col_offset,
                cast=ast.get_source_segment(source, cast) or "",
                bare=ast.get_source_segment(source, receiver) or "",
                call_line=call.lineno,
                model=model,
                function=function,
            )


# methods whose result is no float16 tensor any more: cast back, or taken to the host as numbers
_LEAVES = frozenset({"float", "double", "numpy", "tolist", "item"})


def _leaves_float16(node: ast.AST, parent: ast.AST, parents: dict[int, ast.AST]) -> bool:
    """Whether ``parent`` takes what ``node`` holds out of float16 (``node.float()``,
    ``node.to(torch.float32)``, ``node.numpy()``)."""
    if not (isinstance(parent, ast.Attribute) and parent.value is node):
        return False
    call = parents.get(id(parent))
    if not (isinstance(call, ast.Call) and call.func is parent):
        return False
    if parent.attr in _LEAVES:
        return True
    values = [*call.args, *(k.value for k in call.keywords if k.arg in ("dtype", None))]
    return parent.attr in ("to", "type") and any(
        pytree.dotted(v) in ("torch.float32", "torch.float", "torch.float64", "torch.double") for v in values
    )


def _own_walk(node: ast.AST) -> Iterator[ast.AST]:
    """``node`` and what is under it, nested functions and classes aside."""
    yield node
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        yield from _own_walk(child)


def _scopes(tree: ast.Module) -> Iterator[tuple[ast.AST, list[ast.stmt], str | None]]:
    """The module's top level, and every function (methods and nested ones too), with the
    top-level function each sits in."""
    yield tree, tree.body, None

    def within(node: ast.AST, top: str | None) -> Iterator[tuple[ast.AST, list[ast.stmt], str | None]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = top if top is not None else (child.name if node is tree else None)
                yield child, child.body, name
                yield from within(child, name)
            else:
                yield from within(child, top)

    yield from within(tree, None)


def feeds(tree: ast.Module, source: str, names: frozenset[str]) -> list[Feed]:
    """The casts anywhere in the module that reach a call on a model named ``names`` (by the
    last part of a dotted name: ``self.model`` is ``model``)."""

    model_of = _model_matcher(names)
    found: list[Feed] = []
    for scope, body, top in _scopes(tree):
        found.extend(_scope_feeds(scope, body, source, model_of, top))
    return sorted(set(found), key=lambda feed: (feed.line, feed.column, feed.call_line))


def feeders(tree: ast.Module, source: str) -> dict[str, list[Feed]]:
    """The top-level functions that hand a parameter (the model they are given) an input cast
    to float16: name -> the casts, with the parameter's position."""
    found: dict[str, list[Feed]] = {}
    for function in tree.body:
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        positional = [a.arg for a in [*function.args.posonlyargs, *function.args.args]]
        parameters = set(positional) | {a.arg for a in function.args.kwonlyargs}

        def model_of(node: ast.expr, parameters: set[str] = parameters) -> str | None:
            return node.id if isinstance(node, ast.Name) and node.id in parameters else None

        casts = [
            Feed(
                feed.line,
                feed.column,
                feed.cast,
                feed.bare,
                feed.call_line,
                feed.model,
                function.name,
                positional.index(feed.model) if feed.model in positional else None,
            )
            for scope, body, _ in [(function, function.body, None)]
            for feed in _scope_feeds(scope, body, source, model_of, function.name)
        ]
        if casts:
            found[function.name] = casts
    return found


def feeders_in(source: str) -> dict[str, list[Feed]]:
    """``feeders`` of a module's text ({} where it does not parse or casts nothing)."""
    if "half" not in source.lower() and "float16" not in source:
        return {}
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return {}
    return feeders(tree, source)


def _model_matcher(names: frozenset[str]) -> Callable[[ast.expr], str | None]:
    """The dotted name of an expression that is a model named ``names`` (by the last part,
    ``.module`` of a DataParallel aside), or None."""

    def model_of(node: ast.expr) -> str | None:
        dotted = pytree.dotted(node)
        parts = (dotted or "").split(".")
        while len(parts) > 1 and parts[-1] == "module":
            parts.pop()  # `model.module`: the model a DataParallel wraps
        return dotted if dotted is not None and parts[-1] in names else None

    return model_of


def _negated_tests(node: ast.AST, parents: dict[int, ast.AST]) -> set[str]:
    """What the ``if``s around ``node`` require false: ``X`` for ``if not X:`` or
    ``if not X and Y:`` holding it in their body (as ``ast.unparse`` spells ``X``)."""
    negated: set[str] = set()
    child, parent = node, parents.get(id(node))
    while parent is not None:
        if isinstance(parent, ast.If) and child in parent.body:
            tests = (
                parent.test.values
                if isinstance(parent.test, ast.BoolOp) and isinstance(parent.test.op, ast.And)
                else [parent.test]
            )
            for test in tests:
                if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
                    negated.add(ast.unparse(test.operand))
        child, parent = parent, parents.get(id(parent))
    return negated


def halvings(
    tree: ast.Module, source: str, names: frozenset[str], exclusive: frozenset[str] = frozenset()
) -> list[Feed]:
    """The casts to float16 of a model named ``names`` itself (``model.half()``,
    ``self.net.module.to(torch.float16)``), anywhere in the module but under an ``if not X``
    where ``X`` is one of ``exclusive`` (the tests guarding the setup: that branch runs without it)."""
    model_of = _model_matcher(names)
    parents = _parents(tree) if exclusive else {}
    found: list[Feed] = []
    for _scope, body, top in _scopes(tree):
        definitions = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
        for statement in body:
            if isinstance(statement, definitions):
                continue
            for node in _own_walk(statement):
                if not is_float16_cast(node):
                    continue
                assert isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                model = model_of(node.func.value)
                if model is None or (exclusive and _negated_tests(node, parents) & exclusive):
                    continue
                found.append(
                    Feed(
                        line=node.lineno,
                        column=node.col_offset,
                        cast=ast.get_source_segment(source, node) or "",
                        bare=ast.get_source_segment(source, node.func.value) or "",
                        call_line=node.lineno,
                        model=model,
                        function=top,
                    )
                )
    return sorted(set(found), key=lambda feed: (feed.line, feed.column))


def parameter_owners(tree: ast.Module) -> frozenset[str]:
    """The names (last part, ``.module`` aside) whose ``.parameters()`` or
    ``.named_parameters()`` the module reads: the models an optimizer is made for."""
    owners: set[str] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("parameters", "named_parameters")
        ):
            parts = (pytree.dotted(node.func.value) or "").split(".")
            while len(parts) > 1 and parts[-1] == "module":
                parts.pop()
            if parts[-1] and parts[-1] != "self":
                owners.add(parts[-1])
    return frozenset(owners)
