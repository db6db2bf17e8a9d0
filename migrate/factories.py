"""Project mode: functions that call ``amp.initialize`` and return what it set up.

``setup(model, optimizer, device, fp16, opt_level)`` in ``utils.py`` calls
``amp.initialize`` under ``if fp16:`` and returns the model and optimizer; a trainer in
another module calls it and scales its losses with amp. The GradScaler belongs where the
call returns, so ``read_factory`` reads what the function does with its arguments: the
trainer is then migrated as if the function's own ``amp.initialize`` followed the call,
spelled with the caller's arguments (``migrate.rules._factory_calls``), and the function
loses its call without a scaler of its own.

Only a shape whose meaning does not depend on where it runs is read: one call, reached
through ``if`` tests alone, whose arguments and tests read nothing but the function's
parameters (never reassigned), and whose model and optimizer every ``return`` hands back
at the same places. This module only reads source text; it never imports libcst or torch.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from migrate.amp_api_names import CASTING
from migrate.options import FactorySetup

_CONSTANTS = frozenset({"True", "False", "None"})


def read_factory(source: str, function: str, name: str) -> FactorySetup | None:
    """What the top-level ``function`` of ``source`` does with amp, as callers spelling it
    ``name`` see it; None when its shape is not one a caller can take over."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    definitions = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function]
    if len(definitions) != 1:
        return None
    definition = definitions[0]
    amp = _amp_names(tree)
    calls = [
        node
        for node in _own_nodes(definition)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and ast.unparse(node.func.value) in amp
    ]
    setups = [call for call in calls if call.func.attr == "initialize"]  # type: ignore[attr-defined]
    if not setups or any(c.func.attr not in CASTING for c in calls if c not in setups):  # type: ignore[attr-defined]
        return None
    placed = [_statement_and_tests(definition.body, setup) for setup in setups]
    if any(found is None for found in placed):
        return None
    # beside the one that sets up training, calls reached only where the optimizer is None
    # (inference: Apex only cast the models, and returned them) go with the function's own call
    training = [
        (setup, found) for setup, found in zip(setups, placed) if found is not None and not _inference(setup, found[1])
    ]
    if len(training) != 1:
        return None
    call, (statement, tests) = training[0]
    parameters = _parameters(definition, source)
    if parameters is None:
        return None
    names, defaults = parameters
    targets = _pair(statement.targets[0]) if len(statement.targets) == 1 else None
    models, optimizers = _initialize_pair(call)
    if targets is None or (models, optimizers) != targets:
        return None
    assert models is not None and optimizers is not None
    returned = _returned(definition, models, optimizers, max(found[0].lineno for found in placed if found))
    if returned is None:
        return None
    stored = _stored(definition)
    # amp.initialize returns the objects it was given: its assignment back to the names it was
    # given (`model, optimizer = amp.initialize(model, optimizer)`) rebinds nothing
    setup_lines = {found[0].lineno for found in placed if found is not None and _assigns_back(found[0])}
    readable = {name for name in names if all(line in setup_lines for line in stored.get(name, []))}
    others = list(call.args[2:]) + [kw.value for kw in call.keywords if kw.arg not in ("models", "optimizers")]
    if any(_reads_other(node, readable) for node in [*others, *(test for test, _ in tests)]):
        return None
    if any(line > statement.lineno for line in stored.get(optimizers, [])):
        return None  # the optimizer it returns is not the one amp.initialize gave back
    text = ast.get_source_segment(source, call)
    if text is None:
        return None
    return FactorySetup(
        name=name,
        parameters=tuple(names),
        defaults=tuple(defaults),
        call=text,
        models=models,
        optimizers=optimizers,
        guard=" and ".join(_test_text(source, test, holds) for test, holds in tests) or None,
        returned=returned,
    )


def _inference(call: ast.Call, tests: list[tuple[ast.expr, bool]]) -> bool:
    """Whether ``call`` gets no optimizer: none, a literal None, or a name that a test on the
    way to it finds None (``if optimizer is None:``, or the else of ``is not None``)."""
    given = (
        call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "optimizers"), None)
    )
    if given is None or (isinstance(given, ast.Constant) and given.value is None):
        return True
    if not isinstance(given, ast.Name):
        return False
    for test, holds in tests:
        if (
            isinstance(test, ast.Compare)
            and len(test.ops) == 1
            and isinstance(test.left, ast.Name)
            and test.left.id == given.id
            and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value is None
            and isinstance(test.ops[0], ast.Is if holds else ast.IsNot)
        ):
            return True
    return False


def _assigns_back(statement: ast.Assign) -> bool:
    """Whether the amp.initialize ``statement`` assigns its results to the very names it was
    given (``model, optimizer = amp.initialize(model, optimizer)``, ``model = amp.initialize(model)``,
    ``[a, b] = amp.initialize([a, b])``)."""
    call = statement.value
    if len(statement.targets) != 1 or not isinstance(call, ast.Call):
        return False
    given = [*call.args[:2], *(k.value for k in call.keywords if k.arg in ("models", "optimizers"))]

    def spelled(node: ast.expr) -> str:
        return ast.dump(node, annotate_fields=False).replace("Store()", "Load()")

    target = statement.targets[0]
    values = [spelled(v) for v in given if not (isinstance(v, ast.Constant) and v.value is None)]
    if isinstance(target, (ast.Tuple, ast.List)) and len(target.elts) == len(values):
        return [spelled(e) for e in target.elts] == values
    return len(values) == 1 and spelled(target) == values[0]


def _stored(definition: ast.FunctionDef) -> dict[str, list[int]]:
    """The names the function binds, each with the lines it binds it on."""
    stores: dict[str, list[int]] = {}
    for node in _own_nodes(definition):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            stores.setdefault(node.id, []).append(node.lineno)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            for name in node.names:
                stores.setdefault(name, []).append(node.lineno)
        elif isinstance(node, ast.alias):
            stores.setdefault((node.asname or node.name).split(".")[0], []).append(getattr(node, "lineno", 0))
    return stores


def _own_nodes(definition: ast.FunctionDef) -> Iterator[ast.AST]:
    """The nodes of ``definition``'s body, not those of functions, lambdas or classes in it."""
    pending: list[ast.AST] = list(definition.body)
    while pending:
        node = pending.pop()
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        pending.extend(ast.iter_child_nodes(node))


def _amp_names(tree: ast.Module) -> set[str]:
    """How the module (anywhere in it) spells the Apex amp module."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "apex" and node.level == 0:
            names.update(alias.asname or alias.name for alias in node.names if alias.name == "amp")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "apex.amp":
                    names.add(alias.asname or "apex.amp")
                elif alias.name == "apex":
                    names.add(f"{alias.asname or 'apex'}.amp")
    return names


def _statement_and_tests(body: list[ast.stmt], call: ast.Call) -> tuple[ast.Assign, list[tuple[ast.expr, bool]]] | None:
    """The plain assignment whose value is ``call``, and the ``if`` tests on the way to it
    (True: in the body, False: in the else); None when anything but ``if`` leads there."""
    for statement in body:
        if isinstance(statement, ast.Assign) and statement.value is call:
            return statement, []
        if isinstance(statement, ast.If):
            for branch, holds in ((statement.body, True), (statement.orelse, False)):
                found = _statement_and_tests(branch, call)
                if found is not None:
                    return found[0], [(statement.test, holds), *found[1]]
        elif any(node is call for node in ast.walk(statement)):
            return None
    return None


def _parameters(definition: ast.FunctionDef, source: str) -> tuple[list[str], list[tuple[str, str]]] | None:
    """Its parameter names in order and the literal defaults; None with ``*args``/``**kwargs``
    or a default that is no literal (a name of its module means nothing where the caller is)."""
    arguments = definition.args
    if arguments.vararg is not None or arguments.kwarg is not None:
        return None
    positional = [*arguments.posonlyargs, *arguments.args]
    names = [a.arg for a in positional] + [a.arg for a in arguments.kwonlyargs]
    pairs = list(zip(positional[len(positional) - len(arguments.defaults) :], arguments.defaults))
    pairs += [(a, d) for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults) if d is not None]
    defaults = []
    for argument, default in pairs:
        try:
            ast.literal_eval(default)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return None
        text = ast.get_source_segment(source, default)
        if text is None or "\n" in text:
            return None
        defaults.append((argument.arg, text))
    return names, defaults


def _pair(target: ast.expr) -> tuple[str | None, str | None] | None:
    if isinstance(target, (ast.Tuple, ast.List)) and len(target.elts) == 2:
        first, second = target.elts
        if isinstance(first, ast.Name) and isinstance(second, ast.Name):
            return first.id, second.id
    return None


def _initialize_pair(call: ast.Call) -> tuple[str | None, str | None]:
    """The names passed as amp.initialize's models and optimizers (None where not a name)."""
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return None, None
    given: dict[str, ast.expr] = dict(zip(("models", "optimizers"), call.args))
    given.update({k.arg: k.value for k in call.keywords if k.arg in ("models", "optimizers")})  # type: ignore[misc]
    models, optimizers = given.get("models"), given.get("optimizers")
    return (
        models.id if isinstance(models, ast.Name) else None,
        optimizers.id if isinstance(optimizers, ast.Name) else None,
    )


def _returned(definition: ast.FunctionDef, models: str, optimizers: str, after: int) -> tuple[int, int, int] | None:
    """(how many values, where the models are, where the optimizers are) in every ``return``
    of the function; None when they differ, or when one comes before the call."""
    shapes = set()
    for node in _own_nodes(definition):
        if isinstance(node, (ast.Yield, ast.YieldFrom)):
            return None
        if not isinstance(node, ast.Return):
            continue
        values = node.value
        if node.lineno < after or not isinstance(values, ast.Tuple):
            return None
        names = [v.id if isinstance(v, ast.Name) else None for v in values.elts]
        if names.count(models) != 1 or names.count(optimizers) != 1:
            return None
        shapes.add((len(names), names.index(models), names.index(optimizers)))
    return next(iter(shapes)) if len(shapes) == 1 else None


def _reads_other(node: ast.expr, readable: set[str]) -> bool:
    """Whether ``node`` reads a name other than ``readable`` ones and constants, or calls anything
    (the caller evaluates it again after the call, where only the arguments mean the same)."""
    for inner in ast.walk(node):
        if isinstance(inner, (ast.Call, ast.NamedExpr, ast.Lambda, ast.Await, ast.Yield, ast.YieldFrom)):
            return True
        if isinstance(inner, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            return True
        if isinstance(inner, ast.Name) and inner.id not in readable and inner.id not in _CONSTANTS:
            return True
    return False


def _test_text(source: str, test: ast.expr, holds: bool) -> str:
    text = ast.get_source_segment(source, test) or ""
    text = ast.unparse(test) if "\n" in text or not text else text
    simple = isinstance(test, (ast.Name, ast.Attribute, ast.Subscript, ast.Constant))
    if holds:
        return text if simple or isinstance(test, (ast.Compare, ast.UnaryOp)) else f"({text})"
    return f"not {text}" if simple else f"not ({text})"


def inference_calls(source: str, setup: FactorySetup, function: str) -> list[int] | None:
    """The lines where a module out of the run calls ``function`` without an optimizer (a
    literal None for it: inference, which amp.initialize only cast); None when the module uses
    the name in any other way, or does not parse (it may train with what the function set up)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if setup.optimizers not in setup.parameters:
        return None  # the function makes the optimizer: every caller trains
    position = setup.parameters.index(setup.optimizers)
    defaults = dict(setup.defaults)
    calls = {id(node.func): node for node in ast.walk(tree) if isinstance(node, ast.Call)}
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        named = (isinstance(node, ast.Name) and node.id == function) or (
            isinstance(node, ast.Attribute) and node.attr == function
        )
        if isinstance(node, ast.FunctionDef) and node.name == function:
            return None
        if not named:
            continue
        call = calls.get(id(node))
        if (
            call is None
            or any(isinstance(a, ast.Starred) for a in call.args)
            or any(k.arg is None for k in call.keywords)
        ):
            return None
        given = call.args[position] if position < len(call.args) else None
        given = next((k.value for k in call.keywords if k.arg == setup.optimizers), given)
        if given is None and defaults.get(setup.optimizers) != "None":
            return None
        if given is not None and not (isinstance(given, ast.Constant) and given.value is None):
            return None
        lines.append(call.lineno)
    return sorted(lines)
