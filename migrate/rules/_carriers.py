"""The Apex amp module stored on ``self``: ``self.amp = amp``, later ``self.amp.scale_loss(...)``.

Such an attribute becomes the scaler's carrier: ``self.amp = amp`` becomes
``self.amp = self.scaler`` (the GradScaler ``amp.initialize`` turned into), so the
presence checks (``if self.amp is not None:``) keep choosing the same path, and
``self.amp.scale_loss`` / ``master_params`` / ``state_dict`` / ``load_state_dict`` are
migrated like the module's own calls, through ``self.scaler``.

That is exact only where the attribute says "amp.initialize ran" and nothing more, so a
carrier is recognised in one shape only: one class of this module; one store
``self.<attr> = amp`` in the block of that class's ``amp.initialize``, after it; and every
other use of ``<anything>.<attr>`` in the module is a presence check (of any object: the
scaler answers it as the module did) or, in a method of that class on its own ``self``, one
of those calls or ``self.<attr> = None`` that runs before the store (earlier in the same
method, or in ``__init__``). Any other shape (the attribute read elsewhere, passed out, set
on another object, several classes) is no carrier: its calls stay unseen (AMP026), the store
stays a value use (AMP030), and the setup is frozen.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from migrate.rules._bindings import checks_presence

if TYPE_CHECKING:  # _context builds the carriers
    from migrate.rules._context import ModuleContext

# the amp functions a carrier may be called for
CARRIED_APIS = frozenset({"scale_loss", "master_params", "state_dict", "load_state_dict"})

AmpApi = Callable[[cst.BaseExpression], "tuple[str, cst.Name] | None"]


@dataclass(frozen=True)
class Carrier:
    """``<self>.<attribute> = amp`` in ``method`` of ``klass``, after ``initialize``."""

    klass: cst.ClassDef
    attribute: str
    method: cst.FunctionDef
    initialize: cst.Call
    store: cst.Name  # the ``amp`` of the store, consumed once it names the scaler


class Carriers:
    """The carriers of one module and the amp calls made through them."""

    def __init__(self, ctx: ModuleContext, amp_api: AmpApi) -> None:
        self.ctx = ctx
        self.by_key: dict[tuple[cst.ClassDef, str], Carrier] = {}
        self.bases: list[cst.Attribute] = []  # the ``self.<attr>`` of every call through a carrier
        for name in ctx.nodes_of(cst.Name):
            carrier = self._store(name, amp_api)
            if carrier is not None:
                bases = self._calls(carrier)
                if bases is not None:
                    self.by_key[(carrier.klass, carrier.attribute)] = carrier
                    self.bases.extend(bases)

    @property
    def any(self) -> bool:
        return bool(self.by_key)

    def api(self, func: cst.BaseExpression) -> tuple[str, cst.Attribute] | None:
        """For ``self.<carrier>.f`` (f one of ``CARRIED_APIS``): (f, ``self.<carrier>``)."""
        if not isinstance(func, cst.Attribute) or func.attr.value not in CARRIED_APIS:
            return None
        base = func.value
        if isinstance(base, cst.Attribute) and base in self.bases:
            return func.attr.value, base
        return None

    def leftovers(self) -> list[cst.CSTNode]:
        """Calls through a carrier that no rule rewrote."""
        return [base for base in self.bases if base not in self.ctx.consumed]

    def plan_stores(self, scaler_names: dict[cst.Call, str]) -> None:
        """``self.<attr> = amp`` becomes ``self.<attr> = self.<scaler>`` where the initialize
        got a scaler on ``self`` (``scaler_names``: initialize call -> scaler attribute)."""
        for carrier in self.by_key.values():
            name = scaler_names.get(carrier.initialize)
            owner = self.ctx.self_name(carrier.method)
            if name is None or owner is None:
                continue  # the setup stays: the store stays a value use (AMP030)
            self.ctx.plan.substitute(carrier.store, cst.Attribute(cst.Name(owner), cst.Name(name)))
            self.ctx.consumed.add(carrier.store)

    # ------------------------------------------------------------------ recognition
    def _owner(self, attribute: cst.Attribute) -> cst.ClassDef | None:
        """The class whose method reads ``attribute`` on its own ``self``, if it does."""
        ctx = self.ctx
        function = ctx.function_of(attribute)
        if function is None or not isinstance(attribute.value, cst.Name):
            return None
        klass = ctx.class_of_method(function)
        if klass is None or ctx.self_name(function) != attribute.value.value:
            return None
        if any(
            isinstance(d.decorator, cst.Name) and d.decorator.value in ("staticmethod", "classmethod")
            for d in function.decorators
        ):
            return None
        return klass

    def _store(self, name: cst.Name, amp_api: AmpApi) -> Carrier | None:
        """The carrier ``name`` is stored in, when it is the ``amp`` of ``self.<attr> = amp``
        right after an ``amp.initialize`` of the same block."""
        ctx = self.ctx
        binding = ctx.resolve(name.value, name)
        if binding is None or binding.kind != "amp":
            return None
        assign = ctx.parent(name)
        if not isinstance(assign, cst.Assign) or assign.value is not name or len(assign.targets) != 1:
            return None
        target = assign.targets[0].target
        if not isinstance(target, cst.Attribute):
            return None
        klass = self._owner(target)
        method = ctx.function_of(target)
        if klass is None or method is None:
            return None
        statement = ctx.statement_of(assign)
        block = ctx.parent(statement)
        if not isinstance(block, cst.IndentedBlock):
            return None
        earlier = block.body[: block.body.index(statement)]  # type: ignore[arg-type]
        initializes = [
            call
            for call in ctx.nodes_of(cst.Call)
            if ctx.statement_of(call) in earlier
            and (found := amp_api(call.func)) is not None
            and found[0] == "initialize"
        ]
        if len(initializes) != 1:
            return None
        return Carrier(klass, target.attr.value, method, initializes[0], name)

    def _calls(self, carrier: Carrier) -> list[cst.Attribute] | None:
        """The bases of the amp calls through ``carrier``; None when some use of the
        attribute is none of the carrier's shapes."""
        ctx = self.ctx
        bases: list[cst.Attribute] = []
        store_statement = ctx.statement_of(carrier.store)
        for name in ctx.nodes_of(cst.Name):
            attribute = ctx.parent(name)
            if (
                name.value != carrier.attribute
                or not isinstance(attribute, cst.Attribute)
                or attribute.attr is not name
            ):
                continue
            if self._owner(attribute) is not carrier.klass:
                if checks_presence(ctx, attribute):
                    continue  # `if args.amp:`: another object's flag, or a check the scaler answers alike
                return None
            parent = ctx.parent(attribute)
            if isinstance(parent, cst.AssignTarget):
                assign = ctx.parent(parent)
                assert isinstance(assign, cst.Assign)
                if assign.value is carrier.store:
                    continue
                if not self._reset_before(assign, carrier, store_statement):
                    return None
            elif isinstance(parent, cst.Attribute) and parent.value is attribute:
                call = ctx.parent(parent)
                if not (isinstance(call, cst.Call) and call.func is parent and parent.attr.value in CARRIED_APIS):
                    return None
                bases.append(attribute)
            elif not checks_presence(ctx, attribute):
                return None
        return bases

    def _reset_before(self, assign: cst.Assign, carrier: Carrier, store_statement: cst.CSTNode) -> bool:
        """``self.<attr> = None`` that runs before the store: earlier in its method, or in
        ``__init__`` (before it calls anything on ``self``) when the store is in another
        method. (Set to None after the store, the attribute would say "no amp" while the
        scaler is on.)"""
        ctx = self.ctx
        if len(assign.targets) != 1 or not (isinstance(assign.value, cst.Name) and assign.value.value == "None"):
            return False
        function = ctx.function_of(assign)
        if function is carrier.method:
            return ctx.position(assign) < ctx.position(store_statement) and not any(
                isinstance(a, (cst.For, cst.While)) for a in ctx.ancestors(assign)
            )
        if function is None or function.name.value != "__init__" or carrier.method.name.value == "__init__":
            return False
        # before any call on `self` or `super()` there, which could reach the store first
        owner, here = ctx.self_name(function), ctx.position(assign)
        return not any(
            ctx.position(call) < here and _root_name(call.func) in (owner, "super")
            for call in ctx.nodes_of(cst.Call)
            if ctx.function_of(call) is function
        )


def _root_name(expression: cst.BaseExpression) -> str | None:
    """``self`` for ``self.a.b``, ``super`` for ``super().f``: the name a chain starts from."""
    while isinstance(expression, (cst.Attribute, cst.Call)):
        expression = expression.value if isinstance(expression, cst.Attribute) else expression.func
    return expression.value if isinstance(expression, cst.Name) else None
