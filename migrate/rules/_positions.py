"""Where a node sits in the input: 1-based line and column, for findings and skip comments.

This is the one module that relies on a private libcst API: ``OffsetState`` subclasses
``libcst._nodes.internal.CodegenState`` and overrides its hooks (``add_token``,
``before_codegen``, ``after_codegen``, ``record_syntactic_position``), which libcst's own
position provider uses but does not document. libcst's public ``PositionProvider`` would
do the same job several times slower (it runs a metadata pass over the whole module and
splits every token into lines). pyproject.toml pins ``libcst<2`` for this reason: if a new
libcst changes those hooks, only this module has to follow.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator
from contextlib import contextmanager

import libcst as cst
from libcst._nodes.internal import CodegenState

from migrate import pytree


class OffsetState(CodegenState):
    """Code generation that notes where each node starts and ends, as character offsets.

    It follows libcst's own position provider (syntactic positions win over the whole
    extent, so a statement starts after its leading comment lines), but counts characters
    instead of splitting every token into lines.
    """

    def __init__(self, module: cst.Module) -> None:
        super().__init__(default_indent=module.default_indent, default_newline=module.default_newline)
        self.offset = 0
        self.spans: dict[cst.CSTNode, tuple[int, int]] = {}
        self._starts: list[int] = []

    def add_token(self, value: str) -> None:
        self.tokens.append(value)
        self.offset += len(value)

    def add_indent_tokens(self) -> None:
        for token in self.indent_tokens:
            self.add_token(token)

    def before_codegen(self, node: cst.CSTNode) -> None:
        self._starts.append(self.offset)

    def after_codegen(self, node: cst.CSTNode) -> None:
        start = self._starts.pop()
        self.spans.setdefault(node, (start, self.offset))

    @contextmanager
    def record_syntactic_position(
        self, node: cst.CSTNode, *, start_node: cst.CSTNode | None = None, end_node: cst.CSTNode | None = None
    ) -> Iterator[None]:
        start = self.offset
        try:
            yield
        finally:
            end = self.offset
            if start_node is not None:
                start = self.spans[start_node][0]
            if end_node is not None:
                end = self.spans[end_node][1]
            self.spans[node] = (start, end)


def _spans(module: cst.Module, node: cst.CSTNode) -> tuple[dict[cst.CSTNode, tuple[int, int]], str]:
    """Offsets of every node under ``node`` (generated alone), and its code."""
    state = OffsetState(module)
    node._codegen(state)
    return state.spans, "".join(state.tokens)


class Positions:
    """Lines and columns of the nodes of one parsed module in its input text."""

    def __init__(self, module: cst.Module, source: str) -> None:
        self.module = module
        self.source = source
        self._whole: dict[cst.CSTNode, tuple[int, int]] | None = None
        self._line_starts: list[int] = []
        self._first_lines: dict[cst.CSTNode, int] | None = None
        self._statement_offsets: dict[cst.CSTNode, tuple[dict[cst.CSTNode, tuple[int, int]], str]] = {}

    def locate(self, node: cst.CSTNode, top: cst.CSTNode) -> tuple[int, int, int]:
        """1-based start line, start column and end line of ``node`` in the input.

        ``top`` is the top-level statement holding ``node``. Only that statement is
        generated again (with offsets); Python's own parser says on which line it starts.
        Findings are rare and local, so this costs a fraction of a whole-module pass.
        """
        first_lines = self._top_level_lines()
        if top not in first_lines:
            return self._locate_in_module(node)
        known = self._statement_offsets.get(top)
        if known is None:
            known = self._statement_offsets[top] = _spans(self.module, top)
        spans, code = known
        # the line the statement's own code (leading comment lines included) starts on
        origin = first_lines[top] - code.count("\n", 0, spans[top][0])
        start, end = spans[node]
        column = start - (code.rfind("\n", 0, start) + 1) + 1
        return origin + code.count("\n", 0, start), column, origin + code.count("\n", 0, max(start, end - 1))

    def _top_level_lines(self) -> dict[cst.CSTNode, int]:
        """The line each top-level statement's syntax starts on, from ``ast``."""
        if self._first_lines is None:
            self._first_lines = {}
            try:
                body = pytree.parse(self.source).body  # the engine's tree, not a second parse
            except (SyntaxError, ValueError, RecursionError):
                return self._first_lines
            # libcst starts a decorated definition at `def`/`class`, as ast's lineno does
            lines = [statement.lineno for statement in body]
            index = 0
            for statement in self.module.body:
                if index >= len(lines):
                    self._first_lines = {}
                    break
                self._first_lines[statement] = lines[index]
                index += len(statement.body) if isinstance(statement, cst.SimpleStatementLine) else 1
        return self._first_lines

    def _locate_in_module(self, node: cst.CSTNode) -> tuple[int, int, int]:
        """The same, from a position pass over the whole module (when ``ast`` disagrees)."""
        if self._whole is None:
            self._whole = _spans(self.module, self.module)[0]
            self._line_starts = [0, *(i + 1 for i, char in enumerate(self.source) if char == "\n")]
        start, end = self._whole[node]
        line = bisect_right(self._line_starts, start)
        return line, start - self._line_starts[line - 1] + 1, bisect_right(self._line_starts, max(start, end - 1))
