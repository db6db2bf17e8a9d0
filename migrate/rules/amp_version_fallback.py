"""amp_version_fallback: the Apex branch of a torch version test beside a native one.

What it rewrites
    Projects that moved to native AMP while torch 1.5 was still around kept Apex as the
    fallback of a version test: ``if LooseVersion(torch.__version__) >= LooseVersion("1.6.0"):
    scaler = torch.cuda.amp.GradScaler()`` and, in the ``else:``, ``from apex import amp``,
    ``amp.initialize(...)``, ``amp.register_float_function(...)`` and a checkpoint load given
    ``amp=amp``. On every torch the migrated code can run on (2.3 and newer) the test is true:
    the Apex branch never runs. The test goes and its native branch takes its place; the Apex
    branch goes with it. Where a function's ``amp`` (``amp, scaler = None, None`` before the
    test) thus only ever holds None, the module's own functions it is passed to lose their
    Apex code for it: ``if amp is not None: ...`` goes (its ``else:`` stays in its place), and
    ``if scaler is not None: scaler.scale(loss).backward() else: with amp.scale_loss(...)``
    keeps its first branch (with ``scaler`` None both raise the same AttributeError before
    doing anything).

Before::

    from distutils.version import LooseVersion

    import torch


    def train_one_epoch(model, optimizer, loader, amp, scaler):
        for x, y in loader:
            with torch.autocast("cuda", enabled=scaler is not None):
                loss = model(x, y)
            if scaler is not None:
                scaler.scale(loss).backward()
            else:
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
            scaler.step(optimizer)
            scaler.update()


    def main(model, optimizer, loader):
        amp, scaler = None, None
        if LooseVersion(torch.__version__) >= LooseVersion("1.6.0"):
            scaler = torch.amp.GradScaler("cuda")
        else:
            from apex import amp

            model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        train_one_epoch(model, optimizer, loader, amp, scaler)

After::

    from distutils.version import LooseVersion

    import torch


    def train_one_epoch(model, optimizer, loader, amp, scaler):
        for x, y in loader:
            with torch.autocast("cuda", enabled=scaler is not None):
                loss = model(x, y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()


    def main(model, optimizer, loader):
        amp, scaler = None, None
        scaler = torch.amp.GradScaler("cuda")
        train_one_epoch(model, optimizer, loader, amp, scaler)

Not rewritten (left as it was)
    A test other than a plain comparison of ``torch.__version__`` (through ``LooseVersion``,
    ``StrictVersion``, ``packaging.version.parse``/``Version`` or ``pkg_resources.parse_version``)
    with a version older than 2.3; an ``elif`` on either side; a native branch in the ``else:``
    (``if torch < 1.6: <Apex> else: <native>``); an Apex branch holding other Apex than amp. A
    function the ``amp`` is passed to is left whole where another module of the run imports
    it, where a call gives it something that may not be None, or where it uses its parameter
    in another shape (its ``amp.scale_loss`` stays, with AMP026, and runs only as it ran).

Safety
    Exact on torch 2.3 and newer, which the migrated code needs anyway: the deleted branch
    never ran there, and the names it bound held there what they hold now. The native branch
    is kept as the project wrote it: it does what it did on every torch since 1.6 (autocast
    whatever the opt level said; a CTC loss registered as float32 with Apex is not registered
    with torch, whose autocast list runs ``ctc_loss`` in float32 anyway).

References
    hirofumi0810/neural_sp: neural_sp/bin/asr/train.py and neural_sp/bin/lm/train.py (the
    "Mixed precision training setting"); espnet/espnet PR #1779.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import libcst as cst

from migrate.rules import _syntax as syntax
from migrate.rules._bindings import dotted_name
from migrate.rules._context import ModuleContext
from migrate.rules._setup import amp_references

RULE = "amp_version_fallback"

# the first torch release whose native API the migrated code needs (torch.amp.GradScaler("cuda"))
_NEEDED = (2, 3)
_VERSION_CALLS = frozenset({"LooseVersion", "StrictVersion", "parse", "Version", "parse_version"})
_NEWER = {">=": True, ">": True, "<": False, "<=": False}
_FLIPPED = {">=": "<=", ">": "<", "<": ">", "<=": ">="}


def _version_of(node: cst.BaseExpression) -> tuple[int, int] | str | None:
    """``"torch"`` for ``F(torch.__version__)``; (major, minor) for ``F("1.6.0")``; else None."""
    if not (isinstance(node, cst.Call) and len(node.args) == 1 and node.args[0].keyword is None):
        return None
    name = dotted_name(node.func) or ""
    if name.rpartition(".")[2] not in _VERSION_CALLS:
        return None
    value = node.args[0].value
    if dotted_name(value) == "torch.__version__":
        return "torch"
    literal = syntax.literal(value)
    match = re.fullmatch(r"(\d+)\.(\d+)(\.\d+)*", literal) if isinstance(literal, str) else None
    return (int(match.group(1)), int(match.group(2))) if match else None


def _always_true(test: cst.BaseExpression) -> bool | None:
    """Whether the test says "torch is newer than an old version" (True) or "older" (False),
    on every torch from 2.3 on; None when it is no such test."""
    if not (isinstance(test, cst.Comparison) and len(test.comparisons) == 1):
        return None
    operator = syntax.code(test.comparisons[0].operator).strip()
    if operator not in _NEWER:
        return None
    left, right = _version_of(test.left), _version_of(test.comparisons[0].comparator)
    if left != "torch":
        left, right, operator = right, left, _FLIPPED[operator]
    if left != "torch" or not isinstance(right, tuple) or right >= _NEEDED:
        return None
    return _NEWER[operator]


@dataclass
class _Fallback:
    """``if <torch is new>: <native> else: <Apex>``."""

    choice: cst.If
    dead: cst.CSTNode  # the Apex branch's block
    scope: cst.CSTNode
    names: set[str] = field(default_factory=set)  # the amp names the Apex branch binds


def _fallbacks(ctx: ModuleContext) -> list[_Fallback]:
    found = []
    for call in ctx.nodes_of(cst.Call):
        comparison = ctx.parent(call)
        choice = ctx.parent(comparison) if isinstance(comparison, cst.Comparison) else None
        if _version_of(call) != "torch" or not isinstance(choice, cst.If) or choice.test is not comparison:
            continue
        if _always_true(choice.test) is not True or not isinstance(choice.orelse, cst.Else):
            continue
        if isinstance(ctx.parent(choice), cst.If) or ctx.skipped(choice):
            continue  # an `elif`: the branches above it decide first
        found.append(_Fallback(choice, choice.orelse.body, ctx.scope_of(choice)))
    return found


def _inside(ctx: ModuleContext, node: cst.CSTNode, region: cst.CSTNode) -> bool:
    return any(ancestor is region for ancestor in ctx.ancestors(node))


def _only_amp(ctx: ModuleContext, fallback: _Fallback) -> bool:
    """The Apex branch uses Apex's amp and no other Apex (whose rules would plan inside it)."""
    uses_amp = False
    for name in ctx.walk(fallback.dead):
        if not isinstance(name, cst.Name) or not ctx.tracks(name.value):
            continue
        binding = ctx.resolve(name.value, name)
        if binding is None:
            continue
        if binding.kind in ("amp", "amp_function") or (binding.kind == "apex" and binding.target == "apex"):
            uses_amp = True
            if _inside(ctx, binding.statement, fallback.dead):
                fallback.names.add(name.value)
        elif binding.kind != "torch" and binding.kind != "torch_amp":
            return False
    return uses_amp


def _none_only(ctx: ModuleContext, function: cst.CSTNode, name: str, dead: cst.CSTNode) -> bool:
    """Every binding of ``name`` in ``function`` outside ``dead`` stores None (``amp = None``,
    ``amp, scaler = None, None``), and the function has no parameter of that name."""
    if isinstance(function, cst.FunctionDef) and name in syntax.parameter_names(function):
        return False
    for node in ctx.walk(function, into_definitions=False):
        if not (isinstance(node, cst.Name) and node.value == name) or _inside(ctx, node, dead):
            continue
        parent = ctx.parent(node)
        if isinstance(parent, (cst.Global, cst.Nonlocal, cst.NameItem)):
            return False
        if isinstance(parent, cst.AssignTarget):
            statement = ctx.parent(parent)
            if not (isinstance(statement, cst.Assign) and _is_none(statement.value)):
                return False
        elif isinstance(parent, cst.Element) and isinstance(ctx.parent(parent), cst.Tuple):
            target = ctx.parent(parent)
            holder = ctx.parent(target)
            statement = ctx.parent(holder) if isinstance(holder, cst.AssignTarget) else None
            if statement is None:
                continue  # a tuple read, not a target
            if not (isinstance(statement, cst.Assign) and isinstance(statement.value, cst.Tuple)):
                return False
            assert isinstance(target, cst.Tuple)
            index = next(i for i, element in enumerate(target.elements) if element is parent)
            values = statement.value.elements
            if len(values) != len(target.elements) or not _is_none(values[index].value):
                return False
        elif isinstance(parent, (cst.AugAssign, cst.AnnAssign, cst.For, cst.AsName, cst.NamedExpr, cst.CompFor)):
            if getattr(parent, "target", None) is node or getattr(parent, "name", None) is node:
                return False
    return True


def _is_none(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Name) and node.value == "None"


@dataclass
class _Fold:
    """The edits that drop a function's code for an ``amp`` parameter that only ever holds None."""

    keep_first: list[cst.If] = field(default_factory=list)  # `if S is not None: S... else: amp...`
    drop: list[cst.If] = field(default_factory=list)  # `if amp is not None: ...` with no else
    take_else: list[cst.If] = field(default_factory=list)  # `if amp is not None: ... else: ...`
    calls: list[cst.Call] = field(default_factory=list)  # the amp calls that go with them


def _presence_test(test: cst.BaseExpression, name: str) -> bool:
    """``amp`` or ``amp is not None``."""
    if isinstance(test, cst.Name):
        return test.value == name
    return (
        isinstance(test, cst.Comparison)
        and isinstance(test.left, cst.Name)
        and test.left.value == name
        and len(test.comparisons) == 1
        and isinstance(test.comparisons[0].operator, cst.IsNot)
        and _is_none(test.comparisons[0].comparator)
    )


def _fold_parameter(ctx: ModuleContext, function: cst.FunctionDef, name: str, fold: _Fold) -> bool:
    """Plan how ``function`` drops its code for parameter ``name``; False if some use has another shape."""
    for node in ctx.walk(function.body, into_definitions=False):
        if not (isinstance(node, cst.Name) and node.value == name):
            continue
        parent = ctx.parent(node)
        if isinstance(parent, cst.Attribute) and parent.attr is node:
            continue
        if isinstance(parent, cst.Arg):
            continue  # passed on (None, as it came), or the keyword of `f(amp=...)`
        if isinstance(parent, (cst.If, cst.Comparison)):
            branch = parent if isinstance(parent, cst.If) else ctx.parent(parent)
            if not (isinstance(branch, cst.If) and _presence_test(branch.test, name)):
                return False
            if isinstance(ctx.parent(branch), cst.If) or isinstance(branch.orelse, cst.If):
                return False  # an `elif` chain
            (fold.take_else if branch.orelse is not None else fold.drop).append(branch)
            continue
        choice = _scaled_in_else(ctx, node)
        if choice is None:
            return False
        fold.keep_first.append(choice)
    return True


def _scaled_in_else(ctx: ModuleContext, node: cst.Name) -> cst.If | None:
    """``if S is not None: S.f(...)... else: with amp.scale_loss(...) as x: ...``: the ``if``."""
    attribute = ctx.parent(node)
    call = ctx.parent(attribute) if isinstance(attribute, cst.Attribute) else None
    item = ctx.parent(call) if isinstance(call, cst.Call) and call.func is attribute else None
    with_ = ctx.parent(item) if isinstance(item, cst.WithItem) else None
    if not (isinstance(with_, cst.With) and with_.items[0] is item):
        return None
    block = ctx.parent(with_)
    orelse = ctx.parent(block) if isinstance(block, cst.IndentedBlock) else None
    choice = ctx.parent(orelse) if isinstance(orelse, cst.Else) else None
    if not (isinstance(choice, cst.If) and isinstance(block, cst.IndentedBlock) and block.body[0] is with_):
        return None
    test = choice.test
    if not (
        isinstance(test, cst.Comparison)
        and isinstance(test.left, cst.Name)
        and len(test.comparisons) == 1
        and isinstance(test.comparisons[0].operator, cst.IsNot)
        and _is_none(test.comparisons[0].comparator)
    ):
        return None
    scaler = test.left.value
    first = choice.body.body[0] if isinstance(choice.body, cst.IndentedBlock) else None
    small = syntax.sole_statement(first) if first is not None else None
    # its first step reads an attribute of the scaler: with the scaler None, it raises as the else did
    if not (isinstance(small, cst.Expr) and _starts_with_attribute_of(small.value, scaler)):
        return None
    return choice


def _starts_with_attribute_of(node: cst.BaseExpression, name: str) -> bool:
    """``name.f(...)`` or ``name.f(...).g(...)``: the first thing evaluated is ``name.f``."""
    while True:
        if isinstance(node, cst.Call):
            node = node.func
        elif isinstance(node, cst.Attribute):
            if isinstance(node.value, cst.Name):
                return node.value.value == name
            node = node.value
        else:
            return False


def _callees(ctx: ModuleContext, scope: cst.CSTNode, name: str) -> dict[str, list[tuple[cst.Call, cst.Arg]]]:
    """The module's own functions ``name`` is passed to from ``scope``: function name -> (call, argument)."""
    found: dict[str, list[tuple[cst.Call, cst.Arg]]] = {}
    for node in ctx.walk(scope, into_definitions=False):
        if not (isinstance(node, cst.Name) and node.value == name):
            continue
        argument = ctx.parent(node)
        call = ctx.parent(argument) if isinstance(argument, cst.Arg) else None
        if isinstance(call, cst.Call) and isinstance(call.func, cst.Name):
            assert isinstance(argument, cst.Arg)
            found.setdefault(call.func.value, []).append((call, argument))
    return found


def _module_function(ctx: ModuleContext, name: str) -> cst.FunctionDef | None:
    defined = [
        statement
        for statement in ctx.module.body
        if isinstance(statement, cst.FunctionDef) and statement.name.value == name
    ]
    return defined[0] if len(defined) == 1 else None


def _parameter_of(function: cst.FunctionDef, call: cst.Call, argument: cst.Arg) -> str | None:
    """The parameter of ``function`` that ``argument`` of ``call`` fills."""
    if function.params.star_arg is not cst.MaybeSentinel.DEFAULT or function.params.star_kwarg is not None:
        return None
    parameters = syntax.parameter_names(function)
    if any(arg.star for arg in call.args):
        return None
    if argument.keyword is not None:
        return argument.keyword.value if argument.keyword.value in parameters else None
    index = [arg for arg in call.args if arg.keyword is None].index(argument)
    positional = [*function.params.posonly_params, *function.params.params]
    return positional[index].name.value if index < len(positional) else None


def _fold_callees(ctx: ModuleContext, fallback: _Fallback, name: str, fold: _Fold) -> None:
    """Fold the module's functions that only ever get the None-only ``name`` for a parameter."""
    exported = ctx.options.facts.exported
    for callee, calls in _callees(ctx, fallback.scope, name).items():
        function = _module_function(ctx, callee)
        if function is None or callee in exported or "*" in exported:
            continue
        parameters = {_parameter_of(function, call, argument) for call, argument in calls}
        if len(parameters) != 1 or None in parameters:
            continue
        parameter = parameters.pop()
        assert parameter is not None
        # every call of it in the module gives it this None-only name, None or nothing
        callers = [node for node in ctx.nodes_of(cst.Name) if node.value == callee and node is not function.name]
        if any(not _gives_none(ctx, node, function, parameter, fallback, name) for node in callers):
            continue
        local = _Fold()
        if _fold_parameter(ctx, function, parameter, local):
            fold.keep_first += local.keep_first
            fold.drop += local.drop
            fold.take_else += local.take_else


def _gives_none(
    ctx: ModuleContext, node: cst.Name, function: cst.FunctionDef, parameter: str, fallback: _Fallback, name: str
) -> bool:
    call = ctx.parent(node)
    if not (isinstance(call, cst.Call) and call.func is node):
        return False  # the function used as a value: who knows what it is given
    for argument in call.args:
        if _parameter_of(function, call, argument) != parameter:
            continue
        value = argument.value
        if _is_none(value):
            return True
        return (
            isinstance(value, cst.Name)
            and value.value == name
            and ctx.scope_of(call) is fallback.scope
            and not _inside(ctx, call, fallback.dead)
        )
    default = next((p.default for p in function.params.params if p.name.value == parameter), None)
    return default is not None and _is_none(default)


def _without_else(updated: cst.CSTNode) -> cst.CSTNode:
    assert isinstance(updated, cst.If)
    return updated.with_changes(orelse=None)


def _keep_else(updated: cst.CSTNode) -> list[cst.BaseStatement]:
    assert isinstance(updated, cst.If) and isinstance(updated.orelse, cst.Else)
    return list(updated.orelse.body.body)  # type: ignore[attr-defined]


def plan(ctx: ModuleContext) -> None:
    for fallback in _fallbacks(ctx):
        if not _only_amp(ctx, fallback):
            continue
        fold = _Fold()
        for name in sorted(fallback.names):
            if _none_only(ctx, fallback.scope, name, fallback.dead):
                _fold_callees(ctx, fallback, name, fold)
        ctx.plan.unwrap.add(fallback.choice)
        ctx.plan.replace[fallback.choice] = _without_else  # its comments go with it
        dropped: list[cst.CSTNode] = [fallback.dead]
        for choice in fold.keep_first:
            ctx.plan.unwrap.add(choice)
            assert isinstance(choice.orelse, cst.Else)
            dropped.append(choice.orelse)
        for branch in fold.drop:
            ctx.plan.remove.add(branch)
            dropped.append(branch.body)
        for branch in fold.take_else:
            ctx.plan.replace_statement[branch] = list(branch.orelse.body.body)  # type: ignore[union-attr]
            dropped.append(branch.body)
        ctx.dropped.extend(dropped)
        # the amp names the Apex branch bound never held Apex's module on the torch the code now needs:
        # no other rule sees them
        gone = {
            reference
            for reference in amp_references(ctx)
            if (binding := ctx.resolve(reference.value, reference)) is not None
            and _inside(ctx, binding.statement, fallback.dead)
        }
        ctx.consumed.update(gone)
        model = ctx.amp
        model.calls[:] = [use for use in model.calls if use.base not in gone]
        model.value_uses[:] = [name for name in model.value_uses if name not in gone]
        model.private_uses[:] = [use for use in model.private_uses if use.value not in gone]
        model.other_attributes[:] = [use for use in model.other_attributes if use.value not in gone]
        folded = f"; {_describe(ctx, fold)}" if fold.keep_first or fold.drop or fold.take_else else ""
        ctx.report(
            "AMP034",
            fallback.choice,
            f"`if {' '.join(syntax.code(fallback.choice.test).split())}:` is true on every torch the migrated code "
            f"needs (2.3 and newer): its native branch takes its place and the Apex branch in its `else:`, which "
            f"never runs there, goes{folded}",
        )
    if ctx.consumed and all(reference in ctx.consumed for reference in amp_references(ctx)):
        ctx.amp_folded_away = True


def _describe(ctx: ModuleContext, fold: _Fold) -> str:
    lines = sorted(ctx.position(node)[0] for node in (*fold.keep_first, *fold.drop, *fold.take_else))
    return (
        "the amp it passed on only ever holds None, so the code for it goes too (line "
        + ", ".join(map(str, lines))
        + ")"
    )
