"""The calls of a project function that set up amp for its caller (``migrate.factories``).

``model, optimizer = setup(model, optimizer, cfg.device, cfg.fp16, cfg.fp16_opt_level)``
calls a function of another module whose ``amp.initialize(model, optimizer,
opt_level=fp16_opt_level)`` ran under ``if fp16:``. The caller is migrated as if that call
followed it, spelled with the caller's arguments::

    model, optimizer = setup(model, optimizer, cfg.device, cfg.fp16, cfg.fp16_opt_level)
    from apex import amp as apex_amp
    model, optimizer = apex_amp.initialize(model, optimizer, opt_level=cfg.fp16_opt_level, enabled=cfg.fp16)

so that the rules put its GradScaler where the model and optimizer arrive (``self.scaler``
in a trainer's ``__init__``). The engine migrates this text, and keeps the result only where
no Apex amp is left; the lines added here never reach the output (``Synthetic``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from migrate.findings import Finding
from migrate.options import FactorySetup
from migrate.rules import _syntax as syntax
from migrate.rules._bindings import dotted_name, target_names
from migrate.rules._syntax import bind_arguments

# expressions that bind tighter than any operator: substituted anywhere without parentheses
_ATOMS = (cst.Name, cst.Attribute, cst.Subscript, cst.Call, cst.Integer, cst.Float, cst.SimpleString)


@dataclass(frozen=True)
class Synthetic:
    """The module's text with the added lines, and where they are (1-based, in that text)."""

    source: str
    # (first added line, where the call it follows starts: line and 1-based column), ascending
    added: tuple[tuple[int, int, int], ...]
    per_call: int  # lines added after each call

    def original_position(self, line: int, column: int) -> tuple[int, int]:
        """The input's position for one in the synthetic text (on an added line: its call's)."""
        shift = 0
        for first, call_line, call_column in self.added:
            if line < first:
                break
            if line < first + self.per_call:
                return call_line, call_column
            shift += self.per_call
        return line - shift, column

    def map_findings(self, findings: Sequence[Finding]) -> tuple[Finding, ...]:
        mapped = []
        for finding in findings:
            line, column = self.original_position(finding.line, finding.column)
            mapped.append(Finding(finding.code, line, column, _unshifted(finding.message, self), finding.fixed))
        return tuple(mapped)


def _unshifted(message: str, synthetic: Synthetic) -> str:
    # a message that names a line of the synthetic text names the input's line instead
    return re.sub(
        r"\b(line )(\d+)\b", lambda m: f"{m.group(1)}{synthetic.original_position(int(m.group(2)), 1)[0]}", message
    )


def synthesize(module: cst.Module, setups: Sequence[FactorySetup]) -> Synthetic | None:
    """``module``'s text with each call of ``setups`` followed by the amp.initialize it stands
    for; None when some call, or some other use of those functions, cannot take one."""
    by_name = {setup.name: setup for setup in setups}
    code = module.code
    amp = _free_name(code, "apex_amp")
    finder = _Calls(by_name)
    MetadataWrapper(module, unsafe_skip_copy=True).visit(finder)
    if finder.unusable or not finder.lines:
        return None
    added: dict[cst.SimpleStatementLine, list[cst.SimpleStatementLine]] = {}
    ends = []
    for line, (setup, assign, call, end, start) in finder.lines.items():
        statements = _setup_statements(setup, assign, call, amp)
        if statements is None:
            return None
        added[line] = statements
        ends.append((end, start))
    new_module = module.visit(_Insert(added))
    per_call = 2
    ends.sort()
    return Synthetic(
        new_module.code,
        tuple((end + 1 + index * per_call, *start) for index, (end, start) in enumerate(ends)),
        per_call,
    )


class _Calls(cst.CSTVisitor):
    """The statements that call a factory (``model, optimizer = setup(...)``), with the line each
    ends on; ``unusable`` when a factory is called or used in any other way."""

    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, setups: dict[str, FactorySetup]) -> None:
        self.setups = setups
        # statement -> (factory, assignment, call, the line the statement ends on, where the call starts)
        self.lines: dict[cst.SimpleStatementLine, tuple[FactorySetup, cst.Assign, cst.Call, int, tuple[int, int]]] = {}
        self.taken: set[cst.CSTNode] = set()  # the function names of the calls in ``lines``
        self.unusable = False

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        if len(node.body) != 1 or not isinstance(node.body[0], cst.Assign):
            return
        assign = node.body[0]
        value = assign.value
        name = dotted_name(value.func) if isinstance(value, cst.Call) else None
        if isinstance(value, cst.Call) and name in self.setups and len(assign.targets) == 1:
            end = self.get_metadata(PositionProvider, node).end.line
            start = self.get_metadata(PositionProvider, value).start
            self.lines[node] = (self.setups[name], assign, value, end, (start.line, start.column + 1))
            self.taken.add(value.func)

    def visit_Import(self, node: cst.Import) -> bool:
        return False  # importing the function is no use of it

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        return False

    def visit_Name(self, node: cst.Name) -> None:
        self._use(node)

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        self._use(node)
        node.value.visit(self)  # `obj.setup` is not the function `setup`
        return False

    def _use(self, node: cst.Name | cst.Attribute) -> None:
        if dotted_name(node) in self.setups and node not in self.taken:
            self.unusable = True


class _Insert(cst.CSTTransformer):
    def __init__(self, added: dict[cst.SimpleStatementLine, list[cst.SimpleStatementLine]]) -> None:
        self.added = added

    def leave_IndentedBlock(
        self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock
    ) -> cst.IndentedBlock:
        return updated_node.with_changes(body=self._body(original_node.body, updated_node.body))

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        return updated_node.with_changes(body=self._body(original_node.body, updated_node.body))

    def _body(
        self, original: Sequence[cst.BaseStatement], updated: Sequence[cst.BaseStatement]
    ) -> list[cst.BaseStatement]:
        body: list[cst.BaseStatement] = []
        for before, after in zip(original, updated):
            body.append(after)
            if isinstance(before, cst.SimpleStatementLine) and before in self.added:
                body.extend(self.added[before])
        return body


def _setup_statements(
    setup: FactorySetup, assign: cst.Assign, call: cst.Call, amp: str
) -> list[cst.SimpleStatementLine] | None:
    """``from apex import amp as <amp>`` and the amp.initialize that the call stands for."""
    target = assign.targets[0].target
    if not isinstance(target, (cst.Tuple, cst.List)) or len(target.elements) != setup.returned[0]:
        return None
    if any(isinstance(element, cst.StarredElement) for element in target.elements):
        return None
    models = target.elements[setup.returned[1]].value
    optimizers = target.elements[setup.returned[2]].value
    if not all(isinstance(node, (cst.Name, cst.Attribute)) and dotted_name(node) for node in (models, optimizers)):
        return None
    bound = bind_arguments(call, setup.parameters)
    if bound is None:
        return None
    values: dict[str, cst.BaseExpression] = {name: arg.value for name, arg in bound.items()}
    for name, default in setup.defaults:
        values.setdefault(name, cst.parse_expression(default))
    given = values.get(setup.optimizers)
    # called for inference, amp.initialize got no optimizer (the caller's target is a throwaway)
    passed = given if isinstance(given, cst.Name) and given.value == "None" else optimizers
    # read again after the call: only what the call cannot have changed means the same there
    rebound = set(target_names(target)) | {dotted_name(element.value) or "" for element in target.elements}
    template = cst.parse_expression(setup.call)
    guard = cst.parse_expression(setup.guard) if setup.guard else None
    needed = _names_in(template) | (_names_in(guard) if guard is not None else set())
    for name in needed & set(setup.parameters) - {setup.models, setup.optimizers}:
        if name not in values or not _stable(values[name], rebound):
            return None
    substitute = _Substitute(
        {name: value for name, value in values.items() if name not in (setup.models, setup.optimizers)}
    )
    initialize = template.visit(substitute)
    if not isinstance(initialize, cst.Call):
        return None
    args = list(initialize.args)
    for index, (name, value) in enumerate(zip(("models", "optimizers"), (models, passed))):
        for position, arg in enumerate(args):
            if arg.keyword is not None and arg.keyword.value == name or arg.keyword is None and position == index:
                args[position] = arg.with_changes(value=value)
                break
    if guard is not None:
        # a test of the model or optimizer it was given (`optimizer is not None`) reads what the call
        # returned to the caller: amp.initialize returns the objects it was given
        condition = guard.visit(_Substitute({**substitute.values, setup.models: models, setup.optimizers: passed}))
        assert isinstance(condition, cst.BaseExpression)
        enabled = next((arg for arg in args if arg.keyword is not None and arg.keyword.value == "enabled"), None)
        if enabled is not None:
            condition = cst.BooleanOperation(_grouped(condition), cst.And(), _grouped(enabled.value))
            args = [arg for arg in args if arg is not enabled]
        if args:
            args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        args.append(cst.Arg(condition, keyword=cst.Name("enabled"), equal=_EQUAL))
    initialize = initialize.with_changes(func=cst.Attribute(cst.Name(amp), cst.Name("initialize")), args=args)
    # amp.initialize returns what it was given (the model alone, given no optimizer)
    result: cst.BaseExpression = (
        models
        if passed is not optimizers
        else cst.Tuple([cst.Element(models), cst.Element(optimizers)], lpar=[], rpar=[])
    )
    imported = cst.parse_statement(f"from apex import amp as {amp}\n")
    assert isinstance(imported, cst.SimpleStatementLine)
    return [imported, syntax.assign_statement(result, initialize)]


_EQUAL = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))


def _grouped(node: cst.BaseExpression) -> cst.BaseExpression:
    if isinstance(node, _ATOMS):
        return node
    return node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def _names_in(node: cst.CSTNode) -> set[str]:
    finder = _Names()
    node.visit(finder)
    return finder.names


class _Names(cst.CSTVisitor):
    def __init__(self) -> None:
        self.names: set[str] = set()

    def visit_Name(self, node: cst.Name) -> None:
        self.names.add(node.value)

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        node.value.visit(self)  # the attribute's own name is no variable
        return False

    def visit_Arg(self, node: cst.Arg) -> bool:
        node.value.visit(self)  # nor is a keyword
        return False


def _stable(node: cst.BaseExpression, rebound: set[str]) -> bool:
    """Whether ``node`` reads the same after the call as before: no call or other code runs in
    it, and it reads nothing the call's own assignment rebinds (``model`` or ``self.model``, and
    what hangs from them; ``self.args`` stays when only ``self.model`` is assigned)."""
    for inner in syntax.descendants(node):
        if isinstance(inner, _RUNS_CODE):
            return False
        read = dotted_name(inner) if isinstance(inner, (cst.Name, cst.Attribute)) else None
        if read is not None and any(read == name or read.startswith(f"{name}.") for name in rebound):
            return False
    return True


_RUNS_CODE = (
    cst.Call,
    cst.Lambda,
    cst.Await,
    cst.Yield,
    cst.NamedExpr,
    cst.ListComp,
    cst.SetComp,
    cst.DictComp,
    cst.GeneratorExp,
)


class _Substitute(cst.CSTTransformer):
    """The function's parameters replaced by what the caller passed (grouped where needed)."""

    def __init__(self, values: dict[str, cst.BaseExpression]) -> None:
        self.values = values

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        return False  # `x.fp16` keeps its attribute's name: only `x` may be a parameter

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.BaseExpression:
        return updated_node.with_changes(value=original_node.value.visit(self))

    def visit_Arg(self, node: cst.Arg) -> bool:
        return False  # nor is a keyword a parameter

    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> cst.Arg:
        return updated_node.with_changes(value=original_node.value.visit(self))

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        value = self.values.get(original_node.value)
        return updated_node if value is None else _grouped(value)


def _free_name(code: str, preferred: str) -> str:
    """``preferred``, or with a number added, whichever the module's text does not use."""
    name, number = preferred, 1
    while re.search(rf"\b{re.escape(name)}\b", code):
        number += 1
        name = f"{preferred}_{number}"
    return name
