"""Apex amp set up for a library's runner: how the GradScaler reaches its hooks, read from the modules.

mmdetection-based projects (whai362/PVT detection, microsoft/Swin-Transformer-Object-Detection,
microsoft/Cream EfficientViT downstream) call ``amp.initialize`` in ``train_detector`` and hand
the optimizer to mmcv's ``build_runner``. The loss is scaled in an optimizer hook
(``DistOptimizerHook.after_train_iter(self, runner)``), amp's state is saved by a checkpoint
function and loaded by a runner subclass: modules that the runner reaches through a registry and
a config string, not through imports, and that mmcv's own code runs (the forward pass is
``runner.model.train_step`` inside mmcv). This module reads those pieces with ``ast``:
``runner_setup`` finds the runner built from what the initialize returned, ``threading`` how each
hook or runner module reaches the GradScaler the runner keeps (``runner.scaler`` in a hook's
method, ``self.scaler`` in the runner's own methods, a parameter of the function they call), which
``migrate.project`` turns into facts for the rules; ``hand_written`` and the sentences say, for a
setup left as it was, the same code for a human to write. No libcst, no torch.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass

_STATE_APIS = frozenset({"state_dict", "load_state_dict"})
_CLIPS = ("clip_grads", "clip_grad_norm_", "clip_grad_value_")


@dataclass(frozen=True)
class RunnerSetup:
    """Where ``amp.initialize``'s optimizer goes to a runner built by library code.

    ``plain``: the call is ``amp.initialize(model, optimizer, opt_level="O1")`` (the model maybe
    moved, ``model.cuda()``) in the same block of the function as the statement that builds the
    runner, or in ``if``s there, and the runner built after it in that block or in an ``if``/``else``
    whose every branch builds it: the only shape migrated (the scaler a plain dynamic one, the
    model's forward under float16 autocast where the call was). ``branched``: that call, with the
    runner built in another block (an ``if`` with no ``else``, a loop)."""

    runner: str  # the name the runner is bound to
    builder: str  # the call that builds it (``build_runner``)
    line: int  # the line of that call
    model: str  # the name the model is bound to
    given: str  # the model expression the initialize was given (``model.cuda()``)
    guards: tuple[str, ...]  # the ``if`` tests that guard the initialize, outermost first
    plain: bool = False
    # the lines of the function's own statement that builds the runner: that call's, or an ``if``
    # whose every branch binds the runner to a construction (the scaler goes after its last line)
    span: tuple[int, int] = (0, 0)
    function: int = 0  # the line of the ``def`` of the function that builds it
    # a plain call, but the runner is built in a block that may not run after it, or may leave
    # the name bound to another runner (an ``if`` with no ``else``, a loop)
    branched: bool = False
    # the lines of the statements that bind the runner there (one per branch of that ``if``)
    builds: tuple[int, ...] = ()


def runner_setup(tree: ast.Module, optimizers: set[str], initialize_line: int) -> RunnerSetup | None:
    """The runner that what ``amp.initialize`` (at ``initialize_line``, returning into
    ``optimizers``) made is handed to, in the same function: ``runner = build_runner(cfg,
    default_args=dict(model=model, optimizer=optimizer, ...))``; None for any other shape."""
    for scope in ast.walk(tree):
        if not isinstance(scope, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        found = _initialize_in(scope, initialize_line)
        if found is None:
            continue
        call, target, guards = found
        model = target.elts[0] if isinstance(target, (ast.Tuple, ast.List)) and len(target.elts) == 2 else None
        if not (isinstance(model, ast.Name) and call.args):
            return None
        for statement in _statements(scope.body):
            if not (
                statement.lineno > initialize_line
                and isinstance(statement, ast.Assign)
                and len(statement.targets) == 1
                and isinstance(statement.targets[0], ast.Name)
                and isinstance(statement.value, ast.Call)
            ):
                continue
            built = statement.value
            handed = [*built.args, *(keyword.value for keyword in built.keywords)]
            names = {node.id for node in _walk_all(handed) if isinstance(node, ast.Name)}
            if names & optimizers and model.id in names:
                runner = statement.targets[0].id
                # the statement of the function's own block that builds it: the call's, or an
                # ``if``/``else`` that builds a runner on each branch (mmaction's train_model
                # picks the runner class there); ``runner.scaler = scaler`` goes after it
                top = next((s for s in scope.body if s.lineno <= statement.lineno <= (s.end_lineno or 0)), None)
                plain = (
                    len(call.args) == 2
                    and not isinstance(call.args[0], (ast.List, ast.Tuple))
                    and not _uses_scaler_attribute(tree)
                    and [(k.arg, ast.unparse(k.value)) for k in call.keywords] in ([], [("opt_level", "'O1'")])
                    and not isinstance(scope, ast.Module)
                )
                built_once = (
                    top is not None
                    and (top is statement or (isinstance(top, ast.If) and _builds_on_every_branch(top, runner)))
                    and top.lineno > initialize_line
                )
                branched = plain and not built_once
                return RunnerSetup(
                    runner,
                    ast.unparse(built.func),
                    statement.lineno,
                    model.id,
                    ast.unparse(call.args[0]),
                    guards,
                    plain and built_once,
                    (top.lineno, top.end_lineno or top.lineno) if top is not None else (0, 0),
                    scope.lineno if not isinstance(scope, ast.Module) else 0,
                    branched,
                    tuple(
                        node.lineno
                        for node in (_statements([top]) if top is not None else ())
                        if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == [runner]
                    ),
                )
        return None
    return None


def _builds_on_every_branch(branch: ast.If, runner: str) -> bool:
    """Whether each branch of ``branch`` (its ``elif``s and an ``else`` it must have) is plain
    statements, no block, that bind ``runner`` once, to a call: after it, the runner is the one
    built there whichever branch ran."""
    for body in (branch.body, branch.orelse):
        if len(body) == 1 and isinstance(body[0], ast.If):
            if not _builds_on_every_branch(body[0], runner):
                return False
            continue
        if not body or any(isinstance(statement, _BLOCKS) for statement in body):
            return False
        binds = [
            statement
            for statement in body
            for node in ast.walk(statement)
            if isinstance(node, ast.Name) and node.id == runner and isinstance(node.ctx, ast.Store)
        ]
        if not (
            len(binds) == 1
            and isinstance(binds[0], ast.Assign)
            and [ast.unparse(target) for target in binds[0].targets] == [runner]
            and isinstance(binds[0].value, ast.Call)
        ):
            return False
    return True


_BLOCKS: tuple[type[ast.stmt], ...] = (
    ast.If,
    ast.For,
    ast.AsyncFor,
    ast.While,
    ast.With,
    ast.AsyncWith,
    ast.Try,
    ast.Return,
    ast.Raise,
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
    ast.Match,
    *((ast.TryStar,) if hasattr(ast, "TryStar") else ()),
)


@dataclass(frozen=True)
class ModuleThreading:
    """How one hook or runner module reaches the GradScaler the runner keeps."""

    # (class, method, the expression that reaches the scaler there: ``runner.scaler``, ``self.scaler``)
    methods: tuple[tuple[str, str, str], ...] = ()
    receives: tuple[str, ...] = ()  # top-level functions that take it as a parameter
    passes: tuple[str, ...] = ()  # functions its runner methods call, that take it


def threading(trees: dict[str, ast.Module]) -> dict[str, ModuleThreading] | None:
    """For each module of ``trees`` (display name -> tree), how its amp calls reach the runner's
    GradScaler; None when one of them has another shape than ``hand_written`` reads (or a
    receiving function is called other than by a runner method, which passes the scaler)."""
    receiving = {
        function.name
        for tree in trees.values()
        for call, function, klass in _amp_calls(tree)
        if function is not None and klass is None
    }
    if any(_uses_scaler_attribute(tree) for tree in trees.values()):
        return None  # ``runner.scaler`` / ``self.scaler`` would clash with an attribute of their own
    threaded = {}
    for display, tree in trees.items():
        methods: set[tuple[str, str, str]] = set()
        receives: set[str] = set()
        for call, function, klass in _amp_calls(tree):
            api = call.func.attr if isinstance(call.func, ast.Attribute) else ""
            if function is None or function.name == "__init__":
                return None
            if klass is None:
                receives.add(function.name)
            elif api == "scale_loss":
                if _hook(call, function) is None:
                    return None
                methods.add((klass.name, function.name, f"{ast.unparse(call.args[1].value)}.scaler"))  # type: ignore[attr-defined]
            elif _is_method(function):
                methods.add((klass.name, function.name, "self.scaler"))
            else:
                return None
        passes: set[str] = set()
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            for method in node.body:
                if not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                called = {
                    call.func.id
                    for call in ast.walk(method)
                    if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in receiving
                }
                if called and (not _is_method(method) or method.name == "__init__"):
                    return None
                if called:
                    passes |= called
                    methods.add((node.name, method.name, "self.scaler"))
        # a receiving function called anywhere else would run without the scaler
        for name in receiving:
            calls = sum(
                isinstance(call, ast.Call)
                and (
                    (isinstance(call.func, ast.Name) and call.func.id == name)
                    or (isinstance(call.func, ast.Attribute) and call.func.attr == name)
                )
                for call in ast.walk(tree)
            )
            passed = sum(
                isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == name
                for klass in ast.walk(tree)
                if isinstance(klass, ast.ClassDef)
                for method in klass.body
                if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)) and _is_method(method)
                for call in ast.walk(method)
            )
            if calls != passed:
                return None
        if methods or receives:
            threaded[display] = ModuleThreading(tuple(sorted(methods)), tuple(sorted(receives)), tuple(sorted(passes)))
    return threaded


def hand_written(trees: dict[str, ast.Module], runner: str) -> dict[str, list[str]] | None:
    """For each module of ``trees`` (display name -> tree) that calls Apex amp with no
    ``amp.initialize`` of its own, what to write in place of each call, one sentence per call;
    None when a call has another shape than an mmcv hook's and a runner's (the finding then
    stays the general one). ``runner`` is the name the runner has where the scaler is made."""
    functions = {
        node.name: display
        for display, tree in trees.items()
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    }
    written: dict[str, list[str]] = {}
    for display, tree in trees.items():
        sentences = []
        for call, function, klass in _amp_calls(tree):
            api = call.func.attr if isinstance(call.func, ast.Attribute) else ""
            if api == "initialize":
                return None
            if api == "scale_loss" and function is not None and klass is not None:
                sentence = _hook(call, function)
            elif api in _STATE_APIS and function is not None and klass is not None and _is_method(function):
                sentence = _state("self.scaler", call, api)
            elif api in _STATE_APIS and function is not None and klass is None and function.name in functions:
                callers, state = _callers(trees, function.name), _state("scaler", call, api)
                if not callers or state is None:
                    return None
                sentence = (
                    state + f", with a parameter `scaler=None` added to `{function.name}` and `scaler=self.scaler` "
                    f"passed where the runner calls it ({', '.join(callers)})"
                )
            else:
                return None
            if sentence is None:
                return None
            sentences.append(sentence)
        if sentences:
            written[display] = sentences
    return written if written else None


def creator_sentence(setup: RunnerSetup, others: list[str], why: str) -> str:
    """What to write where ``amp.initialize`` was, for a runner built from what it returned, and
    ``why`` ampmigrate did not write it."""
    enabled = setup.guards[0] if len(setup.guards) == 1 else " and ".join(f"({guard})" for guard in setup.guards)
    scaler = "`scaler = " + 'torch.amp.GradScaler("cuda"' + (f", enabled=bool({enabled}))`" if enabled else ")`")
    if not (setup.plain or setup.branched):
        scaler = (
            "the GradScaler this call's settings ask for (as ampmigrate writes it for one script: a static "
            "`loss_scale` held with `update(new_scale=...)` in the hook, too)"
            + (f", `enabled=bool({enabled})`" if enabled else "")
        )
    where = "before the `if` that guards this call" if setup.guards else "here"
    recast = "" if setup.given == setup.model else f"`{setup.model} = {setup.given}`, "
    return (
        f"what amp.initialize returns is handed to the runner `{setup.runner}` built by `{setup.builder}` at line "
        f"{setup.line}, whose training step runs in the library (the forward pass in its `train_step`) with hooks "
        f"and runner methods found through a registry, not imports, that call Apex amp: {', '.join(others)}; "
        f"the runner would carry the GradScaler to them, but {why}. By hand: "
        f"`{setup.runner}.scaler = scaler` right after line {setup.line if setup.span[0] in (0, setup.line) else setup.span[1]}"
        + (" (and after each other statement that builds a runner the hooks run on)" if setup.branched else "")
        + f", with {scaler} made {where}; "
        f"in place of this call {recast}"
        f'`{setup.model}.forward = torch.autocast("cuda", dtype=torch.float16)({setup.model}.forward)` (Apex O1 '
        "ran the library's forward pass in float16, and removing the call alone would run it in float32 without "
        "a word); then what the findings in those modules say"
    )


def module_sentence(sentences: list[str], creator: str, runner: str) -> str:
    """The reason a hook or runner module stays on Apex, with the code to write in it."""
    return (
        f"Apex amp here belongs to the setup whose amp.initialize is in {creator}, reached through the library's "
        "runner (a registry), not imports, and that setup stays as it was (see its finding). With the GradScaler "
        f"kept on the runner there (`{runner}.scaler = scaler`), write: " + "; ".join(sentences)
    )


def _hook(call: ast.Call, function: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    """``with amp.scale_loss(loss, runner.optimizer) as scaled: scaled.backward()`` in a hook's
    method that gets the runner as a parameter, and the clip and step after it."""
    parameters = [argument.arg for argument in function.args.args]
    if len(call.args) < 2 or len(parameters) < 2:
        return None
    optimizer = call.args[1]
    if not (
        isinstance(optimizer, ast.Attribute)
        and optimizer.attr == "optimizer"
        and isinstance(optimizer.value, ast.Name)
        and optimizer.value.id in parameters[1:]
    ):
        return None
    runner = optimizer.value.id
    loss = ast.unparse(call.args[0])
    steps = [
        node.lineno
        for node in ast.walk(function)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "step"
        and ast.unparse(node.func.value) == f"{runner}.optimizer"
    ]
    if not steps:
        return None
    clips = sorted(
        node.lineno
        for node in ast.walk(function)
        if isinstance(node, ast.Call)
        and (node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")) in _CLIPS
        and node.lineno > call.lineno
    )
    sentence = f"`{runner}.scaler.scale({loss}).backward()` for the `with` block at line {call.lineno}"
    if clips:
        sentence += (
            f", `{runner}.scaler.unscale_({runner}.optimizer)` right before the clip at line "
            + ", ".join(str(line) for line in clips)
            + " (Apex had unscaled the gradients when the block ended)"
        )
    return sentence + "".join(
        f", `{runner}.scaler.step({runner}.optimizer)` then `{runner}.scaler.update()` for "
        f"`{runner}.optimizer.step()` at line {line}"
        for line in sorted(steps)
    )


def _state(scaler: str, call: ast.Call, api: str) -> str | None:
    if api == "state_dict" and not call.args:
        return f"`{scaler}.state_dict()` at line {call.lineno}"
    if api == "load_state_dict" and len(call.args) == 1:
        return (
            f"`{scaler}.load_state_dict(grad_scaler_state({ast.unparse(call.args[0])}))` at line {call.lineno}, "
            "where `grad_scaler_state(state)` returns a GradScaler's state as it is and turns an Apex one "
            '(`{"loss_scaler0": {"loss_scale": s, "unskipped": n}}`) into `{"scale": float(s), "growth_factor": '
            '2.0, "backoff_factor": 0.5, "growth_interval": 2000, "_growth_tracker": n if n < 2000 else 0}`, so '
            "old checkpoints still load"
        )
    return None


def _callers(trees: dict[str, ast.Module], name: str) -> list[str]:
    """``module:line`` of each call of ``name`` in a method (where ``self`` is the runner)."""
    found = []
    for display, tree in trees.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            for method in node.body:
                if not (isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)) and _is_method(method)):
                    continue
                for call in ast.walk(method):
                    if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == name:
                        found.append(f"{display}:{call.lineno}")
    return found


def _uses_scaler_attribute(tree: ast.Module) -> bool:
    return any(isinstance(node, ast.Attribute) and node.attr == "scaler" for node in ast.walk(tree))


def _is_method(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return bool(function.args.args) and function.args.args[0].arg == "self"


def _amp_calls(
    tree: ast.Module,
) -> Iterator[tuple[ast.Call, ast.FunctionDef | ast.AsyncFunctionDef | None, ast.ClassDef | None]]:
    """Each call of the amp module (``amp.X(...)``, ``apex.amp.X(...)``) with its function and class."""

    def visit(
        node: ast.AST, function: ast.FunctionDef | ast.AsyncFunctionDef | None, klass: ast.ClassDef | None
    ) -> Iterator[tuple[ast.Call, ast.FunctionDef | ast.AsyncFunctionDef | None, ast.ClassDef | None]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                yield from visit(child, None, child)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield from visit(child, child, klass if function is None else None)
            else:
                if (
                    isinstance(child, ast.Call)
                    and isinstance(child.func, ast.Attribute)
                    and ast.unparse(child.func.value) in ("amp", "apex.amp")
                ):
                    yield child, function, klass
                yield from visit(child, function, klass)

    yield from visit(tree, None, None)


def _initialize_in(
    scope: ast.Module | ast.FunctionDef | ast.AsyncFunctionDef, line: int
) -> tuple[ast.Call, ast.expr, tuple[str, ...]] | None:
    """The ``amp.initialize`` call of ``scope``'s own code at ``line``, its target and its guards."""

    def visit(statements: list[ast.stmt], guards: tuple[str, ...]) -> tuple[ast.Call, ast.expr, tuple[str, ...]] | None:
        for statement in statements:
            if (
                statement.lineno == line
                and isinstance(statement, ast.Assign)
                and len(statement.targets) == 1
                and isinstance(statement.value, ast.Call)
            ):
                return statement.value, statement.targets[0], guards
            if isinstance(statement, ast.If):
                found = visit(statement.body, (*guards, ast.unparse(statement.test)))
                if found is None and statement.orelse:
                    found = visit(statement.orelse, (*guards, f"not ({ast.unparse(statement.test)})"))
                if found is not None:
                    return found
        return None

    return visit(scope.body, ())


def _statements(statements: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements of a body, those nested in its ``if``/``for``/``with``/``try`` blocks too."""
    for statement in statements:
        yield statement
        for field in ("body", "orelse", "finalbody"):
            yield from _statements(getattr(statement, field, []) or [])
        for handler in getattr(statement, "handlers", []) or []:
            yield from _statements(handler.body)


def _walk_all(nodes: list[ast.expr]) -> Iterator[ast.AST]:
    for node in nodes:
        yield from ast.walk(node)


def foreign_uses(tree: ast.Module, names: set[str], creator: int, runner: str) -> str | None:
    """The first use in ``tree`` of one of ``names`` (the classes of a runner setup's hooks and
    runner methods) that may put one of them on a runner other than the setup's: anything but
    its undecorated definition, an import, a string of ``__all__``, and, in the function at line
    ``creator`` (0: none in this module), ``hook = Name(...)`` handed only to that function's
    ``runner.register_training_hooks(...)`` / ``runner.register_hook(...)``. A decorator (a
    registry), a subclass, a string a config could name it by, an attribute ``module.Name`` and
    a namespace read by name (``globals()``, ``eval``) all count. ``"name:line"``, or None."""
    tracked = set(names)
    holds = False
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name.split(".")[-1] in names or alias.name == "*":
                    tracked.add(alias.asname or alias.name.split(".")[-1])
                    holds = True
        elif isinstance(node, ast.ClassDef) and node.name in names:
            holds = True
            if node.decorator_list:
                return f"{node.name}:{node.lineno}"
    parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    function = function_at(tree, creator)
    inside = set(ast.walk(function)) if function is not None else set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value in tracked:
            owner = parents.get(parents.get(node))  # type: ignore[arg-type]
            if not (
                isinstance(owner, ast.Assign | ast.AugAssign)
                and [ast.unparse(t) for t in getattr(owner, "targets", [getattr(owner, "target", None)])] == ["__all__"]
            ):
                return f"{node.value}:{node.lineno}"
        elif isinstance(node, ast.Attribute) and node.attr in tracked:
            return f"{node.attr}:{node.lineno}"
        elif isinstance(node, ast.Name) and node.id in tracked and node.id != "*":
            if not (node in inside and _handed_to_runner(node, parents, function, runner)):  # type: ignore[arg-type]
                return f"{node.id}:{node.lineno}"
        elif holds and _reads_namespace(node):
            return f"{ast.unparse(node)}:{getattr(node, 'lineno', 0)}"
    return None


def function_at(tree: ast.Module, line: int) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The function whose ``def`` is at ``line`` (a ``RunnerSetup.function``), if any."""
    return next(
        (
            node
            for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.lineno == line
        ),
        None,
    )


def module_values(tree: ast.Module, stems: set[str]) -> str | None:
    """The first use in ``tree`` of a module whose last name is one of ``stems`` (those that hold a
    setup's hook classes) as a value, not ``module.attribute`` nor a call: ``getattr(hooks,
    cfg.type)``, ``obj_from_dict(cfg, hooks)`` could build a hook from a config's string.
    ``"module:line"``, or None."""
    imported: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                imported[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0]
                )
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                imported[alias.asname or alias.name] = f"{node.module or ''}.{alias.name}"
    parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Name, ast.Attribute)) or not isinstance(node.ctx, ast.Load):
            continue
        parent = parents.get(node)
        if isinstance(parent, ast.Attribute) or (isinstance(parent, ast.Call) and parent.func is node):
            continue
        root = node
        while isinstance(root, ast.Attribute):
            root = root.value  # type: ignore[assignment]
        if not isinstance(root, ast.Name) or root.id not in imported:
            continue
        dotted = ast.unparse(node).replace(root.id, imported[root.id], 1)
        if dotted.split(".")[-1] in stems:
            return f"{ast.unparse(node)}:{node.lineno}"
    return None


def _handed_to_runner(
    name: ast.Name, parents: dict[ast.AST, ast.AST], function: ast.FunctionDef | ast.AsyncFunctionDef, runner: str
) -> bool:
    """Whether ``name`` is called, in ``function``, for a hook that only its runner gets:
    ``hook = Name(...)`` with ``hook`` read only as an argument of ``runner.register_*(...)``, or
    ``Name(...)`` such an argument itself."""
    call = parents.get(name)
    if not (isinstance(call, ast.Call) and call.func is name):
        return False
    holder = parents.get(call)
    if isinstance(holder, ast.keyword):
        holder = parents.get(holder)
    if _registers_on(holder, runner):
        return True
    if not (isinstance(holder, ast.Assign) and len(holder.targets) == 1 and isinstance(holder.targets[0], ast.Name)):
        return False
    hook = holder.targets[0].id
    uses = [node for node in ast.walk(function) if isinstance(node, ast.Name) and node.id == hook]
    for use in uses:
        if use is holder.targets[0]:
            continue
        owner = parents.get(use)
        if isinstance(owner, ast.keyword):
            owner = parents.get(owner)
        if not (isinstance(use.ctx, ast.Load) and _registers_on(owner, runner) and use.lineno > holder.lineno):
            return False
    return True


def _registers_on(node: ast.AST | None, runner: str) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("register_training_hooks", "register_hook")
        and ast.unparse(node.func.value) == runner
    )


def _reads_namespace(node: ast.AST) -> bool:
    """``globals()``, ``locals()``, ``vars()``, ``eval``/``exec``, ``sys.modules`` or ``__dict__``:
    a module's names read by a string."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return node.func.id in ("globals", "locals", "eval", "exec", "__import__") or (
            node.func.id == "vars" and not node.args
        )
    return isinstance(node, ast.Attribute) and (
        node.attr == "__dict__" or ast.unparse(node) == "sys.modules" or node.attr == "import_module"
    )
