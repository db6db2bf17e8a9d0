"""The Apex amp model of a module: every amp call, the scalers that replace
``amp.initialize``, and how each place in the file reaches its scaler.

A scaler's *home* is where it is created: the function that called ``amp.initialize``
(and, for a method, its class), or the module. Code elsewhere reaches it in one of
three ways, tried in this order:

1. directly (``_direct_access``): as the same name in the home function, in a closure
   defined there, or anywhere when the scaler lives at module level (a module-level
   script, or a factory function's scaler moved up there); as ``<self>.<name>`` in any
   method of the home class, and as ``<self>.<attr>.<name>`` in a method of a class that
   holds an instance of it in ``self.<attr>`` (``_holders``);
2. through a threaded parameter (``_thread_parameter``): a plain module-level function
   whose callers all reach the scaler gets it as a new parameter, and each caller passes
   it by keyword (a ``functools.partial(f, ...)`` binding of it counts as a caller and gets
   the keyword; the function must be named nowhere else, where it would be called without);
3. not at all: the use is reported (AMP022) instead of guessed.

The vocabulary: ``scaler_access(node)`` answers "which scaler, spelled how, at node"
(planning a threaded parameter if that is the way), ``scaler_access_or_report(node)``
does the same and reports a failure, and ``can_reach(home, klass, node)`` asks the same
question before the scaler exists, without planning anything.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import libcst as cst

from migrate.rules import _syntax as syntax
from migrate.rules._bindings import dotted_name, imported_name, is_import_fallback
from migrate.rules._holders import held_before, holders

if TYPE_CHECKING:  # _context builds the model
    from migrate.rules._context import ModuleContext


@dataclass(frozen=True)
class AmpCall:
    """One call of an apex.amp function."""

    api: str  # "initialize", "scale_loss", ...
    call: cst.Call
    base: cst.CSTNode  # the Name that refers to apex, or the old API's handle (consumed when rewritten)


@dataclass
class Scaler:
    """A GradScaler standing in for one ``amp.initialize`` call."""

    initialize: cst.Call | None  # None: received from another module (a parameter)
    function: cst.FunctionDef | None  # None: created at module level
    klass: cst.ClassDef | None  # set when the scaler is an attribute of ``self``
    name: str
    # the scaler's `enabled=` (None: always on; cst False literal: off)
    enabled: cst.BaseExpression | None
    # autocast's `enabled=` when it differs from the scaler's, "off" for no autocast
    autocast_enabled: cst.BaseExpression | None | str
    static_scale: float | None
    # the local name holding the scale each update sets (None in it: dynamic), for a scale chosen at run time
    held_scale: str | None = None
    # created in a method that may not run: a disabled default stands in until it does
    may_be_disabled: bool = False
    model_names: set[str] = field(default_factory=set)
    # the scaler stored on an object (``args.amp``, the attribute that held the amp module):
    # this expression reaches it in ``function``, where it is read only under ``guard`` (the
    # condition under which Apex scaled); see ``_carriers``
    access: cst.BaseExpression | None = None
    guard: cst.BaseExpression | None = None
    # every condition on the way to that flag's `if` (`not args.deepspeed and bool(args.fp16)`): autocast
    # runs before the branches, and may read the carrier only where they lead to the scaled backward
    path_guard: cst.BaseExpression | None = None
    # the optimizers (``optimizer_key``) whose step() became ``scaler.step`` with this scaler; for
    # a scaler a subclass inherits, those its base class steps (its own scaled backward needs no step)
    stepped: set[str] = field(default_factory=set)
    # ``access`` reaches the GradScaler a library's runner keeps (``runner.scaler``): it is there
    # wherever the code runs, so it serves like a scaler of the function's own, not a carrier
    on_runner: bool = False

    @property
    def carried(self) -> bool:
        """Whether the scaler is read on the object that carried the amp module (``_carriers``)."""
        return self.access is not None and not self.on_runner


class ScalerAccess(NamedTuple):
    """The scaler serving some code, and the expression that reaches it from there."""

    scaler: Scaler
    expression: cst.BaseExpression


class AmpModel:
    """Collects amp calls once; hands out scaler access to the rules."""

    def __init__(self, ctx: ModuleContext) -> None:
        self.ctx = ctx
        self.calls: list[AmpCall] = []
        self.value_uses: list[cst.Name] = []  # amp names used other than as `amp.f(...)`
        self.private_uses: list[cst.Attribute] = []
        self.other_attributes: list[cst.Attribute] = []  # amp.X that is not called
        self.calls_by_function_name: dict[str, list[cst.Call]] = defaultdict(list)
        # `functools.partial(f, ...)` calls, by the name of the function they bind
        self.partials_by_function_name: dict[str, list[cst.Call]] = defaultdict(list)
        self._holders: dict[cst.ClassDef, dict[cst.ClassDef, str]] = {}
        self.scalers: list[Scaler] = []
        # optimizer steps already rewritten (-> their optimizer key) and statements already
        # followed by an update: several scalers may share one training step
        self.steps: dict[cst.Call, str] = {}
        self.updated: set[cst.CSTNode] = set()
        # scale_loss calls that were migrated (their backward is now scaled by a GradScaler)
        self.sites: list[cst.Call] = []
        # `amp._amp_state.loss_scalers[0]._loss_scale = X` lines that became a scaler's init_scale
        self.scale_writes: dict[cst.CSTNode, float] = {}
        self._threaded: dict[tuple[int, cst.FunctionDef], bool] = {}
        self._collect()

    def _collect(self) -> None:
        ctx = self.ctx
        partial = {"functools.partial"}
        imported = imported_name(ctx, frozenset({"functools"}), "partial")
        if imported is not None:
            partial.add(imported[0])
        for node in ctx.nodes_of(cst.Call):
            found = ctx.amp_api(node.func)
            if found is not None:
                self.calls.append(AmpCall(found[0], node, found[1]))
            if isinstance(node.func, cst.Name):
                self.calls_by_function_name[node.func.value].append(node)
            if (
                dotted_name(node.func) in partial
                and node.args
                and node.args[0].keyword is None
                and not node.args[0].star
                and isinstance(node.args[0].value, cst.Name)
            ):
                self.partials_by_function_name[node.args[0].value.value].append(node)
        for name in ctx.nodes_of(cst.Name):
            self._classify_reference(name)

    def _classify_reference(self, node: cst.Name) -> None:
        """Sort a Name bound to apex.amp: a call base, a private use, or a value use."""
        ctx = self.ctx
        binding = ctx.resolve(node.value, node)
        if binding is None or binding.kind not in ("amp", "amp_function"):
            return
        if binding.kind == "amp_function" and binding.target == "_amp_state":
            return  # Apex's private state object: the amp_private_state rule's
        parent = ctx.parent(node)
        if isinstance(parent, (cst.ImportAlias, cst.AsName, cst.NameItem)):
            return  # the import itself, or a `global amp` declaration
        if isinstance(parent, cst.Attribute) and parent.attr is node:
            return
        if isinstance(parent, cst.Arg) and parent.keyword is node:
            return  # the keyword of `f(amp=amp)`: a parameter's name, not the module
        if any(isinstance(a, (cst.Import, cst.ImportFrom)) for a in ctx.ancestors(node)):
            return
        if isinstance(parent, cst.Attribute) and parent.value is node:
            grandparent = ctx.parent(parent)
            if isinstance(grandparent, cst.Call) and grandparent.func is parent:
                return  # an amp.f(...) call, collected above
            if parent.attr.value.startswith("_"):
                self.private_uses.append(parent)
            else:
                self.other_attributes.append(parent)
            return
        if isinstance(parent, cst.Call) and parent.func is node:
            return
        if is_import_fallback(ctx, node):
            return
        self.value_uses.append(node)

    def of(self, api: str) -> list[AmpCall]:
        return [call for call in self.calls if call.api == api]

    # ------------------------------------------------------------------ scaler access
    def scaler_access(self, node: cst.CSTNode) -> ScalerAccess | None:
        """The scaler serving the code at ``node`` and the expression that reaches it there.

        A scaler the code sees directly wins (one of its own function first); failing
        that, the scaler is threaded in as a new parameter (planned here, once).
        """
        function = self.ctx.function_of(node)
        candidates = sorted(self.scalers, key=lambda s: s.function is not function)
        for scaler in candidates:
            expression = self._direct_access(scaler, function, node)
            if expression is not None:
                return ScalerAccess(scaler, expression)
        received = self.ctx.handles.received_in(function) if self.ctx.handles.any else None
        if received is not None:
            # the old API's handle came in as a parameter: the scaler now comes in its place
            for scaler in candidates:
                if scaler.initialize is received.handle.call:
                    return ScalerAccess(scaler, cst.Name(scaler.name))
        for scaler in candidates:
            if scaler.access is not None:
                continue  # read on the object that carries it, never passed as a parameter
            if function is not None and self._thread_parameter(scaler, function):
                return ScalerAccess(scaler, cst.Name(scaler.name))
        return None

    def scaler_access_or_report(self, node: cst.CSTNode) -> ScalerAccess | None:
        """``scaler_access``, reporting AMP023 (no initialize) or AMP022 (out of reach) on failure."""
        found = self.scaler_access(node)
        if found is None:
            migrated_nothing = not self.scalers and any(call.api in ("initialize", "init") for call in self.calls)
            code = "AMP023" if not self.scalers and not migrated_nothing else "AMP022"
            message = _library_trainer_branch(self.ctx, node) if code == "AMP023" else None
            if migrated_nothing:
                # the scaler is missing because the set-up stayed: say where, not that it is out of reach
                setups = [call for call in self.calls if call.api in ("initialize", "init")]
                lines = sorted({self.ctx.position(call.call)[0] for call in setups})
                where = ", ".join(map(str, lines))
                message = (
                    f"amp.{setups[0].api} (line{'s' if len(lines) > 1 else ''} {where}) was left as it was (its finding "
                    "there says why), so no GradScaler replaces it and this stays as it was too: fix what that "
                    "finding names, then run ampmigrate again"
                )
            self.ctx.report(code, node, message)
        return found

    def can_reach(self, home: cst.FunctionDef | None, klass: cst.ClassDef | None, node: cst.CSTNode) -> bool:
        """Whether a scaler created in ``home`` (on ``self`` when ``klass``) could serve ``node``:
        directly or through parameters threaded from its callers. Asked before the scaler
        exists, so it plans nothing."""
        if home is None and klass is None:
            return True
        function = self.ctx.function_of(node)
        return self._reaches_home(home, klass, node) or (
            function is not None and self._can_thread(home, klass, function, frozenset())
        )

    def _direct_access(
        self, scaler: Scaler, function: cst.FunctionDef | None, at: cst.CSTNode | None = None
    ) -> cst.BaseExpression | None:
        """The scaler's expression inside ``function`` without new parameters, if any:
        its name at module level or in its own function, ``<self>.<name>`` in a method of
        its class, ``<self>.<attr>.<name>`` at ``at`` in a method of a class holding one
        (``_holders``). A closure sees what its enclosing functions see.
        """
        ctx = self.ctx
        if scaler.access is not None:
            current = function
            while current is not None and current is not scaler.function:
                current = ctx.function_of(current)
            return scaler.access.deep_clone() if current is not None else None
        if scaler.function is None and scaler.klass is None:
            return cst.Name(scaler.name)
        current = function
        while current is not None:
            if scaler.klass is not None:
                if ctx.class_of_method(current) is scaler.klass:
                    owner = ctx.self_name(current)
                    return cst.Attribute(cst.Name(owner), cst.Name(scaler.name)) if owner else None
            elif scaler.function is current:
                return cst.Name(scaler.name)
            current = ctx.function_of(current)
        if scaler.klass is not None and at is not None:
            held = self._held(scaler.klass, at)
            if held is not None:
                return cst.Attribute(cst.Attribute(cst.Name(held[0]), cst.Name(held[1])), cst.Name(scaler.name))
        return None

    def _held(self, klass: cst.ClassDef, at: cst.CSTNode) -> tuple[str, str] | None:
        """(self, attribute) where the code at ``at``, in a method of a class that keeps an
        instance of ``klass`` in ``self.<attribute>``, surely finds one there (``_holders``)."""
        ctx = self.ctx
        function = ctx.function_of(at)
        holder = ctx.class_of_method(function) if function is not None else None
        if function is None or holder is None or holder is klass:
            return None
        if klass not in self._holders:
            self._holders[klass] = holders(ctx, klass)
        attribute = self._holders[klass].get(holder)
        owner = ctx.self_name(function)
        if attribute is None or owner is None or not held_before(ctx, owner, attribute, at):
            return None
        return owner, attribute

    def _reaches_home(self, home: cst.FunctionDef | None, klass: cst.ClassDef | None, at: cst.CSTNode) -> bool:
        """Whether the code at ``at`` runs in a scaler's home (``_in_home``) or, for a scaler on
        ``self``, reaches it through an object of its class that it holds."""
        function = self.ctx.function_of(at)
        return self._in_home(home, klass, function) or (klass is not None and self._held(klass, at) is not None)

    def access_in(self, scaler: Scaler, node: cst.CSTNode) -> cst.BaseExpression | None:
        """How the code at ``node`` reaches ``scaler``: directly, or through the parameter threaded
        into its function; None where neither (nothing is planned here)."""
        function = self.ctx.function_of(node)
        direct = self._direct_access(scaler, function, node)
        if direct is not None:
            return direct
        if function is not None and self._threaded.get((id(scaler), function)) is True:
            return cst.Name(scaler.name)
        return None

    def _in_home(
        self, home: cst.FunctionDef | None, klass: cst.ClassDef | None, function: cst.FunctionDef | None
    ) -> bool:
        """Whether ``function`` runs in a scaler's home: ``home`` itself or a closure of it,
        or (when ``klass``) a method of that class."""
        current = function
        while current is not None:
            if (klass is not None and self.ctx.class_of_method(current) is klass) or (
                klass is None and current is home
            ):
                return True
            current = self.ctx.function_of(current)
        return False

    def _can_thread(
        self, home: cst.FunctionDef | None, klass: cst.ClassDef | None, function: cst.FunctionDef, seen: frozenset
    ) -> bool:
        """Whether the scaler can become a parameter of ``function``: a plain module-level
        function whose every caller in this file (a ``functools.partial`` binding of it too)
        is in the home or can be threaded itself, and that nothing else names (a function
        handed on as a value would be called without the scaler)."""
        ctx = self.ctx
        params = function.params
        if (
            function in seen
            or not isinstance(ctx.parent(function), cst.Module)
            or isinstance(params.star_arg, cst.Param)
            or params.kwonly_params
            or params.posonly_params
            or not self._only_called(function)
        ):
            return False
        callers = self.callers_of(function)
        return bool(callers) and all(
            self._reaches_home(home, klass, call)
            or (
                (caller := ctx.function_of(call)) is not None
                and self._can_thread(home, klass, caller, seen | {function})
            )
            for call in callers
        )

    def callers_of(self, function: cst.FunctionDef) -> list[cst.Call]:
        """The calls of a module-level function and the ``functools.partial`` calls binding it."""
        name = function.name.value
        return [*self.calls_by_function_name.get(name, []), *self.partials_by_function_name.get(name, [])]

    def _only_called(self, function: cst.FunctionDef) -> bool:
        """Whether every use of the function's name in this module calls it, or binds it with
        ``functools.partial`` to a local name that is only called (``backwards = partial(f, fp16)``,
        then ``backwards(loss, opt)`` in the same function)."""
        ctx = self.ctx
        name = function.name.value
        partials = {id(arg.value) for call in self.partials_by_function_name.get(name, []) for arg in call.args[:1]}
        for node in ctx.nodes_of(cst.Name):
            if node.value != name or node is function.name:
                continue
            parent = ctx.parent(node)
            if not syntax.names_a_value(node, parent):
                continue
            if isinstance(parent, cst.Call) and parent.func is node:
                continue
            if id(node) in partials and partial_bound_calls(ctx, ctx.parent(parent)) is not None:  # type: ignore[arg-type]
                continue
            return False
        return True

    def _thread_parameter(self, scaler: Scaler, function: cst.FunctionDef) -> bool:
        """Make ``scaler`` a parameter of ``function`` if every caller can pass it.

        Checked first with ``_can_thread`` (no edits), so a chain that fails half way
        never leaves parameters behind.
        """
        key = (id(scaler), function)
        if key not in self._threaded:
            self._threaded[key] = self._can_thread(scaler.function, scaler.klass, function, frozenset())
            if self._threaded[key]:
                self._plan_threaded_parameter(scaler, function)
        return self._threaded[key]

    def _plan_threaded_parameter(self, scaler: Scaler, function: cst.FunctionDef) -> None:
        """The new parameter of ``function`` and the keyword each caller passes it with."""
        ctx = self.ctx
        for call in self.callers_of(function):
            caller = ctx.function_of(call)
            expression = self._direct_access(scaler, caller, call)
            if expression is None and caller is not None and self._thread_parameter(scaler, caller):
                expression = cst.Name(scaler.name)
            if expression is None:  # ruled out by _can_thread
                raise AssertionError(f"{function.name.value}: a caller cannot pass the scaler")
            ctx.plan.new_keywords[call].append((scaler.name, expression))
            if scaler.held_scale is not None:  # the scale its updates hold travels with it
                ctx.plan.new_keywords[call].append((scaler.held_scale, cst.Name(scaler.held_scale)))
        has_defaults = any(param.default is not None for param in function.params.params)
        ctx.plan.new_params[function].append((scaler.name, cst.Name("None") if has_defaults else None))
        if scaler.held_scale is not None:
            ctx.plan.new_params[function].append((scaler.held_scale, cst.Name("None") if has_defaults else None))

    def holds_scale_in(self, scaler: Scaler, function: cst.FunctionDef | None) -> bool:
        """Whether ``scaler.held_scale`` is a name ``function`` sees: where the scaler is created,
        or passed with the scaler as a parameter."""
        return function is scaler.function or (
            function is not None and self._threaded.get((id(scaler), function)) is True
        )

    # ------------------------------------------------------------------ generated code
    def autocast_item(self, scaler: Scaler, access: cst.BaseExpression, at: cst.CSTNode) -> cst.WithItem | None:
        """``torch.autocast(...)`` for a forward pass at ``at``; None where not possible."""
        ctx = self.ctx
        options = ctx.options
        args = [
            cst.Arg(syntax.string(options.device)),
            syntax.keyword("dtype", syntax.dotted(f"torch.{options.dtype}")),
        ]
        if scaler.carried:
            # `bool(args.fp16) and args.amp.is_enabled()`: the carrier exists only where Apex scaled
            guard = scaler.path_guard.deep_clone() if scaler.path_guard is not None else None
            switch = syntax.attribute_call(access.deep_clone(), "is_enabled")
            switch_on = switch if guard is None else cst.BooleanOperation(guard, cst.And(), switch)
            args.append(syntax.keyword("enabled", switch_on))
            ctx.plan.needs_torch_import = True
            return cst.WithItem(syntax.call("torch.autocast", args))
        enabled = scaler.enabled if scaler.autocast_enabled is None else scaler.autocast_enabled
        if enabled == "off":
            return None
        if enabled is None and scaler.may_be_disabled:
            enabled = syntax.attribute_call(access, "is_enabled")
        if isinstance(enabled, cst.BaseExpression):
            same_function = ctx.function_of(at) is scaler.function
            simple = isinstance(enabled, (cst.Name, cst.Attribute, cst.Comparison)) or (
                isinstance(enabled, cst.Call) and dotted_name(enabled.func) == "bool"
            )
            if same_function and simple:
                args.append(syntax.keyword("enabled", enabled))
            elif scaler.autocast_enabled is None:
                args.append(syntax.keyword("enabled", syntax.attribute_call(access, "is_enabled")))
            elif same_function:
                args.append(syntax.keyword("enabled", enabled))
            else:
                return None
        ctx.plan.needs_torch_import = True
        return cst.WithItem(syntax.call("torch.autocast", args))


def optimizer_key(ctx: ModuleContext, expression: cst.BaseExpression, at: cst.CSTNode) -> str:
    """The optimizer expression as a key, with a method's own ``self`` spelled ``self``."""
    key = syntax.normalized(expression)
    function = ctx.function_of(at)
    if function is not None and ctx.class_of_method(function) is not None:
        owner = ctx.self_name(function)
        if owner and (key == owner or key.startswith(owner + ".")):
            key = "self" + key[len(owner) :]
    return key


def arm(ctx: ModuleContext, branch: cst.If, node: cst.CSTNode) -> bool | None:
    """True when ``node`` is in ``branch``'s body, False in its else/elif, None outside."""
    for ancestor in ctx.ancestors(node):
        if ancestor is branch.body:
            return True
        if ancestor is branch.orelse:
            return False
        if ancestor is branch:
            return None
    return None


def fp32_only(ctx: ModuleContext, step: cst.CSTNode, sites: Sequence[cst.CSTNode]) -> bool:
    """The step sits in an arm of an `if` whose other arm holds every scaled backward of
    its function: it belongs to the fp32 path, which never touches the scaler."""
    function = ctx.function_of(step)
    local_sites = [site for site in sites if ctx.function_of(site) is function]
    if not local_sites:
        return False
    for ancestor in ctx.ancestors(step):
        if ancestor is function:
            break
        if isinstance(ancestor, cst.If):
            side = arm(ctx, ancestor, step)
            if side is not None and all(arm(ctx, ancestor, site) is (not side) for site in local_sites):
                return True
    return False


def is_clip(func: cst.BaseExpression) -> bool:
    """A gradient clip or norm: ``clip_grad_norm_``, ``clip_grad_value_``, ``get_grad_norm``..."""
    name = dotted_name(func)
    if name is None:
        return False
    last = name.split(".")[-1]
    return last.startswith("clip_grad") or "grad_norm" in last


def in_clip(ctx: ModuleContext, call: cst.Call) -> bool:
    """Whether this ``amp.master_params(...)`` call is an argument of a gradient clip."""
    argument = ctx.parent(call)
    outer = ctx.parent(argument) if isinstance(argument, cst.Arg) else None
    return isinstance(outer, cst.Call) and is_clip(outer.func)


def _library_trainer_branch(ctx: ModuleContext, node: cst.CSTNode) -> str | None:
    """AMP023's message for the Apex branch of a Hugging Face Trainer subclass's own training
    step (``elif self.use_apex: with amp.scale_loss(...)``): the transformers Trainer sets that
    flag, and calls amp.initialize itself, only when its Apex backend is chosen."""
    method = ctx.function_of(node)
    klass = ctx.class_of_method(method) if method is not None else None
    if klass is None:
        return None
    from_transformers = {
        alias.evaluated_alias or alias.evaluated_name
        for statement in ctx.nodes_of(cst.ImportFrom)
        if statement.module is not None
        and (dotted_name(statement.module) or "").split(".")[0] == "transformers"
        and not isinstance(statement.names, cst.ImportStar)
        for alias in statement.names
    }
    if not any(dotted_name(base.value) in from_transformers for base in klass.bases):
        return None
    guard = next(
        (ancestor.test for ancestor in ctx.ancestors(node) if isinstance(ancestor, cst.If)),
        None,
    )
    owner = ctx.self_name(method)  # type: ignore[arg-type]
    if (
        guard is None
        or owner is None
        or f"{owner}.use_apex" not in {dotted_name(part) for part in ctx.walk(guard) if isinstance(part, cst.Attribute)}
    ):
        return None
    return (
        f"this branch runs only where the transformers Trainer that {klass.name.value} derives from was given its "
        'Apex backend (`half_precision_backend="apex"`, `fp16_backend="apex"` in older versions), and that Trainer '
        "then calls amp.initialize itself: ampmigrate cannot migrate library code, so it stays. Train with the "
        'native backend (`half_precision_backend="auto"`, the default), whose branch here scales the loss with '
        f"`{owner}.scaler`, then delete this `{owner}.use_apex` branch and the Apex import"
    )


def partial_bound_calls(ctx: ModuleContext, partial: cst.CSTNode | None) -> list[cst.Call] | None:
    """For ``g = functools.partial(f, ...)`` in a function: the calls ``g(...)`` there, when ``g`` is
    bound once in that function and every use of it is such a call; None otherwise."""
    if not isinstance(partial, cst.Call):
        return None
    assign = ctx.parent(partial)
    function = ctx.function_of(partial)
    if (
        function is None
        or not isinstance(assign, cst.Assign)
        or assign.value is not partial
        or len(assign.targets) != 1
        or not isinstance(assign.targets[0].target, cst.Name)
    ):
        return None
    bound = assign.targets[0].target
    calls: list[cst.Call] = []
    for node in ctx.walk(function.body):
        if not isinstance(node, cst.Name) or node.value != bound.value or node is bound:
            continue
        parent = ctx.parent(node)
        if not syntax.names_a_value(node, parent):
            continue
        if (
            isinstance(parent, cst.Call)
            and parent.func is node
            and ctx.function_of(parent) is function
            and ctx.position(parent) > ctx.position(partial)
        ):
            calls.append(parent)
            continue
        return None
    return calls
