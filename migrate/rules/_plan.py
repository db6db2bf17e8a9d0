"""The plan of edits the rules build: what to replace, remove, insert or wrap.

Every edit is keyed by an *original* node of the parsed module; ``_apply`` makes them all
in one transform at the end, so rules never see each other's half-finished output and
several rules can touch one block.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import libcst as cst

# what a block holds (libcst types its bodies more loosely)
Statement = cst.SimpleStatementLine | cst.BaseCompoundStatement
Block = cst.Module | cst.IndentedBlock


class LostEditError(RuntimeError):
    """A rewrite built from an original node would drop an edit planned inside it."""


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
    # removed statements whose comment lines right above them go too (they spoke of them)
    forget_comments: set[cst.CSTNode] = field(default_factory=set)
    # removed statements whose comments inside go too (they spoke of the code removed)
    forget_inner_comments: set[cst.CSTNode] = field(default_factory=set)
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
    # other modules the new code needs imported (``import functools``), beside torch
    imports: set[str] = field(default_factory=set)

    def substitute(self, node: cst.CSTNode, replacement: cst.CSTNode) -> None:
        """Replace ``node`` by a fixed new node, built from the original: an edit planned
        inside ``node`` would be lost, so that is an error (the file is left as it was)."""

        def replace(updated: cst.CSTNode) -> cst.CSTNode:
            if updated is not node and not updated.deep_equals(node):
                raise LostEditError(f"an edit inside `{cst.Module([]).code_for_node(node)[:80]}` would be lost")
            return replacement

        self.replace[node] = replace

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
            or self.imports
        )
