"""Code for a migrated module, reusing the input text of the statements left untouched.

Applying the plan keeps every top-level statement it does not edit as the very same
node object. The text of such a statement is already in the input: Python's own parser
says on which line each top-level statement starts, the libcst node says how many comment
and blank lines it owns above that, and top-level statements always start a line. Only
the edited statements are generated again, and within them, the statements of their blocks
that were left untouched (but for the last of a block, whose text's end only codegen knows)
come from the input too, where they keep their indentation. Every boundary is cross-checked
against the module's header and footer; when anything does not add up, the whole module is
generated as usual, so the result is always exactly libcst's.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import libcst as cst
from libcst._nodes.internal import CodegenState

from migrate import pytree
from migrate.rules._plan import Statement
from migrate.rules._positions import TreesDisagree, statement_blocks

_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


def _first_line(tree_statement: ast.stmt) -> int:
    decorators = getattr(tree_statement, "decorator_list", None)
    return min(d.lineno for d in decorators) if decorators else tree_statement.lineno


def _no_validation(node: cst.CSTNode) -> None:
    pass


@contextmanager
def nodes_unvalidated() -> Iterator[None]:
    """Build nodes without libcst's per-node validation (``CSTNode.__post_init__`` calls
    ``_validate``): for nodes that hold tokens of a text Python accepted, which libcst's
    codegen writes back as they were (the parser's, a fifth of a parse; copies of them with
    other statements in their blocks). Nodes the rules build are validated as usual."""
    base = cst.CSTNode
    validating = base.__dict__.get("__post_init__")
    if validating is None:  # a libcst that validates elsewhere: build nodes as it does
        yield
        return
    base.__post_init__ = _no_validation  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        base.__post_init__ = validating  # type: ignore[method-assign]


@dataclass(frozen=True)
class _Kept(cst.BaseStatement):
    """A statement left as it was, standing in for it in the code of an edited statement: its
    text from the input where it sits at the input's indentation, else its code."""

    node: cst.BaseStatement
    text: str
    indent: str

    def _visit_and_replace_children(self, visitor: Any) -> cst.CSTNode:  # never visited
        raise NotImplementedError

    def _codegen_impl(self, state: CodegenState) -> None:
        if "".join(state.indent_tokens) == self.indent:
            state.add_token(self.text)
        else:
            self.node._codegen(state)


def _kept_texts(original: cst.Module, tree: list[ast.stmt], lines: list[str]) -> dict[cst.CSTNode, tuple[str, str]]:
    """The input text and indentation of every statement of a nested block but its last: from
    the line its leading comment lines start on to where the next statement's do."""
    try:
        blocks = statement_blocks(original, tree)
    except TreesDisagree:
        return {}
    texts: dict[cst.CSTNode, tuple[str, str]] = {}
    for indent, paired in blocks:
        if not indent:
            continue  # the module's own statements: render() takes them whole
        for (statement, node), (following, next_node) in zip(paired, paired[1:]):
            if not isinstance(statement, Statement) or not isinstance(following, Statement):
                return {}
            start = _first_line(node) - 1 - len(statement.leading_lines)
            end = _first_line(next_node) - 1 - len(following.leading_lines)
            if not 0 <= start < end <= len(lines):
                return {}
            texts[statement] = ("".join(lines[start:end]), indent)
    return texts


def _with_kept(statement: cst.CSTNode, texts: dict[cst.CSTNode, tuple[str, str]]) -> cst.CSTNode:
    """``statement`` with the statements of its blocks that have input text as ``_Kept``."""
    changes: dict[str, object] = {}
    for name in ("body", "orelse", "handlers", "finalbody", "cases"):
        value = getattr(statement, name, None)
        if isinstance(value, cst.IndentedBlock):
            body = [_Kept(s, *texts[s]) if s in texts else _with_kept(s, texts) for s in value.body]
            if any(new is not old for new, old in zip(body, value.body)):
                changes[name] = value.with_changes(body=body)
        elif isinstance(value, (cst.If, cst.Else, cst.Finally)):
            updated = _with_kept(value, texts)
            if updated is not value:
                changes[name] = updated
        elif isinstance(value, (list, tuple)) and name in ("handlers", "cases"):
            items = [_with_kept(item, texts) for item in value]
            if any(new is not old for new, old in zip(items, value)):
                changes[name] = items
    return statement.with_changes(**changes) if changes else statement


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
    texts: dict[cst.CSTNode, tuple[str, str]] | None = None
    same_defaults = (updated.default_indent, updated.default_newline) == (
        original.default_indent,
        original.default_newline,
    )
    for node in updated.body:
        span = text_of.get(id(node))
        if span is not None:
            pieces.append("".join(lines[span[0] : span[1]]))
            continue
        if same_defaults and isinstance(node, cst.BaseCompoundStatement):
            if texts is None:
                texts = _kept_texts(original, pytree.parse(source).body, lines)
            with nodes_unvalidated():  # copies of nodes as they were, with _Kept in their blocks
                pieces.append(generator.code_for_node(_with_kept(node, texts)))
            continue
        pieces.append(generator.code_for_node(node))
    if tuple(updated.footer) == tuple(original.footer):
        pieces.append("".join(lines[ends[-1] :]))
    else:
        pieces.append(generator.with_changes(body=[], footer=updated.footer).code)
    return "".join(pieces)
