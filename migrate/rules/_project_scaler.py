"""A GradScaler shared with other modules of the project.

``main.py`` calls ``amp.initialize`` and ``train(...)``, imported from ``trainer.py``, runs
the loop with ``amp.scale_loss``. The expert's migration creates the scaler in ``main.py``
and passes it on: ``train(model, optimizer, loader, scaler=scaler)`` and
``def train(model, optimizer, loader, scaler)``. Project mode decides which functions take
part (``ModuleFacts.passes_scaler`` / ``receives_scaler``); this module plans both halves:
a receiving function gets the parameter and stands, for the rules, as the place the scaler
is created; a passing call gets the keyword wherever the module's own scaler reaches it.
Anything that cannot be done is reported, so the amp setup is frozen instead of split.
"""

from __future__ import annotations

import re
from dataclasses import replace

import libcst as cst

from migrate.options import ModuleFacts, ScalerInfo
from migrate.rules import _syntax as syntax
from migrate.rules._amp import AmpModel, Scaler
from migrate.rules._context import ModuleContext, dotted_name


def receive(ctx: ModuleContext, model: AmpModel, facts: ModuleFacts) -> int:
    """Give each receiving top-level function a scaler parameter and a Scaler the rules reach.

    Returns how many could not receive it (each reported).
    """
    shared = facts.shared_scaler
    if not facts.receives_scaler or shared is None:
        return 0
    failed = 0
    name = ctx.options.scaler_name
    for statement in ctx.module.body:
        if isinstance(statement, cst.ClassDef) and statement.name.value in facts.receives_scaler:
            failed += _receive_in_class(ctx, model, statement, shared, name)
            continue
        if not (isinstance(statement, cst.FunctionDef) and statement.name.value in facts.receives_scaler):
            continue
        params = statement.params
        taken = set(syntax.parameter_names(statement))
        if name in taken or isinstance(params.star_arg, cst.Param) or params.kwonly_params:
            ctx.report(
                "AMP022",
                statement.name,
                f"{statement.name.value}() should receive the GradScaler as `{name}`, but its parameters "
                "do not allow a new one to be added here",
            )
            failed += 1
            continue
        model.scalers.append(_received(shared, statement, None, name))
        held = shared.held_scale
        if held is not None and held in ctx.all_names():
            ctx.report(
                "AMP022",
                statement.name,
                f"{statement.name.value}() should receive the loss scale held beside the GradScaler as `{held}`, "
                "a name this module already uses",
            )
            failed += 1
            continue
        has_defaults = any(param.default is not None for param in params.params)
        ctx.plan.new_params[statement].append((name, cst.Name("None") if has_defaults else None))
        if held is not None:  # the scale the updates hold travels with the scaler
            ctx.plan.new_params[statement].append((held, cst.Name("None") if has_defaults else None))
    return failed


def _receive_in_class(ctx: ModuleContext, model: AmpModel, klass: cst.ClassDef, shared: ScalerInfo, name: str) -> int:
    """A class whose methods call amp, built by the module that creates the scaler: its
    ``__init__`` takes the scaler and keeps it on ``self`` for them (1 when it cannot, reported)."""
    body = klass.body.body if isinstance(klass.body, cst.IndentedBlock) else []
    init = next((s for s in body if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"), None)
    why = None
    if init is None or not isinstance(init.body, cst.IndentedBlock) or init.decorators:
        why = "it has no plain __init__ of its own to take it"
    elif shared.held_scale is not None:
        why = "the loss scale held beside the GradScaler cannot be kept with it"
    else:
        params = init.params
        taken = set(syntax.parameter_names(init))
        if name in taken or isinstance(params.star_arg, cst.Param) or params.kwonly_params or not params.params:
            why = "its __init__'s parameters do not allow a new one to be added"
        elif re.search(rf"\.\s*{re.escape(name)}\b", ctx.module.code_for_node(klass)):
            why = f"the class already has an attribute `{name}`"
    if why is not None or init is None or not isinstance(init.body, cst.IndentedBlock):
        ctx.report(
            "AMP022",
            klass.name,
            f"{klass.name.value}() should receive the GradScaler as `{name}` and keep it on the object for its "
            f"methods, but {why}",
        )
        return 1
    owner = ctx.self_name(init) or "self"
    store = syntax.assign_statement(cst.Attribute(cst.Name(owner), cst.Name(name)), cst.Name(name))
    statements = [s for s in init.body.body if not syntax.is_docstring(s)]
    first = statements[0] if statements else None
    if first is None:
        ctx.plan.after[init.body.body[-1]].append(store)
    elif syntax.calls_super_init(first):
        ctx.plan.after[first].append(store)  # the base class sets itself up first
    else:
        ctx.plan.before[first].append(store)
    has_defaults = any(param.default is not None for param in init.params.params)
    ctx.plan.new_params[init].append((name, cst.Name("None") if has_defaults else None))
    model.scalers.append(_received(shared, init, klass, name))
    return 0


def _received(shared: ScalerInfo, function: cst.FunctionDef, klass: cst.ClassDef | None, name: str) -> Scaler:
    """The Scaler the rules reach in a function (or, on ``self``, a class) that receives it."""
    return Scaler(
        initialize=None,
        function=function,
        klass=klass,
        name=name,
        enabled=None,
        autocast_enabled=None if shared.follows else "off",
        static_scale=shared.static_scale,
        held_scale=shared.held_scale,
        may_be_disabled=True,
        model_names=set(shared.models),
    )


def carried(ctx: ModuleContext, model: AmpModel) -> None:
    """A Scaler for each function that calls amp through a plain carrier (``args.amp.scale_loss``):
    the attribute now holds the GradScaler the creating module stored there (``_carriers``)."""
    storing = {store.function for store in ctx.carriers.plain_stores}
    for function, base in ctx.carriers.plain_functions().items():
        if function in storing:
            continue  # the function that stores the scaler there uses its own
        model.scalers.append(
            Scaler(
                initialize=None,
                function=function,
                klass=None,
                name=base.attr.value,
                enabled=None,
                autocast_enabled=None,
                static_scale=None,
                may_be_disabled=True,
                access=base,
            )
        )


def on_runner(ctx: ModuleContext, model: AmpModel, facts: ModuleFacts) -> None:
    """A Scaler for each method a library's runner calls (an optimizer hook's, a runner
    subclass's): the runner keeps the GradScaler the module that built it made
    (``runner.scaler``, ``self.scaler``); the forward pass runs under autocast there."""
    for statement in ctx.module.body:
        if not isinstance(statement, cst.ClassDef) or not isinstance(statement.body, cst.IndentedBlock):
            continue
        for method in statement.body.body:
            if not isinstance(method, cst.FunctionDef):
                continue
            for klass, name, expression in facts.runner_scalers:
                if (klass, name) != (statement.name.value, method.name.value):
                    continue
                model.scalers.append(
                    Scaler(
                        initialize=None,
                        function=method,
                        klass=None,
                        name=expression.rsplit(".", 1)[-1],
                        enabled=None,
                        autocast_enabled="off",
                        static_scale=None,
                        may_be_disabled=True,
                        access=cst.parse_expression(expression),
                        on_runner=True,
                    )
                )


def carry_on_runner(ctx: ModuleContext, model: AmpModel, facts: ModuleFacts) -> int:
    """In the module that builds a library's runner from what amp.initialize returned: the
    runner keeps the GradScaler (``runner.scaler = scaler`` right after it is built) and the
    model's forward runs under autocast where the call was, as Apex O1 ran the library's
    forward pass in float16. Returns 1 when it cannot be done (reported), else 0."""
    carrier = facts.runner_carrier
    if carrier is None:
        return 0
    runner, line, model_name = carrier
    created = [scaler for scaler in model.scalers if scaler.initialize is not None]
    statements = {id(statement): statement for statement in map(ctx.statement_of, ctx.nodes_of(cst.Call))}
    built = [
        statement
        for statement in statements.values()
        if isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
        and isinstance(statement.body[0], cst.Assign)
        and ctx.position(statement.body[0])[0] == line
        and dotted_name(statement.body[0].targets[0].target) == runner
    ]
    if len(created) != 1 or len(built) != 1 or created[0].initialize is None:
        anchor: cst.CSTNode = ctx.module
        if created and created[0].initialize is not None:
            anchor = created[0].initialize
        ctx.report(
            "AMP022",
            anchor,
            f"the runner `{runner}` built at line {line} should keep the GradScaler, but it cannot be reached there",
        )
        return 1
    scaler, call = created[0], created[0].initialize
    initialize = ctx.statement_of(call)
    if ctx.function_of(built[0]) is not scaler.function or scaler.klass is not None:
        ctx.report(
            "AMP022",
            call,
            f"the runner `{runner}` built at line {line} should keep the GradScaler, but it is built out of its reach",
        )
        return 1
    keep = syntax.assign_statement(cst.Attribute(cst.Name(runner), cst.Name("scaler")), cst.Name(scaler.name))
    # built in a branch of an ``if`` that builds a runner on each (read in migrate.runner_hooks):
    # after that ``if``, so the runner any branch built keeps it
    top: cst.CSTNode = built[0]
    for ancestor in ctx.ancestors(built[0]):
        if isinstance(ancestor, cst.If) and ctx.function_of(ancestor) is scaler.function:
            top = ancestor
    ctx.plan.after[ctx.statement_of(top)].append(keep)
    forward = cst.Attribute(cst.Name(model_name), cst.Name("forward"))
    autocast = syntax.call(
        "torch.autocast",
        [
            cst.Arg(syntax.string(ctx.options.device)),
            syntax.keyword("dtype", syntax.dotted(f"torch.{ctx.options.dtype}")),
        ],
    )
    wrapped = cst.Call(func=autocast, args=[cst.Arg(forward.deep_clone())])
    ctx.plan.after[initialize].append(syntax.assign_statement(forward, wrapped))
    ctx.plan.needs_torch_import = True
    return 0


def pass_on(ctx: ModuleContext, model: AmpModel, facts: ModuleFacts) -> int:
    """Add ``scaler=<the module's scaler>`` to every call of a function that receives it.

    Returns how many calls could not be given it (each reported).
    """
    failed = 0
    keyword = ctx.options.scaler_name
    for call in ctx.nodes_of(cst.Call):
        if dotted_name(call.func) not in facts.passes_scaler:
            continue
        found = model.scaler_access(call)
        if found is None or not model.scalers:
            ctx.report(
                "AMP022",
                call,
                f"{dotted_name(call.func)}() needs the GradScaler that replaces amp.initialize, "
                "but it cannot be reached from this call",
            )
            failed += 1
            continue
        held = found.scaler.held_scale
        if held is not None and not model.holds_scale_in(found.scaler, ctx.function_of(call)):
            ctx.report(
                "AMP022",
                call,
                f"{dotted_name(call.func)}() needs the loss scale held beside the GradScaler (`{held}`), "
                "but it cannot be reached from this call",
            )
            failed += 1
            continue
        ctx.plan.new_keywords[call].append((keyword, found.expression))
        if held is not None:  # the scale the updates hold travels with the scaler
            ctx.plan.new_keywords[call].append((held, cst.Name(held)))
    return failed


def unused(ctx: ModuleContext, facts: ModuleFacts) -> bool:
    """Whether a GradScaler was created for training that no backward of this module uses (nor
    stored on an object for the backward of another: ``args.amp = scaler``)."""
    model = ctx.amp
    created = [scaler for scaler in model.scalers if scaler.initialize is not None]
    stored = ctx.carriers.any and any(store.store in ctx.consumed for store in ctx.carriers.plain_stores)
    return bool(created) and not model.sites and not facts.passes_scaler and not stored and facts.runner_carrier is None


def shared_scalers(ctx: ModuleContext, model: AmpModel) -> tuple[ScalerInfo, ...]:
    """The scalers this module creates (from amp.initialize), as other modules see them: those of
    a top-level function or the module, and those a top-level class keeps on ``self``."""
    shared = []
    for scaler in model.scalers:
        if scaler.initialize is None:
            continue
        info = ScalerInfo(
            function=scaler.function.name.value if scaler.function is not None else None,
            static_scale=scaler.static_scale,
            follows=scaler.autocast_enabled is None or scaler.autocast_enabled == "off",
            models=tuple(sorted(scaler.model_names)),
            held_scale=scaler.held_scale,
        )
        if scaler.klass is not None:
            if not isinstance(ctx.parent(scaler.klass), cst.Module):
                continue
            info = replace(
                info,
                function=None,
                klass=scaler.klass.name.value,
                attribute=scaler.name,
                stepped=tuple(sorted(scaler.stepped)),
            )
        shared.append(info)
    return tuple(shared)


def inherit(ctx: ModuleContext, model: AmpModel, facts: ModuleFacts) -> int:
    """A Scaler on ``self`` for each class deriving from one of another module that keeps its
    GradScaler there (``ModuleFacts.inherited_scalers``); how many could not have one (reported)."""
    failed = 0
    classes = {s.name.value: s for s in ctx.module.body if isinstance(s, cst.ClassDef)}
    for name, info in facts.inherited_scalers:
        klass = classes.get(name)
        if klass is None or info.held_scale is not None:
            if klass is not None:
                ctx.report(
                    "AMP022",
                    klass.name,
                    f"{name} inherits the GradScaler `self.{info.attribute}` of {info.klass}, but not the loss "
                    "scale held beside it",
                )
            failed += 1
            continue
        model.scalers.append(
            Scaler(
                initialize=None,
                function=None,
                klass=klass,
                name=info.attribute,
                enabled=None,
                autocast_enabled=None if info.follows else "off",
                static_scale=info.static_scale,
                may_be_disabled=True,
                model_names=set(info.models),
                stepped=set(info.stepped),
            )
        )
    return failed
