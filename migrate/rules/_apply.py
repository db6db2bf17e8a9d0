"""Apply a ``Plan`` to the module in one transform.

Statement edits are applied where the enclosing block is rebuilt: the block's original
children and updated children line up one to one (no child returns a sentinel), so each
edit keyed by an original statement finds the updated statement it belongs to. Comments
attached to a statement that goes away move to the next statement emitted.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from typing import TypeVar, cast

import libcst as cst

from migrate.rules import _syntax as syntax
from migrate.rules._bindings import dotted_name, target_names
from migrate.rules._context import ModuleContext
from migrate.rules._plan import Plan, Statement

_IMPORT_TORCH = cst.parse_statement("import torch\n")


def _is_import(statement: cst.CSTNode) -> bool:
    return isinstance(statement, cst.SimpleStatementLine) and all(
        isinstance(small, (cst.Import, cst.ImportFrom)) for small in statement.body
    )


def _binds_torch(statement: cst.CSTNode) -> bool:
    """``import torch`` (or ``import torch.nn``) binding the name ``torch`` at this statement."""
    if not isinstance(statement, cst.SimpleStatementLine):
        return False
    for small in statement.body:
        if isinstance(small, cst.Import):
            for alias in small.names:
                bound = syntax.code(alias.asname.name) if alias.asname else syntax.code(alias.name).split(".")[0]
                if bound == "torch":
                    return True
    return False


def _is_future_import(statement: cst.CSTNode) -> bool:
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and isinstance(statement.body[0], cst.ImportFrom)
        and isinstance(statement.body[0].module, cst.Name)
        and statement.body[0].module.value == "__future__"
    )


def _separator(items: Sequence[cst.Arg] | Sequence[cst.Param]) -> cst.BaseParenthesizableWhitespace:
    """The whitespace between the existing items (one per line, or a space)."""
    if len(items) >= 2 and isinstance(items[-2].comma, cst.Comma):
        return items[-2].comma.whitespace_after
    return cst.SimpleWhitespace(" ")


def _orphaned_comments(gone: cst.BaseStatement, replacement: Sequence[cst.BaseStatement]) -> list[cst.EmptyLine]:
    """Comments inside a statement that goes away (``# enabled=False`` inside an
    ``amp.initialize(...)`` call, the comment of a ``try:`` line) as lines of their own,
    unless the replacement keeps them. An optional import's ``except ImportError:`` says what
    to do without the import, which is gone: its comments go with it."""
    found: list[str] = []

    class Comments(cst.CSTVisitor):
        def visit_Comment(self, node: cst.Comment) -> None:
            found.append(node.value)

    if isinstance(gone, cst.Try):
        for part in (gone.body, gone.orelse, gone.finalbody):
            if part is not None:
                part.visit(Comments())
    else:
        gone.with_changes(leading_lines=()).visit(Comments())
    if not found:
        return []
    kept = "".join(syntax.code(statement) for statement in replacement)
    return [
        cst.EmptyLine(comment=cst.Comment(value))
        for value in found
        if value not in kept and not _LINE_PRAGMA.match(value)
    ]


# A linter's or type checker's word about the line it ends (a noqa comment silencing F401 on an optional
# import): it goes with that line. As a line of its own it would mean nothing, or silence more:
# pylint the rest of the block, mypy the whole file (``# type: ignore`` at the top of a module);
# PyCharm's ``# noinspection`` speaks of the statement below it.
_LINE_PRAGMA = re.compile(
    r"#\s*(noqa\b|type:\s*ignore\b|pyright:\s*ignore\b|pylint:\s*disable|nosec\b|pragma:\s*no\s*cover\b"
    r"|isort:\s*skip\b|fmt:\s*skip\b|noinspection\b)",
    re.IGNORECASE,
)


def _body_statements(body: cst.BaseSuite) -> tuple[list[Statement], list[cst.EmptyLine]]:
    """A block's statements, ready to stand in its header's place, and the header line's
    comment as a line of its own (``with x:  # why`` keeps its why)."""
    if isinstance(body, cst.SimpleStatementSuite):
        # `with amp.scale_loss(...) as s: s.backward()` on one line: its body becomes a line
        return [cst.SimpleStatementLine(body=body.body, trailing_whitespace=body.trailing_whitespace)], []
    block = cast(cst.IndentedBlock, body)
    comment = block.header.comment
    comments = [cst.EmptyLine(comment=comment)] if comment is not None and not _LINE_PRAGMA.match(comment.value) else []
    return list(cast(Sequence[Statement], block.body)), comments


def _guarded_imports(statement: cst.CSTNode) -> bool:
    """``try: import x`` / ``if cond: import x`` blocks: part of the import section."""
    if isinstance(statement, (cst.Try, cst.If)) and isinstance(statement.body, cst.IndentedBlock):
        return bool(statement.body.body) and all(_is_import(s) for s in statement.body.body)
    return False


class _Mentions(cst.CSTVisitor):
    def __init__(self, names: Collection[str]) -> None:
        self.names = names
        self.found = False

    def visit_Name(self, node: cst.Name) -> None:
        self.found = self.found or node.value in self.names


def _mentions(statement: cst.CSTNode, names: Collection[str]) -> bool:
    visitor = _Mentions(names)
    statement.visit(visitor)
    return visitor.found


def _after_imports(body: Sequence[cst.BaseStatement], uses: Collection[str] = ()) -> int:
    """Index just after the module's imports (and docstring), before its first definition, and
    before the first statement that uses one of ``uses``: in a script or notebook that imports
    again after some code, that code runs before the later imports."""
    position = 0
    for index, statement in enumerate(body):
        if _is_import(statement) or _guarded_imports(statement) or (syntax.is_docstring(statement) and index == 0):
            position = index + 1
        elif isinstance(statement, (cst.FunctionDef, cst.ClassDef)) or (uses and _mentions(statement, uses)):
            break
    return position


def _defined_names(statements: Sequence[Statement]) -> set[str]:
    """The names the module-level additions bind (helper functions and classes, globals)."""
    names: set[str] = set()
    for statement in statements:
        if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            names.add(statement.name.value)
        elif isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                for target in small.targets if isinstance(small, cst.Assign) else ():
                    names.update(target_names(target.target))
    return names


# calls that only read what they are given: an `if` testing them can go with its body
_PURE_CALLS = frozenset(
    {
        "isinstance",
        "hasattr",
        "len",
        "bool",
        "torch.cuda.is_available",
        "torch.cuda.device_count",
        "importlib.util.find_spec",
    }
)


# the comparisons whose negation is another operator (`not a < b` is not `a >= b` for NaN)
_INVERSE_COMPARISONS: dict[type, type] = {
    cst.Equal: cst.NotEqual,
    cst.NotEqual: cst.Equal,
    cst.Is: cst.IsNot,
    cst.IsNot: cst.Is,
    cst.In: cst.NotIn,
    cst.NotIn: cst.In,
}


def _negated(test: cst.BaseExpression) -> cst.BaseExpression:
    """``not test``, without a double negation, parenthesized where ``not`` binds tighter."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not) and not test.lpar:
        return test.expression
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1 and not test.lpar:
        target = test.comparisons[0]
        inverse = _INVERSE_COMPARISONS.get(type(target.operator))
        if inverse is not None:
            operator = inverse(
                whitespace_before=target.operator.whitespace_before,  # type: ignore[attr-defined]
                whitespace_after=target.operator.whitespace_after,  # type: ignore[attr-defined]
            )
            return test.with_changes(comparisons=[target.with_changes(operator=operator)])
    if not isinstance(test, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) and not test.lpar:
        test = test.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return cst.UnaryOperation(operator=cst.Not(), expression=test)


def _runs_code(test: cst.BaseExpression) -> bool:
    """Whether evaluating ``test`` may call something other than a few pure builtins."""
    for node in syntax.descendants(test):
        if isinstance(node, cst.Call) and dotted_name(node.func) not in _PURE_CALLS:
            return True
        if isinstance(node, (cst.Await, cst.Yield, cst.NamedExpr)):
            return True
    return False


def _with_leading_lines(statement: Statement, lines: Sequence[cst.EmptyLine]) -> Statement:
    if not lines:
        return statement
    existing = list(statement.leading_lines)
    if all(line.comment is None for line in lines):
        # blank lines of a removed statement: keep the spacing, do not add to it
        blank = 0
        while blank < len(existing) and existing[blank].comment is None:
            blank += 1
        missing = max(0, len(lines) - blank)
        return statement.with_changes(leading_lines=[*lines[:missing], *existing])
    return statement.with_changes(leading_lines=[*lines, *existing])


def _without_new_blank_top(original_first: cst.BaseStatement, first: cst.BaseStatement) -> cst.BaseStatement:
    """A block whose first statements went starts at the next one, without the blank lines
    that separated them (``if ddp:`` / ``try: import apex`` / blank / ``model = DDP(model)``)."""
    assert isinstance(original_first, Statement) and isinstance(first, Statement)
    lines = list(first.leading_lines)
    if original_first.leading_lines and original_first.leading_lines[0].comment is None:
        return first  # the block started with a blank line before the rewrite too
    top = 0
    while top < len(lines) and lines[top].comment is None:
        top += 1
    return first.with_changes(leading_lines=lines[top:]) if top else first


def _with_new_keywords(call: cst.Call, keywords: Sequence[tuple[str, cst.BaseExpression]]) -> cst.Call:
    """``f(a)`` -> ``f(a, name=value)``, laid out like the existing arguments."""
    extra = [syntax.keyword(name, value) for name, value in keywords]
    return call.with_changes(args=_appended(list(call.args), extra, "whitespace_after_arg"))


def _with_new_params(
    function: cst.FunctionDef, new: Sequence[tuple[str, cst.BaseExpression | None]]
) -> cst.FunctionDef:
    """``def f(a)`` -> ``def f(a, name)`` (or ``name=default``), laid out like the others."""
    extra = [
        cst.Param(
            cst.Name(name),
            default=default,
            equal=(
                cst.AssignEqual(whitespace_before=syntax.NO_SPACE, whitespace_after=syntax.NO_SPACE)
                if default is not None
                else cst.MaybeSentinel.DEFAULT
            ),
        )
        for name, default in new
    ]
    params = _appended(list(function.params.params), extra, "whitespace_after_param")
    return function.with_changes(params=function.params.with_changes(params=params))


_Item = TypeVar("_Item", cst.Arg, cst.Param)


def _appended(items: list[_Item], extra: list[_Item], trailing: str) -> list[_Item]:
    """``items`` then ``extra``, separated as the items are (a space, or one per line); the
    last item's trailing comma and the whitespace before the closing parenthesis (the
    ``trailing`` field) move to the new last one."""
    if not items:
        return extra
    separator = _separator(items)
    last = items[-1]
    items[-1] = last.with_changes(comma=cst.Comma(whitespace_after=separator), **{trailing: syntax.NO_SPACE})
    extra = [item.with_changes(comma=cst.Comma(whitespace_after=separator)) for item in extra]
    extra[-1] = extra[-1].with_changes(comma=last.comma, **{trailing: getattr(last, trailing)})
    return items + extra


class PlanApplier(cst.CSTTransformer):
    def __init__(self, plan: Plan, touched: set[int]) -> None:
        super().__init__()
        self.plan = plan
        self._placeholders: set[cst.CSTNode] = set()
        # ids of the nodes on a path from the module to an edit: the walk skips the rest
        self._touched = touched

    def on_visit(self, node: cst.CSTNode) -> bool:
        super().on_visit(node)
        return id(node) in self._touched

    # --- generic hook: expression edits and structural edits by original node
    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode):  # type: ignore[override]
        updated = super().on_leave(original_node, updated_node)
        plan = self.plan
        if not isinstance(updated, cst.CSTNode):
            return updated
        replace = plan.replace.get(original_node)
        if replace is not None:
            updated = replace(updated)
        if isinstance(updated, cst.Call) and original_node in plan.new_keywords:
            updated = _with_new_keywords(updated, plan.new_keywords[original_node])
        if isinstance(updated, cst.FunctionDef) and original_node in plan.new_params:
            updated = _with_new_params(updated, plan.new_params[original_node])
        if isinstance(updated, cst.If) and isinstance(updated.orelse, cst.Else):
            if self._is_placeholder_block(updated.orelse.body):
                updated = updated.with_changes(orelse=None)
        if isinstance(updated, cst.If) and self._vacuous(updated.orelse):
            updated = updated.with_changes(orelse=None)  # a trailing `elif` that emptied out
        if isinstance(updated, cst.If) and self._only_else_left(updated):
            # `if use_apex: <Apex import, gone>` / `else: DDP = ...` -> `if not use_apex: DDP = ...`
            assert isinstance(updated.orelse, cst.Else)
            updated = updated.with_changes(test=_negated(updated.test), body=updated.orelse.body, orelse=None)
        if isinstance(original_node, (cst.IndentedBlock, cst.Module)):
            updated = self._rebuild_block(original_node, updated)  # type: ignore[arg-type]
        if isinstance(updated, cst.Module):
            updated = self._add_module_level(updated)
        return updated

    # --- blocks
    def _is_placeholder_block(self, block: cst.BaseSuite) -> bool:
        return isinstance(block, cst.IndentedBlock) and len(block.body) == 1 and block.body[0] in self._placeholders

    def _only_else_left(self, statement: cst.If) -> bool:
        """An ``if`` whose body emptied out (no comment left in it) and whose plain ``else`` has
        code, with no comment above the ``else:`` that the inverted ``if`` would lose."""
        orelse = statement.orelse
        return (
            isinstance(orelse, cst.Else)
            and self._is_placeholder_block(statement.body)
            and not statement.body.body[0].leading_lines  # type: ignore[union-attr]
            and not any(line.comment for line in orelse.leading_lines)
            and not self._is_placeholder_block(orelse.body)
        )

    def _vacuous(self, statement: cst.CSTNode | None) -> bool:
        """An `if` whose body emptied out because its only content was migrated away, and whose
        test runs no code of its own (a call there may do more than decide: it stays, with `pass`)."""
        return (
            isinstance(statement, cst.If)
            and statement.orelse is None
            and self._is_placeholder_block(statement.body)
            and not _runs_code(statement.test)
        )

    def _emit(self, original: cst.CSTNode, updated: Statement) -> tuple[list[Statement], list[cst.EmptyLine]]:
        """Statements that stand for ``original``, and comment lines left without a home."""
        plan = self.plan
        before = list(plan.before.get(original, ()))
        after = list(plan.after.get(original, ()))
        if (
            not before
            and not after
            and not (original in plan.replace_statement or original in plan.remove or original in plan.unwrap)
            and not self._vacuous(updated)
        ):
            return [updated], []  # the same node: rendering can reuse its input text
        leading = list(updated.leading_lines)
        if original in plan.replace_statement:
            middle = list(plan.replace_statement[original])
            leading.extend(_orphaned_comments(updated, middle))
        elif original in plan.remove or self._vacuous(updated):
            middle = []
            if original in plan.forget_comments:
                leading = leading[: syntax.comments_right_above(leading)]  # they spoke of it
            if original not in plan.forget_inner_comments:
                leading.extend(_orphaned_comments(updated, middle))
        elif original in plan.unwrap:
            # the (updated) body in the statement's place: of a `with amp.scale_loss(...)`; of an
            # `if` whose test became always true (the rest of that `if` never runs); of an
            # optional-import `try` that lost its import (then its `else`)
            assert isinstance(updated, (cst.With, cst.If, cst.Try))
            middle, header_comments = _body_statements(updated.body)
            leading.extend(header_comments)
            if isinstance(updated, cst.Try) and updated.orelse is not None:
                middle.extend(_body_statements(updated.orelse.body)[0])
            elif isinstance(updated, cst.If) and updated.orelse is not None:
                leading.extend(_orphaned_comments(cast(cst.BaseStatement, updated.orelse), middle))
        else:
            middle = [updated.with_changes(leading_lines=())]
        emitted = [*before, *middle, *after]
        if not emitted:
            return [], leading
        emitted[0] = _with_leading_lines(emitted[0], leading)
        return emitted, []

    def _emit_run(
        self, pairs: list[tuple[cst.CSTNode, Statement]], pending: list[cst.EmptyLine]
    ) -> tuple[list[Statement], list[cst.EmptyLine]]:
        """Emit consecutive statements; comments of removed ones move to the next one kept."""
        body: list[Statement] = []
        for original, updated in pairs:
            emitted, lost = self._emit(original, updated)
            if emitted:
                emitted[0] = _with_leading_lines(emitted[0], pending)
                pending = []
                body.extend(emitted)
            else:
                pending = [*pending, *lost]
        return body, pending

    def _rebuild_block(self, original: cst.Module | cst.IndentedBlock, updated):
        plan = self.plan
        originals = list(original.body)
        updates = list(updated.body)
        assert len(originals) == len(updates), "a child statement changed the block length"
        touched = any(
            o in plan.wrap
            or o in plan.remove
            or o in plan.unwrap
            or o in plan.replace_statement
            or o in plan.before
            or o in plan.after
            or self._vacuous(u)
            for o, u in zip(originals, updates)
        )
        if not touched:
            return updated
        body: list[cst.BaseStatement] = []
        pending: list[cst.EmptyLine] = []
        index = 0
        while index < len(originals):
            first = originals[index]
            if first not in plan.wrap:
                emitted, pending = self._emit_run([(first, updates[index])], pending)
                body.extend(emitted)
                index += 1
                continue
            last, item = plan.wrap[first]
            end = originals.index(last, index)  # type: ignore[arg-type]
            inner, orphans = self._emit_run(list(zip(originals[index : end + 1], updates[index : end + 1])), [])
            index = end + 1
            if not inner:
                pending = [*pending, *orphans]
                continue
            lines = inner[0].leading_lines
            inner[0] = inner[0].with_changes(leading_lines=())
            # the block's own step, not the module's first one (files that mix 8 and 4 spaces)
            indent = updated.indent if isinstance(updated, cst.IndentedBlock) else None
            wrapped = cst.With(items=[item], body=cst.IndentedBlock(body=inner, indent=indent), leading_lines=lines)
            body.append(_with_leading_lines(wrapped, pending))
            pending = orphans
        if isinstance(updated, cst.IndentedBlock) and not body:
            placeholder = cst.SimpleStatementLine([cst.Pass()], leading_lines=pending)
            self._placeholders.add(placeholder)
            return updated.with_changes(body=[placeholder])
        if isinstance(updated, cst.IndentedBlock):
            body[0] = _without_new_blank_top(originals[0], body[0])
            # the blank lines above the block's removed last statements would end it: the code
            # after the block keeps its own spacing
            first_comment = next((n for n, line in enumerate(pending) if line.comment is not None), len(pending))
            pending = pending[first_comment:]
        if pending:
            return updated.with_changes(body=body, footer=[*pending, *updated.footer])
        return updated.with_changes(body=body)

    # --- module-level additions
    def _add_module_level(self, module: cst.Module) -> cst.Module:
        plan = self.plan
        if not (plan.needs_torch_import or plan.imports or plan.module_helpers or plan.module_globals):
            return module
        body = list(module.body)
        imports = [cst.parse_statement(f"import {name}\n") for name in sorted(plan.imports)]
        if plan.needs_torch_import:
            imports.append(_IMPORT_TORCH)
        if imports:
            position = 0
            while position < len(body) and (syntax.is_docstring(body[position]) or _is_future_import(body[position])):
                position += 1
            if position < len(body) and position > 0 and not _is_import(body[position]):
                imports[0] = imports[0].with_changes(leading_lines=[cst.EmptyLine()])
            if position < len(body) and any(line.comment for line in body[position].leading_lines):
                # comments that headed the first statement (a license, a section title) stay on top
                head = body[position]
                imports[0] = imports[0].with_changes(leading_lines=[*head.leading_lines, *imports[0].leading_lines])
                body[position] = head.with_changes(leading_lines=())
                if not _is_import(head):
                    body[position] = body[position].with_changes(leading_lines=[cst.EmptyLine()])
            body[position:position] = imports
        added = _defined_names([*plan.module_globals, *plan.module_helpers])
        if plan.module_globals:
            position = _after_imports(body, added)
            shared = list(plan.module_globals)
            if not any(_binds_torch(statement) for statement in body[:position]):
                shared.insert(0, _IMPORT_TORCH)  # the module imports torch only further down: globals run now
            shared[0] = shared[0].with_changes(leading_lines=[cst.EmptyLine(), *shared[0].leading_lines])
            body[position:position] = shared
        if plan.module_helpers:
            position = _after_imports(body, added)
            helpers = [
                helper.with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()]) for helper in plan.module_helpers
            ]
            if position < len(body):
                following = body[position]
                blank = 0
                while blank < len(following.leading_lines) and following.leading_lines[blank].comment is None:
                    blank += 1
                if blank < 2:  # two blank lines after a top-level def or class, as PEP 8 has it
                    padding = [cst.EmptyLine()] * (2 - blank)
                    body[position] = following.with_changes(leading_lines=[*padding, *following.leading_lines])
            body[position:position] = helpers
        return module.with_changes(body=body)


def apply_plan(ctx: ModuleContext) -> cst.Module:
    """The module with every planned edit made, visiting only the subtrees that change."""
    plan = ctx.plan
    edited: set[cst.CSTNode] = {
        *plan.replace,
        *plan.remove,
        *plan.replace_statement,
        *plan.unwrap,
        *plan.before,
        *plan.after,
        *plan.new_params,
        *plan.new_keywords,
    }
    for first, (last, _) in plan.wrap.items():
        edited.update((first, last))
    touched = {id(ctx.module)}
    for node in edited:
        touched.add(id(node))
        for ancestor in ctx.ancestors(node):
            if id(ancestor) in touched:
                break
            touched.add(id(ancestor))
    return ctx.module.visit(PlanApplier(plan, touched))
