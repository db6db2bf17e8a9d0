"""The Apex amp setup of a module, judged as a whole: migrated completely, or not at all.

``amp.initialize`` is only half of a setup: ``amp.scale_loss``, ``amp.master_params`` and
``amp.state_dict`` depend on it. Once ``initialize`` is gone, an Apex call left behind
crashes or trains differently (clipping scaled gradients, an unscaled backward). So after
the rules have planned their edits, ``run_rules`` asks this module whether any use of the
amp module is left over while another was rewritten; if so the module is planned again
with its amp setup *frozen*: the amp rules plan nothing, the Apex import stays, and each
``amp.initialize`` carries a finding (AMP025) that says why. Project mode freezes a whole
group of modules the same way (``ModuleFacts.frozen``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

import libcst as cst

from migrate import pytree
from migrate.project import looks_like_amp_call, says_amp
from migrate.rules import _syntax as syntax
from migrate.rules._bindings import Binding, bound_name, checks_presence, is_import_fallback
from migrate.rules._context import ModuleContext, dotted_name

# the rules that migrate the amp setup (the others, e.g. FusedAdam, run even when frozen)
AMP_SETUP_RULES = frozenset(
    {
        "amp_initialize",
        "amp_init",
        "amp_scale_loss",
        "amp_master_params",
        "amp_state_dict",
        "amp_private_state",
        "amp_disable_casts",
        "amp_cast_functions",
        "timm_apex_scaler",
        "hf_trainer_apex_backend",
    }
)


def amp_references(ctx: ModuleContext) -> Iterator[cst.Name]:
    """Every Name that stands for the apex.amp module (or a function from it) in code."""
    for node in ctx.reference_names():
        binding = ctx.resolve(node.value, node)
        if binding is None or not _is_amp(binding, node, ctx):
            continue
        if any(isinstance(a, (cst.Import, cst.ImportFrom)) for a in ctx.ancestors(node)):
            continue
        if is_import_fallback(ctx, node) or isinstance(ctx.parent(node), cst.NameItem):
            continue  # `global amp` goes with the import (amp_import)
        yield node


def _is_amp(binding: Binding, node: cst.Name, ctx: ModuleContext) -> bool:
    if binding.kind in ("amp", "amp_function"):
        return True
    if binding.kind == "other_apex" and binding.target == "apex.amp._amp_state._amp_state":
        return True  # Apex's private amp state: it needs Apex's amp.initialize to have run
    if binding.kind == "apex":  # `import apex` used as apex.amp.X
        parent = ctx.parent(node)
        return isinstance(parent, cst.Attribute) and parent.value is node and parent.attr.value == "amp"
    return False


def unsupported_shapes(ctx: ModuleContext) -> str | None:
    """Report amp code whose rewrite would be wrong in its place; the reason to freeze, if any.

    ``amp.initialize`` in a ``match`` case: each case would need its own scaler on every
    path. ``amp.master_params`` in a lambda: ``scaler.unscale_`` must run before each call,
    and a lambda has no statement to put it in.
    """
    reason = None
    for use in ctx.amp.calls:
        ancestors = list(ctx.ancestors(use.call))
        if use.api == "initialize" and any(isinstance(a, cst.MatchCase) for a in ancestors):
            ctx.report(
                "AMP010",
                use.call,
                "amp.initialize inside a match/case: delete the calls and create one "
                '`scaler = torch.amp.GradScaler("cuda", enabled=...)` before the `match`, then run ampmigrate again',
            )
        elif use.api == "master_params" and any(isinstance(a, cst.Lambda) for a in ancestors):
            ctx.report(
                "AMP022",
                use.call,
                "amp.master_params inside a lambda: scaler.unscale_(optimizer) must run before each call; "
                "make the lambda a def and run ampmigrate again",
            )
        else:
            continue
        reason = reason or f"amp.{use.api} at line {ctx.position(use.call)[0]} cannot be migrated in its place"
    return reason


def leftovers(ctx: ModuleContext) -> list[cst.CSTNode]:
    """Uses of the amp module (and of the old API's handles) that the plan does not rewrite away.

    "Is Apex installed?" checks (``assert amp is not None``) are not counted: they keep
    working beside torch.amp and change nothing in training.
    """
    left: list[cst.CSTNode] = [
        name for name in amp_references(ctx) if name not in ctx.consumed and not checks_presence(ctx, name)
    ]
    left += ctx.unfinished
    if ctx.carriers.any:
        left += ctx.carriers.leftovers()
    return left + ctx.handles.leftovers() if ctx.handles.any else left


def migrated_any(ctx: ModuleContext) -> bool:
    """Whether the plan rewrites some use of the amp module (or a call through an object that carries it)."""
    return any(name in ctx.consumed for name in amp_references(ctx)) or (
        ctx.carriers.any and ctx.carriers.migrated_any()
    )


def why_left(ctx: ModuleContext, names: list[cst.CSTNode]) -> str:
    """A phrase naming the first use that could not be migrated, for AMP025."""
    first = min(names, key=lambda name: ctx.position(name))
    line = ctx.position(first)[0]
    if isinstance(first, cst.Call):  # a library helper that runs amp inside (timm's ApexScaler)
        arguments = "(...)" if first.args else "()"
        return f"`{syntax.code(first.func)}{arguments}` at line {line} could not be migrated (see its finding)"
    if not isinstance(first, cst.Name) or ctx.resolve(first.value, first) is None:
        return f"{ctx.handles.describe(first)} could not be migrated (see its finding)"
    binding = ctx.resolve(first.value, first)
    if binding is not None and binding.target in ("_amp_state", "apex.amp._amp_state._amp_state"):
        return f"Apex's private _amp_state at line {line} has no native equivalent here (see its finding)"
    # the amp function it names: `amp.f`, `apex.amp.f`, or `f` imported from apex.amp
    expression: cst.BaseExpression = first
    found = ctx.amp_api(first)
    parent = ctx.parent(first)
    while found is None and isinstance(parent, cst.Attribute) and parent.value is expression:
        found = ctx.amp_api(parent)
        expression, parent = parent, ctx.parent(parent)
    if found is not None:
        api = found[0]
        if (isinstance(parent, cst.Call) and parent.func is expression) or isinstance(parent, cst.Decorator):
            if any(f.code == "AMP050" and f.line == line for f in ctx.findings):
                return f"amp.{api} at line {line} is kept by `# ampmigrate: skip`"
            return f"amp.{api} at line {line} could not be migrated (see its finding)"
        return f"amp.{api} at line {line} has no native equivalent (see its finding)"
    if isinstance(parent, cst.Attribute) and parent.value is first:
        return f"amp.{parent.attr.value} at line {line} has no native equivalent (see its finding)"
    return f"the amp module is stored or passed as a value at line {line} (see its finding)"


def report_frozen(ctx: ModuleContext, reason: str) -> None:
    """AMP025 at each ``amp.initialize`` (or, without one, at the first amp use)."""
    anchors: list[cst.CSTNode] = []
    for name in amp_references(ctx):
        parent = ctx.parent(name)
        call = ctx.parent(parent) if isinstance(parent, cst.Attribute) else parent
        api = ctx.amp_api(call.func) if isinstance(call, cst.Call) else None
        if api is not None and api[0] in ("initialize", "init") and call is not None:
            anchors.append(call)
    if not anchors:
        anchors.extend(sorted(amp_references(ctx), key=ctx.position)[:1])
    if not anchors and ctx.carriers.any and all(finding.fixed for finding in ctx.findings):
        # only calls through an attribute that carries the amp module (`self.amp.scale_loss`)
        # the call of `self.amp.scale_loss(...)` holds its `self.amp.scale_loss`, which holds the base
        calls = [ctx.parent(base) for base in (*ctx.carriers.bases, *ctx.carriers.plain_bases)]
        found = [ctx.parent(func) for func in calls if func is not None]
        anchors.extend(sorted((call for call in found if call is not None), key=ctx.position)[:1])
    for anchor in anchors:
        ctx.report("AMP025", anchor, f"the Apex amp setup was left exactly as it was: {reason}")


def report_unseen_amp(ctx: ModuleContext) -> int:
    """AMP026 for amp functions called on names no Apex import binds here; returns how many."""
    count = 0
    imported: set[str] | None = None
    for call in ctx.nodes_of(cst.Call):
        func = call.func
        if not isinstance(func, cst.Attribute):
            continue
        if isinstance(func.value, cst.Attribute) and says_amp(func.value.attr.value):
            # `self.amp.scale_loss(...)`: the module stored on an object
            name = dotted_name(func.value) or func.value.attr.value
        elif isinstance(func.value, cst.Name):
            name = func.value.value
        else:
            continue
        api = func.attr.value
        if not looks_like_amp_call(name, api) or ctx.amp_api(func) is not None:
            continue
        if api in ("state_dict", "load_state_dict") and "scaler" in name.rsplit(".", 1)[-1].lower():
            continue  # `self.amp_grad_scaler.state_dict()`: a GradScaler's own checkpoint, not Apex's
        if imported is None:
            imported = _imported_names(ctx.source)
        if name in imported:
            continue  # another library's amp (mxnet.contrib.amp, ...)
        if ctx.dropped and any(ancestor in ctx.dropped for ancestor in ctx.ancestors(call)):
            continue  # in code the plan drops (a branch that never runs)
        count += 1
        local = _bound_in_another_function(ctx, call, name) if isinstance(func.value, cst.Name) else None
        if local is not None:
            line, owner = local
            ctx.report(
                "AMP026",
                call,
                f"`{name}.{api}(...)`: nothing binds `{name}` here: the Apex import at line {line} binds a local "
                f"name of `{owner}` only, so this line raises NameError when it runs, before any migration; "
                f"import amp at module level (`from apex import amp`) or keep it on the object (`self.{name} = "
                f"{name}` beside that import, `self.{name}.{api}(...)` here), then run ampmigrate again: left as it was",
            )
            continue
        # only for a name that says amp: `optimizer.scale_loss(...)` may be the project's own method
        form = _scaler_form(name, api, call) if says_amp(name.rsplit(".", 1)[-1]) else None
        held = _factory_result(ctx, call, name)
        if held is not None:
            ctx.report(
                "AMP026",
                call,
                f"`{name}.{api}(...)`: `{name}` holds what `{held[0]}` returns ({held[1]}), the Apex amp module or "
                "None, and ampmigrate does not follow the module out of that function (see the AMP030 at its "
                "`return`): left as it was"
                + _written_instead(name, api, form)
                + (f"; where `{name}` held None, it keeps holding None" if form and api == "initialize" else ""),
            )
            continue
        receiver = _parameter_of(ctx, call, name) if isinstance(func.value, cst.Name) and says_amp(name) else None
        if receiver is not None:
            ctx.report(
                "AMP026",
                call,
                f"`{name}.{api}(...)`: `{name}` is a parameter of `{receiver}`, and what its callers pass (the Apex "
                "amp module, a handle, None) is not migrated with it: left as it was. Once they pass the GradScaler "
                f"that replaces amp.initialize, write {_scaler_form(name, api, call) or 'the code of its finding'}",
            )
            continue
        ctx.report(
            "AMP026",
            call,
            f"`{name}.{api}(...)`: `{name}` looks like the Apex amp module, but no Apex import binds it "
            "here (stored on an object, passed as a parameter, brought by a star import or a notebook's %run): "
            "left as it was" + _written_instead(name, api, form),
        )
    return count


def _written_instead(name: str, api: str, form: str | None) -> str:
    """The end of AMP026: the GradScaler's code to write for ``name.api(...)``, if it has one."""
    if form is None:
        return ""
    if api == "initialize":
        return f". Write instead {form}"
    return (
        f". Once `{name}` holds the GradScaler that replaces amp.initialize (where the amp module was stored or "
        f"passed), write {form}"
    )


def _factory_result(ctx: ModuleContext, call: cst.Call, name: str) -> tuple[str, str] | None:
    """(the call, the function's place) where ``name`` holds, at ``call``, the result of a project function
    whose only results are the Apex amp module or None (``ModuleFacts.amp_factory_results``)."""
    kept = ctx.options.facts.amp_factory_results
    if not kept:
        return None
    function = ctx.function_of(call)
    if function is None:
        return None
    klass = ctx.class_of_method(function)
    for owner, method, holder, made, place in kept:
        if holder != name or owner != (klass.name.value if klass is not None else ""):
            continue
        if method == function.name.value or (holder.startswith("self.") and owner):
            return made, place
    return None


def _parameter_of(ctx: ModuleContext, call: cst.Call, name: str) -> str | None:
    """The function ``call`` is in, when ``name`` is one of its parameters (and nothing else binds it there)."""
    function = ctx.function_of(call)
    if function is None or name not in syntax.parameter_names(function):
        return None
    binds = [
        node
        for node in ctx.walk(function)
        if isinstance(node, cst.Name) and node.value == name and _binds(ctx, node) and ctx.function_of(node) is function
    ]
    return function.name.value if all(isinstance(ctx.parent(node), cst.Param) for node in binds) else None


def _scaler_form(name: str, api: str, call: cst.Call) -> str | None:
    """The GradScaler's code for ``name.api(...)`` (the ``name`` then holds the scaler); None
    for an amp function without a GradScaler counterpart."""
    arguments = ", ".join(syntax.code(arg.value) for arg in call.args if arg.keyword is None)
    if api == "load_state_dict":
        return (
            f"`{name}.load_state_dict(grad_scaler_state({arguments}))`, with the `grad_scaler_state` helper ampmigrate "
            "writes where it migrates amp.load_state_dict, so that a checkpoint Apex saved still loads"
        )
    if api == "state_dict":
        return f"`{name}.state_dict()` (the GradScaler's own)"
    if api == "scale_loss":
        return (
            f"`{name}.scale(loss).backward()` for the block, and `{name}.step(optimizer)`, `{name}.update()` for the "
            "optimizer's step, with the forward pass under `torch.autocast`"
        )
    if api == "master_params":
        return f"`{name}.unscale_(optimizer)` first, and the optimizer's own parameters"
    if api == "initialize":
        return (
            f'`{name} = torch.amp.GradScaler("cuda")` in place of the call (what it returned assigned back from its '
            "arguments, the models staying float32), with the forward pass and loss under "
            '`torch.autocast("cuda", dtype=torch.float16)`'
        )
    return None


def _bound_in_another_function(ctx: ModuleContext, call: cst.Call, name: str) -> tuple[int, str] | None:
    """(line, function) of an Apex import of ``name`` inside another function of the module, where
    nothing binds ``name`` for ``call`` (no parameter, assignment or import of its own function or of
    the module): the original fails there with NameError (lonePatient/Bert-Multi-Label-Text-
    Classification's Trainer imports amp in ``__init__`` and calls ``amp.scale_loss`` in
    ``train_epoch``)."""
    function = ctx.function_of(call)
    found = None
    for node in ctx.nodes_of(cst.ImportFrom):
        owner = ctx.function_of(node)
        if owner is None or owner is function or isinstance(node.names, cst.ImportStar):
            continue
        if node.module is None or node.relative or dotted_name(node.module) != "apex":
            continue
        for alias in node.names:
            if dotted_name(alias.name) == "amp" and bound_name(alias) == name:
                found = (ctx.position(node)[0], owner.name.value)
        if found is not None:
            break
    if found is None:
        return None
    # nothing else binds it: not the module, not the calling function, nor a function around it
    scopes: list[cst.CSTNode] = [ctx.module]
    current: cst.CSTNode | None = function
    while current is not None and current not in scopes:
        scopes.append(current)
        current = ctx.function_of(ctx.parent(current) or current)
    for other in ctx.walk(ctx.module):
        if isinstance(other, cst.Name) and other.value == name and _binds(ctx, other):
            scope = ctx.function_of(other)
            if (scope if scope is not None else ctx.module) in scopes:
                return None
        if isinstance(other, cst.Global) and any(item.name.value == name for item in other.names):
            return None
    return found


def _binds(ctx: ModuleContext, name: cst.Name) -> bool:
    """Whether ``name`` is bound where it stands (a target, parameter, import, definition)."""
    parent = ctx.parent(name)
    if isinstance(parent, (cst.AssignTarget, cst.Param, cst.AsName, cst.For, cst.CompFor, cst.NamedExpr)):
        return True
    if isinstance(parent, (cst.AnnAssign, cst.AugAssign)) and parent.target is name:
        return True
    if isinstance(parent, (cst.FunctionDef, cst.ClassDef)) and parent.name is name:
        return True
    if isinstance(parent, cst.ImportAlias):
        return parent.asname is None
    # a name inside a tuple or list target
    for ancestor in ctx.ancestors(name):
        if isinstance(ancestor, cst.AssignTarget):
            return True
        if not isinstance(ancestor, (cst.Tuple, cst.List, cst.Element, cst.StarredElement)):
            return False
    return False


def _imported_names(source: str) -> set[str]:
    """Names an import statement of the module binds from another library than Apex (the
    engine's own ast tree, reused). An Apex import that binds the name only in another scope
    (``from apex import amp`` inside ``__init__``) does not bind it where the call is."""
    try:
        tree = pytree.parse(source)
    except (SyntaxError, ValueError, RecursionError):
        return set()
    names: set[str] = set()
    # `global amp` beside `from apex import amp` in a function binds the module's name (as before)
    declared = {name for node in ast.walk(tree) if isinstance(node, ast.Global) for name in node.names}
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        for alias in node.names:
            bound = alias.asname or alias.name.split(".")[0]
            if isinstance(node, ast.ImportFrom):
                apex = (node.module or "").split(".")[0] == "apex" and not node.level
            else:
                apex = alias.name.split(".")[0] == "apex"
            if not apex or bound in declared:
                names.add(bound)
    return names


def bind_project_amp(ctx: ModuleContext, names: tuple[tuple[str, int], ...]) -> None:
    """Bind names that project imports bring in as apex.amp (``from common import *``)."""
    if not names:
        return
    by_line: dict[int, cst.ImportFrom] = {}
    for line_node in ctx.module.body:
        if isinstance(line_node, cst.SimpleStatementLine):
            for small in line_node.body:
                if isinstance(small, cst.ImportFrom):
                    by_line.setdefault(ctx.position(small)[0], small)
    for name, line in names:
        found = by_line.get(line)
        if found is None:
            continue
        alias = None
        if not isinstance(found.names, cst.ImportStar):
            alias = next((a for a in found.names if (a.evaluated_alias or a.evaluated_name) == name), None)
        ctx.bind(name, Binding("amp", "apex.amp", alias or cst.ImportAlias(cst.Name(name)), found))
