"""A scaler kept on an object that another class holds: ``self.GAN.scaler``.

lucidrains/stylegan2-pytorch builds its models, optimizers and ``amp.initialize`` in
``StyleGAN2.__init__`` and trains them from a ``Trainer`` that keeps the model object in
``self.GAN = StyleGAN2(...)``: the trainer's steps, checkpoints and backward helper reach
the GradScaler that ``StyleGAN2`` keeps on ``self`` as ``self.GAN.scaler``.

That is exact only where ``self.GAN`` surely holds such an object when the code runs, so a
holder is recognised in one shape only: in the holder class's methods, on their own
``self``, every store of the attribute (anywhere in the module, of any object) is
``self.<attr> = K(...)`` or ``self.<attr> = None`` (``del`` too), where K is the one
module-level class of that name; and each place that reaches the scaler through it is
preceded, on every path, by code that reads ``self.<attr>.<something>`` (which would fail
just the same where the attribute holds None), or is in such a statement itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from migrate.rules._bindings import binding_names

if TYPE_CHECKING:  # _amp builds on this module
    from migrate.rules._context import ModuleContext

# nodes whose parts do not always run: the code in them may not run before what follows
_MAYBE_SKIPPED = (cst.Lambda, cst.FunctionDef, cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)
# stores of an attribute beside the `x.attr = value` shape the holder allows
_TARGET_PARTS = (cst.Tuple, cst.List, cst.Element, cst.StarredElement)


def holders(ctx: ModuleContext, klass: cst.ClassDef) -> dict[cst.ClassDef, str]:
    """The classes of this module (other than ``klass``) that keep an instance of ``klass`` in
    one attribute of ``self``, each with that attribute's name."""
    if not isinstance(ctx.parent(klass), cst.Module) or not _names_one_class(ctx, klass):
        return {}
    candidates: dict[cst.ClassDef, set[str]] = {}
    for call in ctx.nodes_of(cst.Call):
        assign = ctx.parent(call)
        if not _builds(call, klass) or not isinstance(assign, cst.Assign) or assign.value is not call:
            continue
        store = _self_store(ctx, assign)
        if store is None:
            continue
        holder, attribute = store
        if holder is not klass:
            candidates.setdefault(holder, set()).add(attribute)
    found: dict[cst.ClassDef, str] = {}
    for holder, attributes in candidates.items():
        if len(attributes) == 1 and _only_holds(ctx, holder, next(iter(attributes)), klass):
            found[holder] = next(iter(attributes))
    return found


def held_before(ctx: ModuleContext, owner: str, attribute: str, at: cst.CSTNode) -> bool:
    """Whether ``<owner>.<attribute>.<something>`` is read, on every path, before ``at`` runs (or
    in the statement of ``at`` itself) in the function around ``at``: where the attribute holds
    None, that read fails as reaching the scaler through it would."""
    function = ctx.function_of(at)
    if function is None:
        return False
    here = ctx.statement_of(at)
    blocks_at = {id(a) for a in ctx.ancestors(at) if isinstance(a, (cst.IndentedBlock, cst.SimpleStatementSuite))}
    for node in ctx.walk(function.body, into_definitions=False):
        if not (
            isinstance(node, cst.Attribute)
            and node.attr.value == attribute
            and isinstance(node.value, cst.Name)
            and node.value.value == owner
            and isinstance(ctx.parent(node), cst.Attribute)
        ):
            continue
        statement = ctx.statement_of(node)
        if statement is not here and ctx.position(node) >= ctx.position(at):
            continue
        if _always_runs(ctx, node, function, blocks_at):
            return True
    return False


def _always_runs(ctx: ModuleContext, node: cst.CSTNode, function: cst.FunctionDef, blocks_at: set[int]) -> bool:
    """Whether ``node`` runs whenever code in the blocks ``blocks_at`` does: every block around it
    is around that code too, and no part of its statement may skip it."""
    child: cst.CSTNode = node
    for ancestor in ctx.ancestors(node):
        if ancestor is function:
            return True
        if isinstance(ancestor, (cst.IndentedBlock, cst.SimpleStatementSuite)) and id(ancestor) not in blocks_at:
            return False
        if isinstance(ancestor, _MAYBE_SKIPPED):
            return False
        if isinstance(ancestor, cst.BooleanOperation) and child is ancestor.right:
            return False
        if isinstance(ancestor, cst.IfExp) and child is not ancestor.test:
            return False
        child = ancestor
    return False


def _names_one_class(ctx: ModuleContext, klass: cst.ClassDef) -> bool:
    """Whether the class's name means that class everywhere: nothing else in the module binds it."""
    return all(name is klass.name for name in binding_names(ctx, klass.name.value))


def _builds(value: cst.BaseExpression, klass: cst.ClassDef) -> bool:
    return isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value == klass.name.value


def _self_store(ctx: ModuleContext, assign: cst.Assign) -> tuple[cst.ClassDef, str] | None:
    """(class, attribute) for ``self.<attribute> = value`` in a method of that class, on its own ``self``."""
    if len(assign.targets) != 1:
        return None
    target = assign.targets[0].target
    if not (isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name)):
        return None
    method = ctx.function_of(assign)
    if method is None or any(
        isinstance(d.decorator, cst.Name) and d.decorator.value in ("staticmethod", "classmethod")
        for d in method.decorators
    ):
        return None
    holder = ctx.class_of_method(method)
    if holder is None or ctx.self_name(method) != target.value.value:
        return None
    return holder, target.attr.value


def _only_holds(ctx: ModuleContext, holder: cst.ClassDef, attribute: str, klass: cst.ClassDef) -> bool:
    """Whether every store of ``<anything>.<attribute>`` in the module puts a new ``klass`` or None
    in a ``holder``'s own attribute (``setattr`` naming it in a string: no holder then)."""
    if any(
        isinstance(call.func, cst.Name)
        and call.func.value == "setattr"
        and any(isinstance(arg.value, cst.SimpleString) and arg.value.raw_value == attribute for arg in call.args)
        for call in ctx.nodes_of(cst.Call)
    ):
        return False
    for name in ctx.nodes_of(cst.Name):
        node = ctx.parent(name)
        if name.value != attribute or not isinstance(node, cst.Attribute) or node.attr is not name:
            continue
        parent = ctx.parent(node)
        while isinstance(parent, _TARGET_PARTS):
            parent = ctx.parent(parent)
        if isinstance(parent, cst.AssignTarget):
            assign = ctx.parent(parent)
            if not (
                isinstance(assign, cst.Assign)
                and assign.targets[0].target is node
                and _self_store(ctx, assign) == (holder, attribute)
                and (
                    _builds(assign.value, klass)
                    or (isinstance(assign.value, cst.Name) and assign.value.value == "None")
                )
            ):
                return False
        elif isinstance(parent, (cst.AugAssign, cst.AnnAssign, cst.For, cst.CompFor, cst.AsName, cst.NamedExpr)):
            if getattr(parent, "target", getattr(parent, "name", None)) is not None and _in_target(ctx, node, parent):
                return False
    return True


def _in_target(ctx: ModuleContext, node: cst.CSTNode, statement: cst.CSTNode) -> bool:
    """Whether ``node`` is in the part of ``statement`` that is stored to."""
    target = getattr(statement, "target", None) or getattr(statement, "name", None)
    return target is not None and any(a is target for a in (node, *ctx.ancestors(node)))
