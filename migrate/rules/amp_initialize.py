"""amp_initialize: ``amp.initialize(...)`` becomes a ``torch.amp.GradScaler``.

What it rewrites
    The call goes (Apex returned the very objects it was given, list in, list out), and a
    GradScaler is created in its place. Targets that differ from the arguments become a
    plain assignment (``model_amp = model``). ``enabled=``, a guarding ``if`` and an
    ``opt_level`` chosen at run time flow into the scaler's ``enabled=`` (O0 means fp32
    with scaling off); autocast follows the scaler.

Before::

    if args.fp16:
        model, optimizer = amp.initialize(model, optimizer, opt_level=args.opt_level)

After::

    scaler = torch.amp.GradScaler("cuda", enabled=args.fp16 and args.opt_level != "O0")

Not rewritten (reported instead)
    A call that is not a plain assignment or expression statement (AMP010);
    ``cast_model_outputs`` or a ``loss_scale`` computed at run time (AMP005).

Safety
    O1 maps exactly onto autocast + GradScaler up to the op lists. O2/O3 have no native
    form: autocast is the nearest recipe (AMP001). A static ``loss_scale`` is kept fixed,
    but GradScaler skips overflowing steps that Apex applied (AMP002). ``min_loss_scale``,
    ``max_loss_scale`` and per-loss scalers are gone (AMP003, AMP004).

References
    NVIDIA/apex@e13873d: apex/amp/frontend.py, apex/amp/_initialize.py, apex/amp/scaler.py;
    ../shared/apex-semantics.md sections 1.1, 2, 3.3, 9.
"""

from __future__ import annotations

import re

import libcst as cst

from migrate.rules import _syntax as syntax
from migrate.rules._amp import AmpCall, AmpModel, Scaler, in_clip
from migrate.rules._bindings import dotted_name
from migrate.rules._context import ModuleContext
from migrate.rules._plan import Statement

RULE = "amp_initialize"

PARAMETERS = (
    "models",
    "optimizers",
    "enabled",
    "opt_level",
    "cast_model_type",
    "patch_torch_functions",
    "keep_batchnorm_fp32",
    "master_weights",
    "loss_scale",
    "cast_model_outputs",
    "num_losses",
    "verbosity",
    "min_loss_scale",
    "max_loss_scale",
)
# settings that only describe how O2/O3 cast the model: autocast has no such knobs
_CASTING_SETTINGS = ("cast_model_type", "patch_torch_functions", "keep_batchnorm_fp32", "master_weights")
_USES_NEEDING_SCALER = ("scale_loss", "state_dict", "load_state_dict", "master_params")


def bind_arguments(call: cst.Call) -> dict[str, cst.Arg] | None:
    """Map the call's arguments to amp.initialize's parameters; None if impossible."""
    bound = syntax.bind_arguments(call, PARAMETERS)
    return bound if bound is not None and "models" in bound else None


def _alias_assignment(target: cst.BaseExpression, value: cst.BaseExpression) -> cst.SimpleStatementLine | None:
    """``target = value`` for the parts of an unpacking that do not already match."""
    pairs: list[tuple[cst.BaseExpression, cst.BaseExpression]] = []

    def match(t: cst.BaseExpression, v: cst.BaseExpression) -> None:
        if isinstance(t, cst.Name) and t.value == "_":
            return
        if syntax.normalized(t) == syntax.normalized(v):
            return
        if (
            isinstance(t, (cst.Tuple, cst.List))
            and isinstance(v, (cst.Tuple, cst.List))
            and len(t.elements) == len(v.elements)
            and not any(isinstance(e, cst.StarredElement) for e in t.elements)
        ):
            for te, ve in zip(t.elements, v.elements):
                match(te.value, ve.value)
            return
        pairs.append((t, v))

    match(target, value)
    if not pairs:
        return None
    if len(pairs) == 1:
        return syntax.assign_statement(syntax.strip_parens(pairs[0][0]), syntax.strip_parens(pairs[0][1]))
    targets = cst.Tuple([cst.Element(syntax.strip_parens(t)) for t, _ in pairs], lpar=[], rpar=[])
    values = cst.Tuple([cst.Element(syntax.strip_parens(v)) for _, v in pairs], lpar=[], rpar=[])
    return syntax.assign_statement(targets, values)


_FLIPPED = {
    cst.Equal: cst.NotEqual,
    cst.NotEqual: cst.Equal,
    cst.In: cst.NotIn,
    cst.NotIn: cst.In,
    cst.Is: cst.IsNot,
    cst.IsNot: cst.Is,
}


def _negated(test: cst.BaseExpression) -> cst.BaseExpression:
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1 and not test.lpar:
        target = test.comparisons[0]
        flipped = _FLIPPED.get(type(target.operator))
        if flipped is not None:
            return test.with_changes(comparisons=[target.with_changes(operator=flipped())])
    if isinstance(test, (cst.BooleanOperation, cst.IfExp, cst.Lambda)) and not test.lpar:
        test = test.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return cst.UnaryOperation(cst.Not(), test)


def _reaching(ctx: ModuleContext, branch: cst.If) -> tuple[list[cst.BaseExpression], cst.If]:
    """What must hold to reach ``branch`` (an `elif` follows failed tests), and the top `if`."""
    parent = ctx.parent(branch)
    if isinstance(parent, cst.If) and parent.orelse is branch:
        conditions, top = _reaching(ctx, parent)
        return [*conditions, _negated(parent.test)], top
    return [], branch


def _guards(ctx: ModuleContext, statement: cst.CSTNode) -> tuple[list[cst.BaseExpression], cst.CSTNode]:
    """Conditions of the `if`/`elif`/`else` clauses around ``statement``, and the outermost `if`."""
    conditions: list[cst.BaseExpression] = []
    outermost = current = statement
    while True:
        block = ctx.parent(current)
        owner = ctx.parent(block) if isinstance(block, cst.IndentedBlock) else None
        if isinstance(owner, cst.If) and owner.body is block:
            reaching, top = _reaching(ctx, owner)
            conditions[:0] = [*reaching, owner.test]
        elif isinstance(owner, cst.Else) and isinstance(ctx.parent(owner), cst.If):
            branch = ctx.parent(owner)
            assert isinstance(branch, cst.If)
            reaching, top = _reaching(ctx, branch)
            conditions[:0] = [*reaching, _negated(branch.test)]
        else:
            break
        outermost = current = top
    return conditions, outermost


def _apex_free_conjuncts(ctx: ModuleContext, guard: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The parts of ``a and b and ...`` that are not "is Apex installed?" checks.

    torch.amp is always there, so ``amp is not None`` (or a bare ``amp``) in a guard is
    simply true after the migration; the amp name it used is then no longer needed.
    """
    if isinstance(guard, cst.BooleanOperation) and isinstance(guard.operator, cst.And) and not guard.lpar:
        return _apex_free_conjuncts(ctx, guard.left) + _apex_free_conjuncts(ctx, guard.right)
    inner = guard.with_changes(lpar=[], rpar=[]) if getattr(guard, "lpar", None) else guard
    if isinstance(inner, cst.BooleanOperation) and isinstance(inner.operator, cst.And):
        return _apex_free_conjuncts(ctx, inner)
    probe = inner
    if (
        isinstance(probe, cst.Comparison)
        and len(probe.comparisons) == 1
        and isinstance(probe.comparisons[0].operator, cst.IsNot)
        and syntax.literal(probe.comparisons[0].comparator) is None
    ):
        probe = probe.left
    if isinstance(probe, cst.Name):
        binding = ctx.resolve(probe.value, probe)
        if binding is not None and binding.kind == "amp":
            ctx.consumed.add(probe)
            return []
    return [guard]


def _surely_bool(node: cst.BaseExpression) -> bool:
    if isinstance(node, (cst.Comparison,)):
        return True
    if isinstance(node, cst.Name) and node.value in ("True", "False"):
        return True
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Not):
        return True
    if isinstance(node, cst.BooleanOperation):
        return _surely_bool(node.left) and _surely_bool(node.right)
    if isinstance(node, cst.Call) and dotted_name(node.func) in ("bool", "isinstance", "hasattr"):
        return True
    return False


def _conjunction(parts: list[cst.BaseExpression], level_code: str | None) -> cst.BaseExpression | None:
    """``a and b and ...``; flags that hold an opt-level string get a ``bool()``."""
    unique: list[cst.BaseExpression] = []
    seen: set[str] = set()
    for part in parts:
        key = syntax.normalized(part)
        if key in seen:
            continue
        seen.add(key)
        if (
            level_code is not None
            and not _surely_bool(part)
            and re.search(rf"(?<![\w.]){re.escape(syntax.normalized(part))}(?![\w.])", level_code)
        ):
            # `if args.fp16:` where args.fp16 holds "O1" (or "%i" of an int): autocast
            # needs a real bool
            part = syntax.call("bool", [cst.Arg(syntax.strip_parens(part))])
        elif isinstance(part, (cst.BooleanOperation, cst.IfExp, cst.Lambda)) and len(parts) > 1:
            part = part.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        unique.append(part)
    if not unique:
        return None
    result = unique[0]
    for part in unique[1:]:
        result = cst.BooleanOperation(left=result, operator=cst.And(), right=part)
    return result


def _scaler_arguments(
    ctx: ModuleContext, initial_scale: float | None, enabled: cst.BaseExpression | None
) -> list[cst.Arg]:
    """The arguments of ``torch.amp.GradScaler("cuda", init_scale=..., enabled=...)``."""
    args = [cst.Arg(syntax.string(ctx.options.device))]
    if initial_scale is not None:
        args.append(syntax.keyword("init_scale", cst.Float(repr(float(initial_scale)))))
    if enabled is not None:
        args.append(syntax.keyword("enabled", enabled))
    return args


def _in_branch_statements(ctx: ModuleContext, model: AmpModel) -> set[cst.CSTNode]:
    """Training initializes of one function that sit in the clauses of one if/else chain."""
    by_function: dict[cst.CSTNode | None, list[cst.CSTNode]] = {}
    for use in model.of("initialize"):
        bound = bind_arguments(use.call)
        if bound is None or "optimizers" not in bound or syntax.literal(bound["optimizers"].value) is None:
            continue
        by_function.setdefault(ctx.function_of(use.call), []).append(ctx.statement_of(use.call))
    found: set[cst.CSTNode] = set()
    for statements in by_function.values():
        if len(statements) > 1 and _exclusive_branches(ctx, statements):
            found.update(statements)
    return found


def _default_in_init(ctx: ModuleContext, klass: cst.ClassDef, name: str) -> bool:
    """Give ``self.<name>`` a disabled GradScaler at the start of ``__init__``.

    The scaler is created in another method (``init_amp``), which may never run: the
    fp32 path then still finds a scaler, one whose scale/step/update are plain no-ops.
    """
    init = next(
        (n for n in klass.body.body if isinstance(n, cst.FunctionDef) and n.name.value == "__init__"),
        None,
    )
    if init is None or not isinstance(init.body, cst.IndentedBlock) or not init.body.body:
        return False
    owner = ctx.self_name(init) or "self"
    default = syntax.assign_statement(
        cst.Attribute(cst.Name(owner), cst.Name(name)),
        syntax.call(
            "torch.amp.GradScaler",
            [cst.Arg(syntax.string(ctx.options.device)), syntax.keyword("enabled", cst.Name("False"))],
        ),
    )
    body = list(init.body.body)
    index = 0
    # after the docstring and the super().__init__() call, before anything that may use it
    while index < len(body) and (syntax.is_docstring(body[index]) or _calls_super_init(ctx, body[index])):
        index += 1
    if index < len(body):
        ctx.plan.before[body[index]].append(default)
    else:
        ctx.plan.after[body[-1]].append(default)
    return True


def _calls_super_init(ctx: ModuleContext, statement: cst.CSTNode) -> bool:
    if not (isinstance(statement, cst.SimpleStatementLine) and isinstance(statement.body[0], cst.Expr)):
        return False
    call = statement.body[0].value
    return isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and call.func.attr.value == "__init__"


def _inside(ctx: ModuleContext, node: cst.CSTNode, function: cst.FunctionDef | None) -> bool:
    """Whether ``node`` runs in ``function`` itself or in a closure defined there."""
    current = ctx.function_of(node)
    while current is not None:
        if current is function:
            return True
        current = ctx.function_of(current)
    return function is None and ctx.function_of(node) is None


def _chain_top(ctx: ModuleContext, statement: cst.CSTNode) -> cst.CSTNode:
    """The top `if` of the if/elif/else chain whose clause holds ``statement``."""
    block = ctx.parent(statement)
    owner = ctx.parent(block) if isinstance(block, cst.IndentedBlock) else None
    branch = ctx.parent(owner) if isinstance(owner, cst.Else) else owner
    if not isinstance(branch, cst.If):
        return statement
    return _reaching(ctx, branch)[1]


def _exclusive_branches(ctx: ModuleContext, statements: list[cst.CSTNode]) -> bool:
    """Each statement in its own clause of one `if`/`elif`/`else` chain that has an `else`."""
    tops = set()
    for statement in statements:
        top = _chain_top(ctx, statement)
        if top is statement:
            return False
        tops.add(top)
    if len(tops) != 1:
        return False
    top = tops.pop()
    assert isinstance(top, cst.If)
    clauses: list[cst.CSTNode] = []
    branch: cst.If | cst.Else | None = top
    while isinstance(branch, cst.If):
        clauses.append(branch.body)
        branch = branch.orelse
    if branch is None:
        return False  # a path with no scaler at all
    clauses.append(branch.body)
    owners = [next(c for c in clauses if any(a is c for a in ctx.ancestors(s))) for s in statements]
    return len(set(map(id, owners))) == len(owners)


def _plan_one(ctx: ModuleContext, model: AmpModel, use: AmpCall) -> None:
    call = use.call
    statement = ctx.statement_of(call)
    if ctx.skipped(call):
        return
    small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1 else None
    if isinstance(small, cst.Assign) and small.value is call and len(small.targets) == 1:
        target: cst.BaseExpression | None = small.targets[0].target
    elif isinstance(small, cst.Expr) and small.value is call:
        target = None
    else:
        ctx.report("AMP010", call)
        return
    bound = bind_arguments(call)
    if bound is None:
        ctx.report("AMP010", call, "amp.initialize with *args/**kwargs or unknown keywords: migrate it by hand")
        return

    models = bound["models"].value
    optimizers = bound["optimizers"].value if "optimizers" in bound else None
    inference_only = (
        optimizers is None
        or syntax.literal(optimizers) is None
        or (isinstance(optimizers, (cst.List, cst.Tuple)) and not optimizers.elements)
    )
    result = (
        models
        if optimizers is None or syntax.literal(optimizers) is None
        else cst.Tuple([cst.Element(models), cst.Element(optimizers)])
    )
    alias = _alias_assignment(target, result) if target is not None else None
    if (
        isinstance(target, cst.Name)
        and isinstance(result, cst.Tuple)
        and isinstance(optimizers, (cst.Name, cst.Attribute))
    ):
        # Apex returned the model alone when the optimizers turned out to be None
        conditional = cst.IfExp(
            test=cst.Comparison(optimizers, [cst.ComparisonTarget(cst.IsNot(), cst.Name("None"))]),
            body=result.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()]),
            orelse=models,
        )
        alias = syntax.assign_statement(target, conditional)

    # what the call asked for
    level_arg = bound.get("opt_level")
    level: str | None = "O1"
    level_expression: cst.BaseExpression | None = None
    if level_arg is not None:
        value = syntax.literal(level_arg.value)
        if isinstance(value, str) and value in ("O0", "O1", "O2", "O3"):
            level = value
        elif value is ...:
            level, level_expression = None, level_arg.value
        else:
            ctx.report("AMP005", level_arg, f"opt_level={value!r} is not one of O0-O3 (Apex raised at run time)")
            return
    enabled_parts: list[cst.BaseExpression] = []
    disabled = level == "O0"
    enabled_arg = bound.get("enabled")
    if enabled_arg is not None:
        value = syntax.literal(enabled_arg.value)
        if enabled_arg.keyword is None and isinstance(value, str):
            ctx.report(
                "AMP005",
                enabled_arg,
                f"the third positional argument of amp.initialize is `enabled`, not opt_level: "
                f"{value!r} meant enabled={bool(value)} at opt_level {level}; check the intent",
            )
        if value is ...:
            enabled_parts.append(enabled_arg.value)
        elif not value:
            disabled = True
    guards, outermost = _guards(ctx, statement)
    in_branch = statement in _in_branch_statements(ctx, model)
    shared_above = False
    if in_branch:
        # one scaler for the whole if/else: built in each clause, or, when the chain is
        # itself guarded, once above that guard (the clauses cover every path below it)
        guards, outermost = _guards(ctx, _chain_top(ctx, statement))
        shared_above = bool(guards)
        if not shared_above:
            guards, outermost = [], statement
    enabled_parts[:0] = [part for guard in guards for part in _apex_free_conjuncts(ctx, guard)]
    if level_expression is not None:
        enabled_parts.append(
            cst.Comparison(
                left=(
                    syntax.strip_parens(level_expression)
                    if not isinstance(level_expression, cst.BinaryOperation)
                    else level_expression.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
                ),
                comparisons=[cst.ComparisonTarget(cst.NotEqual(), syntax.string("O0"))],
            )
        )

    # what gets reported once the call is really migrated
    notes: list[tuple[str, cst.CSTNode, str | None]] = []
    # loss scale
    static_scale: float | None = None
    scaling_off = False
    loss_scale_arg = bound.get("loss_scale")
    if loss_scale_arg is not None:
        value = syntax.literal(loss_scale_arg.value)
        try:
            number = None if value == "dynamic" else float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            notes.append(
                (
                    "AMP005",
                    loss_scale_arg,
                    "loss_scale is computed at run time: migrated as dynamic scaling; if it can be a "
                    "number, hold the scale with `scaler.update(new_scale=...)`",
                )
            )
            number = None
        if number == 1.0:
            scaling_off = True
        elif number is not None:
            static_scale = number
            notes.append(("AMP002", loss_scale_arg, None))
    initial_scale = static_scale
    for name in ("min_loss_scale", "max_loss_scale"):
        if name in bound and syntax.literal(bound[name].value) is not None:
            notes.append(("AMP003", bound[name], None))
    ceiling = syntax.literal(bound["max_loss_scale"].value) if "max_loss_scale" in bound else None
    if static_scale is None and isinstance(ceiling, (int, float)) and ceiling < 2.0**16:
        initial_scale = float(ceiling)  # Apex started at min(max_loss_scale, 2**16)
    if "num_losses" in bound and syntax.literal(bound["num_losses"].value) != 1:
        notes.append(("AMP004", bound["num_losses"], None))
    if "cast_model_outputs" in bound and syntax.literal(bound["cast_model_outputs"].value) is not None:
        ctx.report(
            "AMP005",
            bound["cast_model_outputs"],
            "cast_model_outputs has no autocast equivalent: cast the model outputs with .to(dtype) by hand",
        )
        return
    if inference_only:
        ctx.consumed.add(use.base)
        for note in notes:
            ctx.report(*note)
        ctx.report("AMP011", call)
        if alias is not None:
            ctx.plan.replace_statement[statement] = [alias]
        else:
            ctx.plan.remove.add(statement)
        return

    # where the scaler lives, and whether everything that needs it can reach it there
    function = ctx.function_of(call)
    klass = None
    elsewhere = [
        other
        for other in model.calls
        if other.api in _USES_NEEDING_SCALER
        and not _inside(ctx, other.call, function)
        and (other.api != "master_params" or in_clip(ctx, other.call))
    ]
    if function is not None and elsewhere:
        klass = ctx.class_of_method(function)
        unreachable = [other for other in elsewhere if not model.can_reach(function, klass, other.call)]
        if unreachable and klass is None and not enabled_parts and isinstance(ctx.parent(function), cst.Module):
            # a factory function: a scaler with a fixed configuration can live at module
            # level, where every function of the file reaches it
            function, unreachable = None, []
        if unreachable:
            # migrating this call alone would leave Apex code behind that needs it
            where = ctx.position(unreachable[0].call)[0]
            ctx.report(
                "AMP022",
                call,
                f"amp.initialize left as it was: the amp.{unreachable[0].api} at line {where} could not "
                "reach a GradScaler created here (pass one to it, then run ampmigrate again)",
            )
            return

    ctx.consumed.add(use.base)
    for note in notes:
        ctx.report(*note)
    if (
        level in ("O2", "O3")
        or level_expression is not None
        or any(name in bound and syntax.literal(bound[name].value) is not None for name in _CASTING_SETTINGS)
    ):
        if not disabled:
            if level_expression is not None:
                what = f"opt_level is chosen at run time ({syntax.normalized(level_expression)}): O2/O3 runs now use"
            elif level in ("O2", "O3"):
                what = f"{level} was migrated to"
            else:
                what = "The O2-style casting settings were migrated to"
            ctx.report("AMP001", call, f"{what} torch.autocast + GradScaler, the nearest native recipe")
    elif level == "O1" and not disabled:
        ctx.report("AMP012", call)

    if klass is not None:
        attributes = {scaler.name for scaler in model.scalers if scaler.klass is klass}
        name = (
            ctx.options.scaler_name
            if ctx.options.scaler_name in attributes
            else ctx.fresh_name(ctx.options.scaler_name)
        )
    else:
        same_scope = [s for s in model.scalers if s.function is function and s.klass is None]
        if same_scope and in_branch and shared_above:
            if static_scale != same_scope[0].static_scale:
                ctx.report(
                    "AMP005",
                    call,
                    "this clause asks for a different loss scale than the one above it, "
                    "and both now share one GradScaler: set its scale by hand",
                )
            if alias is not None:
                ctx.plan.replace_statement[statement] = [alias]
            else:
                ctx.plan.remove.add(statement)
            return
        if same_scope and in_branch:
            # another clause of the same if/else: it builds the same scaler its own way
            if static_scale is not None or same_scope[0].static_scale is not None:
                ctx.report(
                    "AMP005",
                    call,
                    "a static loss_scale in one branch only: GradScaler.update() "
                    "cannot hold it there; set the scale by hand after update()",
                )
            level_code = syntax.normalized(level_expression) if level_expression is not None else None
            branch_enabled = (
                cst.Name("False")
                if disabled or scaling_off
                else _conjunction(enabled_parts, level_code) if enabled_parts else None
            )
            args = _scaler_arguments(ctx, initial_scale, branch_enabled)
            creation = syntax.assign_statement(cst.Name(same_scope[0].name), syntax.call("torch.amp.GradScaler", args))
            ctx.plan.replace_statement[statement] = [*([alias] if alias is not None else []), creation]
            return
        if same_scope:
            ctx.report(
                "AMP010", call, "a second amp.initialize in the same function: it shares the first one's GradScaler"
            )
            if alias is not None:
                ctx.plan.replace_statement[statement] = [alias]
            else:
                ctx.plan.remove.add(statement)
            return
        name = ctx.fresh_name(ctx.options.scaler_name)

    scaler_enabled = (
        None
        if not enabled_parts
        else _conjunction(enabled_parts, syntax.normalized(level_expression) if level_expression is not None else None)
    )
    if disabled:
        scaler_enabled = cst.Name("False")
    autocast_enabled: cst.BaseExpression | None | str = None
    if disabled:
        autocast_enabled = "off"
    elif scaling_off:
        autocast_enabled = scaler_enabled
        scaler_enabled = cst.Name("False")

    scaler = Scaler(
        initialize=call,
        statement=statement,
        function=function,
        klass=klass,
        name=name,
        enabled=scaler_enabled,
        autocast_enabled=autocast_enabled,
        static_scale=static_scale,
    )
    for element in models.elements if isinstance(models, (cst.List, cst.Tuple)) else [models]:
        expression = element.value if isinstance(element, cst.BaseElement) else element
        dotted = dotted_name(expression)
        if dotted is not None:
            scaler.model_names.add(dotted.split(".")[-1])
    model.scalers.append(scaler)

    args = _scaler_arguments(ctx, initial_scale, scaler_enabled)
    constructor = syntax.call("torch.amp.GradScaler", args)
    if klass is not None:
        assert function is not None
        owner_name = ctx.self_name(function) or "self"
        scaler_target: cst.BaseExpression = cst.Attribute(cst.Name(owner_name), cst.Name(name))
    else:
        scaler_target = cst.Name(name)
    creation = syntax.assign_statement(scaler_target, constructor)
    ctx.plan.needs_torch_import = True
    if klass is not None and function is not None and function.name.value != "__init__":
        scaler.may_be_disabled = _default_in_init(ctx, klass, name)

    replacement: list[Statement] = [alias] if alias is not None else []
    if function is None and ctx.function_of(call) is not None:
        ctx.plan.module_globals.append(creation)
        if replacement:
            ctx.plan.replace_statement[statement] = replacement
        else:
            ctx.plan.remove.add(statement)
    elif outermost is statement:
        ctx.plan.replace_statement[statement] = [*replacement, creation]
    else:
        ctx.plan.before[outermost].append(creation)
        if replacement:
            ctx.plan.replace_statement[statement] = replacement
        else:
            ctx.plan.remove.add(statement)


def plan(ctx: ModuleContext) -> None:
    model = ctx.amp
    for use in model.of("initialize"):
        _plan_one(ctx, model, use)
