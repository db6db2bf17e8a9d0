"""Project mode: functions whose only results are the Apex amp module or None, and their callers.

``def get_amp(fp16): if fp16: from apex import amp ... else: amp = None; return amp`` (Microsoft's
nlp-recipes ``utils_nlp/common/pytorch_utils.py``) hands the amp module out of the function that
imports it. ampmigrate does not follow it there, so the setups of its callers stay as they were;
this module reads where the result goes, so that the findings say which caller keeps what and
why (the factory's ``return``, AMP030; each call through the result, AMP026) instead of a guess.

Only a shape whose results are plain is read: a top-level function whose every ``return`` gives
one name, bound in it only by an Apex import of amp and by ``= None``. No libcst, no torch.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from migrate.pytree import own_nodes

Function = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass(frozen=True)
class Factory:
    """A top-level function that returns the Apex amp module or None."""

    name: str
    line: int
    condition: str | None  # the ``if`` test under which it imports amp (None: none, or several)


@dataclass(frozen=True)
class Result:
    """Where one call of a factory keeps its result: ``holder`` (``amp``, ``self.amp``) in
    ``function`` of ``klass`` (``""`` at module level or outside a class)."""

    klass: str
    function: str
    holder: str
    call: str  # the call as spelled, on one line
    line: int
    top: bool = True  # ``function`` is a top-level function or a method of a top-level class


def factories(tree: ast.Module) -> list[Factory]:
    """The top-level functions of ``tree`` whose every result is the Apex amp module or None."""
    found = []
    for statement in tree.body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
            factory, condition = _returns_amp_or_none(statement)
            if factory:
                found.append(Factory(statement.name, statement.lineno, condition))
    return found


def _returns_amp_or_none(function: Function) -> tuple[bool, str | None]:
    """Whether ``function`` is a factory, and the test under which it imports amp (None: no single test)."""
    nodes = list(own_nodes(function))
    returns = [node for node in nodes if isinstance(node, ast.Return)]
    names = {node.value.id for node in returns if isinstance(node.value, ast.Name)}
    if not returns or len(names) != 1 or any(not isinstance(node.value, ast.Name) for node in returns):
        return False, None
    (name,) = names
    if name in {arg.arg for arg in (*function.args.posonlyargs, *function.args.args, *function.args.kwonlyargs)}:
        return False, None
    imports: list[ast.stmt] = []
    for node in nodes:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            bound = [alias for alias in node.names if (alias.asname or alias.name.partition(".")[0]) == name]
            if not bound:
                continue
            if not all(_imports_amp(node, alias) for alias in bound):
                return False, None
            imports.append(node)
        elif isinstance(node, ast.Name) and node.id == name and not isinstance(node.ctx, ast.Load):
            if not _bound_to_none(nodes, node):
                return False, None
        elif isinstance(node, (ast.Global, ast.Nonlocal)) and name in node.names:
            return False, None
    if not imports:
        return False, None
    tests = {ast.unparse(test) for test in (_enclosing_test(function, statement) for statement in imports) if test}
    return True, (tests.pop() if len(tests) == 1 else None)


def _imports_amp(node: ast.Import | ast.ImportFrom, alias: ast.alias) -> bool:
    if isinstance(node, ast.ImportFrom):
        return node.level == 0 and node.module == "apex" and alias.name == "amp"
    return alias.name == "apex.amp" and alias.asname is not None


def _bound_to_none(nodes: list[ast.AST], name: ast.Name) -> bool:
    """Whether ``name`` is the one target of an ``= None``."""
    for node in nodes:
        if isinstance(node, ast.Assign) and node.targets == [name]:
            return isinstance(node.value, ast.Constant) and node.value.value is None
        if isinstance(node, ast.AnnAssign) and node.target is name:
            return isinstance(node.value, ast.Constant) and node.value.value is None
    return False


def _enclosing_test(function: Function, statement: ast.stmt) -> ast.expr | None:
    """The test of the innermost ``if`` of ``function`` whose body holds ``statement``."""
    found: ast.expr | None = None

    def visit(statements: list[ast.stmt], test: ast.expr | None) -> None:
        nonlocal found
        for child in statements:
            if child is statement:
                found = test
                return
            if isinstance(child, ast.If):
                visit(child.body, child.test)
                visit(child.orelse, test)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            else:
                for field in ("body", "orelse", "finalbody"):
                    visit(getattr(child, field, []), test)
                for handler in getattr(child, "handlers", []):
                    visit(handler.body, test)

    visit(function.body, None)
    return found


def results(tree: ast.Module, name: str) -> Iterator[Result]:
    """Each call of ``name`` (or ``<module>.name``) in ``tree``, in nested functions too; its ``holder``
    is the name or ``self.<attribute>`` a plain assignment binds to its result, ``""`` for any other use."""
    parents: dict[int, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[id(child)] = node
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        if called != name:
            continue
        parent = parents.get(id(node))
        target = (
            parent.targets[0]
            if isinstance(parent, ast.Assign) and len(parent.targets) == 1 and parent.value is node
            else None
        )
        plain = isinstance(target, ast.Name) or (
            isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self"
        )
        function = parents.get(id(node))
        while function is not None and not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = parents.get(id(function))
        klass = parents.get(id(function)) if function is not None else None
        owner = parents.get(id(klass)) if isinstance(klass, ast.ClassDef) else klass
        yield Result(
            klass.name if isinstance(klass, ast.ClassDef) else "",
            function.name if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)) else "",
            ast.unparse(target) if plain and target is not None else "",
            " ".join(ast.unparse(node).split()),
            node.lineno,
            function is None or owner is tree,
        )


def _scopes(tree: ast.Module) -> Iterator[tuple[ast.ClassDef | None, Function | None]]:
    yield None, None
    for statement in tree.body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield None, statement
        elif isinstance(statement, ast.ClassDef):
            for member in statement.body:
                if isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield statement, member


def where_it_goes(tree: ast.Module, result: Result) -> list[str]:
    """What the code around ``result`` does with the amp module besides calling amp on it: each
    ``return`` that hands it on and each call it is passed to, as phrases with their lines."""
    scopes: list[ast.AST] = []
    for klass, function in _scopes(tree) if result.top else ():
        if function is None or (klass.name if klass is not None else "") != result.klass:
            continue
        if result.holder.startswith("self.") and result.klass:
            scopes.append(function)  # every method of the class reads `self.amp`
        elif function.name == result.function:
            scopes.append(function)
    said: list[str] = []
    for scope in scopes:
        for node in own_nodes(scope):
            if isinstance(node, ast.Return) and node.value is not None and _holds(node.value, result.holder):
                owner = scope.name  # type: ignore[attr-defined]
                said.append(f"`{owner}` returns it on (line {node.lineno})")
            elif isinstance(node, ast.Call):
                given = [*node.args, *(keyword.value for keyword in node.keywords)]
                if any(ast.unparse(value) == result.holder for value in given):
                    callee = " ".join(ast.unparse(node.func).split())
                    said.append(f"it is passed to `{callee}(...)` (line {node.lineno})")
    return list(dict.fromkeys(said))


def _holds(value: ast.expr, holder: str) -> bool:
    if isinstance(value, ast.Tuple):
        return any(ast.unparse(element) == holder for element in value.elts)
    return ast.unparse(value) == holder


def _imports_it(tree: ast.Module, name: str, stem: str) -> bool:
    """Whether ``tree`` imports ``name`` (or the module ``stem`` it is defined in) from the project."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = (node.module or "").rpartition(".")[2]
            if any(alias.name == name for alias in node.names) and module == stem:
                return True
            if any(alias.name == stem for alias in node.names):
                return True
        elif isinstance(node, ast.Import) and any(alias.name.rpartition(".")[2] == stem for alias in node.names):
            return True
    return False


def describe_callers(
    trees: Iterable[tuple[str, ast.Module]], factory: Factory, display: Callable[[str], str], home: str = ""
) -> tuple[str, list[tuple[str, Result]]]:
    """A phrase naming where each call of ``factory`` (defined in the file ``home``) in ``trees`` keeps
    the amp module and what happens to it there, and the calls themselves with their paths. A file
    counts where it is ``home`` or imports the function or its module (``home`` empty: every file)."""
    stem = os.path.splitext(os.path.basename(home))[0]
    if stem == "__init__":
        stem = os.path.basename(os.path.dirname(home))
    phrases: list[str] = []
    found: list[tuple[str, Result]] = []
    for path, tree in trees:
        if home and os.path.abspath(path) != os.path.abspath(home) and not _imports_it(tree, factory.name, stem):
            continue
        for result in results(tree, factory.name):
            found.append((path, result))
            owner = f"{result.klass}.{result.function}" if result.klass else result.function
            inside = f" (in `{owner}`)" if owner else ""
            if not result.holder:
                phrases.append(f"{display(path)}:{result.line} uses `{result.call}` as a value{inside}")
                continue
            phrase = f"{display(path)}:{result.line} keeps it in `{result.holder}`{inside}"
            onward = where_it_goes(tree, result)
            if onward:
                phrase += ", where " + ", and ".join(onward)
            phrases.append(phrase)
    return "; ".join(phrases), found
