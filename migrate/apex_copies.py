"""Local copies of Apex's fp16_utils: project modules that define its API themselves.

Many 2018-2019 projects vendored ``apex/fp16_utils`` as a package or module of their own
(``fp16/``, ``fp16util.py``, ``fp16_optimizer.py``, ``loss_scaler.py``) and import from it:
``from fp16 import FP16_Module, FP16_Optimizer``. ``scan`` reads one module's top-level
definitions with ``ast`` and records those that have the shape of the Apex API (a class
``FP16_Optimizer`` with Apex's constructor and methods, a module wrapper that halves its
child, ``network_to_half``, ...); a same-named definition of another shape is not recorded.
``copy_facts`` then tells each importing module which of its imported names are such
copies (and of what), or why one cannot be treated like Apex (the copy was not given, its
dynamic loss scaler is not Apex's pre-2019 one, it clips with another function). A copy whose
dynamic loss scaler is exactly Apex's pre-2019 one carries ``PRE2019_DYNAMIC`` and its defaults.

Pure ``ast``: no libcst, no torch.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from migrate import pytree

if TYPE_CHECKING:
    from migrate.project import ProjectIndex

# the fp16_utils names a copy may define, and the Apex path the migration knows each as
OPTIMIZER = "apex.fp16_utils.FP16_Optimizer"
_APEX_PATHS = {
    "optimizer": OPTIMIZER,
    "wrapper": "apex.fp16_utils.FP16Model",
    "network_to_half": "apex.fp16_utils.network_to_half",
    "bn_convert_float": "apex.fp16_utils.BN_convert_float",
    "to_python_float": "apex.fp16_utils.to_python_float",
}
_WRAPPER_NAMES = frozenset({"FP16_Module", "FP16Model"})
_OPTIMIZER_METHODS = frozenset(
    {"__init__", "backward", "step", "zero_grad", "clip_master_grads", "update_master_grads", "state_dict"}
)
# names whose module is worth a look when a single file imports them from a module that was not read
COPY_NAMES = frozenset({"FP16_Optimizer", "FP16_Module", "FP16Model", "network_to_half"})
_COPY_MODULES = frozenset({"fp16", "fp16util", "fp16_util", "fp16_utils", "fp16_optimizer", "loss_scaler"})

Definition = dict[str, Any]  # JSON data: {"kind": ..., "line": ..., more per kind}


def looks_like_copy_module(spelled: str) -> bool:
    """``fp16`` / ``fp16util`` / ``.fp16_optimizer`` / ``..fp16``: a module name a vendored fp16_utils has."""
    last = spelled.rsplit(".", 1)[-1]
    return (spelled.startswith(".") or "." not in spelled) and last in _COPY_MODULES


# ---------------------------------------------------------------------------------------------- reading
def _literal(node: ast.expr | None) -> object:
    if node is None:
        return ...
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):  # 2**32
            base, exponent = _literal(node.left), _literal(node.right)
            if isinstance(base, int) and isinstance(exponent, int) and 0 <= exponent < 128:
                return base**exponent
        return ...


def _parameters(function: ast.FunctionDef) -> list[tuple[str, object]]:
    """(name, literal default or ...) of the positional parameters, ``self`` included."""
    args = [*function.args.posonlyargs, *function.args.args]
    defaults: list[ast.expr | None] = [None] * (len(args) - len(function.args.defaults))
    defaults += function.args.defaults
    return [(arg.arg, _literal(default) if default is not None else ...) for arg, default in zip(args, defaults)]


def _methods(cls: ast.ClassDef) -> dict[str, ast.FunctionDef]:
    return {item.name: item for item in cls.body if isinstance(item, ast.FunctionDef)}


def _calls(node: ast.AST) -> list[ast.Call]:
    return [child for child in ast.walk(node) if isinstance(child, ast.Call)]


def _has_property(cls: ast.ClassDef, name: str) -> bool:
    for item in cls.body:
        if isinstance(item, ast.FunctionDef) and item.name == name:
            return any(pytree.dotted(d) == "property" for d in item.decorator_list)
        if isinstance(item, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in item.targets):
            return isinstance(item.value, ast.Call) and pytree.dotted(item.value.func) == "property"
    return False


def _optimizer(cls: ast.ClassDef) -> Definition | None:
    """Apex's FP16_Optimizer: its constructor, backward/step/zero_grad/clip_master_grads/
    update_master_grads/state_dict, a ``loss_scale`` property; which scalers and clip it uses."""
    methods = _methods(cls)
    if not _OPTIMIZER_METHODS <= set(methods) or not _has_property(cls, "loss_scale"):
        return None
    init = _parameters(methods["__init__"])
    expected = [
        ("self", ...),
        ("init_optimizer", ...),
        ("static_loss_scale", 1.0),
        ("dynamic_loss_scale", False),
        ("dynamic_loss_args", None),
    ]
    if init[:5] != expected or any(name != "verbose" for name, _ in init[5:]):
        return None
    backward = [name for name, _ in _parameters(methods["backward"])]
    if backward[:3] != ["self", "loss", "update_master_grads"] or backward[3:] not in ([], ["retain_graph"]):
        return None
    if _parameters(methods["step"]) != [("self", ...), ("closure", None)]:
        return None
    if _parameters(methods["zero_grad"]) not in ([("self", ...)], [("self", ...), ("set_grads_to_None", False)]):
        return None
    if _parameters(methods["clip_master_grads"]) != [("self", ...), ("max_norm", ...), ("norm_type", 2)]:
        return None
    found: Definition = {"kind": "optimizer", "line": cls.lineno, "static": None, "dynamic": None, "clip": None}
    # which loss scaler each branch of the constructor builds
    for call in _calls(methods["__init__"]):
        name = pytree.dotted(call.func)
        if name is None or not name.endswith("LossScaler"):
            continue
        names = {n.id for arg in call.args for n in ast.walk(arg) if isinstance(n, ast.Name)}
        if "static_loss_scale" in names:
            found["static"] = name
        elif any(kw.arg is None for kw in call.keywords) or not call.args:
            found["dynamic"] = [name, call.lineno]
        elif _literal(call.args[0]) == "dynamic":
            found["dynamic"] = [name + "('dynamic')", call.lineno]
    # what clip_master_grads clips with: torch's clip_grad_norm(_) or a name bound to it
    aliases = {
        target.attr: pytree.dotted(statement.value)
        for statement in ast.walk(methods["__init__"])
        if isinstance(statement, ast.Assign)
        for target in statement.targets
        if isinstance(target, ast.Attribute) and pytree.dotted(target.value) == "self"
    }
    for call in _calls(methods["clip_master_grads"]):
        if not any(isinstance(arg, ast.Name) and arg.id == "max_norm" for arg in call.args):
            continue
        name = pytree.dotted(call.func)
        if name is not None and name.startswith("self."):
            name = aliases.get(name[5:])
        found["clip"] = name
    return found


def _wrapper(cls: ast.ClassDef) -> Definition | None:
    """FP16_Module / FP16Model: an nn.Module that halves the module it is given and casts the
    inputs of its forward to half."""
    if not any((pytree.dotted(base) or "").endswith("Module") for base in cls.bases):
        return None
    methods = _methods(cls)
    init, forward = methods.get("__init__"), methods.get("forward")
    if init is None or forward is None or len(_parameters(init)) != 2 or forward.args.vararg is None:
        return None
    child = _parameters(init)[1][0]
    halves = any(
        isinstance(call.func, ast.Attribute)
        and call.func.attr == "half"
        and pytree.dotted(call.func.value) == child
        or (pytree.dotted(call.func) or "").endswith(("convert_network", "network_to_half"))
        and any(isinstance(arg, ast.Name) and arg.id == child for arg in call.args)
        for call in _calls(init)
    )
    inputs = forward.args.vararg.arg
    casts = any(
        (isinstance(call.func, ast.Attribute) and call.func.attr == "half")
        or "fp16" in (pytree.dotted(call.func) or "")
        or "half" in (pytree.dotted(call.func) or "")
        for call in _calls(forward)
    ) and any(isinstance(n, ast.Name) and n.id == inputs for n in ast.walk(forward))
    if not (halves and casts):
        return None
    state_dict = methods.get("state_dict")
    delegates = state_dict is not None and any(
        (pytree.dotted(call.func) or "").endswith(".state_dict")
        and (pytree.dotted(call.func) or "").startswith("self.")
        for call in _calls(state_dict)
    )
    # where it holds the child: its state_dict keys carry that prefix unless state_dict delegates
    child_attribute = "module"
    for node in ast.walk(init):
        if isinstance(node, ast.Call) and (pytree.dotted(node.func) or "") == "self.add_module" and node.args:
            name = _literal(node.args[0])
            child_attribute = name if isinstance(name, str) else child_attribute
        elif isinstance(node, ast.Assign) and any(
            isinstance(n, ast.Name) and n.id == child for n in ast.walk(node.value)
        ):
            targets = [
                t.attr for t in node.targets if isinstance(t, ast.Attribute) and pytree.dotted(t.value) == "self"
            ]
            child_attribute = targets[0] if targets else child_attribute
    return {"kind": "wrapper", "line": cls.lineno, "delegates": delegates, "child": child_attribute}


def _function(function: ast.FunctionDef) -> Definition | None:
    name = function.name
    params = [p for p, _ in _parameters(function)]
    if len(params) != 1 or function.args.vararg or function.args.kwarg:
        return None
    calls = _calls(function)
    if name == "network_to_half":
        for statement in function.body:
            if isinstance(statement, ast.Return) and isinstance(statement.value, ast.Call):
                outer = statement.value
                if (pytree.dotted(outer.func) or "").endswith("Sequential") and len(outer.args) == 2:
                    if any(
                        isinstance(c.func, ast.Attribute)
                        and c.func.attr == "half"
                        and pytree.dotted(c.func.value) == params[0]
                        for c in _calls(outer.args[1])
                    ):
                        return {"kind": "network_to_half", "line": function.lineno}
        return None
    if name == "BN_convert_float":
        batchnorm = any(
            (pytree.dotted(n) or "").endswith("_BatchNorm") for n in ast.walk(function) if isinstance(n, ast.expr)
        )
        floats = any(isinstance(c.func, ast.Attribute) and c.func.attr == "float" for c in calls)
        return {"kind": "bn_convert_float", "line": function.lineno} if batchnorm and floats else None
    if name == "to_python_float":
        items = any(
            isinstance(c.func, ast.Attribute) and c.func.attr == "item" and pytree.dotted(c.func.value) == params[0]
            for c in calls
        )
        return {"kind": "to_python_float", "line": function.lineno} if items else None
    return None


def _static_scaler(cls: ast.ClassDef) -> Definition | None:
    """fp16_utils' LossScaler: a fixed scale, no overflow check, no update."""
    methods = _methods(cls)
    overflow, update = methods.get("has_overflow"), methods.get("update_scale")
    if overflow is None or update is None or "backward" not in methods:
        return None
    returns = [n for n in ast.walk(overflow) if isinstance(n, ast.Return)]
    if not returns or any(_literal(r.value) is not False for r in returns):
        return None
    if any(isinstance(n, (ast.Assign, ast.AugAssign, ast.Call)) for n in ast.walk(update)):
        return None
    return {"kind": "static_scaler", "line": cls.lineno}


def _dynamic_scaler(cls: ast.ClassDef) -> Definition | None:
    """fp16_utils' pre-2019 DynamicLossScaler: its constructor's defaults, and whether it is exactly
    Apex's (``plain``: those three parameters, halving to a floor of 1, doubling once scale_window
    steps have passed since the last overflow, no hysteresis)."""
    methods = _methods(cls)
    if not {"__init__", "has_overflow", "update_scale"} <= set(methods):
        return None
    defaults = dict(_parameters(methods["__init__"])[1:])
    if "init_scale" not in defaults or "scale_window" not in defaults:
        return None
    shown = {name: (repr(value) if value is not ... else "?") for name, value in defaults.items()}
    plain = (
        list(defaults) == ["init_scale", "scale_factor", "scale_window"]
        and isinstance(defaults["init_scale"], (int, float))
        and defaults["scale_factor"] == 2
        and isinstance(defaults["scale_window"], int)
        and _plain_update(methods["update_scale"])
    )
    return {"kind": "dynamic_scaler", "line": cls.lineno, "defaults": shown, "plain": plain}


def _plain_update(function: ast.FunctionDef) -> bool:
    """``update_scale(self, overflow)`` as Apex's pre-2019 DynamicLossScaler has it: on overflow the
    scale is divided by scale_factor, never below 1, and the iteration remembered; otherwise it is
    multiplied when (cur_iter - last_overflow_iter) % scale_window == 0; then cur_iter += 1."""
    if [name for name, _ in _parameters(function)] != ["self", "overflow"]:
        return False
    body = [s for s in function.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if len(body) != 2 or not isinstance(body[0], ast.If) or ast.unparse(body[0].test) != "overflow":
        return False
    if ast.unparse(body[1]) != "self.cur_iter += 1":
        return False
    shrink = sorted(ast.unparse(s) for s in body[0].body)
    if shrink != sorted(
        ["self.cur_scale = max(self.cur_scale / self.scale_factor, 1)", "self.last_overflow_iter = self.cur_iter"]
    ):
        return False
    grow = body[0].orelse
    return (
        len(grow) == 1
        and isinstance(grow[0], ast.If)
        and not grow[0].orelse
        and ast.unparse(grow[0].test) == "(self.cur_iter - self.last_overflow_iter) % self.scale_window == 0"
        and [ast.unparse(s) for s in grow[0].body] == ["self.cur_scale *= self.scale_factor"]
    )


# a copy's dynamic scaling the migration reproduces (pre-2019 DynamicLossScaler): this prefix, then
# "<init_scale> <scale_window>" (its defaults), in place of a problem
PRE2019_DYNAMIC = "pre-2019 dynamic: "


def pre2019_dynamic(problem: str) -> tuple[float, int] | None:
    """The defaults (init_scale, scale_window) a ``PRE2019_DYNAMIC`` fact carries, else None."""
    if not problem.startswith(PRE2019_DYNAMIC):
        return None
    start, window = problem[len(PRE2019_DYNAMIC) :].split()
    return float(start), int(window)


def _torch_clip(statement: ast.stmt) -> list[str]:
    """Names a top-level ``X = torch.nn.utils.clip_grad_norm(_)`` binds (also under an ``if``)."""
    found = []
    for node in ast.walk(statement):
        if isinstance(node, ast.Assign) and pytree.dotted(node.value) in (
            "torch.nn.utils.clip_grad_norm",
            "torch.nn.utils.clip_grad_norm_",
        ):
            found += [t.id for t in node.targets if isinstance(t, ast.Name)]
    return found


def scan(tree: ast.Module) -> dict[str, Definition]:
    """The module's top-level definitions that have the shape of an Apex fp16_utils API."""
    found: dict[str, Definition] = {}
    others: set[str] = set()  # names bound at top level to something else (a clip that is not torch's)
    for statement in tree.body:
        definition: Definition | None = None
        if isinstance(statement, ast.ClassDef):
            if statement.name == "FP16_Optimizer":
                definition = _optimizer(statement)
            elif statement.name in _WRAPPER_NAMES:
                definition = _wrapper(statement)
            elif statement.name == "LossScaler":
                definition = _static_scaler(statement)
            elif statement.name == "DynamicLossScaler":
                definition = _dynamic_scaler(statement)
            if definition is not None:
                found[statement.name] = definition
        elif isinstance(statement, ast.FunctionDef) and statement.name in (
            "network_to_half",
            "BN_convert_float",
            "to_python_float",
        ):
            definition = _function(statement)
            if definition is not None:
                found[statement.name] = definition
        elif isinstance(statement, (ast.Assign, ast.If, ast.Try)):
            clips = _torch_clip(statement)
            for name in clips:
                found.setdefault(name, {"kind": "torch_clip", "line": statement.lineno})
            for node in ast.walk(statement):
                if isinstance(node, ast.Assign) and not _torch_clip(node):
                    others.update(t.id for t in node.targets if isinstance(t, ast.Name))
    for name in others:
        if found.get(name, {}).get("kind") == "torch_clip":
            del found[name]  # bound to torch's clip on one path only
    return found


# ---------------------------------------------------------------------------------------------- project
class _Resolver:
    """Follows a name a module imports to the module that defines it (re-exports and stars too)."""

    def __init__(self, index: ProjectIndex) -> None:
        self.index = index

    def origin(self, path: str, name: str, depth: int = 0) -> tuple[str, Definition] | None:
        summary = self.index.modules.get(path)
        if summary is None or depth > 4:
            return None
        if name in summary.apex_defs:
            return path, summary.apex_defs[name]
        for edge in summary.imports:
            if not edge.names:
                continue
            if name in edge.aliases or edge.names == ("*",):
                target = self.index.resolve(path, edge.module)
                if target is None or target == path:
                    continue
                wanted = name if edge.names == ("*",) else edge.names[edge.aliases.index(name)]
                found = self.origin(target, wanted, depth + 1)
                if found is not None:
                    return found
        return None


# spelled module, name, apex path ("": none), where, problem ("": none), problem of dynamic scaling ("": none;
# for a wrapper that does not delegate its state_dict: the attribute holding the child, its keys' prefix)
CopyFact = tuple[str, str, str, str, str, str]


def copy_facts(index: ProjectIndex, display: Callable[[str], str]) -> dict[str, tuple[CopyFact, ...]]:
    """For each given module that imports names from a project copy of fp16_utils: one fact per
    such name (what it copies, where, and what keeps it from being treated like Apex)."""
    resolver = _Resolver(index)
    facts: dict[str, tuple[CopyFact, ...]] = {}
    copies: set[str] = {path for path, summary in index.modules.items() if summary.apex_defs}
    for path, summary in index.modules.items():
        if not summary.given:
            continue
        found: list[CopyFact] = []
        targets: set[str] = set()
        for edge in summary.imports:
            if not edge.names or not edge.spelled:
                continue
            target = index.resolve(path, edge.module)
            if target is None or target == path:
                continue
            if edge.names == ("*",):
                star = resolver.origin(target, "FP16_Optimizer")
                if star is not None and star[1]["kind"] == "optimizer":
                    found.append((edge.spelled, "*", "", f"{display(star[0])}:{star[1]['line']}", "", ""))
                continue
            origins = {name: resolver.origin(target, name) for name in edge.names}
            if any(o is not None for o in origins.values()):
                targets.add(target)  # the copy, or a package re-exporting it
            if not any(o is not None and o[1]["kind"] in _APEX_PATHS for o in origins.values()):
                if "FP16_Optimizer" in edge.names:
                    # a project module of its own: left alone, and no finding that asks for it
                    found.append((edge.spelled, "FP16_Optimizer", "", display(target), "", ""))
                continue
            for name in edge.names:
                origin = origins[name]
                if origin is None:
                    found.append((edge.spelled, name, "", display(target), "not an fp16_utils API the tool knows", ""))
                    continue
                where_path, definition = origin
                where = f"{display(where_path)}:{definition['line']}"
                apex = _APEX_PATHS.get(definition["kind"], "")
                problem = "" if apex else "not an fp16_utils API the tool knows"
                dynamic = ""
                if apex and not index.modules[where_path].given:
                    problem = (
                        f"{display(where_path)}, which holds the copy, was not given: add it to the paths (or run "
                        "ampmigrate on the whole project) and this migrates like Apex's"
                    )
                elif definition["kind"] == "optimizer":
                    problem = _optimizer_problem(resolver, where_path, definition)
                    dynamic = _dynamic_problem(resolver, where_path, definition, display)
                elif definition["kind"] == "wrapper" and not definition["delegates"]:
                    dynamic = definition["child"]  # for a wrapper: the prefix its state_dict keys had
                found.append((edge.spelled, name, apex, where, problem, dynamic))
        if found:
            facts[path] = tuple(found)
        copies.update(targets)
    return _halved_in_other_modules(index, facts, copies, display)


_HALVING_PATHS = frozenset({_APEX_PATHS["wrapper"], _APEX_PATHS["network_to_half"], _APEX_PATHS["bn_convert_float"]})


def _halved_in_other_modules(
    index: ProjectIndex, facts: dict[str, tuple[CopyFact, ...]], copies: set[str], display: Callable[[str], str]
) -> dict[str, tuple[CopyFact, ...]]:
    """Hold a copied FP16_Optimizer whose module is linked by imports (not through the copy itself)
    to a module that halves the model with a copied FP16_Module / network_to_half: the migration
    keeps the model float32 only where the optimizer is set up."""
    halving = {
        path: next(name for _, name, apex, *_ in found if apex in _HALVING_PATHS)
        for path, found in facts.items()
        if any(apex in _HALVING_PATHS for _, _, apex, *_ in found)
        and all(apex != OPTIMIZER for _, _, apex, *_ in found)
    }
    if not halving:
        return facts
    # imports within one project, not through the copy: the modules the set-up's module imports
    # (a model builder) and those that import it (a script handing it the model), transitively
    from migrate.project import project_root  # here: migrate.project imports this module

    forward: dict[str, set[str]] = {}
    backward: dict[str, set[str]] = {}
    for path, summary in index.modules.items():
        for _, target in index.imported(summary):
            if path not in copies and target not in copies and project_root(path) == project_root(target):
                forward.setdefault(path, set()).add(target)
                backward.setdefault(target, set()).add(path)
    for path, found in list(facts.items()):
        if not any(apex == OPTIMIZER and not problem for _, _, apex, _, problem, _ in found):
            continue
        linked = _reached(forward, path) | _reached(backward, path)
        other = min((module for module in linked if module in halving), default=None)
        if other is None:
            continue
        problem = (
            f"{display(other)} makes the model float16 with `{halving[other]}` from the copy, apart from this "
            "FP16_Optimizer set-up, and the migration would leave it float16 under a GradScaler"
        )
        facts[path] = tuple((*f[:4], problem, f[5]) if f[2] == OPTIMIZER and not f[4] else f for f in found)
    return facts


def _reached(edges: dict[str, set[str]], start: str) -> set[str]:
    seen, pending = {start}, [start]
    while pending:
        for other in edges.get(pending.pop(), ()):
            if other not in seen:
                seen.add(other)
                pending.append(other)
    return seen - {start}


def _optimizer_problem(resolver: _Resolver, path: str, definition: Definition) -> str:
    """What keeps this copy of FP16_Optimizer from training like Apex's whatever scale it is given."""
    static = definition["static"]
    scaler = resolver.origin(path, static) if static else None
    if static and scaler is None:
        return (
            f"where its static loss scaler `{static}` is defined could not be read (give that module too, so "
            "the tool can check it is fp16_utils' LossScaler: a fixed scale, no overflow check)"
        )
    if scaler is None or scaler[1]["kind"] != "static_scaler":
        return (
            f"its static loss scaler ({static or 'none found'}) is not fp16_utils' LossScaler (a fixed scale, no "
            "overflow check)"
        )
    clip = definition["clip"]
    if clip not in ("torch.nn.utils.clip_grad_norm", "torch.nn.utils.clip_grad_norm_"):
        bound = resolver.origin(path, clip) if clip else None
        if bound is None or bound[1]["kind"] != "torch_clip":
            return (
                f"its clip_master_grads clips with `{clip or 'an unknown function'}`, not "
                "torch.nn.utils.clip_grad_norm_ (a model-parallel clip would change the norm)"
            )
    return ""


def _dynamic_problem(resolver: _Resolver, path: str, definition: Definition, display: Callable[[str], str]) -> str:
    """Why this copy's dynamic loss scaling is not the one the migration reproduces (Apex's since
    Feb 2019: amp's LossScaler from 2**16, doubling after 2000 clean steps), with what it does
    instead; "" where it is that one. Only uses that ask for dynamic scaling are held by it."""
    dynamic = definition["dynamic"]
    if dynamic is None:
        return "its constructor builds no dynamic loss scaler the tool recognises"
    name, line = dynamic
    origin = resolver.origin(path, name)
    if origin is None or origin[1]["kind"] != "dynamic_scaler":
        return f"its dynamic loss scaler `{name}` ({display(path)}:{line}) is not one the tool knows"
    defaults = origin[1]["defaults"]
    if origin[1].get("plain") and not name.endswith("('dynamic')"):
        return f"{PRE2019_DYNAMIC}{defaults['init_scale']} {defaults['scale_window']}"
    spelled = ", ".join(f"{key}={value}" for key, value in defaults.items())
    extra = set(defaults) - {"init_scale", "scale_factor", "scale_window"}
    return (
        f"its dynamic loss scaling is the pre-2019 fp16_utils DynamicLossScaler ({display(origin[0])}:"
        f"{origin[1]['line']}, built at {display(path)}:{line}; defaults {spelled}), which halves on overflow down "
        "to a floor and doubles once scale_window steps have passed since the last overflow, where the Apex "
        "fp16_utils the migration reproduces (Feb 2019 on) starts at 2**16 and waits 2000 steps; write "
        '`scaler = torch.amp.GradScaler("cuda", init_scale=<init_scale>, growth_interval=<scale_window>)` and, '
        "after each `scaler.update()`, `if scaler.get_scale() < 1.0: scaler.update(new_scale=1.0)`"
        + (f" ({', '.join(sorted(extra))} have no GradScaler counterpart)" if extra else "")
    )
