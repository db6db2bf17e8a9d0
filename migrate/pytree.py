"""Python's own syntax tree of the module being migrated, parsed once per file.

The engine parses the input with ``ast`` first (its syntax check) and the rules read
the same tree (where top-level statements start), so the text is handed to Python's
parser once, not once per reader. Only the latest text's tree is kept, and the engine
forgets it when the file is done.
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Iterator

_latest: tuple[str, ast.Module] | None = None


def parse(source: str) -> ast.Module:
    """``ast.parse(source)``, reusing the tree when this very text was parsed last."""
    global _latest
    if _latest is not None and _latest[0] is source:
        return _latest[1]
    tree = ast.parse(source)
    _latest = (source, tree)
    return tree


def keep(source: str, tree: ast.Module) -> None:
    """Make ``tree``, parsed from this very ``source`` earlier, the kept tree."""
    global _latest
    _latest = (source, tree)


def forget() -> None:
    """Drop the kept tree (a large module's tree is worth freeing between files)."""
    global _latest
    _latest = None


def own_nodes(scope: ast.AST) -> Iterator[ast.AST]:
    """The nodes of ``scope``'s own code (a function's, or the module's), breadth first: not
    those of the functions, classes and lambdas it defines, which run at another time."""
    pending = deque(ast.iter_child_nodes(scope))
    while pending:
        node = pending.popleft()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            pending.extend(ast.iter_child_nodes(node))


def dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a chain of Names and Attributes, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None
