"""Which names in a module are bound to Apex or torch.amp, and one indexing pass over the tree.

``Indexer`` walks the module once and records, for every node, its parent, its children
and its scope, every node of the few types the rules look for, and per scope the names
bound by imports we track (``Binding``) and the other local names.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import libcst as cst

if TYPE_CHECKING:  # _context builds on this module
    from migrate.rules._context import ModuleContext

Scope = cst.Module | cst.FunctionDef | cst.ClassDef | cst.Lambda


@dataclass(frozen=True)
class Binding:
    """A name bound by an import of something we care about.

    kind: "amp" (the apex.amp module), "apex" (the apex package), "amp_function"
    (``from apex.amp import scale_loss``; ``target`` is the function), "other_apex"
    (any other Apex module or object; ``target`` is its dotted path), "torch_amp"
    (a deprecated ``torch.cuda.amp`` / ``torch.cpu.amp`` object; ``target`` is e.g.
    ``cuda.autocast``), "torch" (the torch package).
    """

    kind: str
    target: str
    alias: cst.ImportAlias
    statement: cst.Import | cst.ImportFrom
    # an "other_apex" name imported from a project module that copies Apex (``migrate.apex_copies``):
    # where the copy defines it, and why dynamic loss scaling with it cannot be migrated ("": it can)
    copy: str | None = None
    copy_dynamic: str = ""


def bound_name(alias: cst.ImportAlias) -> str:
    """The name an import alias binds: its ``as`` name, else the first part of what it imports
    (``import a.b`` binds ``a``; ``from m import x`` binds ``x``)."""
    if alias.asname is not None:
        return dotted_name(alias.asname.name) or ""  # type: ignore[arg-type]
    return (dotted_name(alias.name) or "").split(".")[0]


def global_names(declarations: list[cst.Global]) -> set[str]:
    """The names some ``global`` statements declare."""
    return {item.name.value for declaration in declarations for item in declaration.names}


def dotted_name(node: cst.BaseExpression) -> str | None:
    """``a.b.c`` for a chain of Names and Attributes, else None."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = dotted_name(node.value)
        return None if base is None else f"{base}.{node.attr.value}"
    return None


def target_names(target: cst.BaseExpression) -> Iterator[str]:
    """Plain names bound by an assignment target (tuples and starred unpacked)."""
    if isinstance(target, cst.Name):
        yield target.value
    elif isinstance(target, (cst.Tuple, cst.List)):
        for element in target.elements:
            yield from target_names(element.value)
    elif isinstance(target, cst.StarredElement):
        yield from target_names(target.value)


def is_import_fallback(ctx: ModuleContext, name: cst.Name) -> bool:
    """``amp = None`` (or ``del amp``, or ``amp, x = ...``) in an ``except`` clause: the
    fallback for an import that failed rebinds the name, it does not use what was imported."""
    parent = ctx.parent(name)
    if isinstance(parent, cst.Element):  # one name of a tuple or list target
        container = ctx.parent(parent)
        parent = ctx.parent(container) if container is not None else None
    if not isinstance(parent, (cst.AssignTarget, cst.Del)):
        return False
    below: cst.CSTNode = name
    for ancestor in ctx.ancestors(name):
        if isinstance(ancestor, cst.ExceptHandler):
            return True
        if isinstance(ancestor, cst.If):
            # `if use_apex: from apex.parallel import DDP` / `else: DDP = torch's`: the other branch
            other = ancestor.orelse if below is ancestor.body else ancestor.body if below is ancestor.orelse else None
            if other is not None and _imports_from_apex(ctx, other, name.value):
                return True
        below = ancestor
    return False


def _imports_from_apex(ctx: ModuleContext, block: cst.CSTNode, bound: str) -> bool:
    """Whether ``block`` itself (not a function in it) imports ``bound`` from Apex."""
    for node in ctx.walk(block, into_definitions=False):
        if (
            isinstance(node, cst.ImportFrom)
            and node.module
            and (dotted_name(node.module) or "").split(".")[0] == "apex"
        ):
            names = node.names if isinstance(node.names, (list, tuple)) else ()
            if any(_bound_by(alias) == bound for alias in names):
                return True
        if isinstance(node, cst.Import) and any(
            _bound_by(alias) == bound and (dotted_name(alias.name) or "").split(".")[0] == "apex"
            for alias in node.names
        ):
            return True
    return False


def _bound_by(alias: cst.ImportAlias) -> str | None:
    if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
        return alias.asname.name.value
    return (dotted_name(alias.name) or "").split(".")[0] or None


def checks_presence(ctx: ModuleContext, node: cst.CSTNode) -> bool:
    """``amp is None`` / ``amp is not None`` / ``not amp`` / ``if amp:`` / ``assert amp``."""
    return presence_check(ctx, node) is not None


def presence_check(ctx: ModuleContext, node: cst.CSTNode) -> cst.CSTNode | None:
    """The construct whose test only checks that ``node`` is bound (see ``checks_presence``):
    the ``if``/``while``/``assert``/conditional expression, or the ``is None`` comparison."""
    parent = ctx.parent(node)
    comparison = None
    if isinstance(parent, cst.Comparison) and len(parent.comparisons) == 1:
        target = parent.comparisons[0]
        if isinstance(target.operator, (cst.Is, cst.IsNot)) and isinstance(target.comparator, cst.Name):
            if target.comparator.value == "None":
                comparison = node = parent
                parent = ctx.parent(parent)
    while isinstance(parent, (cst.UnaryOperation, cst.BooleanOperation)):
        node, parent = parent, ctx.parent(parent)
    if isinstance(parent, (cst.If, cst.While, cst.Assert, cst.IfExp)) and getattr(parent, "test", None) is node:
        return parent
    return comparison


def _classify_import(module_path: str, name: str) -> tuple[str, str] | None:
    """Binding kind and target for ``from module_path import name``."""
    full = f"{module_path}.{name}"
    if full == "apex.amp":
        return ("amp", "apex.amp")
    if module_path == "apex.amp":
        return ("amp_function", name)
    if module_path == "apex" or module_path.startswith("apex."):
        return ("other_apex", full)
    if module_path in ("torch.cuda.amp", "torch.cpu.amp"):
        return ("torch_amp", f"{module_path.split('.')[1]}.{name}")
    if module_path in ("torch.cuda", "torch.cpu") and name == "amp":
        return ("torch_amp_module", module_path.split(".")[1])
    return None


_SKIPPED_FIELDS = frozenset(
    {
        "lpar",
        "rpar",
        "lbracket",
        "rbracket",
        "lbrace",
        "rbrace",
        "comma",
        "semicolon",
        "equal",
        "colon",
        "dot",
        "header",
        "footer",
        "leading_lines",
        "lines_after_decorators",
        "trailing_whitespace",
        "asynchronous",
        "operator",
        "star_tok",
        "default_indent",
    }
)
_FIELDS: dict[type, tuple[str, ...]] = {}


def _child_fields(kind: type) -> tuple[str, ...]:
    """The fields of a node type that can hold the nodes the rules care about, in source order."""
    names = _FIELDS.get(kind)
    if names is None:
        names = tuple(
            f.name for f in fields(kind) if not f.name.startswith("whitespace") and f.name not in _SKIPPED_FIELDS
        )
        if "decorators" in names:  # decorators come first in the source, last in the dataclass
            names = ("decorators", *(name for name in names if name != "decorators"))
        _FIELDS[kind] = names
    return names


class Indexer:
    """One pass over the tree: parents, children, nodes by type, and bindings per scope.

    It walks the dataclass fields itself instead of using a libcst visitor: a libcst visit
    rebuilds every node it passes, which costs several times more than this walk. The
    ``visit_X`` / ``leave_X`` methods below are dispatched by node type, as a visitor's are.
    """

    INDEXED = (cst.Call, cst.Name, cst.Decorator, cst.ImportFrom, cst.With)

    def __init__(self) -> None:
        self.imports: dict[Scope, dict[str, list[Binding]]] = defaultdict(lambda: defaultdict(list))
        self.locals: dict[Scope, set[str]] = defaultdict(set)
        # imports of other modules' names, per scope: one may rebind a tracked name on a path
        # (`from torch.nn.parallel import DistributedDataParallel` in the else of an Apex branch)
        self.other_imports: dict[Scope, dict[str, list[cst.Import | cst.ImportFrom]]] = defaultdict(
            lambda: defaultdict(list)
        )
        self.scope_parent: dict[Scope, Scope | None] = {}
        self.parents: dict[cst.CSTNode, cst.CSTNode] = {}
        self.children: dict[cst.CSTNode, list[cst.CSTNode]] = defaultdict(list)
        self.nodes: dict[type, list[cst.CSTNode]] = defaultdict(list)
        self.scope: dict[cst.CSTNode, Scope] = {}
        # a function's `global` statements: what it binds to their names lives in the module's scope
        self.globals: dict[cst.FunctionDef, list[cst.Global]] = defaultdict(list)
        self._stack: list[Scope] = []

    def index(self, root: cst.Module) -> None:
        pending: list[tuple[cst.CSTNode, cst.CSTNode | None, bool]] = [(root, None, False)]
        parents, children, scope, nodes = self.parents, self.children, self.scope, self.nodes
        indexed = dict.fromkeys(self.INDEXED, True)
        hooks: dict[type, tuple[object, object]] = {}
        is_node: dict[type, bool] = {}  # isinstance on the CSTNode ABC is slow; types repeat
        while pending:
            node, parent, leaving = pending.pop()
            kind = type(node)
            hook = hooks.get(kind)
            if hook is None:
                hook = hooks[kind] = (
                    getattr(self, "visit_" + kind.__name__, None),
                    getattr(self, "leave_" + kind.__name__, None),
                )
            if leaving:
                hook[1](node)  # type: ignore[operator]
                continue
            if parent is not None:
                parents[node] = parent
                children[parent].append(node)
            if self._stack:
                scope[node] = self._stack[-1]
            if kind in indexed:
                nodes[kind].append(node)
            if hook[0] is not None:
                hook[0](node)  # type: ignore[operator]
            if hook[1] is not None:
                pending.append((node, None, True))
            found: list[cst.CSTNode] = []
            for name in _child_fields(kind):
                value = getattr(node, name)
                value_kind = type(value)
                if value_kind is list or value_kind is tuple:
                    for item in value:
                        item_kind = type(item)
                        known = is_node.get(item_kind)
                        if known is None:
                            known = is_node[item_kind] = issubclass(item_kind, cst.CSTNode)
                        if known:
                            found.append(item)
                    continue
                known = is_node.get(value_kind)
                if known is None:
                    known = is_node[value_kind] = issubclass(value_kind, cst.CSTNode)
                if known:
                    found.append(value)
            pending.extend((child, node, False) for child in reversed(found))

    # scopes
    def visit_Module(self, node: cst.Module) -> None:
        self.scope_parent[node] = None
        self._stack.append(node)

    def _push(self, node: Scope) -> None:
        self.scope_parent[node] = self._stack[-1]
        self._stack.append(node)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.locals[self._stack[-1]].add(node.name.value)
        self._push(node)
        params = node.params
        for param in (*params.posonly_params, *params.params, *params.kwonly_params):
            self.locals[node].add(param.name.value)
        for star in (params.star_arg, params.star_kwarg):
            if isinstance(star, cst.Param):
                self.locals[node].add(star.name.value)

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self._stack.pop()
        if original_node in self.globals:
            # `from apex import amp` then `global amp` in a function binds the module's `amp`
            # (the declaration holds for the whole function, wherever it stands)
            module = self._stack[0]
            for name in global_names(self.globals[original_node]):
                moved = self.imports.get(original_node, {}).pop(name, None)
                if moved:
                    self.imports[module][name].extend(moved)
                if name in self.locals.get(original_node, ()):
                    self.locals[original_node].discard(name)
                    self.locals[module].add(name)

    def visit_Global(self, node: cst.Global) -> None:
        scope = self._stack[-1]
        if isinstance(scope, cst.FunctionDef):
            self.globals[scope].append(node)

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.locals[self._stack[-1]].add(node.name.value)
        self._push(node)

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self._stack.pop()

    def visit_Lambda(self, node: cst.Lambda) -> None:
        self._push(node)
        for param in node.params.params:
            self.locals[node].add(param.name.value)

    def leave_Lambda(self, original_node: cst.Lambda) -> None:
        self._stack.pop()

    # bindings
    def _bind(self, target: cst.BaseExpression) -> None:
        self.locals[self._stack[-1]].update(target_names(target))

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self._bind(node.target)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._bind(node.target)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._bind(node.target)

    def visit_For(self, node: cst.For) -> None:
        self._bind(node.target)

    def visit_AsName(self, node: cst.AsName) -> None:
        # `with ... as x` and `except E as x`; import aliases are handled below.
        if isinstance(node.name, (cst.Name, cst.Tuple, cst.List)):
            self._bind(node.name)

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self._bind(node.target)

    def visit_Import(self, node: cst.Import) -> None:
        scope = self._stack[-1]
        for alias in node.names:
            path = dotted_name(alias.name) or ""
            bound = bound_name(alias)
            if alias.asname is not None:
                if path == "apex.amp":
                    kind, target = "amp", "apex.amp"
                elif path == "apex":  # the package under another name (`import apex as amp`)
                    kind, target = "apex", path
                elif path.startswith("apex."):
                    kind, target = "other_apex", path
                elif path in ("torch.cuda.amp", "torch.cpu.amp"):
                    kind, target = "torch_amp_module", path.split(".")[1]
                elif path == "torch":
                    kind, target = "torch", "torch"
                else:
                    self.locals[scope].add(bound)
                    self.other_imports[scope][bound].append(node)
                    continue
            elif bound == "apex":
                kind, target = "apex", path
            elif bound == "torch":
                kind, target = "torch", "torch"
            else:
                self.locals[scope].add(bound)
                self.other_imports[scope][bound].append(node)
                continue
            self.imports[scope][bound].append(Binding(kind, target, alias, node))

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        scope = self._stack[-1]
        if node.relative or node.module is None:
            return
        module_path = dotted_name(node.module) or ""
        if isinstance(node.names, cst.ImportStar):
            if module_path == "apex" or module_path.startswith("apex."):
                self.imports[scope]["*"].append(
                    Binding("other_apex", f"{module_path}.*", cst.ImportAlias(cst.Name("_")), node)
                )
            return
        for alias in node.names:
            name = dotted_name(alias.name) or ""
            bound = bound_name(alias)
            classified = _classify_import(module_path, name)
            if classified is None:
                self.locals[scope].add(bound)
                self.other_imports[scope][bound].append(node)
                continue
            self.imports[scope][bound].append(Binding(*classified, alias, node))


def imported_name(ctx: ModuleContext, modules: frozenset[str], name: str) -> tuple[str, cst.ImportFrom] | None:
    """The local name of ``from <module> import <name>`` (a module-level import, the name
    bound nowhere else), with its import statement."""
    found = None
    for statement in ctx.nodes_of(cst.ImportFrom):
        if statement.module is None or dotted_name(statement.module) not in modules or statement.relative:
            continue
        if isinstance(statement.names, cst.ImportStar) or ctx.function_of(statement) is not None:
            continue
        for alias in statement.names:
            if dotted_name(alias.name) == name:
                if found is not None:
                    return None
                found = (bound_name(alias), statement)
    if found is None or rebound(ctx, found[0]):
        return None
    return found


def rebound(ctx: ModuleContext, local: str) -> bool:
    """Whether code other than an import binds ``local`` (an assignment, def, class, parameter,
    ``as`` or loop target)."""
    return any(
        not (isinstance(parent := ctx.parent(name), cst.AsName) and isinstance(ctx.parent(parent), cst.ImportAlias))
        for name in binding_names(ctx, local)
    )


def binding_names(ctx: ModuleContext, local: str) -> list[cst.Name]:
    """The names that bind ``local`` where they stand: the target of an assignment or loop
    (comprehensions too), the name of a def, class or parameter, an ``as`` name (of an import
    too)."""
    found = []
    for name in ctx.nodes_of(cst.Name):
        if name.value != local:
            continue
        parent = ctx.parent(name)
        if (
            (isinstance(parent, cst.AssignTarget) and parent.target is name)
            or (isinstance(parent, (cst.FunctionDef, cst.ClassDef, cst.Param, cst.AsName)) and parent.name is name)
            or (isinstance(parent, (cst.For, cst.CompFor)) and parent.target is name)
        ):
            found.append(name)
    return found
