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

Project mode adds plain carriers (``ModuleFacts.carriers``): ``args.amp = amp`` right after
``amp.initialize`` in a function of one module, ``args.amp.scale_loss(...)`` in functions of
the same or other modules (TencentPretrain and UER-py's ``train_model``). The store keeps its
place and stores the GradScaler (``args.amp = torch.amp.GradScaler("cuda")``), so the attribute
exists exactly where it existed; each reading function gets a Scaler reached as ``args.amp``
(``amp_scale_loss`` keeps its reads under the flag that guarded them). The attribute is a
carrier only where every use of it in the module is one of those two shapes, a presence check
(``if self.amp is not None:``, which the GradScaler answers as the amp module did), or
``self.amp = None`` in ``__init__`` before anything there hands ``self`` on (the value before any
set-up: lRomul/argus-alaska's ``initialize_amp(model)`` stores ``model.amp = amp``, and the model's
class scales through ``self.amp``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from migrate.rules import _syntax as syntax
from migrate.rules._bindings import checks_presence, dotted_name

if TYPE_CHECKING:  # _context builds the carriers
    from migrate.rules._context import ModuleContext

# the amp functions a carrier may be called for
CARRIED_APIS = frozenset({"scale_loss", "master_params", "state_dict", "load_state_dict"})
# ... and through a plain carrier (``args.amp``), whose readers get the scaler on the object
PLAIN_APIS = frozenset({"scale_loss"})

AmpApi = Callable[[cst.BaseExpression], "tuple[str, cst.Name] | None"]


@dataclass(frozen=True)
class Carrier:
    """``<self>.<attribute> = amp`` in ``method`` of ``klass``, after ``initialize``."""

    klass: cst.ClassDef
    attribute: str
    method: cst.FunctionDef
    initialize: cst.Call
    store: cst.Name  # the ``amp`` of the store, consumed once it names the scaler
    # the store comes right before the initialize, called through it (``self.amp = amp``, then
    # ``model, optimizer = self.amp.initialize(...)``): RetinaNet's ``initialize_training``
    before: bool = False


@dataclass(frozen=True)
class PlainStore:
    """``<name>.<attribute> = amp`` in ``function``, right after ``initialize`` in the same block."""

    attribute: str
    function: cst.FunctionDef
    initialize: cst.Call
    store: cst.Name  # the ``amp`` of the store, consumed once it names the scaler


class Carriers:
    """The carriers of one module and the amp calls made through them."""

    def __init__(self, ctx: ModuleContext, amp_api: AmpApi) -> None:
        self.ctx = ctx
        self.by_key: dict[tuple[cst.ClassDef, str], Carrier] = {}
        self.bases: list[cst.Attribute] = []  # the ``self.<attr>`` of every call through a carrier
        self.initialize_bases: list[cst.Attribute] = []  # the ``self.amp`` of ``self.amp.initialize(...)``
        for name in ctx.nodes_of(cst.Name):
            carrier = self._store(name, amp_api)
            if carrier is not None:
                bases = self._calls(carrier)
                if bases is not None and (carrier.klass, carrier.attribute) not in self.by_key:
                    self.by_key[(carrier.klass, carrier.attribute)] = carrier
                    self.bases.extend(bases)
                    if carrier.before:
                        func = carrier.initialize.func
                        assert isinstance(func, cst.Attribute) and isinstance(func.value, cst.Attribute)
                        self.initialize_bases.append(func.value)
        # project mode: attributes of any object that carry the amp module between functions
        # and modules (``args.amp``); see ``_plain``
        self.plain_stores: list[PlainStore] = []
        self.plain_bases: list[cst.Attribute] = []  # the ``args.amp`` of each ``args.amp.scale_loss(...)``
        self.stored_scalers: set[str] = set()  # names of the scalers now stored in a plain carrier
        self.refused: dict[cst.Name, str] = {}  # the `amp` of a plain store that stays, and why
        for attribute in sorted(ctx.options.facts.carriers - {key[1] for key in self.by_key}):
            found = self._plain(attribute, amp_api)
            if found is not None:
                self.plain_stores.extend(found[0])
                self.plain_bases.extend(found[1])

    @property
    def any(self) -> bool:
        return bool(self.by_key) or bool(self.plain_bases) or bool(self.plain_stores)

    def api(self, func: cst.BaseExpression) -> tuple[str, cst.Attribute] | None:
        """For ``self.<carrier>.f`` (f one of ``CARRIED_APIS``): (f, ``self.<carrier>``)."""
        if not isinstance(func, cst.Attribute) or func.attr.value not in CARRIED_APIS:
            return None
        base = func.value
        if isinstance(base, cst.Attribute) and (base in self.bases or base in self.plain_bases):
            return func.attr.value, base
        return None

    def initialize_api(self, func: cst.BaseExpression) -> tuple[str, cst.Attribute] | None:
        """For the ``self.amp.initialize`` of a carrier stored before it: ("initialize", ``self.amp``)."""
        if isinstance(func, cst.Attribute) and func.attr.value == "initialize" and func.value in self.initialize_bases:
            assert isinstance(func.value, cst.Attribute)
            return "initialize", func.value
        return None

    def leftovers(self) -> list[cst.CSTNode]:
        """Calls through a carrier that no rule rewrote."""
        return [base for base in (*self.bases, *self.plain_bases) if base not in self.ctx.consumed]

    def migrated_any(self) -> bool:
        """Whether a call through a plain carrier was rewritten (a module without amp names)."""
        return any(base in self.ctx.consumed for base in self.plain_bases)

    def plain_functions(self) -> dict[cst.FunctionDef, cst.Attribute]:
        """The functions that call amp through a plain carrier, each with the carrier it reads
        (``args.amp``); a function that reads two different ones is left out (its calls stay)."""
        found: dict[cst.FunctionDef, cst.Attribute] = {}
        mixed: set[cst.FunctionDef] = set()
        for base in self.plain_bases:
            function = self.ctx.function_of(base)
            assert function is not None  # _plain keeps calls in functions only
            if function in found and not base.deep_equals(found[function]):
                mixed.add(function)
            found.setdefault(function, base)
        return {function: base for function, base in found.items() if function not in mixed}

    def plan_plain_stores(self, scalers: list[tuple[cst.Call, cst.FunctionDef | None, str, str | None]]) -> None:
        """``args.amp = amp`` becomes ``args.amp = scaler`` where the initialize before it got a
        scaler of its own function that behaves as the carrier's readers assume: on exactly when
        autocast is, with a dynamic scale (``scalers``: initialize, function, name, and why it is
        no such scaler, None when it is)."""
        for store in self.plain_stores:
            match = next((s for s in scalers if s[0] is store.initialize and s[1] is store.function), None)
            if match is not None and match[3] is not None:
                self.refused[store.store] = match[3]
            if match is None or match[3] is not None:
                continue  # the setup stays: the store stays a value use (AMP030)
            self.ctx.plan.substitute(store.store, cst.Name(match[2]))
            self.ctx.consumed.add(store.store)
            self.stored_scalers.add(match[2])

    def _plain(self, attribute: str, amp_api: AmpApi) -> tuple[list[PlainStore], list[cst.Attribute]] | None:
        """The stores of the amp module in ``<name>.<attribute>`` and the amp calls through it, when
        every use of the attribute in this module is one of those; None otherwise.

        A store must follow its ``amp.initialize`` in the same block of a function; a call must be
        ``<name>.<attribute>.scale_loss(...)`` in a function. Anything else (the attribute read,
        tested, set to another value, named in a string for ``getattr``) would see a GradScaler
        where it saw the amp module, so the attribute is no carrier here.
        """
        ctx = self.ctx
        stores: list[PlainStore] = []
        bases: list[cst.Attribute] = []
        if any(isinstance(node, cst.SimpleString) and node.raw_value == attribute for node in ctx.walk(ctx.module)):
            return None  # `getattr(args, "amp", None)`: read where it may hold no scaler
        for name in ctx.nodes_of(cst.Name):
            attribute_node = ctx.parent(name)
            if (
                name.value != attribute
                or not isinstance(attribute_node, cst.Attribute)
                or attribute_node.attr is not name
            ):
                continue
            if not isinstance(attribute_node.value, cst.Name):
                return None
            function = ctx.function_of(attribute_node)
            if function is None:
                return None
            parent = ctx.parent(attribute_node)
            if isinstance(parent, cst.AssignTarget):
                if self._unset_at_construction(attribute_node):
                    continue
                if self._owner(attribute_node) is not None:
                    return None  # `self.amp = amp` in a method: the class carrier's shape, or none
                store = self._plain_store(attribute_node, parent, function, amp_api)
                if store is None:
                    return None
                stores.append(store)
            elif checks_presence(ctx, attribute_node):
                # `if model.amp is not None:`: the GradScaler answers it as the amp module did, and
                # None (set at construction) as before
                continue
            elif isinstance(parent, cst.Attribute) and parent.value is attribute_node:
                call = ctx.parent(parent)
                if not (isinstance(call, cst.Call) and call.func is parent and parent.attr.value in PLAIN_APIS):
                    return None
                bases.append(attribute_node)
            else:
                return None
        return stores, bases

    def _unset_at_construction(self, target: cst.Attribute) -> bool:
        """``self.amp = None`` in ``__init__``, before anything there could hand ``self`` to the
        function that stores the amp module on it: the attribute's value before any set-up, which a
        presence check tells from the GradScaler as it told it from the amp module."""
        ctx = self.ctx
        assign = self._none_set(target)
        if assign is None:
            return False
        function = ctx.function_of(assign)
        if function is None or function.name.value != "__init__" or self._owner(target) is None:
            return False
        if ctx.parent(ctx.statement_of(assign)) is not function.body:
            return False  # under an `if` or in a loop: not surely the value at construction
        # no call before it passes `self` on (it could be the set-up, storing amp first)
        return not self._calls_before(function, assign, handing_on=True)

    def _calls_before(self, function: cst.FunctionDef, at: cst.CSTNode, handing_on: bool = False) -> list[cst.Call]:
        """The calls in ``function`` before ``at``; ``handing_on``: only those given its ``self``
        as (part of) an argument."""
        ctx = self.ctx
        owner, here = ctx.self_name(function), ctx.position(at)
        return [
            call
            for call in ctx.nodes_of(cst.Call)
            if ctx.function_of(call) is function
            and ctx.position(call) < here
            and (
                not handing_on
                or any(isinstance(n, cst.Name) and n.value == owner for arg in call.args for n in ctx.walk(arg.value))
            )
        ]

    def _plain_store(
        self, target: cst.Attribute, assign_target: cst.AssignTarget, function: cst.FunctionDef, amp_api: AmpApi
    ) -> PlainStore | None:
        ctx = self.ctx
        assign = ctx.parent(assign_target)
        if not isinstance(assign, cst.Assign) or len(assign.targets) != 1 or not isinstance(assign.value, cst.Name):
            return None
        binding = ctx.resolve(assign.value.value, assign.value)
        if binding is None or binding.kind != "amp":
            return None
        if ctx.function_of(assign) is not function:
            return None
        initialize = self._initialize_before(assign, amp_api)
        if initialize is None:
            return None
        return PlainStore(target.attr.value, function, initialize, assign.value)

    def plan_stores(self, scaler_names: dict[cst.Call, str]) -> None:
        """``self.<attr> = amp`` becomes ``self.<attr> = self.<scaler>`` where the initialize
        got a scaler on ``self`` (``scaler_names``: initialize call -> scaler attribute)."""
        for carrier in self.by_key.values():
            name = scaler_names.get(carrier.initialize)
            owner = self.ctx.self_name(carrier.method)
            if name is None or owner is None:
                continue  # the setup stays: the store stays a value use (AMP030)
            creation = cst.Attribute(cst.Name(owner), cst.Name(name))
            lines = self.ctx.plan.replace_statement.get(self.ctx.statement_of(carrier.initialize))
            if carrier.before and any(
                isinstance(line, cst.SimpleStatementLine)
                and isinstance(line.body[0], cst.Assign)
                and line.body[0].targets[0].target.deep_equals(creation)
                for line in lines or ()
            ):
                # the store ran before the initialize, which the scaler's creation replaces: the
                # store goes, and the attribute takes the scaler right after its creation
                assert lines is not None
                assign = self.ctx.parent(carrier.store)
                assert isinstance(assign, cst.Assign)
                lines.append(syntax.assign_statement(assign.targets[0].target.deep_clone(), creation))
                self.ctx.plan.remove.add(self.ctx.statement_of(carrier.store))
                self.ctx.consumed.add(carrier.store)
                continue
            # (made above the guards of the initialize, the scaler exists before the store too)
            self.ctx.plan.substitute(carrier.store, creation)
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
        initialize = self._initialize_before(assign, amp_api)
        if initialize is not None:
            return Carrier(klass, target.attr.value, method, initialize, name)
        initialize = self._initialize_through(assign, target)
        if initialize is not None:
            return Carrier(klass, target.attr.value, method, initialize, name, before=True)
        return None

    def _initialize_through(self, assign: cst.Assign, target: cst.Attribute) -> cst.Call | None:
        """``... = self.amp.initialize(...)``, the statement right after the store ``self.amp = amp``
        (``assign``) in its block, on the same object and attribute."""
        ctx = self.ctx
        statement = ctx.statement_of(assign)
        block = ctx.parent(statement)
        if not isinstance(block, cst.IndentedBlock) or not isinstance(statement, cst.SimpleStatementLine):
            return None
        if len(statement.body) != 1:
            return None
        index = block.body.index(statement)
        if index + 1 >= len(block.body):
            return None
        following = block.body[index + 1]
        if not isinstance(following, cst.SimpleStatementLine) or len(following.body) != 1:
            return None
        line = following.body[0]
        if not isinstance(line, cst.Assign) or not isinstance(line.value, cst.Call):
            return None
        func = line.value.func
        if (
            isinstance(func, cst.Attribute)
            and func.attr.value == "initialize"
            and isinstance(func.value, cst.Attribute)
            and func.value.deep_equals(target)
        ):
            return line.value
        return None

    def _initialize_before(self, assign: cst.Assign, amp_api: AmpApi) -> cst.Call | None:
        """The one ``amp.initialize`` call earlier in the block of the store ``assign``."""
        ctx = self.ctx
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
        return initializes[0] if len(initializes) == 1 else None

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
                if self._unset_in_base_init(attribute, carrier):
                    continue  # `self.amp = None` when the base class builds the object
                return None
            parent = ctx.parent(attribute)
            if isinstance(parent, cst.AssignTarget):
                assign = ctx.parent(parent)
                assert isinstance(assign, cst.Assign)
                if assign.value is carrier.store:
                    continue
                if not self._reset_before(attribute, assign, carrier, store_statement):
                    return None
            elif isinstance(parent, cst.Element):
                assign = self._none_set(attribute)  # `self.model, self.amp = None, None`
                if assign is None or not self._reset_before(attribute, assign, carrier, store_statement):
                    return None
            elif isinstance(parent, cst.Attribute) and parent.value is attribute:
                call = ctx.parent(parent)
                if carrier.before and call is carrier.initialize:
                    continue  # `self.amp.initialize(...)`, right after the store
                if not (isinstance(call, cst.Call) and call.func is parent and parent.attr.value in CARRIED_APIS):
                    return None
                bases.append(attribute)
            elif not checks_presence(ctx, attribute):
                return None
        return bases

    def _none_set(self, attribute: cst.Attribute) -> cst.Assign | None:
        """The assignment that sets ``attribute`` to None: ``self.amp = None``, or one element of
        ``self.model, self.amp = [None, None]`` (a literal of as many elements)."""
        ctx = self.ctx
        parent = ctx.parent(attribute)
        if isinstance(parent, cst.AssignTarget):
            assign = ctx.parent(parent)
            if isinstance(assign, cst.Assign) and len(assign.targets) == 1 and _is_none(assign.value):
                return assign
            return None
        if not isinstance(parent, cst.Element):
            return None
        targets = ctx.parent(parent)
        if not isinstance(targets, (cst.Tuple, cst.List)):
            return None
        target = ctx.parent(targets)
        if not isinstance(target, cst.AssignTarget):
            return None
        assign = ctx.parent(target)
        if not isinstance(assign, cst.Assign) or len(assign.targets) != 1:
            return None
        values = assign.value
        if not isinstance(values, (cst.Tuple, cst.List)) or len(values.elements) != len(targets.elements):
            return None
        if any(isinstance(e, cst.StarredElement) for e in (*values.elements, *targets.elements)):
            return None
        index = next(i for i, element in enumerate(targets.elements) if element is parent)
        return assign if _is_none(values.elements[index].value) else None

    def _unset_in_base_init(self, attribute: cst.Attribute, carrier: Carrier) -> bool:
        """``self.amp = None`` (or one element of a tuple of Nones) in the ``__init__`` of a base
        class of the carrier's class named in its bases, as a statement of that ``__init__``'s own
        block, where nothing before it can reach the store: the calls before it pass no ``self``
        and call on ``self`` only static methods of that base the carrier's class does not
        redefine; and the carrier's class's own ``__init__``, if any, calls ``super().__init__``
        first (adik0861/RetinaNet's ``Initialization.__init__``)."""
        ctx = self.ctx
        function = ctx.function_of(attribute)
        base = self._owner(attribute)
        if base is None or function is None or function.name.value != "__init__":
            return False
        if carrier.method.name.value == "__init__":
            return False
        if not any(
            isinstance(arg.value, cst.Name) and arg.value.value == base.name.value for arg in carrier.klass.bases
        ):
            return False
        if not isinstance(ctx.parent(base), cst.Module) or not isinstance(ctx.parent(carrier.klass), cst.Module):
            return False
        if sum(1 for n in ctx.module.body if isinstance(n, cst.ClassDef) and n.name.value == base.name.value) != 1:
            return False
        assign = self._none_set(attribute)
        if assign is None or ctx.parent(ctx.statement_of(assign)) is not function.body:
            return False
        owner = ctx.self_name(function)
        own = {n.name.value for n in carrier.klass.body.body if isinstance(n, cst.FunctionDef)}
        static = {
            n.name.value
            for n in base.body.body
            if isinstance(n, cst.FunctionDef)
            and any(isinstance(d.decorator, cst.Name) and d.decorator.value == "staticmethod" for d in n.decorators)
        }
        if self._calls_before(function, assign, handing_on=True):
            return False
        for call in self._calls_before(function, assign):
            if _root_name(call.func) in (owner, "super"):
                func = call.func
                if not (
                    isinstance(func, cst.Attribute)
                    and isinstance(func.value, cst.Name)
                    and func.value.value == owner
                    and func.attr.value in static
                    and func.attr.value not in own
                ):
                    return False
        init = next(
            (n for n in carrier.klass.body.body if isinstance(n, cst.FunctionDef) and n.name.value == "__init__"), None
        )
        if init is None:
            return True
        first = init.body.body[0] if isinstance(init.body, cst.IndentedBlock) and init.body.body else None
        if not (isinstance(first, cst.SimpleStatementLine) and isinstance(first.body[0], cst.Expr)):
            return False
        first_call = first.body[0].value
        return (
            isinstance(first_call, cst.Call)
            and isinstance(first_call.func, cst.Attribute)
            and first_call.func.attr.value == "__init__"
            and isinstance(first_call.func.value, cst.Call)
            and isinstance(first_call.func.value.func, cst.Name)
            and first_call.func.value.func.value == "super"
        )

    def _reset_before(
        self, attribute: cst.Attribute, assign: cst.Assign, carrier: Carrier, store_statement: cst.CSTNode
    ) -> bool:
        """``self.<attr> = None`` that runs before the store: earlier in its method, or in
        ``__init__`` (before it calls anything on ``self``) when the store is in another
        method. (Set to None after the store, the attribute would say "no amp" while the
        scaler is on.)"""
        ctx = self.ctx
        if self._none_set(attribute) is not assign:
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


def _is_none(expression: cst.BaseExpression) -> bool:
    return isinstance(expression, cst.Name) and expression.value == "None"


def _root_name(expression: cst.BaseExpression) -> str | None:
    """``self`` for ``self.a.b``, ``super`` for ``super().f``: the name a chain starts from."""
    while isinstance(expression, (cst.Attribute, cst.Call)):
        expression = expression.value if isinstance(expression, cst.Attribute) else expression.func
    return expression.value if isinstance(expression, cst.Name) else None


def inline_stored_scalers(module: cst.Module, names: set[str]) -> cst.Module:
    """``scaler = torch.amp.GradScaler(...)`` followed by ``if args.fp16: args.amp = scaler``, where
    nothing else reads ``scaler``, becomes ``if args.fp16: args.amp = torch.amp.GradScaler(...)``:
    the edit an expert writes. Inside ``if <flag>:`` the flag drops out of ``enabled=``."""
    counter = _NameCounter(names)
    module.visit(counter)
    inlined = {name for name in names if counter.counts.get(name) == 2 and name in counter.constructors}
    if not inlined:
        return module
    return module.visit(_Inliner({name: counter.constructors[name] for name in inlined}))


class _NameCounter(cst.CSTVisitor):
    def __init__(self, names: set[str]) -> None:
        super().__init__()
        self.names = names
        self.counts: dict[str, int] = {}
        self.constructors: dict[str, cst.Call] = {}

    def visit_Name(self, node: cst.Name) -> None:
        if node.value in self.names:
            self.counts[node.value] = self.counts.get(node.value, 0) + 1

    def visit_Assign(self, node: cst.Assign) -> None:
        target = node.targets[0].target if len(node.targets) == 1 else None
        if isinstance(target, cst.Name) and target.value in self.names and isinstance(node.value, cst.Call):
            if dotted_name(node.value.func) == "torch.amp.GradScaler" and target.value not in self.constructors:
                self.constructors[target.value] = node.value
            else:
                self.counts[target.value] = -1  # assigned twice, or otherwise: left alone


class _Inliner(cst.CSTTransformer):
    def __init__(self, constructors: dict[str, cst.Call]) -> None:
        super().__init__()
        self.constructors = constructors
        self.created: set[str] = set()  # seen the creation (it comes before the store)
        self.stored: set[str] = set()
        self.if_bodies: set[int] = set()
        # what holds inside the branches being visited: `args.fp16` in `if args.fp16:`, `not
        # args.deepspeed` in its else (by id of the block or clause, then a stack of what is entered)
        self.facts_of: dict[int, set[str]] = {}
        self.known: list[set[str]] = []

    def _store_of(self, statement: cst.BaseStatement) -> str | None:
        if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
            assign = statement.body[0]
            if (
                isinstance(assign, cst.Assign)
                and len(assign.targets) == 1
                and isinstance(assign.targets[0].target, cst.Attribute)
                and isinstance(assign.value, cst.Name)
                and assign.value.value in self.constructors
            ):
                return assign.value.value
        return None

    def _creation_of(self, statement: cst.BaseStatement) -> str | None:
        if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
            assign = statement.body[0]
            if isinstance(assign, cst.Assign) and isinstance(assign.targets[0].target, cst.Name):
                name = assign.targets[0].target.value
                if name in self.constructors and assign.value is not None:
                    return name
        return None

    def _inline(self, statement: cst.SimpleStatementLine, flag: cst.BaseExpression | None) -> cst.SimpleStatementLine:
        assign = statement.body[0]
        assert isinstance(assign, cst.Assign) and isinstance(assign.value, cst.Name)
        constructor = self.constructors[assign.value.value]
        if flag is not None:
            test = _code(flag)
            constructor = _without_flags(constructor, {test, f"bool({test})"}.union(*self.known))
        self.stored.add(assign.value.value)
        return statement.with_changes(body=[assign.with_changes(value=constructor.deep_clone())])

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> cst.If:
        body = updated_node.body
        if isinstance(body, cst.IndentedBlock) and body.body:
            first = body.body[0]
            name = self._store_of(first)
            if name is not None and name in self.created and isinstance(first, cst.SimpleStatementLine):
                lines = [self._inline(first, updated_node.test), *body.body[1:]]
                return updated_node.with_changes(body=body.with_changes(body=lines))
        return updated_node

    def _rebuild(self, statements: Sequence[cst.BaseStatement], if_body: bool) -> list[cst.BaseStatement]:
        kept: list[cst.BaseStatement] = []
        moved: list[cst.EmptyLine] = []
        # the stores this block inlines itself (a creation comes before its store)
        inlined = {
            store
            for index, statement in enumerate(statements)
            if (store := self._store_of(statement)) is not None
            and store in self.created
            and isinstance(statement, cst.SimpleStatementLine)
            and not (if_body and index == 0)
        }
        for index, statement in enumerate(statements):
            name = self._creation_of(statement)
            if name is not None and (name in self.stored or name in inlined):
                assert isinstance(statement, cst.SimpleStatementLine)
                moved.extend(statement.leading_lines)  # its comments go to the next statement
                continue
            store = self._store_of(statement)
            if (
                store is not None
                and store in self.created
                and isinstance(statement, cst.SimpleStatementLine)
                and not (if_body and index == 0)  # leave_If inlines it, knowing the flag
            ):
                statement = self._inline(statement, None)
            if moved and isinstance(statement, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
                statement = statement.with_changes(leading_lines=[*moved, *statement.leading_lines])
                moved = []
            kept.append(statement)
        return kept

    def visit_If(self, node: cst.If) -> None:
        self.if_bodies.add(id(node.body))
        test = _code(node.test)
        self.facts_of[id(node.body)] = {test, f"bool({test})"}
        if node.orelse is not None:
            self.facts_of[id(node.orelse)] = {f"not{test}"}

    def on_visit(self, node: cst.CSTNode) -> bool:
        if id(node) in self.facts_of:
            self.known.append(self.facts_of[id(node)])
        return super().on_visit(node)

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode):  # type: ignore[no-untyped-def]
        result = super().on_leave(original_node, updated_node)
        if id(original_node) in self.facts_of:
            self.known.pop()
        return result

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        name = self._creation_of(node)
        if name is not None:
            self.created.add(name)

    def leave_IndentedBlock(
        self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock
    ) -> cst.IndentedBlock:
        return updated_node.with_changes(body=self._rebuild(updated_node.body, id(original_node) in self.if_bodies))


def _without_flags(constructor: cst.Call, facts: set[str]) -> cst.Call:
    """``enabled=<flag> and X`` is ``enabled=X`` where ``<flag>`` is known to hold (one of ``facts``,
    spelled without spaces); ``enabled=<flag>`` goes."""
    args = []
    for arg in constructor.args:
        if arg.keyword is not None and arg.keyword.value == "enabled":
            kept = [operand for operand in _conjuncts(arg.value) if _code(operand) not in facts]
            if not kept:
                continue
            value = kept[0]
            for operand in kept[1:]:
                value = cst.BooleanOperation(value, cst.And(), operand)
            arg = arg.with_changes(value=value)
        args.append(arg)
    if args:
        args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return constructor.with_changes(args=args)


def _conjuncts(expression: cst.BaseExpression) -> list[cst.BaseExpression]:
    """``a and b and c`` as [a, b, c] (an expression in parentheses is one operand)."""
    if (
        isinstance(expression, cst.BooleanOperation)
        and isinstance(expression.operator, cst.And)
        and not expression.lpar
    ):
        return [*_conjuncts(expression.left), *_conjuncts(expression.right)]
    return [expression]


def _code(node: cst.CSTNode) -> str:
    return "".join(cst.Module([]).code_for_node(node).split())
