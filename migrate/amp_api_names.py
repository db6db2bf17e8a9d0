"""Names of Apex amp's API, for the modules that read source with ``ast`` (no libcst there)."""

from __future__ import annotations

# the amp functions that only mark functions for casting: ``amp_cast_functions.APIS`` spelled
# again here (tests/test_project.py keeps the two in step)
CASTING = frozenset(
    {
        "float_function",
        "half_function",
        "promote_function",
        "register_float_function",
        "register_half_function",
        "register_promote_function",
    }
)
