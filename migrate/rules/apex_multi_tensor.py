"""apex_multi_tensor: ``multi_tensor_applier(amp_C.<kernel>, flag, lists, ...)`` and ``amp_C`` calls.

What it rewrites
    Apex's fused multi-tensor CUDA kernels, called through ``multi_tensor_applier`` or
    directly (``amp_C.multi_tensor_scale(chunk_size, flag, lists, ...)``), become torch's
    multi-tensor ``torch._foreach_*`` ops with the same arithmetic (float32 math, one
    rounding into the output):

    - ``multi_tensor_scale`` with ``[xs, xs]``: ``torch._foreach_mul_(xs, s)``; with
      ``[xs, out]``: ``torch._foreach_copy_(out, xs)`` for a scale of 1, else
      ``torch._foreach_copy_(out, [t.float() * s for t in xs])``;
    - ``multi_tensor_axpby`` ``[xs, ys, out], a, b``:
      ``torch._foreach_copy_(out, [a * x.float() + b * y.float() for x, y in zip(xs, ys)])``;
    - ``multi_tensor_l2norm`` (and ``_mp``) ``[ts]``: the float32 norm
      ``torch.linalg.vector_norm(torch.stack(torch._foreach_norm(ts, dtype=torch.float32)), keepdim=True)``
      (shape ``[1]`` like Apex's); the per-tensor norms are the stacked ``_foreach_norm``.

    Apex's kernels also set the flag tensor to 1 when an input is not finite. Where the
    code reads that flag afterwards, a ``flag.logical_or_(...)`` statement keeps it; a flag
    that is only created, zeroed and passed to kernels is dropped with the kernel.
    ``multi_tensor_applier.available`` becomes ``True`` once every applier call was rewritten
    (``if multi_tensor_applier.available: A else: B`` becomes ``A``);
    ``import amp_C`` goes when nothing uses it any more.

Before::

    import amp_C
    from apex.multi_tensor_apply import multi_tensor_applier

    multi_tensor_applier(amp_C.multi_tensor_scale, overflow_buf, [grads, grads], 1.0 / loss_scale)

After::

    import torch

    torch._foreach_mul_(grads, 1.0 / loss_scale)

Not rewritten (reported instead, AMP040)
    The optimizer kernels (``multi_tensor_adam``, ``_sgd``, ``_lamb``, ``_novograd``, ...),
    kernels reached through a variable, lists that are not written out in the call, and
    results used in ways Apex's shape does not carry over to. Each message gives the torch
    code to write.

Safety
    The same float32 arithmetic; a norm sums per-tensor norms instead of per-chunk squares,
    so its last bit can differ. ``torch._foreach_norm(..., dtype=)`` needs torch 2.4.

References
    NVIDIA/apex: apex/multi_tensor_apply/multi_tensor_apply.py, csrc/multi_tensor_scale_kernel.cu,
    csrc/multi_tensor_axpby_kernel.cu, csrc/multi_tensor_l2norm_kernel.cu, csrc/amp_C_frontend.cpp.
"""

from __future__ import annotations

import re

import libcst as cst

from migrate.rules import _syntax as syntax
from migrate.rules._context import ModuleContext

RULE = "apex_multi_tensor"

_APPLIER = frozenset(
    {
        "apex.multi_tensor_apply.multi_tensor_applier",
        "apex.multi_tensor_apply.multi_tensor_apply.multi_tensor_applier",
    }
)
_NORM = "torch.linalg.vector_norm(torch.stack(torch._foreach_norm({ts}, dtype=torch.float32)), keepdim=True)"
_PER_TENSOR = "torch.stack(torch._foreach_norm({ts}, dtype=torch.float32))"
_NOT_FINITE = "torch.stack([{t}.isfinite().all() for {t} in {ts}]).logical_not().any()"

# What to write instead of each kernel (AMP040 messages for the calls not rewritten).
KERNELS = {
    "multi_tensor_scale": "`torch._foreach_mul_(xs, scale)` for `[xs, xs]`, "
    "`torch._foreach_copy_(out, [t.float() * scale for t in xs])` for `[xs, out]`; the flag: "
    "`flag.logical_or_(torch.stack([t.isfinite().all() for t in xs]).logical_not().any())`",
    "multi_tensor_axpby": "`torch._foreach_copy_(out, [a * x.float() + b * y.float() for x, y in zip(xs, ys)])`",
    "multi_tensor_l2norm": f"`{_NORM.format(ts='ts')}` (per-tensor norms: `{_PER_TENSOR.format(ts='ts')}`)",
    "multi_tensor_l2norm_mp": f"`{_NORM.format(ts='ts')}` (per-tensor norms: `{_PER_TENSOR.format(ts='ts')}`)",
    "multi_tensor_unscale_l2norm": f"`{_NORM.format(ts='ts')} * inv_scale`",
    "multi_tensor_l2norm_scale": "`torch._foreach_copy_(out, [t.float() * scale for t in xs])` and the norm "
    f"`{_NORM.format(ts='xs')}`",
    "multi_tensor_sgd": "the FusedSGD kernel: `torch.optim.SGD(params, lr=lr, momentum=momentum, "
    "dampening=dampening, weight_decay=weight_decay, nesterov=nesterov)` and its `step()`",
    "multi_tensor_adam": "the FusedAdam kernel: `torch.optim.AdamW(params, lr=lr, betas=(beta1, beta2), eps=eps, "
    "weight_decay=weight_decay, fused=True)` (`torch.optim.Adam` for mode 0) and its `step()`",
    "multi_tensor_adam_capturable": "the FusedAdam kernel: `torch.optim.AdamW(params, lr=lr, betas=(beta1, beta2), "
    "eps=eps, weight_decay=weight_decay, capturable=True)` and its `step()`",
    "multi_tensor_adam_capturable_master": "the FusedAdam kernel: `torch.optim.AdamW(params, lr=lr, "
    "betas=(beta1, beta2), eps=eps, weight_decay=weight_decay, capturable=True)` on float32 parameters, "
    "with torch.autocast for the low-precision forward pass",
    "multi_tensor_adagrad": "the FusedAdagrad kernel: `torch.optim.Adagrad(params, lr=lr, eps=eps, "
    "weight_decay=weight_decay)` and its `step()`",
    "multi_tensor_lamb": "the FusedLAMB kernel: torch has no LAMB optimizer; keep `apex.optimizers.FusedLAMB` "
    "(still in Apex) for this optimizer",
    "multi_tensor_lamb_mp": "the FusedMixedPrecisionLamb kernel: torch has no LAMB optimizer; keep "
    "`apex.optimizers.FusedMixedPrecisionLamb` (still in Apex)",
    "multi_tensor_lamb_stage1_cuda": "a LAMB kernel: torch has no LAMB optimizer; keep `apex.optimizers.FusedLAMB`",
    "multi_tensor_lamb_stage2_cuda": "a LAMB kernel: torch has no LAMB optimizer; keep `apex.optimizers.FusedLAMB`",
    "multi_tensor_novograd": "the FusedNovoGrad kernel: torch has no NovoGrad optimizer; keep "
    "`apex.optimizers.FusedNovoGrad` (still in Apex)",
    "update_scale_hysteresis": "`scaler.update()` of a `torch.amp.GradScaler` (it has no hysteresis)",
}


def _kernel_replacement(kernel: str) -> str:
    return KERNELS.get(kernel, "an Apex CUDA kernel: write it with torch._foreach_* ops")


def _amp_c_imports(ctx: ModuleContext) -> list[cst.Name]:
    """The ``amp_C`` names bound by ``import amp_C``."""
    found = []
    for name in ctx.nodes_of(cst.Name):
        if name.value == "amp_C":
            alias = ctx.parent(name)
            if (
                isinstance(alias, cst.ImportAlias)
                and alias.asname is None
                and isinstance(ctx.parent(alias), cst.Import)
            ):
                found.append(name)
    return found


def _kernel_of(expression: cst.BaseExpression) -> str | None:
    """``multi_tensor_scale`` for ``amp_C.multi_tensor_scale``."""
    if (
        isinstance(expression, cst.Attribute)
        and isinstance(expression.value, cst.Name)
        and expression.value.value == "amp_C"
    ):
        return expression.attr.value
    return None


def _code(node: cst.CSTNode) -> str:
    return syntax.code(node).strip()


def _operand(node: cst.BaseExpression) -> str:
    """Code for ``node`` as one operand of ``*`` (a compound expression gets parentheses)."""
    atomic = (cst.Name, cst.Attribute, cst.Integer, cst.Float, cst.Call, cst.Subscript)
    code = _code(node)
    return code if isinstance(node, atomic) or code.startswith("(") else f"({code})"


def _elements(node: cst.BaseExpression, count: int) -> list[cst.BaseExpression] | None:
    if isinstance(node, (cst.List, cst.Tuple)) and len(node.elements) == count:
        if all(isinstance(element, cst.Element) for element in node.elements):
            return [element.value for element in node.elements]
    return None


def _free_name(preferred: str, *expressions: cst.CSTNode) -> str:
    """A comprehension variable that none of ``expressions`` mentions."""
    used = set()
    for expression in expressions:
        used.update(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", _code(expression)))
    name = preferred
    while name in used:
        name += "_"
    return name


class _Calls:
    """The kernel calls of one module, with the flag tensors they are given."""

    def __init__(self, ctx: ModuleContext) -> None:
        self.ctx = ctx
        # call -> (kernel name, flag, lists, extra arguments, the amp_C Name)
        self.found: dict[cst.Call, tuple[str, cst.BaseExpression, cst.BaseExpression, list[cst.Arg], cst.Name]] = {}
        self.applier_roots: dict[cst.Call, cst.Name] = {}
        if not _amp_c_imports(ctx):
            return
        for call in ctx.nodes_of(cst.Call):
            args = list(call.args)
            if any(arg.star or arg.keyword is not None for arg in args):
                continue
            kernel_expression: cst.BaseExpression | None = None
            found = ctx.apex_path(call.func)
            applier = found is not None and found[0] in _APPLIER
            if applier and len(args) >= 3:
                kernel_expression, rest = args[0].value, args[1:]
            elif _kernel_of(call.func) is not None and len(args) >= 3:
                kernel_expression, rest = call.func, args[1:]  # args[0] is the chunk size
            if kernel_expression is None:
                continue
            kernel = _kernel_of(kernel_expression)
            if kernel is None:
                continue
            amp_c = kernel_expression.value  # type: ignore[attr-defined]
            self.found[call] = (kernel, rest[0].value, rest[1].value, rest[2:], amp_c)
            if applier and found is not None:
                self.applier_roots[call] = found[1]

    def is_flag_argument(self, node: cst.CSTNode) -> bool:
        arg = self.ctx.parent(node)
        return isinstance(arg, cst.Arg) and any(
            arg.value is flag and node is flag for _, flag, _, _, _ in self.found.values()
        )


def _flag_observed(ctx: ModuleContext, calls: _Calls, flag: cst.BaseExpression) -> bool:
    """Whether code other than the kernels reads the flag tensor."""
    if isinstance(flag, cst.Call):
        return False  # made on the spot: nothing else holds it
    if isinstance(flag, cst.Name):
        scope = ctx.scope_of(flag)
        occurrences: list[cst.CSTNode] = [
            name for name in ctx.nodes_of(cst.Name) if name.value == flag.value and ctx.scope_of(name) is scope
        ]
        occurrences = [
            name
            for name in occurrences
            if not (isinstance(ctx.parent(name), cst.Attribute) and ctx.parent(name).attr is name)  # type: ignore[union-attr]
        ]
    elif isinstance(flag, cst.Attribute):
        wanted = _code(flag)
        occurrences = []
        for name in ctx.nodes_of(cst.Name):
            parent = ctx.parent(name)
            if name.value == flag.attr.value and isinstance(parent, cst.Attribute) and parent.attr is name:
                if _code(parent) == wanted:
                    occurrences.append(parent)
    else:
        return True
    for node in occurrences:
        parent = ctx.parent(node)
        if isinstance(parent, cst.AssignTarget) or calls.is_flag_argument(node):
            continue
        if isinstance(parent, cst.Attribute) and parent.attr.value in ("fill_", "zero_"):
            holder = ctx.parent(parent)
            if isinstance(holder, cst.Call) and isinstance(ctx.parent(holder), cst.Expr):
                continue
        return True
    return False


def _statement_line(ctx: ModuleContext, call: cst.Call) -> cst.SimpleStatementLine | None:
    """The line when the call is a whole one-statement line of its own."""
    expression = ctx.parent(call)
    line = ctx.parent(expression) if isinstance(expression, cst.Expr) else None
    if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
        return line
    return None


def _replace_line(ctx: ModuleContext, line: cst.SimpleStatementLine, codes: list[str]) -> None:
    """Replace one statement line by others; the plan keeps the line's comments."""
    ctx.plan.replace_statement[line] = [cst.parse_statement(code) for code in codes]  # type: ignore[misc]


def _scale(ctx: ModuleContext, call: cst.Call, flag: str | None, lists: cst.BaseExpression, rest: list[cst.Arg]) -> str:
    pair = _elements(lists, 2)
    if pair is None or len(rest) != 1:
        return "its tensor lists are not written out as `[inputs, outputs]`"
    line = _statement_line(ctx, call)
    if line is None:
        return "its result is used (Apex returns None)"
    xs, out = (_code(p) for p in pair)
    scale = rest[0].value
    t = _free_name("t", *pair, scale)
    if xs == out:
        op = f"torch._foreach_mul_({xs}, {_code(scale)})"
    elif syntax.literal(scale) == 1:
        op = f"torch._foreach_copy_({out}, {xs})"
    else:
        op = f"torch._foreach_copy_({out}, [{t}.float() * {_operand(scale)} for {t} in {xs}])"
    codes = [op] if flag is None else [f"{flag}.logical_or_({_NOT_FINITE.format(t=t, ts=xs)})", op]
    _replace_line(ctx, line, codes)
    return ""


def _axpby(ctx: ModuleContext, call: cst.Call, flag: str | None, lists: cst.BaseExpression, rest: list[cst.Arg]) -> str:
    triple = _elements(lists, 3)
    if triple is None or len(rest) != 3:
        return "its tensor lists are not written out as `[xs, ys, out]`"
    line = _statement_line(ctx, call)
    if line is None:
        return "its result is used (Apex returns None)"
    xs, ys, out = (_code(p) for p in triple)
    a, b = _operand(rest[0].value), _operand(rest[1].value)
    x = _free_name("x", *triple, rest[0].value, rest[1].value)
    y = _free_name("y", *triple, rest[0].value, rest[1].value)
    op = f"torch._foreach_copy_({out}, [{a} * {x}.float() + {b} * {y}.float() for {x}, {y} in zip({xs}, {ys})])"
    codes = [op]
    if flag is not None:
        check = syntax.literal(rest[2].value)
        checked = {0: [xs], 1: [ys], -1: [xs, ys]}.get(check)  # type: ignore[call-overload]
        if checked is None:
            return "its arg_to_check is computed at run time"
        t = _free_name("t", *triple)
        codes = [f"{flag}.logical_or_({_NOT_FINITE.format(t=t, ts=ts)})" for ts in checked] + codes
    _replace_line(ctx, line, codes)
    return ""


def _l2norm(
    ctx: ModuleContext, call: cst.Call, flag: str | None, lists: cst.BaseExpression, rest: list[cst.Arg]
) -> str:
    single = _elements(lists, 1)
    if single is None or len(rest) > 1:
        return "its tensor list is not written out as `[tensors]`"
    ts = _code(single[0])
    per_tensor = syntax.literal(rest[0].value) if rest else False
    norm = _NORM.format(ts=ts)
    parent = ctx.parent(call)
    # `applier(...)[0]`: the norm alone
    if isinstance(parent, cst.Subscript) and parent.value is call and len(parent.slice) == 1:
        index = parent.slice[0].slice
        if isinstance(index, cst.Index) and syntax.literal(index.value) == 0:
            if flag is not None:
                assign = ctx.parent(parent)
                if not (
                    isinstance(assign, cst.Assign)
                    and assign.value is parent
                    and len(assign.targets) == 1
                    and isinstance(assign.targets[0].target, cst.Name)
                ):
                    return "its flag is read later and the norm is not assigned to a name"
                target = assign.targets[0].target.value
                ctx.plan.after[ctx.statement_of(call)].append(
                    cst.parse_statement(f"{flag}.logical_or_({target}.isfinite().logical_not())")  # type: ignore[arg-type]
                )
            ctx.plan.substitute(parent, cst.parse_expression(norm))
            return ""
    # `norm, per_tensor = applier(...)`
    if isinstance(parent, cst.Assign) and parent.value is call and len(parent.targets) == 1:
        targets = _elements(parent.targets[0].target, 2)
        line = ctx.parent(parent)
        if targets is not None and isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
            total, each = (_code(target) for target in targets)
            if each == "_" or per_tensor is False:
                codes = [f"{total} = {norm}"]
                if each != "_":
                    codes.append(f"{each} = torch.empty(0)")  # Apex's per-tensor result when not asked for
            elif per_tensor is True:
                codes = [
                    f"{each} = {_PER_TENSOR.format(ts=ts)}",
                    f"{total} = torch.linalg.vector_norm({each}, keepdim=True)",
                ]
            else:
                return "per_tensor is chosen at run time"
            if flag is not None:
                codes.append(f"{flag}.logical_or_({total}.isfinite().logical_not())")
            _replace_line(ctx, line, codes)
            return ""
    return "its (norm, per_tensor_norms) result is not unpacked or indexed with [0]"


_REWRITES = {
    "multi_tensor_scale": _scale,
    "multi_tensor_axpby": _axpby,
    "multi_tensor_l2norm": _l2norm,
    "multi_tensor_l2norm_mp": _l2norm,
}


def plan(ctx: ModuleContext) -> None:
    imports = _amp_c_imports(ctx)
    if not imports:
        _plan_available(ctx)
        return
    calls = _Calls(ctx)
    rewritten: set[cst.Name] = set()
    reported: set[cst.Name] = set()
    for call, (kernel, flag, lists, rest, amp_c) in calls.found.items():
        if ctx.skipped(call):
            reported.add(amp_c)  # left as the user asked (and reported as skipped)
            continue
        rewrite = _REWRITES.get(kernel)
        if rewrite is None:
            continue  # reported below with the other amp_C uses
        observed = _flag_observed(ctx, calls, flag)
        reason = rewrite(ctx, call, _code(flag) if observed else None, lists, rest)
        if reason:
            reported.add(amp_c)
            ctx.report("AMP040", call, f"amp_C.{kernel} not rewritten ({reason}): write {_kernel_replacement(kernel)}")
            continue
        rewritten.add(amp_c)
        if call in calls.applier_roots:
            ctx.consumed.add(calls.applier_roots[call])
        ctx.plan.needs_torch_import = True
        kept = "; the overflow flag is kept" if observed else ""
        ctx.report("AMP041", call, f"amp_C.{kernel} became torch._foreach_* ops (same float32 arithmetic){kept}")
    _plan_available(ctx)
    remaining = [name for name in ctx.nodes_of(cst.Name) if name.value == "amp_C" and name not in imports]
    for name in remaining:
        attribute = ctx.parent(name)
        if name in rewritten or name in reported:
            continue
        if isinstance(attribute, cst.Attribute) and attribute.value is name:
            ctx.report(
                "AMP040", attribute, f"amp_C.{attribute.attr.value} is {_kernel_replacement(attribute.attr.value)}"
            )
        else:
            ctx.report("AMP040", name, "the amp_C module used as a value: call torch._foreach_* ops instead")
    if all(name in rewritten for name in remaining):
        for name in imports:
            line = ctx.statement_of(name)
            if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
                ctx.plan.remove.add(line)


def _plan_available(ctx: ModuleContext) -> None:
    """``multi_tensor_applier.available``: torch's foreach ops are always there, once every call
    of the applier became one (while a call stays, so does Apex, and the check keeps its meaning)."""
    checks: list[tuple[cst.Attribute, cst.Name]] = []
    for name in ctx.nodes_of(cst.Name):
        attribute = _available_of(ctx, name)
        if attribute is None:
            continue
        found = ctx.apex_path(name)
        if found is not None and found[0] in _APPLIER and not ctx.skipped(attribute):
            checks.append((attribute, found[1]))
    if not checks or _applier_still_called(ctx, {name.value for _, name in checks}):
        return
    for attribute, name in checks:
        test_of = ctx.parent(attribute)
        if isinstance(test_of, cst.If) and test_of.test is attribute and _in_a_body(ctx, test_of):
            ctx.plan.unwrap.add(test_of)  # `if available: A else: B` is A
        else:
            ctx.plan.substitute(attribute, cst.Name("True"))
        ctx.consumed.add(name)
        ctx.report("AMP041", attribute, "multi_tensor_applier.available became True: torch._foreach_* are always there")


def _available_of(ctx: ModuleContext, name: cst.Name) -> cst.Attribute | None:
    """``name.available``, where ``name`` is read for that attribute."""
    attribute = ctx.parent(name)
    if isinstance(attribute, cst.Attribute) and attribute.value is name and attribute.attr.value == "available":
        return attribute
    return None


def _in_a_body(ctx: ModuleContext, statement: cst.If) -> bool:
    """Whether ``statement`` is a statement of a block (an ``elif`` is part of another ``if``)."""
    parent = ctx.parent(statement)
    return isinstance(parent, (cst.Module, cst.IndentedBlock))


def _applier_still_called(ctx: ModuleContext, spellings: set[str]) -> bool:
    """Whether a use of the applier other than ``.available`` is left (not rewritten above)."""
    for name in ctx.nodes_of(cst.Name):
        if name.value not in spellings or name in ctx.consumed:
            continue
        if isinstance(ctx.parent(name), cst.ImportAlias) or _available_of(ctx, name) is not None:
            continue
        found = ctx.apex_path(name)
        if found is not None and found[0] in _APPLIER:
            return True
    return False
