"""amp_disable_casts: ``with amp.disable_casts():``.

What it rewrites
    The context manager that switched Apex's O1 casts off becomes an autocast region that
    is switched off.

Before::

    with amp.disable_casts():
        out = custom_op(x.float())

After::

    with torch.autocast("cuda", enabled=False):
        out = custom_op(x.float())

Safety
    Inputs produced under autocast may be float16 inside the region; Apex's patched
    functions had the same property. Under O2/O3 Apex raised AttributeError here; the
    native form is always valid.

References
    NVIDIA/apex@e13873d: apex/amp/handle.py (disable_casts); NVIDIA/apex issue #510.
"""

from __future__ import annotations

import libcst as cst

from migrate.rules import _syntax as syntax
from migrate.rules._context import ModuleContext

RULE = "amp_disable_casts"


def plan(ctx: ModuleContext) -> None:
    model = ctx.amp
    for use in model.of("disable_casts"):
        if ctx.skipped(use.call) or use.call.args:
            continue
        replacement = syntax.call(
            "torch.autocast",
            [cst.Arg(syntax.string(ctx.options.device)), syntax.keyword("enabled", cst.Name("False"))],
        )
        ctx.plan.substitute(use.call, replacement)
        ctx.plan.needs_torch_import = True
        ctx.consumed.add(use.base)
