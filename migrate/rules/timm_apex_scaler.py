"""timm_apex_scaler: timm's ``ApexScaler`` and the ``amp.initialize`` that goes with it.

What it rewrites
    timm's ``train.py``, copied into many research repositories, trains with Apex amp or with
    native AMP. Its Apex branch calls ``amp.initialize`` (O1) and makes ``ApexScaler()``,
    which runs ``amp.scale_loss``, the clip and ``optimizer.step()`` inside timm. Its native
    branch already holds the torch.amp twins: the autocast factory the loop enters around the
    forward pass and the loss (``with amp_autocast():``, ``suppress`` when AMP is off), and
    ``timm.utils.NativeScaler``, the same call on a GradScaler. So the Apex branch becomes
    the native one: the initialize gives way to an autocast factory, and ``ApexScaler()``
    becomes ``NativeScaler()``.

Before::

    from contextlib import suppress

    import torch
    from apex import amp
    from timm.utils import ApexScaler, NativeScaler


    def main(model, optimizer, use_amp):
        amp_autocast = suppress
        loss_scaler = None
        if use_amp == "apex":
            model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
            loss_scaler = ApexScaler()
        elif use_amp == "native":
            amp_autocast = torch.cuda.amp.autocast
            loss_scaler = NativeScaler()
        return model, optimizer, amp_autocast, loss_scaler

After::

    import functools
    from contextlib import suppress

    import torch
    from timm.utils import NativeScaler


    def main(model, optimizer, use_amp):
        amp_autocast = suppress
        loss_scaler = None
        if use_amp == "apex":
            amp_autocast = functools.partial(torch.autocast, "cuda", dtype=torch.float16)
            loss_scaler = NativeScaler()
        elif use_amp == "native":
            amp_autocast = torch.cuda.amp.autocast
            loss_scaler = NativeScaler()
        return model, optimizer, amp_autocast, loss_scaler

timm's validate.py runs the Apex choice as ``if args.apex_amp: model = amp.initialize(model,
opt_level="O1")`` on the model alone, after the chain that sets the factory for the native
choice (``elif args.apex_amp:`` only logs). That clause sets the factory too, and the
initialize goes::

    amp_autocast = suppress                         amp_autocast = suppress
    if args.native_amp:                             if args.native_amp:
        amp_autocast = torch.cuda.amp.autocast          amp_autocast = torch.cuda.amp.autocast
    elif args.apex_amp:                             elif args.apex_amp:
        _logger.info("Validating with APEX AMP.")       amp_autocast = functools.partial(torch.autocast, ...)
    model = model.cuda()                                _logger.info("Validating with APEX AMP.")
    if args.apex_amp:                               model = model.cuda()
        model = amp.initialize(model, opt_level="O1")

Newer timm names the choice: ``use_amp = "apex"`` in ``if args.amp_impl == "apex":``, then
``if use_amp == "apex": model = amp.initialize(...)``; that clause sets the factory, where no
other assignment of ``use_amp`` runs after it (those before the chain, or in its ``else``).

Only where the flag is a name or attribute the function does not set again after the chain,
and the factory is not entered before the initialize (where Apex did not cast yet); otherwise
amp_initialize's inference path takes the call (AMP011).

Not rewritten (the setup stays as it was, AMP025)
    An opt_level other than a literal "O1", or other initialize arguments (O2 and O3 cast the
    model itself); no factory assigned ``suppress`` before the branch and an autocast in
    another branch; ``NativeScaler`` not imported from timm.utils; a clip of ``parameters``
    that leaves the head out (``exclude_head``: ApexScaler clipped every parameter of the
    optimizer, NativeScaler clips the ``parameters`` it is given).

Safety
    Apex O1 cast the forward pass wherever it ran; the factory casts the code the script
    enters it around, the forward pass and the loss (and validation, as O1 did). NativeScaler
    clips the ``parameters`` it is given where ApexScaler clipped the optimizer's: the same
    tensors unless the optimizer holds only part of the model's trainable parameters. Its
    checkpoint entry is "amp_scaler" (ApexScaler's was "amp"): resuming from an Apex
    checkpoint starts the loss scale afresh.

References
    huggingface/pytorch-image-models: timm/utils/cuda.py (ApexScaler, NativeScaler), train.py,
    validate.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from migrate.rules import _syntax as syntax
from migrate.rules._amp import AmpCall
from migrate.rules._bindings import bound_name, imported_name, rebound
from migrate.rules._context import ModuleContext, dotted_name
from migrate.rules.amp_import import drop_aliases

RULE = "timm_apex_scaler"

_TIMM_UTILS = frozenset({"timm.utils", "timm.utils.cuda"})


def _is_o1(level: cst.Arg) -> bool:
    """``opt_level="O1"``."""
    return level.keyword is not None and level.keyword.value == "opt_level" and syntax.literal(level.value) == "O1"


def _initialize_of_o1(ctx: ModuleContext, call: cst.Call) -> cst.SimpleStatementLine | None:
    """The line ``model, optimizer = amp.initialize(model, optimizer, opt_level="O1")``."""
    line = ctx.statement_of(call)
    target = syntax.target_of(line, call)
    if not isinstance(target, (cst.Tuple, cst.List)) or len(call.args) != 3:
        return None
    positional = [arg.value for arg in call.args[:2] if arg.keyword is None and not arg.star]
    names = [element.value for element in target.elements]
    if len(positional) != 2 or len(names) != 2:
        return None
    if [syntax.code(n) for n in names] != [syntax.code(p) for p in positional]:
        return None  # the model and optimizer are handed back under the names they came in
    if not all(isinstance(p, (cst.Name, cst.Attribute)) for p in positional):
        return None
    level = call.args[2]
    if not _is_o1(level):
        return None
    assert isinstance(line, cst.SimpleStatementLine)
    return line


def _autocast_factory(ctx: ModuleContext, block: cst.IndentedBlock, suppress: str) -> str | None:
    """The name the function sets to ``suppress`` before ``block`` and to an autocast in
    another branch: the factory the training loop enters around its forward pass."""
    function = ctx.function_of(block)
    if function is None:
        return None
    candidates = []
    node: cst.CSTNode | None = block
    while node is not None and node is not function:
        parent = ctx.parent(node)
        if isinstance(parent, cst.IndentedBlock):
            statements = list(parent.body)
            for statement in statements[: statements.index(node)]:  # type: ignore[arg-type]
                assigned = syntax.name_assignment(statement)
                if assigned is not None and isinstance(assigned[1], cst.Name) and assigned[1].value == suppress:
                    candidates.append(assigned[0])
        node = parent
    set_in_branch = {
        assigned[0] for statement in block.body if (assigned := syntax.name_assignment(statement)) is not None
    }
    assignments = [
        assigned
        for statement in ctx.walk(function, into_definitions=False)
        if (assigned := syntax.name_assignment(statement)) is not None
    ]
    for name in candidates:
        if name not in set_in_branch and any(
            target == name and "autocast" in syntax.code(value) for target, value in assignments
        ):
            return name
    return None


def _leaves_head_out(ctx: ModuleContext) -> bool:
    """Parameters chosen without the head (``exclude_head=...``, timm's AGC mode) anywhere in the
    module: given to the scaler directly or through a name (``clip_params = ...``), NativeScaler
    would clip those where ApexScaler clipped every parameter of the optimizer."""
    return any(
        arg.keyword is not None and arg.keyword.value == "exclude_head"
        for call in ctx.nodes_of(cst.Call)
        for arg in call.args
    )


def _native_autocast(ctx: ModuleContext) -> str:
    """``functools.partial(torch.autocast, ...)`` as this module spells ``partial``, importing
    functools where no name is in its way; a lambda where ``functools`` names something else
    (or is imported only inside a function), which the loop's ``amp_autocast()`` calls alike."""
    arguments = f'"{ctx.options.device}", dtype=torch.{ctx.options.dtype}'
    found = imported_name(ctx, frozenset({"functools"}), "partial")
    if found is not None:
        return f"{found[0]}(torch.autocast, {arguments})"
    imported = any(
        dotted_name(alias.name) == "functools" and alias.asname is None and ctx.function_of(statement) is None
        for statement in ctx.nodes_of(cst.Import)
        for alias in statement.names
    )
    if imported and not rebound(ctx, "functools"):
        return f"functools.partial(torch.autocast, {arguments})"
    if "functools" not in ctx.all_names():
        ctx.plan.imports.add("functools")
        return f"functools.partial(torch.autocast, {arguments})"
    return f"lambda: torch.autocast({arguments})"


def _utils_module(ctx: ModuleContext) -> str | None:
    """The name timm.utils is bound to: ``from timm import utils`` or ``import timm.utils as utils``."""
    found = imported_name(ctx, frozenset({"timm"}), "utils")
    if found is not None:
        return found[0]
    names = [
        bound_name(alias)
        for node in ctx.walk(ctx.module, into_definitions=False)
        if isinstance(node, cst.Import)
        for alias in node.names
        if dotted_name(alias.name) == "timm.utils" and alias.asname is not None
    ]
    return names[0] if len(names) == 1 and not rebound(ctx, names[0]) else None


@dataclass(frozen=True)
class _Recipe:
    """What the Apex branch becomes: ``line`` (the initialize) sets ``factory``, and
    ``made`` (``ApexScaler()``) calls ``native`` instead."""

    line: cst.SimpleStatementLine
    factory: str
    made: cst.Call
    native: str


def _recipe(ctx: ModuleContext, use: AmpCall, made: list[cst.Call], utils: str | None) -> _Recipe | str:
    """The native recipe for ``use`` (an amp.initialize), or why there is none (``utils``: the
    name of ``from timm import utils`` where the scalers are reached as ``utils.ApexScaler``)."""
    imported = imported_name(ctx, _TIMM_UTILS, "NativeScaler")
    native = f"{utils}.NativeScaler" if utils is not None else imported[0] if imported is not None else None
    suppress = imported_name(ctx, frozenset({"contextlib"}), "suppress")
    line = _initialize_of_o1(ctx, use.call)
    if line is None:
        return (
            'the amp.initialize is not `model, optimizer = amp.initialize(model, optimizer, opt_level="O1")` '
            "(O2 and O3 cast the model itself, which the native branch does not)"
        )
    block = ctx.parent(line)
    later = list(block.body)[list(block.body).index(line) + 1 :] if isinstance(block, cst.IndentedBlock) else []
    made_here = [call for call in made if ctx.statement_of(call) in later and not call.args]
    if len(made_here) != 1 or len(made) != 1:
        return "ApexScaler() is not made once, right after the amp.initialize in the same branch"
    if native is None:
        return "NativeScaler is not imported from timm.utils"
    factory = (
        _autocast_factory(ctx, block, suppress[0])
        if suppress is not None and isinstance(block, cst.IndentedBlock)
        else None
    )
    if factory is None:
        return (
            "no autocast factory was found (a name set to contextlib's suppress before this branch and to an "
            "autocast in another, entered around the forward pass: `with amp_autocast():`)"
        )
    if _leaves_head_out(ctx):
        return (
            "the scaler is given `parameters` without the head (exclude_head, timm's AGC mode): NativeScaler clips "
            "those, ApexScaler clipped every parameter of the optimizer, head included, and the call that passes them "
            "serves the native choice too, which cannot tell the two apart there (to clip what Apex clipped on its "
            'path alone, hand the choice to that call and write `exclude_head="agc" in args.clip_mode and '
            'use_amp != "apex"`)'
        )
    assert isinstance(line, cst.SimpleStatementLine)
    return _Recipe(line, factory, made_here[0], native)


def _inference_initialize(ctx: ModuleContext, call: cst.Call) -> cst.If | None:
    """The ``if <flag>: model = amp.initialize(model, opt_level="O1")`` statement around ``call``
    (timm's validate.py: the model alone, handed back under its own name, nothing else in the
    ``if``)."""
    line = ctx.statement_of(call)
    target = syntax.target_of(line, call)
    if target is None:
        return None
    if len(call.args) != 2 or call.args[0].keyword is not None or call.args[0].star:
        return None
    model, level = call.args
    if not isinstance(model.value, (cst.Name, cst.Attribute)):
        return None
    if syntax.code(target) != syntax.code(model.value):
        return None
    if not _is_o1(level):
        return None
    block = ctx.parent(line)
    statement = ctx.parent(block) if isinstance(block, cst.IndentedBlock) else None
    if not isinstance(statement, cst.If) or statement.orelse is not None or len(block.body) != 1:  # type: ignore[union-attr]
        return None
    if not isinstance(statement.test, (cst.Name, cst.Attribute)) and _choice_test(statement.test) is None:
        return None
    return statement


def _choice_test(test: cst.BaseExpression) -> tuple[str, str] | None:
    """``use_amp == "apex"`` as ("use_amp", "apex"): newer timm's validate.py names its choice."""
    if not (
        isinstance(test, cst.Comparison)
        and len(test.comparisons) == 1
        and isinstance(test.comparisons[0].operator, cst.Equal)
        and isinstance(test.left, cst.Name)
        and isinstance(test.comparisons[0].comparator, cst.SimpleString)
    ):
        return None
    return test.left.value, test.comparisons[0].comparator.evaluated_value  # type: ignore[return-value]


def _choice_clause(ctx: ModuleContext, function: cst.FunctionDef, guard: cst.If) -> cst.If | None:
    """For ``if use_amp == "apex":`` around the initialize: the ``if`` of the earlier chain whose
    body sets ``use_amp = "apex"``, where no other assignment of ``use_amp`` runs after it (the
    others come before that chain or in the ``else`` of that ``if``)."""
    choice = _choice_test(guard.test)
    if choice is None:
        return None
    flag, value = choice
    assignments = [
        node
        for node in ctx.walk(function, into_definitions=False)
        if isinstance(node, (cst.Assign, cst.AugAssign, cst.AnnAssign, cst.For, cst.CompFor))
        and any(
            isinstance(target, cst.Name) and target.value == flag
            for target in (
                [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]  # type: ignore[union-attr]
            )
        )
    ]
    chosen = [
        node
        for node in assignments
        if isinstance(node, cst.Assign)
        and isinstance(node.value, cst.SimpleString)
        and node.value.evaluated_value == value
    ]
    if len(chosen) != 1:
        return None
    line = ctx.statement_of(chosen[0])
    block = ctx.parent(line)
    clause = ctx.parent(block) if isinstance(block, cst.IndentedBlock) else None
    if not isinstance(clause, cst.If) or clause.body is not block or ctx.position(clause)[0] > ctx.position(guard)[0]:
        return None
    for node in assignments:
        if node is chosen[0] or ctx.position(node)[0] < ctx.position(clause)[0]:
            continue
        exclusive = clause.orelse is not None and any(ancestor is clause.orelse for ancestor in ctx.ancestors(node))
        if not exclusive:
            return None
    return clause


def _flag_set_after(ctx: ModuleContext, function: cst.FunctionDef, flag: str, line: int) -> bool:
    """Whether ``function`` assigns ``flag`` (a name or attribute, as code) at or after ``line``."""
    for node in ctx.walk(function, into_definitions=False):
        targets: list[cst.BaseExpression] = []
        if isinstance(node, cst.Assign):
            targets = [target.target for target in node.targets]
        elif isinstance(node, (cst.AugAssign, cst.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, (cst.For, cst.CompFor)):
            targets = [node.target]
        if any(syntax.code(target) == flag for target in targets) and ctx.position(node)[0] >= line:
            return True
    return False


def _inference_recipe(ctx: ModuleContext, use: AmpCall) -> tuple[cst.If, cst.If, str] | None:
    """For timm's validate.py: the ``if <flag>:`` around ``model = amp.initialize(model,
    opt_level="O1")``, the clause of the earlier chain that tests the same flag (and logs the
    Apex choice), and the autocast factory another clause of that chain sets. None where the
    shape is not this one, the flag is set again after that chain, or the factory is entered
    before the initialize (where Apex did not cast yet): amp_initialize's inference path
    takes the call then."""
    guard = _inference_initialize(ctx, use.call)
    function = ctx.function_of(use.call)
    suppress = imported_name(ctx, frozenset({"contextlib"}), "suppress")
    if guard is None or function is None or suppress is None:
        return None
    flag = syntax.code(guard.test)
    start = ctx.position(guard)[0]
    if _choice_test(guard.test) is not None:
        chosen = _choice_clause(ctx, function, guard)
        if chosen is None or not isinstance(chosen.body, cst.IndentedBlock):
            return None
        clause = chosen
    else:
        clauses = [
            node
            for node in ctx.walk(function, into_definitions=False)
            if isinstance(node, cst.If) and node is not guard and syntax.code(node.test) == flag
        ]
        if len(clauses) != 1 or ctx.position(clauses[0])[0] > start:
            return None
        clause = clauses[0]
        if _flag_set_after(ctx, function, flag, ctx.position(clause)[0]):
            return None
    if not isinstance(clause.body, cst.IndentedBlock):
        return None
    factory = _autocast_factory(ctx, clause.body, suppress[0])
    if factory is None:
        return None
    for name in ctx.walk(function, into_definitions=False):
        if isinstance(name, cst.Name) and name.value == factory and ctx.position(name)[0] < start:
            statement = ctx.statement_of(name)
            if syntax.name_assignment(statement) is None or ctx.position(statement)[0] != ctx.position(name)[0]:
                return None
    return guard, clause, factory


def _plan_inference(ctx: ModuleContext) -> None:
    """timm's validate.py: ``if args.apex_amp: model = amp.initialize(model, opt_level="O1")``
    beside the chain that sets the autocast factory for the native choice. The Apex clause of
    that chain sets the factory too, and the initialize goes."""
    calls = ctx.amp.calls
    if len(calls) != 1 or calls[0].api != "initialize" or ctx.skipped(calls[0].call):
        return
    use = calls[0]
    recipe = _inference_recipe(ctx, use)
    if recipe is None:
        return
    guard, clause, factory = recipe
    assert isinstance(clause.body, cst.IndentedBlock)
    ctx.plan.before[clause.body.body[0]].append(cst.parse_statement(f"{factory} = {_native_autocast(ctx)}\n"))
    ctx.plan.remove.add(guard)
    ctx.plan.needs_torch_import = True
    ctx.consumed.add(use.base)
    ctx.report(
        "AMP041",
        use.call,
        f"amp.initialize (O1) for inference became timm's native recipe: where `{syntax.code(clause.test)}` "
        f"holds, `{factory}` enters torch.autocast around the forward pass, as the native choice does",
    )


def plan(ctx: ModuleContext) -> None:
    _plan_inference(ctx)
    apex_scaler = imported_name(ctx, _TIMM_UTILS, "ApexScaler")
    module = _utils_module(ctx) if apex_scaler is None else None
    if apex_scaler is not None:
        spelled = apex_scaler[0]
    elif module is not None:
        spelled = f"{module}.ApexScaler"  # `from timm import utils`, `utils.ApexScaler()`
    else:
        return
    made = [call for call in ctx.nodes_of(cst.Call) if dotted_name(call.func) == spelled]
    calls = ctx.amp.calls
    if not made or not calls:
        return
    use = calls[0]
    if ctx.skipped(use.call):
        return
    if len(calls) != 1 or use.api != "initialize":
        recipe: _Recipe | str = "this module calls Apex amp beside the amp.initialize"
    else:
        recipe = _recipe(ctx, use, made, module)
    if isinstance(recipe, str):
        ctx.unfinished.extend(made)  # the setup stays as it was (AMP025)
        ctx.report(
            "AMP032",
            made[0],
            f"timm's ApexScaler runs amp.scale_loss inside timm, so it stays with its amp setup: {recipe}. Its "
            "native twin: in place of the amp.initialize, set the autocast factory the loop enters, "
            f'`amp_autocast = functools.partial(torch.autocast, "{ctx.options.device}", '
            f"dtype=torch.{ctx.options.dtype})`, and write `NativeScaler()` for `ApexScaler()`",
        )
        return
    autocast = _native_autocast(ctx)
    ctx.plan.replace_statement[recipe.line] = [cst.parse_statement(f"{recipe.factory} = {autocast}\n")]
    ctx.plan.substitute(recipe.made.func, cst.parse_expression(recipe.native))
    ctx.plan.needs_torch_import = True
    ctx.consumed.add(use.base)
    if apex_scaler is not None and sum(name.value == spelled for name in ctx.nodes_of(cst.Name)) == 2:
        statement = apex_scaler[1]  # only the import and the call named it: the import goes
        assert not isinstance(statement.names, cst.ImportStar)
        drop_aliases(ctx, statement, {alias for alias in statement.names if bound_name(alias) == spelled})
    ctx.report(
        "AMP041",
        use.call,
        f"amp.initialize (O1) with timm's ApexScaler became timm's native recipe: `{recipe.factory}` enters "
        "torch.autocast around the forward pass and loss, and NativeScaler scales the loss with a GradScaler "
        "(it clips the `parameters` it is given; its checkpoint entry is 'amp_scaler', so an Apex checkpoint's "
        "loss scale is not restored)",
    )
