"""What the rules share: one analysis of the module and one plan of edits.

Rules never edit the tree themselves. They read the analysis (which names are bound to
Apex, where each node sits) and record edits in the ``Plan`` keyed by *original* nodes;
``migrate.rules._apply`` then applies the whole plan in a single transform. Keying by
original nodes lets several rules touch one block without stepping on each other.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import TypeVar

import libcst as cst
from libcst._nodes.internal import CodegenState

from migrate import pytree
from migrate.findings import Finding, make_finding
from migrate.options import Options

_N = TypeVar("_N", bound=cst.CSTNode)
Block = cst.Module | cst.IndentedBlock
# what a block holds (libcst types its bodies more loosely)
Statement = cst.SimpleStatementLine | cst.BaseCompoundStatement
Scope = cst.Module | cst.FunctionDef | cst.ClassDef | cst.Lambda

SKIP_COMMENT = re.compile(r"#\s*ampmigrate:\s*skip\b")


# --------------------------------------------------------------------------- bindings


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


class _Indexer:
    """One pass over the tree: parents, children, nodes by type, and bindings per scope.

    It walks the dataclass fields itself instead of using a libcst visitor: a libcst visit
    rebuilds every node it passes, which costs several times more than this walk. The
    ``visit_X`` / ``leave_X`` methods below are dispatched by node type, as a visitor's are.
    """

    INDEXED = (cst.Call, cst.Name, cst.Decorator, cst.ImportFrom, cst.With)

    def __init__(self) -> None:
        self.imports: dict[Scope, dict[str, list[Binding]]] = defaultdict(lambda: defaultdict(list))
        self.locals: dict[Scope, set[str]] = defaultdict(set)
        self.scope_parent: dict[Scope, Scope | None] = {}
        self.parents: dict[cst.CSTNode, cst.CSTNode] = {}
        self.children: dict[cst.CSTNode, list[cst.CSTNode]] = defaultdict(list)
        self.nodes: dict[type, list[cst.CSTNode]] = defaultdict(list)
        self.scope: dict[cst.CSTNode, Scope] = {}
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
            if alias.asname is not None:
                bound = dotted_name(alias.asname.name) or ""  # type: ignore[arg-type]
                if path == "apex.amp":
                    kind, target = "amp", "apex.amp"
                elif path == "apex" or path.startswith("apex."):
                    kind, target = "other_apex", path
                elif path in ("torch.cuda.amp", "torch.cpu.amp"):
                    kind, target = "torch_amp_module", path.split(".")[1]
                elif path == "torch":
                    kind, target = "torch", "torch"
                else:
                    self.locals[scope].add(bound)
                    continue
            else:
                bound = path.split(".")[0]
                if bound == "apex":
                    kind, target = "apex", path
                elif bound == "torch":
                    kind, target = "torch", "torch"
                else:
                    self.locals[scope].add(bound)
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
            bound = (
                dotted_name(alias.asname.name) or name if alias.asname is not None else name  # type: ignore[arg-type]
            )
            classified = _classify_import(module_path, name)
            if classified is None:
                self.locals[scope].add(bound)
                continue
            self.imports[scope][bound].append(Binding(*classified, alias, node))


# --------------------------------------------------------------------------- positions


class _OffsetState(CodegenState):
    """Code generation that notes where each node starts and ends, as character offsets.

    It follows libcst's own position provider (syntactic positions win over the whole
    extent, so a statement starts after its leading comment lines), but counts characters
    instead of splitting every token into lines.
    """

    def __init__(self, module: cst.Module) -> None:
        super().__init__(default_indent=module.default_indent, default_newline=module.default_newline)
        self.offset = 0
        self.spans: dict[cst.CSTNode, tuple[int, int]] = {}
        self._starts: list[int] = []

    def add_token(self, value: str) -> None:
        self.tokens.append(value)
        self.offset += len(value)

    def add_indent_tokens(self) -> None:
        for token in self.indent_tokens:
            self.add_token(token)

    def before_codegen(self, node: cst.CSTNode) -> None:
        self._starts.append(self.offset)

    def after_codegen(self, node: cst.CSTNode) -> None:
        start = self._starts.pop()
        self.spans.setdefault(node, (start, self.offset))

    @contextmanager
    def record_syntactic_position(
        self, node: cst.CSTNode, *, start_node: cst.CSTNode | None = None, end_node: cst.CSTNode | None = None
    ) -> Iterator[None]:
        start = self.offset
        try:
            yield
        finally:
            end = self.offset
            if start_node is not None:
                start = self.spans[start_node][0]
            if end_node is not None:
                end = self.spans[end_node][1]
            self.spans[node] = (start, end)


def _offsets(module: cst.Module) -> dict[cst.CSTNode, tuple[int, int]]:
    state = _OffsetState(module)
    module._codegen(state)
    return state.spans


# --------------------------------------------------------------------------- plan


@dataclass
class Plan:
    """Edits keyed by original nodes; applied in one pass by ``_apply``."""

    # expression node -> function(updated expression) -> new expression
    replace: dict[cst.CSTNode, Callable[[cst.CSTNode], cst.CSTNode]] = field(default_factory=dict)
    # statements removed (their comments move to the next statement emitted)
    remove: set[cst.CSTNode] = field(default_factory=set)
    # statements replaced by others
    replace_statement: dict[cst.CSTNode, list[Statement]] = field(default_factory=dict)
    # `with` statements replaced by their own (updated) body
    unwrap: set[cst.CSTNode] = field(default_factory=set)
    before: dict[cst.CSTNode, list[Statement]] = field(default_factory=lambda: defaultdict(list))
    after: dict[cst.CSTNode, list[Statement]] = field(default_factory=lambda: defaultdict(list))
    # first statement -> (last statement, with item): statements first..last go in a `with`
    wrap: dict[cst.CSTNode, tuple[cst.CSTNode, cst.WithItem]] = field(default_factory=dict)
    # function definitions that get new parameters (name, default or None)
    new_params: dict[cst.CSTNode, list[tuple[str, cst.BaseExpression | None]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    # calls that get new keyword arguments
    new_keywords: dict[cst.CSTNode, list[tuple[str, cst.BaseExpression]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    # module-level statements added right after the imports (a scaler shared by functions)
    module_globals: list[Statement] = field(default_factory=list)
    # module-level helper functions added after the imports
    module_helpers: list[Statement] = field(default_factory=list)
    needs_torch_import: bool = False

    def substitute(self, node: cst.CSTNode, replacement: cst.CSTNode) -> None:
        """Replace ``node`` by a fixed new node (whatever happened inside it)."""
        self.replace[node] = lambda _updated: replacement

    @property
    def empty(self) -> bool:
        return not (
            self.replace
            or self.remove
            or self.replace_statement
            or self.unwrap
            or self.before
            or self.after
            or self.wrap
            or self.new_params
            or self.new_keywords
            or self.module_helpers
            or self.module_globals
        )


# --------------------------------------------------------------------------- context


class ModuleContext:
    """The module, its analysis, the plan being built and the findings so far."""

    def __init__(self, module: cst.Module, source: str, options: Options) -> None:
        self.source = source
        self.options = options
        self.module = module
        index = _Indexer()
        index.index(module)
        self.imports = index.imports
        self.locals = index.locals
        self.scope_parent = index.scope_parent
        self._parents = index.parents
        self._children = index.children
        self._nodes = index.nodes
        self._scope = index.scope
        self._tracked = {name for bindings in self.imports.values() for name in bindings}
        self._positions: dict[cst.CSTNode, tuple[int, int]] | None = None
        self._line_starts: list[int] = []
        self._first_lines: dict[cst.CSTNode, int] | None = None
        self._statement_offsets: dict[cst.CSTNode, tuple[dict[cst.CSTNode, tuple[int, int]], str]] = {}
        self._call_order: dict[int, int] | None = None
        self.plan = Plan()
        self.findings: list[Finding] = []
        # reference nodes (Names) whose Apex use has been rewritten away
        self.consumed: set[cst.CSTNode] = set()
        self.skip_lines = {
            number for number, line in enumerate(source.splitlines(), start=1) if SKIP_COMMENT.search(line)
        }
        self._all_names: set[str] | None = None

    # positions and findings
    def _locate(self, node: cst.CSTNode) -> tuple[int, int, int]:
        """1-based start line, start column and end line of ``node`` in the input.

        Only the top-level statement holding ``node`` is generated again (with offsets);
        Python's own parser says on which line that statement starts. Findings are rare
        and local, so this costs a fraction of a whole-module position pass.
        """
        top = node
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, cst.Module):
                break
            top = ancestor
        first_lines = self._top_level_lines()
        if top not in first_lines:
            return self._locate_in_module(node)
        known = self._statement_offsets.get(top)
        if known is None:
            state = _OffsetState(self.module)
            top._codegen(state)
            known = self._statement_offsets[top] = (state.spans, "".join(state.tokens))
        spans, code = known
        # the line the statement's own code (leading comment lines included) starts on
        origin = first_lines[top] - code.count("\n", 0, spans[top][0])
        start, end = spans[node]
        column = start - (code.rfind("\n", 0, start) + 1) + 1
        return origin + code.count("\n", 0, start), column, origin + code.count("\n", 0, max(start, end - 1))

    def _top_level_lines(self) -> dict[cst.CSTNode, int]:
        """The line each top-level statement's syntax starts on, from ``ast``."""
        if self._first_lines is None:
            self._first_lines = {}
            try:
                body = pytree.parse(self.source).body  # the engine's tree, not a second parse
            except (SyntaxError, ValueError, RecursionError):
                return self._first_lines
            # libcst starts a decorated definition at `def`/`class`, as ast's lineno does
            lines = [statement.lineno for statement in body]
            index = 0
            for statement in self.module.body:
                if index >= len(lines):
                    self._first_lines = {}
                    break
                self._first_lines[statement] = lines[index]
                index += len(statement.body) if isinstance(statement, cst.SimpleStatementLine) else 1
        return self._first_lines

    def _locate_in_module(self, node: cst.CSTNode) -> tuple[int, int, int]:
        """The same, from a position pass over the whole module (when ``ast`` disagrees)."""
        if self._positions is None:
            self._positions = _offsets(self.module)
            self._line_starts = [0, *(i + 1 for i, char in enumerate(self.source) if char == "\n")]
        start, end = self._positions[node]
        line = bisect_right(self._line_starts, start)
        return line, start - self._line_starts[line - 1] + 1, bisect_right(self._line_starts, max(start, end - 1))

    def position(self, node: cst.CSTNode) -> tuple[int, int]:
        """1-based line and column of ``node`` in the input."""
        line, column, _ = self._locate(node)
        return line, column

    def report(self, code: str, node: cst.CSTNode, message: str | None = None) -> None:
        line, column = self.position(node)
        finding = make_finding(code, line, column, message)
        if finding not in self.findings:
            self.findings.append(finding)

    def skipped(self, node: cst.CSTNode) -> bool:
        """True (and reported) when a `# ampmigrate: skip` comment covers ``node``'s statement."""
        if not self.skip_lines:
            return False
        first, _, last = self._locate(self.statement_of(node))
        if any(first <= line <= last for line in self.skip_lines):
            self.report("AMP050", node)
            return True
        return False

    def code(self, node: cst.CSTNode) -> str:
        return self.module.code_for_node(node)

    # tree navigation
    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return self._parents.get(node)

    def nodes_of(self, kind: type[_N]) -> list[_N]:
        """Every node of one indexed type (Call, Name, Decorator, ImportFrom, With), in source order."""
        return self._nodes.get(kind, [])  # type: ignore[return-value]

    def order(self, node: cst.Call) -> int:
        """Source-order index of a call (for "before" / "after" questions)."""
        if self._call_order is None:
            self._call_order = {id(call): index for index, call in enumerate(self.nodes_of(cst.Call))}
        return self._call_order[id(node)]

    def children(self, node: cst.CSTNode) -> list[cst.CSTNode]:
        return self._children.get(node, [])

    def walk(self, node: cst.CSTNode, into_definitions: bool = True) -> Iterator[cst.CSTNode]:
        """``node`` and everything under it (optionally not entering nested defs)."""
        stack = [node]
        while stack:
            current = stack.pop()
            yield current
            for child in self._children.get(current, ()):
                if into_definitions or not isinstance(child, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                    stack.append(child)

    def ancestors(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        current = self._parents.get(node)
        while current is not None:
            yield current
            current = self._parents.get(current)

    def statement_of(self, node: cst.CSTNode) -> cst.CSTNode:
        """The statement (a direct child of a block) that contains ``node``."""
        current = node
        for parent in self.ancestors(node):
            if isinstance(parent, (cst.Module, cst.IndentedBlock)):
                return current
            current = parent
        return current

    def block_of(self, statement: cst.CSTNode) -> Block:
        parent = self.parent(statement)
        assert isinstance(parent, (cst.Module, cst.IndentedBlock))
        return parent

    def owner_of_block(self, block: Block) -> cst.CSTNode | None:
        """The compound statement (or clause) a block belongs to; None for the module."""
        if isinstance(block, cst.Module):
            return None
        return self.parent(block)

    def scope_of(self, node: cst.CSTNode) -> Scope:
        """The innermost function, lambda, class or module whose body holds ``node``."""
        known = self._scope.get(node)
        if known is not None:
            return known
        for parent in self.ancestors(node):
            if isinstance(parent, (cst.FunctionDef, cst.Lambda, cst.Module)):
                return parent
            if isinstance(parent, cst.ClassDef):
                return parent
        return self.module

    def function_of(self, node: cst.CSTNode) -> cst.FunctionDef | None:
        scope = self.scope_of(node)
        return scope if isinstance(scope, cst.FunctionDef) else None

    def class_of_method(self, function: cst.FunctionDef) -> cst.ClassDef | None:
        parent = self.parent(function)
        if isinstance(parent, cst.IndentedBlock):
            owner = self.parent(parent)
            if isinstance(owner, cst.ClassDef):
                return owner
        return None

    def self_name(self, function: cst.FunctionDef) -> str | None:
        params = function.params.posonly_params or function.params.params
        return params[0].name.value if params else None

    # name resolution
    def resolve(self, name: str, at: cst.CSTNode) -> Binding | None:
        """The import binding ``name`` refers to at ``at``, if it is one we track."""
        if name not in self._tracked:
            return None  # most names are never bound by an import we track
        scope: Scope | None = self.scope_of(at)
        first = True
        while scope is not None:
            # class bodies do not enclose their methods
            if isinstance(scope, cst.ClassDef) and not first:
                scope = self.scope_parent.get(scope)
                continue
            bindings = self.imports.get(scope, {}).get(name)
            if bindings:
                return bindings[-1]
            if name in self.locals.get(scope, ()):
                return None
            first = False
            scope = self.scope_parent.get(scope)
        return None

    def amp_api(self, func: cst.BaseExpression) -> tuple[str, cst.Name] | None:
        """For ``amp.X`` / ``apex.amp.X`` / a name from ``apex.amp``: (X, the base Name)."""
        if isinstance(func, cst.Attribute):
            base = func.value
            if isinstance(base, cst.Name):
                binding = self.resolve(base.value, base)
                if binding is not None and binding.kind == "amp":
                    return func.attr.value, base
            if isinstance(base, cst.Attribute) and base.attr.value == "amp" and isinstance(base.value, cst.Name):
                binding = self.resolve(base.value.value, base.value)
                if binding is not None and binding.kind == "apex":
                    return func.attr.value, base.value
        elif isinstance(func, cst.Name):
            binding = self.resolve(func.value, func)
            if binding is not None and binding.kind == "amp_function":
                return binding.target, func
        return None

    def apex_path(self, expression: cst.BaseExpression) -> tuple[str, cst.Name] | None:
        """``apex.optimizers.FusedAdam`` for any spelling that reaches an Apex object."""
        rest: list[str] = []
        node = expression
        while isinstance(node, cst.Attribute):
            rest.insert(0, node.attr.value)
            node = node.value
        if not isinstance(node, cst.Name):
            return None
        binding = self.resolve(node.value, node)
        if binding is None:
            return None
        if binding.kind == "apex":
            return ".".join(["apex", *rest]), node
        if binding.kind == "other_apex":
            return ".".join([binding.target, *rest]), node
        return None

    def all_names(self) -> set[str]:
        """Every identifier in the file (names and attribute names), for clash checks."""
        if self._all_names is None:
            self._all_names = {name.value for name in self.nodes_of(cst.Name)}
        return self._all_names

    def fresh_name(self, preferred: str) -> str:
        names = self.all_names()
        for candidate in (preferred, f"grad_{preferred}", f"amp_{preferred}"):
            if candidate not in names:
                names.add(candidate)
                return candidate
        counter = 1
        while f"{preferred}_{counter}" in names:
            counter += 1
        names.add(f"{preferred}_{counter}")
        return f"{preferred}_{counter}"
