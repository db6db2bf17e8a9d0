"""Finding the forward pass that feeds a loss, so that it can run under autocast.

Starting from the statement that uses the loss, walk backwards through the statements
that assign the names the loss depends on, climbing out of ``if``/``with``/``try``
blocks but never out of the loop iteration or the function. The walk stops at a
previous backward or optimizer step (the end of the previous phase). The forward pass
is the earliest statement on that chain that calls one of the models passed to
``amp.initialize`` (or, failing that, anything that computes); the span to wrap runs
from there to the last statement of the chain in the same block (compound statements
that compute the loss, such as an ``if``/``else`` choosing the loss, included).
"""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from migrate.rules import _syntax as syntax
from migrate.rules._bindings import dotted_name
from migrate.rules._context import ModuleContext

# calls that move or reshape data rather than compute a forward pass
_DATA_METHODS = frozenset(
    "cuda to half float double bfloat16 cpu contiguous detach view reshape long int bool "
    "squeeze unsqueeze permute transpose flatten items keys values get size numel item "
    "clone pin_memory type expand repeat fill_ zero_ split chunk append extend".split()
)
_DATA_FUNCTIONS = frozenset(
    "tuple list dict set len zip enumerate range next iter isinstance int float str print "
    "getattr hasattr min max sorted map filter".split()
)
_BOUNDARY_METHODS = frozenset({"backward", "step"})
_AUTOCAST_NAMES = frozenset(
    {"torch.autocast", "torch.amp.autocast", "autocast", "torch.cuda.amp.autocast", "amp.autocast"}
)
_TRANSPARENT = (cst.If, cst.Else, cst.With, cst.Try, cst.ExceptHandler, cst.Finally)


def _references(ctx: ModuleContext, node: cst.CSTNode) -> set[str]:
    """Dotted names read in ``node`` (maximal ``a.b.c`` chains and plain names)."""
    found: set[str] = set()
    inner: set[int] = set()
    for current in ctx.walk(node, into_definitions=False):
        if isinstance(current, cst.Attribute):
            inner.add(id(current.attr))
            name = dotted_name(current)
            if name is not None:
                found.add(name)
                base = current.value
                while isinstance(base, cst.Attribute):
                    inner.add(id(base))
                    base = base.value
                inner.add(id(base))
        elif isinstance(current, cst.Name) and id(current) not in inner:
            found.add(current.value)
    return found


def _targets(ctx: ModuleContext, node: cst.CSTNode) -> set[str]:
    """Dotted names (re)bound or updated anywhere in ``node``; also an object called for its
    effect alone (``self.D_cl(images, accumulate=True)``, its result dropped): it keeps what the
    call computed, for a later ``loss = self.D_cl.calculate_loss()`` (lucidrains'
    stylegan2-pytorch contrastive regularizer), and Apex O1 ran that call in float16 too."""
    bound: set[str] = set()

    def add(target: cst.BaseExpression) -> None:
        if isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                add(element.value)
        elif isinstance(target, cst.StarredElement):
            add(target.value)
        elif isinstance(target, cst.Subscript):
            add(target.value)
        else:
            name = dotted_name(target)
            if name is not None:
                bound.add(name)

    for current in ctx.walk(node, into_definitions=False):
        if isinstance(current, cst.AssignTarget):
            add(current.target)
        elif isinstance(current, (cst.AugAssign, cst.AnnAssign)):
            add(current.target)
        elif isinstance(current, cst.NamedExpr):
            add(current.target)
        elif isinstance(current, cst.For):
            add(current.target)
        elif isinstance(current, cst.AsName) and isinstance(current.name, cst.BaseExpression):
            add(current.name)
        elif isinstance(current, cst.Expr) and isinstance(current.value, cst.Call):
            add(current.value.func)
    return bound


def _matches(need: str, target: str) -> bool:
    return need == target or need.startswith(target + ".")


def is_autocast_with(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.With) and any(
        isinstance(item.item, cst.Call) and dotted_name(item.item.func) in _AUTOCAST_NAMES for item in node.items
    )


def _is_boundary(ctx: ModuleContext, statement: cst.CSTNode, *, autocast: bool = True) -> bool:
    """A backward, an optimizer step, amp set-up or (``autocast``) an autocast region: not forward code."""
    for current in ctx.walk(statement, into_definitions=False):
        if isinstance(current, cst.Call):
            func = current.func
            if isinstance(func, cst.Attribute) and func.attr.value in _BOUNDARY_METHODS:
                return True
            found = ctx.amp_api(func)
            if found is not None and found[0] in ("scale_loss", "initialize"):
                return True
        if autocast and is_autocast_with(current):
            return True
    return False


def _ends_phase(ctx: ModuleContext, statement: cst.CSTNode) -> bool:
    """Whether the backward walk stops at ``statement``: a boundary, except an ``if`` that is
    one only through the autocast regions of its branches (``if apex: out = model(x)``
    ``else: with autocast(): out = model(x)``): its other branches compute the loss unwrapped."""
    if not _is_boundary(ctx, statement):
        return False
    return not (isinstance(statement, cst.If) and not _is_boundary(ctx, statement, autocast=False))


def _calls(ctx: ModuleContext, statement: cst.CSTNode) -> Iterator[cst.Call]:
    for current in ctx.walk(statement, into_definitions=False):
        if isinstance(current, cst.Call):
            yield current


def _model_like(name: str, model_names: set[str]) -> bool:
    lowered = name.lower()
    return name in model_names or lowered.endswith(("model", "net")) or lowered.startswith("net")


def _is_model_call(call: cst.Call, model_names: set[str]) -> bool:
    """A call of a model (``model(x)``, ``self.net.forward(x)``) or a call handed one."""
    name = dotted_name(call.func)
    if name is not None:
        parts = name.split(".")
        if _model_like(parts[-1], model_names):
            return True
        if len(parts) > 1 and parts[-1] in ("forward", "module") and _model_like(parts[-2], model_names):
            return True
    for arg in call.args:
        value = dotted_name(arg.value)
        if value is not None and value.split(".")[-1] in model_names:
            return True  # compute_loss(batch, model)
    return False


def _computes(call: cst.Call) -> bool:
    func = call.func
    if isinstance(func, cst.Attribute) and func.attr.value in _DATA_METHODS:
        return False
    if isinstance(func, cst.Name) and func.value in _DATA_FUNCTIONS:
        return False
    return True


def _ancestor_in(ctx: ModuleContext, statement: cst.CSTNode, block: cst.CSTNode) -> cst.CSTNode | None:
    current = statement
    while True:
        parent_block = ctx.block_of(current)
        if parent_block is block:
            return current
        owner = ctx.owner_of_block(parent_block)
        if owner is None:
            return None
        current = ctx.statement_of(owner)


def forward_span(
    ctx: ModuleContext, anchor: cst.CSTNode, loss: cst.BaseExpression, model_names: set[str]
) -> tuple[cst.CSTNode, cst.CSTNode] | None:
    """(first, last) statements computing ``loss`` before ``anchor``, in one block."""
    chain = _dependency_chain(ctx, anchor, loss)
    if not chain:
        return None
    forward = _forward_statement(ctx, chain, model_names)
    if forward is None:
        return None
    if any(is_autocast_with(ancestor) for ancestor in ctx.ancestors(forward)):
        return None  # already under autocast
    block = ctx.block_of(forward)
    body = list[cst.CSTNode](block.body)
    limit = _ancestor_in(ctx, anchor, block)
    end = body.index(limit) if limit is not None else len(body)
    last = forward
    members = {statement for statement, _ in chain}
    for statement in body[body.index(forward) + 1 : end]:
        if _ends_phase(ctx, statement):
            break
        if statement in members:
            # an if/else, loop or with that computes the loss (its own head layers, a sum
            # over outputs) runs under autocast too, as all of it ran under Apex O1
            last = statement
    return forward, last


def calls_a_model(ctx: ModuleContext, first: cst.CSTNode, last: cst.CSTNode, model_names: set[str]) -> bool:
    """Whether a statement from ``first`` to ``last`` (one block) calls one of the models."""
    body = list[cst.CSTNode](ctx.block_of(first).body)
    span = body[body.index(first) : body.index(last) + 1]
    return any(_is_model_call(call, model_names) for statement in span for call in _calls(ctx, statement))


def inner_loss_spans(
    ctx: ModuleContext, anchor: cst.CSTNode, loss: cst.BaseExpression, forward: cst.CSTNode
) -> list[tuple[cst.CSTNode, cst.CSTNode]]:
    """(first, last) statements computing ``loss`` inside the `if`/`with` that holds ``anchor``
    after the forward pass (``outputs = model(x)``, then ``if accumulate: loss = criterion(outputs,
    y); ...; with amp.scale_loss(loss, ...)``): each block between the forward pass's block and
    ``anchor`` where the loss is computed before the statement that holds ``anchor``. Apex O1
    cast those ops as it cast the forward pass."""
    members = {statement for statement, in_phase in _dependency_chain(ctx, anchor, loss) if in_phase}
    outer = ctx.block_of(forward)
    spans: list[tuple[cst.CSTNode, cst.CSTNode]] = []
    current = anchor
    while True:
        block = ctx.block_of(current)
        if block is outer:
            return spans
        body = list[cst.CSTNode](block.body)
        before = body[: body.index(current)]
        first = last = None
        for statement in before:
            if _ends_phase(ctx, statement):
                first = last = None  # the loss is computed after an earlier backward or step
            elif statement in members:
                first = first or statement
                last = statement
        if first is not None and last is not None:
            spans.append((first, last))
        owner = ctx.owner_of_block(block)
        if not isinstance(owner, _TRANSPARENT):
            return []  # the forward pass is not in a block around the anchor
        current = ctx.statement_of(owner)


def autocast_over_forward(
    ctx: ModuleContext, anchor: cst.CSTNode, loss: cst.BaseExpression, model_names: set[str]
) -> cst.With | None:
    """The ``with <autocast>:`` statement that already holds the forward pass feeding ``loss``
    (a native path's region, ``with autocast(enabled=args.amp == "native"):``), when all the
    loss's computation after it only moves data; None otherwise."""
    chain = _dependency_chain(ctx, anchor, loss, through_autocast=True)
    forward = _forward_statement(ctx, chain, model_names)
    if not isinstance(forward, cst.With) or not is_autocast_with(forward) or len(forward.items) != 1:
        return None
    later = [statement for statement, in_phase in chain if in_phase and ctx.position(statement) > ctx.position(forward)]
    if any(_computes(call) for statement in later for call in _calls(ctx, statement)):
        return None  # part of the loss is computed outside the region
    return forward


def _dependency_chain(
    ctx: ModuleContext, anchor: cst.CSTNode, loss: cst.BaseExpression, *, through_autocast: bool = False
) -> list[tuple[cst.CSTNode, bool]]:
    """The statements before ``anchor`` that ``loss`` depends on, latest first, each with
    whether it was found before any earlier backward/step was crossed (``through_autocast``:
    an autocast region is one of them, not the end of the phase)."""
    needs = _references(ctx, loss)
    chain: list[tuple[cst.CSTNode, bool]] = []
    current = anchor
    in_phase = True
    while True:
        block = ctx.block_of(current)
        body: list[cst.CSTNode] = list(block.body)
        for statement in reversed(body[: body.index(current)]):
            if through_autocast and is_autocast_with(statement) and not _is_boundary(ctx, statement, autocast=False):
                pass  # the forward pass may already run under an autocast region (see autocast_over_forward)
            elif _ends_phase(ctx, statement):
                # an earlier backward or step: what comes before belongs to the previous
                # phase, but a loss computed there may still feed this one
                in_phase = False
                continue
            targets = _targets(ctx, statement)
            hit = {need for need in needs if any(_matches(need, t) for t in targets)}
            if not hit:
                continue
            chain.append((statement, in_phase))
            if isinstance(statement, cst.SimpleStatementLine):
                needs -= hit
            needs |= _references(ctx, statement)
        owner = ctx.owner_of_block(block)
        if not isinstance(owner, _TRANSPARENT):
            return chain
        current = ctx.statement_of(owner)


def _forward_statement(
    ctx: ModuleContext, chain: list[tuple[cst.CSTNode, bool]], model_names: set[str]
) -> cst.CSTNode | None:
    """The earliest statement of the chain that calls a model (or, failing that, computes
    anything), preferring the statements of the current phase."""
    forward: cst.CSTNode | None = None
    for wanted in (True, False):
        candidates = [statement for statement, phase in chain if phase or not wanted]
        for statement in candidates:  # latest first: the last hit is the earliest statement
            if any(_is_model_call(call, model_names) for call in _calls(ctx, statement)):
                forward = statement
        if forward is None:
            for statement in candidates:
                if any(_computes(call) for call in _calls(ctx, statement)):
                    forward = statement
        if forward is not None:
            break
    return forward


def parameter_callers(
    ctx: ModuleContext,
    function: cst.FunctionDef,
    parameter: str,
    calls_by_name: dict[str, list[cst.Call]],
    partials_by_name: dict[str, list[cst.Call]] | None = None,
) -> list[tuple[cst.Call, cst.BaseExpression]]:
    """Call sites of ``function`` in this file with the argument given for ``parameter``; for
    ``g = functools.partial(function, a)`` (``partials_by_name``), the calls ``g(...)`` (or the
    ``partial`` call itself where it binds the parameter)."""
    names = [param.name.value for param in function.params.params]
    if parameter not in names:
        return []
    found_in_partials: list[tuple[cst.Call, cst.BaseExpression]] = []
    if partials_by_name is not None and ctx.class_of_method(function) is None:
        for partial in partials_by_name.get(function.name.value, []):
            found_in_partials.extend(_partial_callers(ctx, partial, names, parameter))
    klass = ctx.class_of_method(function)
    if klass is not None:
        names = names[1:]  # called as self.f(...)
        candidates = [
            node
            for owner in (klass, *_subclasses_keeping(ctx, klass, function.name.value))
            for node in ctx.walk(owner)
            if isinstance(node, cst.Call)
            and isinstance(node.func, cst.Attribute)
            and node.func.attr.value == function.name.value
        ]
    else:
        candidates = list(calls_by_name.get(function.name.value, []))
    found: list[tuple[cst.Call, cst.BaseExpression]] = []
    for call in candidates:
        bound = syntax.bind_arguments(call, names, partial=True)
        if bound is not None and parameter in bound:
            found.append((call, bound[parameter].value))
    return found + found_in_partials


def _partial_callers(
    ctx: ModuleContext, partial: cst.Call, names: list[str], parameter: str
) -> list[tuple[cst.Call, cst.BaseExpression]]:
    """The argument ``partial(f, ...)`` gives ``parameter`` (with the partial call), or, where it
    leaves it open, each call of the name it is bound to with the argument given there."""
    from migrate.rules._amp import partial_bound_calls  # _amp builds on _context, as this module does

    given = partial.args[1:]
    positional = [arg for arg in given if arg.keyword is None]
    if any(arg.star for arg in given):
        return []
    if parameter in names[: len(positional)]:
        return [(partial, positional[names.index(parameter)].value)]
    keyword = next((arg for arg in given if arg.keyword is not None and arg.keyword.value == parameter), None)
    if keyword is not None:
        return [(partial, keyword.value)]
    found: list[tuple[cst.Call, cst.BaseExpression]] = []
    for call in partial_bound_calls(ctx, partial) or []:
        bound = syntax.bind_arguments(call, names[len(positional) :], partial=True)
        if bound is not None and parameter in bound:
            found.append((call, bound[parameter].value))
    return found


def _subclasses_keeping(ctx: ModuleContext, klass: cst.ClassDef, method: str) -> list[cst.ClassDef]:
    """The classes of this file that inherit ``method`` from ``klass`` (directly or through
    each other) without defining their own: their ``self.method(...)`` calls it too (an
    encoder-decoder trainer's steps calling the base trainer's ``optimize``)."""
    classes = [node for node in ctx.walk(ctx.module) if isinstance(node, cst.ClassDef)]

    def defines(owner: cst.ClassDef) -> bool:
        body = owner.body.body if isinstance(owner.body, cst.IndentedBlock) else ()
        return any(isinstance(statement, cst.FunctionDef) and statement.name.value == method for statement in body)

    found: list[cst.ClassDef] = []
    parents = {klass.name.value}
    while True:
        new = [
            owner
            for owner in classes
            if owner is not klass
            and owner not in found
            and not defines(owner)
            and any(_base_name(base.value) in parents for base in owner.bases)
        ]
        if not new:
            return found
        found += new
        parents |= {owner.name.value for owner in new}


def _base_name(base: cst.BaseExpression) -> str | None:
    """The class name a base expression ends in (``Trainer``, ``trainers.Trainer``)."""
    if isinstance(base, cst.Name):
        return base.value
    if isinstance(base, cst.Attribute):
        return base.attr.value
    return None
