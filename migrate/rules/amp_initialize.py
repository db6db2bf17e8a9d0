"""amp_initialize: ``amp.initialize(...)`` becomes a ``torch.amp.GradScaler``.

What it rewrites
    The call goes (Apex returned the very objects it was given, list in, list out), with a
    check just before it that Apex is installed (``if not is_apex_available(): raise ...``),
    and a GradScaler is created in its place. Targets that differ from the arguments become a
    plain assignment (``model_amp = model``). ``enabled=``, a guarding ``if`` and an
    ``opt_level`` chosen at run time flow into the scaler's ``enabled=`` (O0 means fp32
    with scaling off); autocast follows the scaler. A switch that may hold an int or a
    string (``--fp16 1``, a config's 0/1) is written ``bool(...)``: autocast raises
    TypeError on anything but a bool; argparse ``store_true`` flags and parameters with a
    True/False default of the module are used as they are.

Before::

    import torch
    from apex import amp

    if args.fp16:
        model, optimizer = amp.initialize(model, optimizer, opt_level=args.opt_level)

After::

    import torch

    scaler = torch.amp.GradScaler("cuda", enabled=bool(args.fp16) and args.opt_level != "O0")

A ``loss_scale`` computed at run time (``args.loss_scale``: a number, a numeric string,
``"dynamic"`` or None) is read once where the scaler is created and held at each update::

    static_loss_scale = float(args.loss_scale) if args.loss_scale not in (None, "dynamic") else None
    scaler = torch.amp.GradScaler("cuda", init_scale=static_loss_scale or 2.0**16)
    ...
    scaler.update(new_scale=static_loss_scale)  # None: the plain dynamic update

The name travels with the scaler (threaded parameters, project mode). Under a guard it is
read only when amp is on (``args.fp16 and ...``), or, when the guard computes it, in the
guarded clause, which builds its own scaler. At O3 None keeps O3's 1.0.

A top-level factory that calls it under a run-time switch (``if args.fp16:``) and returns
the model and optimizer to a loop elsewhere in the file sets a module-level scaler where
the call ran, off until then (as Apex amp did nothing before ``amp.initialize``); autocast
follows it with ``enabled=scaler.is_enabled()``::

    # off until build() sets up mixed precision
    scaler = torch.amp.GradScaler("cuda", enabled=False)

    def build(model, optimizer, args):
        global scaler
        if args.fp16:
            scaler = torch.amp.GradScaler("cuda")
        return model, optimizer

In project mode, such a function in one module whose callers are in others (``model, optimizer =
setup(model, optimizer, cfg.fp16, cfg.opt_level)`` in a trainer's ``__init__``) hands its call
over: it goes without a scaler, and each caller gets the GradScaler where the call returns, as
if the function's amp.initialize, spelled with the caller's arguments, followed the call
(``migrate.factories``).

At O2/O3 an input cast to float16 by hand to match the float16 weights Apex gave the model
(``if cfg.fp16: batch["x"] = batch["x"].half()`` before ``model.forward_inference(batch)``, a
method Apex's patched forward does not cover) goes with the setup where ``_hand_casts`` proves
that its value reaches only that model's call on the next line, under the setup's own flag
(AMP001 at the cast): the migrated model keeps float32 weights.

Not rewritten (reported instead)
    A call that is not a plain assignment or expression statement (AMP010);
    ``cast_model_outputs``, a ``loss_scale`` that is no number, or a run-time ``loss_scale``
    whose held value cannot reach every ``scaler.update`` (a scaler on ``self``, a step in a
    closure) (AMP005; the setup stays as it was, AMP025); an inference-only call (no
    optimizers, opt level other than O0) in a module that casts to float16 by hand
    (``x.half()``, ``torch.float16``, a ``HalfTensor``): without it those tensors would meet a
    float32 model (AMP005, the call stays), unless those casts are the proven ones above; an
    O2/O3 training call whose model's name receives such a cast the tool cannot prove (its value
    also used elsewhere, another flag, a function called from out of sight) (AMP005); an O1
    training call whose model's name receives such a cast outside the training step's forward
    pass (and outside a function with an amp.initialize of its own), or is cast to float16
    itself (``model.half()``, at any level): Apex O1's patched functions cast the other side to
    match wherever the model ran, evaluation included, where autocast covers the training step
    alone (AMP005); a training call whose model is copied (``copy.deepcopy(model)``) and the copy
    made float16 by hand (``exported.half()`` for a traced export): Apex O1's patched ops cast its
    float32 inputs, and without Apex it would meet them outside autocast (AMP005); a factory like the one above
    whose file has another amp.initialize, or that turns scaling off (O0, ``loss_scale=1``)
    while autocast stays on (AMP022).

Safety
    O1 maps exactly onto autocast + GradScaler up to the op lists. O2/O3 have no native
    form: autocast is the nearest recipe (AMP001). A static ``loss_scale`` (a run-time one
    that is a number, 1.0 included) is kept fixed, but GradScaler skips overflowing steps
    that Apex applied (AMP002). ``min_loss_scale``, ``max_loss_scale`` and per-loss scalers
    are gone (AMP003, AMP004), except ``min_loss_scale == max_loss_scale == S`` under dynamic
    scaling: Apex held S and skipped overflows, exactly a GradScaler held at S.

References
    NVIDIA/apex@e13873d: apex/amp/frontend.py, apex/amp/_initialize.py, apex/amp/scaler.py;
    ../shared/apex-semantics.md sections 1.1, 2, 3.3, 9.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import libcst as cst

from migrate import half_inputs, pytree
from migrate.rules import _hand_casts as hand_casts
from migrate.rules import _syntax as syntax
from migrate.rules import amp_private_state
from migrate.rules._amp import AmpCall, AmpModel, Scaler, in_clip
from migrate.rules._bindings import dotted_name, target_names
from migrate.rules._context import ModuleContext
from migrate.rules._forward import forward_span
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


def _arguments(call: cst.Call) -> dict[str, cst.Arg] | None:
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


def _clause_conditions(ctx: ModuleContext, branch: cst.If) -> tuple[list[cst.BaseExpression], cst.If]:
    """What must hold to run ``branch``'s body, without the failed tests its own test implies
    (``elif args.amp == "apex"`` after ``if args.amp == "pytorch"``)."""
    reaching, top = _reaching(ctx, branch)
    return [c for c in reaching if not _implied_by(branch.test, c)] + [branch.test], top


def _implied_by(test: cst.BaseExpression, condition: cst.BaseExpression) -> bool:
    """``x == "b"`` implies ``x != "a"``: the same name compared with two different literals."""
    if not (isinstance(test, cst.Comparison) and isinstance(condition, cst.Comparison)):
        return False
    if len(test.comparisons) != 1 or len(condition.comparisons) != 1:
        return False
    equal, different = test.comparisons[0], condition.comparisons[0]
    literals = (cst.SimpleString, cst.Integer)
    return (
        isinstance(equal.operator, cst.Equal)
        and isinstance(different.operator, cst.NotEqual)
        and syntax.normalized(test.left) == syntax.normalized(condition.left)
        and isinstance(equal.comparator, literals)
        and isinstance(different.comparator, literals)
        and type(equal.comparator) is type(different.comparator)
        and equal.comparator.evaluated_value != different.comparator.evaluated_value  # type: ignore[union-attr]
    )


def _guards(ctx: ModuleContext, statement: cst.CSTNode) -> tuple[list[cst.BaseExpression], cst.CSTNode]:
    """Conditions of the `if`/`elif`/`else` clauses around ``statement``, and the outermost `if`
    (or set-up-only loop) around it."""
    conditions: list[cst.BaseExpression] = []
    outermost = current = statement
    top: cst.CSTNode
    while True:
        block = ctx.parent(current)
        owner = ctx.parent(block) if isinstance(block, cst.IndentedBlock) else None
        if isinstance(owner, cst.If) and _is_main_guard(owner.test):
            break  # the script's entry point, not an amp switch: the scaler lives inside it
        if isinstance(owner, cst.If) and owner.body is block:
            clause, top = _clause_conditions(ctx, owner)
            conditions[:0] = clause
        elif isinstance(owner, cst.Else) and isinstance(ctx.parent(owner), cst.If):
            branch = ctx.parent(owner)
            assert isinstance(branch, cst.If)
            reaching, top = _reaching(ctx, branch)
            conditions[:0] = [*reaching, _negated(branch.test)]
        elif isinstance(owner, (cst.For, cst.While)) and owner.body is block and _sets_up_only(ctx, owner):
            # one amp.initialize per model/optimizer pair: each call replaced Apex's loss scalers,
            # so every optimizer used the last one made, the one scaler made above the loop (and
            # its guards, so that the training loop after them always has it)
            top = owner
        else:
            break
        outermost = current = top
    return conditions, outermost


def _sets_up_only(ctx: ModuleContext, loop: cst.For | cst.While) -> bool:
    """Whether ``loop`` neither trains nor scales a loss (no ``backward``, ``step``, ``update``
    or amp call but ``initialize`` inside): a scaler made once above it is the one Apex kept."""
    return not any(
        isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in _TRAINING_CALLS
        for node in ctx.walk(loop, into_definitions=False)
    )


# calls that show a loop trains, or uses amp beyond amp.initialize
_TRAINING_CALLS = frozenset(
    {"backward", "step", "update", "scale_loss", "master_params", "state_dict", "load_state_dict", "disable_casts"}
)


def _is_main_guard(test: cst.BaseExpression) -> bool:
    """``__name__ == "__main__"`` (either way round)."""
    return syntax.normalized(test) in ('__name__=="__main__"', "__name__=='__main__'", '"__main__"==__name__')


def _bound_inside(statement: cst.CSTNode) -> set[str]:
    """Names assigned anywhere inside ``statement`` (targets, loop variables, imports, ``as``)."""
    return _assigned_inside(statement)[0]


def _assigned_inside(statement: cst.CSTNode, skip: cst.CSTNode | None = None) -> tuple[set[str], set[str]]:
    """What is assigned anywhere inside ``statement`` but in ``skip``: the names (targets, loop
    variables, imports, ``as``) and the dotted attributes an assignment sets (``self.amp_ready =
    True``)."""
    names: set[str] = set()
    attributes: set[str] = set()

    def assigned(target: cst.BaseExpression) -> None:
        names.update(_target_names(target))
        elements = [e.value for e in target.elements] if isinstance(target, (cst.Tuple, cst.List)) else [target]
        attributes.update(d for e in elements if isinstance(e, cst.Attribute) and (d := dotted_name(e)) is not None)

    class Targets(cst.CSTVisitor):
        def on_visit(self, node: cst.CSTNode) -> bool:
            return node is not skip and super().on_visit(node)

        def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
            assigned(node.target)

        def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
            assigned(node.target)

        def visit_AugAssign(self, node: cst.AugAssign) -> None:
            assigned(node.target)

        def visit_For(self, node: cst.For) -> None:
            names.update(_target_names(node.target))

        def visit_AsName(self, node: cst.AsName) -> None:
            names.update(_target_names(node.name))

        def visit_ImportAlias(self, node: cst.ImportAlias) -> None:
            bound = node.evaluated_alias or node.evaluated_name
            names.add(bound.split(".")[0])

    statement.visit(Targets())
    return names, attributes


def _read_late(ctx: ModuleContext, outermost: cst.CSTNode, parts: list[cst.BaseExpression]) -> set[str]:
    """The names ``parts`` read that code inside ``outermost`` may rebind before they are read
    there: a scaler made above ``outermost`` would read them too early. The test of ``outermost``
    itself is read before its body runs, and an inner test before the statements after it."""
    late: set[str] = set()
    everything: set[str] | None = None
    for name in (n for part in parts for n in _names_in(part)):
        before = _bound_before(ctx, outermost, name)
        if before is None:
            everything = _bound_inside(outermost) if everything is None else everything
            before = everything
        if name.value in before:
            late.add(name.value)
    return late


def _bound_before(ctx: ModuleContext, outermost: cst.CSTNode, node: cst.CSTNode) -> set[str] | None:
    """The names statements inside ``outermost`` may bind before ``node`` is evaluated: those of
    the statements before it in each block around it (an `elif` test follows only its chain's
    earlier tests), the `as` names of the `with` statements and except clauses around it, what
    the body of a `try` around its handler binds; None where a loop (``outermost`` itself, a
    set-up-only loop, or one inside it) may evaluate it again after later statements ran, or
    ``node`` is not inside ``outermost``."""
    names: set[str] = set()
    current = node
    for ancestor in ctx.ancestors(node):
        if isinstance(ancestor, (cst.For, cst.While)):
            return None
        siblings = getattr(ancestor, "body", None)
        if isinstance(siblings, (list, tuple)):
            at = next((index for index, sibling in enumerate(siblings) if sibling is current), 0)
            for sibling in siblings[:at]:
                names |= _bound_inside(sibling)
        if isinstance(ancestor, cst.With) and current is ancestor.body:
            names |= {n for item in ancestor.items if item.asname is not None for n in _target_names(item.asname.name)}
        if isinstance(ancestor, cst.ExceptHandler) and ancestor.name is not None and current is ancestor.body:
            names |= _target_names(ancestor.name.name)
        if isinstance(ancestor, cst.Try) and current is not ancestor.body:
            names |= _bound_inside(ancestor)
        if ancestor is outermost:
            return names
        current = ancestor
    return None


def _target_names(target: cst.CSTNode) -> set[str]:
    """The names an assignment target rebinds (``self.x = ...`` and ``d[k] = ...`` rebind none)."""
    if isinstance(target, cst.Name):
        return {target.value}
    if isinstance(target, (cst.Tuple, cst.List)):
        return {name for element in target.elements for name in _target_names(element.value)}
    if isinstance(target, cst.StarredElement):
        return _target_names(target.value)
    return set()


def _names_in(node: cst.CSTNode) -> list[cst.Name]:
    """The plain names ``node`` reads or binds (not attribute names: ``args.fp16`` gives ``args``)."""
    if isinstance(node, cst.Name):
        return [node]
    if isinstance(node, cst.Attribute):
        return _names_in(node.value)
    found: list[cst.Name] = []
    for child in node.children:
        found += _names_in(child)
    return found


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


def _surely_bool(node: cst.BaseExpression, flags: BoolFlags | None = None) -> bool:
    """Whether ``node`` is a bool (autocast raises TypeError on an int, even 0 or 1)."""
    if isinstance(node, (cst.Comparison,)):
        return True
    if isinstance(node, cst.Name) and node.value in ("True", "False"):
        return True
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Not):
        return True
    if isinstance(node, cst.BooleanOperation):
        return _surely_bool(node.left, flags) and _surely_bool(node.right, flags)
    if isinstance(node, cst.Call) and dotted_name(node.func) in ("bool", "isinstance", "hasattr"):
        return True
    if flags is not None:
        if isinstance(node, cst.Name):
            return node.value in flags.names
        if isinstance(node, cst.Attribute):
            return node.attr.value in flags.attributes
    return False


@dataclass(frozen=True)
class BoolFlags:
    """Names and attributes a module surely holds bools in: argparse ``store_true`` /
    ``store_false`` options (``args.fp16``), parameters with a True/False default, and
    ``self.x = <such a parameter>``."""

    names: frozenset[str]
    attributes: frozenset[str]


def bool_flags(ctx: ModuleContext) -> BoolFlags:
    names: set[str] = set()
    attributes: set[str] = set()
    for call in ctx.nodes_of(cst.Call):
        if not (isinstance(call.func, cst.Attribute) and call.func.attr.value == "add_argument"):
            continue
        keywords = {arg.keyword.value: arg.value for arg in call.args if arg.keyword is not None}
        action = keywords.get("action")
        if syntax.literal(action) not in ("store_true", "store_false") if action is not None else True:
            continue
        dest = syntax.literal(keywords["dest"]) if "dest" in keywords else None
        if not isinstance(dest, str):
            options = [syntax.literal(arg.value) for arg in call.args if arg.keyword is None]
            spelled = [o for o in options if isinstance(o, str)]
            long = [o for o in spelled if o.startswith("--")]
            dest = (long or spelled or [""])[0].lstrip("-").replace("-", "_")
        if dest:
            attributes.add(dest)
    for param in ctx.nodes_of(cst.Param):
        if isinstance(param.default, cst.Name) and param.default.value in ("True", "False"):
            names.add(param.name.value)
    for target in ctx.nodes_of(cst.AssignTarget):
        assign = ctx.parent(target)
        if (
            isinstance(target.target, cst.Attribute)
            and isinstance(assign, cst.Assign)
            and isinstance(assign.value, cst.Name)
            and assign.value.value in names
        ):
            attributes.add(target.target.attr.value)
    return BoolFlags(frozenset(names), frozenset(attributes))


def _conjunction(parts: list[cst.BaseExpression], flags: BoolFlags | None = None) -> cst.BaseExpression | None:
    """``a and b and ...``; given the module's ``flags``, each part a bool: a flag that may
    hold an int (``--fp16 1``, a config's 0/1) or an opt-level string gets ``bool()``, since
    autocast raises on anything but a bool (and ``0 and x`` is 0)."""
    unique: list[cst.BaseExpression] = []
    seen: set[str] = set()
    for part in parts:
        key = syntax.normalized(part)
        if key in seen:
            continue
        seen.add(key)
        if flags is not None and not _surely_bool(part, flags):
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
    ctx: ModuleContext,
    initial_scale: float | None,
    enabled: cst.BaseExpression | None,
    initial_expression: cst.BaseExpression | None = None,
) -> list[cst.Arg]:
    """The arguments of ``torch.amp.GradScaler("cuda", init_scale=..., enabled=...)``."""
    args = [cst.Arg(syntax.string(ctx.options.device))]
    if initial_expression is not None:
        args.append(syntax.keyword("init_scale", initial_expression))
    elif initial_scale is not None:
        args.append(syntax.keyword("init_scale", cst.Float(repr(float(initial_scale)))))
    if enabled is not None:
        args.append(syntax.keyword("enabled", enabled))
    return args


def _in_branch_statements(ctx: ModuleContext, model: AmpModel) -> set[cst.CSTNode]:
    """Training initializes of one function that sit in the clauses of one if/else chain."""
    by_function: dict[cst.CSTNode | None, list[cst.CSTNode]] = {}
    for use in model.of("initialize"):
        bound = _arguments(use.call)
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
    while index < len(body) and (syntax.is_docstring(body[index]) or syntax.calls_super_init(body[index])):
        index += 1
    planned = ctx.plan.before[body[index]] if index < len(body) else ctx.plan.after[body[-1]]
    # two methods of the class may each create the scaler (fit, lr_find): one default is enough
    if not any(statement.deep_equals(default) for statement in planned):
        planned.append(default)
    return True


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


def _branch_position(ctx: ModuleContext, statement: cst.CSTNode) -> tuple[cst.CSTNode, list[cst.BaseExpression]]:
    """The top `if` of the if/elif/else chain whose clause holds ``statement``, reached through
    the plain `if`s (no `elif`/`else`) around it inside that clause, and the tests of those plain
    `if`s, outermost first (RepVGG's `if multi_gpu: (if amp_on: initialize) else: (if amp_on:
    initialize)`); ``statement`` itself, with no tests, when no chain holds it."""
    tests: list[cst.BaseExpression] = []
    current = statement
    while True:
        top = _chain_top(ctx, current)
        if top is not current and (not isinstance(top, cst.If) or top.orelse is not None):
            return top, tests
        block = ctx.parent(current)
        owner = ctx.parent(block) if isinstance(block, cst.IndentedBlock) else None
        if not (
            isinstance(owner, cst.If)
            and owner.body is block
            and owner.orelse is None
            and not isinstance(ctx.parent(owner), cst.If)  # not an `elif`
        ):
            return statement, []
        tests.insert(0, owner.test)
        current = owner


def _exclusive_branches(ctx: ModuleContext, statements: list[cst.CSTNode]) -> bool:
    """Each statement in its own clause of one `if`/`elif`/`else` chain that has an `else`
    (directly, or under the same plain `if` tests in every clause)."""
    tops = set()
    inner = set()
    for statement in statements:
        top, tests = _branch_position(ctx, statement)
        if top is statement:
            return False
        tops.add(top)
        inner.add(tuple(syntax.normalized(test) for test in tests))
    if len(tops) != 1 or len(inner) != 1:
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


@dataclass
class SetupCall:
    """One ``amp.initialize`` call as written, and the assignment that survives it."""

    use: AmpCall
    statement: cst.CSTNode
    bound: dict[str, cst.Arg]
    models: cst.BaseExpression
    inference_only: bool  # no optimizers: nothing to scale
    alias: cst.SimpleStatementLine | None  # ``model_amp = model`` for targets that differ

    @property
    def call(self) -> cst.Call:
        return self.use.call

    def replacement(self) -> list[Statement]:
        return [self.alias] if self.alias is not None else []


@dataclass
class _Settings:
    """What the call asks for: the opt level, when amp is on, and where the scaler goes."""

    level: str | None  # "O0".."O3"; None when chosen at run time (``level_expression``)
    level_expression: cst.BaseExpression | None
    disabled: bool  # O0 or enabled=False: fp32, scaling off
    enabled_parts: list[cst.BaseExpression]  # conditions that all hold when amp is on
    outermost: cst.CSTNode  # the statement the scaler is created before
    in_branch: bool  # one of several initializes in the clauses of one if/else
    shared_above: bool  # ... whose scaler is created once, above the guarded chain
    guard_parts: int = 0  # how many of ``enabled_parts`` (the first ones) come from guarding ifs
    guards_check_apex: bool = False  # a guarding if asks whether Apex is installed (``amp is not None``)
    flags: BoolFlags | None = None  # the module's names that surely hold bools


@dataclass
class _LossScale:
    """The loss-scale arguments, and the notes to report once the call is migrated."""

    static: float | None = None  # a fixed scale
    initial: float | None = None  # the GradScaler's init_scale
    off: bool = False  # loss_scale=1.0: no scaling at all
    # a loss_scale computed at run time: a number is held, "dynamic" (or None) scales dynamically
    runtime: cst.BaseExpression | None = None
    # min_loss_scale == max_loss_scale == S: Apex's dynamic scale stays at S (skipping overflows)
    clamped: float | None = None
    o3: bool = False  # at O3 a loss_scale of None kept the opt level's 1.0, not dynamic scaling
    invalid: bool = False  # neither a number nor "dynamic": Apex raised
    notes: list[tuple[str, cst.CSTNode, str | None]] = field(default_factory=list)


def _inference_models(model: AmpModel) -> set[str]:
    """The last names of the models passed to this module's amp.initialize calls without optimizers."""
    names: set[str] = set()
    for use in model.calls:
        bound = _arguments(use.call) if use.api == "initialize" else None
        if bound is None or "models" not in bound:
            continue
        optimizers = bound["optimizers"].value if "optimizers" in bound else None
        if not (
            optimizers is None
            or syntax.literal(optimizers) is None
            or (isinstance(optimizers, (cst.List, cst.Tuple)) and not optimizers.elements)
        ):
            continue
        models = bound["models"].value
        for element in models.elements if isinstance(models, (cst.List, cst.Tuple)) else [models]:
            dotted = dotted_name(element.value if isinstance(element, cst.BaseElement) else element)
            if dotted is not None:
                names.add(dotted.split(".")[-1])
    return names


def _read_call(ctx: ModuleContext, use: AmpCall) -> SetupCall | None:
    """The call's statement, arguments and targets; None (reported) when it is no plain assignment."""
    call = use.call
    statement = ctx.statement_of(call)
    small = syntax.sole_statement(statement)
    target: cst.BaseExpression | None = syntax.target_of(statement, call)
    if target is None and not (isinstance(small, cst.Expr) and small.value is call):
        ctx.report(
            "AMP010",
            call,
            "amp.initialize is not a plain assignment the tool can replace (returned, nested in an expression, "
            "or unpacked into other names): assign its arguments back (`model, optimizer = model, optimizer`) "
            'and create `scaler = torch.amp.GradScaler("cuda")` where the training loop can reach it',
        )
        return None
    bound = _arguments(call)
    if bound is None:
        unknown = [
            arg.keyword.value for arg in call.args if arg.keyword is not None and arg.keyword.value not in PARAMETERS
        ]
        if unknown:
            ctx.report(
                "AMP010",
                call,
                f"amp.initialize with the keyword {', '.join(unknown)} (not an amp.initialize argument): delete the "
                'call and create `scaler = torch.amp.GradScaler("cuda")` where the training loop can reach it',
            )
            return None
        native = _native_scaler_beside(ctx, call)
        ctx.report(
            "AMP010",
            call,
            "amp.initialize with *args/**kwargs: the settings it applies (opt_level, loss_scale, num_losses, ...) are "
            "known only at run time, so the code they ask for cannot be written here. Spell them out in the call "
            '(`amp.initialize(model, optimizer, opt_level="O1")`) and run ampmigrate again; or, for O1 with a '
            'dynamic scale, delete the call, create `scaler = torch.amp.GradScaler("cuda")` where the training '
            'loop can reach it, and run the forward pass and loss under `torch.autocast("cuda", dtype=torch.float16)` '
            "(the call removed alone would train in float32)"
            + (
                f"; this class already makes a native one (`{ctx.code(native)}`, line {ctx.position(native)[0]}) "
                "for its torch.amp path: train through that path and delete this Apex branch with the amp calls "
                "made under the same switch"
                if native is not None
                else ""
            ),
        )
        return None

    models = bound["models"].value
    optimizers = bound["optimizers"].value if "optimizers" in bound else None
    inference = _without_optimizers(bound)
    if optimizers is not None and _found_none(ctx, statement, optimizers):
        # `if optimizer is None:` around it: Apex only cast the models, and returned them alone
        optimizers, inference = None, True
    alias = _result_alias(target, models, optimizers) if target is not None else None
    return SetupCall(use, statement, bound, models, inference, alias)


def _native_scaler_beside(ctx: ModuleContext, call: cst.Call) -> cst.Call | None:
    """A GradScaler the class around ``call`` makes itself (``self.amp_grad_scaler = TorchGradScaler()``
    beside the Apex branch, facebookresearch/ClassyVision and vissl), if any."""
    function = ctx.function_of(call)
    klass = ctx.class_of_method(function) if function is not None else None
    if klass is None:
        return None
    for node in ctx.walk(klass):
        if not isinstance(node, cst.Call):
            continue
        name = dotted_name(node.func)
        binding = ctx.resolve(name, node) if name is not None and "." not in name else None
        native = (
            binding is not None and binding.kind == "torch_amp" and binding.target.endswith("GradScaler")
        ) or name in ("torch.amp.GradScaler", "torch.cuda.amp.GradScaler", "torch.GradScaler")
        if native:
            return node
    return None


def _found_none(ctx: ModuleContext, statement: cst.CSTNode, value: cst.BaseExpression) -> bool:
    """Whether a clause around ``statement`` runs only where the name ``value`` is None
    (``if optimizer is None:``, or the else of ``if optimizer is not None:``), with nothing in
    that clause before ``statement`` that may rebind it."""
    if not isinstance(value, cst.Name):
        return False
    conditions, outermost = _guards(ctx, statement)
    # an else's condition comes negated and flipped (`optimizer is not None` gives `optimizer is None`)
    if outermost is statement or f"{value.value}isNone" not in {syntax.normalized(c) for c in conditions}:
        return False
    before = _bound_before(ctx, outermost, statement)
    return before is not None and value.value not in before


def _result_alias(
    target: cst.BaseExpression, models: cst.BaseExpression, optimizers: cst.BaseExpression | None
) -> cst.SimpleStatementLine | None:
    """``target = <what amp.initialize returned>`` where the targets differ from the arguments."""
    result = (
        models
        if optimizers is None or syntax.literal(optimizers) is None
        else cst.Tuple([cst.Element(models), cst.Element(optimizers)])
    )
    # a list of as many models as the targets (`a, b = amp.initialize([a, b], optimizer)`)
    # unpacks whichever Apex returned
    unpacks_models = (
        isinstance(target, (cst.Tuple, cst.List))
        and isinstance(models, (cst.List, cst.Tuple))
        and len(models.elements) == len(target.elements)
        and not any(isinstance(e.value, (cst.Tuple, cst.List)) for e in target.elements)
    )
    if (
        (isinstance(target, cst.Name) or unpacks_models)
        and isinstance(result, cst.Tuple)
        and isinstance(optimizers, (cst.Name, cst.Attribute))
    ):
        # Apex returned the model alone when the optimizers turned out to be None
        conditional = cst.IfExp(
            test=cst.Comparison(optimizers, [cst.ComparisonTarget(cst.IsNot(), cst.Name("None"))]),
            body=result.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()]),
            orelse=models,
        )
        return syntax.assign_statement(target, conditional)
    return _alias_assignment(target, result)


def _inference_message(ctx: ModuleContext, bound: dict[str, cst.Arg]) -> str | None:
    """AMP011's message where the literal opt level (O1 where none is given) says what Apex did
    (None: the generic one).

    Only O1 patches ops globally; O2/O3 cast the model itself, O0 did nothing."""
    level = syntax.literal(bound["opt_level"].value) if "opt_level" in bound else "O1"
    if level == "O0":
        return (
            "amp.initialize without optimizers (inference) at opt_level O0: Apex changed nothing, the call was removed"
        )
    if level == "O1":
        models = bound["models"].value
        several = isinstance(models, (cst.List, cst.Tuple))
        return (
            "amp.initialize without optimizers (inference) at opt_level O1: Apex patched the ops run after it to "
            f"cast to float16, and the call was removed, so `{ctx.code(models)}` now run{'' if several else 's'} in "
            f"float32: wrap {'their' if several else 'its'} forward passes in "
            f'`with torch.autocast("{ctx.options.device}", dtype=torch.float16):` for float16 speed'
        )
    if level not in ("O2", "O3"):
        return None
    if "keep_batchnorm_fp32" in bound:
        how = "BatchNorm as keep_batchnorm_fp32 said"
    else:
        how = "BatchNorm kept in float32" if level == "O2" else "model.half()"
    return (
        f"amp.initialize without optimizers (inference) at opt_level {level}: Apex cast the model itself to float16 "
        f"({how}) and the floating inputs of its forward to float16; the call was "
        "removed, so the model now runs in float32, and an input cast to float16 by hand (`x.half()`) would now "
        f'meet float32 weights: wrap the inference in `with torch.autocast("{ctx.options.device}", '
        "dtype=torch.float16):` for float16 speed"
    )


def float16_by_hand(ctx: ModuleContext, call: cst.Call) -> cst.CSTNode | None:
    """The first cast to float16 written out in the module, outside ``call`` (``x.half()``,
    ``torch.float16``/``torch.half``, a ``HalfTensor``); None where there is none. A cast
    whose result leaves for the host (``x.half().numpy()``) does not count."""
    inside = {id(node) for node in ctx.walk(call)} | {id(cast.call) for cast in _droppable_casts(ctx)}
    for node in ctx.walk(ctx.module):
        if id(node) in inside:
            continue
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "half":
            after = ctx.parent(node)
            # `scores.half().numpy()`: a result stored in float16, not a tensor for the model
            stored = isinstance(after, cst.Attribute) and after.attr.value in ("numpy", "cpu", "tolist", "item")
            if not node.args and not stored:
                return node
        if isinstance(node, (cst.Attribute, cst.Name)):
            name = dotted_name(node)
            if name in ("torch.float16", "torch.half") or (name or "").endswith("HalfTensor"):
                return node
    return None


def _hand_casts(ctx: ModuleContext) -> list[hand_casts.HandCast]:
    """The ``.half()`` casts whose value the next line hands to a model (``_hand_casts``)."""
    if ctx.hand_casts is None:
        ctx.hand_casts = hand_casts.candidates(ctx, _o2_setups(ctx, ctx.amp))
    return ctx.hand_casts


def _droppable_casts(ctx: ModuleContext) -> list[hand_casts.HandCast]:
    """The casts that provably only feed the forward of a model an O2/O3 setup made float16:
    they go with the setup, and keep no inference setup as it was."""
    return [cast for cast in _hand_casts(ctx) if cast.setups]


def _model_names(found: SetupCall) -> set[str]:
    """The names of the models a setup is given, by the last part (``self.model``: ``model``)."""
    models = found.models
    given = models.elements if isinstance(models, (cst.List, cst.Tuple)) else [models]
    names = set()
    for element in given:
        dotted = dotted_name(element.value if isinstance(element, cst.BaseElement) else element)
        if dotted is not None:
            names.add(dotted.split(".")[-1])
    return names


def _float16_model_copy(ctx: ModuleContext, found: SetupCall) -> cst.Call | None:
    """The first ``copy.half()`` of a copy of one of the setup's models (``copy =
    copy.deepcopy(model)``), made float16 by hand: Apex O1 ran it on float32 input by casting in
    its patched ops (a traced export); without Apex nothing does. None where there is none."""
    models = _model_names(found)
    copies: set[str] = set()
    for node in ctx.walk(ctx.module):
        if (
            isinstance(node, cst.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0].target, cst.Name)
            and isinstance(node.value, cst.Call)
            and (dotted_name(node.value.func) or "").rpartition(".")[2] == "deepcopy"
            and node.value.args
            and (dotted_name(node.value.args[0].value) or "").rpartition(".")[2] in models
        ):
            copies.add(node.targets[0].target.value)
    copies -= models
    for node in ctx.walk(ctx.module):
        if (
            isinstance(node, cst.Call)
            and not node.args
            and isinstance(node.func, cst.Attribute)
            and node.func.attr.value == "half"
            and isinstance(node.func.value, cst.Name)
            and node.func.value.value in copies
        ):
            return node
    return None


def _unproven_cast(ctx: ModuleContext, found: SetupCall) -> hand_casts.HandCast | None:
    """A cast to float16 by hand that feeds a call on this O2/O3 training setup's model (by
    name), where the tool cannot prove that the value goes there alone, or that the model
    there is the one set up: migrated, a float32 model could meet it."""
    names = _model_names(found)
    return next((cast for cast in _hand_casts(ctx) if not cast.setups and cast.model in names), None)


def _unproven_feed(
    ctx: ModuleContext, found: SetupCall, level: str, names: frozenset[str] | None = None, runtime: bool = False
) -> str | None:
    """AMP005's message where a cast to float16 by hand (``model(x.half())``, a cast lines above
    the call, a function here or imported that casts what it hands the model it is given) may
    reach this setup's model (``names``: the models it is given), and is not one of the casts
    proven to go with an O2/O3 setup (``_droppable_casts``); None where there is none. Migrated,
    the model is float32, and outside a torch.autocast region that input meets float32 weights.

    At O1 (``level`` "O1", or the old API's ``amp.init``) the model was float32 under Apex too,
    but Apex's patched functions cast the input and the weights alike to float16 everywhere in
    the process, evaluation included, where autocast now covers the training step alone."""
    names = frozenset(_model_names(found)) if names is None else names
    if not names:
        return None
    tree = pytree.parse(ctx.source)
    dropped = {ctx.position(cast.call) for cast in _droppable_casts(ctx)}
    o1 = level in ("O1", "init")
    subject = "amp.init (the old API, O1)" if level == "init" else f"amp.initialize at opt_level {level}"

    def message(where: str, feed: half_inputs.Feed, reaches: str) -> str:
        if runtime:
            why = (
                ": at O2/O3 that matched the float16 weights Apex gave the model, and at O1 Apex's patched functions "
                "cast the float32 weights to match wherever it ran; the migration keeps the model in float32 and puts "
                "only the training step under torch.autocast, and outside it that float16 input would meet float32 "
                "weights (a dtype error), which the tool cannot rule out here"
            )
        elif o1:
            why = (
                "; Apex O1 patched torch's functions for the whole process, so the float32 model's ops cast that "
                "input and their weights alike to float16 wherever it ran, evaluation included, while the "
                "migration puts only the training step's forward pass and loss under torch.autocast: elsewhere "
                "that float16 input would meet float32 weights (`mat1 and mat2 must have the same dtype`), which "
                "the tool cannot rule out here"
            )
        else:
            why = (
                ", matching the float16 weights Apex gave the model; the migration keeps the model in float32, and "
                "outside a torch.autocast region that float16 input would meet float32 weights (`Input type (Half) "
                "and weight type (Float)`), which the tool cannot rule out here"
            )
        return (
            f"{subject} left as it was: {where} casts to float16 by hand (`{feed.cast}`) what {reaches}{why}: write "
            f"`{feed.bare}` instead of `{feed.cast}` (the float32 model takes the float32 input), put that call "
            f'under `with torch.autocast("{ctx.options.device}", dtype=torch.float16):` if float16 speed matters, '
            "then run ampmigrate again"
        )

    autocast = _training_forward_lines(ctx, names) if o1 else []
    # top-level functions with a setup of their own (WaveFlow's O3 synthesis beside O1 training):
    # that one speaks for the models they run
    others = {_top_function(ctx, use.call) for use in ctx.amp.of("initialize") if use.call is not found.call}
    others.discard(_top_function(ctx, found.call))
    others.discard(None)
    for feed in half_inputs.feeds(tree, ctx.source, names):
        if any(first <= feed.call_line <= last for first, last in autocast):
            continue  # the migration runs that call under autocast, as Apex's patches ran it
        if o1 and feed.function in others:
            continue
        if (feed.line, feed.column + 1) not in dropped:
            return message(f"line {feed.line}", feed, f"line {feed.call_line} hands to `{feed.model}`")
    helpers: dict[str, list[tuple[half_inputs.Feed, str | None]]] = {}
    for name, feeds in half_inputs.feeders(tree, ctx.source).items():
        kept = [
            (feed, None)
            for feed in feeds
            if (feed.line, feed.column + 1) not in dropped
            and not (o1 and name in others)
            and not (
                o1
                and any(
                    first <= feed.call_line <= last
                    for first, last in _training_forward_lines(ctx, frozenset({feed.model}))
                )
            )
        ]
        if kept and _defined_once(tree, name):
            helpers.setdefault(name, []).extend(kept)
    for alias, index, parameter, origin, line, cast, bare in ctx.options.facts.half_feeders:
        feed = half_inputs.Feed(line, 0, cast, bare, line, parameter, alias, None if index < 0 else index)
        helpers.setdefault(alias, []).append((feed, origin))
    if not helpers:
        return None
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        for feed, module in helpers.get(pytree.dotted(node.func) or "", []):
            given = _ast_argument(node, feed.index, feed.model)
            dotted = pytree.dotted(given) if given is not None else None
            if dotted is None or dotted.split(".")[-1] not in names:
                continue
            where = f"line {feed.line}" if module is None else f"{module}:{feed.line}"
            hands = f"line {feed.call_line}" if module is None else "it"
            call = ast.get_source_segment(ctx.source, node) or ""
            if len(call) > 80:
                call = call[:77] + "..."
            return message(
                f"{where} (in `{feed.function}`)",
                feed,
                f"{hands} hands to `{feed.model}`, the parameter that line {node.lineno} gives `{dotted}` (`{call}`)",
            )
    return None


def _top_function(ctx: ModuleContext, node: cst.CSTNode) -> str | None:
    """The name of the top-level function ``node`` sits in (None: elsewhere)."""
    for ancestor in ctx.ancestors(node):
        if isinstance(ancestor, cst.FunctionDef) and isinstance(ctx.parent(ancestor), cst.Module):
            return ancestor.name.value
    return None


def _training_forward_lines(ctx: ModuleContext, names: frozenset[str]) -> list[tuple[int, int]]:
    """The lines (first, last) of each forward pass the scale_loss rule puts under autocast:
    from the statement calling a model to the last one computing the loss that a
    ``with amp.scale_loss(loss, ...)`` (or a handle's) scales, in one block (``forward_span``)."""
    found = []
    for use in ctx.amp.of("scale_loss"):
        if not use.call.args:
            continue
        statement = ctx.statement_of(use.call)
        span = forward_span(ctx, statement, use.call.args[0].value, set(names))
        if span is not None:
            found.append((ctx.lines(span[0])[0], ctx.lines(span[1])[1]))
    return found


def _o1_hand_cast(ctx: ModuleContext, found: SetupCall) -> str | None:
    """AMP005's message where an O1 setup (``amp.initialize``, or the old API's ``amp.init``,
    whose models are those an optimizer is made for) may see a float16 tensor or a float16
    model made by hand; None where there is none.

    Apex O1 left the model float32 and patched torch's functions process-wide: ``model(x.half())``
    and a ``model.half()`` fed float32 inputs ran wherever they were, evaluation included. The
    migration's autocast covers the training step alone: elsewhere either mismatch is a dtype
    error, and a float16 model in training gives GradScaler float16 gradients, which it refuses
    to unscale."""
    old_api = found.use.api == "init"
    tree = pytree.parse(ctx.source)
    names = half_inputs.parameter_owners(tree) if old_api else frozenset(_model_names(found))
    if not names:
        return None
    reached = _unproven_feed(ctx, found, "init" if old_api else "O1", names)
    if reached is not None:
        return reached
    return _halved_by_hand(
        ctx, found.call, names, "amp.init (the old API, O1)" if old_api else "amp.initialize at opt_level O1"
    )


def _guard_tests(ctx: ModuleContext, call: cst.Call) -> frozenset[str]:
    """The tests of the ``if``s whose body holds ``call``, as ``ast.unparse`` spells them."""
    found = set()
    for ancestor in ctx.ancestors(call):
        if isinstance(ancestor, cst.If) and any(a is ancestor.body for a in ctx.ancestors(call)):
            try:
                found.add(ast.unparse(ast.parse(syntax.code(ancestor.test).strip(), mode="eval").body))
            except SyntaxError:
                continue
    return frozenset(found)


def _halved_by_hand(
    ctx: ModuleContext, call: cst.Call, names: frozenset[str], subject: str, o1: bool = True
) -> str | None:
    """AMP005's message where the module casts a model named ``names`` itself to float16 by hand
    (``model.half()``, ``self.net.to(torch.float16)``); None where it does not.

    Migrated, the model is float32 and autocast covers the training step alone: a model halved
    by hand meets float32 inputs elsewhere (Apex's patches cast them to match), and its float16
    gradients are ones GradScaler refuses to unscale."""
    halved = next(
        iter(half_inputs.halvings(pytree.parse(ctx.source), ctx.source, names, _guard_tests(ctx, call))), None
    )
    if halved is None:
        return None
    if o1:
        how = (
            "Apex O1 patched torch's functions for the whole process, so the float32 inputs it was given were "
            "cast to match wherever it ran"
        )
    else:
        how = (
            "Apex had made the model float16 already and its patched forward cast the inputs to match, so this "
            "changed little there"
        )
    return (
        f"{subject} left as it was: line {halved.line} casts the model itself to float16 by hand "
        f"(`{halved.cast}`); {how}, while the migration keeps the model in float32 and puts only the training "
        "step under torch.autocast: elsewhere a float32 input would meet float16 weights (a dtype error), and "
        "GradScaler refuses the float16 gradients of a float16 model (`Attempting to unscale FP16 gradients`): "
        f"keep the model in float32 (drop `{halved.cast}`) and put the evaluation under "
        f'`with torch.autocast("{ctx.options.device}", dtype=torch.float16):` if float16 speed matters, then run '
        "ampmigrate again"
    )


def _defined_once(tree: ast.Module, name: str) -> bool:
    """Whether nothing at the module's top level but one function binds ``name``."""
    bound = 0
    for statement in tree.body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound += statement.name == name
        elif any(
            isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store) for n in ast.walk(statement)
        ):
            return False
    return bound == 1


def _ast_argument(call: ast.Call, index: int | None, name: str) -> ast.expr | None:
    """What ``call`` passes for the parameter ``name`` at position ``index`` (None: not known)."""
    for keyword in call.keywords:
        if keyword.arg == name:
            return keyword.value
    if index is None:
        return None
    for position, argument in enumerate(call.args):
        if isinstance(argument, ast.Starred):
            return None
        if position == index:
            return argument
    return None


def _o2_setups(ctx: ModuleContext, model: AmpModel) -> list[hand_casts.Setup]:
    """The O2/O3 amp.initialize calls standing alone at the top of a function's body (or in an
    ``if flag:`` there, without ``enabled=``: the flag switches it), that assign plain model names back (``model, optimizer = amp.initialize(model, optimizer, ...)``).
    """
    setups = []
    for use in model.of("initialize"):
        bound = _arguments(use.call)
        if bound is None or any(name in bound for name in ("cast_model_type", "cast_model_outputs")):
            continue
        level = syntax.literal(bound["opt_level"].value) if "opt_level" in bound else "O1"
        enabled = bound["enabled"].value if "enabled" in bound else None
        if level not in ("O2", "O3") or (enabled is not None and syntax.literal(enabled) is False):
            continue
        statement = ctx.statement_of(use.call)
        function = ctx.function_of(use.call)
        target = syntax.target_of(statement, use.call)
        if function is None or target is None:
            continue
        guard = None
        if ctx.parent(statement) is not function.body:
            # `if args.fp16: model, optimizer = amp.initialize(...)` at the top of the body: the
            # `if`'s flag switches it as `enabled=` would
            block = ctx.parent(statement)
            owner = ctx.parent(block) if block is not None else None
            if not (
                isinstance(owner, cst.If)
                and owner.body is block
                and owner.orelse is None
                and ctx.parent(owner) is function.body
                and hand_casts.flag_root(owner.test) is not None
                and "enabled" not in bound
            ):
                continue
            guard = syntax.normalized(owner.test)
        models = bound["models"].value
        given = [e.value for e in models.elements] if isinstance(models, (cst.List, cst.Tuple)) else [models]
        names = {node.value for node in given if isinstance(node, cst.Name)}
        if len(names) != len(given) or not names <= set(target_names(target)):
            continue
        always = enabled is None or syntax.literal(enabled) is True
        switch = None if always else syntax.normalized(enabled)  # type: ignore[arg-type]
        setups.append(hand_casts.Setup(use.call, statement, function, frozenset(names), guard or switch))
    return setups


def _inference_cast_message(ctx: ModuleContext, bound: dict[str, cst.Arg], level: object, cast: cst.CSTNode) -> str:
    """AMP005's message for an inference-only amp.initialize kept because the module casts to
    float16 by hand: without the call, those tensors would meet a float32 model."""
    model = ctx.code(bound["models"].value)
    if level in ("O2", "O3"):
        kept = "BatchNorm kept in float32" if level == "O2" else "BatchNorm included"
        if "keep_batchnorm_fp32" in bound:
            kept = "BatchNorm as keep_batchnorm_fp32 said"
        how = (
            f"Apex cast the model itself to float16 ({kept}), the floating inputs of its forward to float16 "
            f"and its outputs to float32: to migrate by hand, cast `{model}` to float16 as Apex did "
            f"(`{model}.half()` for O3) and cast what reaches its forward"
        )
    else:
        if not isinstance(level, str):
            level = ctx.code(bound["opt_level"].value)
        how = (
            "Apex O1 patched every op to cast its inputs: to migrate by hand, run the inference under "
            f'`with torch.autocast("{ctx.options.device}", dtype=torch.float16):`'
        )
    return (
        f"amp.initialize without optimizers (inference) at opt_level {level} left as it was: this module casts to "
        f"float16 by hand (line {ctx.position(cast)[0]}: `{ctx.code(cast)}`), and without the call the model would "
        f"run in float32 and meet those float16 tensors (a dtype mismatch where Apex ran); {how}"
    )


def _beside_training_message(ctx: ModuleContext, model: AmpModel, use: AmpCall) -> str | None:
    """AMP011's message for a model set up without optimizers beside one set up for training
    (a MoCo key encoder, a distillation teacher); None where it stands alone."""
    function = ctx.function_of(use.call)
    for other in model.of("initialize"):
        if other.call is use.call or ctx.function_of(other.call) is not function:
            continue
        bound = _arguments(other.call)
        if bound is not None and not _without_optimizers(bound):
            return (
                "amp.initialize without optimizers, beside the one that sets up training: the call was removed; "
                "where this model's forward leads to the loss it runs under the training step's torch.autocast, "
                "but Apex O1 also cast its other forward passes (evaluation): wrap those in torch.autocast too"
            )
    return None


def _without_optimizers(bound: dict[str, cst.Arg]) -> bool:
    optimizers = bound["optimizers"].value if "optimizers" in bound else None
    return (
        optimizers is None
        or syntax.literal(optimizers) is None
        or (isinstance(optimizers, (cst.List, cst.Tuple)) and not optimizers.elements)
    )


def _opt_level(
    ctx: ModuleContext, bound: dict[str, cst.Arg], call: cst.Call
) -> tuple[str | None, cst.BaseExpression | None] | None:
    """The literal opt level, or the expression choosing it at run time; None (reported) if invalid."""
    level_arg = bound.get("opt_level")
    if level_arg is None:
        return "O1", None
    value = syntax.literal(level_arg.value)
    if value is ... and isinstance(level_arg.value, cst.Name):
        value = _assigned_literal(ctx, level_arg.value.value, call)
    if isinstance(value, str) and value in ("O0", "O1", "O2", "O3"):
        return value, None
    if value is ...:
        return None, level_arg.value
    ctx.report("AMP005", level_arg, f"opt_level={value!r} is not one of O0-O3 (Apex raised at run time)")
    return None


def _assigned_literal(ctx: ModuleContext, name: str, call: cst.Call) -> object:
    """The literal a name holds at ``call``: ``opt_level = 'O1'`` earlier in the same block, the
    statements between naming it nowhere (``if HALF: opt_level = 'O1'; net, opt = amp.initialize(...,
    opt_level=opt_level)``, efficientdet.pytorch); ``...`` where not known."""
    found = _assignment_before(ctx, name, ctx.statement_of(call))
    return syntax.literal(found[1]) if found is not None else ...


def _assignment_before(
    ctx: ModuleContext, name: str, statement: cst.CSTNode
) -> tuple[cst.CSTNode, cst.BaseExpression] | None:
    """The line ``name = value`` earlier in the block of ``statement``, with its value, where the
    statements between name it nowhere; None where there is none."""
    body: list[cst.CSTNode] = list(ctx.block_of(statement).body)
    for earlier in reversed(body[: body.index(statement)]):
        assigned = syntax.name_assignment(earlier)
        if assigned is not None and assigned[0] == name:
            return earlier, assigned[1]
        if any(isinstance(node, cst.Name) and node.value == name for node in ctx.walk(earlier)):
            return None
    return None


def _enabled_flag(
    ctx: ModuleContext, bound: dict[str, cst.Arg], level: str | None
) -> tuple[list[cst.BaseExpression], bool]:
    """The ``enabled=`` argument: as a condition when computed at run time, or whether it is off."""
    enabled_arg = bound.get("enabled")
    if enabled_arg is None:
        return [], False
    value = syntax.literal(enabled_arg.value)
    if enabled_arg.keyword is None and isinstance(value, str):
        ctx.report(
            "AMP005",
            enabled_arg,
            f"the third positional argument of amp.initialize is `enabled`, not opt_level: "
            f"{value!r} meant enabled={bool(value)} at opt_level {level}; check the intent",
        )
    if value is ...:
        return [enabled_arg.value], False
    return [], not value


def _read_settings(ctx: ModuleContext, model: AmpModel, found: SetupCall) -> _Settings | None:
    """When amp is on (opt level, ``enabled=``, guarding ifs) and where the scaler is created."""
    level_read = _opt_level(ctx, found.bound, found.call)
    if level_read is None:
        return None
    level, level_expression = level_read
    enabled_parts, disabled = _enabled_flag(ctx, found.bound, level)
    disabled = disabled or level == "O0"
    statement = found.statement
    guards, outermost = _guards(ctx, statement)
    in_branch = statement in _in_branch_statements(ctx, model)
    shared_above = False
    if in_branch:
        # one scaler for the whole if/else: built in each clause, or, when the chain is
        # itself guarded, once above that guard (the clauses cover every path below it)
        top, inner_tests = _branch_position(ctx, statement)
        guards, outermost = _guards(ctx, top)
        # the same plain `if` around the call in every clause: its test holds on each path of the chain
        guards = [*guards, *inner_tests]
        shared_above = bool(guards)
        if not shared_above:
            guards, outermost = [], statement
    from_guards = [part for guard in guards for part in _apex_free_conjuncts(ctx, guard)]
    checks_apex = any(
        isinstance(node, cst.Name) and (binding := ctx.resolve(node.value, node)) is not None and binding.kind == "amp"
        for guard in guards
        for node in ctx.walk(guard)
    )
    enabled_parts[:0] = from_guards
    if level_expression is not None:
        enabled_parts.append(
            cst.Comparison(
                left=(
                    syntax.strip_parens(level_expression)
                    # a looser-binding expression keeps its parentheses: `("O2" if fp16 else "O0") != "O0"`
                    if not isinstance(
                        syntax.strip_parens(level_expression),
                        (cst.BinaryOperation, cst.IfExp, cst.BooleanOperation, cst.Lambda, cst.NamedExpr),
                    )
                    else syntax.strip_parens(level_expression).with_changes(
                        lpar=[cst.LeftParen()], rpar=[cst.RightParen()]
                    )
                ),
                comparisons=[cst.ComparisonTarget(cst.NotEqual(), syntax.string("O0"))],
            )
        )
    if outermost is not statement and not found.inference_only:  # inference: no scaler is created
        late = _read_late(ctx, outermost, enabled_parts)
        if late:
            ctx.report(
                "AMP010",
                found.call,
                f"the scaler must be created before the `if` around this call (so every path has one), but its "
                f"`enabled=` reads {', '.join(sorted(late))}, assigned inside that `if`: compute the flag before the "
                "`if`, then run ampmigrate again",
            )
            return None
        # the call's own results (`self.model, self.optimizer = amp.initialize(...)`) are the objects it was given
        latched = sorted(_attributes_read(enabled_parts) & _assigned_inside(outermost, skip=statement)[1])
        if latched:
            ctx.report(
                "AMP010",
                found.call,
                f"the `if` around this call reads {', '.join(latched)}, which it also sets: it runs amp.initialize "
                "once, and Apex's set-up then stayed for every later call, while a GradScaler made above that `if` "
                "would be made again on each call, disabled (float32, no autocast) once the flag is set: create the "
                'GradScaler once where the flag starts (`torch.amp.GradScaler("cuda", enabled=...)`), then run '
                "ampmigrate again",
            )
            return None
        counters = _counters_compared(ctx, outermost, enabled_parts)
        if counters:
            ctx.report(
                "AMP010",
                found.call,
                f"the `if` around this call compares {', '.join(counters)} (a parameter) with a number: a call made "
                "on every epoch or step runs amp.initialize on one of them only, and Apex's set-up then stayed for "
                "the later calls, while a GradScaler made above that `if` would be made again on each call, disabled "
                '(float32, no autocast) on the others: create the GradScaler once (`torch.amp.GradScaler("cuda", '
                "enabled=...)`) where the training starts and pass it in, then run ampmigrate again",
            )
            return None
        varying = _varying_in_loop(ctx, outermost, enabled_parts)
        if varying:
            loop, names = varying
            ctx.report(
                "AMP010",
                found.call,
                f"the scaler would be created before the `if` around this call, inside the loop at line "
                f"{ctx.position(loop)[0]}, but its `enabled=` reads {', '.join(names)}, which that loop changes: "
                "Apex kept the set-up this call made for the later iterations, while a GradScaler made there would "
                "be made again on every iteration, disabled (float32, no autocast) where the condition no longer "
                'holds: create `scaler = torch.amp.GradScaler("cuda", enabled=...)` once before the loop, then run '
                "ampmigrate again",
            )
            return None
    return _Settings(
        level,
        level_expression,
        disabled,
        enabled_parts,
        outermost,
        in_branch,
        shared_above,
        len(from_guards),
        checks_apex,
        bool_flags(ctx),
    )


def _per_call_switches(
    ctx: ModuleContext, home: tuple[cst.FunctionDef | None, cst.ClassDef | None], parts: list[cst.BaseExpression]
) -> list[str]:
    """Parameters of the method that makes a scaler kept on ``self`` (not ``__init__``) that the
    tests of the ``if`` around amp.initialize (``parts``) read as plain names (``training`` in
    ``if self.use_apex and training:``): switches of one call, where the scaler outlives the call
    (``args.fp16``, a setting, is not one)."""
    method, klass = home
    if method is None or klass is None or method.name.value == "__init__":
        return []
    parameters = set(syntax.parameter_names(method)[1:])  # not `self`
    found = set()
    for part in parts:
        for node in syntax.descendants(part):
            parent = ctx.parent(node)
            if isinstance(node, cst.Name) and node.value in parameters and not isinstance(parent, cst.Attribute):
                found.add(node.value)
    return sorted(found)


def _counters_compared(ctx: ModuleContext, outermost: cst.CSTNode, parts: list[cst.BaseExpression]) -> list[str]:
    """Parameters of the function around ``outermost`` that ``parts`` compare with an integer
    (``epoch == 0``): counters of a function called again and again, not amp switches."""
    function = ctx.function_of(outermost)
    if function is None:
        return []
    parameters = set(syntax.parameter_names(function))
    found: set[str] = set()
    for part in parts:
        for node in syntax.descendants(part):
            if not isinstance(node, cst.Comparison):
                continue
            operands = [node.left, *(target.comparator for target in node.comparisons)]
            if any(isinstance(syntax.strip_parens(o), cst.Integer) for o in operands):
                found.update(
                    o.value
                    for o in map(syntax.strip_parens, operands)
                    if isinstance(o, cst.Name) and o.value in parameters
                )
    return sorted(found)


def _attributes_read(parts: list[cst.BaseExpression]) -> set[str]:
    """The dotted attributes (``self.amp_ready``) that ``parts`` read."""
    found: set[str] = set()
    for part in parts:
        for node in syntax.descendants(part):
            if isinstance(node, cst.Attribute) and (dotted := dotted_name(node)) is not None:
                found.add(dotted)
    return found


def _varying_in_loop(
    ctx: ModuleContext, outermost: cst.CSTNode, enabled_parts: list[cst.BaseExpression]
) -> tuple[cst.CSTNode, list[str]] | None:
    """The loop around ``outermost`` (in its function) and the names (or ``self.x`` attributes)
    of the ``enabled=`` parts it assigns (its target included), when there are any: a scaler
    created there would be created again each iteration under a condition that changes."""
    function = ctx.function_of(outermost)
    read = {n.value for part in enabled_parts for n in _names_in(part)}
    for ancestor in ctx.ancestors(outermost):
        if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef)):
            return None
        if isinstance(ancestor, (cst.For, cst.While)) and ctx.function_of(ancestor) is function:
            bound, attributes = _assigned_inside(ancestor)
            names = sorted(read & bound | _attributes_read(enabled_parts) & attributes)
            return (ancestor, names) if names else None
    return None


def _loss_scale(bound: dict[str, cst.Arg]) -> _LossScale:
    """``loss_scale``, ``min/max_loss_scale`` and ``num_losses``, with what to report about them."""
    scale = _LossScale()
    floor = syntax.literal(bound["min_loss_scale"].value) if "min_loss_scale" in bound else None
    ceiling = syntax.literal(bound["max_loss_scale"].value) if "max_loss_scale" in bound else None
    if isinstance(ceiling, (int, float)) and ceiling > 0 and floor == ceiling:
        # every dynamic step clamps back to S (Apex skipped the overflowing ones, as GradScaler does)
        scale.clamped = float(ceiling)
    loss_scale_arg = bound.get("loss_scale")
    dynamic = True
    if loss_scale_arg is not None:
        value = syntax.literal(loss_scale_arg.value)
        if value is not ... and value not in (None, "dynamic") and _as_number(value) is None:
            scale.invalid = True
            scale.notes.append(
                ("AMP005", loss_scale_arg, f'loss_scale={value!r} is neither a number nor "dynamic" (Apex raised)')
            )
            return scale
        if value is ...:
            scale.runtime = loss_scale_arg.value
            scale.notes.append(("AMP002", loss_scale_arg, _RUNTIME_NOTE))
            dynamic = False
        else:
            number = None if value in (None, "dynamic") else _as_number(value)
            dynamic = number is None
            if number == 1.0:
                scale.off = True
            elif number is not None:
                scale.static = number
                scale.notes.append(("AMP002", loss_scale_arg, None))
    if dynamic and scale.clamped is not None:
        scale.static = scale.clamped  # held, and skipping like Apex: no AMP002, no AMP003
    elif scale.runtime is None or scale.clamped is None:  # (a run-time value is held either way)
        for name in ("min_loss_scale", "max_loss_scale"):
            if name in bound and syntax.literal(bound[name].value) is not None:
                scale.notes.append(("AMP003", bound[name], None))
    scale.initial = scale.static
    if scale.static is None and isinstance(ceiling, (int, float)) and ceiling < 2.0**16:
        scale.initial = float(ceiling)  # Apex started at min(max_loss_scale, 2**16)
    if "num_losses" in bound and syntax.literal(bound["num_losses"].value) != 1:
        scale.notes.append(("AMP004", bound["num_losses"], None))
    return scale


def _held_default(ctx: ModuleContext, found: SetupCall) -> dict[str, cst.Arg]:
    """The call's arguments, ``loss_scale=P`` read as P's default where every call of the function in
    the project leaves the parameter P there (``ModuleFacts.held_defaults``), with an AMP006 note."""
    bound = found.bound
    argument = bound.get("loss_scale")
    function = ctx.function_of(found.call)
    if (
        argument is None
        or not isinstance(argument.value, cst.Name)
        or function is None
        or (function.name.value, argument.value.value) not in ctx.options.facts.held_defaults
    ):
        return bound
    parameter = next(
        (p for p in (*function.params.params, *function.params.kwonly_params) if p.name.value == argument.value.value),
        None,
    )
    if parameter is None or parameter.default is None or syntax.literal(parameter.default) is ...:
        return bound
    ctx.report(
        "AMP006",
        argument,
        f"loss_scale={argument.value.value}: every call of `{function.name.value}` in the project leaves "
        f"`{argument.value.value}` at its default {syntax.code(parameter.default)}, so the GradScaler is made for "
        "that; the parameter is no longer read (a call passing another loss_scale needs the scaler made by hand)",
    )
    return {**bound, "loss_scale": argument.with_changes(value=parameter.default)}


def _scale_literal(value: float | None) -> cst.BaseExpression:
    return cst.Float(repr(value)) if value is not None else cst.Name("None")


def _as_number(value: object) -> float | None:
    """``float(value)`` as Apex's loss_scale setter takes it; None where that raises."""
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def _held_initial(name: str, scale: _LossScale) -> cst.BaseExpression:
    """``init_scale=``: the held scale, or the dynamic start where it is None."""
    if scale.clamped is not None:
        return cst.Name(name)  # never None: the dynamic case holds the clamp
    start = cst.Float(repr(scale.initial)) if scale.initial is not None else cst.parse_expression("2.0**16")
    return cst.BooleanOperation(cst.Name(name), cst.Or(), start)


_RUNTIME_NOTE = (
    "loss_scale is computed at run time: a number (1.0 included, where Apex did not scale at all) is held "
    "with `scaler.update(new_scale=...)`, and GradScaler skips the inf/NaN steps Apex applied; "
    '"dynamic" (and None, where it meant dynamic) scale as Apex\'s dynamic scaler did'
)


def _held_scale(scale: _LossScale, guard: cst.BaseExpression | None) -> cst.BaseExpression:
    """``float(E) if E not in (None, "dynamic") else None``: the scale to hold (None: dynamic),
    with ``guard and`` in front where amp may be off (Apex then never read E)."""
    assert scale.runtime is not None
    expression = syntax.strip_parens(scale.runtime)
    if isinstance(expression, (cst.IfExp, cst.Lambda, cst.BooleanOperation, cst.NamedExpr)):
        expression = expression.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    test: cst.BaseExpression = cst.Comparison(
        expression,
        [
            cst.ComparisonTarget(
                cst.NotIn(),
                cst.Tuple([cst.Element(cst.Name("None")), cst.Element(syntax.string("dynamic"))]),
            )
        ],
    )
    if guard is not None:
        if isinstance(guard, (cst.IfExp, cst.Lambda, cst.NamedExpr)) or (
            isinstance(guard, cst.BooleanOperation) and isinstance(guard.operator, cst.Or)
        ):
            guard = guard.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        test = cst.BooleanOperation(guard.deep_clone(), cst.And(), test)
    dynamic_value: cst.BaseExpression = _scale_literal(scale.clamped)
    if scale.o3 and scale.clamped != 1.0:
        # None kept O3's static 1.0; "dynamic" asked for dynamic scaling
        dynamic_value = cst.IfExp(
            test=cst.Comparison(expression.deep_clone(), [cst.ComparisonTarget(cst.Is(), cst.Name("None"))]),
            body=_scale_literal(1.0),
            orelse=dynamic_value,
            lpar=[cst.LeftParen()],
            rpar=[cst.RightParen()],
        )
    return cst.IfExp(test=test, body=syntax.call("float", [cst.Arg(expression.deep_clone())]), orelse=dynamic_value)


def _apex_check(statement: cst.CSTNode) -> bool:
    """``if not is_apex_available(): raise ImportError(...)`` (or ``if not has_apex: ...``): it
    only runs to raise ImportError when Apex is missing (it may build its message first); a
    ValueError for a flag (``if not args.apex: raise ValueError``) stays."""
    if not (isinstance(statement, cst.If) and statement.orelse is None):
        return False
    test = statement.test
    if not (isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not)):
        return False
    probe = test.expression.func if isinstance(test.expression, cst.Call) else test.expression
    if not (isinstance(probe, (cst.Name, cst.Attribute)) and "apex" in syntax.code(probe).lower()):
        return False
    body = statement.body
    if not isinstance(body, cst.IndentedBlock):
        return False
    last = syntax.sole_statement(body.body[-1])
    if not (isinstance(last, cst.Raise) and last.exc is not None):
        return False
    raised = last.exc.func if isinstance(last.exc, cst.Call) else last.exc
    return syntax.code(raised) in ("ImportError", "ModuleNotFoundError")


def _apex_checks_before(ctx: ModuleContext, statement: cst.CSTNode) -> list[cst.CSTNode]:
    """The Apex checks just before the call in its block: they made sure the call could run, and
    left behind they would stop the migrated fp16 run where Apex is no longer installed."""
    parent = ctx.parent(statement)
    if not isinstance(parent, (cst.Module, cst.IndentedBlock)):
        return []
    body = list(parent.body)
    index = next(i for i, s in enumerate(body) if s is statement)
    checks: list[cst.CSTNode] = []
    while index > 0 and _apex_check(body[index - 1]):
        index -= 1
        checks.append(body[index])
    return checks


def _drop_call(ctx: ModuleContext, found: SetupCall, then: Sequence[Statement] = ()) -> None:
    """The call's statement goes, leaving its alias assignment (if any) and ``then``; so does
    ``opt_level = 'O1'`` just before it where nothing else reads that name, and a check just
    before it that Apex is installed."""
    replacement = [*found.replacement(), *then]
    if replacement:
        ctx.plan.replace_statement[found.statement] = replacement
    else:
        ctx.plan.remove.add(found.statement)
    level = _level_read_only_here(ctx, found)
    if level is not None:
        ctx.plan.remove.add(level)
    ctx.plan.remove.update(_apex_checks_before(ctx, found.statement))


def _level_read_only_here(ctx: ModuleContext, found: SetupCall) -> cst.CSTNode | None:
    """The line ``opt_level = 'O1'`` earlier in the call's block whose name only the call's
    ``opt_level=`` reads (efficientdet.pytorch: ``if HALF: opt_level = 'O1'`` then the call):
    with the call gone it would be a dead assignment."""
    level_arg = found.bound.get("opt_level")
    if level_arg is None or not isinstance(level_arg.value, cst.Name):
        return None
    name = level_arg.value.value
    assignment = _assignment_before(ctx, name, found.statement)
    if assignment is None or syntax.literal(assignment[1]) is ...:
        return None
    spelled = [
        node for node in ctx.nodes_of(cst.Name) if node.value == name and syntax.names_a_value(node, ctx.parent(node))
    ]
    return assignment[0] if len(spelled) == 2 else None


def _home(
    ctx: ModuleContext, model: AmpModel, call: cst.Call, settings: _Settings
) -> tuple[cst.FunctionDef | None, cst.ClassDef | None] | None:
    """Where the scaler lives (function, and class when it goes on ``self``), such that every
    use that needs it can reach it; None (reported) when some use cannot."""
    function = ctx.function_of(call)
    elsewhere = [
        other
        for other in model.calls
        if other.api in _USES_NEEDING_SCALER
        and not _inside(ctx, other.call, function)
        and (other.api != "master_params" or in_clip(ctx, other.call))
        # a call through an object that carries the scaler (``args.amp``) reads it from there
        and not (ctx.carriers.any and other.base in ctx.carriers.plain_bases)
    ]
    if function is None or not elsewhere:
        return function, None
    klass = ctx.class_of_method(function)
    unreachable = [other for other in elsewhere if not model.can_reach(function, klass, other.call)]
    if unreachable and klass is None and isinstance(ctx.parent(function), cst.Module):
        # a factory function: the scaler lives at module level, where every function of the
        # file reaches it (switched on at run time, the factory sets it: see _set_by_factory)
        return None, None
    if unreachable:
        # migrating this call alone would leave Apex code behind that needs it
        where = ctx.position(unreachable[0].call)[0]
        factory = _returning_factory(ctx, function, unreachable[0].call)
        how = (
            f"{factory} returns what amp.initialize made to its caller, which uses amp: create the GradScaler "
            f"here, return it with them and unpack it where {function.name.value}(...) is called, then run "
            "ampmigrate again"
            if factory is not None
            else "pass one to it, then run ampmigrate again"
        )
        ctx.report(
            "AMP022",
            call,
            f"amp.initialize left as it was: the amp.{unreachable[0].api} at line {where} could not "
            f"reach a GradScaler created here ({how})",
        )
        return None
    return function, klass


def _returning_factory(ctx: ModuleContext, function: cst.FunctionDef, use: cst.CSTNode) -> str | None:
    """``function``'s name when it returns something and the function of ``use`` calls it by
    name (``model, optimizer = setup(...)``): a factory whose scaler would have to be returned."""
    user = ctx.function_of(use)
    if user is None or not any(
        isinstance(node, cst.Return) and node.value for node in ctx.walk(function, into_definitions=False)
    ):
        return None
    name = function.name.value
    calls = (node for node in ctx.walk(user) if isinstance(node, cst.Call))
    if not any(isinstance(node.func, cst.Name) and node.func.value == name for node in calls):
        return None
    return f"`{name}`"


def _report_numerics(ctx: ModuleContext, found: SetupCall, settings: _Settings) -> None:
    """AMP001 (O2/O3 became autocast, the nearest recipe) or AMP012 (O1, an exact match)."""
    if settings.disabled:
        return
    level, level_expression, bound = settings.level, settings.level_expression, found.bound
    if (
        level in ("O2", "O3")
        or level_expression is not None
        or any(name in bound and syntax.literal(bound[name].value) is not None for name in _CASTING_SETTINGS)
    ):
        if level_expression is not None:
            spelled = " ".join(syntax.code(level_expression).split())
            what = f"opt_level is chosen at run time ({spelled}): O2/O3 runs now use"
        elif level in ("O2", "O3"):
            what = f"{level} was migrated to"
        else:
            what = "The O2-style casting settings were migrated to"
        ctx.report("AMP001", found.call, f"{what} torch.autocast + GradScaler, the nearest native recipe")
    elif level == "O1":
        ctx.report("AMP012", found.call)


def _join_local_scaler(
    ctx: ModuleContext, found: SetupCall, settings: _Settings, scale: _LossScale, same_scope: list[Scaler]
) -> None:
    """A second initialize in a function that already has a scaler: it shares that one."""
    call, first = found.call, same_scope[0]
    branch_enabled = (
        cst.Name("False")
        if settings.disabled or scale.off
        else _conjunction(settings.enabled_parts, settings.flags) if settings.enabled_parts else None
    )
    args = _scaler_arguments(ctx, scale.initial, branch_enabled)
    held: list[Statement] = []
    if settings.in_branch and (
        scale.runtime is not None
        or scale.static is not None
        or first.static_scale is not None
        or first.held_scale is not None
    ):
        # each clause sets the scale its updates hold (None: dynamic)
        name = _hold_beside(ctx, first, settings)
        if name is None:
            ctx.report(
                "AMP005",
                call,
                "the clauses of this if/else ask for different loss scales, and the first one's GradScaler "
                "is created where a held scale cannot be set beside it: set the scale by hand",
            )
            ctx.consumed.discard(found.use.base)
            return
        value: cst.BaseExpression = (
            _held_scale(scale, None)
            if scale.runtime is not None
            else cst.Float(repr(scale.static)) if scale.static is not None else cst.Name("None")
        )
        held.append(syntax.assign_statement(cst.Name(name), value))
        if scale.runtime is not None:
            args = _scaler_arguments(ctx, None, branch_enabled, _held_initial(name, scale))
    creation = syntax.assign_statement(cst.Name(first.name), syntax.call("torch.amp.GradScaler", args))
    if settings.in_branch and settings.shared_above:
        # the scaler above the guards stands for this clause too, unless it asks for its own scale
        _drop_call(ctx, found, then=[*held, creation] if held else [])
    elif settings.in_branch:
        # another clause of the same if/else: it builds the same scaler its own way
        ctx.plan.replace_statement[found.statement] = [*found.replacement(), *held, creation]
    elif _same_settings(first.initialize, call):
        # Apex's second call replaced the loss scaler of the first: both optimizers then
        # shared one, as they share this GradScaler
        _drop_call(ctx, found)
    else:
        ctx.report(
            "AMP010",
            call,
            "a second amp.initialize in the same function, with other settings than the first: Apex replaced "
            "the first call's loss scaler with this call's, so both optimizers shared one scaler set up as "
            f"asked here, and the amp setup stays as it was: give both calls this call's settings "
            f"(`{_settings_code(call)}`), as Apex ran them, then run ampmigrate again",
        )
        ctx.consumed.discard(found.use.base)


def _settings(call: cst.Call) -> dict[str, cst.Arg] | None:
    """The call's arguments but its models and optimizers; None where they cannot be bound."""
    bound = _arguments(call)
    if bound is None:
        return None
    return {name: arg for name, arg in bound.items() if name not in ("models", "optimizers")}


def _settings_code(call: cst.Call) -> str:
    """The call's settings as written (``opt_level="O1", ...``)."""
    return ", ".join(
        " ".join(f"{name}={syntax.code(arg.value)}".split()) for name, arg in (_settings(call) or {}).items()
    )


def _same_settings(first: cst.Call | None, second: cst.Call) -> bool:
    """Whether two amp.initialize calls ask for the same (all but their models and optimizers)."""
    if first is None:
        return False
    spelled = [
        {name: syntax.normalized(arg.value) for name, arg in settings.items()}
        for settings in (_settings(first), _settings(second))
        if settings is not None
    ]
    return len(spelled) == 2 and spelled[0] == spelled[1]


def _hold_beside(ctx: ModuleContext, first: Scaler, settings: _Settings) -> str | None:
    """The name that holds ``first``'s loss scale, set just before ``first`` is created (in the
    first clause, or above the guards); None where that creation cannot be found."""
    if first.held_scale is not None:
        return first.held_scale
    if first.initialize is None:
        return None
    planned = (
        ctx.plan.before.get(settings.outermost)
        if settings.shared_above
        else ctx.plan.replace_statement.get(ctx.statement_of(first.initialize))
    )
    at = next((i for i, line in enumerate(planned or []) if _assigns(line, first.name)), None)
    if planned is None or at is None:
        return None
    name = ctx.fresh_name("static_loss_scale")
    value = cst.Float(repr(first.static_scale)) if first.static_scale is not None else cst.Name("None")
    planned.insert(at, syntax.assign_statement(cst.Name(name), value))
    first.held_scale, first.static_scale = name, None
    return name


def _assigns(line: Statement, name: str) -> bool:
    """Whether ``line`` is ``name = ...``."""
    return (
        isinstance(line, cst.SimpleStatementLine)
        and isinstance(line.body[0], cst.Assign)
        and isinstance(line.body[0].targets[0].target, cst.Name)
        and line.body[0].targets[0].target.value == name
    )


def _enabled_arguments(
    settings: _Settings, scale: _LossScale
) -> tuple[cst.BaseExpression | None, cst.BaseExpression | None | str]:
    """The scaler's ``enabled=`` and autocast's (see ``Scaler``)."""
    scaler_enabled = _conjunction(settings.enabled_parts, settings.flags) if settings.enabled_parts else None
    if settings.disabled:
        return cst.Name("False"), "off"
    if scale.off:
        return cst.Name("False"), scaler_enabled
    return scaler_enabled, None


# methods that return the module they are called on, moved or cast (`model.to(device)`)
_MOVING_METHODS = frozenset({"to", "cuda", "cpu", "half", "float", "double", "bfloat16", "type", "train"})


def _create_scaler(
    ctx: ModuleContext,
    model: AmpModel,
    found: SetupCall,
    settings: _Settings,
    scale: _LossScale,
    home: tuple[cst.FunctionDef | None, cst.ClassDef | None],
    name: str,
) -> None:
    """Record the new scaler in the model, and plan its creation where it lives."""
    function, klass = home
    call, statement = found.call, found.statement
    scaler_enabled, autocast_enabled = _enabled_arguments(settings, scale)
    scaler = Scaler(
        initialize=call,
        function=function,
        klass=klass,
        name=name,
        enabled=scaler_enabled,
        autocast_enabled=autocast_enabled,
        static_scale=scale.static,
    )
    models = found.models
    for element in models.elements if isinstance(models, (cst.List, cst.Tuple)) else [models]:
        expression = element.value if isinstance(element, cst.BaseElement) else element
        # `[model.to(device), model_old.to(device)]`: the model is what is moved
        while (
            isinstance(expression, cst.Call)
            and isinstance(expression.func, cst.Attribute)
            and expression.func.attr.value in _MOVING_METHODS
        ):
            expression = expression.func.value
        dotted = dotted_name(expression)
        if dotted is not None:
            scaler.model_names.add(dotted.split(".")[-1])
    # a model given to an amp.initialize without optimizers (a momentum encoder, a teacher) ran its
    # forward pass in float16 too: where it feeds the loss, autocast starts at its call
    scaler.model_names |= _inference_models(model)
    model.scalers.append(scaler)

    arguments = _scaler_arguments(ctx, scale.initial, scaler_enabled)
    held_above: list[Statement] = []  # before the scaler's creation
    held_here: list[Statement] = []  # in place of the call
    if scale.runtime is not None:
        held = scaler.held_scale = ctx.fresh_name("static_loss_scale")
        late = settings.outermost is not statement and bool(
            {n.value for n in _names_in(scale.runtime)} & _bound_inside(settings.outermost)
        )
        if settings.shared_above or late:
            # the scaler above the guards serves the paths where amp is off; this clause (which may
            # compute the scale only here) makes its own
            held_above.append(syntax.assign_statement(cst.Name(held), cst.Name("None")))
            own = _scaler_arguments(ctx, None, scaler_enabled, _held_initial(held, scale))
            held_here.append(syntax.assign_statement(cst.Name(held), _held_scale(scale, None)))
            held_here.append(syntax.assign_statement(cst.Name(name), syntax.call("torch.amp.GradScaler", own)))
        else:
            # above the guards, read the value only where Apex did: when amp is on
            guard = scaler_enabled if settings.outermost is not statement else None
            held_above.append(syntax.assign_statement(cst.Name(held), _held_scale(scale, guard)))
            arguments = _scaler_arguments(ctx, None, scaler_enabled, _held_initial(held, scale))
    constructor = syntax.call("torch.amp.GradScaler", arguments)
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

    if _set_by_factory(ctx, found, settings, home):
        _set_in_factory(ctx, found, settings, scale, scaler)
        return
    if function is None and ctx.function_of(call) is not None:
        ctx.plan.module_globals.append(creation)
        _drop_call(ctx, found)
    elif settings.outermost is statement:
        _drop_call(ctx, found, then=[*held_above, creation])
    else:
        planned = ctx.plan.before[settings.outermost]
        if held_above or not any(line.deep_equals(creation) for line in planned):
            # several amp.initialize calls under the same guards (one per model/optimizer pair):
            # Apex's last call left one set of loss scalers, and one scaler made above stands for them
            planned.extend([*held_above, creation])
        _drop_call(ctx, found, then=held_here)


def _set_in_factory(
    ctx: ModuleContext, found: SetupCall, settings: _Settings, scale: _LossScale, scaler: Scaler
) -> None:
    """The factory's scaler (``_set_by_factory``): a disabled one at module level, replaced
    where amp.initialize ran, under the same guards (a call of the factory with amp off
    leaves the scaler as it was, as it left Apex's state), declared global at the top."""
    factory = ctx.function_of(found.call)
    assert factory is not None and isinstance(factory.body, cst.IndentedBlock)
    scaler.may_be_disabled = True
    off = syntax.assign_statement(
        cst.Name(scaler.name), syntax.call("torch.amp.GradScaler", _scaler_arguments(ctx, None, cst.Name("False")))
    )
    note = cst.EmptyLine(comment=cst.Comment(f"# off until {factory.name.value}() sets up mixed precision"))
    ctx.plan.module_globals.append(off.with_changes(leading_lines=[note]))
    body = factory.body.body
    first = 1 if len(body) > 1 and syntax.is_docstring(body[0]) else 0
    ctx.plan.before[body[first]].insert(0, cst.SimpleStatementLine([cst.Global([cst.NameItem(cst.Name(scaler.name))])]))
    if settings.guards_check_apex:
        # `if amp is not None and ...:` goes: torch.amp is always there, so the scaler is made
        # above that if, switched by the rest of its conditions
        enabled, _ = _enabled_arguments(settings, scale)
        at = settings.outermost
    else:
        # under the guards, where the call stood: only the call's own conditions (its opt level)
        here = replace(settings, enabled_parts=settings.enabled_parts[settings.guard_parts :])
        enabled, _ = _enabled_arguments(here, scale)
        at = found.statement
    scaler.enabled = enabled
    creation = syntax.assign_statement(
        cst.Name(scaler.name), syntax.call("torch.amp.GradScaler", _scaler_arguments(ctx, scale.initial, enabled))
    )
    if at is found.statement:
        _drop_call(ctx, found, then=[creation])
    else:
        ctx.plan.before[at].append(creation)
        _drop_call(ctx, found)


def _scale_written_after(
    ctx: ModuleContext, found: SetupCall, settings: _Settings, scale: _LossScale
) -> tuple[cst.SimpleStatementLine, float] | None:
    """The loss scale set on Apex's first loss scaler right after this call, where the
    GradScaler's ``init_scale`` reproduces it exactly."""
    written = amp_private_state.scale_write_after(ctx, found.statement)
    if written is None:
        return None
    value, bound = written[1], found.bound
    if scale.runtime is not None:
        return None  # held from a run-time value: the write stays, and the setup with it
    if scale.off or ("enabled" in bound and syntax.literal(bound["enabled"].value) is not True):
        return None  # loss_scale=1.0 had no scaler to set; disabled, Apex had none at all
    if "num_losses" in bound and syntax.literal(bound["num_losses"].value) != 1:
        return None  # the other losses kept their own scale
    if (settings.disabled or settings.level_expression is not None) and (
        not amp_private_state.power_of_two(value) or amp_private_state.reads_scale(ctx)
    ):
        # at O0 Apex scaled float32 gradients by it (exact only for a power of two) and reported it,
        # where the disabled GradScaler reports 1.0
        return None
    if scale.static is None:
        ceiling = syntax.literal(bound["max_loss_scale"].value) if "max_loss_scale" in bound else 2.0**24
        if not isinstance(ceiling, (int, float)) or value > ceiling:
            return None  # Apex's first growth would have capped it
    return written


def _plan_one(ctx: ModuleContext, model: AmpModel, use: AmpCall) -> None:
    if ctx.skipped(use.call) or use.base in ctx.consumed:
        return  # left as the user asked, or migrated by an earlier rule (timm_apex_scaler)
    found = _read_call(ctx, use)
    if found is not None:
        plan_setup(ctx, model, found)


def plan_setup(ctx: ModuleContext, model: AmpModel, found: SetupCall) -> None:
    """The GradScaler for one amp setup call (``amp.initialize``, or the old API's ``amp.init``);
    the call's base is consumed when it is planned."""
    use = found.use
    settings = _read_settings(ctx, model, found)
    if settings is None:
        return
    scale = _loss_scale(_held_default(ctx, found))
    bound = found.bound
    if scale.invalid:
        for note in scale.notes:
            ctx.report(*note)
        return
    if scale.runtime is not None and (settings.disabled or found.inference_only):
        # nothing is scaled: the value no longer matters
        scale.runtime = None
        scale.notes = [note for note in scale.notes if note[2] is not _RUNTIME_NOTE]
    if "cast_model_outputs" in bound and syntax.literal(bound["cast_model_outputs"].value) is not None:
        ctx.report(
            "AMP005",
            bound["cast_model_outputs"],
            "cast_model_outputs has no autocast equivalent: cast the model outputs with .to(dtype) by hand",
        )
        return
    handed_off = _handed_off(ctx, found)
    if handed_off is not None:
        # its callers set up the GradScaler where it returns (project mode, ``migrate.factories``)
        ctx.consumed.add(use.base)
        if handed_off:
            ctx.report(
                "AMP011",
                use.call,
                f"amp.initialize was removed: its callers set up mixed precision where it returns; {handed_off} "
                "call it without an optimizer (inference), whose forward pass Apex O1 ran in float16: it now runs "
                'in float32 (wrap it in `with torch.autocast("cuda", dtype=torch.float16):` for float16 speed)',
            )
        _drop_call(ctx, found)
        return
    if found.inference_only:
        cast = float16_by_hand(ctx, use.call)
        level = syntax.literal(bound["opt_level"].value) if "opt_level" in bound else "O1"
        if cast is not None and level != "O0":
            # the use is not consumed: the setup stays as it was
            ctx.report("AMP005", use.call, _inference_cast_message(ctx, bound, level, cast))
            return
        ctx.consumed.add(use.base)
        for note in scale.notes:
            ctx.report(*note)
        ctx.report("AMP011", use.call, _inference_message(ctx, bound) or _beside_training_message(ctx, model, use))
        _drop_call(ctx, found)
        return
    unproven = _unproven_cast(ctx, found) if settings.level in ("O2", "O3") else None
    if unproven is not None:
        fed = ctx.position(unproven.forward)[0]
        ctx.report(
            "AMP005",
            use.call,
            f"amp.initialize at opt_level {settings.level} left as it was: line {ctx.position(unproven.call)[0]} casts "
            f"to float16 by hand (`{ctx.code(unproven.call)}`) what line {fed} hands to `{unproven.model}`, matching the "
            "float16 weights Apex gave the model; the migration keeps the model in float32, and the tool cannot "
            "prove that this value reaches only that call, under this call's `enabled=` flag, nor that the model "
            "there is always this one: remove the cast where it only feeds this model, then run ampmigrate again",
        )
        return
    half_copy = _float16_model_copy(ctx, found) if settings.level != "O0" else None
    if half_copy is not None:
        copied = ctx.code(half_copy.func.value)  # type: ignore[attr-defined]
        ctx.report(
            "AMP005",
            use.call,
            f"amp.initialize left as it was: line {ctx.position(half_copy)[0]} makes `{copied}`, a copy of the model "
            f"this call sets up, float16 by hand (`{ctx.code(half_copy)}`), and Apex O1 cast the float32 inputs of its "
            "convolutions and linear layers to float16 in every op of the process, so that copy ran on float32 "
            "input; without Apex it meets float32 input outside autocast (`Input type (float) and weight type "
            f'(half)`): run its forward under `with torch.autocast("{ctx.options.device}", dtype=torch.float16):` '
            "or give it float16 input, then run ampmigrate again",
        )
        return
    reached = None
    if settings.level in ("O2", "O3"):
        reached = _unproven_feed(ctx, found, settings.level) or _halved_by_hand(
            ctx, found.call, frozenset(_model_names(found)), f"amp.initialize at opt_level {settings.level}", o1=False
        )
    elif settings.level == "O1" and not settings.disabled:
        reached = _o1_hand_cast(ctx, found)
    elif settings.level is None and settings.level_expression is not None:
        # O2/O3 among the levels chosen at run time
        spelled = " ".join(syntax.code(settings.level_expression).split())
        reached = _unproven_feed(
            ctx, found, f"`{spelled}` (chosen at run time: O1, O2 or O3)", runtime=True
        ) or _halved_by_hand(
            ctx,
            found.call,
            frozenset(_model_names(found)),
            f"amp.initialize at opt_level `{spelled}` (chosen at run time)",
        )
    if reached is not None:
        ctx.report("AMP005", use.call, reached)
        return
    home = _home(ctx, model, use.call, settings)
    if home is None:
        return
    switches = _per_call_switches(ctx, home, settings.enabled_parts[: settings.guard_parts])
    if switches:
        method = home[0].name.value  # type: ignore[union-attr]
        ctx.report(
            "AMP010",
            use.call,
            f"the `if` around this call reads {', '.join(f'`{name}`' for name in switches)}, a parameter of "
            f"`{method}`: called with it true (training) and false (evaluation), the method ran amp.initialize on the "
            "first call only, and Apex's set-up stayed for the others, while a GradScaler kept on `self` and made "
            "above that `if` would be made again on every call, disabled (float32, no autocast, its scale lost) "
            'where it is false: create the GradScaler once (`self.scaler = torch.amp.GradScaler("cuda", '
            "enabled=...)` in `__init__` or where training starts), then run ampmigrate again",
        )
        return
    if scale.runtime is not None:
        scale.o3 = settings.level == "O3"
        blocked = _runtime_scale_blocked(ctx, model, found, settings, home)
        if blocked is not None:
            _report_runtime_blocked(ctx, found, scale, blocked)
            return
    if _set_by_factory(ctx, found, settings, home):
        why = _factory_blocked(model, settings, scale)
        if why is not None:
            where = ctx.position(use.call)[0]
            ctx.report(
                "AMP022",
                use.call,
                f"amp.initialize left as it was: its function is a factory that switches amp on at run time, and "
                f"the code that needs its GradScaler is elsewhere in the file, but {why} (line {where})",
            )
            return
    ctx.consumed.add(use.base)
    for note in scale.notes:
        ctx.report(*note)
    _report_numerics(ctx, found, settings)
    function, klass = home
    if klass is not None:
        attributes = {scaler.name for scaler in model.scalers if scaler.klass is klass}
        if settings.outermost is not found.statement and _reinitializes(ctx, model, found, function, klass):
            # a second set-up in another method (again before loading a checkpoint): Apex's
            # state changed only where that call ran; made above its guards, the new scaler
            # would replace the first one, disabled, on every path where they fail
            settings = replace(settings, outermost=found.statement, shared_above=False)
        preferred = ctx.options.scaler_name
        name = preferred if preferred in attributes else ctx.fresh_name(preferred)
    else:
        same_scope = [s for s in model.scalers if s.function is function and s.klass is None]
        if same_scope:
            _join_local_scaler(ctx, found, settings, scale, same_scope)
            return
        name = ctx.fresh_name(ctx.options.scaler_name)
    written = _scale_written_after(ctx, found, settings, scale)
    if written is not None:
        # `amp._amp_state.loss_scalers[0]._loss_scale = X` right after the call: Apex started there
        line, value = written
        model.scale_writes[line] = value
        scale.initial = value
        if scale.static is not None:
            scale.static = value
    _create_scaler(ctx, model, found, settings, scale, home, name)


def _handed_off(ctx: ModuleContext, found: SetupCall) -> str | None:
    """Where the call is in a top-level function whose callers take its amp setup over: the
    callers out of the run that use it for inference ("" for none); else None."""
    function = ctx.function_of(found.call)
    if function is None or not any(statement is function for statement in ctx.module.body):
        return None
    return dict(ctx.options.facts.hands_off).get(function.name.value)


def _set_by_factory(
    ctx: ModuleContext, found: SetupCall, settings: _Settings, home: tuple[cst.FunctionDef | None, cst.ClassDef | None]
) -> bool:
    """Whether the scaler is a module-level name that the function holding ``amp.initialize``
    sets, switched on by conditions only that function can evaluate (``if args.fp16:`` in a
    factory whose caller runs the loop elsewhere). A disabled scaler stands at module level
    until the factory runs, as Apex's amp did nothing before amp.initialize."""
    return home == (None, None) and ctx.function_of(found.call) is not None and bool(settings.enabled_parts)


def _factory_blocked(model: AmpModel, settings: _Settings, scale: _LossScale) -> str | None:
    """Why a factory-set scaler (``_set_by_factory``) cannot stand for this call; None if it can."""
    if model.scalers:
        return "another amp.initialize of the file already has a GradScaler"
    if settings.disabled or scale.off:
        return "autocast would not follow the GradScaler's switch (`scaler.is_enabled()`)"
    if scale.runtime is not None:
        return "its loss scale is chosen at run time"
    return None


def _reinitializes(
    ctx: ModuleContext,
    model: AmpModel,
    found: SetupCall,
    function: cst.FunctionDef | None,
    klass: cst.ClassDef,
) -> bool:
    """Whether ``found`` is in a method other than ``__init__`` of a class with an ``__init__``
    (which makes its scaler, or gets a disabled default), and another of its methods also calls
    amp.initialize under fewer conditions: the class already has a scaler, maybe enabled, on
    paths where this call does not run (under the same conditions, a scaler made above them is
    the same disabled one there)."""
    if (
        function is None
        or function.name.value == "__init__"
        or not any(isinstance(node, cst.FunctionDef) and node.name.value == "__init__" for node in klass.body.body)
    ):
        return False
    mine = {syntax.normalized(condition) for condition in _guards(ctx, found.statement)[0]}
    for use in model.of("initialize"):
        other = ctx.function_of(use.call)
        if use.call is not found.call and other is not None and other is not function:
            if ctx.class_of_method(other) is klass:
                theirs = {syntax.normalized(condition) for condition in _guards(ctx, ctx.statement_of(use.call))[0]}
                if mine - theirs:
                    return True
    return False


def _runtime_scale_blocked(
    ctx: ModuleContext,
    model: AmpModel,
    found: SetupCall,
    settings: _Settings,
    home: tuple[cst.FunctionDef | None, cst.ClassDef | None],
) -> str | None:
    """Why a run-time loss_scale cannot be held next to this scaler; None when it can.

    The held scale is a plain local name, so every ``scaler.update`` must sit where the
    scaler itself is created (same function, or both at module level).
    """
    function, klass = home
    if klass is not None or (function is None and ctx.function_of(found.call) is not None):
        return "the GradScaler is shared beyond this function, where the held scale cannot follow it"
    same_scope = [s for s in model.scalers if s.function is function and s.klass is None]
    if same_scope and not settings.in_branch:
        return "another amp.initialize already set up this function's GradScaler"
    return None


def _report_runtime_blocked(ctx: ModuleContext, found: SetupCall, scale: _LossScale, why: str) -> None:
    """AMP005 with the code that holds the scale by hand; the setup stays as it was."""
    expression = syntax.strip_parens(found.bound["loss_scale"].value)
    value = syntax.code(expression)
    if "\n" in value:
        value = " ".join(value.split())  # a message is one line
    named = ""
    if not isinstance(expression, (cst.Name, cst.Attribute)):
        # an expression is named once, so that the advice neither repeats nor regroups it
        named, value = f"`apex_loss_scale = {value}`, ", "apex_loss_scale"
    ctx.report(
        "AMP005",
        found.bound["loss_scale"],
        f"loss_scale is computed at run time and {why}: amp.initialize left as it was. By hand: {named}"
        f'`static_loss_scale = float({value}) if {value} not in (None, "dynamic") else None`, '
        '`scaler = torch.amp.GradScaler("cuda", init_scale=static_loss_scale or 2.0**16)` and '
        "`scaler.update(new_scale=static_loss_scale)` after each step",
    )


def _unfit_for_a_carrier(scaler: Scaler, loss_scale: str | None) -> str | None:
    """Why the GradScaler of ``scaler`` cannot be stored where the amp module was, for readers that
    only scale, step and update through it (``args.amp``); None when it can."""
    if scaler.static_scale is not None or scaler.held_scale is not None:
        spelled = f" (`loss_scale={loss_scale}`)" if loss_scale else ""
        return (
            f"its loss scale{spelled} is fixed or known only at run time, and the scale to hold after each "
            "`scaler.update()` cannot follow the GradScaler to the code that reads it through the attribute"
        )
    if scaler.autocast_enabled is not None:
        return "autocast is not on exactly where that GradScaler is enabled"
    return None


def plan(ctx: ModuleContext) -> None:
    model = ctx.amp
    for use in model.of("initialize"):
        _plan_one(ctx, model, use)
    setups = model.of("initialize")
    if setups and all(use.base in ctx.consumed for use in setups):
        # every setup migrates: the models stay float32, and inputs cast to match Apex's
        # float16 weights would meet float32 ones
        for cast in _droppable_casts(ctx):
            hand_casts.plan_drop(ctx, cast)
    found_scales: dict[int, str] = {}
    for use in model.of("initialize"):
        bound = _arguments(use.call)
        if bound is not None and "loss_scale" in bound:
            found_scales[id(use.call)] = syntax.code(bound["loss_scale"].value)
    if ctx.carriers.any:
        # `self.amp = amp` now stores the scaler that amp.initialize became
        ctx.carriers.plan_stores({s.initialize: s.name for s in model.scalers if s.klass and s.initialize})
        # `args.amp = amp` stores the scaler for the functions that read it there (in any module)
        ctx.carriers.plan_plain_stores(
            [
                (
                    s.initialize,
                    s.function,
                    s.name,
                    _unfit_for_a_carrier(s, found_scales.get(id(s.initialize))),
                )
                for s in model.scalers
                if s.initialize is not None and s.klass is None
            ]
        )
