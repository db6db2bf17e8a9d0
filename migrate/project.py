"""Project mode: which of the given modules share one Apex amp setup.

Real training code spans modules: ``main.py`` calls ``amp.initialize`` and ``trainer.py``
runs the loop with ``amp.scale_loss``; ``common.py`` imports amp and ``train.py`` gets it
through ``from common import *``. Migrating such modules one by one leaves a project that
crashes or trains differently. So the runner first indexes the modules that may use Apex
(cheaply, with ``ast``), links those that import each other inside the project, and then
treats each linked group as one setup: migrated completely, or left exactly as it was.

This module only reads source text; it never imports libcst or torch.
"""

from __future__ import annotations

import ast
import functools
import itertools
import os
import re
from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from migrate import (
    amp_factories,
    apex_copies,
    factories,
    gradient_norms,
    half_inputs,
    halving_helpers,
    runner_hooks,
    version_fallbacks,
)
from migrate.amp_api_names import CASTING as _CAST_FUNCTION_APIS
from migrate.gcpause import cycle_collector_paused
from migrate.options import ModuleFacts, ScalerInfo
from migrate.pytree import own_nodes
from migrate.roots import may_share_a_program, project_root

# amp functions whose call on a name that no import binds means "the amp module came
# from somewhere we cannot see"; initialize and state_dict are too common a method name
# for that unless the name itself says amp (the engine reports by the same rule).
_DISTINCT_APIS = frozenset({"scale_loss", "master_params"})
_AMP_APIS = frozenset({"initialize", "scale_loss", "master_params", "state_dict", "load_state_dict", "disable_casts"})


def says_amp(name: str) -> bool:
    """Whether a (dotted) name says amp as a word of its own (``amp``, ``apex_amp``, ``self.amp``,
    ``amp_handle``), not inside another word: ``train_sampler``, ``example``, ``clamp``."""
    return any(
        word in ("amp", "apexamp") or (word.startswith("amp") and word[3:].isdigit())
        for word in re.split(r"[^a-z0-9]+", name.lower())
    )


def looks_like_amp_call(name: str, api: str) -> bool:
    """Whether ``name.api(...)`` looks like a call of the Apex amp module (whatever binds ``name``)."""
    return name not in ("self", "cls") and (api in _DISTINCT_APIS or (api in _AMP_APIS and says_amp(name)))


@dataclass(frozen=True)
class ImportEdge:
    """One import of a project module: ``from <module> import <names>`` or ``import <module>``."""

    module: str  # absolute dotted name, relative imports already resolved
    names: tuple[str, ...]  # imported names; ("*",) for a star import; () for `import module`
    line: int
    # the names the importer binds: one per imported name, or the one name `import module` binds
    aliases: tuple[str, ...] = ()
    spelled: str = ""  # `from <spelled> import ...` as written (".x" for a relative import); "" for `import`
    # `import pkg` at module level: the attributes the importer reads on `pkg` (None: unknown,
    # or `pkg` is also used as a value)
    attributes: tuple[str, ...] | None = None


@dataclass(frozen=True)
class FunctionSummary:
    """A top-level function: does it call amp itself, and which top-level names it calls."""

    uses_amp: bool
    calls: frozenset[str]
    # names an amp module (or calls amp on what no import binds): may take part in an amp setup
    mentions_amp: bool = True


@dataclass(frozen=True)
class AmpUse:
    """``NAME.api(...)`` where the module itself binds ``NAME`` to nothing we can see."""

    name: str
    api: str
    line: int
    column: int


@dataclass
class ModuleSummary:
    """What one module says about Apex amp and about the project modules it imports."""

    path: str
    given: bool = True  # False: read only to follow imports (not among the paths to migrate)
    imports: list[ImportEdge] = field(default_factory=list)
    amp_names: set[str] = field(default_factory=set)  # module-level names bound to apex.amp
    uses_amp: bool = False  # imports apex.amp anywhere, or calls an amp function
    unbound_uses: list[AmpUse] = field(default_factory=list)
    parameter_uses: list[AmpUse] = field(default_factory=list)  # amp received as a parameter
    functions: dict[str, FunctionSummary] = field(default_factory=dict)  # top-level functions
    amp_apis: set[str] = field(default_factory=set)  # amp functions the module calls
    amp_outside_functions: bool = False  # an amp call at module level or in a class
    amp_classes: set[str] = field(default_factory=set)  # top-level classes whose code calls amp
    amp_at_module_level: bool = False  # an amp call outside every top-level function and class
    calls_outside_functions: frozenset[str] = frozenset()  # names called at module level or in classes
    # every name the module binds at its top level (function, class, variable) -> the names read by
    # the statements that bind it (a function's body, a class's, an assignment's value)
    definitions: dict[str, frozenset[str]] = field(default_factory=dict)
    # top-level definitions shaped like Apex's fp16_utils API (a local copy of it): name -> facts
    apex_defs: dict[str, Any] = field(default_factory=dict)
    # attributes the amp module is stored in (``args.amp = amp``), and those amp is called
    # through (``args.amp.scale_loss(...)``): the carriers of the amp module between modules
    amp_stores: set[str] = field(default_factory=set)
    carried_uses: set[str] = field(default_factory=set)
    # for each store: the attribute and the ``if`` tests that lead to it from its function's body
    # (each test spelled without layout, ``<obj>`` for the object it is stored on, with True for the
    # body and False for the else); None where something other than an ``if`` lies on the way
    store_conditions: list[tuple[str, tuple[tuple[str, bool], ...] | None]] = field(default_factory=list)
    # the module names FP16_Optimizer (it may set one up on a model an imported helper halves)
    fp16_optimizer: bool = False


def summarize(path: str, source: str) -> ModuleSummary | None:
    """Index one module; None when it does not parse (the engine reports that)."""
    # An ast tree holds no reference cycles (reference counting frees it): the cycle
    # collector's passes over its nodes while it is built and read are pure overhead,
    # and in a process that has imported libcst they cost as much as the parse.
    with cycle_collector_paused():
        return _summarize(path, source)


def _summarize(path: str, source: str) -> ModuleSummary | None:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    summary = ModuleSummary(path)
    package = _package_of(path)
    bound: set[str] = set()
    parameters: set[str] = set()
    calls: list[tuple[str, str, ast.Call]] = []
    # Per top-level statement: the plain names it calls, and the names whose attributes it
    # calls (``amp.x(...)`` once the module's amp names are known): one walk for everything.
    called: list[set[str]] = [set() for _ in tree.body]
    called_on: list[set[str]] = [set() for _ in tree.body]
    # `import pkg` at module level (the walk meets every top-level statement before any name):
    # the attributes read on `pkg`, and how often `pkg` is read at all
    plain: dict[str, int] = {}
    read: list[set[str]] = [set() for _ in tree.body]
    stored: list[set[str]] = [set() for _ in tree.body]  # top-level statement -> module names it binds
    read_attributes: dict[str, set[str]] = {}
    reads: dict[str, int] = {}
    named: list[set[str]] = [set() for _ in tree.body]  # names read that may be an amp module
    decorators: list[tuple[str, str]] = []  # (module name, amp casting function) not called
    for node, top in _walk(tree):
        if isinstance(node, ast.Attribute):
            base = node.value
            if isinstance(base, ast.Name) and node.attr in _CAST_FUNCTION_APIS and not isinstance(node.ctx, ast.Store):
                decorators.append((base.id, node.attr))  # `@amp.float_function`: used, not called
            if isinstance(base, ast.Name) and base.id in plain:
                read_attributes.setdefault(base.id, set()).add(node.attr)
                reads[base.id] = reads.get(base.id, 0) - 1  # this read is an attribute's
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name):
                called[top].add(func.id)
            elif isinstance(func, ast.Attribute):
                base = func.value
                if isinstance(base, ast.Name):
                    called_on[top].add(base.id)
                    calls.append((base.id, func.attr, node))
                elif isinstance(base, ast.Attribute):
                    if base.attr == "amp" and isinstance(base.value, ast.Name) and base.value.id == "apex":
                        summary.amp_apis.add(func.attr)  # apex.amp.X with `import apex`
                    elif says_amp(base.attr) and func.attr in _AMP_APIS:
                        # `self.amp.scale_loss(...)`: the amp module stored on an object
                        summary.unbound_uses.append(AmpUse(base.attr, func.attr, node.lineno, node.col_offset + 1))
                        summary.carried_uses.add(base.attr)
        elif isinstance(node, ast.Name):
            if not isinstance(node.ctx, ast.Load):
                bound.add(node.id)
                if node.id in plain:
                    reads[node.id] = reads.get(node.id, 0) + 1  # rebound: not surely the package
                if not isinstance(tree.body[top], (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    stored[top].add(node.id)
            else:
                read[top].add(node.id)
                if node.id in plain:
                    reads[node.id] = reads.get(node.id, 0) + 1
                if "amp" in node.id.lower():
                    named[top].add(node.id)
        elif isinstance(node, ast.Assign):
            if isinstance(node.value, ast.Name) and "amp" in node.value.id.lower():
                # `args.amp = amp`: a carrier, if the name is the amp module (the engine checks)
                summary.amp_stores.update(t.attr for t in node.targets if isinstance(t, ast.Attribute))
        elif isinstance(node, ast.arg):
            parameters.add(node.arg)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                bound.add(alias.asname or alias.name.split(".")[0])
                if alias.name == "apex.amp" or (alias.name == "apex" and alias.asname is None):
                    summary.uses_amp = summary.uses_amp or alias.name == "apex.amp"
                    if alias.asname and _at_module_level(tree, node):
                        summary.amp_names.add(alias.asname)
                bound_as = alias.asname or alias.name
                if "." not in bound_as and isinstance(tree.body[top], ast.Import):
                    plain[bound_as] = len(summary.imports)
                summary.imports.append(ImportEdge(alias.name, (), node.lineno, (bound_as,)))
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(node.module, node.level, package)
            names = tuple(alias.name for alias in node.names)
            for alias in node.names:
                bound.add(alias.asname or alias.name)
            if module == "apex" and "amp" in names or module == "apex.amp":
                summary.uses_amp = True
                if module == "apex" and _at_module_level(tree, node):
                    summary.amp_names.update(a.asname or a.name for a in node.names if a.name == "amp")
            if module is not None:
                aliases = tuple(alias.asname or alias.name for alias in node.names)
                spelled = "." * node.level + (node.module or "")
                summary.imports.append(ImportEdge(module, names, node.lineno, aliases, spelled))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
            if node is tree.body[top]:
                stored[top].add(node.name)
    for name, at in plain.items():
        if reads.get(name, 0) == 0:
            edge = summary.imports[at]
            summary.imports[at] = replace(edge, attributes=tuple(sorted(read_attributes.get(name, ()))))
    for name, api in decorators:
        if name in summary.amp_names or name == "amp":
            summary.amp_apis.add(api)
    for name, api, call in calls:
        if name in summary.amp_names or name == "amp":
            summary.amp_apis.add(api)
        if not looks_like_amp_call(name, api):
            continue
        use = AmpUse(name, api, call.lineno, call.col_offset + 1)
        if name in summary.amp_names:
            continue
        if name in parameters and name not in bound:
            summary.parameter_uses.append(use)
        elif name not in bound:
            summary.unbound_uses.append(use)
    summary.uses_amp = summary.uses_amp or bool(summary.unbound_uses or summary.parameter_uses)
    definitions: dict[str, set[str]] = {}
    for top, defined in enumerate(stored):
        for name in defined:
            definitions.setdefault(name, set()).update(read[top])
    summary.definitions = {name: frozenset(reads) for name, reads in definitions.items()}
    if summary.amp_stores:
        summary.store_conditions = _store_conditions(tree, summary.amp_stores)
    _summarize_functions(tree, summary, called, called_on, named)
    summary.apex_defs = apex_copies.scan(tree)
    summary.fp16_optimizer = "FP16_Optimizer" in source
    return summary


def carrier_condition(test: str, owner: str) -> str:
    """``test`` (spelled without layout) with the object ``owner`` that carries amp spelled ``<obj>``."""
    return re.sub(rf"(?<![\w.]){re.escape(owner)}(?=\.)", "<obj>", test)


def _store_conditions(tree: ast.Module, attributes: set[str]) -> list[tuple[str, tuple[tuple[str, bool], ...] | None]]:
    """The conditions of each ``<name>.<attribute> = <name>`` store in a function (see ``ModuleSummary``)."""
    found: list[tuple[str, tuple[tuple[str, bool], ...] | None]] = []

    def visit(statements: list[ast.stmt], path: tuple[tuple[str, bool], ...] | None) -> None:
        for statement in statements:
            if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(statement.body, ())
            elif isinstance(statement, ast.ClassDef):
                visit(statement.body, None)
            elif isinstance(statement, ast.If):
                test = "".join(ast.unparse(statement.test).split())
                visit(statement.body, None if path is None else (*path, (test, True)))
                visit(statement.orelse, None if path is None else (*path, (test, False)))
            elif isinstance(statement, ast.Assign):
                for target in statement.targets:
                    if (
                        isinstance(target, ast.Attribute)
                        and target.attr in attributes
                        and isinstance(target.value, ast.Name)
                        and isinstance(statement.value, ast.Name)
                    ):
                        owner = target.value.id
                        conditions = (
                            None if path is None else tuple((carrier_condition(t, owner), arm) for t, arm in path)
                        )
                        found.append((target.attr, conditions))
            elif isinstance(statement, (ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith)):
                # Each pass of a loop (a cross-validation fold) stores anew what amp.initialize made
                # anew, under the same tests; a `with` runs its body once. A reader that runs before
                # any store fails alike before and after the migration.
                visit(statement.body, path)
                if isinstance(statement, (ast.For, ast.AsyncFor, ast.While)):
                    visit(statement.orelse, None)  # runs once the loop ends without a break: a condition of its own
            else:
                for name in ("body", "orelse", "finalbody", "handlers"):
                    inner = getattr(statement, name, None)
                    if isinstance(inner, list):
                        blocks = [h.body for h in inner] if name == "handlers" else [inner]
                        for block in blocks:
                            visit(block, None)  # a `try`, a `match`: not an `if` on the way

    visit(tree.body, None)
    return found


# Fields that hold only leaves no summary looks at (expression contexts, operators).
_LEAF_FIELDS = frozenset({"ctx", "op", "ops"})
_FOLLOWED: dict[type, tuple[str, ...]] = {}


def _walk(tree: ast.Module) -> Iterator[tuple[ast.AST, int]]:
    """Every node below the module, breadth first as ``ast.walk`` goes (so lists built from it
    keep its order), each with the index of the top-level statement it belongs to; nodes that
    hold nothing a summary uses (``Load``, ``Add``) are passed over."""
    pending: deque[tuple[ast.AST, int]] = deque((statement, top) for top, statement in enumerate(tree.body))
    popleft, append = pending.popleft, pending.append
    ast_node = ast.AST
    while pending:
        node, top = popleft()
        yield node, top
        kind = type(node)
        fields = _FOLLOWED.get(kind)
        if fields is None:
            fields = _FOLLOWED[kind] = tuple(name for name in kind._fields if name not in _LEAF_FIELDS)
        for name in fields:
            value = getattr(node, name, None)
            if type(value) is list:
                for item in value:
                    if isinstance(item, ast_node):
                        append((item, top))
            elif isinstance(value, ast_node):
                append((value, top))


def _summarize_functions(
    tree: ast.Module,
    summary: ModuleSummary,
    called: list[set[str]],
    called_on: list[set[str]],
    named: list[set[str]],
) -> None:
    """Which top-level functions call amp (on this module's amp names), and whom they call."""
    names = summary.amp_names | {"amp"}
    # amp called on what no import binds (``args.amp.scale_loss``, a parameter): used there too
    unseen = [use.line for use in (*summary.unbound_uses, *summary.parameter_uses)]
    for top, statement in enumerate(tree.body):
        end = getattr(statement, "end_lineno", None) or statement.lineno
        unseen_here = any(statement.lineno <= line <= end for line in unseen)
        uses_amp = not names.isdisjoint(called_on[top]) or unseen_here
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
            mentions = uses_amp or not names.isdisjoint(named[top])
            summary.functions[statement.name] = FunctionSummary(uses_amp, frozenset(called[top]), mentions)
        elif not isinstance(statement, (ast.Import, ast.ImportFrom)):
            summary.amp_outside_functions = summary.amp_outside_functions or uses_amp
            summary.calls_outside_functions |= called[top]
            if isinstance(statement, ast.ClassDef) and uses_amp:
                summary.amp_classes.add(statement.name)
            else:
                summary.amp_at_module_level = summary.amp_at_module_level or uses_amp


def summary_to_json(summary: ModuleSummary) -> dict[str, Any]:
    """``summary`` as JSON data for the cache (its path and ``given`` are the caller's)."""
    return {
        "imports": [
            [
                edge.module,
                list(edge.names),
                edge.line,
                list(edge.aliases),
                edge.spelled,
                None if edge.attributes is None else list(edge.attributes),
            ]
            for edge in summary.imports
        ],
        "amp_names": sorted(summary.amp_names),
        "uses_amp": summary.uses_amp,
        "unbound_uses": [[use.name, use.api, use.line, use.column] for use in summary.unbound_uses],
        "parameter_uses": [[use.name, use.api, use.line, use.column] for use in summary.parameter_uses],
        "functions": [
            [name, function.uses_amp, sorted(function.calls), function.mentions_amp]
            for name, function in summary.functions.items()
        ],
        "amp_apis": sorted(summary.amp_apis),
        "amp_outside_functions": summary.amp_outside_functions,
        "amp_classes": sorted(summary.amp_classes),
        "amp_at_module_level": summary.amp_at_module_level,
        "calls_outside_functions": sorted(summary.calls_outside_functions),
        "definitions": {name: sorted(reads) for name, reads in summary.definitions.items()},
        "apex_defs": summary.apex_defs,
        "amp_stores": sorted(summary.amp_stores),
        "carried_uses": sorted(summary.carried_uses),
        "store_conditions": [
            [attribute, None if path is None else [[test, arm] for test, arm in path]]
            for attribute, path in summary.store_conditions
        ],
        "fp16_optimizer": summary.fp16_optimizer,
    }


def summary_from_json(path: str, data: dict[str, Any]) -> ModuleSummary:
    """The summary ``summary_to_json`` stored, for the module at ``path``; raises on damaged data."""
    return ModuleSummary(
        path,
        imports=[
            ImportEdge(
                str(module),
                tuple(map(str, names)),
                int(line),
                tuple(map(str, aliases)),
                str(spelled),
                None if attributes is None else tuple(map(str, attributes)),
            )
            for module, names, line, aliases, spelled, attributes in data["imports"]
        ],
        amp_names=set(map(str, data["amp_names"])),
        uses_amp=bool(data["uses_amp"]),
        unbound_uses=[AmpUse(str(n), str(a), int(line), int(col)) for n, a, line, col in data["unbound_uses"]],
        parameter_uses=[AmpUse(str(n), str(a), int(line), int(col)) for n, a, line, col in data["parameter_uses"]],
        functions={
            str(name): FunctionSummary(bool(uses_amp), frozenset(map(str, calls)), bool(mentions))
            for name, uses_amp, calls, mentions in data["functions"]
        },
        amp_apis=set(map(str, data["amp_apis"])),
        amp_outside_functions=bool(data["amp_outside_functions"]),
        amp_classes=set(map(str, data["amp_classes"])),
        amp_at_module_level=bool(data["amp_at_module_level"]),
        calls_outside_functions=frozenset(map(str, data["calls_outside_functions"])),
        definitions={str(name): frozenset(map(str, reads)) for name, reads in data["definitions"].items()},
        apex_defs=dict(data["apex_defs"]),
        amp_stores=set(map(str, data["amp_stores"])),
        carried_uses=set(map(str, data["carried_uses"])),
        store_conditions=[
            (str(attribute), None if path is None else tuple((str(test), bool(arm)) for test, arm in path))
            for attribute, path in data["store_conditions"]
        ],
        fp16_optimizer=bool(data["fp16_optimizer"]),
    )


def _at_module_level(tree: ast.Module, node: ast.stmt) -> bool:
    """The import runs at module level (possibly inside a try/if), so others can import the name."""
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        statement = pending.pop()
        if statement is node:
            return True
        if isinstance(statement, (ast.Try, ast.If)):
            pending.extend(statement.body)
            pending.extend(statement.orelse)
            if isinstance(statement, ast.Try):
                pending.extend(statement.finalbody)
                for handler in statement.handlers:
                    pending.extend(handler.body)
    return False


def _package_of(path: str) -> list[str]:
    """The folders of ``path`` as package parts, innermost last (relative imports climb them)."""
    folder = os.path.dirname(os.path.abspath(path))
    return [part for part in folder.split(os.sep) if part]


def _absolute(module: str | None, level: int, package: list[str]) -> str | None:
    """``from ..x import y`` inside ``a/b/c.py`` names ``a.x``: return that dotted path."""
    if level == 0:
        return module
    if level > len(package):
        return None
    parts = package[: len(package) - (level - 1)]
    return ".".join([*parts, *([module] if module else [])])


class ProjectIndex:
    """The given modules, found by the dotted names they can be imported under."""

    def __init__(self, summaries: Iterable[ModuleSummary]) -> None:
        self.modules: dict[str, ModuleSummary] = {}
        self._by_name: dict[str, list[str]] = {}
        self._leads_to_amp_module: dict[str, bool] = {}
        for summary in summaries:
            self.modules[summary.path] = summary
            for name in _import_names(summary.path):
                self._by_name.setdefault(name, []).append(summary.path)

    def resolve(self, importer: str, module: str) -> str | None:
        """The given module that ``importer`` gets for ``import <module>``, if it is one of ours.

        Absolute paths count as dotted names too (relative imports were resolved against the
        folders), so a name matches a file whose path ends with it; among several, the one
        nearest to the importer wins, as a script run from its folder would see it.
        """
        candidates = self._by_name.get(module, [])
        if not candidates:
            return None
        folder = os.path.dirname(os.path.abspath(importer))
        nearest = min(candidates, key=lambda path: (_distance(folder, path), path))
        # a script's own folder comes first on sys.path: a file of that name there that is not
        # indexed (it uses no amp) is the one imported (MiniViT/Mini-DeiT's `import utils` is not
        # Mini-Swin's utils.py); farther up, which folder is on sys.path is not known
        found = _beside(folder, module)
        if found is None:
            return nearest
        # the one Python imports, where it is indexed: `utils/__init__.py` beside the script, not
        # `models/utils.py` just as near (GroupViT's `from utils import get_grad_norm`)
        return next((path for path in candidates if os.path.abspath(path) == found), None)

    def imported(self, summary: ModuleSummary) -> list[tuple[ImportEdge, str]]:
        """The project modules ``summary`` imports, each with the edge that imports it."""
        found = []
        for edge in summary.imports:
            target = self.resolve(summary.path, edge.module)
            if target is None and edge.names and edge.names != ("*",):
                # `from package import module`
                for name in edge.names:
                    target = self.resolve(summary.path, f"{edge.module}.{name}")
                    if target is not None:
                        found.append((ImportEdge(f"{edge.module}.{name}", (), edge.line), target))
                continue
            if target is not None and target != summary.path:
                found.append((edge, target))
        return found

    def reached_amp_modules(self, path: str) -> list[str]:
        """The amp modules ``path`` imports, directly or through modules without amp.

        A module without amp that only re-exports the names asked of it (a package's
        ``__init__``: ``from .trainer import Trainer``) leads on only where those names come
        from: ``from transformers import AdamW`` does not reach the amp of ``trainer.py``.
        """
        reached: list[str] = []
        seen: set[tuple[str, frozenset[str] | None]] = set()
        # (module, the names asked of it (None: all), the dotted name it was imported by)
        pending: list[tuple[str, frozenset[str] | None, str]] = [(path, None, "")]
        while pending:
            current, wanted, dotted = pending.pop()
            summary = self.modules[current]
            edges = self.imported(summary)
            if wanted is not None:
                wanted = self._passed_on(summary, wanted, dotted, edges)
            for edge, target in edges:
                asked = _asked_of(edge, wanted)
                if asked == frozenset() or (target, asked) in seen:
                    continue
                seen.add((target, asked))
                if self.modules[target].uses_amp:
                    if target not in reached and target != path and self._takes_part(asked, target):
                        reached.append(target)
                else:
                    pending.append((target, asked, edge.module))
        return reached

    def _takes_part(self, asked: frozenset[str] | None, target: str) -> bool:
        """Whether the names ``asked`` of the amp module ``target`` (None: all) may take part in
        its amp setup: anything but top-level functions that reach no amp call there
        (``build_optimizer`` imported from a script whose ``main`` calls amp.initialize shares no
        setup with it), and classes or values whose code names none of those that do (a model
        class imported from the module whose set-up function calls amp.initialize), where no
        class or module-level code of ``target`` calls amp."""
        summary = self.modules[target]
        if asked is None or "*" in asked or summary.amp_outside_functions:
            return True
        needing = {name for name, function in summary.functions.items() if function.mentions_amp}
        return any(self._leads_to_amp(summary, name, needing) for name in asked)

    def _leads_to_amp(self, summary: ModuleSummary, start: str, needing: set[str]) -> bool:
        """Whether the top-level name ``start`` of ``summary`` may reach amp code: a function
        that calls into ``needing``, a class or value whose code names one, names the amp module
        or names what it imports from a project module that uses amp (or leads to one), or a name
        it does not define (imported: it may be anything)."""
        imported: dict[str, str] = {}
        for edge, module in self.imported(summary):
            for alias in edge.aliases or (edge.module.split(".")[0],):
                imported[alias] = module
        seen, pending = set(), [start]
        while pending:
            name = pending.pop()
            if name in seen:
                continue
            seen.add(name)
            if name in summary.functions:
                if _reaches(summary, name, needing):
                    return True
                continue
            if name in summary.amp_names or name not in summary.definitions:
                return True
            for read in summary.definitions[name]:
                origin = imported.get(read)
                if read in summary.amp_names or (origin is not None and self._imports_amp(origin)):
                    return True
                if read in summary.definitions:
                    pending.append(read)
        return False

    def _imports_amp(self, path: str) -> bool:
        """Whether the module ``path`` uses amp or imports, directly or not, one that does."""
        known = self._leads_to_amp_module.get(path)
        if known is not None:
            return known
        seen, pending, found = {path}, [path], False
        while pending and not found:
            summary = self.modules[pending.pop()]
            found = summary.uses_amp
            for _, target in self.imported(summary):
                if target not in seen:
                    seen.add(target)
                    pending.append(target)
        self._leads_to_amp_module[path] = found
        return found

    def _passed_on(
        self, summary: ModuleSummary, wanted: frozenset[str], dotted: str, edges: list[tuple[ImportEdge, str]]
    ) -> frozenset[str]:
        """The names of its own imports a module without amp passes on when ``wanted`` is asked
        of it (its re-exports, what its definitions read). A submodule read on a package
        (``pkg.sub``) is added to ``edges``."""
        if dotted:
            for name in sorted(wanted - _reexported(summary)):
                submodule = self.resolve(summary.path, f"{dotted}.{name}")
                if submodule is not None and submodule != summary.path:
                    edges.append((ImportEdge(f"{dotted}.{name}", (), 0), submodule))
        return _read_through(summary, wanted)


def _imported_names(summary: ModuleSummary) -> frozenset[str]:
    """Every name ``summary``'s imports bind (``from x import y``, ``import pkg``)."""
    return frozenset(alias.split(".")[0] for edge in summary.imports if edge.names != ("*",) for alias in edge.aliases)


def _reexported(summary: ModuleSummary) -> frozenset[str]:
    """The names ``summary`` binds by ``from x import y`` (which it may pass on)."""
    return frozenset(alias for edge in summary.imports if edge.names not in ((), ("*",)) for alias in edge.aliases)


def _asked_of(edge: ImportEdge, wanted: frozenset[str] | None) -> frozenset[str] | None:
    """The names asked of the module ``edge`` imports, when its importer is asked for ``wanted``:
    an empty set when the edge brings none of them; None for every name (a plain ``import``,
    ``import *`` under no filter, or an importer asked for everything)."""
    if edge.names == ():
        if wanted is None:
            return None if edge.attributes is None else frozenset(edge.attributes)
        return None if any(alias.split(".")[0] in wanted for alias in edge.aliases) else frozenset()
    if edge.names == ("*",):
        return wanted
    pairs = list(zip(edge.names, edge.aliases or edge.names))
    if wanted is None:
        return frozenset(name for name, _ in pairs)
    return frozenset(name for name, alias in pairs if alias in wanted)


def _read_through(summary: ModuleSummary, names: frozenset[str]) -> frozenset[str]:
    """The names of its imports that ``summary`` uses for ``names``: those it re-exports, and
    those read by the statements that define the others (following its own definitions they
    read). Names it neither imports nor defines stay: a star import may bring them."""
    imported = _imported_names(summary)
    starred = any(edge.names == ("*",) for edge in summary.imports)
    found: set[str] = set()
    seen: set[str] = set()
    pending = list(names)
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in imported or (starred and name not in summary.definitions):
            found.add(name)
        if name in summary.definitions:
            pending.extend(summary.definitions[name])
    return frozenset(found)


def _import_names(path: str) -> list[str]:
    """Every dotted name a file may be imported under: each suffix of its path."""
    parts = [part for part in os.path.abspath(path).split(os.sep) if part]
    stem = parts[-1]
    if stem.endswith(".py"):
        parts[-1] = stem[:-3]
    elif stem.endswith(".ipynb"):
        return []
    if parts[-1] == "__init__":
        parts.pop()
    return [".".join(parts[index:]) for index in range(len(parts))]


def _distance(folder: str, path: str) -> int:
    """Folders to climb up and go down from ``folder`` to reach ``path``."""
    return len(os.path.relpath(os.path.dirname(os.path.abspath(path)), folder).split(os.sep))


@dataclass
class Group:
    """Modules linked by imports that all take part in Apex amp."""

    paths: list[str]


def amp_groups(index: ProjectIndex) -> list[Group]:
    """Group the given amp modules that import one another.

    An import counts when it reaches the other amp module directly or through modules that
    do not use amp themselves (``from engine import fit`` where ``engine/__init__.py``
    re-exports ``fit`` from ``engine/loop.py``); two modules that merely share a helper
    module stay apart.
    """
    amp_modules = [path for path, summary in index.modules.items() if summary.uses_amp and summary.given]
    parent: dict[str, str] = {path: path for path in amp_modules}

    def find(path: str) -> str:
        while parent[path] != path:
            parent[path] = parent[parent[path]]
            path = parent[path]
        return path

    for path in amp_modules:
        for target in index.reached_amp_modules(path):
            if target in parent:
                parent[find(path)] = find(target)
    _join_carriers(index, parent, find)
    groups: dict[str, list[str]] = {}
    for path in amp_modules:
        groups.setdefault(find(path), []).append(path)
    return [Group(sorted(paths)) for paths in groups.values()]


def _join_carriers(index: ProjectIndex, parent: dict[str, str], find: Callable[[str], str]) -> None:
    """Join a module that stores the amp module on an object (``model.amp = amp`` in a set-up
    helper) and one that calls amp through that attribute (``self.amp.scale_loss``) where a third
    module imports both (argus-alaska's train.py builds the model from one and hands it to the
    other's helper): they are one setup, the attribute its carrier."""
    stored = {path: index.modules[path].amp_stores for path in parent if index.modules[path].amp_stores}
    read = {path: index.modules[path].carried_uses for path in parent if index.modules[path].carried_uses}
    pairs = [(a, b) for a in stored for b in read if find(a) != find(b) and stored[a] & read[b]]
    files: list[tuple[str, bytes]] = []  # the project's files, read once for every pair
    for a, b in pairs:
        if find(a) != find(b) and _imported_together(index, a, b, files):
            parent[find(a)] = find(b)


def _imported_together(index: ProjectIndex, a: str, b: str, files: list[tuple[str, bytes]]) -> bool:
    """Whether some module of the project imports both ``a`` and ``b`` (by their module names);
    ``files`` holds the project's files once read (filled here the first time)."""
    for path, summary in index.modules.items():
        if path not in (a, b) and {a, b} <= {target for _, target in index.imported(summary)}:
            return True
    # the module that joins them may use no amp itself, so the run did not index it
    patterns = []
    for path in (a, b):
        stem = _module_stem(path)
        patterns.append(
            re.compile(
                rf"^[ \t]*(?:from[ \t]+\S*\b{re.escape(stem)}[ \t]+import\b|import[ \t]+.*\b{re.escape(stem)}\b)".encode(),
                re.M,
            )
        )
    if not files:
        files.extend(_project_files([a, b], set()))
    for path, data in files:
        if path not in (a, b) and all(pattern.search(data) for pattern in patterns):
            joiner = summarize(path, data.decode("utf-8", "replace"))
            if joiner is not None:
                probe = ProjectIndex([*index.modules.values(), joiner])
                if {a, b} <= {target for _, target in probe.imported(joiner)}:
                    return True
    return False


def module_facts(index: ProjectIndex) -> dict[str, ModuleFacts]:
    """Facts for every indexed module that has any (the rest get the defaults)."""
    exported: dict[str, set[str]] = {}
    amp_from: dict[str, list[tuple[str, int]]] = {}
    for path, summary in index.modules.items():
        for edge, target in index.imported(summary):
            if not edge.names:
                continue
            exported.setdefault(target, set()).update(edge.names)
            source = index.modules[target]
            names = source.amp_names if edge.names == ("*",) else source.amp_names & set(edge.names)
            for name in sorted(names):
                amp_from.setdefault(path, []).append((name, edge.line))
    facts = {}
    for path in index.modules:
        if path in exported or path in amp_from:
            facts[path] = ModuleFacts(
                amp_from=tuple(amp_from.get(path, ())),
                exported=frozenset(exported.get(path, ())),
            )
    return facts


def build_index(sources: Mapping[str, str]) -> ProjectIndex:
    """Index the given modules (path -> source text); those that do not parse are left out."""
    summaries = (summarize(path, text) for path, text in sources.items() if not path.endswith(".ipynb"))
    return ProjectIndex(summary for summary in summaries if summary is not None)


class Outcome(NamedTuple):
    """How one module's amp setup came out of a pass."""

    amp_left: bool  # some use of Apex amp stays
    amp_migrated: bool  # some use of Apex amp was rewritten
    scalers: tuple[ScalerInfo, ...] = ()  # the GradScalers it creates
    scaler_unused: bool = False  # a training GradScaler that no backward of the module uses


def _free_scalers(result: Outcome) -> list[ScalerInfo]:
    """The GradScalers a module creates that are not kept on a class's ``self``."""
    return [info for info in result.scalers if info.klass is None]


def _reaches(summary: ModuleSummary, start: str, targets: set[str]) -> bool:
    """Whether the top-level function ``start`` calls into ``targets`` (or is one)."""
    seen, pending = set(), [start]
    while pending:
        name = pending.pop()
        if name in targets:
            return True
        if name in seen or name not in summary.functions:
            continue
        seen.add(name)
        pending.extend(summary.functions[name].calls)
    return False


class _Reference(NamedTuple):
    """A project file that spells some names defined in a module (see ``ProjectPlan._references``)."""

    path: str
    derives: bool  # a class there derives from one of them
    indexed: bool  # the index holds it (its calls were read)
    imports: set[str] | None  # those it imports from the module; None: any (a star import, the module as a value)


class ProjectPlan:
    """The facts each module is migrated with, and how to settle a group after a first pass.

    The runner migrates every module once with ``facts``; ``settle`` then looks at how each
    group came out and returns the modules to migrate again with new facts: a group where
    some module keeps Apex amp while another was migrated is frozen whole, and a module that
    kept its amp import only for modules that no longer use amp may drop it.
    """

    # how far imports are followed into modules that were not given, and how many are read
    CONTEXT_DEPTH = 3
    CONTEXT_FILES = 200

    def __init__(
        self,
        summaries: Iterable[ModuleSummary],
        displays: Mapping[str, str] | None = None,
        context: Callable[[str], ModuleSummary | None] | None = None,
        searched: Iterable[str] | None = None,
    ) -> None:
        """Plan the project of the given modules' ``summaries``; ``context(path)``, when given,
        summarizes a module that was not given (or returns None: no such file, or it does not
        parse), so that imports can be followed into it. ``searched``, when given, holds the
        folders discovery searched: a project file elsewhere was not given, and one that calls
        amp on a given module's setup keeps that setup as it was."""
        _reads.clear()
        _find_beside.cache_clear()  # a process may plan again after files changed (tests, servers)
        # the files and folders read beyond the summarized modules, for a cached plan's probes
        self.reads = _reads
        self.index = ProjectIndex(summaries)
        if context is not None:
            self._add_context(context)
            self._add_apex_name_importers(context)
        self.groups = amp_groups(self.index)
        self.facts = module_facts(self.index)
        self._display = dict(displays or {})
        self._name_importers()
        self._scan_apex_options({os.path.abspath(folder) for folder in searched or ()})
        self._stage: dict[int | None, str] = {}
        self._blocked: dict[int, str] = {}  # group -> why its setup could not be threaded or handed off
        self._threaded: dict[int, set[str]] = {}  # group -> the modules given new facts to thread a scaler
        for path, copies in apex_copies.copy_facts(self.index, self.display).items():
            self.facts[path] = replace(self.facts.get(path, ModuleFacts()), apex_copies=copies)
        self._plan_carriers()
        self._freeze_outside_context()
        if searched is not None:
            self._freeze_for_amp_users_out_of_the_run({os.path.abspath(folder) for folder in searched})
        self._find_gradient_norms()
        self._find_half_feeders()
        self._find_halving_helpers()
        self._find_none_only({os.path.abspath(folder) for folder in searched or ()})
        self._find_held_defaults({os.path.abspath(folder) for folder in searched or ()})
        self._find_amp_factories({os.path.abspath(folder) for folder in searched or ()})
        # per folder, the project modules each module there imports (see _may_run_together)
        self._importers: dict[str, set[frozenset[str]]] = {}
        # setups handed to a library's runner, being migrated: their modules, each with why it
        # stays as it was (and the code to write there) if any of them keeps Apex amp
        self._runner_setups: list[Callable[[str], dict[str, str]]] = []
        # setups left to migrate because the orphans they would reach are a runner setup's; frozen
        # after all if that runner setup goes back (orphans, the setup's module, the reason)
        self._spared: list[tuple[set[str], str, str]] = []

    def display(self, path: str) -> str:
        return self._display.get(path, os.path.relpath(path))

    def _add_context(self, context: Callable[[str], ModuleSummary | None]) -> None:
        """Summarize the project modules the given ones import, so imports can be followed."""
        frontier = list(self.index.modules)
        for _depth in range(self.CONTEXT_DEPTH):
            found = self._context_layer(frontier, context, self.CONTEXT_FILES - len(self.index.modules))
            if not found:
                break
            self.index = ProjectIndex([*self.index.modules.values(), *found.values()])
            frontier = list(found)

    def _context_layer(
        self, frontier: list[str], context: Callable[[str], ModuleSummary | None], room: int
    ) -> dict[str, ModuleSummary]:
        """The modules ``frontier`` imports that are not indexed yet; {} when there are none,
        or more than ``room`` (the layer is left out whole, so the search stops there: the
        rest of it would be summarized for nothing)."""
        found: dict[str, ModuleSummary] = {}
        for path in frontier:
            for edge in self.index.modules[path].imports:
                if edge.module.split(".")[0] in ("apex", "torch") or self.index.resolve(path, edge.module):
                    continue
                names = [edge.module, *(f"{edge.module}.{name}" for name in edge.names if name != "*")]
                for candidate in (file for name in names for file in _module_files(path, name)):
                    if candidate in self.index.modules or candidate in found:
                        continue
                    summary = context(candidate)
                    if summary is not None:
                        summary.given = False
                        found[candidate] = summary
                        if len(found) > room:
                            return {}
                        break
        return found

    def _apex_names(self) -> dict[str, set[str]]:
        """For each given module, the names its ``from apex.X import Y [as Z]`` imports bind
        (amp aside: the amp setup has facts of its own)."""
        names: dict[str, set[str]] = {}
        for path, summary in self.index.modules.items():
            if not summary.given:
                continue
            for edge in summary.imports:
                if edge.module.split(".")[0] != "apex" or edge.module == "apex.amp" or edge.names in ((), ("*",)):
                    continue
                bound = {
                    alias for name, alias in zip(edge.names, edge.aliases) if (edge.module, name) != ("apex", "amp")
                }
                if bound:
                    names.setdefault(path, set()).update(bound)
        return names

    def _add_apex_name_importers(self, context: Callable[[str], ModuleSummary | None]) -> None:
        """Summarize the project files that import an Apex class from a given module
        (``from norms import SyncBN2d`` where norms.py has ``from apex.parallel import
        SyncBatchNorm as SyncBN2d``): they name no Apex, so neither the pre-filter nor the imports
        of the given modules lead to them, yet the import they rely on must stay (``exported``)."""
        names = self._apex_names()
        wanted = set().union(*names.values()) if names else set()
        if not wanted:
            return
        spelled = re.compile(rb"\b(?:" + b"|".join(re.escape(n.encode()) for n in sorted(wanted)) + rb")\b")
        found: dict[str, ModuleSummary] = {}
        for path, data in _project_files(sorted(names), set(self.index.modules)):
            if b"import" not in data or spelled.search(data) is None:
                continue
            summary = context(path)
            if summary is None:
                continue
            for edge in summary.imports:
                target = self.index.resolve(path, edge.module)
                if target in names and ("*" in edge.names or names[target] & set(edge.names)):
                    summary.given = False
                    found[path] = summary
                    break
        if found:
            self.index = ProjectIndex([*self.index.modules.values(), *found.values()])

    def _name_importers(self) -> None:
        """Tell each given module which project modules import its Apex names from it."""
        names = self._apex_names()
        importers: dict[str, set[tuple[str, str]]] = {}
        for path, summary in self.index.modules.items():
            for edge, target in self.index.imported(summary):
                if target not in names:
                    continue
                # one read only to find it (not given) is named from the module it imports
                shown = self.display(path) if summary.given else os.path.relpath(path, os.path.dirname(target))
                for name in names[target] if "*" in edge.names else names[target] & set(edge.names):
                    importers.setdefault(target, set()).add((name, shown))
        for path, found in importers.items():
            self.facts[path] = replace(self.facts.get(path, ModuleFacts()), apex_importers=tuple(sorted(found)))

    _APEX_OPTIONS = (b"channel_last", b"fuse_relu")

    def _scan_apex_options(self, searched: set[str]) -> None:
        """Tell the given modules that import Apex's SyncBatchNorm which of its Apex-only options
        the Python files of their project spell (a vendored copy of Apex, in a folder named
        ``apex``, aside): a SyncBatchNorm class handed to the project's code (``norm_layer=
        BatchNorm2d``) can only be called there with an option some file spells. The project is
        the folder a marker (setup.py, .git, ...) makes its root, else the topmost folder discovery
        searched around the module; with neither, or more files than are read, nothing is known."""
        paths = [
            path
            for path, summary in self.index.modules.items()
            if summary.given
            and any(
                edge.module.startswith("apex.parallel") and "SyncBatchNorm" in edge.names for edge in summary.imports
            )
        ]
        roots: set[str] = set()
        for path in paths:
            root = project_root(path)
            if os.path.dirname(root) == root:  # no marker up to the file system's root
                around = [
                    folder for folder in searched if os.path.commonpath([folder, os.path.abspath(path)]) == folder
                ]
                if not around:
                    return
                root = min(around, key=len)
            roots.add(root)
        spelled: set[bytes] = set()
        under_roots = (path for root in sorted(roots) for path in _python_files(root, also_skipped={"apex"}))
        files = list(itertools.islice(under_roots, _CARRIER_SCAN_FILES + 1))
        if len(files) > _CARRIER_SCAN_FILES:
            return
        for path in files:
            try:
                with open(path, "rb") as handle:
                    data = handle.read()
            except OSError:
                return
            spelled.update(option for option in self._APEX_OPTIONS if option in data)
        found = tuple(sorted(option.decode() for option in spelled))
        for path in paths:
            self.facts[path] = replace(self.facts.get(path, ModuleFacts()), apex_options_spelled=found)

    def _plan_carriers(self) -> None:
        """Tell the modules of each group which attributes carry the amp module between them:
        stored (``args.amp = amp``) in one member and called through in one (the same or another)."""
        for number, group in enumerate(self.groups):
            members = [self.index.modules[path] for path in group.paths]
            carried = set().union(*(m.amp_stores for m in members)) & set().union(*(m.carried_uses for m in members))
            if not carried:
                continue
            outside = _carrier_users_outside(group.paths, carried, self._given_paths)
            if outside is not None:
                reason = (
                    f"{self.display(outside)} also stores the amp module on an object or calls amp through one "
                    f"(`.{'`, `.'.join(sorted(carried))}`) and was not given: run ampmigrate on the whole project "
                    "(or include that file)"
                )
                self._freeze_group(number, reason)
                continue
            conditions = {
                path for summary in members for attribute, path in summary.store_conditions if attribute in carried
            }
            if len(conditions) != 1 or None in conditions:
                # the readers must know where the attribute holds a scaler: where it held the amp module
                self._freeze_group(
                    number,
                    "the amp module is stored on an object under different conditions, or inside a loop, `with` "
                    "or `try`, so the code that reads it there cannot know where it holds a GradScaler",
                )
                continue
            held = next(iter(conditions))
            for summary in members:
                if (summary.amp_stores | summary.carried_uses) & carried:
                    attributes = frozenset((summary.amp_stores | summary.carried_uses) & carried)
                    self.facts[summary.path] = replace(
                        self.facts.get(summary.path, ModuleFacts()), carriers=attributes, carrier_conditions=held
                    )

    def _find_gradient_norms(self) -> None:
        """Tell the modules that call amp.master_params which functions they import compute a
        norm of the gradients they are given (``get_grad_norm`` in a Swin-Transformer's utils.py)."""
        proven: dict[str, set[str]] = {}  # module -> its functions that are norms of gradients
        for path, summary in self.index.modules.items():
            if "master_params" not in summary.amp_apis:
                continue
            norms = []
            for alias, origin, name in self._imported_functions(path):
                if origin not in proven:
                    proven[origin] = gradient_norms.gradient_norms_in(_text(origin))
                if name in proven[origin]:
                    norms.append(alias)
            if norms:
                self.facts[path] = replace(self.facts.get(path, ModuleFacts()), gradient_norms=tuple(sorted(norms)))

    def _find_half_feeders(self) -> None:
        """Tell the modules that call amp.initialize which functions they import hand the model they
        are given an input cast to float16 by hand (an evaluation module's ``model(x.half())``):
        migrated, an O2/O3 model passed there would be float32 and meet that input."""
        proven: dict[str, dict[str, list[half_inputs.Feed]]] = {}
        for path, summary in self.index.modules.items():
            if "initialize" not in summary.amp_apis:
                continue
            found = []
            for alias, origin, name in self._imported_functions(path):
                if origin not in proven:
                    proven[origin] = half_inputs.feeders_in(_text(origin))
                for feed in proven[origin].get(name, []):
                    index = -1 if feed.index is None else feed.index
                    found.append((alias, index, feed.model, self.display(origin), feed.line, feed.cast, feed.bare))
            if found:
                self.facts[path] = replace(self.facts.get(path, ModuleFacts()), half_feeders=tuple(sorted(found)))

    def _find_halving_helpers(self) -> None:
        """Tell the modules that name FP16_Optimizer which functions they import halve the model
        they are given under a flag (``load_model(model, checkpoint, args)`` with ``if args.fp16:
        model.half()`` in a train_utils.py): the set-up may keep that model float32 itself."""
        proven: dict[str, dict[str, halving_helpers.HalvingHelper]] = {}
        readers: dict[str, dict[str, halving_helpers.GroupReader]] = {}
        for path, summary in self.index.modules.items():
            if not (summary.fp16_optimizer and summary.given):
                continue
            found, reading = [], []
            for alias, origin, name in self._imported_functions(path):
                if origin not in proven:
                    text = _text(origin)
                    proven[origin] = halving_helpers.halving_helpers_in(text)
                    readers[origin] = halving_helpers.param_group_readers_in(text)
                helper = proven[origin].get(name)
                if helper is not None:
                    found.append((alias, *helper, self.display(origin)))
                reader = readers[origin].get(name)
                if reader is not None:
                    reading.append((alias, *reader))
            if found or reading:
                self.facts[path] = replace(
                    self.facts.get(path, ModuleFacts()),
                    halving_helpers=tuple(sorted(found)),
                    param_group_readers=tuple(sorted(reading)),
                )

    def _find_none_only(self, searched: set[str]) -> None:
        """Tell each given module which of its names and parameters only ever hold None once the Apex
        fallbacks of torch version tests go (``version_fallbacks``): ``amp_version_fallback`` drops the
        code its functions have for them, in the module of the fallback and in the modules it calls."""
        trees: dict[str, ast.Module] = {}
        for path, summary in self.index.modules.items():
            if summary.given and summary.uses_amp and "__version__" in _text(path):
                tree = _tree(path)
                if tree is not None:
                    trees[os.path.abspath(path)] = tree
        if not trees:
            return
        files: list[tuple[str, bytes]] = []

        def spelled(word: str) -> list[tuple[str, ast.Module]] | None:
            if not files:  # the project around the fallbacks and the folders given (a file stands for each)
                files.extend(_project_files([*sorted(trees), *(os.path.join(f, "-") for f in sorted(searched))], set()))
            if not files or len(files) >= _CARRIER_SCAN_FILES:
                return None  # the project was not read (whole): a call out of sight may give it more
            return _spelling(files, word)

        given = {os.path.abspath(path): path for path, summary in self.index.modules.items() if summary.given}
        found = version_fallbacks.none_only(trees, spelled)
        for path in sorted({*trees, *found}):
            # a module the index left out (no Apex in it, `amp.state_dict()` on a parameter) is still
            # migrated, under its path; one not in this run keeps its code, which then gets None
            module = given.get(path, path)
            pairs = frozenset(found.get(path, ()))
            self.facts[module] = replace(self.facts.get(module, ModuleFacts()), none_only=pairs)

    def _find_held_defaults(self, searched: set[str]) -> None:
        """Tell each given module which parameters of its top-level functions, handed to amp.initialize
        as its loss_scale (``initialize_amp(model, loss_scale="dynamic")``, argus-alaska's helper),
        every call in the project leaves at their default: the scale is that default's there."""
        for path, summary in self.index.modules.items():
            if not summary.given or "initialize" not in summary.amp_apis or "loss_scale" not in _text(path):
                continue
            tree = _tree(path)
            if tree is None:
                continue
            wanted = _loss_scale_parameters(tree)
            if not wanted:
                continue
            files = list(_project_files([path, *(os.path.join(f, "-") for f in sorted(searched))], set()))
            if not files or len(files) >= _CARRIER_SCAN_FILES:
                continue  # the project was not read whole: a call out of sight may give it a scale

            held = version_fallbacks.defaults_held(
                os.path.abspath(path), tree, wanted, functools.partial(_spelling, files)
            )
            if held:
                self.facts[path] = replace(self.facts.get(path, ModuleFacts()), held_defaults=frozenset(held))

    def _find_amp_factories(self, searched: set[str]) -> None:
        """Tell each given module that defines a function whose only results are the Apex amp module
        or None (``get_amp(fp16)``) where its callers keep that result, and tell those callers what
        their names hold (``amp_factories``): the findings there name it instead of a guess."""
        given = {os.path.abspath(path): path for path, summary in self.index.modules.items() if summary.given}
        results: dict[str, list[tuple[str, str, str, str, str]]] = {}
        for path, summary in self.index.modules.items():
            if not summary.given or not summary.uses_amp:
                continue
            text = _text(path)
            if "apex" not in text or "return" not in text:
                continue
            tree = _tree(path)
            found = amp_factories.factories(tree) if tree is not None else []
            if not found:
                continue
            files = list(_project_files([path, *(os.path.join(f, "-") for f in sorted(searched))], set()))
            described: list[tuple[str, str, str]] = []
            for factory in found:
                spelled = _spelling(files, factory.name) if 0 < len(files) < _CARRIER_SCAN_FILES else None
                if spelled is None:
                    described.append((factory.name, factory.condition or "", ""))
                    continue
                callers, calls = amp_factories.describe_callers(spelled, factory, self.display, path)
                described.append((factory.name, factory.condition or "", callers or "nothing in the project calls it"))
                place = f"{self.display(path)}:{factory.line}"
                for caller, result in calls:
                    if result.holder:
                        results.setdefault(given.get(caller, caller), []).append(
                            (result.klass, result.function, result.holder, result.call, place)
                        )
            self.facts[path] = replace(self.facts.get(path, ModuleFacts()), amp_factories=tuple(described))
        for module, kept in results.items():
            self.facts[module] = replace(self.facts.get(module, ModuleFacts()), amp_factory_results=tuple(kept))

    def _freeze_outside_context(self) -> None:
        """Freeze the groups whose amp setup continues in a module that was not given."""
        for number, group in enumerate(self.groups):
            for path in group.paths:
                outside = [
                    t
                    for t in self.index.reached_amp_modules(path)
                    if not self.index.modules[t].given and not self._named_like_amp_only(t)
                ]
                if outside:
                    self._freeze_group(
                        number,
                        f"the setup continues in {self.display(outside[0])}, which was not given: run ampmigrate "
                        "on the whole project (or on both files)",
                    )
                    break

    def _freeze_for_amp_users_out_of_the_run(self, searched: set[str]) -> None:
        """Freeze the groups with an amp.initialize whose module a project file out of the run
        (in a folder discovery did not search: ``ampmigrate trainer.py``) imports while calling
        amp without an amp.initialize of its own (a trainer subclass that scales its loss with
        the base class's setup): migrated without it, that file would call Apex amp on a setup
        that no longer exists."""
        setups = {
            path: number
            for number, group in enumerate(self.groups)
            for path in group.paths
            if "initialize" in self.index.modules[path].amp_apis
        }
        if not setups:
            return
        given = {os.path.abspath(path) for path in self._given_paths}
        members = {os.path.abspath(path): number for number, group in enumerate(self.groups) for path in group.paths}
        # an importer spells the module's name (or its package's, for `from . import x`)
        names = {os.path.basename(os.path.dirname(path)).encode() for path in setups}
        names |= {os.path.splitext(os.path.basename(path))[0].encode() for path in setups}
        # the folders discovery searched: what there uses amp was given (or excluded on purpose)
        for other, data in _project_files(sorted(setups), given, unread=searched):
            if not any(name in data for name in names):
                continue
            if b"amp" not in data or not _AMP_USE.search(data) or _AMP_INITIALIZE.search(data):
                continue
            for _, target in self._imports_out_of_index(other, data.decode("utf-8", "replace")):
                number = members.get(os.path.abspath(target))
                if number is not None and self._stage.get(number) != "frozen":
                    self._freeze_group(
                        number,
                        f"{self.display(other)} (not given) imports {self.display(target)} and calls Apex amp on "
                        "its setup: run ampmigrate on the whole project (or give that file too)",
                    )

    def _named_like_amp_only(self, path: str) -> bool:
        """Whether ``path``, a module not given, spells no Apex and calls amp only through
        attributes no other module of the project stores the amp module in:
        ``self.amp_scaler.state_dict()`` in timm's CheckpointSaver is a call on timm's scaler
        object, named like amp."""
        modules = self.index.modules
        summary = modules[path]
        if summary.amp_names or summary.amp_apis or summary.parameter_uses:
            return False
        uses = summary.unbound_uses
        if not uses or any(use.name not in summary.carried_uses for use in uses):
            return False
        try:
            with open(path, "rb") as handle:
                if b"apex" in handle.read():
                    return False
        except OSError:
            return False
        # its own `self.amp_scaler = amp_scaler` stores what its caller passes: a caller that
        # passed the amp module would use it as a value, which keeps that caller's setup as it was
        others = [m.amp_stores for p, m in modules.items() if p != path]
        if summary.carried_uses & set().union(*others):
            return False
        return _carrier_users_outside([path], set(summary.carried_uses), self._given_paths) is None

    @functools.cached_property
    def _given_paths(self) -> set[str]:
        """The modules given to migrate (the others were read only to follow imports)."""
        return {path for path, summary in self.index.modules.items() if summary.given}

    def _freeze_group(self, number: int, reason: str) -> None:
        """Leave every module of group ``number`` as it was, for ``reason``."""
        self._stage[number] = "frozen"
        for path in self.groups[number].paths:
            self._freeze(path, reason)

    def _freeze(self, path: str, reason: str) -> None:
        previous = self.facts.get(path, ModuleFacts())
        if previous.frozen is None:
            self.facts[path] = replace(previous, frozen=reason)

    def settle(self, outcome: Mapping[str, Outcome]) -> dict[str, ModuleFacts]:
        """The modules to migrate again, with their new facts; empty once all is settled.

        A group that came out half migrated (some module keeps Apex amp while another was
        rewritten) first gets its scaler threaded across modules, where one module creates
        it and the others' amp code sits in functions it calls; if that still leaves Apex
        behind, the group is frozen whole. A module that kept its amp import only for
        modules that no longer use amp drops it.
        """
        # the runner setups tried in the pass before this one (before new ones are tried)
        again: dict[str, ModuleFacts] = {}
        tried = list(self._runner_setups)  # in the pass before this one (new ones are tried now)
        if not self._stage:
            again.update(self._freeze_unused_scalers(outcome))
        again.update(self._settle_runner_setups(outcome, tried))
        for number, group in enumerate(self.groups):
            members = [path for path in group.paths if path in outcome]
            left = [path for path in members if outcome[path].amp_left]
            migrated = [path for path in members if outcome[path].amp_migrated]
            stage = self._stage.get(number, "first")
            if not (left and migrated) or stage == "frozen":
                continue
            threaded = (
                (
                    self._thread(number, members, left, outcome)
                    or self._hand_off(number, members, left, outcome)
                    or self._inherit(number, members, left, outcome)
                )
                if stage == "first"
                else None
            )
            if threaded:
                self._stage[number] = "threaded"
                self._threaded[number] = set(threaded)
                again.update(threaded)
                continue
            self._stage[number] = "frozen"
            reason = (
                f"the setup continues in {self.display(left[0])}, where Apex amp stays (see its findings); "
                "migrating the rest alone would break it"
            )
            if number in self._blocked:
                reason += f"; {self._blocked[number]}"
            # and the modules the threading changed (a receiving class's new parameter) though amp stays
            for path in [*migrated, *sorted(self._threaded.get(number, set()) & set(members) - set(migrated))]:
                again[path] = replace(self.facts.get(path, ModuleFacts()), frozen=reason)
        for path, facts in self.facts.items():
            if path not in outcome or path in again or not facts.exported or not self.index.modules[path].amp_names:
                continue
            member_of = next((n for n, g in enumerate(self.groups) if path in g.paths), None)
            users = [other for other, f in self.facts.items() if f.amp_from and self._gets_amp_from(other, path)]
            keeping = [u for u in users if outcome.get(u, Outcome(True, False)).amp_left]
            if self._stage.get(member_of) == "frozen" or keeping:
                # named: the given modules seen keeping amp (one not run here uses no amp call)
                kept_by = tuple(sorted(self.display(u) for u in keeping if u in outcome))
                if kept_by != facts.amp_kept_by:
                    again[path] = replace(facts, amp_kept_by=kept_by)
                continue
            # every module that took amp from here no longer uses it (once: what else other modules
            # import from here stays exported, and facts that did not change would never settle)
            exported = facts.exported - self.index.modules[path].amp_names - {"*"}
            if exported != facts.exported:
                again[path] = replace(facts, exported=exported)
        if not again:
            # once every amp setup has settled: which of them stay on Apex is known only then
            casts = self._cast_functions_beside_apex(outcome)
            for path, reason in {**casts, **self._notebooks_beside_apex(outcome, casts)}.items():
                again[path] = replace(self.facts.get(path, ModuleFacts()), frozen=reason)
        self.facts.update(again)
        return again

    def _cast_functions_beside_apex(self, outcome: Mapping[str, Outcome]) -> dict[str, str]:
        """The migrated modules whose only amp use is a casting decorator (``amp.float_function``
        around a custom kernel), when every amp training setup of the same project folder stays
        on Apex (those that may run in its program), each with why it stays too.

        No import links them (the model reaches the layer, not the amp code), yet they run
        together: the helpers written for the decorators cast only inside ``torch.autocast``,
        so under the Apex O1 that stays the kernel would get the float16 tensors Apex cast
        away from it. Where some setups of the folder were migrated and others stay, no one
        spelling serves both, and the modules go with the migrated ones."""
        modules = self.index.modules  # notebooks are not indexed: they are left out here

        def apis(path: str) -> set[str]:
            return modules[path].amp_apis if path in modules else set()

        def trains(path: str) -> bool:
            # its own amp calls, and those through the amp module kept on an object or passed in
            # (`self.amp = amp` then `self.amp.scale_loss(...)`: adik0861/RetinaNet train_epoch.py)
            if path not in modules:
                return False
            return bool(_amp_calls(modules[path]) & {"initialize", "scale_loss"})

        # an inference amp.init has no bearing: removed, it leaves float32 code the helpers suit
        training = [path for path in outcome if trains(path)]
        kept = [path for path in training if outcome[path].amp_left]
        migrated = [path for path in training if outcome[path].amp_migrated]
        found: dict[str, str] = {}
        for path, result in outcome.items():
            only_casts = bool(apis(path)) and not apis(path) - _CAST_FUNCTION_APIS
            if not (result.amp_migrated and only_casts) or self.facts.get(path, ModuleFacts()).frozen is not None:
                continue
            # the setups that may run in its program (in a monorepo, not another subproject's)
            keeping = [other for other in kept if may_share_a_program(other, path)]
            if keeping and not any(may_share_a_program(other, path) for other in migrated):
                found[path] = (
                    f"the Apex amp setup of {self.display(keeping[0])} stays (see its findings), and under its O1 "
                    "the helpers that would replace these decorators cast nothing (they cast inside torch.autocast "
                    "only): migrate this module together with that setup"
                )
        return found

    def _notebooks_beside_apex(self, outcome: Mapping[str, Outcome], casts: Mapping[str, str]) -> dict[str, str]:
        """The notebooks whose migrated training setup (the GradScalers they create tell it) runs
        beside modules of their program that stay on Apex, each with why it stays too.

        The index holds no notebook, so no import links one to a group: a notebook that calls
        ``amp.initialize`` and hands the model to a trainer module (``do_train`` with its own
        ``amp.scale_loss``) is migrated alone. Two shapes are known to break: casting decorators
        kept on Apex (``casts``, or frozen earlier), which cast nothing for the notebook's
        autocast; and, when no backward of the notebook uses its GradScaler, amp code without an
        ``amp.initialize`` of its own, which would call Apex amp on a setup that is gone."""
        modules = self.index.modules

        def apis(path: str) -> set[str]:
            return modules[path].amp_apis if path in modules else set()

        def only_casts(path: str) -> bool:
            return bool(apis(path)) and not apis(path) - _CAST_FUNCTION_APIS

        staying_casts = [
            path for path, result in outcome.items() if only_casts(path) and (path in casts or result.amp_left)
        ]
        orphans = [
            path
            for path, result in outcome.items()
            if path in modules and result.amp_left and not only_casts(path) and "initialize" not in apis(path)
        ]
        found: dict[str, str] = {}
        for path, result in outcome.items():
            if not (path.endswith(".ipynb") and result.scalers):
                continue
            if self.facts.get(path, ModuleFacts()).frozen is not None:
                continue
            cast = next((other for other in staying_casts if may_share_a_program(other, path)), None)
            orphan = next((other for other in orphans if may_share_a_program(other, path)), None)
            if cast is not None:
                found[path] = (
                    f"the casting decorators of {self.display(cast)} stay on Apex (see its findings): they cast only "
                    "under Apex amp, so under torch.autocast here its kernels would get float16 tensors: migrate "
                    "this notebook together with that module"
                )
            elif result.scaler_unused and orphan is not None:
                found[path] = (
                    f"no backward here uses its GradScaler, and {self.display(orphan)} keeps Apex amp without an "
                    "amp.initialize of its own (see its findings): the training loop may be there (a notebook's "
                    "imports are not followed), and it would call Apex amp on a setup that no longer exists: "
                    "migrate them together"
                )
        return found

    def _freeze_unused_scalers(self, outcome: Mapping[str, Outcome]) -> dict[str, ModuleFacts]:
        """Freeze a migrated amp.initialize whose scaler nothing here uses while, in the same
        project folder, amp code without an amp.initialize stays as it was.

        Frameworks reach their training loop through registries and config strings (an
        mmcv optimizer hook), not imports; migrating the initialize alone would leave that
        loop calling Apex amp on a setup that no longer exists.
        """
        orphans = [
            path
            for path, result in outcome.items()
            if result.amp_left and "initialize" not in self.index.modules[path].amp_apis
        ]
        again = {}
        alone = {group.paths[0] for group in self.groups if len(group.paths) == 1}
        # a module in no group is alone too: `import apex` with `apex.amp.initialize(...)` (whai362/PVT
        # detection's train.py), given by itself
        alone |= {path for path in outcome if not any(path in group.paths for group in self.groups)}
        # orphans no import links to an amp.initialize of their own: they can only be using one
        # set up elsewhere (a logging hook reading Apex's loss scalers, reached through a registry)
        unowned = [
            orphan
            for orphan in orphans
            if not any(
                orphan in group.paths and any("initialize" in self.index.modules[p].amp_apis for p in group.paths)
                for group in self.groups
            )
        ]
        # the setups handed to a library's runner first: the orphans a runner takes over are none
        taken: set[str] = set()
        for path, result in outcome.items():
            if not (result.scaler_unused and result.amp_migrated):
                continue
            # an orphan import-linked to an amp.initialize belongs to that setup, not to this one
            # (and once its scaler is threaded to it, it is no orphan at all)
            related = [orphan for orphan in unowned if self._may_run_together(orphan, path)]
            # with the modules import-linked to them or beside them (the checkpoint function a runner
            # subclass imports, relatively in a namespace package: whai362/PVT detection/mmcv_custom)
            folders = {os.path.dirname(os.path.abspath(orphan)) for orphan in related}
            linked = [
                orphan
                for orphan in unowned
                if orphan not in related
                and (
                    os.path.dirname(os.path.abspath(orphan)) in folders
                    or any(orphan in group.paths and set(related) & set(group.paths) for group in self.groups)
                )
            ]
            by_hand = self._runner_by_hand(path, [*related, *linked], result) if related else None
            if by_hand is not None:
                # an mmcv-style runner: the runner keeps the scaler for its hooks and methods, or,
                # where that cannot be done, each module gets the code to write in it and stays whole
                reasons_for, threaded = by_hand
                facts = threaded or {
                    member: replace(self.facts.get(member, ModuleFacts()), frozen=why)
                    for member, why in reasons_for("").items()
                }
                if threaded:
                    self._runner_setups.append(reasons_for)
                    taken |= set(reasons_for(""))
                again.update(facts)
                continue
            if related:
                reason = (
                    f"no backward here uses its GradScaler, and {self.display(related[0])} keeps Apex amp without an "
                    "amp.initialize of its own: they may be one setup, linked at run time rather than by imports"
                )
            elif path in alone and _trains(path):
                # the module trains (it backpropagates somewhere) but nothing in the project can
                # receive the scaler: the loss is scaled by code the tool cannot see (timm's
                # ApexScaler calls amp.scale_loss inside a library), or not at all; either way the
                # initialize must stay for that code to keep working
                reason = (
                    "no backward in this module or in a project module it is linked to scales a loss with the "
                    "GradScaler that would replace this amp.initialize: the training step that uses Apex amp is out "
                    "of sight (a library helper such as timm's ApexScaler, a method inherited from a library class "
                    "such as transformers' Trainer.training_step, or a module linked at run time), and "
                    "removing the initialize would leave it calling Apex on a setup that no longer exists; migrate "
                    "that step to `scaler.scale(loss).backward()`, `scaler.step(optimizer)`, `scaler.update()` (or "
                    "include its module), then run ampmigrate again"
                )
            elif (
                path in alone
                and (setup := _initialized_in_function(path)) is not None
                and not _trains(path)
                and self._linked_to_training(path)
            ):
                # the function hands what amp.initialize made to code elsewhere (returns it, passes
                # it on, keeps it on an object) that trains; under Apex O1 its forward pass ran in
                # float16 even with a plain loss.backward(), and would silently
                # run in float32 once the initialize is gone
                given = self._optimizer_to_project(path)
                if given is not None:
                    # named where it is a given module that trains without Apex's scale_loss
                    # (microsoft/scene_graph_benchmark's do_train, with a GradScaler of its own)
                    callee, line, module = given
                    goes = (
                        f"the model and optimizer go to `{callee}` at line {line}, from {self.display(module)}, "
                        "which trains without Apex's scale_loss (a plain `loss.backward()` or a GradScaler of "
                        "its own); Apex (at O1, O2 or O3) ran its forward pass in float16"
                    )
                else:
                    goes = (
                        f"the model and optimizer leave `{setup}` for code out of sight (a caller, a trainer class "
                        "or a module not given), whose forward pass Apex (at O1, O2 or O3) ran in float16 even with a plain "
                        "`loss.backward()` or none"
                    )
                reason = (
                    f"amp.initialize in `{setup}` is given an optimizer, but no backward in this module or in a "
                    f"project module it is linked to scales a loss with the GradScaler that would replace it: {goes}; "
                    "removing the initialize would run it in float32 without a word. Put "
                    'that step\'s forward pass and loss under `with torch.autocast("cuda", dtype=torch.float16):`, '
                    "give it a GradScaler (`scaler.scale(loss).backward()`, `scaler.step(optimizer)`, "
                    f"`scaler.update()`){'' if given else ', or include its module'}, then run ampmigrate again"
                )
            elif (
                (path in alone or self._no_member_shares_its_setup(path))
                and not _trains(path)
                and (handed := self._optimizer_out_of_sight(path)) is not None
            ):
                # the same, for an optimizer handed straight to library code (mmcv's build_runner,
                # a trainer class of a package): that code trains it out of sight
                callee, line = handed
                reason = (
                    f"amp.initialize is given an optimizer, and what it returns is handed to `{callee}` at line "
                    f"{line}, code out of sight that may train with it: Apex (at O1, O2 or O3) ran that training's forward pass "
                    "in float16 even with a plain `loss.backward()`, and removing the initialize would run it in "
                    "float32 without a word, while the GradScaler that would replace it reaches no backward. Put "
                    'that code\'s forward pass and loss under `with torch.autocast("cuda", dtype=torch.float16):` '
                    "with a GradScaler (`scaler.scale(loss).backward()`, `scaler.step(optimizer)`, "
                    "`scaler.update()`), or include its module, then run ampmigrate again"
                )
            else:
                continue
            again[path] = replace(self.facts.get(path, ModuleFacts()), frozen=reason)
        for path, result in outcome.items():
            if not (
                result.amp_migrated and not result.scaler_unused and "initialize" in self.index.modules[path].amp_apis
            ):
                continue
            reached = [orphan for orphan in unowned if self._may_run_together(orphan, path)]
            if not reached:
                continue
            reason = (
                f"{self.display(reached[0])} keeps Apex amp without an amp.initialize of its own, and no "
                "import links it to one: reached at run time (a hook, a registry), it would use Apex amp "
                "on a setup that no longer exists once this amp.initialize is gone"
            )
            if all(orphan in taken for orphan in reached):
                # a runner setup migrates them: this setup stays only if that one goes back
                self._spared.append((set(reached), path, reason))
                continue
            again[path] = replace(self.facts.get(path, ModuleFacts()), frozen=reason)
        return again

    def _settle_runner_setups(
        self, outcome: Mapping[str, Outcome], tried: list[Callable[[str], dict[str, str]]]
    ) -> dict[str, ModuleFacts]:
        """A setup handed to a library's runner (``tried``) whose modules came out migrated is done;
        one where any of them keeps Apex amp goes back to how it was, whole, each module saying why."""
        again = {}
        for reasons_for in tried:
            self._runner_setups.remove(reasons_for)
            members = reasons_for("")
            left = sorted(self.display(path) for path in members if path in outcome and outcome[path].amp_left)
            if not left:
                continue
            why = (
                f"carrying it on the runner left Apex amp in {left[0]} (a call there that the rules do not rewrite, "
                "such as a `with` of more than the scaled loss)"
            )
            for orphans, spared, reason in self._spared:
                if orphans & set(members):
                    again[spared] = replace(self.facts.get(spared, ModuleFacts()), frozen=reason)
            for path, reason in reasons_for(why).items():
                again[path] = replace(
                    self.facts.get(path, ModuleFacts()),
                    frozen=reason,
                    runner_scalers=(),
                    runner_carrier=None,
                    receives_scaler=(),
                    passes_scaler=(),
                    shared_scaler=None,
                )
        return again

    def _runner_by_hand(
        self, path: str, related: list[str], result: Outcome
    ) -> tuple[Callable[[str], dict[str, str]], dict[str, ModuleFacts]] | None:
        """For an amp.initialize in ``path`` whose optimizer goes to a library's runner, with
        ``related`` (amp code without an initialize, reached at run time) its hooks and runner
        methods (``migrate.runner_hooks``): why each module stays on Apex if the setup cannot be
        migrated, with the code to write in it (given why the runner does not carry the scaler,
        "" where it would), and the facts that migrate it (the runner keeps the GradScaler; empty
        where the shape is not the plain one); None for any other shape (read only for the rare
        module whose GradScaler no backward uses)."""
        tree = _tree(path)
        if tree is None:
            return None
        setup = None
        for scope in ast.walk(tree):
            if isinstance(scope, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef)):
                handed = _optimizer_names(scope)
                if handed is not None:
                    setup = runner_hooks.runner_setup(tree, *handed)
                    break
        if setup is None:
            return None
        trees = {}
        for orphan in related:
            orphan_tree = _tree(orphan)
            if orphan_tree is None:
                return None
            trees[self.display(orphan)] = orphan_tree
        written = runner_hooks.hand_written(trees, setup.runner)
        if written is None or set(written) != set(trees):
            return None
        threading = runner_hooks.threading(trees) if setup.plain else None
        scalers = result.scalers
        other = self._other_runners(path, related, setup, trees) if threading else None
        if setup.branched:
            why = (
                f"the runner is built at line {setup.line} in a block of the function that may not build it on every "
                "path after the call (it is migrated where that statement is in the function's own block, or in an "
                "`if` whose every branch, `else` included, binds the runner once in plain statements): "
                f"`{setup.runner}.scaler = scaler` after it could miss the runner the hooks run on"
            )
        elif not setup.plain:
            why = (
                'it is migrated only where the call is `amp.initialize(model, optimizer, opt_level="O1")` in the '
                "function that builds the runner (in the same block, or in `if`s there), and this one is not"
            )
        elif threading is None or set(threading) != set(trees):
            why = (
                "one of them calls amp in another shape than an optimizer hook's method given the runner, the "
                "runner's own methods and a function only they call"
            )
        elif other is not None:
            why = other
        elif (
            len(scalers) != 1
            or scalers[0].klass is not None
            or scalers[0].static_scale is not None
            or scalers[0].held_scale is not None
        ):
            why = "only a plain dynamic loss scale is carried that way"
        else:
            why = ""

        def reasons(given: str) -> dict[str, str]:
            return self._runner_reasons(path, related, setup, written, why or given)

        if why or threading is None:
            return reasons, {}
        # the checkpoint function only reads the scaler's state: no autocast follows it
        shared = replace(scalers[0], follows=False)
        facts = {
            path: replace(self.facts.get(path, ModuleFacts()), runner_carrier=(setup.runner, setup.line, setup.model))
        }
        for orphan in related:
            plan = threading[self.display(orphan)]
            facts[orphan] = replace(
                self.facts.get(orphan, ModuleFacts()),
                runner_scalers=plan.methods,
                receives_scaler=plan.receives,
                passes_scaler=plan.passes,
                shared_scaler=shared if plan.receives else None,
            )
        return reasons, facts

    def _runner_reasons(
        self, path: str, related: list[str], setup: runner_hooks.RunnerSetup, written: dict[str, list[str]], why: str
    ) -> dict[str, str]:
        """Why each module of a runner setup stays on Apex, with the code to write in it."""
        reasons = {path: runner_hooks.creator_sentence(setup, sorted(self.display(o) for o in related), why)}
        for orphan in related:
            reasons[orphan] = runner_hooks.module_sentence(
                written[self.display(orphan)], self.display(path), setup.runner
            )
        return reasons

    def _other_runners(
        self, path: str, related: list[str], setup: runner_hooks.RunnerSetup, trees: dict[str, ast.Module]
    ) -> str | None:
        """Why the runner ``path`` builds may not be the only one to run the hooks and runner methods
        of ``related``: another ``builder(...)`` call or ``register_training_hooks(...)``
        (config-driven) in the program's files, a construction of one of their classes by name, or
        a module of the program that imports Apex (where it can reach amp) and is not among them (not given, or another
        setup); None if nothing does (read only for a runner setup).

        Other runners do not count where no other runner can get one of those classes: each is
        undecorated (no registry), and the program names it only where it is defined, imported
        and, in the function that builds the setup's runner, made for that runner alone
        (``migrate.runner_hooks.foreign_uses``), with no module that holds it read as a value
        (``getattr(hooks, cfg.type)``): open-mmlab/OpenSelfSup's ``_non_dist_train``, whose runner
        is given the optimizer hook's config, cannot build its ``DistOptimizerHook``."""
        classes = {node.name for tree in trees.values() for node in tree.body if isinstance(node, ast.ClassDef)}
        constructed = (
            re.compile(r"\b(" + "|".join(re.escape(name) for name in sorted(classes)) + r")\s*\(") if classes else None
        )
        mentioned = (
            re.compile(r"\b(" + "|".join(re.escape(name) for name in sorted(classes)) + r")\b") if classes else None
        )
        built = re.compile(rf"\b{re.escape(setup.builder.split('.')[-1])}\s*\(|\bregister_training_hooks\s*\(")
        folders = [_import_root(p) for p in [path, *related]]
        top = os.path.commonpath(folders)
        members = {os.path.abspath(p) for p in [path, *related]}
        others: str | None = None  # the first other runner or construction of a class, by name
        holders: set[str] = set()  # the modules that hold one of the classes, by their last name
        private: str | None = None  # where another runner could get one of the classes
        files = []
        for read, other in enumerate(_python_files(top), start=1):
            if read > _RUNNER_FILES_READ:
                return f"the program under {top} has more than {_RUNNER_FILES_READ} files to search for other runners"
            files.append(other)
            text = _text(other)
            creator = os.path.abspath(other) == os.path.abspath(path)
            calls = [text.count("\n", 0, at) + 1 for at in _calls_of(built, text)]
            if creator:
                # the calls that build the setup's runner (one in each branch of its ``if``) are
                # one, and one ``register_training_hooks`` on it is expected
                inside = [line for line in calls if line in setup.builds]
                calls = [line for line in calls if line not in setup.builds] + inside[:1]
            allowed = 1 if creator else 0
            if others is None and (
                len(calls) > (2 * allowed if "register_training_hooks" in text else allowed)
                or (constructed is not None and _calls_of(constructed, text))
            ):
                others = (
                    f"{self.display(other)} may build another runner (or register hooks from a config) that would "
                    "run them without it"
                )
            if _COPIES_THE_MODEL.search(text):
                return (
                    f"{self.display(other)} copies or pickles the model, whose forward would be an autocast "
                    "wrapper of the original's bound method (a deep copy would run the original)"
                )
            if os.path.abspath(other) not in members and _may_reach_amp(text):
                return (
                    f"{self.display(other)} imports Apex too, and is not among them (include it in the run, or "
                    "migrate it first)"
                )
            imported = _IMPORTS_BY_NAME.search(text)
            if private is None and imported is not None:
                # a module imported by a string (a config's) could be the one that holds them
                at = text.count("\n", 0, imported.start()) + 1
                private = f"`{imported.group(1)}` at {self.display(other)}:{at}"
            if private is None and mentioned is not None and mentioned.search(text):
                tree = _tree(other)
                foreign = (
                    runner_hooks.foreign_uses(tree, classes, setup.function if creator else 0, setup.runner)
                    if tree is not None
                    else "?:0"
                )
                if foreign is not None:
                    name, line = foreign.rsplit(":", 1)
                    private = f"`{name}` at {self.display(other)}:{line}"
                holders.add(_module_stem(other))
        if others is None:
            return None
        if private is not None:
            # what keeps a hook class from being only the setup runner's
            return (
                f"{others}, and {private} may hand them to it (a hook class made only in the function that "
                "builds this runner and registered only on it, with no registry, subclass, string or lookup by "
                "name in the program, would not keep it)"
            )
        if not classes or not holders or not self._built_once(path, setup):
            return others
        # a module that star-imports one that holds them holds them too
        stars = re.compile(r"^\s*from\s+\S*?\b(" + "|".join(map(re.escape, sorted(holders))) + r")\s+import\s+\*", re.M)
        for other in files:
            if stars.search(_text(other)):
                holders.add(_module_stem(other))
                # its names read by a string (``globals()[cfg.type]``) would find them too
                tree = _tree(other)
                found = runner_hooks.foreign_uses(tree, classes, 0, setup.runner) if tree is not None else "?:0"
                if found is not None:
                    return f"{others}, and {self.display(other)} star-imports their classes and reads its names by a string"
        named = re.compile(r"\b(" + "|".join(map(re.escape, sorted(holders))) + r")\b")
        for other in files:
            text = _text(other)
            if not named.search(text):
                continue
            tree = _tree(other)
            found = runner_hooks.module_values(tree, holders) if tree is not None else "?:0"
            if found is not None:
                name, line = found.rsplit(":", 1)
                return (
                    f"{others}, and `{name}` at {self.display(other)}:{line} reads a module that holds their "
                    "classes as a value (a lookup by a config's name could build one there)"
                )
        return None

    def _no_member_shares_its_setup(self, path: str) -> bool:
        """Whether no other module of ``path``'s group can run its training under ``path``'s
        amp.initialize: each one that calls amp makes an amp.initialize of its own (a training
        script beside a helper module whose learning-rate finder initializes amp again for
        a library: RobbieEarle/vector_projects trainer.py and util.py), so nothing threads
        ``path``'s scaler anywhere."""
        modules = self.index.modules
        for group in self.groups:
            if path not in group.paths:
                continue
            for other in group.paths:
                calls = _amp_calls(modules[other])
                if other != path and calls - {"initialize"} - _CAST_FUNCTION_APIS and "initialize" not in calls:
                    return False
            return True
        return True

    def _built_once(self, path: str, setup: runner_hooks.RunnerSetup) -> bool:
        """Whether the function that builds the setup's runner binds the runner's name only there."""
        tree = _tree(path)
        if tree is None:
            return False
        function = runner_hooks.function_at(tree, setup.function)
        return function is not None and all(
            setup.span[0] <= node.lineno <= setup.span[1]
            for node in ast.walk(function)
            if isinstance(node, ast.Name) and node.id == setup.runner and isinstance(node.ctx, ast.Store)
        )

    def _optimizer_out_of_sight(self, path: str) -> tuple[str, int] | None:
        """The first call that hands what ``path``'s ``amp.initialize`` returned for its optimizer
        to a function imported from outside the project (not torch), with its line; None if none
        does (read only for the rare module whose GradScaler no backward uses)."""
        tree = _tree(path)
        if tree is None:
            return None
        outside = self._imported_from_outside(path, tree)
        for scope in ast.walk(tree):
            if not isinstance(scope, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            handed = _optimizer_names(scope)
            if not handed:
                continue
            for node in own_nodes(scope):
                if not isinstance(node, ast.Call) or node.lineno < handed[1]:
                    continue
                root = node.func
                while isinstance(root, (ast.Attribute, ast.Call)):
                    root = root.value if isinstance(root, ast.Attribute) else root.func
                if not (isinstance(root, ast.Name) and root.id in outside):
                    continue
                arguments = [*node.args, *(keyword.value for keyword in node.keywords)]
                if any(isinstance(name, ast.Name) and name.id in handed[0] for name in _walk_all(arguments)):
                    return ast.unparse(node.func), node.lineno
        return None

    def _imported_from_outside(self, path: str, tree: ast.Module) -> set[str]:
        """The names ``path`` binds by importing them from modules that are not the project's,
        torch's or Apex's (a library: mmcv, transformers)."""
        names = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                module, bound = node.module, [alias.asname or alias.name for alias in node.names]
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if not _inside_torch_or_apex(alias.name) and self.index.resolve(path, alias.name) is None:
                        names.add(alias.asname or alias.name.split(".")[0])
                continue
            else:
                continue
            if _inside_torch_or_apex(module) or self.index.resolve(path, module) is not None:
                continue
            if _beside(os.path.dirname(os.path.abspath(path)), module) is None:
                names.update(name for name in bound if name != "*")
        return names

    def _may_run_together(self, orphan: str, path: str) -> bool:
        """Whether ``orphan`` may reach ``path``'s amp setup at run time: from the same program
        folder, or both imported by one module (a script importing its set-up function and, for
        the registry, the hook module: whai362/PVT detection/train.py, namespace packages apart)."""
        if may_share_a_program(orphan, path):
            return True
        # the script sits in the folder both packages hang from; it uses no amp, so it was not
        # given to the index: read the modules there (only for the rare unused scaler)
        folder = os.path.commonpath([os.path.abspath(orphan), os.path.abspath(path)])
        if folder not in self._importers:
            names = sorted(name for name in _listing(folder) if name.endswith(".py"))
            found: set[frozenset[str]] = set()
            for name in names[:_NEIGHBOURS_READ]:
                other = os.path.join(folder, name)
                found.add(frozenset(target for _, target in self._imports_out_of_index(other, _text(other))))
            self._importers[folder] = found
        return any(orphan in targets and path in targets for targets in self._importers[folder])

    def _imports_out_of_index(self, path: str, text: str) -> list[tuple[ImportEdge, str]]:
        """The indexed modules a module the index does not hold imports (none if it does not parse)."""
        summary = summarize(path, text)
        return [] if summary is None else self.index.imported(summary)

    def _linked_to_training(self, path: str) -> bool:
        """Whether a project module ``path`` imports, or a module beside it that imports it,
        runs a backward (read only for the rare module whose GradScaler no backward uses)."""
        if any(_backpropagates(target) for _, target in self.index.imported(self.index.modules[path])):
            return True
        folder, stem = os.path.split(os.path.abspath(path))
        stem = os.path.splitext(stem)[0]
        imports_it = re.compile(
            rf"^\s*(from\s+\S*\b{re.escape(stem)}\s+import\b|import\s+.*\b{re.escape(stem)}\b)", re.M
        )
        neighbours = sorted(name for name in _listing(folder) if name.endswith(".py"))
        for name in neighbours[:_NEIGHBOURS_READ]:
            other = os.path.join(folder, name)
            if other == os.path.abspath(path):
                continue
            text = _text(other)
            if imports_it.search(text) and _BACKPROPAGATES.search(text):
                return True
        return False

    def _optimizer_to_project(self, path: str) -> tuple[str, int, str] | None:
        """The first call that hands what ``path``'s ``amp.initialize`` returned for its optimizer
        to a function ``path`` imports from a given module that runs a backward: the function, the
        line and the module; None if none does (read only for the rare module whose GradScaler no
        backward uses)."""
        tree = _tree(path)
        if tree is None:
            return None
        trainers = {
            alias: target
            for edge, target in self.index.imported(self.index.modules[path])
            if edge.names and edge.names != ("*",) and _backpropagates(target)
            for alias in edge.aliases
        }
        for scope in ast.walk(tree):
            if not isinstance(scope, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            handed = _optimizer_names(scope)
            if not handed:
                continue
            for node in own_nodes(scope):
                if not (isinstance(node, ast.Call) and node.lineno >= handed[1]):
                    continue
                if not (isinstance(node.func, ast.Name) and node.func.id in trainers):
                    continue
                arguments = [*node.args, *(keyword.value for keyword in node.keywords)]
                if any(isinstance(name, ast.Name) and name.id in handed[0] for name in _walk_all(arguments)):
                    return node.func.id, node.lineno, trainers[node.func.id]
        return None

    def _thread(
        self, number: int, members: list[str], left: list[str], outcome: Mapping[str, Outcome]
    ) -> dict[str, ModuleFacts]:
        """Facts that pass each creating module's GradScaler to the functions that need it; {} if none do.

        Several entry scripts may share one trainer module: each creates its scaler and passes
        it, as long as their scalers behave alike (the receiving code is written once).
        """
        if any(self.facts.get(path, ModuleFacts()).carriers for path in members):
            return {}  # the scaler travels on the object that carried the amp module (``_carriers``)
        creators = [path for path in members if _free_scalers(outcome[path])]
        # a creator may make a scaler in each of several functions (wetectron's train and
        # train_cdb, each calling its own loop of the trainer module): each call passes its own
        if not creators or any(
            len(outcome[path].scalers) != len(_free_scalers(outcome[path])) or path in left for path in creators
        ):
            return {}
        infos = [info for path in creators for info in _free_scalers(outcome[path])]
        if len({(info.static_scale, info.follows, info.held_scale) for info in infos}) != 1:
            return {}
        models = tuple(sorted({name for info in infos for name in info.models}))
        shared = replace(infos[0], function=None, models=models)
        facts: dict[str, ModuleFacts] = {}
        passes: dict[str, set[str]] = {creator: set() for creator in creators}
        for path in left:
            summary = self.index.modules[path]
            # functions, and classes whose constructor can take the scaler and keep it on `self`
            needing = {name for name, function in summary.functions.items() if function.uses_amp}
            needing |= summary.amp_classes
            if summary.amp_at_module_level or not needing:
                return {}
            entries: set[str] = set()
            for creator in creators:
                for alias, origin, origin_name in self._imported_functions(creator):
                    if origin == path and _reaches(summary, origin_name, needing):
                        entries.add(origin_name)
                        passes[creator].add(alias)
            if not entries or self._called_without_scaler(path, entries, set(creators)):
                return {}
            # what uses amp but nothing calls (ClipBERT keeps an older TrainingRestorer beside the
            # one its scripts build) takes the scaler too, or it would keep Apex for no caller
            reached = {name for name in needing if any(_reaches(summary, entry, {name}) for entry in entries)}
            unreached = needing - reached
            entries |= self._unreferenced(path, unreached, creators)
            if unreached - entries:
                self._blocked[number] = (
                    f"{' and '.join(f'`{name}`' for name in sorted(unreached - entries))} of {self.display(path)} "
                    "calls amp, but no module that creates a GradScaler calls it, and other code names it: the "
                    "scaler cannot reach it"
                )
            unseen = self._called_out_of_sight(path, entries, creators)
            if unseen is not None:
                self._blocked[number] = (
                    f"{' and '.join(f'`{name}`' for name in sorted(entries))} would take the GradScaler as a new "
                    f"parameter, but {unseen}, which would then raise TypeError: include that file, or pass it a "
                    "GradScaler there"
                )
                return {}
            facts[path] = replace(
                self.facts.get(path, ModuleFacts()), receives_scaler=tuple(sorted(entries)), shared_scaler=shared
            )
        for creator, aliases in passes.items():
            facts[creator] = replace(self.facts.get(creator, ModuleFacts()), passes_scaler=tuple(sorted(aliases)))
        return facts

    def _called_out_of_sight(self, path: str, entries: set[str], creators: list[str]) -> str | None:
        """Where one of the receiving functions or classes ``entries`` may be called without the
        GradScaler it now takes, said for a finding: a project file the index does not hold (it
        mentions no amp) imports it from ``path``, or a class of any project file derives from it
        (its ``super().__init__(...)`` passes no scaler); None where none is."""
        if not entries:
            return None
        references, _ = self._references(path, entries, creators)
        for reference in references:
            if reference.derives:
                return f"a class of {self.display(reference.path)} derives from it (its `super().__init__(...)` passes none)"
            # an indexed module's calls were read (_called_without_scaler); `train` is a common word
            if not reference.indexed and (reference.imports is None or reference.imports):
                return (
                    f"{self.display(reference.path)} (not in this run: it mentions no amp) imports it and calls it "
                    "without one"
                )
        return None

    def _references(self, path: str, names: set[str], creators: list[str]) -> tuple[list[_Reference], bool]:
        """The project files around ``path`` (itself included) that spell one of ``names``, each
        with what it does with them (see ``_Reference``), and whether the project was read whole."""
        spelled = b"|".join(re.escape(name.encode()) for name in sorted(names))
        word = re.compile(rb"\b(?:" + spelled + rb")\b")
        derived = re.compile(rb"^[ \t]*class[ \t]+\w+[ \t]*\([^)]*\b(?:" + spelled + rb")\b", re.M)
        indexed = {os.path.abspath(module): module for module in self.index.modules}
        home = os.path.abspath(path)
        found, read = [], 0
        for other, data in _project_files([path, *creators], set()):
            read += 1
            if not word.search(data):
                continue
            module = indexed.get(other)
            summary = self.index.modules[module] if module is not None else None
            edges = (
                self.index.imported(summary)
                if summary is not None
                else self._imports_out_of_index(other, data.decode("utf-8", "replace"))
            )
            imports: set[str] | None = set()
            for edge, target in edges:
                if os.path.abspath(target) != home or imports is None:
                    continue
                if edge.names:
                    imports = None if "*" in edge.names else imports | (names & set(edge.names))
                else:  # `import module`: the attributes it reads there, or all (the module used as a value)
                    imports = None if edge.attributes is None else imports | (names & set(edge.attributes))
            found.append(_Reference(other, bool(derived.search(data)), module is not None, imports))
        return found, read < _CARRIER_SCAN_FILES

    def _inherit(
        self, number: int, members: list[str], left: list[str], outcome: Mapping[str, Outcome]
    ) -> dict[str, ModuleFacts]:
        """Facts that give each class of ``left`` deriving from a class of another member that keeps
        its GradScaler on ``self`` (``Trainer.train`` calls amp.initialize) that scaler; {} if any
        amp code of ``left`` is elsewhere (modelled on howardhsu/BERT-for-RRC-ABSA's MetaTrainer)."""
        held = {
            (path, info.klass): info
            for path in members
            if path not in left
            for info in outcome[path].scalers
            if info.klass is not None
        }
        if not held:
            return {}
        facts: dict[str, ModuleFacts] = {}
        for path in left:
            summary = self.index.modules[path]
            if (
                summary.amp_at_module_level
                or "initialize" in summary.amp_apis
                or any(function.uses_amp for function in summary.functions.values())
                or not summary.amp_classes
            ):
                return {}
            classes = _class_shapes(path)
            imported = {alias: (origin, name) for alias, origin, name in self._imported_functions(path)}
            inherited = []
            for name in sorted(summary.amp_classes):
                bases, init_calls_super = classes.get(name, ((), False))
                found = [held[imported[base]] for base in bases if imported.get(base) in held]
                if len(found) != 1:
                    return {}
                if not init_calls_super:  # the base's __init__ sets the stand-in scaler
                    self._blocked[number] = (
                        f"{name} in {self.display(path)} would use the GradScaler its base class "
                        f"{found[0].klass} keeps on `self.{found[0].attribute}`, but its __init__ does not call "
                        "`super().__init__(...)`, where the base class sets a stand-in until its amp set-up runs"
                    )
                    return {}
                inherited.append((name, found[0]))
            facts[path] = replace(self.facts.get(path, ModuleFacts()), inherited_scalers=tuple(inherited))
        return facts

    def _unreferenced(self, path: str, names: set[str], creators: list[str]) -> set[str]:
        """Those of the functions and classes ``names`` of ``path`` that no code of the project
        names: not ``path``'s own (its definition apart), nor a module importing them from it, nor
        a class deriving from them; none when the project is too large to read whole."""
        if not names:
            return set()
        tree = _tree(path)
        if tree is None:
            return set()
        named = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
        named |= {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
        left = names - named
        if not left:
            return set()
        references, whole = self._references(path, left, creators)
        if not whole:
            return set()
        for reference in references:
            if reference.path == os.path.abspath(path):
                continue  # its own code was read above (a subclass there names its base)
            if reference.derives or reference.imports is None:
                return set()  # a subclass, a star import, the module used as a value
            left -= reference.imports
        return left

    def _hand_off(
        self, number: int, members: list[str], left: list[str], outcome: Mapping[str, Outcome]
    ) -> dict[str, ModuleFacts]:
        """Facts that move a factory's amp.initialize to the modules that call it; {} if they cannot.

        ``setup(...)`` in ``utils.py`` calls amp.initialize and returns the model and optimizer
        to trainers in other modules, which scale their losses with amp: each caller gets the
        GradScaler where the call returns (``migrate.factories``), and the factory loses its
        call. Every use of the factory in the project must be a call the rules can follow:
        in a given module, or, in one out of the run, an inference call (no optimizer).
        """
        creators = [path for path in members if _free_scalers(outcome[path])]
        if len(creators) != 1 or creators[0] in left or len(outcome[creators[0]].scalers) != 1:
            return {}
        creator = creators[0]
        function = outcome[creator].scalers[0].function
        summary = self.index.modules[creator]
        if function is None or function in summary.calls_outside_functions:
            return {}
        if any(function in f.calls for f in summary.functions.values()):
            return {}
        callers: dict[str, str] = {}
        for path in self.index.modules:
            for alias, origin, name in self._imported_functions(path) if path != creator else ():
                if origin == creator and name == function and callers.setdefault(path, alias) != alias:
                    return {}
        if not callers or any(path not in outcome for path in callers):
            return {}
        returned_to = (
            f"`{function}` of {self.display(creator)} sets up amp and returns the model and optimizer to "
            f"{' and '.join(self.display(path) for path in sorted(callers))}"
        )
        setup = factories.read_factory(_text(creator), function, function)
        if setup is None:
            self._blocked.setdefault(
                number,
                f"{returned_to}, but a caller can take over only a function with one amp.initialize that sets up "
                "training, reached through `if` tests of its parameters alone, whose model and optimizer every "
                f"`return` hands back: create the GradScaler in `{function}`, return it with them and use it where "
                "the losses are scaled, then run ampmigrate again",
            )
            return {}
        if set(left) - set(callers):
            self._blocked.setdefault(
                number,
                f"{returned_to}, while {' and '.join(self.display(path) for path in sorted(set(left) - set(callers)))} "
                f"scales the losses without calling `{function}`: a setup a caller takes over is not passed on "
                "further (pass the GradScaler on by hand, then run ampmigrate again)",
            )
            return {}
        word = re.compile(rf"\b{re.escape(function)}\b".encode())
        inference = []
        for path, data in _project_files([creator, *callers], {creator, *callers}):
            if word.search(data):
                lines = factories.inference_calls(data.decode("utf-8", "replace"), setup, function)
                if lines is None:
                    self._blocked[number] = (
                        f"{self.display(path)} also uses `{function}` (which sets up amp and returns the model and "
                        "optimizer) and is not migrated with it: it may train with what it returns, whose forward "
                        "pass Apex O1 ran in float16 (include that file, or move its amp setup where it trains)"
                    )
                    return {}
                inference += [f"{self.display(path)}:{line}" for line in lines]
        facts = {
            path: replace(self.facts.get(path, ModuleFacts()), factory_setups=(replace(setup, name=alias),))
            for path, alias in callers.items()
        }
        handed = ((function, ", ".join(inference)),)
        facts[creator] = replace(self.facts.get(creator, ModuleFacts()), hands_off=handed)
        return facts

    def _imported_functions(self, path: str) -> Iterator[tuple[str, str, str]]:
        """(how ``path`` calls it, defining module, name there) for each project function it imports
        (and each class whose code calls amp: calling it constructs one)."""
        for edge in self.index.modules[path].imports:
            target = self.index.resolve(path, edge.module)
            if target is None:
                continue
            if not edge.names:
                imported = self.index.modules[target]
                for name in [*imported.functions, *sorted(imported.amp_classes)]:
                    yield f"{edge.aliases[0]}.{name}", target, name
                continue
            for name, alias in zip(edge.names, edge.aliases):
                origin = self._origin(target, name)
                if origin is not None:
                    yield alias, origin[0], origin[1]

    def _origin(self, path: str, name: str, depth: int = 0) -> tuple[str, str] | None:
        """Where the function (or amp-calling class) ``name`` imported from ``path`` is defined
        (following re-exports)."""
        summary = self.index.modules[path]
        if name in summary.functions or name in summary.amp_classes:
            return path, name
        if depth > 3:
            return None
        for edge in summary.imports:
            if name in edge.aliases and edge.names:
                target = self.index.resolve(path, edge.module)
                if target is not None:
                    return self._origin(target, edge.names[edge.aliases.index(name)], depth + 1)
        return None

    def _called_without_scaler(self, path: str, entries: set[str], creators: set[str]) -> bool:
        """Whether code other than the creators' calls a receiving function (it could not pass the scaler)."""
        summary = self.index.modules[path]
        if entries & summary.calls_outside_functions:
            return True
        if any(entries & function.calls for name, function in summary.functions.items() if name not in entries):
            return True
        for other, other_summary in self.index.modules.items():
            if other == path or other in creators:
                continue
            called = other_summary.calls_outside_functions.union(*(f.calls for f in other_summary.functions.values()))
            for alias, origin, name in self._imported_functions(other):
                # a package __init__ that only re-exports the function does not call it
                if origin == path and name in entries and ("." in alias or alias in called):
                    return True
        return False

    def _gets_amp_from(self, importer: str, exporter: str) -> bool:
        return any(target == exporter for _, target in self.index.imported(self.index.modules[importer]))


# how many Python files of a project are read for other modules that use a carrier of the amp module
_CARRIER_SCAN_FILES = 5000
# an amp call other than amp.initialize (the module object, or the attribute carrying it), and amp.initialize
_AMP_USE = re.compile(rb"\bamp\s*\.\s*(?:scale_loss|master_params|state_dict|load_state_dict)\s*\(")
_AMP_INITIALIZE = re.compile(rb"\bamp\s*\.\s*initialize\s*\(")
# `copy.deepcopy(model)`, `torch.save(model, ...)`: the instance attribute `model.forward` the
# migration sets would not follow the copy
_COPIES_THE_MODEL = re.compile(r"\b(deepcopy|torch\.save|pickle\.dumps?)\(\s*(self\.|runner\.)?model\b")
_IMPORTS_BY_NAME = re.compile(r"\b(import_module|__import__|import_modules_from_strings)\s*\(")
_IMPORTS_APEX = re.compile(r"^\s*(import\s+apex\b|from\s+apex\b)", re.M)
# Apex's packages that cannot hand a module amp: `from apex.normalization import FusedLayerNorm`
# binds no `apex` name (unlike `import apex.normalization`), and none of them imports amp's API
_AMP_FREE_APEX = re.compile(
    r"^\s*from\s+apex\.(normalization|optimizers|parallel|contrib|mlp|fused_dense|multi_tensor_apply)\b", re.M
)


def _may_reach_amp(text: str) -> bool:
    """Whether a module's text imports Apex in a way that can reach amp: any Apex import but
    ``from apex.<package> import ...`` of the packages in ``_AMP_FREE_APEX`` (VDIGPKU/CBNetV2's
    EVA backbones import only ``FusedLayerNorm``, in a try/except, and cannot run amp)."""
    return any(not _AMP_FREE_APEX.match(text, match.start()) for match in _IMPORTS_APEX.finditer(text))


def _carrier_users_outside(paths: list[str], attributes: set[str], given: set[str]) -> str | None:
    """A Python file of the project around ``paths`` that was not given and stores the amp module
    in one of ``attributes`` or calls amp through it: migrating the given ones alone would hand it
    a GradScaler where it expects the amp module (or the reverse). None when there is none."""
    names = "|".join(re.escape(attribute) for attribute in sorted(attributes))
    pattern = re.compile(rf"\.(?:{names})\s*(?:=\s*amp\b|\.\s*(?:scale_loss|master_params|state_dict)\b)".encode())
    # ... and imports one of them (a script with a setup of its own, sharing nothing, does not count)
    stems = {
        os.path.basename(os.path.dirname(p)) if p.endswith("__init__.py") else os.path.basename(p)[:-3] for p in paths
    }
    modules = "|".join(re.escape(stem) for stem in sorted(stems))
    imports = re.compile(
        rf"^[ \t]*(?:from[ \t]+\S*\b(?:{modules})[ \t]+import\b|import[ \t]+.*\b(?:{modules})\b)".encode(), re.M
    )
    for path, data in _project_files(paths, given):
        if (b"apex" in data or b"scale_loss" in data) and pattern.search(data) and imports.search(data):
            return path
    return None


def _amp_calls(summary: ModuleSummary) -> set[str]:
    """The amp functions a module calls: on an Apex binding, and through the amp module kept on an
    object or passed in (``self.amp.scale_loss(...)``, ``amp.state_dict()`` on a parameter)."""
    return summary.amp_apis | {use.api for use in (*summary.unbound_uses, *summary.parameter_uses)}


def _spelling(files: list[tuple[str, bytes]], word: str) -> list[tuple[str, ast.Module]] | None:
    """(path, tree) of each of ``files`` that spells ``word``; None where one of them does not parse
    (its calls cannot be read)."""
    pattern = re.compile(rb"\b" + re.escape(word.encode()) + rb"\b")
    found = []
    for path, data in files:
        if pattern.search(data):
            try:
                found.append((os.path.abspath(path), ast.parse(data)))
            except (SyntaxError, ValueError):
                return None
    return found


def _project_files(paths: list[str], skipped: set[str], unread: Collection[str] = ()) -> Iterator[tuple[str, bytes]]:
    """The Python files of the project around ``paths`` (but ``skipped``, and those of the folders
    ``unread``), with their bytes; at most ``_CARRIER_SCAN_FILES`` of them."""
    folders = [os.path.dirname(os.path.abspath(path)) for path in paths]
    common = os.path.commonpath(folders)
    root = project_root(paths[0])
    if (
        os.path.commonpath([root, common]) != root
        or len(os.path.relpath(common, root).split(os.sep)) > 3
        or os.path.dirname(root) == root
    ):
        root = common  # no project marker near (or none above them at all): the folder the modules share
    if os.path.dirname(root) == root:
        return
    found = (path for path in _python_files(root, unread=unread) if path not in skipped)
    for path in itertools.islice(found, _CARRIER_SCAN_FILES):
        try:
            with open(path, "rb") as handle:
                data = handle.read()
        except OSError:
            continue
        yield path, data


def _python_files(root: str, *, also_skipped: Collection[str] = (), unread: Collection[str] = ()) -> Iterator[str]:
    """The Python files under ``root``, in a stable order, outside hidden and ``_SKIPPED_FOLDERS``
    folders (and ``also_skipped`` ones), and but the files right in the folders ``unread``. Each
    folder and file it yields is noted as read: a new module there changes what a search finds."""
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = sorted(
            name
            for name in subfolders
            if not name.startswith(".") and name not in _SKIPPED_FOLDERS and name not in also_skipped
        )
        if folder in unread:
            continue
        _reads.add(folder)
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                _reads.add(path)
                yield path


# A backward, or an optimizer step whose backward runs out of sight (a trainer subclass that
# inherits transformers' training_step, which scales the loss with Apex amp itself).
_BACKWARD = re.compile(r"\.(backward|step)\s*\(")


def _trains(path: str) -> bool:
    """Whether the module's text calls ``.backward(`` or ``.step(`` (read again only for the rare
    module whose GradScaler no backward uses; a fragment without either is migrated as before)."""
    return _BACKWARD.search(_text(path)) is not None


# The files and folders the plan read beyond the modules it summarized (see ProjectPlan.reads):
# a cached plan holds only while they are as they were.
_reads: set[str] = set()


def _calls_of(pattern: re.Pattern[str], text: str) -> list[int]:
    """Where ``pattern`` (a name and its opening parenthesis) matches ``text`` other than in the
    line that defines the name (``def build_runner(``, ``class Hook(Base):``)."""
    found = []
    for match in pattern.finditer(text):
        line_start = text.rfind("\n", 0, match.start()) + 1
        if not re.fullmatch(r"\s*(def|class)\s+", text[line_start : match.start()]):
            found.append(match.start())
    return found


def _module_stem(path: str) -> str:
    """The last name of the module at ``path`` (its package's, for an ``__init__.py``)."""
    name = os.path.basename(path)[:-3]
    return os.path.basename(os.path.dirname(os.path.abspath(path))) if name == "__init__" else name


def _import_root(path: str) -> str:
    """The folder ``path``'s absolute imports start from: the first above its package chain."""
    folder = os.path.dirname(os.path.abspath(path))
    while os.path.exists(os.path.join(folder, "__init__.py")) and os.path.dirname(folder) != folder:
        folder = os.path.dirname(folder)
    return folder


def _loss_scale_parameters(tree: ast.Module) -> list[tuple[str, str]]:
    """(function, parameter) for each top-level function whose ``X.initialize(..., loss_scale=P)``
    passes its parameter ``P`` (with a default) as the loss scale."""
    found = []
    for statement in tree.body:
        if not isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        arguments = statement.args
        positional = [a.arg for a in [*arguments.posonlyargs, *arguments.args]]
        with_default = set(positional[len(positional) - len(arguments.defaults) :]) | {
            a.arg for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults) if d is not None
        }
        for node in own_nodes(statement):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "initialize":
                for keyword in node.keywords:
                    if keyword.arg == "loss_scale" and isinstance(keyword.value, ast.Name):
                        if keyword.value.id in with_default and (statement.name, keyword.value.id) not in found:
                            found.append((statement.name, keyword.value.id))
    return found


def _tree(path: str) -> ast.Module | None:
    """The syntax tree of the module at ``path``; None if it does not parse (or cannot be read)."""
    try:
        return ast.parse(_text(path))
    except (SyntaxError, ValueError):
        return None


def _listing(folder: str) -> list[str]:
    """The names in ``folder`` (none if it cannot be listed), noted as read."""
    _reads.add(folder)
    try:
        return os.listdir(folder)
    except OSError:
        return []


def _text(path: str) -> str:
    """The module's text as far as it decodes ("" when it cannot be read)."""
    _reads.add(path)
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return ""


# how many modules beside an unused scaler's module are read for one that imports it and trains
_NEIGHBOURS_READ = 200
# how many files of a runner setup's program are read for other runners that could reach its hooks
_RUNNER_FILES_READ = 5000
# folders no project search enters (besides hidden ones): caches, build outputs, installed packages
_SKIPPED_FOLDERS = frozenset({"__pycache__", "build", "dist", "node_modules", "venv", "site-packages"})
_BACKPROPAGATES = re.compile(r"\.backward\s*\(")


def _backpropagates(path: str) -> bool:
    """Whether the module's text calls ``.backward(``."""
    return _BACKPROPAGATES.search(_text(path)) is not None


def _inside_torch_or_apex(module: str) -> bool:
    return module.split(".")[0] in ("torch", "apex", "torchvision")


def _optimizer_names(scope: ast.Module | ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[set[str], int] | None:
    """The names that hold the optimizer an ``<amp>.initialize(model, optimizer, ...)`` of
    ``scope`` (itself, not a nested function) was given and returned, with the call's line."""
    for node in own_nodes(scope):
        if not (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Attribute)
            and node.value.func.attr == "initialize"
            and says_amp(ast.unparse(node.value.func.value))
        ):
            continue
        call = node.value
        given = call.args[1] if len(call.args) > 1 else None
        given = next((keyword.value for keyword in call.keywords if keyword.arg == "optimizers"), given)
        if given is None or (isinstance(given, ast.Constant) and given.value is None):
            continue
        names = {name.id for name in _walk_all([given]) if isinstance(name, ast.Name)}
        for target in node.targets:
            if isinstance(target, (ast.Tuple, ast.List)) and len(target.elts) == 2:
                names.update(name.id for name in _walk_all([target.elts[1]]) if isinstance(name, ast.Name))
        return names, node.lineno
    return None


def _walk_all(nodes: Iterable[ast.AST]) -> Iterator[ast.AST]:
    for node in nodes:
        yield from ast.walk(node)


def _class_shapes(path: str) -> dict[str, tuple[tuple[str, ...], bool]]:
    """For each top-level class of ``path``: the names of its plain bases, and whether its
    ``__init__`` (if it has one) calls ``super().__init__(...)``."""
    tree = _tree(path)
    if tree is None:
        return {}
    shapes = {}
    for statement in tree.body:
        if not isinstance(statement, ast.ClassDef):
            continue
        bases = tuple(base.id for base in statement.bases if isinstance(base, ast.Name))
        init = next((s for s in statement.body if isinstance(s, ast.FunctionDef) and s.name == "__init__"), None)
        calls_super = init is None or any(
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "__init__"
            and isinstance(node.func.value, ast.Call)
            and isinstance(node.func.value.func, ast.Name)
            and node.func.value.func.id == "super"
            for node in ast.walk(init)
        )
        shapes[statement.name] = (bases, calls_super)
    return shapes


def _initialized_in_function(path: str) -> str | None:
    """The function (or method) of ``path`` that calls ``<amp>.initialize(...)``, if the call is
    in one (read again only for the rare module whose GradScaler no backward uses); None for a
    module-level call, which a fragment makes and is migrated as before."""
    tree = _tree(path)
    if tree is None:
        return None
    for node in ast.walk(tree):  # breadth first: the outermost function comes first
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute)
            and call.func.attr == "initialize"
            and says_amp(ast.unparse(call.func.value))
            for call in ast.walk(node)
        ):
            return node.name
    return None


def _beside(folder: str, module: str) -> str | None:
    """The file ``import module`` finds in ``folder`` itself (a module or a package), if any;
    the places looked at are noted as read, there or not (a file added there changes the plan)."""
    found, looked_at = _find_beside(folder, module)
    _reads.update(looked_at)
    return found


@functools.lru_cache(maxsize=16384)
def _find_beside(folder: str, module: str) -> tuple[str | None, tuple[str, str]]:
    base = os.path.join(folder, *module.split("."))
    looked_at = (base + ".py", os.path.join(base, "__init__.py"))
    return next((path for path in looked_at if os.path.isfile(path)), None), looked_at


def _module_files(importer: str, module: str) -> tuple[str, ...]:
    """Where ``import module`` could find a project file: from the importer's folder (a
    script's own folder is on ``sys.path``) or from one of the folders above it (a package
    root); for relative imports ``module`` is already the absolute path of folders."""
    return _module_files_from(os.path.dirname(os.path.abspath(importer)), module)


@functools.lru_cache(maxsize=16384)
def _module_files_from(folder: str, module: str) -> tuple[str, ...]:
    # the modules of one folder import the same names: computed once per folder and name
    parts = module.split(".")
    found = []
    for _level in range(3):
        base = os.path.join(folder, *parts)
        found += [base + ".py", os.path.join(base, "__init__.py")]
        folder = os.path.dirname(folder)
    if os.path.isabs(os.sep + os.path.join(*parts)):  # relative import, resolved to folders
        base = os.sep + os.path.join(*parts)
        found += [base + ".py", os.path.join(base, "__init__.py")]
    return tuple(found)
