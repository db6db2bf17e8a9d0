"""Functions that compute a norm of gradients, proven from their code.

Swin-Transformer and the projects built on it log ``get_grad_norm(amp.master_params(optimizer))``
after every micro-batch of gradient accumulation. Apex gave it unscaled gradients there;
GradScaler can unscale only once per step. When the function is a norm of the gradients
(scaling every gradient by ``s > 0`` scales what it returns by ``s``), dividing what it computes
on the scaled gradients by ``scaler.get_scale()`` gives what it computed under Apex.

``is_gradient_norm`` proves that property by abstract interpretation of the function's code:
each value is tracked as a degree in the gradient scale, a monomial ``c * N**k`` in the one
other parameter ``N`` (the norm type), and only a small set of statements and operations is
understood (``p.grad``, ``norm``, ``item``, ``abs``, ``max``, ``**``, ``+``, ``torch.norm``,
``torch.stack``, the usual ``isinstance``/``filter`` normalization of the parameters). Anything
else, and any store but to a plain name, fails the proof. No libcst, no torch.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from fractions import Fraction


@dataclass(frozen=True)
class _Value:
    """An abstract value: the parameters (or one of them), a number ``c * N**k`` (an exponent),
    or a quantity homogeneous of degree ``c * N**k`` in the gradient scale (``zero`` for 0)."""

    kind: str  # "params", "param", "number", "degree", "zero", "other"
    c: Fraction = Fraction(0)
    k: int = 0


_PARAMS = _Value("params")
_PARAM = _Value("param")
_ZERO = _Value("zero")
_OTHER = _Value("other")  # a value that must not reach the result (a device, a bool)
# methods that keep a gradient quantity's degree (a norm of a degree-d tensor has degree d)
_KEEPING = frozenset({"data", "detach", "item", "abs", "max", "float", "double", "norm", "to", "cpu", "sum"})


class _Unproven(Exception):
    pass


def gradient_norms_in(source: str) -> set[str]:
    """The top-level functions of ``source`` that are norms of gradients (each defined once)."""
    if ".grad" not in source:
        return set()
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return set()
    return gradient_norms_of(tree)


def gradient_norms_of(tree: ast.Module) -> set[str]:
    """``gradient_norms_in`` for a module's parsed tree."""
    definitions = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    once = {name for name in (d.name for d in definitions) if [d.name for d in definitions].count(name) == 1}
    return {d.name for d in definitions if d.name in once and isinstance(d, ast.FunctionDef) and is_gradient_norm(d)}


def is_gradient_norm(definition: ast.FunctionDef) -> bool:
    """Whether ``definition`` returns a norm of the gradients of the parameters its first
    argument holds: degree one in their common scale, whatever its other argument."""
    arguments = definition.args
    names = [a.arg for a in (*arguments.posonlyargs, *arguments.args)]
    if not names or len(names) > 2 or arguments.vararg or arguments.kwarg or arguments.kwonlyargs:
        return False
    if definition.decorator_list:
        return False
    env = {names[0]: _PARAMS}
    if len(names) == 2:
        env[names[1]] = _Value("number", Fraction(1), 1)
    try:
        returned = _run(definition.body, env)
    except (_Unproven, ZeroDivisionError):
        return False
    return returned is not None and returned.kind == "degree" and (returned.c, returned.k) == (1, 0)


def _run(body: list[ast.stmt], env: dict[str, _Value]) -> _Value | None:
    """Interpret ``body``; the value it returns (None: it falls through)."""
    for statement in body:
        if isinstance(statement, ast.Return):
            if statement.value is None:
                raise _Unproven
            return _eval(statement.value, env)
        if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
            continue  # a docstring
        if isinstance(statement, ast.Assign):
            if len(statement.targets) != 1 or not isinstance(statement.targets[0], ast.Name):
                raise _Unproven
            env[statement.targets[0].id] = _eval(statement.value, env)
        elif isinstance(statement, ast.AugAssign) and isinstance(statement.target, ast.Name):
            current = env.get(statement.target.id)
            if current is None:
                raise _Unproven
            env[statement.target.id] = _binary(statement.op, current, _eval(statement.value, env))
        elif isinstance(statement, ast.If):
            _normalize(statement, env)
        elif isinstance(statement, ast.For):
            _loop(statement, env)
        else:
            raise _Unproven
    return None


def _normalize(statement: ast.If, env: dict[str, _Value]) -> None:
    """``if isinstance(parameters, torch.Tensor): parameters = [parameters]``: still parameters."""
    test, body = statement.test, statement.body
    if (
        statement.orelse
        or not isinstance(test, ast.Call)
        or not (isinstance(test.func, ast.Name) and test.func.id == "isinstance")
        or len(test.args) != 2
        or not isinstance(test.args[0], ast.Name)
        or env.get(test.args[0].id) != _PARAMS
        or len(body) != 1
        or not isinstance(body[0], ast.Assign)
        or len(body[0].targets) != 1
        or not isinstance(body[0].targets[0], ast.Name)
        or body[0].targets[0].id != test.args[0].id
        or not isinstance(body[0].value, ast.List)
        or [ast.dump(e) for e in body[0].value.elts] != [ast.dump(test.args[0])]
    ):
        raise _Unproven


def _loop(statement: ast.For, env: dict[str, _Value]) -> None:
    """``for p in parameters:`` accumulating: interpreted until what it binds is stable."""
    if statement.orelse or not isinstance(statement.target, ast.Name) or _eval(statement.iter, env) != _PARAMS:
        raise _Unproven
    for _ in range(4):
        before = dict(env)
        env[statement.target.id] = _PARAM
        if _run(statement.body, env) is not None:
            raise _Unproven  # a return inside the loop
        if env == before:
            return
    raise _Unproven


def _eval(node: ast.expr, env: dict[str, _Value]) -> _Value:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return _ZERO if node.value == 0 else _Value("number", Fraction(node.value), 0)
    if isinstance(node, ast.Name):
        if node.id not in env:
            raise _Unproven
        return env[node.id]
    if isinstance(node, ast.Attribute):
        owner = _eval(node.value, env)
        if owner == _PARAM and node.attr == "grad":
            return _Value("degree", Fraction(1), 0)
        if owner == _PARAM and node.attr == "device":
            return _OTHER
        if owner.kind == "degree" and node.attr in _KEEPING:
            return owner
        if owner.kind == "degree" and node.attr == "device":
            return _OTHER
        raise _Unproven
    if isinstance(node, ast.BinOp):
        return _binary(node.op, _eval(node.left, env), _eval(node.right, env))
    if isinstance(node, ast.Call):
        return _call(node, env)
    if isinstance(node, (ast.List, ast.ListComp, ast.GeneratorExp)):
        return _sequence(node, env)
    raise _Unproven


def _call(node: ast.Call, env: dict[str, _Value]) -> _Value:
    func = node.func
    if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
        raise _Unproven
    if isinstance(func, ast.Attribute) and not (isinstance(func.value, ast.Name) and func.value.id == "torch"):
        # a method: p.grad.norm(norm_type), x.item(), x.to(device)
        owner = _eval(func.value, env)
        if owner.kind != "degree" or func.attr not in _KEEPING:
            raise _Unproven
        for argument in [*node.args, *(k.value for k in node.keywords)]:
            if _eval(argument, env).kind not in ("number", "other", "zero"):
                raise _Unproven
        return owner
    name = ast.unparse(func)
    if name == "filter" and len(node.args) == 2 and not node.keywords and _keeps_some(node.args[0]):
        if _eval(node.args[1], env) == _PARAMS:
            return _PARAMS
        raise _Unproven
    args = [_eval(a, env) for a in node.args]
    others = [_eval(k.value, env) for k in node.keywords]
    if any(v.kind not in ("number", "other", "zero") for v in others):
        raise _Unproven
    if name == "float" and len(args) == 1 and args[0].kind in ("number", "degree", "zero"):
        return args[0]
    if name in ("torch.norm", "max", "sum", "torch.stack", "torch.max", "torch.sum") and args:
        quantity, rest = args[0], args[1:]
        if quantity.kind not in ("degree", "zero") or any(v.kind not in ("number", "other") for v in rest):
            raise _Unproven
        return quantity
    if name == "list" and len(args) == 1 and args[0] == _PARAMS:
        return _PARAMS
    raise _Unproven


def _keeps_some(predicate: ast.expr) -> bool:
    """``lambda p: p.grad is not None``: a filter that only drops parameters without gradients."""
    return (
        isinstance(predicate, ast.Lambda)
        and len(predicate.args.args) == 1
        and isinstance(predicate.body, ast.Compare)
        and ast.unparse(predicate.body) == f"{predicate.args.args[0].arg}.grad is not None"
    )


def _sequence(node: ast.List | ast.ListComp | ast.GeneratorExp, env: dict[str, _Value]) -> _Value:
    """A list of quantities of one degree, or the parameters filtered by ``if p.grad is not None``."""
    if isinstance(node, ast.List):
        values = {_eval(e, env) for e in node.elts}
        if len(values) == 1 and next(iter(values)).kind == "degree":
            return next(iter(values))
        raise _Unproven
    if len(node.generators) != 1:
        raise _Unproven
    generator = node.generators[0]
    if generator.is_async or not isinstance(generator.target, ast.Name) or _eval(generator.iter, env) != _PARAMS:
        raise _Unproven
    inner = {**env, generator.target.id: _PARAM}
    for condition in generator.ifs:
        if ast.unparse(condition) != f"{generator.target.id}.grad is not None":
            raise _Unproven
    element = _eval(node.elt, inner)
    if element == _PARAM:
        return _PARAMS  # the parameters that have gradients
    if element.kind != "degree":
        raise _Unproven
    return element


def _binary(op: ast.operator, left: _Value, right: _Value) -> _Value:
    if isinstance(op, ast.Pow):
        if right.kind != "number":
            raise _Unproven
        if left == _ZERO:
            return _ZERO
        if left.kind == "degree":
            return _product(left, right, "degree")
        if left.kind == "number" and right.k == 0 and right.c.denominator == 1:
            return _Value("number", left.c ** int(right.c), left.k * int(right.c))
        raise _Unproven
    if isinstance(op, ast.Div) and left.kind == "number" and right.kind == "number":
        return _Value("number", left.c / right.c, left.k - right.k)
    if isinstance(op, (ast.Add, ast.Sub)):
        if left == _ZERO:
            return right if right.kind in ("degree", "zero") else _raise()
        if right == _ZERO:
            return left if left.kind == "degree" else _raise()
        if left.kind == "degree" and left == right:
            return left
    raise _Unproven


def _product(quantity: _Value, exponent: _Value, kind: str) -> _Value:
    """A quantity of degree ``c1 N**k1`` raised to ``c2 N**k2`` has degree ``c1 c2 N**(k1 + k2)``."""
    return _Value(kind, quantity.c * exponent.c, quantity.k + exponent.k)


def _raise() -> _Value:
    raise _Unproven
