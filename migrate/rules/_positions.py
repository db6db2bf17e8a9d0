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

import ast
from bisect import bisect_right
from collections.abc import Iterator, Sequence
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


def _spans(
    module: cst.Module, node: cst.CSTNode, indents: list[str] | None = None
) -> tuple[dict[cst.CSTNode, tuple[int, int]], str]:
    """Offsets of every node under ``node`` (generated alone), and its code. ``indents``: the
    indentation of the blocks around ``node``, outermost first (as the module's codegen has
    them when it reaches ``node``), so that its code is exactly its text in the input."""
    state = OffsetState(module)
    if indents:
        state.indent_tokens.extend(indents)
    node._codegen(state)
    return state.spans, "".join(state.tokens)


# ast statement types that hold the same blocks as a libcst compound statement (see _blocks)
_AST_OF: dict[type, tuple[type, ...]] = {
    cst.FunctionDef: (ast.FunctionDef, ast.AsyncFunctionDef),
    cst.ClassDef: (ast.ClassDef,),
    cst.If: (ast.If,),
    cst.For: (ast.For, ast.AsyncFor),
    cst.While: (ast.While,),
    cst.With: (ast.With, ast.AsyncWith),
    cst.Try: (ast.Try,),
    cst.TryStar: (ast.TryStar,),
    cst.Match: (ast.Match,),
}


# A block of statements as the two trees have it: libcst's statements (None for a suite on
# the header's line, `if x: return`, which holds small statements: nothing to map), ast's
# statements, and the block's own indentation (None: the module's default).
_Pair = tuple[Sequence[cst.BaseStatement] | None, list[ast.stmt], str | None]


def _suite(suite: cst.BaseSuite, trees: list[ast.stmt]) -> _Pair:
    if isinstance(suite, cst.IndentedBlock):
        return suite.body, trees, suite.indent
    return None, trees, None


def _blocks(statement: cst.CSTNode, tree: ast.stmt) -> list[_Pair]:
    """The blocks of a compound statement, paired with ast's; raises TreesDisagree where the two
    trees differ."""
    if not isinstance(tree, _AST_OF.get(type(statement), ())):
        raise TreesDisagree
    pairs: list[_Pair] = []
    if isinstance(statement, (cst.FunctionDef, cst.ClassDef, cst.With)):
        pairs.append(_suite(statement.body, tree.body))  # type: ignore[attr-defined]
    elif isinstance(statement, (cst.If, cst.For, cst.While)):
        branch: cst.If | cst.For | cst.While = statement
        node: ast.stmt = tree
        # `elif` is an If in the orelse of both trees
        while isinstance(branch, cst.If) and isinstance(branch.orelse, cst.If):
            if not (isinstance(node, ast.If) and len(node.orelse) == 1 and isinstance(node.orelse[0], ast.If)):
                raise TreesDisagree
            pairs.append(_suite(branch.body, node.body))
            branch, node = branch.orelse, node.orelse[0]
        assert isinstance(node, (ast.If, ast.For, ast.AsyncFor, ast.While))
        pairs.append(_suite(branch.body, node.body))
        orelse = branch.orelse
        pairs.append(_suite(orelse.body, node.orelse) if isinstance(orelse, cst.Else) else ([], node.orelse, None))
    elif isinstance(statement, (cst.Try, cst.TryStar)):
        assert isinstance(tree, (ast.Try, ast.TryStar))
        if len(statement.handlers) != len(tree.handlers):
            raise TreesDisagree
        pairs.append(_suite(statement.body, tree.body))
        pairs.extend(_suite(h.body, t.body) for h, t in zip(statement.handlers, tree.handlers))  # type: ignore[attr-defined]
        orelse, final = statement.orelse, statement.finalbody
        pairs.append(_suite(orelse.body, tree.orelse) if orelse is not None else ([], tree.orelse, None))
        pairs.append(_suite(final.body, tree.finalbody) if final is not None else ([], tree.finalbody, None))
    elif isinstance(statement, cst.Match):
        assert isinstance(tree, ast.Match)
        if len(statement.cases) != len(tree.cases):
            raise TreesDisagree
        pairs.extend(_suite(case.body, t.body) for case, t in zip(statement.cases, tree.cases))
    return pairs


def statement_blocks(
    module: cst.Module, body: list[ast.stmt]
) -> list[tuple[str, list[tuple[cst.BaseStatement, ast.stmt]]]]:
    """Every block of statements of ``module`` (its body, function bodies, branches...), each
    with its indentation (as codegen has it there: the enclosing blocks' indents joined) and
    its statements paired with ast's (the first ast statement of a line of several); raises
    TreesDisagree where the trees do not pair up."""
    found: list[tuple[str, list[tuple[cst.BaseStatement, ast.stmt]]]] = []
    pending: list[tuple[Sequence[cst.BaseStatement] | None, list[ast.stmt], str]] = [(module.body, body, "")]
    while pending:
        statements, trees, indent = pending.pop()
        if statements is None:
            continue
        paired: list[tuple[cst.BaseStatement, ast.stmt]] = []
        index = 0
        for statement in statements:
            if index >= len(trees):
                raise TreesDisagree
            paired.append((statement, trees[index]))
            if isinstance(statement, cst.SimpleStatementLine):
                index += len(statement.body)
                continue
            for inner, inner_trees, own in _blocks(statement, trees[index]):
                pending.append((inner, inner_trees, indent + (module.default_indent if own is None else own)))
            index += 1
        if index != len(trees):
            raise TreesDisagree
        found.append((indent, paired))
    return found


def _position(
    spans: dict[cst.CSTNode, tuple[int, int]], code: str, node: cst.CSTNode, statement: cst.CSTNode, first: int
) -> tuple[int, int, int]:
    """Line, column and end line of ``node`` from the ``code`` of ``statement``, whose syntax
    starts on line ``first`` of the input."""
    # the line the statement's own code (leading comment lines included) starts on
    origin = first - code.count("\n", 0, spans[statement][0])
    start, end = spans[node]
    column = start - (code.rfind("\n", 0, start) + 1) + 1
    return origin + code.count("\n", 0, start), column, origin + code.count("\n", 0, max(start, end - 1))


class TreesDisagree(Exception):
    """libcst's and ast's statements do not pair up (never expected: the finer map is dropped)."""


class Positions:
    """Lines and columns of the nodes of one parsed module in its input text."""

    def __init__(self, module: cst.Module, source: str) -> None:
        self.module = module
        self.source = source
        self._whole: dict[cst.CSTNode, tuple[int, int]] | None = None
        self._line_starts: list[int] = []
        self._first_lines: dict[cst.CSTNode, int] | None = None
        self._statement_lines: dict[cst.CSTNode, int] | None = None
        self._source_lines: list[str] = []
        self._statement_offsets: dict[cst.CSTNode, tuple[dict[cst.CSTNode, tuple[int, int]], str]] = {}

    def locate(self, node: cst.CSTNode, chain: Sequence[cst.CSTNode]) -> tuple[int, int, int]:
        """1-based start line, start column and end line of ``node`` in the input.

        ``chain`` is ``node`` and its ancestors, innermost first, up to the top-level
        statement holding it (the module left out). Only the innermost statement of a
        block that holds ``node`` is generated again (with offsets, indented as in the
        input); Python's own parser says on which line it starts, and that line of the
        generated code must read as the input's does, else the top-level statement is
        generated instead. Findings are rare and local, so this costs a fraction of a
        whole-module pass.
        """
        lines = self._nested_lines()
        for depth, statement in enumerate(chain):
            first = lines.get(statement)
            if first is None:
                continue
            indents = [
                self.module.default_indent if block.indent is None else block.indent
                for block in reversed(chain[depth + 1 :])
                if isinstance(block, cst.IndentedBlock)
            ]
            found = self._locate_in(node, statement, first, indents)
            if found is not None:
                return found
            break
        return self._locate_in_top(node, chain[-1])

    def _locate_in(
        self, node: cst.CSTNode, statement: cst.CSTNode, first: int, indents: list[str]
    ) -> tuple[int, int, int] | None:
        """The position of ``node`` from the code of ``statement`` (whose syntax starts on
        line ``first``); None when that code's line does not read as the input's there."""
        spans, code = self._offsets(statement, indents)
        begin = spans[statement][0]
        if not self._source_lines:
            self._source_lines = self.source.split("\n")
        line_start = code.rfind("\n", 0, begin) + 1
        line_end = code.find("\n", begin)
        if (
            not 0 < first <= len(self._source_lines)
            or self._source_lines[first - 1] != code[line_start : len(code) if line_end < 0 else line_end]
        ):
            return None
        return _position(spans, code, node, statement, first)

    def _locate_in_top(self, node: cst.CSTNode, top: cst.CSTNode) -> tuple[int, int, int]:
        first_lines = self._top_level_lines()
        if top not in first_lines:
            return self._locate_in_module(node)
        spans, code = self._offsets(top, [])
        return _position(spans, code, node, top, first_lines[top])

    def _offsets(self, statement: cst.CSTNode, indents: list[str]) -> tuple[dict[cst.CSTNode, tuple[int, int]], str]:
        """``_spans`` of ``statement``, generated once."""
        known = self._statement_offsets.get(statement)
        if known is None:
            known = self._statement_offsets[statement] = _spans(self.module, statement, indents)
        return known

    def _ast_body(self) -> list[ast.stmt] | None:
        """The statements of the engine's ``ast`` tree of the input (not a second parse); None
        when it does not parse."""
        try:
            return pytree.parse(self.source).body
        except (SyntaxError, ValueError, RecursionError):
            return None

    def _nested_lines(self) -> dict[cst.CSTNode, int]:
        """The line each statement of every block (top level, function bodies, branches...)
        starts on, from ``ast``; {} where the two trees do not pair up."""
        if self._statement_lines is None:
            self._statement_lines = {}
            body = self._ast_body()
            if body is None:
                return self._statement_lines
            try:
                blocks = statement_blocks(self.module, body)
            except TreesDisagree:
                return self._statement_lines
            # libcst starts a decorated definition at `def`/`class`, as ast's lineno does
            self._statement_lines = {statement: tree.lineno for _, paired in blocks for statement, tree in paired}
        return self._statement_lines

    def _top_level_lines(self) -> dict[cst.CSTNode, int]:
        """The line each top-level statement's syntax starts on, from ``ast``."""
        if self._first_lines is None:
            self._first_lines = {}
            body = self._ast_body()
            if body is None:
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
