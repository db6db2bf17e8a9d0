"""Whether an optimizer provably holds every parameter of a module.

``if fp16: clip(amp.master_params(optimizer), n) else: clip(model.parameters(), n)`` folds into
``unscale_`` + ``clip(model.parameters(), n)`` only where both arms clip the same gradients: an
optimizer built over part of the model (``AdamW(model.classifier.parameters())``) left the rest
out of Apex's norm, and clipping them all would scale the update differently. Proven shapes:
``Opt(model.parameters(), ...)`` and the grouped lists that split ``model.named_parameters()``
by one test and its negation (the usual weight-decay split).
"""

from __future__ import annotations

import libcst as cst

from migrate.rules import _syntax as syntax
from migrate.rules._bindings import dotted_name
from migrate.rules._context import ModuleContext

# calls whose result holds the same parameters as their module argument
_WRAPPERS = ("DataParallel", "DistributedDataParallel")
_MOVES = frozenset({"to", "cuda", "cpu", "half", "float", "train"})


def holds_every_parameter(
    ctx: ModuleContext, optimizer: cst.BaseExpression, parameters: cst.BaseExpression, at: cst.CSTNode
) -> bool:
    """Whether ``optimizer`` (as read at ``at``) was built over every parameter that
    ``parameters`` (``X.parameters()``) yields."""
    owner = _parameters_owner(parameters)
    if owner is None:
        return False
    function = ctx.function_of(at)
    modules = _aliases(ctx, owner, function)
    built = [
        value
        for value in _values_assigned(ctx, _region_of(ctx, optimizer, function), syntax.normalized(optimizer))
        if not _returned_by_initialize(ctx, value)
    ]
    return bool(built) and all(
        value is not None and _covers(ctx, value, modules, ctx.function_of(value)) for value in built
    )


def _returned_by_initialize(ctx: ModuleContext, value: cst.BaseExpression | None) -> bool:
    """``self.optimizer = optimizer`` after ``model, optimizer = amp.initialize(...)``: the
    optimizer amp.initialize was given, which is read at its own assignment."""
    if not isinstance(value, cst.Name):
        return False
    function = ctx.function_of(value)
    unpacks: list[cst.Assign] = []
    others = _values_assigned(ctx, function if function is not None else ctx.module, value.value, unpacks)
    return bool(unpacks) and not others


def _parameters_owner(parameters: cst.BaseExpression) -> cst.BaseExpression | None:
    parameters = syntax.strip_parens(parameters)
    if (
        isinstance(parameters, cst.Call)
        and not parameters.args
        and isinstance(parameters.func, cst.Attribute)
        and parameters.func.attr.value == "parameters"
    ):
        return parameters.func.value
    return None


def _region_of(ctx: ModuleContext, optimizer: cst.BaseExpression, function: cst.FunctionDef | None) -> cst.CSTNode:
    """Where ``optimizer`` is assigned: its function for a local name, the class for ``self.x``."""
    if isinstance(optimizer, cst.Attribute) and function is not None:
        owner = ctx.class_of_method(function)
        if owner is not None and syntax.code(optimizer.value) == ctx.self_name(function):
            return owner
    return function if function is not None else ctx.module


def _values_assigned(
    ctx: ModuleContext, region: cst.CSTNode, target: str, initialize_unpacks: list[cst.Assign] | None = None
) -> list[cst.BaseExpression | None]:
    """The values assigned to ``target`` in ``region``; None for one it cannot read (an unpacking
    other than amp.initialize's, an augmented assignment). amp.initialize's unpackings return
    what they were given, so they are left out (and collected in ``initialize_unpacks``)."""
    values: list[cst.BaseExpression | None] = []
    for node in ctx.walk(region):
        if isinstance(node, cst.Assign):
            for assign_target in node.targets:
                element = assign_target.target
                if isinstance(element, (cst.Tuple, cst.List)):
                    if any(syntax.normalized(item.value) == target for item in element.elements):
                        initialize = (
                            (dotted_name(node.value.func) or "").endswith("initialize")
                            if isinstance(node.value, cst.Call)
                            else False
                        )
                        if not initialize:
                            values.append(None)
                        elif initialize_unpacks is not None:
                            initialize_unpacks.append(node)
                elif syntax.normalized(element) == target:
                    values.append(node.value)
        elif isinstance(node, (cst.AnnAssign, cst.AugAssign)) and syntax.normalized(node.target) == target:
            values.append(node.value if isinstance(node, cst.AnnAssign) else None)
    return values


def _aliases(ctx: ModuleContext, owner: cst.BaseExpression, function: cst.FunctionDef | None) -> set[str]:
    """The spellings of the module ``owner`` names at the clip: itself, and what every assignment
    to it in the function wraps, moves or aliases (``model = DDP(model)``, ``model = self.model``)."""
    names = {syntax.normalized(owner)}
    if function is None:
        return names
    pending = [syntax.normalized(owner)]
    while pending:
        name = pending.pop()
        values = _values_assigned(ctx, function, name)
        sources = [_source_module(value) for value in values]
        if any(source is None for source in sources):
            return {syntax.normalized(owner)}  # reassigned to something else somewhere
        for source in sources:
            assert source is not None
            text = syntax.normalized(source)
            if text not in names:
                names.add(text)
                pending.append(text)
    return names


def _source_module(value: cst.BaseExpression | None) -> cst.BaseExpression | None:
    """The module ``value`` holds the parameters of: ``m`` in ``m``, ``DDP(m, ...)``, ``m.to(d)``."""
    if value is None:
        return None
    if isinstance(value, (cst.Name, cst.Attribute)):
        return value
    if isinstance(value, cst.Call):
        name = dotted_name(value.func) or ""
        if name.endswith(_WRAPPERS) and value.args and value.args[0].keyword is None:
            return value.args[0].value
        if isinstance(value.func, cst.Attribute) and value.func.attr.value in _MOVES:
            return value.func.value
    return None


def _covers(ctx: ModuleContext, built: cst.BaseExpression, modules: set[str], function: cst.FunctionDef | None) -> bool:
    if not isinstance(built, cst.Call):
        return False
    bound = syntax.bind_arguments(built, ("params",), partial=True)
    if "params" not in bound:
        return False
    params = syntax.strip_parens(bound["params"].value)
    modules = modules | _stored_from(ctx, function, modules)
    owner = _parameters_owner(params)
    if owner is not None:
        return syntax.normalized(owner) in modules
    if not isinstance(params, cst.Name):
        return False
    groups = _values_assigned(ctx, function if function is not None else ctx.module, params.value)
    return len(groups) == 1 and _split_groups(ctx, groups[0], modules, function)


def _stored_from(ctx: ModuleContext, function: cst.FunctionDef | None, modules: set[str]) -> set[str]:
    """The names the constructor's function stored as one of ``modules`` (``self.student = student``
    in ``__init__``, where the optimizer is built over ``student``)."""
    found: set[str] = set()
    for node in ctx.walk(function if function is not None else ctx.module):
        if (
            isinstance(node, cst.Assign)
            and len(node.targets) == 1
            and syntax.normalized(node.targets[0].target) in modules
            and isinstance(node.value, (cst.Name, cst.Attribute))
        ):
            found.add(syntax.normalized(node.value))
    return found


def _split_groups(
    ctx: ModuleContext, groups: cst.BaseExpression | None, modules: set[str], function: cst.FunctionDef | None
) -> bool:
    """``[{"params": [p for n, p in m.named_parameters() if not T]}, {"params": [... if T]}]``,
    or one group over them all."""
    if not isinstance(groups, cst.List) or not groups.elements:
        return False
    tests: list[str] = []
    for element in groups.elements:
        group = element.value
        if not isinstance(group, cst.Dict):
            return False
        selected = [
            item.value
            for item in group.elements
            if isinstance(item, cst.DictElement) and syntax.literal(item.key) == "params"
        ]
        if len(selected) != 1:
            return False
        test = _selection_test(ctx, selected[0], modules, function)
        if test is None:
            return False
        tests.append(test)
    if tests == [""]:
        return True
    if len(tests) != 2 or "" in tests:
        return False
    first, second = tests
    return first == f"not{second}" or second == f"not{first}" or first == f"not({second})" or second == f"not({first})"


def _selection_test(
    ctx: ModuleContext, selection: cst.BaseExpression, modules: set[str], function: cst.FunctionDef | None
) -> str | None:
    """The normalized test of ``[p for n, p in m.named_parameters() if test]`` ("" without one)."""
    if not isinstance(selection, (cst.ListComp, cst.GeneratorExp)):
        return None
    loop = selection.for_in
    if loop.inner_for_in is not None or len(loop.ifs) > 1:
        return None
    if not _named_parameters_of(ctx, loop.iter, modules, function):
        return None
    if not (
        isinstance(loop.target, cst.Tuple)
        and len(loop.target.elements) == 2
        and syntax.normalized(loop.target.elements[1].value) == syntax.normalized(selection.elt)
    ):
        return None
    if not loop.ifs:
        return ""
    test = syntax.strip_parens(loop.ifs[0].test)
    # `... and p.requires_grad`: a parameter left out by it gets no gradient to clip
    if (
        isinstance(test, cst.BooleanOperation)
        and isinstance(test.operator, cst.And)
        and syntax.normalized(test.right) == f"{syntax.normalized(selection.elt)}.requires_grad"
    ):
        test = syntax.strip_parens(test.left)
    return syntax.normalized(test)


def _named_parameters_of(
    ctx: ModuleContext, iterable: cst.BaseExpression, modules: set[str], function: cst.FunctionDef | None
) -> bool:
    """``m.named_parameters()``, or a name bound once to it (or to ``list(...)`` of it)."""
    iterable = syntax.strip_parens(iterable)
    if isinstance(iterable, cst.Name):
        values = _values_assigned(ctx, function if function is not None else ctx.module, iterable.value)
        if len(values) != 1 or values[0] is None:
            return False
        iterable = values[0]
        if isinstance(iterable, cst.Call) and dotted_name(iterable.func) == "list" and len(iterable.args) == 1:
            iterable = iterable.args[0].value
    return (
        isinstance(iterable, cst.Call)
        and not iterable.args
        and isinstance(iterable.func, cst.Attribute)
        and iterable.func.attr.value == "named_parameters"
        and syntax.normalized(iterable.func.value) in modules
    )
