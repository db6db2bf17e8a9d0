"""What the rules share: one analysis of the module, the plan of edits, the findings.

Rules never edit the tree themselves. They read the analysis (which names are bound to
Apex, where each node sits) through ``ModuleContext`` and record edits in its ``Plan``,
keyed by *original* nodes; ``migrate.rules._apply`` then applies the whole plan in a
single transform. The pieces live in their own modules: ``_bindings`` (import bindings
and the indexing pass), ``_positions`` (lines and columns), ``_plan`` (the edits).
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import cached_property
from typing import Any, TypeVar

import libcst as cst

from migrate import pytree
from migrate.findings import Finding, make_finding
from migrate.gradient_norms import gradient_norms_of
from migrate.options import Options
from migrate.rules._amp import AmpModel
from migrate.rules._bindings import Binding, Indexer, Scope, dotted_name, target_names
from migrate.rules._carriers import Carriers
from migrate.rules._handles import Handles
from migrate.rules._plan import Block, Plan, Statement
from migrate.rules._positions import Positions
from migrate.skip import SKIP_COMMENT

# the names rules imported from here before the split keep working
__all__ = ["Binding", "Block", "ModuleContext", "Plan", "Scope", "Statement", "dotted_name", "target_names"]

_N = TypeVar("_N", bound=cst.CSTNode)


class ModuleContext:
    """The module, its analysis, the plan being built and the findings so far."""

    def __init__(
        self, module: cst.Module, source: str, options: Options, handed_over: ModuleContext | None = None
    ) -> None:
        """``handed_over``: a context of this very module and text that is done with (its
        index, a third of planning a file, is taken over rather than built again)."""
        self.source = source
        self.options = options
        self.module = module
        index: Indexer
        positions: Positions
        if handed_over is None:
            index = Indexer()
            index.index(module)
            positions = Positions(module, source)
        else:
            # taken, not shared: bind() adds to the imports, which the old context must
            # not have done (else its bindings would be here too)
            assert handed_over.module is module and handed_over.source is source
            index, positions = handed_over._index, handed_over._positions
        self._index: Indexer = index
        self.imports = index.imports
        self.other_imports = index.other_imports
        self.locals = index.locals
        self.global_declarations = index.globals
        self.scope_parent = index.scope_parent
        self._parents = index.parents
        self._children = index.children
        self._nodes = index.nodes
        self._scope = index.scope
        self._positions: Positions = positions
        self._tracked = {name for bindings in self.imports.values() for name in bindings}
        self._call_order: dict[int, int] | None = None
        self.plan = Plan()
        self.findings: list[Finding] = []
        # reference nodes (Names) whose Apex use has been rewritten away
        self.consumed: set[cst.CSTNode] = set()
        # amp uses rewritten only in part (a scale_loss whose forward pass was not found): the
        # setup must stay as it was, whatever else was rewritten
        self.unfinished: list[cst.CSTNode] = []
        # every amp use was folded away under a flag nothing sets any more (a vendored Hugging Face
        # Trainer's Apex backend): no scaler was made for other modules, and their Apex branches under
        # that flag are dead code, not a setup that continues there
        self.amp_folded_away = False
        # findings that only explain why the amp setup stays: dropped where the other rules
        # migrate it after all (a Trainer-like class whose amp.initialize migrates on its own)
        self.explains_leftovers: list[Finding] = []
        # code the plan drops whole (a branch that never runs): its calls are not reported as unseen amp
        self.dropped: list[cst.CSTNode] = []
        self.skip_lines = {
            number for number, line in enumerate(source.splitlines(), start=1) if SKIP_COMMENT.search(line)
        }
        self._all_names: set[str] | None = None
        # amp_initialize's ``.half()`` casts that go with an O2/O3 setup (``_hand_casts``), once found
        self.hand_casts: list[Any] | None = None

    def release(self) -> None:
        """Drop everything this context holds, once the rules are done with it: its analyses
        (the amp model, the handles) refer back to it, a cycle that would keep the module's
        whole tree alive until the cycle collector's next pass, which would then walk all of it."""
        self.__dict__.clear()

    @cached_property
    def amp(self) -> AmpModel:
        """The module's Apex amp model: its amp calls and the scalers the rules create."""
        return AmpModel(self)

    @cached_property
    def carriers(self) -> Carriers:
        """The attributes of ``self`` that store the amp module (``self.amp = amp``)."""
        return Carriers(self, self._apex_amp_api)

    @cached_property
    def gradient_norms(self) -> set[str]:
        """The module's own top-level functions that compute a norm of the gradients they are given."""
        return gradient_norms_of(pytree.parse(self.source))

    @cached_property
    def handles(self) -> Handles:
        """The old API's ``amp.init`` handles and the optimizers wrapped by them."""
        return Handles(self, self._apex_amp_api)

    # positions and findings
    def _locate(self, node: cst.CSTNode) -> tuple[int, int, int]:
        """1-based start line, start column and end line of ``node`` in the input."""
        chain = [node]  # and its ancestors up to the top-level statement
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, cst.Module):
                break
            chain.append(ancestor)
        return self._positions.locate(node, chain)

    def position(self, node: cst.CSTNode) -> tuple[int, int]:
        """1-based line and column of ``node`` in the input."""
        line, column, _ = self._locate(node)
        return line, column

    def lines(self, node: cst.CSTNode) -> tuple[int, int]:
        """1-based first and last line of ``node`` in the input."""
        first, _, last = self._locate(node)
        return first, last

    def report(self, code: str, node: cst.CSTNode, message: str | None = None) -> None:
        line, column = self.position(node)
        finding = make_finding(code, line, column, message)
        at = (line, column)
        # a rule's own word on an Apex name it kept (AMP042) says more than the generic "use
        # its torch class" (AMP040) that amp_import gives every import left behind
        if code == "AMP040" and any(f.code == "AMP042" and (f.line, f.column) == at for f in self.findings):
            return
        if code == "AMP042":
            self.findings[:] = [f for f in self.findings if not (f.code == "AMP040" and (f.line, f.column) == at)]
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

    def hide(self, region: cst.CSTNode) -> None:
        """Leave the nodes inside ``region`` (code the plan drops whole) out of ``nodes_of``, so no
        later rule plans edits in it or reports on it."""
        inside = {id(node) for node in self.walk(region)}
        self._nodes = {kind: [n for n in nodes if id(n) not in inside] for kind, nodes in self._nodes.items()}

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

    def try_around(self, node: cst.CSTNode) -> cst.Try | None:
        """The ``try`` whose body (not a handler, ``else`` or ``finally``) holds ``node``'s statement."""
        block = self.parent(self.statement_of(node))
        owner = self.parent(block) if isinstance(block, cst.IndentedBlock) else None
        return owner if isinstance(owner, cst.Try) and owner.body is block else None

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
    def reference_names(self) -> Iterator[cst.Name]:
        """Names that may refer to a tracked import: not the names an import statement binds
        (``as X``), not attribute names after a dot, and only names some import binds."""
        for name in self.nodes_of(cst.Name):
            if name.value not in self._tracked:
                continue  # resolve() would find nothing (and this check is cheap)
            parent = self._parents.get(name)
            if isinstance(parent, (cst.ImportAlias, cst.AsName)) or (
                isinstance(parent, cst.Attribute) and parent.attr is name
            ):
                continue
            if isinstance(parent, cst.Arg) and parent.keyword is name:
                continue  # `f(amp=...)`: the name of the callee's parameter
            yield name

    def tracks(self, name: str) -> bool:
        """Whether some import we track binds ``name`` anywhere (else ``resolve`` finds nothing)."""
        return name in self._tracked

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
                if first and self._rebound_by_other_import(scope, name, at, bindings):
                    return None
                if len(bindings) > 1 and first:
                    # `from apex import amp` in each branch of one function: a use reads the
                    # import above it, not the last one of the function (which would leave the
                    # first looking unused)
                    here = self.position(at)
                    above = [binding for binding in bindings if self.position(binding.statement) <= here]
                    if above:
                        return above[-1]
                return bindings[-1]
            if name in self.locals.get(scope, ()):
                return None
            first = False
            scope = self.scope_parent.get(scope)
        return None

    def _rebound_by_other_import(self, scope: Scope, name: str, at: cst.CSTNode, bindings: list[Binding]) -> bool:
        """Whether an import of something else binds ``name`` on every path to ``at`` after
        the tracked imports: it stands above ``at`` in a block that holds ``at``, and no
        tracked import comes between them."""
        others = self._index.other_imports.get(scope, {}).get(name)
        if not others:
            return False
        here = self.position(at)
        ancestors = set(self.ancestors(at))
        covering = []
        for other in others:
            line = self.parent(other)
            # on its own line in a block (not `if x: import y`, whose block is the if's)
            if isinstance(line, cst.SimpleStatementLine) and self.parent(line) in ancestors:
                if self.position(other) <= here:
                    covering.append(other)
        if not covering:
            return False
        latest = max(self.position(other) for other in covering)
        # (a project's copy of an Apex module is bound by that same import: it stays tracked)
        return not any(latest <= self.position(binding.statement) <= here for binding in bindings)

    def amp_api(self, func: cst.BaseExpression) -> tuple[str, cst.CSTNode] | None:
        """For ``amp.X`` / ``apex.amp.X`` / a name from ``apex.amp``: (X, the base Name); for
        ``handle.scale_loss`` and the like of the old API: (X, the handle expression); for
        ``self.amp.scale_loss`` where ``self.amp`` stores the amp module: (X, ``self.amp``)."""
        found: tuple[str, cst.CSTNode] | None = self._apex_amp_api(func)
        if found is None and isinstance(func, cst.Attribute):
            if self.handles.any:
                found = self.handles.api(func)
            if found is None and self.carriers.any:
                found = self.carriers.api(func) or self.carriers.initialize_api(func)
        return found

    def _apex_amp_api(self, func: cst.BaseExpression) -> tuple[str, cst.Name] | None:
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

    def bind(self, name: str, binding: Binding) -> None:
        """Bind ``name`` at module level as an import we track (project imports of amp)."""
        self.imports[self.module][name].append(binding)
        self._tracked.add(name)

    def bind_at(self, scope: Scope, name: str, binding: Binding) -> None:
        """Bind ``name`` in ``scope`` to an import we track (a name from a local copy of Apex)."""
        self.imports[scope][name].append(binding)
        self._tracked.add(name)

    def all_names(self) -> set[str]:
        """Every identifier in the file (names and attribute names), for clash checks."""
        if self._all_names is None:
            self._all_names = {name.value for name in self.nodes_of(cst.Name)}
        return self._all_names

    def fresh_name(self, preferred: str) -> str:
        return fresh_identifier(self.all_names(), preferred, ("grad_", "amp_"))


def fresh_identifier(taken: set[str], preferred: str, prefixes: tuple[str, ...]) -> str:
    """``preferred``, else it with one of ``prefixes``, else ``<preferred>_1``, ``_2``...: the first
    not in ``taken``, which is then added to it."""
    for candidate in (preferred, *(f"{prefix}{preferred}" for prefix in prefixes)):
        if candidate not in taken:
            break
    else:
        counter = 1
        while f"{preferred}_{counter}" in taken:
            counter += 1
        candidate = f"{preferred}_{counter}"
    taken.add(candidate)
    return candidate
