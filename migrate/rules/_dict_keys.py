"""The keys a ``**kwargs`` dict may hold where a call unpacks it.

timm's optimizer factory (and its copies: ConvNeXt, RepLKNet) builds the optimizer's keywords
in a dict, then calls each optimizer with them::

    opt_args = dict(lr=args.lr, weight_decay=weight_decay)
    if args.opt_eps is not None:
        opt_args["eps"] = args.opt_eps
    ...
    elif opt_lower == "fusedsgd":
        opt_args.pop("eps", None)
        optimizer = FusedSGD(parameters, momentum=args.momentum, **opt_args)

Where the function builds the dict from a literal and changes it only by ``d["k"] = ...``,
``d.setdefault("k", ...)`` and ``d.pop("k"...)``, the keys it may hold at the call (and those it
surely holds) are known: a key set on some path is possible, a key set where the call always
runs after it is sure, a key popped where the call always runs after it is gone.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from migrate.rules import _syntax as syntax
from migrate.rules._bindings import rebound
from migrate.rules._context import ModuleContext


@dataclass(frozen=True)
class Keys:
    """The keys the dict may hold where the call unpacks it, and those it surely holds."""

    possible: frozenset[str]
    sure: frozenset[str]


def _literal_keys(value: cst.BaseExpression, ctx: ModuleContext) -> list[str] | None:
    """The keys of ``dict(a=1, b=2)`` or ``{"a": 1, "b": 2}``; None for any other value."""
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value == "dict":
        if rebound(ctx, "dict") or any(arg.star or arg.keyword is None for arg in value.args):
            return None
        return [arg.keyword.value for arg in value.args if arg.keyword is not None]
    if isinstance(value, cst.Dict):
        keys = []
        for element in value.elements:
            if not isinstance(element, cst.DictElement) or not isinstance(element.key, cst.SimpleString):
                return None
            key = element.key.evaluated_value
            if not isinstance(key, str):
                return None
            keys.append(key)
        return keys
    return None


def _dominates(ctx: ModuleContext, statement: cst.CSTNode, call: cst.Call) -> bool:
    """Whether ``call`` runs only after ``statement`` ran: the statement stands earlier in a
    block that holds the call."""
    block = ctx.parent(statement)
    return (
        isinstance(block, cst.IndentedBlock)
        and any(ancestor is block for ancestor in ctx.ancestors(call))
        and ctx.position(statement) < ctx.position(call)
    )


def _key(arg: cst.Arg | cst.SubscriptElement) -> str | None:
    value = arg.value if isinstance(arg, cst.Arg) else arg.slice
    if isinstance(value, cst.Index):
        value = value.value
    if isinstance(value, cst.SimpleString) and isinstance(value.evaluated_value, str):
        return value.evaluated_value
    return None


def _event(ctx: ModuleContext, name: cst.Name) -> tuple[str, str, cst.CSTNode] | str | None:
    """What one use of the dict's name does: ("set" | "pop", key, statement); None for a read
    that leaves it as it is; a reason where the use may change it in a way not followed."""
    parent = ctx.parent(name)
    if isinstance(parent, cst.Arg) and parent.star == "**":
        return None  # unpacked into a call: read
    if isinstance(parent, cst.Subscript) and parent.value is name and len(parent.slice) == 1:
        holder = ctx.parent(parent)
        if isinstance(holder, cst.AssignTarget):
            assign = ctx.parent(holder)
            key = _key(parent.slice[0])
            if key is None or not isinstance(assign, cst.Assign) or len(assign.targets) != 1:
                return f"`{syntax.code(parent)}` sets a key not spelled as a string"
            return "set", key, ctx.statement_of(assign)
        if isinstance(holder, (cst.Del, cst.AugAssign, cst.AnnAssign, cst.For, cst.CompFor, cst.AsName, cst.Element)):
            return f"`{syntax.code(parent)}` on line {ctx.position(parent)[0]} may be assigned"
        return None  # `d["k"]` read
    if isinstance(parent, cst.Attribute) and parent.value is name:
        call = ctx.parent(parent)
        method = parent.attr.value
        if method in ("get", "keys", "values", "items", "copy") and isinstance(call, cst.Call):
            return None
        if method in ("pop", "setdefault") and isinstance(call, cst.Call) and call.func is parent and call.args:
            key = _key(call.args[0])
            statement = ctx.statement_of(call)
            line = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else None
            sole = isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
            if key is None or not sole or not isinstance(line, (cst.Expr, cst.Assign)) or line.value is not call:
                return f"`{name.value}.{method}(...)` on line {ctx.position(call)[0]} is not a statement of its own"
            return ("pop" if method == "pop" else "set"), key, statement
        return f"`{name.value}.{method}` on line {ctx.position(parent)[0]} may change it"
    if isinstance(parent, cst.Comparison) or isinstance(parent, cst.ComparisonTarget):
        return None  # `"k" in d`
    return f"`{name.value}` is used on line {ctx.position(name)[0]} where it may be changed or shared"


def dict_keys(ctx: ModuleContext, call: cst.Call, spread: cst.Name) -> Keys | str:
    """The keys the dict named ``spread`` (unpacked into ``call`` as ``**spread``) may hold
    there, or why they are not known."""
    function = ctx.function_of(call)
    if function is None:
        return f"`{spread.value}` is not a variable of a function"
    loops = []
    for ancestor in ctx.ancestors(call):
        if ancestor is function:
            break
        if isinstance(ancestor, (cst.For, cst.While)):
            loops.append(ancestor)
    if loops:
        return "the call is in a loop, where the dict may change between calls"
    names = [node for node in ctx.walk(function) if isinstance(node, cst.Name) and node.value == spread.value]
    inner = [node for node in names if ctx.scope_of(node) is not function]
    if inner:
        return f"`{spread.value}` is used in a nested definition (line {ctx.position(inner[0])[0]})"
    literal: cst.Assign | None = None
    events: list[tuple[str, str, cst.CSTNode]] = []
    for name in names:
        parent = ctx.parent(name)
        if name is spread:
            continue
        if isinstance(parent, cst.AssignTarget) and parent.target is name:
            assign = ctx.parent(parent)
            if literal is not None or not isinstance(assign, cst.Assign) or len(assign.targets) != 1:
                return f"`{spread.value}` is assigned more than once"
            literal = assign
            continue
        if isinstance(parent, (cst.Param, cst.NameItem, cst.AsName, cst.For, cst.CompFor, cst.AugAssign)):
            return f"`{spread.value}` is bound by `{syntax.code(parent).strip()}`"
        event = _event(ctx, name)
        if isinstance(event, str):
            return event
        if event is not None:
            events.append(event)
    if literal is None:
        return f"`{spread.value}` is not built in this function"
    keys = _literal_keys(literal.value, ctx)
    if keys is None or not _dominates(ctx, ctx.statement_of(literal), call):
        return f"`{spread.value}` is not built from a dict literal before the call in the same function"
    possible, sure = set(keys), set(keys)
    for kind, key, statement in sorted(events, key=lambda event: ctx.position(event[2])):
        if any(ancestor is statement for ancestor in ctx.ancestors(call)) or statement is ctx.statement_of(call):
            return f"`{spread.value}` changes in the statement of the call"
        if ctx.position(statement) > ctx.position(call):
            continue  # the call ran before it (no loop holds the call)
        dominates = _dominates(ctx, statement, call)
        if kind == "set":
            possible.add(key)
            if dominates:
                sure.add(key)
        else:
            sure.discard(key)
            if dominates:
                possible.discard(key)
    return Keys(frozenset(possible), frozenset(sure))
