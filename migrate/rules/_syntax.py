"""Small helpers for the code the rules read (literal values, normalized code) and write (builders
that keep the user's layout where they can)."""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence
from typing import Literal, cast, overload

import libcst as cst

NO_SPACE = cst.SimpleWhitespace("")
ONE_SPACE = cst.SimpleWhitespace(" ")


_EMPTY = cst.Module([])


def code(node: cst.CSTNode) -> str:
    """Source code of any node (also one not in a module)."""
    return _EMPTY.code_for_node(node)


def string(value: str) -> cst.SimpleString:
    return cst.SimpleString(f'"{value}"')


def keyword(name: str, value: cst.BaseExpression) -> cst.Arg:
    return cst.Arg(
        value=value,
        keyword=cst.Name(name),
        equal=cst.AssignEqual(whitespace_before=NO_SPACE, whitespace_after=NO_SPACE),
    )


def prepend_args(call: cst.Call, new: Sequence[cst.Arg]) -> cst.Call:
    """``f(a)`` -> ``f(NEW, a)``, following the call's one-line or one-per-line layout."""
    if not new:
        return call
    args = list(call.args)
    separator: cst.BaseParenthesizableWhitespace = ONE_SPACE
    if isinstance(call.whitespace_before_args, cst.ParenthesizedWhitespace) and args:
        separator = call.whitespace_before_args
    built = [arg.with_changes(comma=cst.Comma(whitespace_after=separator)) for arg in new]
    if not args:
        built[-1] = built[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return call.with_changes(args=[*built, *args])


def dotted(name: str) -> cst.Name | cst.Attribute:
    """``torch.amp.GradScaler`` as nodes, without a trip through the parser."""
    first, *rest = name.split(".")
    node: cst.Name | cst.Attribute = cst.Name(first)
    for part in rest:
        node = cst.Attribute(value=node, attr=cst.Name(part))
    return node


def call(func: str, args: Sequence[cst.Arg] = ()) -> cst.Call:
    return cst.Call(func=dotted(func), args=list(args))


def attribute_call(owner: cst.BaseExpression, method: str, args: Sequence[cst.Arg] = ()) -> cst.Call:
    return cst.Call(func=cst.Attribute(value=owner, attr=cst.Name(method)), args=list(args))


def strip_parens(node: cst.BaseExpression) -> cst.BaseExpression:
    if getattr(node, "lpar", None):
        return node.with_changes(lpar=[], rpar=[])
    return node


def expression_statement(expression: cst.BaseExpression) -> cst.SimpleStatementLine:
    return cst.SimpleStatementLine([cst.Expr(expression)])


def sole_statement(line: cst.CSTNode) -> cst.BaseSmallStatement | None:
    """The one small statement of a statement line (``x = f()``); None for a compound
    statement or a line holding several (``a; b``)."""
    if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
        return line.body[0]
    return None


def names_a_value(name: cst.Name, parent: cst.CSTNode | None) -> bool:
    """Whether ``name`` (whose parent is ``parent``) refers to a variable: not the attribute
    part of ``a.name`` nor the keyword of ``f(name=...)``."""
    if isinstance(parent, cst.Attribute) and parent.attr is name:
        return False
    return not (isinstance(parent, cst.Arg) and parent.keyword is name)


def target_of(line: cst.CSTNode, value: cst.CSTNode) -> cst.BaseAssignTargetExpression | None:
    """The one target of a statement line ``target = value`` (``model, optimizer = value``,
    ``self.optimizer = value``); None where ``value`` is not what the line assigns, or the line
    assigns it to several targets (``a = b = value``) or holds more than one statement."""
    small = sole_statement(line)
    if isinstance(small, cst.Assign) and small.value is value and len(small.targets) == 1:
        return small.targets[0].target
    return None


def name_assignment(line: cst.CSTNode) -> tuple[str, cst.BaseExpression] | None:
    """(``x``, value) for a line ``x = value`` (one target, a plain name)."""
    small = sole_statement(line)
    if isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name):
        return small.targets[0].target.value, small.value
    return None


def descendants(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """``node`` and everything below it, for nodes the module's index does not hold (built by a
    rule, or parsed from text): ``ModuleContext.walk`` would not enter them."""
    pending = [node]
    while pending:
        current = pending.pop()
        yield current
        pending.extend(reversed(current.children))  # in source order


def calls_super_init(statement: cst.CSTNode) -> bool:
    """``super().__init__(...)`` (or ``Base.__init__(self, ...)``) as the whole statement."""
    small = sole_statement(statement)
    call = small.value if isinstance(small, cst.Expr) else None
    return isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and call.func.attr.value == "__init__"


def assign_statement(target: cst.BaseExpression, value: cst.BaseExpression) -> cst.SimpleStatementLine:
    assignable = cast(cst.BaseAssignTargetExpression, target)
    return cst.SimpleStatementLine([cst.Assign(targets=[cst.AssignTarget(assignable)], value=value)])


def parameter_names(function: cst.FunctionDef) -> list[str]:
    """The names of ``function``'s named parameters, in order (positional-only, plain, keyword-only)."""
    params = function.params
    return [param.name.value for param in (*params.posonly_params, *params.params, *params.kwonly_params)]


@overload
def bind_arguments(call: cst.Call, parameters: Sequence[str]) -> dict[str, cst.Arg] | None: ...
@overload
def bind_arguments(call: cst.Call, parameters: Sequence[str], *, partial: Literal[True]) -> dict[str, cst.Arg]: ...
def bind_arguments(call: cst.Call, parameters: Sequence[str], *, partial: bool = False) -> dict[str, cst.Arg] | None:
    """Map a call's arguments to the callee's parameter names (in positional order).

    By default the whole call must bind: None for a ``*``/``**`` argument, an unknown
    keyword, more positional arguments than parameters, or a parameter given twice. With
    ``partial``, only what binds for sure is returned and the rest ignored: positional
    arguments before any ``*args``, and keywords by name (the first, when given twice).
    """
    bound: dict[str, cst.Arg] = {}
    unpacked = False  # after `*args`, the position of an argument is unknown
    for index, arg in enumerate(call.args):
        if arg.star:
            if not partial:
                return None
            unpacked = unpacked or arg.star == "*"
            continue
        if arg.keyword is not None:
            name: str | None = arg.keyword.value if arg.keyword.value in parameters else None
        else:
            name = parameters[index] if index < len(parameters) and not unpacked else None
        if name is None or name in bound:
            if not partial:
                return None
            continue
        bound[name] = arg
    return bound


def with_keywords(call: cst.Call, parameters: Sequence[str]) -> list[cst.Arg] | None:
    """The call's arguments with each positional one given its parameter name; None if the
    call does not bind (see ``bind_arguments``)."""
    bound = bind_arguments(call, parameters)
    if bound is None:
        return None
    names = {id(arg): name for name, arg in bound.items()}
    return [
        (
            arg
            if arg.keyword is not None
            else arg.with_changes(
                keyword=cst.Name(names[id(arg)]),
                equal=cst.AssignEqual(whitespace_before=NO_SPACE, whitespace_after=NO_SPACE),
            )
        )
        for arg in call.args
    ]


def comments_right_above(lines: Sequence[cst.EmptyLine]) -> int:
    """Where, in a statement's leading lines, the comment lines right above it begin."""
    start = len(lines)
    while start and lines[start - 1].comment is not None:
        start -= 1
    return start


def is_docstring(statement: cst.CSTNode) -> bool:
    """A statement that is only a string literal (a module, class or function docstring)."""
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and isinstance(statement.body[0], cst.Expr)
        and isinstance(statement.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )


def literal(node: cst.BaseExpression) -> object:
    """The Python value of a literal expression (``2.**24`` included), else ``...``."""
    if isinstance(node, cst.Name) and node.value in ("True", "False", "None"):
        return {"True": True, "False": False, "None": None}[node.value]
    try:
        tree = ast.parse(code(node).strip(), mode="eval")
    except SyntaxError:
        return ...

    def evaluate(expression: ast.expr) -> object:
        if isinstance(expression, ast.Constant):
            return expression.value
        if isinstance(expression, ast.UnaryOp) and isinstance(expression.op, ast.USub):
            return -evaluate(expression.operand)  # type: ignore[operator]
        if isinstance(expression, ast.BinOp) and isinstance(
            expression.op, (ast.Pow, ast.Mult, ast.Add, ast.Sub, ast.Div)
        ):
            left, right = evaluate(expression.left), evaluate(expression.right)
            if isinstance(left, (int, float)) and isinstance(right, (int, float)):
                operators = {
                    ast.Pow: lambda a, b: a**b,
                    ast.Mult: lambda a, b: a * b,
                    ast.Add: lambda a, b: a + b,
                    ast.Sub: lambda a, b: a - b,
                    ast.Div: lambda a, b: a / b,
                }
                return operators[type(expression.op)](left, right)
        raise ValueError

    try:
        return evaluate(tree.body)
    except (ValueError, TypeError, ZeroDivisionError, OverflowError):
        return ...


def normalized(node: cst.BaseExpression) -> str:
    """Code of ``node`` without layout, tuples and lists spelled alike."""
    if isinstance(node, (cst.Tuple, cst.List)):
        return "(" + ",".join(normalized(element.value) for element in node.elements) + ")"
    return "".join(code(node).split())
