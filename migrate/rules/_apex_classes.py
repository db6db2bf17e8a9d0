"""Shared machinery for rules that swap an Apex class or function for its torch twin.

A ``Replacement`` names the Apex object, its parameters in Apex's order, the torch
callable, and how arguments carry over: kept (positional while the two signatures agree,
as keywords after that), dropped (settings without numerical effect), required to have a
given literal value (otherwise the call is left as it was and reported), or added (a
default that differs between the two). The user's own argument nodes are reused, so
comments and layout inside the call survive.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import libcst as cst

from migrate.rules import _syntax as syntax
from migrate.rules._context import ModuleContext


@dataclass(frozen=True)
class Replacement:
    apex_name: str  # e.g. "FusedAdam"
    modules: tuple[str, ...]  # Apex modules it is found in, e.g. ("apex.optimizers",)
    parameters: tuple[str, ...]  # Apex's signature, in order
    # torch callable, or chosen from the literal arguments (values) and their code (codes)
    target: str | Callable[[dict[str, object], dict[str, str]], str]
    positional: int  # how many leading parameters keep their position in torch's signature
    dropped: frozenset[str] = frozenset()
    # parameter -> the value (or tuple of values; ``...`` for one chosen at run time) we can map;
    # others are reported
    required: dict[str, object] = field(default_factory=dict)
    added: Callable[[dict[str, object]], dict[str, str]] = lambda values: {}
    renamed: dict[str, str] = field(default_factory=dict)
    note: str | Callable[[dict[str, object]], str] = ""
    # parameter (required, or unknown to this Apex signature) -> the code to write instead
    advice: dict[str, str] = field(default_factory=dict)


def _matches(path: str, replacement: Replacement) -> bool:
    module, _, name = path.rpartition(".")
    return name == replacement.apex_name and any(
        module == prefix or module.startswith(prefix + ".") for prefix in replacement.modules
    )


def _rewrite(call: cst.Call, replacement: Replacement) -> cst.Call | str:
    """The torch call, or the reason it cannot be written."""
    bound = syntax.bind_arguments(call, replacement.parameters)
    target = replacement.target if isinstance(replacement.target, str) else None
    if bound is None:
        unknown = [a.keyword.value for a in call.args if a.keyword and a.keyword.value not in replacement.parameters]
        if not unknown:
            return (
                f"{replacement.apex_name} is called with *args/**kwargs (or too many positional arguments): "
                f"spell its arguments out: `{replacement.apex_name}({', '.join(replacement.parameters)})`"
            )
        hints = [replacement.advice.get(name, f"remove `{name}=...` (not an Apex argument)") for name in unknown]
        return f"{replacement.apex_name} has no parameter {', '.join(unknown)}: {'; '.join(hints)}"
    values = {name: syntax.literal(arg.value) for name, arg in bound.items()}
    codes = {name: syntax.code(arg.value).strip() for name, arg in bound.items()}
    for name, wanted in replacement.required.items():
        allowed = wanted if isinstance(wanted, tuple) else (wanted,)
        if name in values and not any(values[name] is value or values[name] == value for value in allowed):
            shown = f"{name} chosen at run time" if values[name] is ... else f"{name}={codes[name]}"
            advice = replacement.advice.get(name, f"remove `{name}=...`")
            return f"{replacement.apex_name} with {shown} has no torch equivalent: {advice}"
    if target is None:
        target = replacement.target(values, codes)  # type: ignore[operator]
    names = {id(arg): name for name, arg in bound.items()}
    kept: list[cst.Arg] = []
    for index, arg in enumerate(call.args):
        name = names[id(arg)]
        if name in replacement.dropped or name in replacement.required:
            continue
        new_name = replacement.renamed.get(name, name)
        if arg.keyword is None and index >= replacement.positional or new_name != name:
            arg = arg.with_changes(
                keyword=cst.Name(new_name),
                equal=cst.AssignEqual(whitespace_before=syntax.NO_SPACE, whitespace_after=syntax.NO_SPACE),
            )
        kept.append(arg)
    for name, code in replacement.added(values).items():
        if name not in bound:
            kept.append(syntax.keyword(name, cst.parse_expression(code)))
    if kept and call.args and not isinstance(call.args[-1].comma, cst.Comma):
        kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    for position in range(len(kept) - 1):
        if not isinstance(kept[position].comma, cst.Comma):
            kept[position] = kept[position].with_changes(comma=cst.Comma(whitespace_after=syntax.ONE_SPACE))
    func = syntax.dotted(target) if target.replace(".", "").isidentifier() else cst.parse_expression(target)
    return call.with_changes(func=func, args=kept)


def _rewritten(updated: cst.CSTNode, replacement: Replacement) -> cst.CSTNode:
    """The torch call built from the call as the other edits left it (its arguments may hold
    rewritten Apex calls: ``SyncBatchNorm(n, process_group=create_syncbn_process_group(k))``)."""
    assert isinstance(updated, cst.Call)
    result = _rewrite(updated, replacement)
    assert not isinstance(result, str), result  # the arguments' names and count did not change
    return result


def plan_replacements(ctx: ModuleContext, replacements: tuple[Replacement, ...]) -> None:
    for call in ctx.nodes_of(cst.Call):
        found = ctx.apex_path(call.func)
        if found is None:
            continue
        path, root = found
        replacement = next((r for r in replacements if _matches(path, r)), None)
        if replacement is None or ctx.skipped(call):
            continue
        result = _rewrite(call, replacement)
        if isinstance(result, str):
            ctx.report("AMP042", call, result)
            continue
        ctx.plan.replace[call] = functools.partial(_rewritten, replacement=replacement)
        ctx.plan.needs_torch_import = True
        ctx.consumed.add(root)
        target = syntax.code(result.func).strip("()")
        note = replacement.note
        if callable(note):
            bound = syntax.bind_arguments(call, replacement.parameters) or {}
            note = note({name: syntax.literal(arg.value) for name, arg in bound.items()})
        ctx.report("AMP041", call, f"{path} became {target}" + (f": {note}" if note else ""))
