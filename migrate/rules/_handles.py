"""The old Apex amp API: ``handle = amp.init(...)`` and what is reached through the handle.

Before ``amp.initialize`` (Apex 0.1, 2019) mixed precision went through a handle:
``amp_handle = amp.init(enabled=...)`` patched torch as O1 does, ``amp_handle.scale_loss(loss,
optimizer)`` scaled a loss with the handle's dynamic LossScaler, and
``optimizer = amp_handle.wrap_optimizer(optimizer, num_loss=N)`` returned an ``OptimWrapper``
whose ``optimizer.scale_loss(loss)`` and ``optimizer.step()`` did the same per loss. So the
handle *is* an ``amp.initialize`` O1 setup: this module finds the handles (a plain
``name = amp.init(...)`` or ``self.name = amp.init(...)``), the wrappers made from them, and
tells ``ModuleContext.amp_api`` that ``handle.scale_loss`` and ``wrapper.scale_loss`` are amp's
``scale_loss``, so that the amp rules migrate them like the newer API.

A handle (or wrapper) is matched by its spelling where its assignment can be seen: in the
function that assigned it (and closures there), in any method of the class for
``self.<name>``, anywhere in the module for a module-level name that a function does not
rebind, and in a module-level function whose every call passes it as one argument (``Received``:
the scaler is passed there instead). A reference the rules do not rewrite away (the handle
tested, stored, ``handle._deactivate()``) keeps the whole setup as it was (``leftovers``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import libcst as cst

from migrate.rules import _syntax as syntax
from migrate.rules._bindings import dotted_name

if TYPE_CHECKING:  # _context builds the handles
    from migrate.rules._context import ModuleContext

# what the handle and the wrapper offered that maps onto the GradScaler
HANDLE_APIS = frozenset({"scale_loss", "wrap_optimizer"})
WRAPPER_APIS = frozenset({"scale_loss"})


@dataclass(eq=False)
class Owner:
    """An object that holds a handle or a wrapper: where it was assigned and how it is spelled."""

    key: str  # "amp_handle", "self.amp_handle" (a method's own first parameter spelled ``self``)
    function: cst.FunctionDef | None
    klass: cst.ClassDef | None  # set for ``self.<name>`` in a method
    target: cst.BaseExpression  # the assignment target


@dataclass(eq=False)
class Handle:
    """One ``amp.init(...)`` call and the name it was assigned to (None: the handle is dropped)."""

    call: cst.Call
    statement: cst.CSTNode
    owner: Owner | None
    # ``handle = None`` statements in the handle's scope (removed with it)
    resets: list[cst.CSTNode] = field(default_factory=list)
    wrappers: list[Wrapper] = field(default_factory=list)
    received: list[Received] = field(default_factory=list)
    migrated: bool = False  # a GradScaler replaces it


@dataclass(eq=False)
class Received:
    """A parameter of a module-level function that every caller passes the handle to."""

    handle: Handle
    function: cst.FunctionDef
    param: cst.Param
    owner: Owner
    arguments: list[cst.Arg]  # what each call passes


@dataclass(eq=False)
class Wrapper:
    """``target = handle.wrap_optimizer(optimizer, num_loss=N)``."""

    handle: Handle
    call: cst.Call
    statement: cst.CSTNode
    owner: Owner
    optimizer: cst.BaseExpression


def _owner_key(ctx: ModuleContext, expression: cst.BaseExpression, at: cst.CSTNode) -> str | None:
    """The spelling of ``expression`` as a key; a method's own first parameter becomes ``self``."""
    name = dotted_name(expression)
    if name is None:
        return None
    function = ctx.function_of(at)
    if function is not None and ctx.class_of_method(function) is not None:
        owner = ctx.self_name(function)
        if owner and name.startswith(owner + "."):
            return "self" + name[len(owner) :]
    return name


def _assigned(ctx: ModuleContext, call: cst.Call) -> tuple[cst.CSTNode, cst.BaseExpression | None] | None:
    """The statement of ``call`` and its single target (None for a bare expression statement);
    None when the call is anything else (returned, nested, unpacked)."""
    statement = ctx.statement_of(call)
    target = syntax.target_of(statement, call)
    if target is not None:
        return (statement, target) if dotted_name(target) is not None else None
    small = syntax.sole_statement(statement)
    if isinstance(small, cst.Expr) and small.value is call:
        return statement, None
    return None


def _owner(ctx: ModuleContext, target: cst.BaseExpression, at: cst.CSTNode) -> Owner | None:
    key = _owner_key(ctx, target, at)
    if key is None:
        return None
    function = ctx.function_of(at)
    klass = ctx.class_of_method(function) if function is not None and key.startswith("self.") else None
    return Owner(key, function, klass, target)


class Handles:
    """The handles and wrappers of a module, and the amp API reached through them."""

    def __init__(self, ctx: ModuleContext, apex_api: Callable[[cst.BaseExpression], tuple[str, cst.Name] | None]):
        self.ctx = ctx
        self.handles: list[Handle] = []
        self.wrappers: list[Wrapper] = []
        # amp.init calls that are no plain assignment of a handle
        self.unsupported: list[cst.Call] = []
        # a handle's attribute read where its assignment is not seen
        self.foreign: set[cst.CSTNode] = set()
        inits = [call for call in ctx.nodes_of(cst.Call) if (found := apex_api(call.func)) and found[0] == "init"]
        for call in inits:
            assigned = _assigned(ctx, call)
            if assigned is None:
                self.unsupported.append(call)
                continue
            statement, target = assigned
            owner = _owner(ctx, target, call) if target is not None else None
            self.handles.append(Handle(call, statement, owner))
        if not any(handle.owner for handle in self.handles):
            return
        for handle in self.handles:
            if handle.owner is not None:
                self._find_received(handle)
        for call in ctx.nodes_of(cst.Call):
            func = call.func
            if isinstance(func, cst.Attribute) and func.attr.value == "wrap_optimizer":
                wrapping = self.handle_at(func.value, call)
                if wrapping is not None:
                    self._add_wrapper(wrapping, call)
        for handle in self.handles:
            if handle.owner is not None:
                handle.resets = list(self._resets(handle.owner))

    @property
    def any(self) -> bool:
        return bool(self.handles)

    def _find_received(self, handle: Handle) -> None:
        """Module-level functions that get the handle as an argument from every call in the module."""
        ctx = self.ctx
        assert handle.owner is not None
        functions = {
            node.name.value: node
            for node in (ctx.module.body if isinstance(ctx.module, cst.Module) else ())
            if isinstance(node, cst.FunctionDef)
        }
        calls: dict[str, list[cst.Call]] = {}
        for call in ctx.nodes_of(cst.Call):
            if isinstance(call.func, cst.Name) and call.func.value in functions:
                calls.setdefault(call.func.value, []).append(call)
        # a function also used as a value (a callback, `pool.map(train, ...)`) has callers we cannot see
        as_values = {
            name.value
            for name in ctx.nodes_of(cst.Name)
            if name.value in functions and not isinstance(ctx.parent(name), (cst.FunctionDef, cst.Call, cst.Attribute))
        }
        for name, function in functions.items():
            params = function.params
            if (
                name in as_values
                or params.posonly_params
                or isinstance(params.star_arg, cst.Param)
                or params.star_kwarg is not None
            ):
                continue
            found: Received | None = None
            for call in calls.get(name, []):
                passed = self._passed_param(handle.owner, call, function)
                if passed is None or (found is not None and passed[0] is not found.param):
                    found = None
                    break
                param, argument = passed
                if found is None:
                    found = Received(handle, function, param, Owner(param.name.value, function, None, param.name), [])
                found.arguments.append(argument)
            if found is not None and len(found.arguments) == len(calls.get(name, [])):
                handle.received.append(found)

    def _passed_param(
        self, owner: Owner, call: cst.Call, function: cst.FunctionDef
    ) -> tuple[cst.Param, cst.Arg] | None:
        """The parameter of ``function`` that ``call`` passes the handle to, with the argument."""
        params = list(function.params.params) + list(function.params.kwonly_params)
        hits = []
        for index, arg in enumerate(call.args):
            if arg.star or not self._matches(owner, arg.value, arg.value):
                continue
            if arg.keyword is not None:
                param = next((p for p in params if p.name.value == arg.keyword.value), None)
            else:
                param = function.params.params[index] if index < len(function.params.params) else None
            if param is None:
                return None
            hits.append((param, arg))
        return hits[0] if len(hits) == 1 else None

    def received_in(self, function: cst.FunctionDef | None) -> Received | None:
        """The handle parameter of ``function`` (or of a function it is nested in), if any."""
        current = function
        while current is not None:
            for handle in self.handles:
                for received in handle.received:
                    if received.function is current:
                        return received
            current = self.ctx.function_of(current)
        return None

    def _add_wrapper(self, handle: Handle, call: cst.Call) -> None:
        assigned = _assigned(self.ctx, call)
        bound = syntax.bind_arguments(call, ("optimizer", "num_loss"))
        if assigned is None or assigned[1] is None or bound is None or "optimizer" not in bound:
            return  # left as a reference of the handle that nothing rewrites: the setup stays
        statement, target = assigned
        owner = _owner(self.ctx, target, call) if target is not None else None
        if owner is None:
            return
        wrapper = Wrapper(handle, call, statement, owner, bound["optimizer"].value)
        handle.wrappers.append(wrapper)
        self.wrappers.append(wrapper)

    def _resets(self, owner: Owner) -> Iterator[cst.CSTNode]:
        """``handle = None`` statements where the handle is seen (the usual "no amp yet")."""
        ctx = self.ctx
        for node in self._references(owner):
            parent = ctx.parent(node)
            if isinstance(parent, cst.AssignTarget):
                assign = ctx.parent(parent)
                statement = ctx.statement_of(node)
                if (
                    isinstance(assign, cst.Assign)
                    and len(assign.targets) == 1
                    and syntax.literal(assign.value) is None
                    and isinstance(statement, cst.SimpleStatementLine)
                    and len(statement.body) == 1
                ):
                    yield statement

    # ------------------------------------------------------------------ matching
    def _reaches(self, owner: Owner, node: cst.CSTNode) -> bool:
        """Whether code at ``node`` sees the object ``owner`` assigned."""
        ctx = self.ctx
        function = ctx.function_of(node)
        if owner.klass is not None:
            current = function
            while current is not None:
                if ctx.class_of_method(current) is owner.klass:
                    return True
                current = ctx.function_of(current)
            return False
        if owner.function is None:
            # module level: seen in every function that does not bind the name itself
            root = owner.key.split(".")[0]
            current = function
            while current is not None:
                if root in ctx.locals.get(current, ()):
                    return False
                current = ctx.function_of(current)
            return True
        current = function
        while current is not None:
            if current is owner.function:
                return True
            current = ctx.function_of(current)
        return False

    def _matches(self, owner: Owner, expression: cst.BaseExpression, at: cst.CSTNode) -> bool:
        return _owner_key(self.ctx, expression, at) == owner.key and self._reaches(owner, at)

    def handle_at(self, expression: cst.BaseExpression, at: cst.CSTNode) -> Handle | None:
        for handle in self.handles:
            if handle.owner is not None and self._matches(handle.owner, expression, at):
                return handle
            for received in handle.received:
                if self._matches(received.owner, expression, at):
                    return handle
        return None

    def wrapper_at(self, expression: cst.BaseExpression, at: cst.CSTNode) -> Wrapper | None:
        for wrapper in self.wrappers:
            if self._matches(wrapper.owner, expression, at):
                return wrapper
        return None

    def api(self, func: cst.Attribute) -> tuple[str, cst.CSTNode] | None:
        """``handle.scale_loss`` / ``handle.wrap_optimizer`` / ``wrapper.scale_loss``: (api, the
        handle or wrapper expression, consumed when the call is rewritten)."""
        attr = func.attr.value
        if attr in HANDLE_APIS and self.handle_at(func.value, func) is not None:
            return attr, func.value
        if attr in WRAPPER_APIS and self.wrapper_at(func.value, func) is not None:
            return attr, func.value
        return None

    def wrapped_optimizer(self, call: cst.Call) -> cst.BaseExpression | None:
        """For ``wrapper.scale_loss(loss)``: the wrapper, which steps like the optimizer it wraps."""
        func = call.func
        if isinstance(func, cst.Attribute) and self.wrapper_at(func.value, call) is not None:
            return func.value
        return None

    # ------------------------------------------------------------------ references
    def _references(self, owner: Owner) -> Iterator[cst.CSTNode]:
        """Every expression that spells ``owner``'s object where it is seen (targets included)."""
        ctx = self.ctx
        parts = owner.key.split(".")
        for name in ctx.nodes_of(cst.Name):
            parent = ctx.parent(name)
            if (isinstance(parent, cst.Attribute) and parent.attr is name) or (
                isinstance(parent, cst.Arg) and parent.keyword is name
            ):
                continue
            node: cst.CSTNode = name
            for _ in parts[1:]:
                parent = ctx.parent(node)
                if not (isinstance(parent, cst.Attribute) and parent.value is node):
                    break
                node = parent
            if isinstance(node, cst.BaseExpression) and self._matches(owner, node, node):
                yield node

    def references(self, handle: Handle) -> list[cst.CSTNode]:
        """The handle's references other than its own assignment and its ``= None`` resets, and
        (for an attribute like ``self.amp_handle``) the same attribute read where the assignment
        is not seen (``trainer.amp_handle`` elsewhere): those would find no handle any more."""
        if handle.owner is None:
            return []
        ctx = self.ctx
        skipped = {handle.statement, *handle.resets}
        found = [node for node in self._references(handle.owner) if ctx.statement_of(node) not in skipped]
        for received in handle.received:
            found.extend(node for node in self._references(received.owner) if node is not received.param.name)
        if "." in handle.owner.key:
            attribute = handle.owner.key.rsplit(".", 1)[1]
            for name in ctx.nodes_of(cst.Name):
                parent = ctx.parent(name)
                if (
                    name.value == attribute
                    and isinstance(parent, cst.Attribute)
                    and parent.attr is name
                    and not self._matches(handle.owner, parent, parent)
                ):
                    self.foreign.add(parent)
                    found.append(parent)
        return found

    def leftovers(self) -> list[cst.CSTNode]:
        """References of migrated handles that the plan does not rewrite away, and wrapper calls
        it does not rewrite: each would crash once the handle is gone."""
        ctx = self.ctx
        found: list[cst.CSTNode] = []
        for handle in self.handles:
            if not handle.migrated:
                continue
            for node in self.references(handle):
                if node not in ctx.consumed and not self._planned_away(node):
                    found.append(node)
            for wrapper in handle.wrappers:
                for node in self._references(wrapper.owner):
                    func = ctx.parent(node)
                    if (
                        isinstance(func, cst.Attribute)
                        and func.value is node
                        and func.attr.value in WRAPPER_APIS
                        and node not in ctx.consumed
                    ):
                        found.append(node)
        return found

    def _planned_away(self, node: cst.CSTNode) -> bool:
        """Inside a statement the plan removes or replaces (a collapsed ``if fp16: ... else: ...``)."""
        plan = self.ctx.plan
        return any(
            ancestor in plan.remove or ancestor in plan.replace_statement for ancestor in self.ctx.ancestors(node)
        )

    def describe(self, node: cst.CSTNode) -> str:
        """What a leftover reference does, for the messages."""
        ctx = self.ctx
        spelled = syntax.code(node) if isinstance(node, cst.BaseExpression) else "the handle"
        line = ctx.position(node)[0]
        if node in self.foreign:
            return f"`{spelled}` at line {line}, where the amp handle's assignment is not seen"
        parent = ctx.parent(node)
        if isinstance(parent, cst.Attribute) and parent.value is node:
            return f"`{spelled}.{parent.attr.value}` at line {line}"
        return f"the amp handle `{spelled}` used as a value at line {line} (passed, stored or tested)"
