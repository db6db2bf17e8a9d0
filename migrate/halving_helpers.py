"""Project functions that make the model they are given float16 under a flag, proven from their code.

microsoft/DialoGPT's ``load_model(model, checkpoint, args)`` and PKD-for-BERT's ``load_model(model,
checkpoint, args, mode)`` load a checkpoint into the model, then ``if args.fp16: model.half()``, move
it to the device (``model.to(device)``), maybe wrap it in ``torch.nn.DataParallel`` and return it.
The script that calls them sets up FP16_Optimizer on that model under ``if args.fp16:``. The helper
is shared (inference scripts call it too), so the migration cannot drop its ``.half()``; knowing
that the helper halves its model exactly under ``args.fp16``, it can make the returned model
float32 again beside the set-up (``model.float()``), which gives the float16-rounded weights
FP16_Optimizer's float32 masters started from.

``halving_helpers_in`` proves the shape on the helper's code: a parameter ``model`` halved by
``model.half()`` (or ``model = model.half()``) in the body of an ``if flag.attr:`` (no ``else``)
at the top level of the function, where ``flag`` is another parameter; nothing else in the
function casts anything (``.float()``, ``.double()``, ``.type(...)``, a ``.to`` other than
``.to(device)``: an alias of the model could be cast), reads a ``.dtype``, registers a hook, or
binds ``model`` but ``model = torch.nn.DataParallel(model, ...)`` after the half; and every
``return`` returns ``model``. No libcst, no torch.

``DistributedDataParallel(model)`` after the half is no such wrap: torch's DDP made over the float16
model and made float32 afterwards (the caller's ``model.float()``) no longer all-reduces its
gradients (each process trains on its own, silently; checked on torch 2.13, gloo, two processes),
where ``DataParallel`` replicates its module anew at each forward.
"""

from __future__ import annotations

import ast
from typing import NamedTuple


class HalvingHelper(NamedTuple):
    """A function that returns its ``model`` parameter halved when ``flag.attr`` holds."""

    model_index: int
    model: str
    flag_index: int
    flag: str
    attribute: str


_CASTS = frozenset({"half", "float", "double", "bfloat16", "type", "apply", "_apply"})


def _functions_defined_once(source: str, spelled: str) -> list[ast.FunctionDef]:
    """The top-level (not async) functions of ``source`` defined once, where it spells ``spelled``."""
    if spelled not in source:
        return []
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    definitions = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    names = [d.name for d in definitions]
    return [d for d in definitions if names.count(d.name) == 1 and isinstance(d, ast.FunctionDef)]


def halving_helpers_in(source: str) -> dict[str, HalvingHelper]:
    """The top-level functions of ``source`` (each defined once) that halve their model under a flag."""
    found: dict[str, HalvingHelper] = {}
    for definition in _functions_defined_once(source, ".half()"):
        helper = halving_helper(definition)
        if helper is not None:
            found[definition.name] = helper
    return found


def halving_helper(definition: ast.FunctionDef) -> HalvingHelper | None:
    """The proof for one function (None when it does not hold)."""
    arguments = definition.args
    if arguments.posonlyargs or definition.decorator_list:
        return None
    parameters = [a.arg for a in arguments.args]
    for statement in definition.body:
        if not (isinstance(statement, ast.If) and not statement.orelse):
            continue
        test = statement.test
        if not (isinstance(test, ast.Attribute) and isinstance(test.value, ast.Name)):
            continue
        flag = test.value.id
        halved = [model for model in (_halved(s) for s in statement.body) if model is not None]
        if len(halved) != 1 or flag not in parameters or halved[0] not in parameters or halved[0] == flag:
            continue
        model = halved[0]
        if not _kept_after(definition, statement, model, flag):
            continue
        return HalvingHelper(parameters.index(model), model, parameters.index(flag), flag, test.attr)
    return None


def _halved(statement: ast.stmt) -> str | None:
    """``m.half()`` or ``m = m.half()``: ``m``."""
    value = statement.value if isinstance(statement, (ast.Expr, ast.Assign)) else None
    if not (
        isinstance(value, ast.Call)
        and not value.args
        and not value.keywords
        and isinstance(value.func, ast.Attribute)
        and value.func.attr == "half"
        and isinstance(value.func.value, ast.Name)
    ):
        return None
    model = value.func.value.id
    if isinstance(statement, ast.Assign):
        targets = statement.targets
        if len(targets) != 1 or not (isinstance(targets[0], ast.Name) and targets[0].id == model):
            return None
    return model


def _kept_after(definition: ast.FunctionDef, halving: ast.If, model: str, flag: str) -> bool:
    """Nothing but the half casts ``model``, reads a dtype or registers a hook; it is bound only to ``DataParallel(model)`` after the
    half; the flag is never bound; every return returns ``model``."""
    returns = 0
    for node in ast.walk(definition):
        if node is definition:
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            return False  # a nested scope could do anything with them
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            return False
        if isinstance(node, ast.Return):
            returns += 1
            if not (isinstance(node.value, ast.Name) and node.value.id == model):
                return False
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            if node.id == flag:
                return False
            if node.id == model and not _wrapped_after(definition, halving, node, model):
                return False
        if isinstance(node, ast.Attribute) and node.attr == "dtype":
            return False  # a dtype read (``next(model.parameters()).dtype``) could keep float16 somewhere
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            # any receiver: an alias of the model (``start_model = model``) could be cast too
            method = node.func.attr
            if method.startswith("register_") and "hook" in method:
                return False  # a hook (casting inputs to float16?) outlives the caller's ``.float()``
            if method in _CASTS and not (method == "half" and _inside(halving, node)):
                return False
            if method == "to" and not _to_device(node):
                return False
    return returns >= 1


def _inside(outer: ast.AST, node: ast.AST) -> bool:
    return any(child is node for child in ast.walk(outer))


def _wrapped_after(definition: ast.FunctionDef, halving: ast.If, target: ast.Name, model: str) -> bool:
    """``model = model.half()`` in the half's ``if``, or ``model = <...>DataParallel(model, ...)``
    (not DistributedDataParallel: see the module's docstring) in a statement of the function's body
    after it."""
    if _inside(halving, target):
        return True
    top = next((s for s in definition.body if _inside(s, target)), None)
    if top is None or definition.body.index(top) <= definition.body.index(halving):
        return False
    for node in ast.walk(top):
        if isinstance(node, ast.Assign) and any(t is target for t in node.targets):
            return len(node.targets) == 1 and _is_data_parallel(node.value, model)
    return False


def _is_data_parallel(value: ast.expr, model: str) -> bool:
    func = value.func if isinstance(value, ast.Call) else None
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    return (
        isinstance(value, ast.Call)
        and name == "DataParallel"
        and bool(value.args)
        and isinstance(value.args[0], ast.Name)
        and value.args[0].id == model
    )


def _to_device(call: ast.Call) -> bool:
    """``model.to(device)`` / ``model.to(args.device)``: a move, no cast."""
    if len(call.args) != 1 or call.keywords:
        return False
    argument = call.args[0]
    name = (
        argument.attr if isinstance(argument, ast.Attribute) else argument.id if isinstance(argument, ast.Name) else ""
    )
    return "device" in name.lower()


class GroupReader(NamedTuple):
    """A function that uses its ``optimizer`` parameter only through ``optimizer.param_groups``."""

    position: int
    name: str


def param_group_readers_in(source: str) -> dict[str, GroupReader]:
    """The top-level functions of ``source`` (each defined once) that use one parameter only as
    ``P.param_groups`` (DialoGPT's ``set_lr(optimizer, ...)``: ``for g in optimizer.param_groups:
    g["lr"] = ...``): given an FP16_Optimizer, they read and set the wrapped optimizer's groups
    (Apex's ``param_groups`` was the wrapped optimizer's), so the migrated optimizer can be passed. Not one
    that reads a group's ``"params"``: Apex's float32 masters there, the model's parameters once migrated."""
    found: dict[str, GroupReader] = {}
    for definition in _functions_defined_once(source, ".param_groups"):
        if definition.args.posonlyargs or definition.decorator_list:
            continue
        parameters = [a.arg for a in definition.args.args]
        for index, parameter in enumerate(parameters):
            if _only_param_groups(definition, parameter):
                found[definition.name] = GroupReader(index, parameter)
                break
    return found


def _only_param_groups(definition: ast.FunctionDef, parameter: str) -> bool:
    parents = {id(child): node for node in ast.walk(definition) for child in ast.iter_child_nodes(node)}
    used = False
    for node in ast.walk(definition):
        if (
            isinstance(node, (ast.Lambda, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and node is not definition
        ):
            return False
        if not (isinstance(node, ast.Name) and node.id == parameter):
            continue
        parent = parents.get(id(node))
        if not (
            isinstance(node.ctx, ast.Load)
            and isinstance(parent, ast.Attribute)
            and parent.attr == "param_groups"
            and isinstance(parent.ctx, ast.Load)
        ):
            return False
        used = True
    # a group's "params" were FP16_Optimizer's float32 masters (gradients unscaled); migrated, the model's
    # parameters (gradients still scaled): only the groups' settings read alike
    return used and not any(
        isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value == "params"
        for node in ast.walk(definition)
    )
