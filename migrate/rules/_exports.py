"""Whether a name a module binds may be reached from outside it, so an import that binds it stays.

Other given modules import it (project mode's ``ModuleFacts.exported``, ``"*"`` for a star
import), ``__all__`` lists it, the module is a package's ``__init__.py``, or the module may look it up by its spelling: the name as a
whole string literal (``getattr(module, "name")``, ``globals()["name"]``), or a lookup by a
string computed at run time (``globals()``, ``locals()``, ``vars()`` without argument,
``eval``, ``exec``).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import libcst as cst

from migrate.rules._bindings import Scope, dotted_name

if TYPE_CHECKING:
    from migrate.rules._context import ModuleContext


def dynamic_lookup(ctx: ModuleContext) -> cst.Call | None:
    """The first call that may look a module name up by a string computed at run time:
    ``globals()``, ``locals()``, ``vars()`` (no argument), ``eval(...)``, ``exec(...)``."""
    for call in ctx.nodes_of(cst.Call):
        if isinstance(call.func, cst.Name) and (
            call.func.value in ("eval", "exec") or call.func.value in ("globals", "locals", "vars") and not call.args
        ):
            return call
    return None


def module_all(ctx: ModuleContext) -> set[str]:
    """The string items of ``__all__`` assignments and updates at module level."""
    names: set[str] = set()
    for statement in ctx.module.body:
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        for small in statement.body:
            value: cst.BaseExpression | None = None
            if isinstance(small, cst.Assign) and any(
                isinstance(t.target, cst.Name) and t.target.value == "__all__" for t in small.targets
            ):
                value = small.value
            elif isinstance(small, (cst.AugAssign, cst.AnnAssign)) and dotted_name(small.target) == "__all__":
                value = small.value
            elif isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
                func = dotted_name(small.value.func)
                if func in ("__all__.append", "__all__.extend") and small.value.args:
                    value = small.value.args[0].value
            if value is None:
                continue
            items = value.elements if isinstance(value, (cst.List, cst.Tuple, cst.Set)) else [value]
            for item in items:
                node = item.value if isinstance(item, cst.BaseElement) else item
                if isinstance(node, cst.SimpleString) and isinstance(node.evaluated_value, str):
                    names.add(node.evaluated_value)
    return names


def reached_from_outside(
    ctx: ModuleContext, scope: Scope, bound: str, optional_import: cst.CSTNode | None = None
) -> str | None:
    """Why ``bound`` (bound in ``scope``) may be reached from outside the module, as a
    clause ("`__all__` lists `X`"); None when nothing but the module's own code reaches it.

    ``optional_import``: the import statement that binds ``bound``. Where it is an Apex-optional
    import (a ``try`` whose ``except ImportError`` clauses leave the name unbound) and no string
    in the module holds the name, a lookup by a string computed at run time (``eval(cfg.MODULE)``)
    does not keep it: without Apex that lookup already found nothing, and the module is written to
    run without Apex, so a lookup reaching the name is not one it relies on."""
    if scope is ctx.module:
        exported = ctx.options.facts.exported
        if bound in exported or "*" in exported:
            return f"other modules of the project import `{bound}` from this one"
        if bound in module_all(ctx):
            return f"`__all__` lists `{bound}`"
        if ctx.options.facts.package_init:
            return f"this is a package's __init__.py: code that imports the package may use `{bound}`"
    if re.search(rf"""(['"]){re.escape(bound)}\1""", ctx.source):
        return f"the module spells '{bound}' in a string (a getattr or globals() lookup may reach it)"
    lookup = dynamic_lookup(ctx)
    if lookup is not None and optional_import is not None and _optional(ctx, optional_import, bound):
        if not any(bound in _string_text(node) for node in ctx.nodes_of(cst.SimpleString)) and not any(
            bound in ctx.code(node) for node in ctx.nodes_of(cst.FormattedString)
        ):
            lookup = None
    if lookup is not None:
        call = f"{ctx.code(lookup.func).strip()}() on line {ctx.position(lookup)[0]}"
        return f"the module may look names up by a string computed at run time ({call})"
    return None


def _string_text(node: cst.SimpleString) -> str:
    value = node.evaluated_value
    return value if isinstance(value, str) else ""


def _optional(ctx: ModuleContext, statement: cst.CSTNode, bound: str) -> bool:
    """``statement`` is in the body of a ``try`` whose handlers all catch ImportError and none
    binds ``bound`` again (``except ImportError: pass``)."""
    owner = ctx.try_around(statement)
    if owner is None or not owner.handlers:
        return False
    for handler in owner.handlers:
        caught = handler.type
        names = (
            [dotted_name(e.value) for e in caught.elements]
            if isinstance(caught, cst.Tuple)
            else [dotted_name(caught)] if caught is not None else [None]
        )
        if not any(name in ("ImportError", "ModuleNotFoundError") for name in names):
            return False
        for node in ctx.walk(handler):
            if isinstance(node, cst.Name) and node.value == bound:
                return False
            if isinstance(node, cst.ImportAlias) and (node.evaluated_alias or node.evaluated_name) == bound:
                return False
    return True
