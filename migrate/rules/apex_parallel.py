"""apex_parallel: ``apex.parallel.DistributedDataParallel`` and the rest of ``apex.parallel``.

What it rewrites
    ``apex.parallel.DistributedDataParallel(module, ...)`` becomes
    ``torch.nn.parallel.DistributedDataParallel(module, ..., broadcast_buffers=False,
    find_unused_parameters=True)``: Apex never synchronised buffers (BatchNorm statistics
    stay per process), and it accepted parameters that get no gradient, where torch raises
    without ``find_unused_parameters``. ``device_ids`` is written only where the code around
    the call puts the module on one GPU (``model.cuda(args.gpu)``, or ``model.cuda()`` after
    ``torch.cuda.set_device(args.local_rank)``); elsewhere it is left out, which is what Apex
    did (the module stays wherever it is, CPU included). ``message_size`` (elements) becomes
    ``bucket_cap_mb`` (MiB of 4-byte gradients). Settings that only changed *when* gradients
    were all-reduced go (``delay_allreduce``, ``allreduce_trigger_params``,
    ``num_allreduce_streams``, ``allreduce_communicators``, ``retain_allreduce_buffers``,
    ``shared_param``, ``prof``), and so does ``gradient_predivide_factor`` with averaging on
    (the average is the same). ``gradient_average=False`` (a sum) becomes a communication hook
    that sums. ``ddp.disable_allreduce()`` / ``enable_allreduce()`` become
    ``ddp.require_backward_grad_sync = False`` / ``True``; ``isinstance(m, DDP)`` checks,
    annotations (``-> Tuple[DDP, Optimizer]``) and the class stored in a variable used only
    in such checks (``DDP = DistributedDataParallel if not with_apex else ApexDDP``, or a tuple
    or list of classes holding it: ``valid = list((Net, nn.DataParallel, DDP))``) name
    torch's class, provided every Apex DDP call in the module migrates (else a check would stop
    matching the Apex DDP still built). ``apex.parallel.ReduceOp``
    is ``torch.distributed.ReduceOp``.

    ``LARC``, ``Reducer``, ``create_syncbn_process_group`` and ``flat_dist_call`` have no torch
    counterpart: a plain-torch version of each (same arithmetic) is written once into the
    module, and the calls use it.

Before::

    from apex.parallel import DistributedDataParallel as DDP

    model = model.cuda()
    model = DDP(model, delay_allreduce=True)

After::

    import torch

    model = model.cuda()
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[torch.cuda.current_device()], broadcast_buffers=False, find_unused_parameters=True)

Not rewritten (reported instead)
    ``gradient_average`` chosen at run time, or ``False`` where the wrapped module has no name
    to register the hook on; unknown keywords; a wrapped module this module only runs, moves or
    wraps while another wrapped module's ``.parameters()`` are taken (``augment = DDP(augment)``
    beside ``SGD(net.parameters())``): it may have no parameter that requires a gradient, which
    torch's DDP refuses with RuntimeError and Apex's wrapped, unless it is given weights here
    (``from_pretrained``, ``load_state_dict``); a wrapped module this module freezes whole before the wrap
    (``for p in teacher.parameters(): p.requires_grad = False``) (AMP042). A subclass of Apex DDP, or the class
    passed or stored for other uses than checks (AMP040, from amp_import); the Apex DDP calls
    of a module that keeps the class as such a value stay too (AMP040), as a torch DDP built
    there would no longer match it (``unwrap(net, (nn.DataParallel, DDP))``). ``LARC`` in a
    module where Apex amp stays (AMP040): Apex's ``amp.initialize`` accepts a torch optimizer or Apex's own LARC and
    raises TypeError on any other wrapper. Each message gives the code to write.

Safety
    Gradients are the same average; torch divides by the world size before the all-reduce,
    Apex after (or split by ``gradient_predivide_factor``): the last bits can differ in
    float16. ``allreduce_always_fp32`` mattered only for float16 gradients; under
    ``torch.autocast`` they are float32. ``find_unused_parameters=True`` costs one graph
    traversal per step: drop it when every parameter gets a gradient every step.

References
    NVIDIA/apex@e13873d: apex/parallel/distributed.py, apex/parallel/LARC.py,
    apex/parallel/__init__.py; pytorch/pytorch: torch/nn/parallel/distributed.py;
    ../shared/apex-semantics.md section 5 (apex.parallel).
"""

from __future__ import annotations

import libcst as cst

from migrate.rules import _setup as setup
from migrate.rules import _syntax as syntax
from migrate.rules._apex_classes import reads_variable, stored_in
from migrate.rules._bindings import checks_presence, is_import_fallback
from migrate.rules._context import ModuleContext, dotted_name
from migrate.rules._exports import reached_from_outside

RULE = "apex_parallel"

TORCH_DDP = "torch.nn.parallel.DistributedDataParallel"
_DDP_PATHS = frozenset({"apex.parallel.DistributedDataParallel", "apex.parallel.distributed.DistributedDataParallel"})
_DDP_PARAMETERS = (
    "module",
    "message_size",
    "delay_allreduce",
    "shared_param",
    "allreduce_trigger_params",
    "retain_allreduce_buffers",
    "allreduce_always_fp32",
    "num_allreduce_streams",
    "allreduce_communicators",
    "gradient_average",
    "gradient_predivide_factor",
    "gradient_average_split_factor",
    "prof",
)
# torch DDP's keywords that Apex's DDP has no parameter for: a call that passes one raised
# TypeError with Apex's class, so it ran only where the name was bound to torch's
_TORCH_DDP_ONLY = frozenset(
    {
        "device_ids",
        "output_device",
        "dim",
        "broadcast_buffers",
        "process_group",
        "bucket_cap_mb",
        "find_unused_parameters",
        "check_reduction",
        "gradient_as_bucket_view",
        "static_graph",
    }
)
# Apex settings that only chose when (or how) gradients were communicated, never their values.
_SCHEDULING = (
    "delay_allreduce",
    "allreduce_trigger_params",
    "num_allreduce_streams",
    "allreduce_communicators",
    "retain_allreduce_buffers",
    "shared_param",
    "gradient_average_split_factor",
    "prof",
)
_SUM_HOOK = (
    "lambda _, bucket: torch.distributed.all_reduce(bucket.buffer(){divide}, async_op=True)"
    ".get_future().then(lambda fut: fut.value()[0])"
)

_LARC = '''\
class {name}:
    """apex.parallel.LARC in plain torch: layer-wise adaptive learning rates around an optimizer.

    Before each step every gradient (plus its weight decay) is multiplied by
    trust_coefficient * |w| / (|g| + weight_decay * |w| + eps), divided by the group's lr and
    capped at 1 when clip=True; the wrapped optimizer then steps with its weight decay off.
    """

    def __init__(self, optimizer, trust_coefficient=0.02, clip=True, eps=1e-8):
        self.optim = optimizer
        self.trust_coefficient = trust_coefficient
        self.clip = clip
        self.eps = eps

    def __getstate__(self):
        return self.optim.__getstate__()

    def __setstate__(self, state):
        self.optim.__setstate__(state)

    def __repr__(self):
        return repr(self.optim)

    @property
    def state(self):
        return self.optim.state

    @property
    def param_groups(self):
        return self.optim.param_groups

    @param_groups.setter
    def param_groups(self, value):
        self.optim.param_groups = value

    def state_dict(self):
        return self.optim.state_dict()

    def load_state_dict(self, state_dict):
        self.optim.load_state_dict(state_dict)

    def zero_grad(self):
        self.optim.zero_grad()

    def add_param_group(self, param_group):
        self.optim.add_param_group(param_group)

    def step(self):
        decays = []
        with torch.no_grad():
            for group in self.optim.param_groups:
                decay = group.get("weight_decay", 0)
                decays.append(decay)
                group["weight_decay"] = 0
                for param in group["params"]:
                    if param.grad is None:
                        continue
                    param_norm = torch.linalg.vector_norm(param)
                    grad_norm = torch.linalg.vector_norm(param.grad)
                    if param_norm != 0 and grad_norm != 0:
                        rate = self.trust_coefficient * param_norm / (grad_norm + param_norm * decay + self.eps)
                        if self.clip:
                            rate = torch.clamp(rate / group["lr"], max=1)
                        param.grad += decay * param
                        param.grad *= rate
        self.optim.step()
        for group, decay in zip(self.optim.param_groups, decays):
            group["weight_decay"] = decay
'''

_REDUCER = '''\
class {name}:
    """apex.parallel.Reducer in plain torch: reduce() averages gradients over the processes.

    Given a module it broadcasts the parameters from rank 0 first and reduces the gradients
    its parameters hold; given (nested lists of) gradient tensors it reduces those.
    """

    def __init__(self, module_or_grads_list):
        if isinstance(module_or_grads_list, torch.nn.Module):
            self.module = module_or_grads_list
            for param in self.module.parameters():
                torch.distributed.broadcast(param.data, 0)
        else:
            self.module = None
            self.grads = []
            pending = [module_or_grads_list]
            while pending:
                item = pending.pop(0)
                if torch.is_tensor(item):
                    self.grads.append(item)
                elif isinstance(item, (list, tuple)):
                    pending[:0] = item

    def reduce(self):
        if self.module is not None:
            grads = [param.grad.data for param in self.module.parameters() if param.grad is not None]
        else:
            grads = self.grads
        world_size = torch.distributed.get_world_size()
        for grad in grads:
            torch.distributed.all_reduce(grad)
            grad /= world_size
'''

_SYNCBN_GROUP = '''\
def {name}(group_size):
    """apex.parallel.create_syncbn_process_group in plain torch: this rank's group of group_size ranks.

    Every rank creates every group (torch.distributed.new_group requires it); 0 means the
    whole world (None).
    """
    if group_size == 0:
        return None
    world_size = torch.distributed.get_world_size()
    assert world_size >= group_size and world_size % group_size == 0
    groups = [
        torch.distributed.new_group(ranks=list(range(start, start + group_size)))
        for start in range(0, world_size, group_size)
    ]
    return groups[torch.distributed.get_rank() // group_size]
'''

_FLAT_DIST_CALL = '''\
def {name}(tensors, call, extra_args=None):
    """apex.parallel.distributed.flat_dist_call in plain torch: call(tensor, *extra_args) on each tensor.

    An all_reduce is followed by a division by the world size (an average), as in Apex.
    """
    for tensor in tensors:
        if extra_args is not None:
            call(tensor, *extra_args)
        else:
            call(tensor)
        if call is torch.distributed.all_reduce:
            tensor /= torch.distributed.get_world_size()
'''

# Apex name -> (paths it is imported from, helper template)
_HELPERS = {
    "LARC": (("apex.parallel.LARC", "apex.parallel.LARC.LARC"), _LARC),
    "Reducer": (("apex.parallel.Reducer", "apex.parallel.distributed.Reducer"), _REDUCER),
    "create_syncbn_process_group": (("apex.parallel.create_syncbn_process_group",), _SYNCBN_GROUP),
    "flat_dist_call": (("apex.parallel.distributed.flat_dist_call",), _FLAT_DIST_CALL),
}
_HELPER_NOTES = {
    "LARC": "LARC is written into this module in plain torch (same per-parameter rates)",
    "Reducer": "Reducer is written into this module in plain torch (broadcast, then averaged all-reduces)",
    "create_syncbn_process_group": "create_syncbn_process_group is written into this module in plain torch",
    "flat_dist_call": "flat_dist_call is written into this module in plain torch (one call per tensor)",
}
_RENAMED = {"apex.parallel.ReduceOp": "torch.distributed.ReduceOp"}


def _same(a: cst.BaseExpression, b: cst.BaseExpression) -> bool:
    return syntax.code(syntax.strip_parens(a)).strip() == syntax.code(syntax.strip_parens(b)).strip()


def _first_arg(call: cst.Call, keyword: str) -> cst.BaseExpression | None:
    for arg in call.args:
        if arg.star:
            return None
        if arg.keyword is None or arg.keyword.value == keyword:
            return arg.value
    return None


def _cuda_call(node: cst.BaseExpression, module: cst.BaseExpression) -> cst.Call | None:
    """``module.cuda(...)`` somewhere in a method chain starting at ``module``."""
    while isinstance(node, (cst.Call, cst.Attribute)):
        if (
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Attribute)
            and node.func.attr.value == "cuda"
            and _same(node.func.value, module)
        ):
            return node
        node = node.func if isinstance(node, cst.Call) else node.value
    return None


def _device_ids(ctx: ModuleContext, call: cst.Call, module: cst.BaseExpression) -> tuple[str | None, str]:
    """The device id expression for ``device_ids`` (or None) and why.

    Only a ``.cuda(...)`` of the wrapped module that surely ran before the call (in a block
    enclosing it) says the module sits on one GPU; its argument, or else the device current
    at that point, is the id. A ``set_device`` between the move and the call leaves it open.
    """
    scope = ctx.scope_of(call)
    enclosing = {node for node in ctx.ancestors(call) if isinstance(node, (cst.Module, cst.IndentedBlock))}
    order = ctx.order(call)
    moved: cst.Call | None = None
    moved_at = order
    if isinstance(module, cst.Call) and isinstance(module.func, cst.Attribute) and module.func.attr.value == "cuda":
        moved = module  # DDP(model.cuda(...))
    set_devices: list[tuple[int, cst.Call, bool]] = []  # (order, call, surely ran)
    for earlier in ctx.nodes_of(cst.Call):
        if ctx.order(earlier) >= order or ctx.scope_of(earlier) is not scope:
            continue
        ran = ctx.parent(ctx.statement_of(earlier)) in enclosing
        name = dotted_name(earlier.func) or ""
        if name.endswith("cuda.set_device") and len(earlier.args) == 1 and not earlier.args[0].star:
            set_devices.append((ctx.order(earlier), earlier, ran))
        found = _cuda_call(earlier, module)
        if found is not None and ran and (moved is None or moved is not module):
            moved, moved_at = found, ctx.order(earlier)
    if moved is None:
        return None, "device_ids is left out as Apex did: the module may not be on one GPU"
    explicit = _first_arg(moved, "device")
    if explicit is not None:
        code = syntax.code(explicit).strip()
        return code, f"device_ids=[{code}] from .cuda({code})"
    if any(at > moved_at for at, _, _ in set_devices):
        return None, "device_ids is left out: torch.cuda.set_device runs between .cuda() and the wrap"
    before = [(at, device, ran) for at, device, ran in set_devices if at < moved_at]
    if before and before[-1][2]:
        code = syntax.code(before[-1][1].args[0].value).strip()
        return code, f"device_ids=[{code}] from torch.cuda.set_device({code}) and .cuda()"
    return "torch.cuda.current_device()", "device_ids=[torch.cuda.current_device()] from .cuda()"


def _has_torch_fallback(ctx: ModuleContext, name: cst.Name, branches: bool = False) -> bool:
    """``try: from apex.parallel import DDP except ImportError: from torch...import ... as DDP``;
    with ``branches``, also ``if use_apex: from apex.parallel import DDP else: DDP = torch...``."""
    binding = ctx.resolve(name.value, name)
    if binding is None:
        return False
    for ancestor in ctx.ancestors(binding.statement):
        if isinstance(ancestor, cst.Try):
            return any(_binds_torch_ddp(ctx, handler, name.value) for handler in ancestor.handlers)
        if branches and isinstance(ancestor, cst.If):
            inside_body = any(node is ancestor.body for node in ctx.ancestors(binding.statement))
            other = ancestor.orelse if inside_body else ancestor.body
            return other is not None and _binds_torch_ddp(ctx, other, name.value)
    return False


def _binds_torch_ddp(ctx: ModuleContext, block: cst.CSTNode, bound: str) -> bool:
    """Whether ``block`` binds ``bound`` to torch's DistributedDataParallel (an import or an assignment)."""
    for node in ctx.walk(block):
        if isinstance(node, cst.ImportAlias):
            alias = dotted_name(node.asname.name) if node.asname else dotted_name(node.name)  # type: ignore[arg-type]
            if alias == bound and (dotted_name(node.name) or "").endswith("DistributedDataParallel"):
                return True
        if isinstance(node, cst.Assign) and (dotted_name(node.value) or "").endswith(
            "parallel.DistributedDataParallel"
        ):
            if any(isinstance(t.target, cst.Name) and t.target.value == bound for t in node.targets):
                return True
    return False


def _assigned_to(ctx: ModuleContext, call: cst.Call) -> cst.BaseExpression | None:
    """``x`` / ``self.x`` when the call is the whole value of ``x = call``."""
    parent = ctx.parent(call)
    if isinstance(parent, cst.Assign) and parent.value is call and len(parent.targets) == 1:
        target = parent.targets[0].target
        if dotted_name(target) is not None:
            return target
    return None


def _rewrite_ddp(ctx: ModuleContext, call: cst.Call, path: str, root: cst.Name) -> bool:
    """Plan the torch DDP call for one Apex DDP call; False when it is reported instead."""
    bound = syntax.bind_arguments(call, _DDP_PARAMETERS)
    if bound is None:
        unknown = [arg.keyword.value for arg in call.args if arg.keyword and arg.keyword.value not in _DDP_PARAMETERS]
        what = f"keyword {', '.join(unknown)}" if unknown else "*args/**kwargs"
        note = None
        if isinstance(call.func, cst.Name) and _has_torch_fallback(ctx, call.func):
            # the torch branch of an optional import: already torch's signature
            note = f"{path} (bound to {TORCH_DDP} without Apex) became {TORCH_DDP}"
        elif (
            isinstance(call.func, cst.Name)
            and set(unknown) & _TORCH_DDP_ONLY
            and _has_torch_fallback(ctx, call.func, branches=True)
        ):
            # `if use_apex: from apex.parallel import DDP else: DDP = torch's`, then `DDP(m, device_ids=...)`:
            # Apex's raised TypeError on that keyword, so the call only ever ran with torch's
            note = (
                f"{path} became {TORCH_DDP}, its arguments kept: the other branch of its import binds the name to "
                f"{TORCH_DDP}, and Apex's takes no {what} (it raised TypeError), so this call only ever ran with "
                "torch's"
            )
        if note is not None:
            ctx.plan.substitute(call, call.with_changes(func=syntax.dotted(TORCH_DDP)))
            ctx.plan.needs_torch_import = True
            ctx.consumed.add(root)
            ctx.report("AMP041", call, note)
            return True
        ctx.report(
            "AMP042",
            call,
            f"{path} has no parameter for its {what}: write `{TORCH_DDP}(module, broadcast_buffers=False, "
            "find_unused_parameters=True)` with the torch arguments you need",
        )
        return False
    values = {name: syntax.literal(arg.value) for name, arg in bound.items()}
    module_arg = bound.get("module")
    if module_arg is None:
        ctx.report("AMP042", call, f"{path} without a module: write `{TORCH_DDP}(module, broadcast_buffers=False)`")
        return False
    notes: list[str] = []
    after: list[cst.SimpleStatementLine] = []
    average = values.get("gradient_average", True)
    divide = ""
    if "gradient_predivide_factor" in bound:
        factor = values["gradient_predivide_factor"]
        if average is not False:
            notes.append("gradient_predivide_factor dropped: the result is the same average")
        elif factor != 1:
            # Apex multiplies by the reciprocal: the same rounding
            divide = f".mul_(1.0 / ({syntax.code(bound['gradient_predivide_factor'].value).strip()}))"
    hook = _SUM_HOOK.format(divide=divide)
    if average is ...:
        ctx.report(
            "AMP042",
            call,
            f"{path} with gradient_average chosen at run time: torch DDP averages; where it is False (a sum) "
            f"register after the wrap: `ddp_model.register_comm_hook(None, {hook})`",
        )
        return False
    if average is False:
        target = _assigned_to(ctx, call)
        if target is None:
            ctx.report(
                "AMP042",
                call,
                f"{path}(..., gradient_average=False) sums gradients: assign the wrapped model, then "
                f"`ddp_model.register_comm_hook(None, {hook})`",
            )
            return False
        after.append(cst.parse_statement(f"{syntax.code(target).strip()}.register_comm_hook(None, {hook})"))  # type: ignore[arg-type]
        notes.append("gradient_average=False became a communication hook that sums")
    kept = module_arg.with_changes(comma=cst.MaybeSentinel.DEFAULT, whitespace_after_arg=syntax.NO_SPACE)
    args = [kept]
    device, why = _device_ids(ctx, call, module_arg.value)
    if device is not None:
        args.append(syntax.keyword("device_ids", cst.parse_expression(f"[{device}]")))
    notes.insert(0, why)
    args.append(syntax.keyword("broadcast_buffers", cst.Name("False")))
    if (
        "message_size" in bound
        and values.get("delay_allreduce") is not True
        and "allreduce_trigger_params" not in bound
    ):
        size = syntax.code(syntax.strip_parens(bound["message_size"].value)).strip()
        args.append(syntax.keyword("bucket_cap_mb", cst.parse_expression(f"{size} * 4 / 2**20")))
        notes.append(f"message_size={size} elements became bucket_cap_mb (4-byte gradients)")
    args.append(syntax.keyword("find_unused_parameters", cst.Name("True")))
    dropped = [name for name in _SCHEDULING if name in bound]
    if "message_size" in bound and not any(arg.keyword and arg.keyword.value == "bucket_cap_mb" for arg in args):
        dropped.insert(0, "message_size")
    if dropped:
        notes.append(f"{', '.join(dropped)} dropped (scheduling only: torch overlaps the all-reduce with backward)")
    if "allreduce_always_fp32" in bound:
        notes.append(
            "allreduce_always_fp32 dropped: gradients are all-reduced in their dtype (float32 under autocast); where "
            "the model stays float16 (a `.half()`, Apex O2/O3 or FP16_Optimizer left in place) they would be summed "
            "in float16: register Apex's float32 all-reduce on the wrapped model, `ddp_model.register_comm_hook(None, "
            "lambda _, bucket: torch.distributed.all_reduce(bucket.buffer().float().div_("
            "torch.distributed.get_world_size()), async_op=True).get_future().then(lambda fut: "
            "bucket.buffer().copy_(fut.value()[0])))`"
        )
    args = [arg.with_changes(comma=cst.Comma(whitespace_after=syntax.ONE_SPACE)) for arg in args[:-1]] + [args[-1]]
    new = call.with_changes(func=syntax.dotted(TORCH_DDP), args=args, whitespace_before_args=syntax.NO_SPACE)
    ctx.plan.substitute(call, new)
    if after:
        ctx.plan.after[ctx.statement_of(call)].extend(after)
    ctx.plan.needs_torch_import = True
    ctx.consumed.add(root)
    ctx.report(
        "AMP041",
        call,
        f"{path} became {TORCH_DDP}: broadcast_buffers=False keeps buffers per process as Apex did; "
        "find_unused_parameters=True because Apex accepted parameters without gradients (remove it if every "
        "parameter gets one each step); " + "; ".join(notes),
    )
    return True


def _plan_allreduce_switches(ctx: ModuleContext) -> None:
    """``ddp.disable_allreduce()`` / ``enable_allreduce()`` statements of a migrated Apex DDP."""
    defined = {node.name.value for node in ctx.walk(ctx.module) if isinstance(node, cst.FunctionDef)}
    for call in ctx.nodes_of(cst.Call):
        func = call.func
        if not (isinstance(func, cst.Attribute) and func.attr.value in ("disable_allreduce", "enable_allreduce")):
            continue
        if call.args or func.attr.value in defined or ctx.skipped(call):
            continue
        expression = ctx.parent(call)
        if not isinstance(expression, cst.Expr):
            ctx.report(
                "AMP040",
                call,
                f"Apex DDP's {func.attr.value}() has no torch method: use the statement "
                f"`{syntax.code(func.value).strip()}.require_backward_grad_sync = "
                f"{func.attr.value == 'enable_allreduce'}` (or `with ddp_model.no_sync():`)",
            )
            continue
        flag = "True" if func.attr.value == "enable_allreduce" else "False"
        target = cst.Attribute(value=func.value, attr=cst.Name("require_backward_grad_sync"))
        ctx.plan.substitute(expression, cst.Assign(targets=[cst.AssignTarget(target)], value=cst.Name(flag)))
        ctx.report(
            "AMP041",
            call,
            f"{func.attr.value}() became require_backward_grad_sync = {flag} (what torch's no_sync sets)",
        )


def plan(ctx: ModuleContext) -> None:
    migrated_ddp = False
    unmigrated_ddp = False
    # Apex DDP named in a check, an annotation, or stored for checks only: torch's class once every
    # Apex DDP this module builds is torch's (else the check would stop matching the ones left)
    class_uses: list[tuple[cst.BaseExpression, cst.Name]] = []
    # the Apex DDP calls, planned once every use of the class is known (see _kept_class_value)
    ddp_calls: list[tuple[cst.Call, str, cst.Name]] = []
    kept_value: cst.BaseExpression | None = None
    helper_names: dict[str, str] = {}
    amp_stays: bool | None = None  # worked out at the first LARC
    for name in ctx.reference_names():
        if any(isinstance(a, (cst.Import, cst.ImportFrom)) for a in ctx.ancestors(name)):
            continue
        found = None
        reference: cst.BaseExpression = name
        while True:  # the shortest `a.b.c` prefix that names an Apex object handled here
            found = ctx.apex_path(reference)
            if found is not None and _handled(found[0]):
                break
            parent = ctx.parent(reference)
            if not (isinstance(parent, cst.Attribute) and parent.value is reference):
                found = None
                break
            reference = parent
        if found is None:
            continue
        path, root = found
        holder = ctx.parent(reference)
        is_call = isinstance(holder, cst.Call) and holder.func is reference
        apex_name = path.rpartition(".")[2]
        if path in _DDP_PATHS:
            if ctx.skipped(reference):
                continue
            if is_call:
                ddp_calls.append((holder, path, root))  # type: ignore[arg-type]
            elif (
                _in_type_check(ctx, reference)
                or _in_annotation(ctx, reference)
                or _stored_for_checks(ctx, reference) is not None
            ):
                class_uses.append((reference, root))
            elif (
                kept_value is None
                and not _is_class_base(ctx, reference)
                and not (isinstance(reference, cst.Name) and not reads_variable(ctx, reference))
                and not (isinstance(reference, cst.Name) and is_import_fallback(ctx, reference))
                and not checks_presence(ctx, reference)  # `if DDP is None: raise ...` tests the import only
            ):
                kept_value = reference
            # other uses (a subclass, the class stored or passed) keep Apex: amp_import reports them
        elif path in _RENAMED:
            if ctx.skipped(reference):
                continue
            ctx.plan.substitute(reference, syntax.dotted(_RENAMED[path]))
            ctx.plan.needs_torch_import = True
            ctx.consumed.add(root)
        elif apex_name in _HELPERS and path in _HELPERS[apex_name][0]:
            if ctx.skipped(reference):
                continue
            if apex_name == "LARC":
                if amp_stays is None:
                    amp_stays = bool(setup.leftovers(ctx))
                if amp_stays:
                    _keep_larc(ctx, holder if is_call else None)
                    continue
            helper = helper_names.get(apex_name)
            if helper is None:
                helper = helper_names[apex_name] = _helper_name(ctx, apex_name)
                template = _HELPERS[apex_name][1]
                ctx.plan.module_helpers.append(cst.parse_statement(template.format(name=helper)))
                ctx.plan.needs_torch_import = True
            if not (isinstance(reference, cst.Name) and reference.value == helper):
                ctx.plan.substitute(reference, cst.Name(helper))
            ctx.consumed.add(root)
            if is_call and holder is not None:
                ctx.report("AMP041", holder, f"{path}: {_HELPER_NOTES[apex_name]}")
    untrained = _untrained_wraps(ctx, ddp_calls)
    for call, path, root in ddp_calls:
        if id(call) in untrained:
            wrapped, trained, line = untrained[id(call)]
            if not trained:
                ctx.report(
                    "AMP042",
                    call,
                    f"{path} left as it was: line {line} freezes every parameter of `{wrapped}`, and "
                    f"{TORCH_DDP} is built for parameters that get gradients (it raises RuntimeError when built over "
                    "a module without one), where Apex's wrapper only ran the forward of a frozen module: drop the "
                    f"wrap and keep `{wrapped}` as it is",
                )
                unmigrated_ddp = True
                continue
            ctx.report(
                "AMP042",
                call,
                f"{path} left as it was: nothing in this module trains the parameters of `{wrapped}` (no "
                f"`{wrapped}.parameters()`, where `{trained}.parameters()` on line {line} goes to training), so it may "
                f"have none that requires a gradient (an augmentation or a frozen network), and {TORCH_DDP} raises "
                "RuntimeError on such a module where Apex's wrapper only ran its forward: if it has none, drop the "
                f"wrap and keep `{wrapped}` as it is; otherwise write `{TORCH_DDP}({wrapped}, broadcast_buffers=False, "
                "find_unused_parameters=True)`",
            )
            unmigrated_ddp = True
            continue
        if kept_value is not None:
            # the class stays Apex's where it is a value (`wrappers = (nn.DataParallel, DDP)` passed on):
            # a torch DDP built here would no longer match it
            ctx.report(
                "AMP040",
                call,
                f"{path} left as it was: the class is also used as a value on line {ctx.position(kept_value)[0]}, "
                f"which keeps Apex's class there and would stop matching a {TORCH_DDP} built here: name "
                f"{TORCH_DDP} there and here (`{TORCH_DDP}(module, broadcast_buffers=False, "
                "find_unused_parameters=True)`), then run ampmigrate again",
            )
            unmigrated_ddp = True
            continue
        done = _rewrite_ddp(ctx, call, path, root)
        migrated_ddp |= done
        unmigrated_ddp |= not done
    if migrated_ddp:
        _plan_allreduce_switches(ctx)
    if not unmigrated_ddp:
        for reference, root in class_uses:
            ctx.plan.substitute(reference, syntax.dotted(TORCH_DDP))
            ctx.plan.needs_torch_import = True
            ctx.consumed.add(root)
            variable = _stored_for_checks(ctx, reference)
            if variable is not None:
                ctx.report(
                    "AMP041",
                    reference,
                    f"apex.parallel.DistributedDataParallel stored in `{variable}` became {TORCH_DDP}: `{variable}` is "
                    f"only used in isinstance/issubclass checks, and the Apex DDP calls become {TORCH_DDP} (in other "
                    "modules too, when they are migrated)",
                )


def _untrained_wraps(
    ctx: ModuleContext, ddp_calls: list[tuple[cst.Call, str, cst.Name]]
) -> dict[int, tuple[str, str, int]]:
    """The Apex DDP calls whose module (a plain name) this module never takes the parameters of
    (``x.parameters()``, ``x.named_parameters()``) and only runs, moves or wraps, while another
    name wrapped in a DDP here has its parameters taken:
    ``augment = DDP(augment)`` beside ``net = DDP(net)`` and ``SGD(net.parameters())``. Such a
    module may have no parameter that requires a gradient (buffers only, frozen), which torch's
    DDP refuses with RuntimeError and Apex's wrapped anyway. Keyed by the call's id: (its name, the
    trained name, the line of that name's parameters)."""
    wrapped: dict[int, str] = {}
    for call, _path, _root in ddp_calls:
        bound = syntax.bind_arguments(call, _DDP_PARAMETERS)
        module = bound.get("module") if bound is not None else None
        if module is not None and isinstance(module.value, cst.Name):
            wrapped[id(call)] = module.value.value
    if not wrapped:
        return {}
    trained: dict[str, int] = {}
    others: set[str] = set()  # the names wrapped in any DDP here, torch's included (a second pass)
    for node in ctx.walk(ctx.module):
        if (
            isinstance(node, cst.Call)
            and (dotted_name(node.func) or "").endswith("DistributedDataParallel")
            and node.args
            and isinstance(node.args[0].value, cst.Name)
        ):
            others.add(node.args[0].value.value)
        if (
            isinstance(node, cst.Attribute)
            and node.attr.value in ("parameters", "named_parameters")
            and isinstance(node.value, cst.Name)
        ):
            line = ctx.position(node)[0]
            trained[node.value.value] = min(line, trained.get(node.value.value, line))
    frozen = _frozen(ctx)
    seen = sorted(name for name in others | set(wrapped.values()) if name in trained and name not in frozen)
    calls = {id(call) for call, _path, _root in ddp_calls}
    found: dict[int, tuple[str, str, int]] = {}
    lines = {id(call): ctx.position(call)[0] for call, _path, _root in ddp_calls}
    for key, name in wrapped.items():
        if frozen.get(name, lines[key]) < lines[key]:
            # frozen before the wrap; one frozen after it (MiB's teacher) still had trainable
            # parameters when torch's DDP was built, and a no-grad forward never reduces
            found[key] = (name, "", frozen[name])
        elif seen and name not in trained and _only_run_here(ctx, name, calls) and not _has_weights(ctx, name):
            found[key] = (name, seen[0], trained[seen[0]])
    return found


def _frozen(ctx: ModuleContext) -> dict[str, int]:
    """The names whose every parameter this module freezes, by the line: ``x.requires_grad_(False)``,
    ``for p in x.parameters(): p.requires_grad = False``."""
    found: dict[str, int] = {}
    for node in ctx.walk(ctx.module):
        target = None
        if (
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Attribute)
            and node.func.attr.value == "requires_grad_"
            and node.args
            and syntax.literal(node.args[0].value) is False
        ):
            target = node.func.value
        elif (
            isinstance(node, cst.For) and isinstance(node.iter, cst.Call) and isinstance(node.iter.func, cst.Attribute)
        ):
            if node.iter.func.attr.value == "parameters" and any(
                isinstance(inner, cst.Assign)
                and isinstance(inner.targets[0].target, cst.Attribute)
                and inner.targets[0].target.attr.value == "requires_grad"
                and syntax.literal(inner.value) is False
                for inner in ctx.walk(node.body)
            ):
                target = node.iter.func.value
        if isinstance(target, cst.Name):
            found.setdefault(target.value, ctx.position(node)[0])
    return found


def _has_weights(ctx: ModuleContext, name: str) -> bool:
    """Whether ``name`` is given weights here (``X.from_pretrained(...)``, ``name.load_state_dict``):
    a network with parameters, which require gradients unless frozen."""
    for node in ctx.walk(ctx.module):
        if (
            isinstance(node, cst.Assign)
            and any(isinstance(t.target, cst.Name) and t.target.value == name for t in node.targets)
            and isinstance(node.value, cst.Call)
            and (dotted_name(node.value.func) or "").endswith(".from_pretrained")
        ):
            return True
        if (
            isinstance(node, cst.Attribute)
            and node.attr.value == "load_state_dict"
            and isinstance(node.value, cst.Name)
            and node.value.value == name
        ):
            return True
    return False


def _only_run_here(ctx: ModuleContext, name: str, ddp_calls: set[int]) -> bool:
    """Whether every read of ``name`` in this module runs it, moves it or wraps it (``x(batch)``,
    ``x.to(device)``, ``x.eval()``, the Apex DDP calls): none hands it to code that could train
    its parameters (an optimizer factory, amp.initialize, a trainer)."""
    for node in ctx.walk(ctx.module):
        if not (isinstance(node, cst.Name) and node.value == name):
            continue
        parent = ctx.parent(node)
        if isinstance(parent, (cst.AssignTarget, cst.Param)) or (
            isinstance(parent, cst.Attribute) and parent.attr is node
        ):
            continue
        if isinstance(parent, cst.Call) and parent.func is node:
            continue  # its forward
        if isinstance(parent, cst.Attribute) and parent.value is node:
            if parent.attr.value in ("to", "cuda", "cpu", "eval", "train", "float", "half", "module"):
                continue
            return False
        if isinstance(parent, cst.Arg):
            call = ctx.parent(parent)
            if id(call) in ddp_calls or (
                isinstance(call, cst.Call)
                and (dotted_name(call.func) or "").rpartition(".")[2]
                in ("convert_syncbn_model", "convert_sync_batchnorm")
            ):
                continue
        return False
    return True


def _stored_for_checks(ctx: ModuleContext, reference: cst.BaseExpression) -> str | None:
    """The variable of ``DDP = torch_ddp if c else ApexDDP`` (or of a tuple or list of classes holding
    it: ``valid = list((Net, nn.DataParallel, DDP))``) when every use of it is the class of an
    ``isinstance`` / ``issubclass`` check (or an annotation), and nothing outside the module reaches it."""
    store = stored_in(ctx, _class_collection(ctx, reference))
    if store is None:
        return None
    target = store.targets[0].target
    if not isinstance(target, cst.Name) or isinstance(ctx.scope_of(store), cst.ClassDef):
        return None
    if reached_from_outside(ctx, ctx.scope_of(store), target.value) is not None:
        return None
    for name in ctx.nodes_of(cst.Name):
        if name.value != target.value:
            continue
        if not reads_variable(ctx, name):
            continue
        if not (_in_type_check(ctx, name) or _in_annotation(ctx, name)):
            return None
    return target.value


def _keep_larc(ctx: ModuleContext, call: cst.CSTNode | None) -> None:
    """Apex's LARC stays where Apex amp stays: its amp.initialize takes a torch optimizer or Apex's
    own LARC and raises TypeError on any other wrapper, a plain-torch LARC included."""
    if call is None:
        return
    ctx.report(
        "AMP040",
        call,
        "apex.parallel.LARC kept: Apex amp stays in this module (see its findings) and its amp.initialize "
        "accepts only a torch optimizer or Apex's own LARC; once the amp setup is migrated, ampmigrate writes "
        "`class LARC` in plain torch (each gradient, plus `weight_decay * p`, scaled by "
        "trust_coefficient * |w| / (|g| + weight_decay * |w| + eps), over the group's lr and capped at 1 "
        "when clip=True, then the wrapped optimizer steps with its weight decay off)",
    )


def _handled(path: str) -> bool:
    name = path.rpartition(".")[2]
    return path in _DDP_PATHS or path in _RENAMED or (name in _HELPERS and path in _HELPERS[name][0])


def _class_collection(ctx: ModuleContext, reference: cst.BaseExpression) -> cst.BaseExpression:
    """The outermost tuple or list literal holding ``reference`` among its elements, through
    ``tuple(...)`` / ``list(...)`` of it (``list((Net, nn.DataParallel, DDP))``); else ``reference``."""
    current = reference
    while True:
        element = ctx.parent(current)
        container = ctx.parent(element) if isinstance(element, cst.Element) else None
        if isinstance(container, (cst.Tuple, cst.List)) and element.value is current:  # type: ignore[union-attr]
            current = container
            continue
        if _copied_collection(ctx, current) is None:
            return current
        current = _copied_collection(ctx, current)  # type: ignore[assignment]


def _copied_collection(ctx: ModuleContext, node: cst.CSTNode) -> cst.Call | None:
    """The ``tuple(node)`` / ``list(node)`` call ``node`` is the only argument of."""
    arg = ctx.parent(node)
    call = ctx.parent(arg) if isinstance(arg, cst.Arg) else None
    if (
        isinstance(call, cst.Call)
        and isinstance(call.func, cst.Name)
        and call.func.value in ("tuple", "list")
        and len(call.args) == 1
        and call.args[0] is arg
        and not arg.star  # type: ignore[union-attr]
        and arg.keyword is None  # type: ignore[union-attr]
    ):
        return call
    return None


def _in_type_check(ctx: ModuleContext, reference: cst.BaseExpression) -> bool:
    """Inside the class argument of ``isinstance`` / ``issubclass`` (through tuple and list
    literals and ``tuple(...)`` / ``list(...)`` of them)."""
    for ancestor in ctx.ancestors(reference):
        if isinstance(ancestor, cst.Call):
            if any(_copied_collection(ctx, arg.value) is ancestor for arg in ancestor.args):
                continue
            return (
                isinstance(ancestor.func, cst.Name)
                and ancestor.func.value in ("isinstance", "issubclass")
                and len(ancestor.args) == 2
                and any(node is reference for node in ctx.walk(ancestor.args[1]))
            )
        if not isinstance(ancestor, (cst.Tuple, cst.List, cst.Element, cst.Arg)):
            return False
    return False


def _is_class_base(ctx: ModuleContext, reference: cst.BaseExpression) -> bool:
    """The base of a class statement (``class MyDDP(DDP):``): its objects are built from the subclass."""
    arg = ctx.parent(reference)
    return isinstance(arg, cst.Arg) and isinstance(ctx.parent(arg), cst.ClassDef)


def _in_annotation(ctx: ModuleContext, reference: cst.BaseExpression) -> bool:
    """Inside a parameter, return or variable annotation: the object there is torch's DDP now."""
    return any(isinstance(ancestor, cst.Annotation) for ancestor in ctx.ancestors(reference))


def _helper_name(ctx: ModuleContext, apex_name: str) -> str:
    """Apex's own name unless the module binds it to something else."""
    taken = any(apex_name in names for names in ctx.locals.values())
    return ctx.fresh_name(apex_name) if taken else apex_name
