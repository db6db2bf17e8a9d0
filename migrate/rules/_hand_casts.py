"""Inputs cast to float16 by hand for a model that Apex O2/O3 made float16.

At O2/O3 Apex cast the model's weights to float16; only the patched ``forward`` of the model
it was given casts what it receives. A script that calls another method of the model
(``model.forward_inference(batch)``), or casts out of habit, writes the cast itself::

    if cfg.fp16:
        mini_batch["visual_inputs"] = mini_batch["visual_inputs"].half()
    outputs = forward_inference_step(model, mini_batch)

The migration keeps the model in float32 (autocast stands for O2/O3), where that float16
input would meet float32 weights. ``droppable`` proves, cast by cast, that the cast can go
with the setup; anything it cannot prove is left, and the setup with it (AMP005):

- the cast is a whole line ``T = X.half()``, ``T`` a local name or ``D["key"]`` of a local
  dict, alone in the body of an ``if`` on the setup's ``enabled=`` flag (no ``else``), or
  unguarded where the setup is always on;
- the very next line calls the model: ``model(...)`` or ``model.method(...)``, or a module
  function whose whole body is that one call on two of its parameters (``forward_step(model,
  batch)``), and ``T`` (or ``D``) is one of the arguments, the line's only mention of it;
- nothing else in the function reads ``T`` or ``D`` (stores into ``D[...]`` and new bindings
  aside), so the float16 value reaches that call alone;
- ``model`` is the model an O2/O3 ``amp.initialize`` set up earlier in the same function,
  with ``enabled=`` the very flag of the ``if`` (or, without ``enabled=``, inside an ``if`` on
  that very flag at the top of the function's body); or a parameter, where every call of the
  function in the module (none elsewhere: it is not exported) passes such a model, and the
  flag's object, through the same parameters.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import libcst as cst

from migrate.rules import _syntax as syntax
from migrate.rules._bindings import target_names
from migrate.rules._context import ModuleContext

_MAX_DEPTH = 4  # callers followed up from the cast to the setup


@dataclass(frozen=True)
class Setup:
    """An O2/O3 ``amp.initialize`` at the top level of a function's body, or alone in an ``if
    flag:`` there (``enabled`` is then that flag)."""

    call: cst.Call
    statement: cst.CSTNode
    function: cst.FunctionDef
    models: frozenset[str]  # the plain names it is given and assigns back
    enabled: str | None  # ``enabled=`` normalized; None where always on


@dataclass(frozen=True)
class HandCast:
    """A ``.half()`` the migration drops: its value reaches only the forward of a model that
    an O2/O3 setup (in ``setups``) made float16."""

    call: cst.Call  # ``X.half()``
    statement: cst.CSTNode  # ``T = X.half()``
    unit: cst.CSTNode  # the statement, or the ``if flag:`` that holds it alone
    forward: cst.Call  # the call its value goes to
    model: str  # the name the model has there
    setups: tuple[cst.Call, ...]  # empty where the proof failed: the cast stays, and the setups too


def candidates(ctx: ModuleContext, setups: list[Setup]) -> list[HandCast]:
    """The module's ``.half()`` casts whose next line hands their value to a call on a model;
    those whose value provably reaches only the forward of an O2/O3 model hold its setups."""
    if not setups:
        return []
    found = []
    for call in ctx.nodes_of(cst.Call):
        cast = _prove(ctx, call, setups)
        if cast is not None:
            found.append(cast)
    return found


def plan_drop(ctx: ModuleContext, cast: HandCast) -> None:
    """``T = X.half()`` becomes ``T = X``; ``T = T.half()`` goes, with an ``if`` that held it alone."""
    small = syntax.sole_statement(cast.statement)
    assert isinstance(small, cst.Assign) and isinstance(cast.call.func, cst.Attribute)
    source = cast.call.func.value
    if syntax.normalized(source) == syntax.normalized(small.targets[0].target):
        ctx.plan.remove.add(cast.unit)
        ctx.plan.forget_inner_comments.add(cast.unit)  # `# FIXME why cast by hand?` spoke of the cast
    else:
        ctx.plan.substitute(cast.call, source)
    line = ctx.position(cast.forward)[0]
    ctx.report(
        "AMP001",
        cast.call,
        f"`{ctx.code(cast.call)}` was removed: under Apex O2/O3 the model that receives it (line {line}) had "
        "float16 weights, and this input was cast to match them; the migrated model keeps float32 weights, so "
        "the input stays float32 (outside a torch.autocast region that forward pass now runs in float32: wrap "
        f'it in `with torch.autocast("{ctx.options.device}", dtype=torch.float16):` for float16 speed)',
    )


def _prove(ctx: ModuleContext, call: cst.Call, setups: list[Setup]) -> HandCast | None:
    if not (isinstance(call.func, cst.Attribute) and call.func.attr.value == "half" and not call.args):
        return None
    statement = ctx.statement_of(call)
    small = syntax.sole_statement(statement)
    if not (isinstance(small, cst.Assign) and len(small.targets) == 1 and small.value is call):
        return None
    target = small.targets[0].target
    carrier = _carrier(target)
    function = ctx.function_of(call)
    if carrier is None or function is None or ctx.parent(function) is not ctx.module:
        return None
    located = _unit(ctx, statement)
    if located is None:
        return None
    unit, guard = located
    block = ctx.block_of(unit)
    body: list[cst.CSTNode] = list(block.body)
    at = body.index(unit)
    if at + 1 >= len(body) or syntax.sole_statement(body[at + 1]) is None:
        return None
    forward_line = body[at + 1]
    reached = _forward(ctx, forward_line, carrier, target)
    if reached is None:
        return None
    forward, model = reached
    found: list[cst.Call] = []
    if _only_reaches(ctx, function, carrier, target, statement, unit, forward_line):
        found = _model_set_up(ctx, function, model, unit, guard, setups)
    return HandCast(call, statement, unit, forward, model, tuple(found))


def _carrier(target: cst.BaseExpression) -> str | None:
    """The local name the cast value lives in: ``x`` for ``x``, ``d`` for ``d["key"]``."""
    if isinstance(target, cst.Name):
        return target.value
    if (
        isinstance(target, cst.Subscript)
        and isinstance(target.value, cst.Name)
        and len(target.slice) == 1
        and isinstance(target.slice[0].slice, cst.Index)
        and isinstance(target.slice[0].slice.value, (cst.SimpleString, cst.Integer))
    ):
        return target.value.value
    return None


def _unit(ctx: ModuleContext, statement: cst.CSTNode) -> tuple[cst.CSTNode, cst.BaseExpression | None] | None:
    """The cast's line, or the ``if`` holding it alone, with that ``if``'s test; None where the
    line sits in some other clause (an ``else``, a ``try``, an ``if`` with more in it)."""
    block = ctx.block_of(statement)
    owner = ctx.owner_of_block(block)
    if isinstance(owner, cst.If):
        if owner.orelse is not None or len(block.body) != 1 or not isinstance(ctx.parent(owner), cst.IndentedBlock):
            return None
        unit: cst.CSTNode = owner
        guard: cst.BaseExpression | None = owner.test
    else:
        unit, guard = statement, None
    outer = ctx.owner_of_block(ctx.block_of(unit))
    if not isinstance(outer, (cst.FunctionDef, cst.For, cst.While, cst.With)):
        return None
    return unit, guard


def _forward(
    ctx: ModuleContext, line: cst.CSTNode, carrier: str, target: cst.BaseExpression
) -> tuple[cst.Call, str] | None:
    """The call on the line after the cast that takes the cast value, and the model's name:
    ``model(d)``/``model.f(d)``, or ``helper(model, d)`` for a function that only calls the model."""
    mentions = list(_names(ctx, line, carrier))
    if len(mentions) != 1:
        return None
    node = mentions[0]
    passed: cst.CSTNode = node
    parent = ctx.parent(node)
    if isinstance(target, cst.Subscript) and isinstance(parent, cst.Subscript) and parent.deep_equals(target):
        passed, parent = parent, ctx.parent(parent)
    if not (isinstance(parent, cst.Arg) and parent.value is passed and not parent.star):
        return None
    call = ctx.parent(parent)
    if not isinstance(call, cst.Call):
        return None
    if isinstance(call.func, cst.Name) and _top_level_function(ctx, call.func.value) is not None:
        model = _through_helper(ctx, call, parent)
    elif isinstance(call.func, cst.Name):
        model = call.func.value  # `model(batch)`: proven a model below, or left
    else:
        model = _receiver(call.func)
    return (call, model) if model is not None and model != carrier else None


def _receiver(func: cst.BaseExpression) -> str | None:
    """``model`` for ``model`` and ``model.method``."""
    if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name):
        return func.value.value
    return None


def _through_helper(ctx: ModuleContext, call: cst.Call, passed: cst.Arg) -> str | None:
    """The model's name where ``call`` is ``helper(model, batch)`` and ``helper``, defined once at
    the top of the module, only calls its model parameter on its batch parameter and returns."""
    assert isinstance(call.func, cst.Name)
    helper = _top_level_function(ctx, call.func.value)
    if helper is None or helper.decorators or helper.asynchronous:
        return None
    parameters = syntax.parameter_names(helper)
    bound = syntax.bind_arguments(call, parameters)
    if bound is None or helper.params.star_arg not in (None, cst.MaybeSentinel.DEFAULT) or helper.params.star_kwarg:
        return None
    batch = next((name for name, arg in bound.items() if arg is passed), None)
    inner = [node for node in ctx.walk(helper.body) if isinstance(node, cst.Call)]
    if batch is None or len(inner) != 1:
        return None
    model_call = inner[0]
    if isinstance(model_call.func, cst.Name):
        model_parameter: str | None = model_call.func.value
    else:
        model_parameter = _receiver(model_call.func)
    if model_parameter is None or model_parameter not in bound or model_parameter == batch:
        return None
    for statement in helper.body.body:
        if syntax.is_docstring(statement):
            continue
        small = syntax.sole_statement(statement)
        if isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name):
            continue
        if isinstance(small, (cst.Return, cst.Expr)):
            continue
        return None
    batch_uses = list(_names(ctx, helper.body, batch))
    model_uses = list(_names(ctx, helper.body, model_parameter))
    if len(batch_uses) != 1 or len(model_uses) != 1:
        return None
    use = ctx.parent(batch_uses[0])
    if not (isinstance(use, cst.Arg) and use.value is batch_uses[0] and not use.star and ctx.parent(use) is model_call):
        return None
    model = bound[model_parameter].value
    return model.value if isinstance(model, cst.Name) and not bound[model_parameter].star else None


def _top_level_function(ctx: ModuleContext, name: str) -> cst.FunctionDef | None:
    """The module's top-level function ``name``, where nothing else at the top binds that name."""
    found = []
    for statement in ctx.module.body:
        if isinstance(statement, cst.FunctionDef) and statement.name.value == name:
            found.append(statement)
        elif not isinstance(statement, cst.FunctionDef) and name in _bound_by(ctx, statement):
            return None
    return found[0] if len(found) == 1 else None


def _only_reaches(
    ctx: ModuleContext,
    function: cst.FunctionDef,
    carrier: str,
    target: cst.BaseExpression,
    statement: cst.CSTNode,
    unit: cst.CSTNode,
    forward_line: cst.CSTNode,
) -> bool:
    """Whether the function mentions the carrier only in the cast, on the forward's line, to
    bind it anew, (a dict) to store into it, or (a name) to read it before the cast where no
    float16 value from an earlier turn of a loop can be there: nothing else can see that value."""
    if any(
        isinstance(node, (cst.Global, cst.Nonlocal)) and any(n.name.value == carrier for n in node.names)
        for node in ctx.walk(function)
    ):
        return False
    inside = {id(node) for node in ctx.walk(statement)} | {id(node) for node in ctx.walk(forward_line)}
    fresh = _fresh_before(ctx, unit, carrier) if isinstance(target, cst.Name) else set()
    for node in _names(ctx, function, carrier):
        if id(node) in inside or id(node) in fresh:
            continue
        if _nested(ctx, node, function):
            return False
        parent = ctx.parent(node)
        if isinstance(parent, cst.Param):
            if isinstance(target, cst.Subscript):
                return False  # the caller's dict would hold the float16 value
            continue
        if isinstance(parent, cst.AssignTarget) and parent.target is node:
            continue  # bound anew
        if isinstance(parent, cst.For) and parent.target is node:
            continue
        if (
            isinstance(target, cst.Subscript)
            and isinstance(parent, cst.Subscript)
            and parent.value is node
            and isinstance(ctx.parent(parent), cst.AssignTarget)
        ):
            continue  # `d[k] = v`: a store
        return False
    return True


def _fresh_before(ctx: ModuleContext, unit: cst.CSTNode, name: str) -> set[int]:
    """The nodes of the statements before ``unit`` in its block that cannot see a value the
    cast left in ``name``: the block is the function's body (run once), or the body of a
    ``for name in ...`` loop, or a plain ``name = ...`` line earlier in the block binds it anew."""
    block = ctx.block_of(unit)
    body: list[cst.CSTNode] = list(block.body)
    owner = ctx.owner_of_block(block)
    fresh = isinstance(owner, cst.FunctionDef) or (
        isinstance(owner, cst.For) and isinstance(owner.target, cst.Name) and owner.target.value == name
    )
    nodes: set[int] = set()
    for statement in body[: body.index(unit)]:
        if fresh:
            nodes |= {id(node) for node in ctx.walk(statement)}
        assigned = syntax.name_assignment(statement)
        if assigned is not None and assigned[0] == name:
            fresh = True
    return nodes


def _nested(ctx: ModuleContext, node: cst.CSTNode, function: cst.FunctionDef) -> bool:
    for ancestor in ctx.ancestors(node):
        if ancestor is function:
            return False
        if isinstance(ancestor, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
            return True
    return True


def _names(ctx: ModuleContext, node: cst.CSTNode, name: str) -> Iterator[cst.Name]:
    """The Names under ``node`` that refer to the variable ``name``."""
    for child in ctx.walk(node):
        if isinstance(child, cst.Name) and child.value == name and syntax.names_a_value(child, ctx.parent(child)):
            parent = ctx.parent(child)
            if isinstance(parent, (cst.FunctionDef, cst.ClassDef)) and parent.name is child:
                continue
            yield child


def _binds_here(node: cst.CSTNode) -> set[str]:
    """The plain names ``node`` itself binds (not what its children bind)."""
    if isinstance(node, cst.AssignTarget):
        return set(target_names(node.target))
    if isinstance(node, (cst.AugAssign, cst.AnnAssign, cst.For, cst.NamedExpr)):
        return set(target_names(node.target))
    if isinstance(node, cst.AsName):
        return set(target_names(node.name))
    if isinstance(node, (cst.FunctionDef, cst.ClassDef)):
        return {node.name.value}
    if isinstance(node, cst.Del):
        return set(target_names(node.target))
    if isinstance(node, (cst.Global, cst.Nonlocal)):
        return {item.name.value for item in node.names}
    if isinstance(node, cst.Import):
        return {(a.evaluated_alias or a.evaluated_name).split(".")[0] for a in node.names}
    if isinstance(node, cst.ImportFrom) and not isinstance(node.names, cst.ImportStar):
        return {a.evaluated_alias or a.evaluated_name for a in node.names}
    return set()


def _bound_by(ctx: ModuleContext, node: cst.CSTNode) -> set[str]:
    """The plain names that ``node`` and everything under it (nested definitions included) bind."""
    names: set[str] = set()
    for child in ctx.walk(node):
        names |= _binds_here(child)
    return names


def _rebinds(ctx: ModuleContext, function: cst.FunctionDef, name: str, after: cst.CSTNode | None) -> bool:
    """Whether something in ``function``'s body (after the statement ``after``, where given)
    binds ``name`` or declares it global."""
    skipped = {id(node) for node in ctx.walk(after)} if after is not None else set()
    start = ctx.position(after) if after is not None else (0, 0)
    return any(
        id(node) not in skipped and name in _binds_here(node) and ctx.position(node) > start
        for node in ctx.walk(function.body)
    )


def flag_root(guard: cst.BaseExpression | None) -> str | None:
    """``cfg`` for ``cfg.fp16``, ``fp16`` for ``fp16``; None for anything else."""
    while isinstance(guard, cst.Attribute):
        guard = guard.value
    return guard.value if isinstance(guard, cst.Name) else None


def _model_set_up(
    ctx: ModuleContext,
    function: cst.FunctionDef,
    model: str,
    at: cst.CSTNode,
    guard: cst.BaseExpression | None,
    setups: list[Setup],
    depth: int = 0,
    passed: bool | None = None,
    seen: frozenset[int] = frozenset(),
) -> list[cst.Call]:
    """The O2/O3 setups whose model ``model`` holds at ``at`` in ``function``, switched by
    ``guard`` (None: always on); empty where that cannot be proven for every way there.

    ``passed``: whether the callee got the flag's object through a parameter of the same name
    (True), reads a global one (False), or is the function of the cast itself (None)."""
    wanted = syntax.normalized(guard) if guard is not None else None
    root = flag_root(guard)
    if guard is not None and root is None:
        return []
    parameters = syntax.parameter_names(function)
    local = ctx.locals.get(function, set())
    if root is not None and passed is False and root in local:
        return []  # a local name, not the global flag the callee read
    here = [setup for setup in setups if setup.function is function and model in setup.models]
    if here:
        setup = here[0]
        if len(here) != 1 or setup.enabled != wanted or ctx.position(setup.statement) >= ctx.position(at):
            return []
        if _rebinds(ctx, function, model, setup.statement):
            return []
        return [setup.call]
    if depth >= _MAX_DEPTH or id(function) in seen or model not in parameters or _rebinds(ctx, function, model, None):
        return []
    if root is not None:
        through = root in parameters
        if (passed is True and not through) or (passed is False and through):
            return []
        if through and _rebinds(ctx, function, root, None):
            return []
        if not through and root in local:
            return []  # a local flag, not the one the setup read
        passed = through
    exported = ctx.options.facts.exported
    if function.name.value in exported or "*" in exported or ctx.options.facts.package_init:
        return []  # called from modules out of sight
    if _top_level_function(ctx, function.name.value) is not function:
        return []
    found: list[cst.Call] = []
    for name in ctx.nodes_of(cst.Name):
        if name.value != function.name.value or name is function.name:
            continue
        call = ctx.parent(name)
        if not (isinstance(call, cst.Call) and call.func is name):
            return []  # used as a value: callers out of sight
        caller = ctx.function_of(call)
        if caller is None or ctx.parent(caller) is not ctx.module:
            return []
        bound = syntax.bind_arguments(call, parameters)
        given = bound.get(model) if bound is not None else None
        if given is None or given.star or not isinstance(given.value, cst.Name):
            return []
        if root is not None and passed:
            flag = bound.get(root) if bound is not None else None
            if flag is None or flag.star or not (isinstance(flag.value, cst.Name) and flag.value.value == root):
                return []
        upstream = _model_set_up(
            ctx, caller, given.value.value, call, guard, setups, depth + 1, passed, seen | {id(function)}
        )
        if not upstream:
            return []
        found.extend(c for c in upstream if c not in found)
    return found
