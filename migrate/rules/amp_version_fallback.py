"""amp_version_fallback: the Apex branch of a torch version test beside a native one.

What it rewrites
    Projects that moved to native AMP while torch 1.5 was still around kept Apex as the
    fallback of a version test: ``if LooseVersion(torch.__version__) >= LooseVersion("1.6.0"):
    scaler = torch.cuda.amp.GradScaler()`` and, in the ``else:``, ``from apex import amp``,
    ``amp.initialize(...)``, ``amp.register_float_function(...)`` and a checkpoint load given
    ``amp=amp``. On every torch the migrated code can run on (2.3 and newer) the test is true:
    the Apex branch never runs. The test goes and its native branch takes its place; the Apex
    branch goes with it, and so does the import of the version class (``LooseVersion``) where
    only the test used it. Where a function's ``amp`` (``amp, scaler = None, None`` before the
    test) thus only ever holds None, the module's own functions it is passed to lose their
    Apex code for it: ``if amp is not None: ...`` goes (its ``else:`` stays in its place), and
    ``if scaler is not None: scaler.scale(loss).backward() else: with amp.scale_loss(...)``
    keeps its first branch (with ``scaler`` None both raise the same AttributeError before
    doing anything).

Before::

    from distutils.version import LooseVersion

    import torch


    def train_one_epoch(model, optimizer, loader, amp, scaler):
        for x, y in loader:
            with torch.autocast("cuda", enabled=scaler is not None):
                loss = model(x, y)
            if scaler is not None:
                scaler.scale(loss).backward()
            else:
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
            scaler.step(optimizer)
            scaler.update()


    def main(model, optimizer, loader):
        amp, scaler = None, None
        if LooseVersion(torch.__version__) >= LooseVersion("1.6.0"):
            scaler = torch.amp.GradScaler("cuda")
        else:
            from apex import amp

            model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        train_one_epoch(model, optimizer, loader, amp, scaler)

After::

    import torch


    def train_one_epoch(model, optimizer, loader, amp, scaler):
        for x, y in loader:
            with torch.autocast("cuda", enabled=scaler is not None):
                loss = model(x, y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()


    def main(model, optimizer, loader):
        amp, scaler = None, None
        scaler = torch.amp.GradScaler("cuda")
        train_one_epoch(model, optimizer, loader, amp, scaler)

Not rewritten (left as it was)
    A test other than a plain comparison of ``torch.__version__`` (through ``LooseVersion``,
    ``StrictVersion``, ``packaging.version.parse``/``Version`` or ``pkg_resources.parse_version``)
    with a version older than 2.3; an ``elif`` on either side; a native branch in the ``else:``
    (``if torch < 1.6: <Apex> else: <native>``): the Apex branch and the setup stay as the other
    rules leave them (the amp module passed on: AMP030, AMP025). A function's code for an ``amp``
    stays (and runs, with None, as it ran) where the name may hold something else: a binding of it
    other than ``= None`` outside the Apex branch, a call in the project that gives the parameter
    anything but None or such a name, the function used as a value or imported under another
    name, a method called through its class, or the name used in another shape than the two above.

Safety
    Exact on torch 2.3 and newer, which the migrated code needs anyway: the deleted branch never
    ran there, and the names it bound held there what they hold now (a project file that cannot
    be read or parsed keeps every parameter's code). Whatever the Apex branch did differently
    (its opt level, ``amp.register_float_function``, a checkpoint's ``amp`` entry) the project had
    already given up on every torch since 1.6: its native branch is kept as the project wrote it.
    The one difference: an Apex name the branch imported and code after it used (``DDP``) raised
    NameError there; apex_parallel now rewrites that use.

References
    hirofumi0810/neural_sp: neural_sp/bin/asr/train.py and neural_sp/bin/lm/train.py (the
    "Mixed precision training setting"); espnet/espnet PR #1779.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass, field

import libcst as cst

from migrate import pytree, version_fallbacks
from migrate.rules import _syntax as syntax
from migrate.rules._bindings import bound_name
from migrate.rules._context import ModuleContext, dotted_name
from migrate.rules._setup import amp_references
from migrate.rules.amp_import import drop_aliases

RULE = "amp_version_fallback"


@dataclass
class _Fold:
    """The edits that drop a function's code for a name that only ever holds None."""

    keep_first: list[cst.If] = field(default_factory=list)  # `if S is not None: S... else: amp...`
    drop: list[cst.If] = field(default_factory=list)  # `if amp is not None: ...` with no else
    take_else: list[cst.If] = field(default_factory=list)  # `if amp is not None: ... else: ...`

    @property
    def any(self) -> bool:
        return bool(self.keep_first or self.drop or self.take_else)


def _tree(ctx: ModuleContext) -> ast.Module | None:
    if "__version__" not in ctx.source and not ctx.options.facts.none_only:  # (None or empty: nothing to fold)
        return None
    return pytree.parse(ctx.source)  # the engine's tree (it checked the syntax), not a second parse


def _fallbacks(ctx: ModuleContext, tree: ast.Module) -> list[cst.If]:
    """The ``if`` of each fallback (``version_fallbacks.fallbacks``) in this module."""
    where = {(f.choice.lineno, f.choice.col_offset + 1) for f in version_fallbacks.fallbacks(tree)}
    found = []
    for call in ctx.nodes_of(cst.Call):  # the `LooseVersion(torch.__version__)` of each test
        comparison = ctx.parent(call)
        choice = ctx.parent(comparison) if isinstance(comparison, cst.Comparison) else None
        if isinstance(choice, cst.If) and choice.test is comparison and ctx.position(choice) in where:
            if isinstance(choice.orelse, cst.Else) and not ctx.skipped(choice) and choice not in found:
                found.append(choice)
    return found


def _none_only(ctx: ModuleContext, tree: ast.Module) -> set[tuple[str, str]]:
    """The project's word on the names that only ever hold None here; without a project plan, this
    module's own: its functions that no other module of the run imports (not its methods, which
    code anywhere may call on an instance)."""
    if ctx.options.facts.none_only is not None:
        return set(ctx.options.facts.none_only)
    exported = ctx.options.facts.exported
    return {
        (owner, name)
        for owner, name in version_fallbacks.none_only({"": tree}, lambda word: [("", tree)]).get("", set())
        if "." not in owner and owner not in exported and "*" not in exported
    }


def _function(ctx: ModuleContext, owner: str) -> cst.FunctionDef | None:
    """The module-level function ``f`` or method ``C.f`` named ``owner``."""
    *klass, name = owner.split(".")
    body: list[cst.CSTNode] = list(ctx.module.body)
    if klass:
        classes = [s for s in body if isinstance(s, cst.ClassDef) and s.name.value == klass[0]]
        if len(classes) != 1 or not isinstance(classes[0].body, cst.IndentedBlock):
            return None
        body = list(classes[0].body.body)
    functions = [s for s in body if isinstance(s, cst.FunctionDef) and s.name.value == name]
    return functions[0] if len(functions) == 1 else None


def _inside(ctx: ModuleContext, node: cst.CSTNode, regions: Sequence[cst.CSTNode]) -> bool:
    return any(ancestor in regions for ancestor in ctx.ancestors(node))


def _is_none(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Name) and node.value == "None"


def _presence_test(test: cst.BaseExpression, name: str) -> bool:
    """``amp`` or ``amp is not None``."""
    if isinstance(test, cst.Name):
        return test.value == name
    return (
        isinstance(test, cst.Comparison)
        and isinstance(test.left, cst.Name)
        and test.left.value == name
        and len(test.comparisons) == 1
        and isinstance(test.comparisons[0].operator, cst.IsNot)
        and _is_none(test.comparisons[0].comparator)
    )


def _fold(ctx: ModuleContext, function: cst.FunctionDef, name: str, dead: list[cst.CSTNode]) -> _Fold | None:
    """How ``function`` drops its code for ``name`` (None where some use of it has another shape)."""
    fold = _Fold()
    uses = [
        node
        for node in ctx.walk(function.body, into_definitions=False)
        if isinstance(node, cst.Name) and node.value == name and not _inside(ctx, node, dead)
    ]
    for node in uses:  # the presence tests first: the code under them goes, whatever it does
        parent = ctx.parent(node)
        branch = ctx.parent(parent) if isinstance(parent, cst.Comparison) else parent
        if isinstance(branch, cst.If) and _presence_test(branch.test, name):
            if isinstance(ctx.parent(branch), cst.If) or isinstance(branch.orelse, cst.If):
                return None  # an `elif` chain
            (fold.take_else if branch.orelse is not None else fold.drop).append(branch)
    gone = [branch.body for branch in (*fold.drop, *fold.take_else)]
    for node in uses:
        parent = ctx.parent(node)
        if _inside(ctx, node, gone) or any(
            node is branch.test or parent is branch.test for branch in (*fold.drop, *fold.take_else)
        ):
            continue
        if isinstance(parent, cst.Attribute) and parent.attr is node:
            continue
        if isinstance(parent, (cst.Arg, cst.AssignTarget, cst.Element)):
            continue  # passed on (None, as it came), a parameter's keyword, or set to None
        choice = _scaled_in_else(ctx, node)
        if choice is None:
            return None
        fold.keep_first.append(choice)
    return fold


def _scaled_in_else(ctx: ModuleContext, node: cst.Name) -> cst.If | None:
    """``if S is not None: S.f(...)... else: with amp.scale_loss(...) as x: ...``: the ``if``."""
    attribute = ctx.parent(node)
    call = ctx.parent(attribute) if isinstance(attribute, cst.Attribute) else None
    item = ctx.parent(call) if isinstance(call, cst.Call) and call.func is attribute else None
    with_ = ctx.parent(item) if isinstance(item, cst.WithItem) else None
    if not (isinstance(with_, cst.With) and with_.items[0] is item):
        return None
    block = ctx.parent(with_)
    orelse = ctx.parent(block) if isinstance(block, cst.IndentedBlock) else None
    choice = ctx.parent(orelse) if isinstance(orelse, cst.Else) else None
    if not (isinstance(choice, cst.If) and isinstance(block, cst.IndentedBlock) and block.body[0] is with_):
        return None
    test = choice.test
    if not (
        isinstance(test, cst.Comparison)
        and isinstance(test.left, cst.Name)
        and len(test.comparisons) == 1
        and isinstance(test.comparisons[0].operator, cst.IsNot)
        and _is_none(test.comparisons[0].comparator)
    ):
        return None
    first = choice.body.body[0] if isinstance(choice.body, cst.IndentedBlock) else None
    small = syntax.sole_statement(first) if first is not None else None
    # its first step reads an attribute of the scaler: with the scaler None, it raises as the else did
    if not (isinstance(small, cst.Expr) and _starts_with_attribute_of(small.value, test.left.value)):
        return None
    return choice


def _starts_with_attribute_of(node: cst.BaseExpression, name: str) -> bool:
    """``name.f(...)`` or ``name.f(...).g(...)``: the first thing evaluated is ``name.f``."""
    while True:
        if isinstance(node, cst.Call):
            node = node.func
        elif isinstance(node, cst.Attribute):
            if isinstance(node.value, cst.Name):
                return node.value.value == name
            node = node.value
        else:
            return False


def _without_else(updated: cst.CSTNode) -> cst.CSTNode:
    assert isinstance(updated, cst.If)
    return updated.with_changes(orelse=None)


def _drop_fallback(ctx: ModuleContext, choice: cst.If) -> None:
    """The native branch in the test's place; the Apex ``else:`` (its comments too) goes, and no
    other rule sees the amp names it binds (they never held Apex's module on the torch now needed)."""
    dead = choice.orelse
    assert isinstance(dead, cst.Else)
    ctx.plan.unwrap.add(choice)
    ctx.plan.replace[choice] = _without_else
    ctx.dropped.append(dead)
    gone = {
        reference
        for reference in amp_references(ctx)
        if _inside(ctx, reference, [dead])
        or (
            (binding := ctx.resolve(reference.value, reference)) is not None and _inside(ctx, binding.statement, [dead])
        )
    }
    ctx.consumed.update(gone)
    ctx.hide(dead)  # nor does any other rule see the rest of it (an Apex DDP in it)
    model = ctx.amp
    model.calls[:] = [use for use in model.calls if use.base not in gone]
    model.value_uses[:] = [name for name in model.value_uses if name not in gone]
    model.private_uses[:] = [use for use in model.private_uses if use.value not in gone]
    model.other_attributes[:] = [use for use in model.other_attributes if use.value not in gone]
    ctx.report(
        "AMP034",
        choice,
        f"`if {' '.join(syntax.code(choice.test).split())}:` is true on every torch the migrated code needs (2.3 "
        "and newer): its native branch takes its place, and the Apex branch in its `else:`, which never runs "
        "there, goes",
    )


def _apply(ctx: ModuleContext, fold: _Fold) -> None:
    for choice in fold.keep_first:
        ctx.plan.unwrap.add(choice)
        ctx.plan.replace[choice] = _without_else
        ctx.dropped.append(choice.orelse)  # type: ignore[arg-type]
    for branch in fold.drop:
        ctx.plan.remove.add(branch)
        ctx.plan.forget_comments.add(branch)
        ctx.dropped.append(branch.body)
    for branch in fold.take_else:
        ctx.plan.replace_statement[branch] = list(branch.orelse.body.body)  # type: ignore[union-attr, arg-type]
        ctx.dropped.append(branch.body)


# the modules whose version classes the tests compare with, and those classes
_VERSION_MODULES = frozenset({"distutils.version", "packaging.version", "pkg_resources"})


def _drop_version_imports(ctx: ModuleContext, tests: list[cst.BaseExpression]) -> None:
    """A ``from distutils.version import LooseVersion`` (or packaging's, pkg_resources') that
    only the dropped tests used goes with them."""
    if not tests:
        return
    for statement in ctx.nodes_of(cst.ImportFrom):
        if statement.module is None or dotted_name(statement.module) not in _VERSION_MODULES:
            continue
        if isinstance(statement.names, cst.ImportStar) or ctx.function_of(statement) is not None:
            continue
        unused = set()
        for alias in statement.names:
            local = bound_name(alias)
            uses = [
                name for name in ctx.nodes_of(cst.Name) if name.value == local and not _inside(ctx, name, [statement])
            ]
            if uses and all(_inside(ctx, name, tests) for name in uses):
                unused.add(alias)
        if unused:
            drop_aliases(ctx, statement, unused)


def plan(ctx: ModuleContext) -> None:
    tree = _tree(ctx)
    if tree is None:
        return
    choices = _fallbacks(ctx, tree)
    for choice in choices:
        _drop_fallback(ctx, choice)
    _drop_version_imports(ctx, [choice.test for choice in choices])
    dead: list[cst.CSTNode] = [choice.orelse for choice in choices if choice.orelse is not None]
    for owner, name in sorted(_none_only(ctx, tree)):
        function = _function(ctx, owner)
        fold = _fold(ctx, function, name, dead) if function is not None else None
        if fold is None or not fold.any:
            continue  # its code for the name stays, and runs as it ran: with None
        _apply(ctx, fold)
        lines = ", ".join(str(ctx.position(node)[0]) for node in (*fold.keep_first, *fold.drop, *fold.take_else))
        ctx.report(
            "AMP035",
            function.name,  # type: ignore[union-attr]
            f"`{name}` only ever holds None in `{owner}` once the Apex branch of a torch version test goes (every "
            f"call in the project gives it None, or a name that holds only None): its code for `{name}` goes "
            f"(line {lines})",
        )
    if choices and all(reference in ctx.consumed for reference in amp_references(ctx)):
        ctx.amp_folded_away = True
