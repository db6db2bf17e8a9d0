"""Code for a migrated module, reusing the input text of the statements left untouched.

Applying the plan keeps every top-level statement it does not edit as the very same
node object. The text of such a statement is already in the input: Python's own parser
says on which line each top-level statement starts, the libcst node says how many comment
and blank lines it owns above that, and top-level statements always start a line. Only
the edited statements are generated again. Every boundary is cross-checked against the
module's header and footer; when anything does not add up, the whole module is generated
as usual, so the result is always exactly libcst's.
"""

from __future__ import annotations

import ast
import re

import libcst as cst

from migrate import pytree

_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


def _first_line(tree_statement: ast.stmt) -> int:
    decorators = getattr(tree_statement, "decorator_list", None)
    return min(d.lineno for d in decorators) if decorators else tree_statement.lineno


def _starts(original: cst.Module, source: str, lines: list[str]) -> list[int] | None:
    """0-based index of the first line of each top-level statement's text, or None."""
    try:
        tree = pytree.parse(source).body  # the engine's tree, not a second parse
    except (SyntaxError, ValueError, RecursionError):
        return None
    starts: list[int] = []
    position = 0
    for statement in original.body:
        if position >= len(tree):
            return None
        leading = len(statement.leading_lines)
        starts.append(_first_line(tree[position]) - 1 - leading)
        position += len(statement.body) if isinstance(statement, cst.SimpleStatementLine) else 1
    if position != len(tree):
        return None
    if starts and starts[0] != len(original.header):
        return None
    if any(later <= earlier for earlier, later in zip(starts, starts[1:])):
        return None
    if original.body and len(lines) - len(original.footer) <= starts[-1]:
        return None
    return starts


def render(original: cst.Module, updated: cst.Module, source: str) -> str:
    """``updated.code``, taking unchanged top-level statements from ``source``."""
    if updated.header is not original.header and updated.header != original.header:
        return updated.code
    lines = _LINE.findall(source)
    starts = _starts(original, source, lines)
    if starts is None or not original.body:
        return updated.code
    ends = [*starts[1:], len(lines) - len(original.footer)]
    text_of = {id(node): (start, end) for node, start, end in zip(original.body, starts, ends)}
    kept = sum(1 for node in updated.body if id(node) in text_of)
    if kept == 0:
        return updated.code
    pieces = ["".join(lines[: starts[0]])] if tuple(updated.header) == tuple(original.header) else None
    if pieces is None:
        return updated.code
    generator = cst.Module(body=[], default_indent=updated.default_indent, default_newline=updated.default_newline)
    for node in updated.body:
        span = text_of.get(id(node))
        if span is not None:
            pieces.append("".join(lines[span[0] : span[1]]))
        else:
            pieces.append(generator.code_for_node(node))
    if tuple(updated.footer) == tuple(original.footer):
        pieces.append("".join(lines[ends[-1] :]))
    else:
        pieces.append(generator.with_changes(body=[], footer=updated.footer).code)
    return "".join(pieces)
