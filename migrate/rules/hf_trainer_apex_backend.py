"""hf_trainer_apex_backend: the Apex backend of a vendored Hugging Face ``Trainer``.

What it rewrites
    Research repositories vendor transformers' ``trainer.py`` (the 4.0-4.5 era). Its
    ``__init__`` picks an fp16 backend: the "amp" branch sets ``self.use_amp = True`` and
    makes a GradScaler, the Apex branch checks that Apex is installed and sets
    ``self.use_apex = True``; every Apex call then sits under a ``self.use_apex`` test
    beside its native twin (``if self.use_amp: self.scaler.scale(loss).backward()`` /
    ``elif self.use_apex: with amp.scale_loss(...)``). The Apex backend becomes the native
    one: the backend choice keeps only its native branch, and since nothing sets
    ``self.use_apex`` to True any more, every test of it is folded to False
    (``if self.use_apex and training: amp.initialize(...)`` goes, an ``elif self.use_apex:``
    branch goes, ``X if self.use_apex else Y`` becomes ``Y``). ``self.use_apex = False``
    stays, so code that reads the flag still works.

Before::

    import torch
    from apex import amp


    class Trainer:
        def __init__(self, args):
            self.use_apex = False
            self.use_amp = False
            if args.fp16:
                if args.fp16_backend == "amp":
                    self.use_amp = True
                    self.scaler = torch.cuda.amp.GradScaler()
                else:
                    self.use_apex = True

        def training_step(self, model, inputs):
            if self.use_amp:
                with torch.cuda.amp.autocast():
                    loss = model(inputs)
            else:
                loss = model(inputs)
            if self.use_amp:
                self.scaler.scale(loss).backward()
            elif self.use_apex:
                with amp.scale_loss(loss, self.optimizer) as scaled_loss:
                    scaled_loss.backward()
            else:
                loss.backward()
            if self.use_amp:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()

After::

    import torch


    class Trainer:
        def __init__(self, args):
            self.use_apex = False
            self.use_amp = False
            if args.fp16:
                self.use_amp = True
                self.scaler = torch.amp.GradScaler("cuda")

        def training_step(self, model, inputs):
            if self.use_amp:
                with torch.autocast("cuda", dtype=torch.float16):
                    loss = model(inputs)
            else:
                loss = model(inputs)
            if self.use_amp:
                self.scaler.scale(loss).backward()
            else:
                loss.backward()
            if self.use_amp:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()

Not rewritten (left as it was; AMP032 names what blocks it)
    ``self.use_apex`` set True more than once, or outside the plain ``else`` of a backend
    choice whose ``if`` sets the native flag and creates a GradScaler (or with other code in
    that ``else`` than an "is Apex installed?" check); an Apex amp use that is not under a
    ``self.use_apex`` test; an ``elif self.use_apex:`` scaled backward with no sibling
    ``if self.<native flag>:`` branch that scales with the GradScaler; a module that never
    steps (``scaler.step`` / ``scaler.update``) or unscales before the clip with it.

Safety
    The native backend as transformers ran it: the opt level (``--fp16_opt_level``) is
    ignored, as the "amp" backend always ignored it (autocast in place of O1's patched
    functions or O2's fp16 model with fp32 master weights), and evaluation and prediction
    run under autocast where the Apex backend (whose ``amp.initialize`` ran only when
    training) evaluated an evaluation-only run in float32. An Apex checkpoint has no loss
    scale to restore: the GradScaler starts afresh. A subclass in another module that sets
    ``self.use_apex = True`` itself would lose its Apex calls: none is known to do so.

References
    huggingface/transformers v4.5: src/transformers/trainer.py (``Trainer.__init__``'s
    "Mixed precision setup", ``_wrap_model``, ``training_step``, the clip in ``train``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from migrate.rules import _syntax as syntax
from migrate.rules._bindings import dotted_name
from migrate.rules._context import ModuleContext
from migrate.rules._setup import amp_references

RULE = "hf_trainer_apex_backend"

_FLAG = "use_apex"


def _flag_attributes(ctx: ModuleContext) -> list[cst.Attribute]:
    """Every ``<name>.use_apex`` in the module."""
    found = []
    for name in ctx.nodes_of(cst.Name):
        parent = ctx.parent(name)
        if name.value == _FLAG and isinstance(parent, cst.Attribute) and parent.attr is name:
            found.append(parent)
    return found


def _is_self_attribute(ctx: ModuleContext, node: cst.CSTNode, attr: str | None = None) -> bool:
    """``self.<attr>`` where ``self`` is the first parameter of the method it is in."""
    if not (isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name)):
        return False
    if attr is not None and node.attr.value != attr:
        return False
    function = ctx.function_of(node)
    return (
        function is not None
        and ctx.class_of_method(function) is not None
        and (ctx.self_name(function) == node.value.value)
    )


def _self_assignment(ctx: ModuleContext, statement: cst.CSTNode) -> tuple[str, cst.BaseExpression] | None:
    """(attr, value) for a line ``self.<attr> = value``."""
    small = syntax.sole_statement(statement)
    if isinstance(small, cst.Assign) and len(small.targets) == 1:
        target = small.targets[0].target
        if _is_self_attribute(ctx, target):
            assert isinstance(target, cst.Attribute)
            return target.attr.value, small.value
    return None


def _calls(node: cst.CSTNode) -> bool:
    return any(isinstance(n, cst.Call) for n in syntax.descendants(node)) or isinstance(node, cst.Call)


def _presence_check(statement: cst.CSTNode) -> bool:
    """``if not is_apex_available(): raise ImportError(...)``: the Apex branch's own check (its body
    ends in the raise)."""
    if not (isinstance(statement, cst.If) and statement.orelse is None):
        return False
    test = statement.test
    if not (isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not)):
        return False
    if not (isinstance(test.expression, cst.Call) and "apex" in syntax.code(test.expression.func).lower()):
        return False
    body = statement.body  # it may build its message first: it runs only to raise
    return isinstance(body, cst.IndentedBlock) and isinstance(syntax.sole_statement(body.body[-1]), cst.Raise)


@dataclass
class _Backend:
    """The backend choice: ``choice`` (``if <native>: ... else: <Apex>``) and what its native branch sets."""

    choice: cst.If
    switch: cst.CSTNode  # the line ``self.use_apex = True``
    flag: str  # the native flag (``use_amp``)
    scaler: str  # the GradScaler's attribute (``scaler``)


@dataclass
class _Folds:
    """The tests of ``self.use_apex`` folded to False, by kind."""

    removed: list[cst.If] = field(default_factory=list)  # `if self.use_apex ...:` with no else
    promoted: list[cst.If] = field(default_factory=list)  # `if self.use_apex: ... elif ...`: the elif stays
    elifs: list[cst.If] = field(default_factory=list)  # `elif self.use_apex ...:`
    expressions: list[cst.IfExp] = field(default_factory=list)  # `X if self.use_apex else Y`

    def regions(self) -> list[cst.CSTNode]:
        """The code that no longer runs."""
        return [
            *(node.body for node in (*self.removed, *self.promoted, *self.elifs)),
            *(e.body for e in self.expressions),
        ]


def _backend(ctx: ModuleContext, switch: cst.CSTNode) -> _Backend | str:
    """The backend choice around ``switch`` (``self.use_apex = True``), or why it is not one."""
    block = ctx.parent(switch)
    orelse = ctx.parent(block) if isinstance(block, cst.IndentedBlock) else None
    choice = ctx.parent(orelse) if isinstance(orelse, cst.Else) else None
    if (
        not isinstance(choice, cst.If)
        or choice.orelse is not orelse
        or not isinstance(ctx.parent(choice), cst.IndentedBlock)
    ):
        return "`self.use_apex = True` is not in the plain `else:` of an `if` that chooses the native backend"
    assert isinstance(block, cst.IndentedBlock)
    if _calls(choice.test):
        return f"the backend test `{syntax.code(choice.test)}` calls code, which folding the choice would drop"
    if any(statement is not switch and not _presence_check(statement) for statement in block.body):
        return "the Apex branch of the backend choice does more than check that Apex is installed"
    flags = []
    scalers = []
    for statement in choice.body.body:
        assigned = _self_assignment(ctx, statement)
        if assigned is None:
            continue
        attr, value = assigned
        if isinstance(value, cst.Name) and value.value == "True":
            flags.append(attr)
        elif "GradScaler(" in syntax.code(value):
            scalers.append(attr)
    if len(flags) != 1 or len(scalers) != 1:
        return (
            f"the native branch of `if {syntax.code(choice.test)}:` does not set one flag of its own to True and "
            "one GradScaler on self"
        )
    return _Backend(choice, switch, flags[0], scalers[0])


def _test_of(ctx: ModuleContext, flag: cst.Attribute) -> cst.If | cst.IfExp | None:
    """The ``if`` / ``elif`` / conditional expression whose test is ``self.use_apex`` (or
    ``self.use_apex and ...``, which is False without running the rest)."""
    node: cst.CSTNode = flag
    parent = ctx.parent(node)
    if isinstance(parent, cst.BooleanOperation) and isinstance(parent.operator, cst.And) and parent.left is node:
        node, parent = parent, ctx.parent(parent)
    if isinstance(parent, (cst.If, cst.IfExp)) and parent.test is node:
        return parent
    return None


def _is_elif(ctx: ModuleContext, branch: cst.If) -> bool:
    parent = ctx.parent(branch)
    return isinstance(parent, cst.If) and parent.orelse is branch


def _native_sibling(ctx: ModuleContext, branch: cst.If, backend: _Backend) -> bool:
    """An earlier branch of the chain, ``if self.<flag>:``, that scales the backward with the GradScaler."""
    node: cst.CSTNode = branch
    while _is_elif(ctx, node):  # type: ignore[arg-type]
        node = ctx.parent(node)  # type: ignore[assignment]
        assert isinstance(node, cst.If)
        if _is_self_attribute(ctx, node.test, backend.flag):
            body = syntax.code(node.body)
            return f".{backend.scaler}.scale(" in body and ".backward(" in body
    return False


def _fold(ctx: ModuleContext, backend: _Backend, folds: _Folds) -> str | None:
    """Sort every test of ``self.use_apex`` into ``folds``; why they cannot be folded, if so."""
    klass = ctx.class_of_method(ctx.function_of(backend.switch))  # type: ignore[arg-type]
    for flag in _flag_attributes(ctx):
        line = ctx.position(flag)[0]
        if not _is_self_attribute(ctx, flag) or ctx.class_of_method(ctx.function_of(flag)) is not klass:  # type: ignore[arg-type]
            return f"`{syntax.code(flag)}` at line {line} is not the flag of the class that chooses the backend"
        statement = ctx.statement_of(flag)
        if statement is backend.switch:
            continue
        assigned = _self_assignment(ctx, statement)
        if assigned is not None and assigned[0] == _FLAG:
            value = assigned[1]
            if isinstance(value, cst.Name) and value.value == "False":
                continue
            return f"`self.use_apex` is set to `{syntax.code(value)}` at line {line}, beside the backend choice"
        test = _test_of(ctx, flag)
        if isinstance(test, cst.IfExp):
            folds.expressions.append(test)
        elif isinstance(test, cst.If) and _is_elif(ctx, test):
            folds.elifs.append(test)
        elif isinstance(test, cst.If) and test.orelse is None:
            folds.removed.append(test)
        elif isinstance(test, cst.If) and isinstance(test.orelse, cst.If):
            folds.promoted.append(test)
        elif isinstance(test, cst.If):
            return f"`if {syntax.code(test.test)}:` at line {line} has an `else:`"
        # any other read (a log line, `not self.use_apex`) keeps working: the flag stays False
    return None


def _inside(ctx: ModuleContext, node: cst.CSTNode, regions: list[cst.CSTNode]) -> bool:
    ancestors = set(map(id, ctx.ancestors(node)))
    return any(id(region) in ancestors for region in regions)


def _checks(ctx: ModuleContext, backend: _Backend, folds: _Folds) -> str | None:
    """Why folding the tests away would lose something Apex did, if it would."""
    regions = folds.regions()
    for name in amp_references(ctx):
        if not _inside(ctx, name, regions):
            line = ctx.position(name)[0]
            return f"the Apex amp use at line {line} is not under a `self.use_apex` test"
    scaled = ctx.amp.of("scale_loss")
    for use in scaled:
        branch = next(
            (b for b in (*folds.removed, *folds.promoted, *folds.elifs) if _inside(ctx, use.call, [b.body])), None
        )
        if branch is None or not _is_elif(ctx, branch) or not _native_sibling(ctx, branch, backend):
            line = ctx.position(use.call)[0]
            return (
                f"the amp.scale_loss at line {line} has no sibling `if self.{backend.flag}:` branch before it that "
                f"scales the backward with `self.{backend.scaler}`"
            )
    for branch in folds.elifs:
        above = ctx.parent(branch)
        if branch.orelse is None and any(above is other for other in (*folds.elifs, *folds.promoted)):
            return f"`self.use_apex` is tested twice in a row at line {ctx.position(branch)[0]}"
    if scaled and not _autocasts_under(ctx, backend.flag):
        return (
            f"the native backend never runs the forward pass under autocast (`if self.{backend.flag}: with "
            'torch.autocast("cuda"): ...`), where the Apex backend\'s amp.initialize cast it to float16'
        )
    code = ctx.module.code
    if scaled and not (f".{backend.scaler}.step(" in code and f".{backend.scaler}.update(" in code):
        return f"the module never steps the optimizer with `self.{backend.scaler}` (step and update)"
    for use in ctx.amp.of("master_params"):
        function = ctx.function_of(use.call)
        if function is None or f".{backend.scaler}.unscale_(" not in syntax.code(function):
            line = ctx.position(use.call)[0]
            return (
                f"the clip of amp.master_params at line {line} has no `self.{backend.scaler}.unscale_(...)` before it"
            )
    return None


def _autocasts_under(ctx: ModuleContext, flag: str) -> bool:
    """Whether an autocast (``autocast()``, ``torch.autocast(...)``, ``torch.cuda.amp.autocast()``)
    is made under a test of ``self.<flag>``, or switched by it (``enabled=self.<flag>``): the
    native backend's mixed-precision forward pass."""
    for call in ctx.nodes_of(cst.Call):
        name = dotted_name(call.func) or ""
        if name.rpartition(".")[2] != "autocast":
            continue
        switched = [arg.value for arg in call.args if arg.keyword is not None and arg.keyword.value == "enabled"]
        if any(_is_self_attribute(ctx, node, flag) for value in switched for node in ctx.walk(value)):
            return True  # `with torch.autocast("cuda", enabled=self.use_amp):`
        for ancestor in ctx.ancestors(call):
            test = ancestor.test if isinstance(ancestor, (cst.If, cst.IfExp)) else None
            if test is not None and any(
                _is_self_attribute(ctx, node, flag) for node in ctx.walk(test) if isinstance(node, cst.Attribute)
            ):
                return True
    return False


def _import_guards(ctx: ModuleContext) -> list[cst.If]:
    """``if is_apex_available(): from apex import amp`` at module level: the guard goes with its import
    (unless another module imports ``amp`` from this one)."""
    exported = ctx.options.facts.exported
    guards = []
    for bindings in ctx.imports.get(ctx.module, {}).values():
        for binding in bindings:
            line = ctx.statement_of(binding.statement)
            block = ctx.parent(line)
            guard = ctx.parent(block) if isinstance(block, cst.IndentedBlock) else None
            if binding.kind != "amp" or not isinstance(guard, cst.If) or guard.orelse is not None:
                continue
            if not isinstance(ctx.parent(guard), cst.Module) or len(block.body) != 1:  # type: ignore[union-attr]
                continue
            test = guard.test
            if not (isinstance(test, cst.Call) and not test.args and "apex" in syntax.code(test.func).lower()):
                continue
            statement = binding.statement
            if isinstance(statement.names, cst.ImportStar) or len(statement.names) != 1:
                continue
            local = binding.alias.evaluated_alias or binding.alias.evaluated_name
            if local not in exported and "*" not in exported:
                guards.append(guard)
    return guards


def _drop_elif(updated: cst.CSTNode) -> cst.CSTNode:
    assert isinstance(updated, cst.If) and updated.orelse is not None
    return updated.orelse


def _drop_last_elif(updated: cst.CSTNode) -> cst.CSTNode:
    assert isinstance(updated, cst.If)
    return updated.with_changes(orelse=None)


def _promote_elif(updated: cst.CSTNode) -> cst.CSTNode:
    assert isinstance(updated, cst.If) and isinstance(updated.orelse, cst.If)
    return updated.orelse.with_changes(leading_lines=updated.leading_lines)


def _take_orelse(updated: cst.CSTNode) -> cst.CSTNode:
    assert isinstance(updated, cst.IfExp)
    return updated.orelse


def plan(ctx: ModuleContext) -> None:
    flags = _flag_attributes(ctx)
    switches = [
        ctx.statement_of(flag)
        for flag in flags
        if (assigned := _self_assignment(ctx, ctx.statement_of(flag))) is not None
        and assigned[0] == _FLAG
        and isinstance(assigned[1], cst.Name)
        and assigned[1].value == "True"
    ]
    if not switches or not list(amp_references(ctx)):
        return  # no Apex backend here (a subclass reads a flag its base class sets): nothing of ours
    if any(ctx.skipped(switch) for switch in switches):
        return
    folds = _Folds()
    backend: _Backend | str = (
        _backend(ctx, switches[0]) if len(switches) == 1 else "`self.use_apex` is set to True more than once"
    )
    why = backend if isinstance(backend, str) else _fold(ctx, backend, folds) or _checks(ctx, backend, folds)
    if why is not None:
        known = len(ctx.findings)
        ctx.report(
            "AMP032",
            switches[0],
            f"this Trainer's Apex backend stays as it was: {why}. Its native twin: in the Apex branch of the backend "
            "choice, do what the native branch does (set its flag and create the GradScaler), then drop the code "
            "under `self.use_apex` tests (amp.initialize, the scale_loss branch, amp.master_params in the clip)",
        )
        ctx.explains_leftovers.extend(ctx.findings[known:])  # moot where the other rules migrate it all
        return
    assert isinstance(backend, _Backend)
    ctx.plan.unwrap.add(backend.choice)  # the native branch in the choice's place
    for branch in folds.removed:
        ctx.plan.remove.add(branch)
        ctx.plan.forget_comments.add(branch)
    for branch in folds.promoted:
        ctx.plan.replace[branch] = _promote_elif
    for branch in folds.elifs:
        if branch.orelse is not None:
            ctx.plan.replace[branch] = _drop_elif
        else:  # the last branch of its chain: the `if` above it loses its `elif`
            ctx.plan.replace[ctx.parent(branch)] = _drop_last_elif  # type: ignore[index]
    for expression in folds.expressions:
        ctx.plan.replace[expression] = _take_orelse
    ctx.plan.remove.update(_import_guards(ctx))
    ctx.consumed.update(amp_references(ctx))
    ctx.amp_folded_away = True
    ctx.report(
        "AMP001",
        backend.switch,
        f"the Trainer's Apex backend became its native one (`self.{backend.flag} = True` and "
        f"`self.{backend.scaler}`, a GradScaler, as the native branch sets them); every `self.use_apex` test "
        "is folded to False, the flag stays False for the code that reads it. The opt level is ignored, as the "
        "native backend always ignored it (autocast in place of O1's patched functions or O2's fp16 model), "
        "evaluation now runs under autocast (the Apex backend evaluated an evaluation-only run in float32), "
        "and an Apex checkpoint's loss scale is not restored",
    )
