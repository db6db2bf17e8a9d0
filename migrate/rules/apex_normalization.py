"""apex_normalization: ``apex.normalization.FusedLayerNorm`` and ``FusedRMSNorm``.

What it rewrites
    ``FusedLayerNorm`` becomes ``torch.nn.LayerNorm`` and ``FusedRMSNorm`` becomes
    ``torch.nn.RMSNorm``, with ``eps=1e-5`` written out for RMSNorm (torch's default is the
    float32 machine epsilon, Apex's 1e-5). ``memory_efficient`` goes: it only trades memory
    for recomputation. Parameter names (``weight``, ``bias``) match, so checkpoints load.

    ``MixedFusedLayerNorm`` / ``MixedFusedRMSNorm`` become ``torch.nn.LayerNorm`` /
    ``torch.nn.RMSNorm`` too (eps written out for RMSNorm); their output followed the
    parameters' dtype, torch's follows the input's, and the note gives the cast that restores
    Apex's dtype where the two differ.

    Every use of one imported class moves together or none does (a torch layer built here
    and an ``isinstance`` check still testing for the Apex class would silently stop
    matching): calls, ``isinstance``/``issubclass`` checks, a class deriving from it (no
    ``memory_efficient``, and called with arguments torch takes), and for FusedLayerNorm a
    use as a value (torch's LayerNorm takes the same arguments and defaults). Code in the
    ``except ImportError`` clause of the optional import (BERT's fallback ``class
    BertLayerNorm``) only ran without Apex, and goes with the ``try`` (amp_import rule).

    A FusedLayerNorm imported under a name of the project's own (``FusedLayerNorm as
    BertLayerNorm``, which other modules import in turn), or one other modules may reach
    (project facts, ``__all__``; see ``_exports``), keeps its name: the import becomes
    ``from torch.nn import LayerNorm as BertLayerNorm`` and its uses stay as written (a
    ``memory_efficient`` argument goes). That is what ran where Apex was installed: the
    same defaults (eps 1e-5, affine), the same parameter names, so state_dict keys match.
    The fallback class is not kept: it is what ran without Apex (often eps 1e-12 by
    default, an attribute named ``variance_epsilon``), not what ran with it.

Before::

    import torch
    from apex.normalization import FusedLayerNorm


    class Block(torch.nn.Module):
        def __init__(self, hidden_size):
            super().__init__()
            self.norm = FusedLayerNorm(hidden_size, eps=1e-12)

After::

    import torch


    class Block(torch.nn.Module):
        def __init__(self, hidden_size):
            super().__init__()
            self.norm = torch.nn.LayerNorm(hidden_size, eps=1e-12)

Not rewritten (reported instead, AMP042, with the code to write)
    ``elementwise_affine=False`` on a Mixed* layer (Apex raised) and unknown keywords;
    FusedRMSNorm and the Mixed* layers used as values or subclassed (called the same way,
    torch's differ); an ``isinstance`` check on the Apex class in a module that also uses
    torch's class (the check would start matching those layers). One such use keeps every
    use of that import as it was.

Safety
    Under autocast Apex's fused layer norm returned float16; torch's LayerNorm runs in
    float32 there (AMP041). ``torch.nn.RMSNorm`` needs torch 2.4. Outside autocast, a Mixed*
    layer with half parameters returned half for float32 input, torch returns float32.

    ``isinstance(m, torch.nn.LayerNorm)`` (or the kept ``BertLayerNorm`` name) matches every
    torch LayerNorm, where the Apex check matched only the fused layers; the converse holds
    for a check on ``nn.LayerNorm`` elsewhere, which now matches the migrated layers. Within
    the module this is checked (above); for layers and checks in other modules the AMP041
    note on each check says so. In BERT-style ``init_weights`` (bias zeroed, weight filled
    with 1) a freshly built affine LayerNorm already holds those values, so the extra match
    changes nothing; a LayerNorm built with ``elementwise_affine=False`` would fail there.
    Calls through a kept name or a value in other modules are not seen: one passing
    ``memory_efficient`` fails (torch has no such keyword), one passing it as a fourth
    positional argument sets torch's ``bias`` instead.

References
    NVIDIA/apex: apex/normalization/fused_layer_norm.py; pytorch/pytorch PR #121364;
    ../shared/apex-semantics.md section 5 (apex.normalization).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import libcst as cst

from migrate.rules import _syntax as syntax
from migrate.rules._apex_classes import Replacement, _matches, _rewrite, class_check
from migrate.rules._bindings import Binding, is_import_fallback
from migrate.rules._context import ModuleContext
from migrate.rules._exports import reached_from_outside

RULE = "apex_normalization"

_PARAMETERS = ("normalized_shape", "eps", "elementwise_affine", "memory_efficient")
# Apex's Mixed* layers: (normalized_shape, eps=1e-5, *, memory_efficient=False, **kwargs)
_MIXED_PARAMETERS = ("normalized_shape", "eps", "memory_efficient", "elementwise_affine")
_MIXED_NOTE = (
    "its output follows the input's dtype where Apex's followed the parameters': with float32 input and "
    "half parameters write `norm(x).to(norm.weight.dtype)`; under autocast it is float32 where Apex's was float16"
)


def _eps_note(values: dict[str, object]) -> str:
    if "eps" in values:
        return "eps kept as written"
    return "eps=1e-5 is written out (Apex's default; torch's is the float32 machine epsilon)"


_MIXED_ADVICE = {
    "elementwise_affine": "Apex raised for it (Mixed* layers always have parameters): use the plain "
    "`torch.nn.LayerNorm(normalized_shape, eps=eps, elementwise_affine=False)` (RMSNorm likewise)"
}

REPLACEMENTS = (
    Replacement(
        apex_name="FusedLayerNorm",
        modules=("apex.normalization",),
        parameters=_PARAMETERS,
        target="torch.nn.LayerNorm",
        positional=3,
        dropped=frozenset({"memory_efficient"}),
        note="under autocast its output is float32 where Apex's was float16",
    ),
    Replacement(
        apex_name="FusedRMSNorm",
        modules=("apex.normalization",),
        parameters=_PARAMETERS,
        target="torch.nn.RMSNorm",
        positional=3,
        dropped=frozenset({"memory_efficient"}),
        added=lambda values: {"eps": "1e-5"},
        note=lambda values: _eps_note(values),
    ),
    Replacement(
        apex_name="MixedFusedLayerNorm",
        modules=("apex.normalization",),
        parameters=_MIXED_PARAMETERS,
        target="torch.nn.LayerNorm",
        positional=2,
        dropped=frozenset({"memory_efficient"}),
        required={"elementwise_affine": True},
        note=_MIXED_NOTE,
        advice=_MIXED_ADVICE,
    ),
    Replacement(
        apex_name="MixedFusedRMSNorm",
        modules=("apex.normalization",),
        parameters=_MIXED_PARAMETERS,
        target="torch.nn.RMSNorm",
        positional=2,
        dropped=frozenset({"memory_efficient"}),
        required={"elementwise_affine": True},
        added=lambda values: {"eps": "1e-5"},
        note=lambda values: f"{_eps_note(values)}; {_MIXED_NOTE}",
        advice=_MIXED_ADVICE,
    ),
)


_LAYER_NORM = REPLACEMENTS[0]
_RMS_EPS = "torch's default eps is the float32 machine epsilon, Apex's 1e-5"
_VALUE_DIFFERENCE = {
    "FusedRMSNorm": _RMS_EPS,
    "MixedFusedLayerNorm": "its output follows the input's dtype, Apex's the parameters'",
    "MixedFusedRMSNorm": f"{_RMS_EPS}; its output follows the input's dtype, Apex's the parameters'",
}
_AUTOCAST_NOTE = "under autocast its output is float32 where Apex's was float16"


def _replacement(path: str) -> Replacement | None:
    return next((r for r in REPLACEMENTS if _matches(path, r)), None)


def _direct(ctx: ModuleContext) -> dict[int, tuple[Binding, str]]:
    """Imports that bind an Apex norm class itself (``from apex.normalization import
    FusedLayerNorm as X``): alias id -> (binding, the name bound)."""
    found: dict[int, tuple[Binding, str]] = {}
    for scope_imports in ctx.imports.values():
        for bound, bindings in scope_imports.items():
            for binding in bindings:
                if binding.kind == "other_apex" and _replacement(binding.target) is not None:
                    found[id(binding.alias)] = (binding, bound)
    return found


def _keeps_name(ctx: ModuleContext, binding: Binding, bound: str, used: bool) -> bool:
    """Whether ``FusedLayerNorm`` imported under ``bound`` becomes ``from torch.nn import
    LayerNorm as <bound>`` (its uses left as they are) rather than each use rewritten.

    Only FusedLayerNorm: torch.nn.LayerNorm has its defaults (eps=1e-5, affine), so a call
    through the name needs no change. Where the project gave the class a name of its own
    (``as BertLayerNorm``, which other modules often import) or the name may be reached from
    outside the module, the name stays; a plain ``FusedLayerNorm`` only used here does not.
    """
    if _replacement(binding.target) is not _LAYER_NORM:
        return False
    statement = binding.statement
    if not isinstance(statement, cst.ImportFrom) or isinstance(statement.names, cst.ImportStar):
        return False
    if len(statement.names) != 1:
        return False  # the apex import line cannot become a torch one for one of its names
    line = ctx.statement_of(statement)
    block = ctx.parent(line)
    owner = ctx.parent(block) if isinstance(block, cst.IndentedBlock) else None
    if ctx.skipped(line) or (isinstance(owner, cst.Try) and ctx.skipped(owner)):
        return False  # `# ampmigrate: skip` keeps the import as it was
    scope = next((s for s, names in ctx.imports.items() if binding in names.get(bound, ())), ctx.module)
    if reached_from_outside(ctx, scope, bound) is not None:
        return True
    return used and bound != "FusedLayerNorm"


def rebound_names(ctx: ModuleContext) -> dict[int, str]:
    """Imports of FusedLayerNorm whose name stays, bound to ``torch.nn.LayerNorm``: alias id
    -> the torch class (the amp_import rule rewrites the import once every use is settled)."""
    references = _references(ctx)
    return {
        key: _LAYER_NORM.target  # type: ignore[misc]
        for key, (binding, bound) in _direct(ctx).items()
        if _keeps_name(ctx, binding, bound, bool(references.get(key)))
    }


def _references(ctx: ModuleContext) -> dict[int, list[cst.Name]]:
    """Names that refer to a direct import of an Apex norm class, by alias id."""
    direct = _direct(ctx)
    found: dict[int, list[cst.Name]] = {}
    if not direct:
        return found
    for name in ctx.nodes_of(cst.Name):
        binding = ctx.resolve(name.value, name)
        if binding is None or id(binding.alias) not in direct:
            continue
        parent = ctx.parent(name)
        if not isinstance(parent, (cst.ImportAlias, cst.AsName)) and not (
            isinstance(parent, cst.Attribute) and parent.attr is name
        ):
            found.setdefault(id(binding.alias), []).append(name)
    return found


@dataclass
class _Group:
    """The uses of one Apex norm class through one import: migrated together or not at all."""

    replacement: Replacement
    path: str
    root: Binding
    keeps_name: bool = False
    uses: list[tuple[cst.BaseExpression, cst.Name]] = field(default_factory=list)


def _groups(ctx: ModuleContext) -> list[_Group]:
    """Every expression that denotes an Apex norm class (``FusedLayerNorm``, ``BertLayerNorm``
    bound by ``import ... as``, ``apex.normalization.FusedLayerNorm``), grouped by import."""
    groups: dict[tuple[int, str], _Group] = {}
    direct = _direct(ctx)
    references = _references(ctx)
    for name in ctx.reference_names():
        binding = ctx.resolve(name.value, name)
        if binding is None or binding.kind not in ("apex", "other_apex"):
            continue
        if any(isinstance(a, (cst.Import, cst.ImportFrom)) for a in ctx.ancestors(name)):
            continue
        node: cst.BaseExpression = name
        while True:
            found = ctx.apex_path(node)
            replacement = _replacement(found[0]) if found is not None else None
            if found is not None and replacement is not None:
                key = (id(binding.alias), replacement.apex_name)
                group = groups.get(key)
                if group is None:
                    keeps = False
                    if id(binding.alias) in direct:
                        bound = direct[id(binding.alias)][1]
                        keeps = _keeps_name(ctx, binding, bound, bool(references.get(id(binding.alias))))
                    group = groups[key] = _Group(replacement, found[0], binding, keeps)
                group.uses.append((node, name))
                break
            above = ctx.parent(node)
            if not (isinstance(above, cst.Attribute) and above.value is node):
                break
            node = above
    return list(groups.values())


def _class_check(ctx: ModuleContext, node: cst.CSTNode) -> cst.BaseExpression | None:
    """The ``isinstance(x, C)`` / ``isinstance(x, (A, C))`` call ``node`` is the class of, or
    the comparison it is compared in (``type(x) is C``)."""
    parent = ctx.parent(node)
    if isinstance(parent, cst.ComparisonTarget):
        parent = ctx.parent(parent)
    if isinstance(parent, cst.Comparison):
        return parent
    return class_check(ctx, node)  # type: ignore[arg-type]  # a Name or Attribute


def _in_fallback(ctx: ModuleContext, node: cst.CSTNode, binding: Binding) -> bool:
    """``node`` lies in an ``except`` clause of the ``try`` that holds the import: the code
    that stood in for Apex where it was missing (``class BertLayerNorm(nn.Module)``)."""
    line = ctx.statement_of(binding.statement)
    block = ctx.parent(line)
    owner = ctx.parent(block) if isinstance(block, cst.IndentedBlock) else None
    if not isinstance(owner, cst.Try) or owner.body is not block:
        return False
    return any(isinstance(a, cst.ExceptHandler) and ctx.parent(a) is owner for a in ctx.ancestors(node)) or (
        isinstance(node, cst.Name) and is_import_fallback(ctx, node)
    )


def _torch_layers(ctx: ModuleContext, torch_class: str) -> list[cst.CSTNode]:
    """Uses of the torch class itself in the module (``nn.LayerNorm``, ``torch.nn.LayerNorm``,
    a ``LayerNorm`` imported from torch.nn)."""
    short = torch_class.rpartition(".")[2]
    found: list[cst.CSTNode] = []
    from_torch = {
        (alias.evaluated_alias or alias.evaluated_name)
        for statement in ctx.nodes_of(cst.ImportFrom)
        if statement.module is not None
        and syntax.code(statement.module).strip() in ("torch.nn", "torch.nn.modules.normalization")
        and not isinstance(statement.names, cst.ImportStar)
        for alias in statement.names
        if alias.evaluated_name == short
    }
    for name in ctx.nodes_of(cst.Name):
        parent = ctx.parent(name)
        if isinstance(parent, cst.Attribute) and parent.attr is name:
            spelled = syntax.code(parent).strip()
            if spelled in (torch_class, f"nn.{short}", f"torch.nn.modules.normalization.{short}"):
                found.append(parent)
        elif name.value in from_torch and not isinstance(parent, (cst.ImportAlias, cst.AsName)):
            found.append(name)
    return found


def _subclass_problem(ctx: ModuleContext, base: cst.CSTNode, definition: cst.ClassDef, group: _Group) -> str | None:
    """Why a class deriving from the Apex one cannot derive from the torch one instead."""
    if group.replacement is not _LAYER_NORM:
        return (
            f"`class {definition.name.value}({syntax.code(base).strip()})` would get torch's defaults: write its "
            f"`__init__` with `super().__init__(normalized_shape, eps=1e-5)` and base it on "
            f"`{group.replacement.target}`"
        )
    if any(isinstance(n, cst.Name) and n.value == "memory_efficient" for n in ctx.walk(definition)):
        return f"`class {definition.name.value}` uses memory_efficient, which torch.nn.LayerNorm does not have"
    for call in ctx.nodes_of(cst.Call):
        if isinstance(call.func, cst.Name) and call.func.value == definition.name.value:
            bound = syntax.bind_arguments(call, _LAYER_NORM.parameters)
            if bound is None or "memory_efficient" in bound:
                return (
                    f"`{syntax.code(call).strip()}` on line {ctx.position(call)[0]} passes arguments torch.nn.LayerNorm "
                    "takes otherwise (its fourth parameter is bias): pass normalized_shape, eps and "
                    "elementwise_affine only"
                )
    return None


def _plan_group(ctx: ModuleContext, group: _Group) -> None:
    replacement = group.replacement
    target = replacement.target
    assert isinstance(target, str)
    edits: dict[cst.CSTNode, cst.CSTNode] = {}
    notes: list[tuple[cst.CSTNode, str]] = []
    problems: list[tuple[cst.CSTNode, str]] = []
    checks: list[cst.BaseExpression] = []
    for use, _root in group.uses:
        node: cst.CSTNode = use
        parent = ctx.parent(node)
        check = _class_check(ctx, node)
        if ctx.skipped(node):
            problems.append((node, ""))
        elif isinstance(parent, cst.Call) and parent.func is node:
            result = _rewrite(parent, replacement)
            if isinstance(result, str):
                problems.append((parent, result))
                continue
            bound = syntax.bind_arguments(parent, replacement.parameters) or {}
            if group.keeps_name:
                if any(name in replacement.dropped for name in bound):
                    edits[parent] = result.with_changes(func=parent.func)
                continue
            edits[parent] = result
            note = replacement.note
            if callable(note):
                note = note({name: syntax.literal(arg.value) for name, arg in bound.items()})
            notes.append((parent, f"{group.path} became {target}" + (f": {note}" if note else "")))
        elif _in_fallback(ctx, node, group.root):
            continue  # goes with the `except` clause when the optional import collapses
        elif check is not None:
            checks.append(check)
            if not group.keeps_name:
                edits[node] = syntax.dotted(target)
        elif isinstance(parent, cst.Arg) and isinstance(definition := ctx.parent(parent), cst.ClassDef):
            problem = _subclass_problem(ctx, node, definition, group)
            if problem is not None:
                problems.append((node, problem))
            elif not group.keeps_name:
                edits[node] = syntax.dotted(target)
        elif replacement is _LAYER_NORM:
            if not group.keeps_name:
                edits[node] = syntax.dotted(target)  # a value: torch's class takes the same arguments
                notes.append(
                    (
                        node,
                        f"{group.path} became {target} here, passed on as a value: where it is called, "
                        "memory_efficient must not be passed (a fourth positional argument sets torch's bias)",
                    )
                )
        else:
            problems.append(
                (
                    node,
                    f"{group.path} is used as a value here, and {target} called the same way differs from it "
                    f"({_VALUE_DIFFERENCE[replacement.apex_name]}): pass a function that builds "
                    f"`{target}(normalized_shape, eps=1e-5)` instead",
                )
            )
    torch_layers = _torch_layers(ctx, target)
    for torch_check in (c for c in map(functools.partial(_class_check, ctx), torch_layers) if c is not None):
        tested = (
            syntax.code(torch_check.args[0].value).strip()
            if isinstance(torch_check, cst.Call) and torch_check.args
            else "module"
        )
        problems.append(
            (
                torch_check,
                f"`{syntax.code(torch_check).strip()}` would also match the layers that were "
                f"{replacement.apex_name} once they are {target}, which it did not before: to keep that, give them "
                f"a class of their own, `class {replacement.apex_name}({target}): pass`, and test "
                f"`... and not isinstance({tested}, {replacement.apex_name})` here",
            )
        )
    if checks and torch_layers:
        lines = sorted({ctx.position(n)[0] for n in torch_layers})
        for check in checks:
            problems.append(
                (
                    check,
                    f"`{syntax.code(check).strip()}` would also match the {target} layers this module uses "
                    f"(line {', '.join(map(str, lines))}) once {group.path} becomes {target}, which it did not "
                    f"before: give the layers that were {replacement.apex_name} a class of their own, "
                    f"`class {replacement.apex_name}({target}): pass`, and test for that",
                )
            )
    if problems:
        for where, message in problems:
            if message:
                ctx.report("AMP042", where, message)
        return
    for edited, new in edits.items():
        ctx.plan.substitute(edited, new)
    if edits and not group.keeps_name:
        ctx.plan.needs_torch_import = True
    for _use, root in group.uses:
        ctx.consumed.add(root)
    for noted, message in notes:
        ctx.report("AMP041", noted, message)
    spelled = syntax.code(group.root.alias.asname.name if group.root.alias.asname else group.root.alias.name).strip()
    for check in checks:
        ctx.report(
            "AMP041",
            check,
            f"{group.path} became {target}: the check now also matches {target} layers that were not "
            f"{replacement.apex_name} before; this module builds none, so only layers built elsewhere can differ",
        )
    if group.keeps_name:
        name = target.rpartition(".")[2]
        ctx.report(
            "AMP041",
            group.root.alias,
            f"{group.path} became {target}, imported under the same name (`from torch.nn import {name} as "
            f"{spelled}`): {_AUTOCAST_NOTE}",
        )


def plan(ctx: ModuleContext) -> None:
    reachable = any(
        binding.kind == "apex" or binding.kind == "other_apex" and binding.target.startswith("apex.normalization")
        for scope_imports in ctx.imports.values()
        for bindings in scope_imports.values()
        for binding in bindings
    )
    if not reachable:
        return  # nothing here can name apex.normalization
    for group in _groups(ctx):
        _plan_group(ctx, group)
