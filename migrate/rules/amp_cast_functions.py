'''amp_cast_functions: ``@amp.float_function``, ``@amp.half_function``, ``@amp.promote_function``,
their call form ``amp.float_function(lib.fn)`` and ``amp.register_*_function(module, "name")``.

What it rewrites
    Each becomes a small plain-torch decorator written once into the module, named like the
    Apex function it replaces. ``amp.register_float_function(torch, "sigmoid")`` becomes
    ``torch.sigmoid = float_function(torch.sigmoid)`` in the same place (Apex patched the same
    attribute when amp.initialize ran).

Before::

    from maskrcnn_benchmark import _C

    from apex import amp

    # Only valid with fp32 inputs
    nms = amp.float_function(_C.nms)

After::

    import torch
    from maskrcnn_benchmark import _C


    def float_function(fn):
        """apex.amp.float_function in torch.amp terms: under "cuda" autocast, fn gets its
        floating-point "cuda" tensor arguments in float32 and runs with autocast off."""

        def run_in_float32(*args, **kwargs):
            if not torch.is_autocast_enabled("cuda"):
                return fn(*args, **kwargs)
            args, kwargs = cast_floating_arguments(args, kwargs, torch.float32)
            with torch.autocast("cuda", enabled=False):
                return fn(*args, **kwargs)

        return run_in_float32


    def cast_floating_arguments(args, kwargs, dtype):
        """args and kwargs with their floating-point "cuda" tensors cast to dtype; as in Apex, a
        list or tuple is cast only when it holds nothing but floating-point tensors."""

        def floating(value):
            if isinstance(value, (list, tuple)):
                return all(floating(item) for item in value)
            return isinstance(value, torch.Tensor) and value.is_floating_point()

        def cast(value):
            if isinstance(value, (list, tuple)):
                return type(value)(cast(item) for item in value)
            return value.to(dtype) if value.device.type == "cuda" else value

        args = tuple(cast(arg) if floating(arg) else arg for arg in args)
        kwargs = {key: cast(value) if floating(value) else value for key, value in kwargs.items()}
        return args, kwargs


    # Only valid with fp32 inputs
    nms = float_function(_C.nms)

When the helpers cast (what Apex did, and why the helpers do it this way)
    Apex's wrappers did nothing unless O1's handle was active: after ``amp.initialize`` at
    O1, outside ``amp.disable_casts()``. The migration turns O1 into ``torch.autocast``
    regions and ``disable_casts`` into ``autocast(enabled=False)``, so the helpers act while
    ``torch.is_autocast_enabled(device)`` holds. Apex cast floating-point CUDA tensors, other
    precisions included (float64 to float32 by float_function), and lists or tuples whose
    items are all floating-point tensors, nothing inside dicts; so do the helpers, on the
    ``--device`` type.

    - float_function: arguments to float32, then the body runs with autocast off, as
      ``torch.amp.custom_fwd(cast_inputs=torch.float32)`` and torchvision's own float32-only
      kernels do. This is the case the decorator exists for (a custom C++/CUDA kernel):
      autocast casts at the dispatcher, inside C++ extensions too, which Apex never did,
      so a float32-only kernel must not run under it.
    - half_function: arguments to the autocast dtype (``--dtype``; float16 as in Apex), the
      body runs under autocast as it is. Apex's casts stayed on inside the wrapped function
      too, and they must: a decorated ``nn.Module.forward`` gets float16 inputs while its
      layers keep float32 weights, which only autocast reconciles.
    - promote_function: when the floating-point tensor arguments mix exactly the autocast
      dtype and float32, they all become float32; otherwise they pass as they are. The body
      runs under autocast as it is.

    ``torch.amp.custom_fwd`` itself is not used: it stores ``_dtype`` and
    ``_fwd_used_autocast`` on its first argument (an autograd ``ctx``), which breaks on a
    plain function whose first argument is a float or ``None`` and writes attributes onto a
    tensor or an ``nn.Module`` otherwise, and it casts into dicts and any iterable (an
    ``nn.ModuleList`` argument included).

Not rewritten (reported instead)
    The decorator on an autograd Function's ``backward`` (autograd runs it outside autocast,
    where Apex still cast the gradients: write ``torch.amp.custom_fwd``/``custom_bwd``);
    ``register_*_function`` after ``amp.initialize`` in the same function (Apex ignored it:
    delete the call), inside an expression, or with a module that is not a name or an
    attribute chain (``importlib.import_module(...)``); a call with other than one function;
    the functions used as values (AMP032, the last from amp_import). A computed name is
    rewritten with ``setattr``/``getattr``.

Safety
    A float_function body written in Python now runs in float32 throughout (AMP013 notes it):
    under Apex O1 the float16-list ops it called (matmul, conv, linear) still ran in float16.
    promote_function passes mixes other than float16/float32 through where Apex raised
    NotImplementedError. half_function casts with ``.to()`` each call, without Apex's cache
    of float16 weights (the same values). A registration takes effect at once and under
    every autocast region, where Apex applied it only if made before an O1 amp.initialize.

References
    NVIDIA/apex@e13873d: apex/amp/amp.py (half_function, float_function, promote_function,
    register_*), apex/amp/wrap.py (make_cast_wrapper, make_promote_wrapper), apex/amp/utils.py
    (maybe_half, maybe_float, casted_args); pytorch/pytorch: torch/amp/autocast_mode.py
    (custom_fwd, _cast); ../shared/apex-semantics.md 1.5 and 9.
'''

from __future__ import annotations

import keyword

import libcst as cst

from migrate.rules import _syntax as syntax
from migrate.rules._bindings import dotted_name
from migrate.rules._context import ModuleContext, fresh_identifier

RULE = "amp_cast_functions"

# the Apex function -> the helper's kind
DECORATORS = {"half_function": "half", "float_function": "float", "promote_function": "promote"}
REGISTRATIONS = {
    "register_half_function": "half",
    "register_float_function": "float",
    "register_promote_function": "promote",
}
APIS = frozenset({*DECORATORS, *REGISTRATIONS})

_FLOAT = '''\
def {name}(fn):
    """apex.amp.float_function in torch.amp terms: under "{device}" autocast, fn gets its
    floating-point "{device}" tensor arguments in float32 and runs with autocast off."""

    def run_in_float32(*args, **kwargs):
        if not torch.is_autocast_enabled("{device}"):
            return fn(*args, **kwargs)
        args, kwargs = {cast}(args, kwargs, torch.float32)
        with torch.autocast("{device}", enabled=False):
            return fn(*args, **kwargs)

    return run_in_float32
'''

_HALF = '''\
def {name}(fn):
    """apex.amp.half_function in torch.amp terms: under "{device}" autocast, fn gets its
    floating-point "{device}" tensor arguments in {dtype} and runs under autocast as it is."""

    def run_in_{dtype}(*args, **kwargs):
        if torch.is_autocast_enabled("{device}"):
            args, kwargs = {cast}(args, kwargs, torch.{dtype})
        return fn(*args, **kwargs)

    return run_in_{dtype}
'''

_PROMOTE = '''\
def {name}(fn):
    """apex.amp.promote_function in torch.amp terms: under "{device}" autocast, when fn's
    floating-point tensor arguments mix {dtype} and float32, they all run in float32."""

    def dtypes(values):
        found = set()
        for value in values:
            if isinstance(value, (list, tuple)):
                found |= dtypes(value)
            elif isinstance(value, torch.Tensor) and value.is_floating_point():
                found.add(value.dtype)
        return found

    def run_promoted(*args, **kwargs):
        mixed = dtypes([*args, *kwargs.values()]) == {{torch.{dtype}, torch.float32}}
        if mixed and torch.is_autocast_enabled("{device}"):
            args, kwargs = {cast}(args, kwargs, torch.float32)
        return fn(*args, **kwargs)

    return run_promoted
'''

_CAST = '''\
def {name}(args, kwargs, dtype):
    """args and kwargs with their floating-point "{device}" tensors cast to dtype; as in Apex, a
    list or tuple is cast only when it holds nothing but floating-point tensors."""

    def floating(value):
        if isinstance(value, (list, tuple)):
            return all(floating(item) for item in value)
        return isinstance(value, torch.Tensor) and value.is_floating_point()

    def cast(value):
        if isinstance(value, (list, tuple)):
            return type(value)(cast(item) for item in value)
        return value.to(dtype) if value.device.type == "{device}" else value

    args = tuple(cast(arg) if floating(arg) else arg for arg in args)
    kwargs = {{key: cast(value) if floating(value) else value for key, value in kwargs.items()}}
    return args, kwargs
'''

_TEMPLATES = {"float": _FLOAT, "half": _HALF, "promote": _PROMOTE}


class _Helpers:
    """The helper functions this module needs, each written once (the cast helper last)."""

    def __init__(self, ctx: ModuleContext) -> None:
        self.ctx = ctx
        self.names: dict[str, str] = {}
        self.cast_name: str | None = None
        self._written: list[tuple[str, str]] = []
        self._taken: set[str] | None = None

    def name(self, kind: str) -> str:
        if kind not in self.names:
            if self._taken is None:
                self._taken = _identifiers(self.ctx)
            self.names[kind] = fresh_identifier(self._taken, f"{kind}_function", ("amp_",))
            if self.cast_name is None:
                self.cast_name = fresh_identifier(self._taken, "cast_floating_arguments", ("amp_",))
            self.ctx.all_names().update(self._taken)  # rules after this one avoid them too
            self._written.append((kind, self.names[kind]))
        return self.names[kind]

    def write(self) -> None:
        if not self._written:
            return
        options = self.ctx.options
        for kind, name in sorted(self._written, key=lambda pair: ("float", "half", "promote").index(pair[0])):
            text = _TEMPLATES[kind].format(name=name, device=options.device, dtype=options.dtype, cast=self.cast_name)
            self.ctx.plan.module_helpers.append(cst.parse_statement(text))
        self.ctx.plan.module_helpers.append(
            cst.parse_statement(_CAST.format(name=self.cast_name, device=options.device))
        )
        self.ctx.plan.needs_torch_import = True


def _identifiers(ctx: ModuleContext) -> set[str]:
    """The names the module binds or reads, and those other rules chose for new code
    (``amp.float_function``'s attribute name is none of them)."""
    found, everywhere = set(), set()
    for node in ctx.nodes_of(cst.Name):
        everywhere.add(node.value)
        parent = ctx.parent(node)
        if not (isinstance(parent, cst.Attribute) and parent.attr is node):
            found.add(node.value)
    return found | (ctx.all_names() - everywhere)


def _is_backward(ctx: ModuleContext, function: cst.FunctionDef) -> bool:
    """A ``backward`` method: autograd calls it outside autocast, where Apex still cast."""
    return function.name.value == "backward" and ctx.class_of_method(function) is not None


def _plan_decorators(ctx: ModuleContext, helpers: _Helpers) -> None:
    for decorator in ctx.nodes_of(cst.Decorator):
        found = ctx.amp_api(decorator.decorator)
        if found is None or found[0] not in DECORATORS:
            continue
        api, base = found
        function = ctx.parent(decorator)
        if not isinstance(function, cst.FunctionDef) or ctx.skipped(decorator):
            continue
        if _is_backward(ctx, function):
            dtype = "float32" if api == "float_function" else "float16"
            ctx.report(
                "AMP032",
                decorator,
                f"amp.{api} on an autograd Function's backward (autograd runs it outside autocast, where Apex "
                f'still cast): write `@torch.amp.custom_fwd(device_type="{ctx.options.device}", '
                f"cast_inputs=torch.{dtype})` on its forward and "
                f'`@torch.amp.custom_bwd(device_type="{ctx.options.device}")` on this backward',
            )
            continue
        name = helpers.name(DECORATORS[api])
        ctx.plan.substitute(decorator.decorator, cst.Name(name))
        ctx.consumed.add(base)
        if api == "float_function":
            ctx.report(
                "AMP013",
                decorator,
                f"{function.name.value} runs with autocast off, in float32 throughout, where Apex O1 still ran "
                "the float16-list ops it calls (matmul, conv, linear) in float16; a custom kernel behind it "
                "sees the float32 inputs it saw under Apex",
            )


def _plan_wrapping_calls(ctx: ModuleContext, helpers: _Helpers) -> None:
    """``amp.float_function(fn)`` anywhere: the helper called on the same function."""
    for use in ctx.amp.calls:
        if use.api not in DECORATORS or ctx.skipped(use.call):
            continue
        bound = syntax.bind_arguments(use.call, ("fn",))
        if bound is None or "fn" not in bound:
            ctx.report(
                "AMP032",
                use.call,
                f"amp.{use.api} takes one function: write `amp.{use.api}(fn)` once per function and run ampmigrate "
                "again",
            )
            continue
        name = helpers.name(DECORATORS[use.api])
        ctx.plan.substitute(use.call.func, cst.Name(name))
        ctx.consumed.add(use.base)


def _registered(call: cst.Call) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
    """The module and name expressions of ``register_*_function(module, name)``, when both
    may be evaluated twice (names, attribute chains, string literals)."""
    bound = syntax.bind_arguments(call, ("module", "name"))
    if bound is None or set(bound) != {"module", "name"}:
        return None
    module, name = (syntax.strip_parens(bound[key].value) for key in ("module", "name"))
    if dotted_name(module) is None:
        return None
    if dotted_name(name) is None and not isinstance(syntax.literal(name), str):
        return None
    return module, name


def _attribute(name: cst.BaseExpression) -> str | None:
    """The attribute a string literal names, if it can be written ``module.<it>``."""
    value = syntax.literal(name)
    if isinstance(value, str) and value.isidentifier() and not keyword.iskeyword(value):
        return value
    return None


def _registration(module: cst.BaseExpression, name: cst.BaseExpression, helper: str) -> cst.BaseSmallStatement:
    """``module.name = helper(module.name)``, or with setattr/getattr when the name is computed."""
    attribute = _attribute(name)
    if attribute is not None:
        return cst.Assign(
            targets=[cst.AssignTarget(cst.Attribute(module, cst.Name(attribute)))],
            value=cst.Call(cst.Name(helper), [cst.Arg(cst.Attribute(module, cst.Name(attribute)))]),
        )
    current = syntax.call("getattr", [cst.Arg(module), cst.Arg(name)])
    wrapped = cst.Call(cst.Name(helper), [cst.Arg(current)])
    return cst.Expr(syntax.call("setattr", [cst.Arg(module), cst.Arg(name), cst.Arg(wrapped)]))


def _after_initialize(ctx: ModuleContext, call: cst.Call) -> bool:
    """An ``amp.initialize`` earlier in the same function (or module body) has already run, and
    no ``amp.init()`` after the registration reads the registry again (hirofumi0810/neural_sp:
    ``amp.register_float_function(CTC, "loss_fn")`` then ``amp.init()`` after the initialize)."""
    scope = ctx.scope_of(call)
    if any(ctx.scope_of(init.call) is scope and ctx.order(init.call) > ctx.order(call) for init in ctx.amp.of("init")):
        return False
    return any(
        ctx.scope_of(init.call) is scope and ctx.order(init.call) < ctx.order(call) for init in ctx.amp.of("initialize")
    )


def _plan_registrations(ctx: ModuleContext, helpers: _Helpers) -> None:
    for use in ctx.amp.calls:
        if use.api not in REGISTRATIONS or ctx.skipped(use.call):
            continue
        call = use.call
        kind = REGISTRATIONS[use.api]
        statement = ctx.parent(call)
        registered = _registered(call)
        if not isinstance(statement, cst.Expr) or registered is None:
            ctx.report(
                "AMP032",
                call,
                f"amp.{use.api} is migrated only as a statement of its own whose module is a name or attribute "
                f"chain: bind the module to a name first (`module = ...`, then `amp.{use.api}(module, name)`) and "
                "run ampmigrate again",
            )
            continue
        if _after_initialize(ctx, call):
            wanted = syntax.code(_registration(*registered, f"{kind}_function"))
            ctx.report(
                "AMP032",
                call,
                f"amp.{use.api} after amp.initialize did nothing in Apex (amp.initialize reads the registry once): "
                f"delete the call, or write `{wanted}` before the training loop if the cast is wanted",
            )
            continue
        replacement = _registration(*registered, helpers.name(kind))
        ctx.plan.substitute(statement, replacement.with_changes(semicolon=statement.semicolon))
        ctx.consumed.add(use.base)


def plan(ctx: ModuleContext) -> None:
    helpers = _Helpers(ctx)
    _plan_decorators(ctx, helpers)
    _plan_wrapping_calls(ctx, helpers)
    _plan_registrations(ctx, helpers)
    helpers.write()
