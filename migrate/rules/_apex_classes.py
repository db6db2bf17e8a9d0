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
from migrate.rules._bindings import bound_name, dotted_name, is_import_fallback
from migrate.rules._context import ModuleContext
from migrate.rules._dict_keys import Keys, dict_keys
from migrate.rules._exports import reached_from_outside


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
    # parameters Apex has no default for (a call without one raised) where torch has one: a call
    # through a value that leaves one out must give it in each parameter group it builds
    no_default: frozenset[str] = frozenset()
    # the Apex class (apex_name of another Replacement) whose instances the result holds: a
    # class check on that class must change with this call (convert_syncbn_model: SyncBatchNorm)
    builds: str = ""
    # a class that may be handed to the project's own code when stored in a variable
    # (``norm_layer=BatchNorm2d``), where the project spells none of these Apex-only options
    # (project facts: ``ModuleFacts.apex_options_spelled``): code there can only call it with the
    # arguments the torch class takes the same way, and test instances with it
    passable_unless: tuple[str, ...] = ()
    # torch classes the Apex class derives from (Apex's SyncBatchNorm, either of its two
    # implementations: ``torch.nn.modules.batchnorm._BatchNorm``): in a tuple of classes that
    # already holds one of them, the Apex class adds nothing to what a class test matches
    bases: tuple[str, ...] = ()


def _matches(path: str, replacement: Replacement) -> bool:
    module, _, name = path.rpartition(".")
    return name == replacement.apex_name and any(
        module == prefix or module.startswith(prefix + ".") for prefix in replacement.modules
    )


def _spread(call: cst.Call) -> cst.Name | None:
    """The dict a call unpacks as its only starred argument, last: ``f(x, k=1, **opt_args)``."""
    starred = [arg for arg in call.args if arg.star]
    last = call.args[-1] if call.args else None
    if len(starred) != 1 or starred[0] is not last or last.star != "**" or not isinstance(last.value, cst.Name):
        return None
    return last.value


def _spread_problem(call: cst.Call, replacement: Replacement, keys: Keys) -> str:
    """Why the torch call cannot take the ``**`` dict whose keys are ``keys`` as it is ("" when
    it can): each key it may hold must pass to torch unchanged, and each keyword the torch call
    would add (a default that differs) must be one it surely holds."""
    spread = _spread(call)
    assert spread is not None
    bound = syntax.bind_arguments(call.with_changes(args=call.args[:-1]), replacement.parameters)
    if bound is None:
        return f"{replacement.apex_name} is called with too many positional arguments or a keyword it lacks"
    passed = set(_torch_parameters(replacement)) - {replacement.parameters[0]}
    values = {name: syntax.literal(arg.value) for name, arg in bound.items()}
    unknown = sorted(keys.possible - set(replacement.parameters))
    if unknown:
        return (
            f"`{spread.value}` may hold {', '.join(unknown)}, which {replacement.apex_name} does not take (Apex "
            "raised a TypeError where it did)"
        )
    foreign = sorted(keys.possible - passed)
    if foreign:
        return f"`{spread.value}` may hold {', '.join(foreign)}, which the torch call does not take as it is"
    given_twice = sorted(keys.possible & set(bound))
    if given_twice:
        return f"`{spread.value}` may hold {', '.join(given_twice)}, also given by name"
    codes = {name: syntax.code(arg.value).strip() for name, arg in bound.items()}
    for key in sorted(keys.possible):
        varied = {**values, key: ...}
        if replacement.added(varied) != replacement.added(values) or (
            not isinstance(replacement.target, str)
            and replacement.target(varied, {**codes, key: key}) != replacement.target(values, codes)
        ):
            return f"`{spread.value}` may hold {key}, which changes the torch call written"
    unsure = sorted(
        name for name in replacement.added(values) if name not in bound and name != "fused" and name not in keys.sure
    )
    unsure += sorted(name for name in replacement.no_default if name not in bound and name not in keys.sure)
    if unsure:
        return f"`{spread.value}` may leave out {', '.join(unsure)}, whose default differs in torch's optimizer"
    return ""


def _rewrite(call: cst.Call, replacement: Replacement, keys: Keys | None = None) -> cst.Call | str:
    """The torch call, or the reason it cannot be written (``keys``: those of the dict the call
    unpacks last, ``**opt_args``, where they are known)."""
    spread = call.args[-1] if keys is not None else None
    if spread is not None:
        problem = _spread_problem(call, replacement, keys)  # type: ignore[arg-type]
        if problem:
            return f"{replacement.apex_name} is called with **{syntax.code(spread.value)}: {problem}"
        call = call.with_changes(args=call.args[:-1])
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
        if name not in bound and (keys is None or name not in keys.possible):
            kept.append(syntax.keyword(name, cst.parse_expression(code)))
    if spread is not None:
        kept.append(spread)
    if kept and call.args and not isinstance(call.args[-1].comma, cst.Comma):
        kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    for position in range(len(kept) - 1):
        if not isinstance(kept[position].comma, cst.Comma):
            kept[position] = kept[position].with_changes(comma=cst.Comma(whitespace_after=syntax.ONE_SPACE))
    func = syntax.dotted(target) if target.replace(".", "").isidentifier() else cst.parse_expression(target)
    return call.with_changes(func=func, args=kept)


def _rewritten(updated: cst.CSTNode, replacement: Replacement, keys: Keys | None = None) -> cst.CSTNode:
    """The torch call built from the call as the other edits left it (its arguments may hold
    rewritten Apex calls: ``SyncBatchNorm(n, process_group=create_syncbn_process_group(k))``)."""
    assert isinstance(updated, cst.Call)
    result = _rewrite(updated, replacement, keys)
    assert not isinstance(result, str), result  # the arguments' names and count did not change
    return result


def plan_replacements(ctx: ModuleContext, replacements: tuple[Replacement, ...]) -> None:
    _plan_calls(ctx, replacements)
    _plan_values(ctx, replacements)


def _builders(ctx: ModuleContext, check: _Value, replacements: tuple[Replacement, ...]) -> list[cst.Call]:
    """The calls in the module that build instances of the class ``check`` tests: its own
    constructions and the calls of a Replacement that ``builds`` it (convert_syncbn_model)."""
    makers = [r for r in replacements if r.builds == check.replacement.apex_name]
    calls: list[cst.Call] = []
    for call in ctx.nodes_of(cst.Call):
        found = ctx.apex_path(call.func)
        if found is not None and (found[0] == check.path or any(_matches(found[0], r) for r in makers)):
            calls.append(call)
    return calls


def _hold_builders(ctx: ModuleContext, checks: list[_Value], replacements: tuple[Replacement, ...]) -> bool:
    """Keep Apex's every call that builds the layers a class check left as it was tests: with
    torch's layers there, ``isinstance(m, apex.parallel.SyncBatchNorm)`` would silently stop
    matching (a momentum or an init no longer applied). True when a call was held."""
    held = False
    for check in checks:
        if not check.problem or check.check is None:
            continue
        for call in _builders(ctx, check, replacements):
            if call not in ctx.plan.replace:
                continue
            found = ctx.apex_path(call.func)
            assert found is not None
            del ctx.plan.replace[call]
            ctx.consumed.discard(found[1])
            at = ctx.position(call)
            ctx.findings[:] = [f for f in ctx.findings if not (f.code == "AMP041" and (f.line, f.column) == at)]
            tested = " ".join(ctx.code(check.check).split())
            torch_check = check.check.deep_replace(check.reference, syntax.dotted(check.torch_class))
            result = _rewrite(call, next(r for r in replacements if _matches(found[0], r)))
            assert not isinstance(result, str)
            ctx.report(
                "AMP042",
                call,
                f"{found[0]} left as it was: `{tested}` on line {ctx.position(check.check)[0]} tests the layers it "
                f"builds for {check.path} and stays Apex's ({check.problem}), and torch's layers would silently stop "
                f"matching it. Migrate the two together: `{' '.join(syntax.code(result).split())}` here and "
                f"`{' '.join(syntax.code(torch_check).split())}` there",
            )
            held = True
    return held


def _plan_calls(ctx: ModuleContext, replacements: tuple[Replacement, ...]) -> None:
    for call in ctx.nodes_of(cst.Call):
        found = ctx.apex_path(call.func)
        if found is None:
            continue
        path, root = found
        replacement = next((r for r in replacements if _matches(path, r)), None)
        if replacement is None or ctx.skipped(call):
            continue
        other = _other_library(ctx, root)
        if other is not None:
            _report_other_library(ctx, root, path, replacement, other)
            continue
        keys: Keys | None = None
        spread = _spread(call)
        if spread is not None:
            known = dict_keys(ctx, call, spread)
            if isinstance(known, str):
                ctx.report(
                    "AMP042",
                    call,
                    f"{replacement.apex_name} is called with **{spread.value}, whose keys are not known here: {known}; "
                    f"spell its arguments out: `{replacement.apex_name}({', '.join(replacement.parameters)})`",
                )
                continue
            keys = known
        result = _rewrite(call, replacement, keys)
        if isinstance(result, str):
            ctx.report("AMP042", call, result)
            continue
        ctx.plan.replace[call] = functools.partial(_rewritten, replacement=replacement, keys=keys)
        ctx.plan.needs_torch_import = True
        ctx.consumed.add(root)
        target = syntax.code(result.func).strip("()")
        note = replacement.note
        if callable(note):
            bound = syntax.bind_arguments(call, replacement.parameters, partial=True)
            note = note({name: syntax.literal(arg.value) for name, arg in bound.items()})
        ctx.report("AMP041", call, f"{path} became {target}" + (f": {note}" if note else ""))


def _value_call_problem(call: cst.Call, replacement: Replacement) -> tuple[str | None, str]:
    """(the torch class, "") when ``call``, made through a variable holding the Apex class,
    means the same unchanged with the torch class there; else (None, why not)."""
    bound = syntax.bind_arguments(call, replacement.parameters)
    if bound is None:
        return None, "passes *args/**kwargs or a keyword Apex's signature lacks"
    positional = sum(1 for arg in call.args if arg.keyword is None)
    if positional > replacement.positional:
        return None, f"passes {positional} positional arguments (the two signatures agree on {replacement.positional})"
    values = {name: syntax.literal(arg.value) for name, arg in bound.items()}
    codes = {name: syntax.code(arg.value).strip() for name, arg in bound.items()}
    target = replacement.target if isinstance(replacement.target, str) else replacement.target(values, codes)
    apex_only = sorted(set(bound) & (replacement.dropped | set(replacement.required) | set(replacement.renamed)))
    if apex_only:
        return None, f"passes {', '.join(apex_only)}, which {target} does not take"
    # fused=True only picks torch's faster kernel: a call without it computes the same
    differing = sorted(name for name in replacement.added(values) if name not in bound and name != "fused")
    if differing:
        return None, f"leaves out {', '.join(differing)}, whose default differs in {target}"
    for name in sorted(replacement.no_default - set(bound)):
        params = bound.get(replacement.parameters[0])
        if params is None or not _every_group_gives(params.value, name):
            return None, f"leaves out {name}, which Apex required (it raised) and {target} defaults"
    return target, ""


def _other_library(ctx: ModuleContext, root: cst.Name) -> cst.Import | cst.ImportFrom | None:
    """The import of another library than Apex or torch tried before the Apex one, binding the
    same name (``try: from transformer_engine.pytorch.optimizers import FusedSGD as SGD except
    ImportError: from apex.optimizers import FusedSGD as SGD``): where that library is installed
    the name is its class, which a torch call must not replace. (A fallback tried after Apex only
    ran where Apex was missing: the Apex path is the one migrated.)"""
    binding = ctx.resolve(root.value, root)
    if binding is None:
        return None
    scope = next((s for s, names in ctx.imports.items() if binding in names.get(root.value, ())), None)
    if scope is None:
        return None
    tried_first: list[cst.Try] = []  # the trys whose except clauses hold the Apex import
    for ancestor in ctx.ancestors(binding.statement):
        if isinstance(ancestor, cst.ExceptHandler):
            owner = ctx.parent(ancestor)
            if isinstance(owner, cst.Try):
                tried_first.append(owner)
    for other in ctx.other_imports.get(scope, {}).get(root.value, []):
        module = dotted_name(other.module) if isinstance(other, cst.ImportFrom) and other.module is not None else ""
        if isinstance(other, cst.ImportFrom) and (module or "").split(".")[0] == "torch":
            continue
        around = set(ctx.ancestors(other))
        if any(attempt.body in around for attempt in tried_first):
            return other
    return None


def _torch_fallback(ctx: ModuleContext, scope: object, bound: str) -> str | None:
    """The torch class an ``except`` clause of the try around the Apex import binds to the same
    name (``from torch.optim import AdamW as Adam``), as a dotted path."""
    for other in ctx.other_imports.get(scope, {}).get(bound, []):  # type: ignore[call-overload]
        if not isinstance(other, cst.ImportFrom) or isinstance(other.names, cst.ImportStar):
            continue
        module = dotted_name(other.module) if other.module is not None else None
        if module is None or module.split(".")[0] != "torch":
            continue
        if not any(isinstance(a, cst.ExceptHandler) for a in ctx.ancestors(other)):
            continue
        for alias in other.names:
            if (alias.evaluated_alias or alias.evaluated_name) == bound:
                return f"{module}.{alias.evaluated_name}"
    return None


def _report_other_library(
    ctx: ModuleContext, root: cst.Name, path: str, replacement: Replacement, other: cst.Import | cst.ImportFrom
) -> None:
    """AMP042 on the Apex import of a name another library's import binds first: what the name
    is where, and whether deleting the Apex level (the name falls to torch's fallback) is the
    same for every use here."""
    binding = ctx.resolve(root.value, root)
    assert binding is not None
    bound = root.value
    scope = next((s for s, names in ctx.imports.items() if binding in names.get(bound, ())), ctx.module)
    fallback = _torch_fallback(ctx, scope, bound)
    differences: list[str] = []
    for name in ctx.reference_names():
        if name.value != bound or any(isinstance(a, (cst.Import, cst.ImportFrom)) for a in ctx.ancestors(name)):
            continue
        found = ctx.resolve(name.value, name)
        if found is None or found.alias is not binding.alias:
            continue
        holder = ctx.parent(name)
        line = ctx.position(name)[0]
        if isinstance(holder, cst.Call) and holder.func is name:
            twin, why = _value_call_problem(holder, replacement)
            if twin is None:
                differences.append(f"the call on line {line} {why}")
            elif fallback is not None and twin != fallback:
                differences.append(f"the call on line {line} builds {fallback} where Apex's twin is {twin}")
        else:
            differences.append(f"line {line} uses it other than by a call, so the calls it reaches are not seen")
    twin = _default_target(replacement)
    if fallback is not None and fallback != twin:
        differences.insert(0, f"the fallback {fallback} is not {path}'s torch twin {twin}")
    flags = _flags_that_differ(ctx, binding.statement)
    if flags:
        differences.append(f"the flags the try sets change ({', '.join(flags)})")
    imported = " ".join(syntax.code(other).split())
    where = f"{fallback} where neither is installed" if fallback else "the except clause's choice where neither is"
    verdict = (
        f"deleting it is not the same as what ran with Apex: {'; '.join(differences)}"
        if differences or fallback is None
        else f"every use here passes arguments {fallback} takes the same way, so deleting it changes only speed"
    )
    ctx.report(
        "AMP042",
        binding.alias,
        f"`{bound}` is chosen among three: the class of the import on line {ctx.position(other)[0]} (`{imported}`) "
        f"where that library is installed, {path} where only Apex is, {where}; ampmigrate leaves the choice as it "
        f"is. To run without Apex, delete this import (its `try` level, keeping its except clause's code); " + verdict,
    )


def _flags_that_differ(ctx: ModuleContext, statement: cst.CSTNode) -> list[str]:
    """The names the try around ``statement`` sets beside the import to another value than its
    except clauses do (``USING_APEX_OPTIMIZER = True``): deleting the Apex level changes them."""
    owner = ctx.try_around(statement)
    if owner is None:
        return []

    def flags(node: cst.CSTNode) -> dict[str, str]:
        found: dict[str, str] = {}
        for inner in ctx.walk(node):
            if isinstance(inner, cst.Assign) and len(inner.targets) == 1:
                name = dotted_name(inner.targets[0].target)
                if name is not None:
                    found[name] = " ".join(syntax.code(inner.value).split())
        return found

    tried = flags(owner.body)
    otherwise: dict[str, str] = {}
    for handler in owner.handlers:
        otherwise.update(flags(handler))
    changes = [
        f"`{name} = {otherwise[name]}` instead of `{name} = {code}`" if name in otherwise else f"no `{name} = {code}`"
        for name, code in tried.items()
        if otherwise.get(name) != code
    ]
    return changes + [f"`{name} = {code}` set" for name, code in otherwise.items() if name not in tried]


def _every_group_gives(params: cst.BaseExpression, option: str) -> bool:
    """``[{"params": ..., "lr": ...}, ...]``: a literal list of groups, each giving ``option``."""
    if not isinstance(params, (cst.List, cst.Tuple)) or not params.elements:
        return False
    for element in params.elements:
        group = element.value
        if not isinstance(element, cst.Element) or not isinstance(group, cst.Dict):
            return False
        keys = {syntax.literal(item.key) for item in group.elements if isinstance(item, cst.DictElement)}
        if option not in keys:
            return False
    return True


def stored_in(ctx: ModuleContext, reference: cst.BaseExpression) -> cst.Assign | None:
    """The assignment that stores the class as a value: ``x = C`` or ``x = D if c else C``."""
    node: cst.CSTNode = reference
    parent = ctx.parent(node)
    while isinstance(parent, cst.IfExp) and parent.test is not node:
        node, parent = parent, ctx.parent(parent)
    if isinstance(parent, cst.Assign) and parent.value is node and len(parent.targets) == 1:
        return parent
    return None


def _calls_through(ctx: ModuleContext, variable: str, passable: bool = False) -> list[cst.Call] | str:
    """Every call made through the plain variable ``variable``, or why some use of it is not a
    call (then the value may flow where it is not seen). Every name spelled so in the module
    counts, whatever scope it is in: a name elsewhere only adds calls to check. ``passable``:
    the variable may also be the class tested by ``isinstance``/``issubclass`` and an argument
    of a call to code other than Apex's (that call is in the list, its func not the variable)."""
    calls: list[cst.Call] = []
    for name in ctx.nodes_of(cst.Name):
        if name.value != variable:
            continue
        if not reads_variable(ctx, name):
            continue
        parent = ctx.parent(name)
        if isinstance(parent, cst.Call) and parent.func is name:
            calls.append(parent)
            continue
        if passable and class_check(ctx, name) is not None:
            continue
        holder = ctx.parent(parent) if isinstance(parent, cst.Arg) and parent.value is name else None
        if passable and isinstance(holder, cst.Call) and ctx.apex_path(holder.func) is None:
            calls.append(holder)
            continue
        return f"`{variable}` is used other than by a call on line {ctx.position(name)[0]}"
    return calls


def reads_variable(ctx: ModuleContext, name: cst.Name) -> bool:
    """Whether ``name`` reads the variable it spells: not an attribute (``obj.variable``), a
    keyword (``f(variable=...)``) or the target of an assignment to it."""
    parent = ctx.parent(name)
    if isinstance(parent, cst.Attribute) and parent.attr is name:
        return False
    if isinstance(parent, cst.Arg) and parent.keyword is name:
        return False
    return not (isinstance(parent, cst.AssignTarget) and parent.target is name)


def _plan_values(ctx: ModuleContext, replacements: tuple[Replacement, ...]) -> None:
    """An Apex class stored in a variable and called through it (``opt_class = FusedSGD``,
    ``opt_class(params, lr=0.1)``) becomes the torch class where every call through the
    variable is seen and means the same with the torch class; an ``isinstance``/``issubclass``
    check on it where every construction of the class in the module becomes that torch class.
    Every other use of the same import must migrate too; else AMP042 with the code to write."""
    decisions: list[_Value] = []
    checks: list[_Value] = []
    drops: list[_Value] = []  # elements of a tuple of classes that a torch base class there covers
    for name in ctx.reference_names():
        if any(isinstance(a, (cst.Import, cst.ImportFrom)) for a in ctx.ancestors(name)):
            continue
        reference: cst.BaseExpression = name
        replacement = None
        found = None
        while True:
            found = ctx.apex_path(reference)
            if found is not None:
                replacement = next((r for r in replacements if _matches(found[0], r)), None)
                if replacement is not None:
                    break
            parent = ctx.parent(reference)
            if not (isinstance(parent, cst.Attribute) and parent.value is reference):
                break
            reference = parent
        if replacement is None or found is None:
            continue
        holder = ctx.parent(reference)
        if isinstance(holder, cst.Call) and holder.func is reference:
            continue  # a direct call: _plan_calls
        if ctx.skipped(reference):
            continue
        other = _other_library(ctx, found[1])
        if other is not None:
            _report_other_library(ctx, found[1], found[0], replacement, other)
            continue
        covered = _covered(ctx, reference, replacement)
        if covered is not None:
            drops.append(covered)
            continue
        extended = _extends_torch_tuple(ctx, reference, replacement, found[0])
        if extended:
            ctx.report("AMP042", reference, extended)
            continue
        store = stored_in(ctx, reference)
        if store is not None:
            decisions.append(_decide(ctx, reference, store, replacement, found[0], found[1]))
            continue
        tested = class_check(ctx, reference)
        if tested is not None:
            target = _default_target(replacement)
            checks.append(_Value(reference, found[1], replacement, found[0], "", target, [], "", tested))
        # other uses (passed, subclassed): amp_import reports the import that stays
    for check in checks:
        check.problem = _check_problem(ctx, check, decisions, replacements)
    while True:  # a use whose import keeps another Apex use fails, which may fail others in turn
        migrated = {id(value.root) for value in (*decisions, *checks, *drops) if not value.problem}
        failed = False
        for value in (*decisions, *checks, *drops):
            if not value.problem:
                value.problem = _other_use(ctx, value, migrated)
                failed |= bool(value.problem)
        failed |= _hold_builders(ctx, checks, replacements)
        for check in checks:
            if not check.problem:
                check.problem = _check_problem(ctx, check, decisions, replacements)
                failed |= bool(check.problem)
        if not failed:
            break
    for value in decisions:
        if value.problem:
            _report_value(ctx, value)
            continue
        ctx.plan.substitute(value.reference, syntax.dotted(value.torch_class))
        ctx.plan.needs_torch_import = True
        ctx.consumed.add(value.root)
        lines = ", ".join(str(ctx.position(call)[0]) for call in value.calls)
        said = (
            f"every call through it (line{'s' if len(value.calls) > 1 else ''} {lines}) passes arguments "
            f"{value.torch_class} takes with the same meaning and defaults"
            if value.calls
            else ""
        )
        if value.passed:
            handed = ", ".join(sorted({str(ctx.position(call)[0]) for call in value.passed}, key=int))
            options = " or ".join(value.replacement.passable_unless)
            said += (
                f"{'; ' if said else ''}the code it is handed to (line{'s' if ',' in handed else ''} {handed}) can "
                f"only build layers with it from arguments {value.torch_class} takes the same way, and test layers "
                f"with it: no file of the project spells {options}"
            )
        ctx.report(
            "AMP041", value.reference, f"{value.path} stored in `{value.spelled}` became {value.torch_class}: {said}"
        )
    dropped: dict[cst.Tuple, list[int]] = {}  # a tuple may hold two Apex classes (both go)
    for drop in drops:
        if drop.problem:
            continue  # the import stays for another use: amp_import reports it (AMP040)
        assert drop.base is not None
        element = ctx.parent(drop.reference)
        tuple_node = ctx.parent(element) if element is not None else None
        assert isinstance(tuple_node, cst.Tuple)
        dropped.setdefault(tuple_node, []).append(
            next(i for i, item in enumerate(tuple_node.elements) if item.value is drop.reference)
        )
        ctx.plan.replace[tuple_node] = functools.partial(
            _without_elements, indices=tuple(dropped[tuple_node]), unwrap=class_check(ctx, tuple_node) is not None
        )
        ctx.consumed.add(drop.root)
        ctx.report(
            "AMP041",
            drop.reference,
            f"{drop.path} dropped from the tuple of classes: it derives from {drop.torch_class} "
            f"(`{ctx.code(drop.base).strip()}`, in the same tuple), so {drop.spelled} matches the same layers",
        )
    for check in checks:
        assert check.check is not None
        if check.problem:
            torch_check = check.check.deep_replace(check.reference, syntax.dotted(check.torch_class))
            ctx.report(
                "AMP042",
                check.check,
                f"`{' '.join(ctx.code(check.check).split())}` tests for {check.path}, but {check.problem}: write "
                f"`{' '.join(syntax.code(torch_check).split())}` once every {check.path.rpartition('.')[2]} that "
                f"reaches it is built as {check.torch_class}",
            )
            continue
        ctx.plan.substitute(check.reference, syntax.dotted(check.torch_class))
        ctx.plan.needs_torch_import = True
        ctx.consumed.add(check.root)
        ctx.report(
            "AMP041",
            check.check,
            f"{check.path} became {check.torch_class} in the check: every {check.path.rpartition('.')[2]} this module "
            f"builds is {check.torch_class} now; one built in another module and tested here must be too",
        )


def _covered(ctx: ModuleContext, reference: cst.BaseExpression, replacement: Replacement) -> _Value | None:
    """``reference`` as an element of a tuple of classes that also holds a torch base class of
    it (``(nn.BatchNorm2d, _BatchNorm, apex.parallel.SyncBatchNorm)``), where the tuple is only
    ever a class test's second argument: straight in ``isinstance``/``issubclass``, or bound to a
    name that nothing outside the module reaches and that the module reads only there. Dropping
    the element then changes no test; ``base`` holds the base class's expression."""
    if not replacement.bases:
        return None
    element = ctx.parent(reference)
    tuple_node = ctx.parent(element) if isinstance(element, cst.Element) else None
    if not isinstance(tuple_node, cst.Tuple) or len(tuple_node.elements) < 2:
        return None
    base = next(
        (
            other.value
            for other in tuple_node.elements
            if other is not element
            and isinstance(other, cst.Element)
            and _torch_path(ctx, other.value) in replacement.bases
        ),
        None,
    )
    if base is None:
        return None
    path, root = ctx.apex_path(reference) or ("", reference)
    assert isinstance(root, cst.Name)
    value = _Value(reference, root, replacement, path, "", _torch_path(ctx, base) or "", [], "", base=base)
    parent = ctx.parent(tuple_node)
    if isinstance(parent, cst.Arg) and class_check(ctx, tuple_node) is not None:
        value.spelled = "the test"
        return value
    if not (isinstance(parent, cst.Assign) and parent.value is tuple_node and len(parent.targets) == 1):
        return None
    target = parent.targets[0].target
    scope = ctx.scope_of(parent)
    if not isinstance(target, cst.Name) or isinstance(scope, cst.ClassDef):
        return None
    if reached_from_outside(ctx, scope, target.value) is not None:
        return None
    for name in ctx.nodes_of(cst.Name):
        if name.value != target.value or not reads_variable(ctx, name):
            continue
        if isinstance(ctx.parent(name), cst.AssignTarget) or class_check(ctx, name) is None:
            return None
    value.spelled = f"every test of `{target.value}`"
    return value


_TORCH_SYNCBN = ("torch.nn.SyncBatchNorm", "torch.nn.modules.SyncBatchNorm", "torch.nn.modules.batchnorm.SyncBatchNorm")


def _extends_torch_tuple(ctx: ModuleContext, reference: cst.BaseExpression, replacement: Replacement, path: str) -> str:
    """Why the Apex class added to a tuple of classes that already holds torch's (``_NORM_TYPES +=
    (apex.parallel.SyncBatchNorm,)`` after ``_NORM_TYPES = (..., nn.SyncBatchNorm)``) stays, and
    when it can go; "" for another use. Torch's layers match the tuple without it, but whether any
    Apex layer still reaches the tests depends on code outside the module, a library's included."""
    if not replacement.bases:
        return ""
    element = ctx.parent(reference)
    added = ctx.parent(element) if isinstance(element, cst.Element) else None
    if not isinstance(added, cst.Tuple):
        return ""
    holder = ctx.parent(added)
    target: cst.BaseExpression | None = None
    if isinstance(holder, cst.AugAssign) and isinstance(holder.operator, cst.AddAssign) and holder.value is added:
        target = holder.target
    elif (
        isinstance(holder, cst.BinaryOperation)
        and isinstance(holder.operator, cst.Add)
        and holder.right is added
        and isinstance(ctx.parent(holder), cst.Assign)
    ):
        assign = ctx.parent(holder)
        assert isinstance(assign, cst.Assign)
        if len(assign.targets) == 1 and syntax.normalized(assign.targets[0].target) == syntax.normalized(holder.left):
            target = holder.left
    if not isinstance(target, cst.Name):
        return ""
    held = None
    for name in ctx.nodes_of(cst.Name):  # the index holds no Assign nodes: find them through their targets
        if name.value != target.value or not isinstance(ctx.parent(name), cst.AssignTarget):
            continue
        assign = ctx.parent(ctx.parent(name))  # type: ignore[arg-type]
        if not (
            isinstance(assign, cst.Assign)
            and len(assign.targets) == 1
            and isinstance(assign.value, cst.Tuple)
            and ctx.scope_of(assign) is ctx.scope_of(added)
        ):
            continue
        held = next(
            (e.value for e in assign.value.elements if _torch_path(ctx, e.value) in _TORCH_SYNCBN),
            held,
        )
    if held is None:
        return ""
    assert holder is not None
    small = holder if isinstance(holder, cst.AugAssign) else ctx.parent(holder)
    assert small is not None
    statement = " ".join(ctx.code(small).split())
    return (
        f"`{statement}` adds {path} to `{target.value}`, which already holds torch's SyncBatchNorm "
        f"(`{ctx.code(held).strip()}`, line {ctx.position(held)[0]}): layers built by torch match it without this "
        f"statement, but an Apex SyncBatchNorm built elsewhere (by `apex.parallel.convert_syncbn_model` or "
        f"`apex.parallel.SyncBatchNorm(...)`, in this project or in a library it calls) would stop matching. Once "
        f"no code that builds the layers `{target.value}` tests builds Apex's, delete this statement (and the "
        f"`import apex` and the `if` or `try` around them where they serve nothing else)"
    )


def _torch_path(ctx: ModuleContext, expression: cst.BaseExpression) -> str | None:
    """The dotted path in torch that ``expression`` (``nn.modules.batchnorm._BatchNorm``,
    ``torch.nn.modules.batchnorm._BatchNorm``, an imported ``_BatchNorm``) names through the
    module's imports, or None."""
    spelled = dotted_name(expression)
    if spelled is None:
        return None
    root, _, rest = spelled.partition(".")
    binding = ctx.resolve(root, expression)
    if binding is not None:
        return f"{binding.target}.{rest}" if binding.kind == "torch" and rest else None
    if _rebound(ctx, root):
        return None  # a parameter, a variable or a definition of that name may be what it reads
    scope = ctx.scope_of(expression)
    statements = [
        statement
        for where in (scope, ctx.module)
        for statement in ctx.other_imports.get(where, {}).get(root, [])  # type: ignore[call-overload]
    ]
    found: set[str] = set()
    for statement in statements:
        if isinstance(statement.names, cst.ImportStar):
            return None
        for alias in statement.names:
            if bound_name(alias) != root:
                continue
            imported = dotted_name(alias.name) or ""
            if isinstance(statement, cst.Import):
                full = imported if alias.asname is not None else root
            elif statement.relative or statement.module is None:
                return None
            else:
                full = f"{dotted_name(statement.module)}.{imported}"
            found.add(f"{full}.{rest}" if rest else full)
    if len(found) != 1:
        return None
    path = found.pop()
    return path if path.split(".")[0] == "torch" else None


def _rebound(ctx: ModuleContext, name: str) -> bool:
    """Whether the module binds ``name`` anywhere other than by an import: an assignment, a
    parameter, a loop or ``with``/``except`` target, a ``def`` or ``class``, a ``global``."""
    for node in ctx.nodes_of(cst.Name):
        if node.value != name:
            continue
        parent = ctx.parent(node)
        if isinstance(parent, (cst.AssignTarget, cst.Param, cst.NameItem)):
            return True
        if isinstance(parent, (cst.AugAssign, cst.AnnAssign, cst.For, cst.CompFor)) and parent.target is node:
            return True
        if isinstance(parent, cst.NamedExpr) and parent.target is node:
            return True
        if isinstance(parent, cst.AsName) and not any(
            isinstance(a, (cst.Import, cst.ImportFrom)) for a in ctx.ancestors(node)
        ):
            return True
        if isinstance(parent, (cst.FunctionDef, cst.ClassDef)) and parent.name is node:
            return True
        if isinstance(parent, cst.Element) and isinstance(ctx.parent(parent), (cst.Tuple, cst.List)):
            holder = ctx.parent(ctx.parent(parent))  # type: ignore[arg-type]
            if isinstance(holder, (cst.AssignTarget, cst.For, cst.CompFor)):
                return True
    return False


def _without_elements(updated: cst.CSTNode, indices: tuple[int, ...], unwrap: bool) -> cst.CSTNode:
    """The tuple without its elements at ``indices``, its last comma as the source wrote it;
    ``unwrap``: a class test's own argument, one class left, is that class."""
    assert isinstance(updated, cst.Tuple)
    last_comma = updated.elements[-1].comma
    elements = [element for index, element in enumerate(updated.elements) if index not in indices]
    if unwrap and len(elements) == 1 and isinstance(elements[0], cst.Element):
        return elements[0].value
    if len(updated.elements) - 1 in indices:  # the last one went: the new last keeps the old last's comma
        elements[-1] = elements[-1].with_changes(comma=last_comma)
    return updated.with_changes(elements=elements)


def class_check(ctx: ModuleContext, reference: cst.BaseExpression) -> cst.Call | None:
    """The ``isinstance(x, C)`` / ``issubclass(x, (A, C))`` call whose class argument is ``reference``."""
    node: cst.CSTNode = reference
    parent = ctx.parent(node)
    if isinstance(parent, cst.Element) and isinstance(ctx.parent(parent), cst.Tuple):
        node = ctx.parent(parent)  # type: ignore[assignment]
        parent = ctx.parent(node)
    if not isinstance(parent, cst.Arg) or parent.value is not node:
        return None
    call = ctx.parent(parent)
    if (
        isinstance(call, cst.Call)
        and isinstance(call.func, cst.Name)
        and call.func.value in ("isinstance", "issubclass")
        and len(call.args) == 2
        and call.args[1] is parent
    ):
        return call
    return None


def _check_problem(
    ctx: ModuleContext, check: _Value, values: list[_Value], replacements: tuple[Replacement, ...]
) -> str:
    """Why a class check on the Apex class cannot name the torch class ("" when it can): each
    construction of the Apex class the module holds (``convert_syncbn_model`` builds
    SyncBatchNorm layers too) must become that very torch class."""
    if not isinstance(check.replacement.target, str):
        return "the torch class depends on the arguments of each construction"
    built: list[str] = []
    for call in _builders(ctx, check, replacements):
        if call not in ctx.plan.replace:
            found = ctx.apex_path(call.func)
            assert found is not None
            what = "built" if found[0] == check.path else f"built by {found[0].rpartition('.')[2]}"
            return f"the {check.path} {what} on line {ctx.position(call)[0]} stays Apex's"
        built.append(str(ctx.position(call)[0]))
    for value in values:
        if value.path == check.path:
            if value.problem:
                return f"the {check.path} stored on line {ctx.position(value.reference)[0]} stays Apex's"
            built.append(str(ctx.position(value.reference)[0]))
    if not built:
        return "this module builds none: the layers it tests come from elsewhere, where they may stay Apex's"
    short = check.torch_class.rpartition(".")[2]
    # the index holds no Attribute nodes: find `nn.SyncBatchNorm` (or an imported `SyncBatchNorm`)
    # through its last name
    for name in ctx.nodes_of(cst.Name):
        if name.value != short or any(isinstance(a, (cst.Import, cst.ImportFrom)) for a in ctx.ancestors(name)):
            continue
        parent = ctx.parent(name)
        node: cst.BaseExpression = parent if isinstance(parent, cst.Attribute) and parent.attr is name else name
        if isinstance(node, cst.Name) and isinstance(parent, cst.Attribute) and parent.value is not name:
            continue
        if node is check.reference or ctx.apex_path(node) is not None:
            continue
        spelled = syntax.code(node).strip()
        return f"the module also uses {spelled} (line {ctx.position(node)[0]}), which the check would start to match"
    return ""


@dataclass
class _Value:
    """One Apex class stored as a value, and whether the torch class may take its place."""

    reference: cst.BaseExpression
    root: cst.Name
    replacement: Replacement
    path: str
    spelled: str  # the variable (or attribute) it is stored in
    torch_class: str
    calls: list[cst.Call]
    problem: str  # why not ("" when it may)
    check: cst.Call | None = None  # the isinstance/issubclass call, for a class check
    passed: list[cst.Call] = field(default_factory=list)  # the calls it is handed to (``passable_unless``)
    base: cst.BaseExpression | None = None  # the torch base class beside it in a tuple (``_covered``)


def _decide(
    ctx: ModuleContext,
    reference: cst.BaseExpression,
    store: cst.Assign,
    replacement: Replacement,
    path: str,
    root: cst.Name,
) -> _Value:
    target = store.targets[0].target
    spelled = syntax.code(target).strip()
    value = _Value(reference, root, replacement, path, spelled, _default_target(replacement), [], "")
    if not isinstance(target, cst.Name) or isinstance(ctx.scope_of(store), cst.ClassDef):
        value.problem = f"`{spelled}` is an attribute, and the calls through it are not all in this module"
        return value
    reached = reached_from_outside(ctx, ctx.scope_of(store), target.value)
    if reached is not None:
        value.problem = f"`{spelled}` may be used outside this module ({reached})"
        return value
    calls = _calls_through(ctx, target.value, _passable(ctx, replacement))
    if isinstance(calls, str):
        value.problem = calls
        options = sorted(set(ctx.options.facts.apex_options_spelled or ()) & set(replacement.passable_unless))
        if options:
            value.problem += (
                f" (a file of the project spells {' and '.join(options)}: code it is handed to may pass "
                f"{'them' if len(options) > 1 else 'it'})"
            )
        return value
    if not calls:
        value.problem = f"`{spelled}` is never called in this module"
        return value
    value.passed = [call for call in calls if not (isinstance(call.func, cst.Name) and call.func.value == target.value)]
    calls = [call for call in calls if call not in value.passed]
    if not calls:
        value.torch_class = _default_target(replacement)
        return value
    targets: set[str] = set()
    for call in calls:
        called, why = _value_call_problem(call, replacement)
        if called is None:
            value.problem = f"the call on line {ctx.position(call)[0]} {why}"
            return value
        targets.add(called)
    if len(targets) > 1 or not next(iter(targets)).replace(".", "").isidentifier():
        value.problem = f"its calls need different torch classes ({', '.join(sorted(targets))})"
        return value
    value.torch_class, value.calls = next(iter(targets)), calls
    return value


def _passable(ctx: ModuleContext, replacement: Replacement) -> bool:
    """Whether a variable holding the class may be handed to other code: the project (as
    project mode scanned it) spells none of the Apex-only options such code could pass."""
    spelled = ctx.options.facts.apex_options_spelled
    return (
        bool(replacement.passable_unless)
        and spelled is not None
        and not set(spelled) & set(replacement.passable_unless)
    )


def _other_use(ctx: ModuleContext, value: _Value, migrated: set[int]) -> str:
    """Why the Apex class stays for another of its uses through the same import ("" when none
    does): a torch class stored here beside the Apex one checked or passed elsewhere would stop
    matching."""
    root = value.root
    binding = ctx.resolve(root.value, root)
    if binding is None:
        return ""
    for name in ctx.reference_names():
        if name is root or name in ctx.consumed or id(name) in migrated or name.value != root.value:
            continue
        if any(isinstance(a, (cst.Import, cst.ImportFrom)) for a in ctx.ancestors(name)):
            continue
        if is_import_fallback(ctx, name):
            continue
        other = ctx.resolve(name.value, name)
        if other is None or other.alias is not binding.alias:
            continue
        node: cst.BaseExpression = name
        while (path := ctx.apex_path(node)) is not None and path[0] != value.path:
            parent = ctx.parent(node)
            if not (isinstance(parent, cst.Attribute) and parent.value is node):
                break
            node = parent
        if path is not None and path[0] == value.path:
            return f"`{name.value}` is also used on line {ctx.position(name)[0]}, where it stays Apex's class"
    return ""


def _report_value(ctx: ModuleContext, value: _Value) -> None:
    needed = sorted(name for name in value.replacement.added({}) if name != "fused")
    passes = f" and passes {', '.join(needed)} (Apex's default differs)" if needed else ""
    ctx.report(
        "AMP042",
        value.reference,
        f"{value.path} is stored in `{value.spelled}` as a value, but {value.problem}: write "
        f"`{value.torch_class}` here once every call through `{value.spelled}` passes only "
        f"({', '.join(_torch_parameters(value.replacement))}){passes}",
    )


def _default_target(replacement: Replacement) -> str:
    if isinstance(replacement.target, str):
        return replacement.target
    return replacement.target({}, {})


def _torch_parameters(replacement: Replacement) -> list[str]:
    """The Apex parameters a call through a value may pass unchanged to the torch class."""
    apex_only = replacement.dropped | set(replacement.required) | set(replacement.renamed)
    return [name for name in replacement.parameters if name not in apex_only]
