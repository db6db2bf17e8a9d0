"""A cheap byte-level test run before any parsing.

A file that cannot contain a use of Apex or of the deprecated ``torch.cuda.amp`` /
``torch.cpu.amp`` forms is never parsed, and libcst is not even imported when no
file passes this test. False positives are fine (the engine then finds nothing);
false negatives are not.
"""

from __future__ import annotations

import re

# "amp" in a torch.cuda/torch.cpu context covers the deprecated native forms, also when
# reached through `from torch.cuda import amp`. One pattern per device, so that each
# starts with a literal the regex engine scans for quickly (an alternation of the two
# is five times slower on a real tree).
_CUDA_AMP = rb"cuda\b[\s\\]*(?:\.|import)[\s\\(]*amp"
_CPU_AMP = rb"cpu\b[\s\\]*(?:\.|import)[\s\\(]*amp"
# The amp functions themselves cover code that gets the amp module from elsewhere (a
# parameter, a star import, a notebook's %run), which must be reported, not passed over.
_AMP_FUNCTION = rb"amp\.(?:initialize|state_dict|load_state_dict)"


def may_need_migration(data: bytes | str) -> bool:
    """Return False only when ``data`` certainly has nothing to migrate."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    # Substring tests are a memchr-fast scan: "apex" covers every Apex import.
    if b"apex" in data or b"scale_loss" in data or b"master_params" in data:
        return True
    # a project's own copy of apex.fp16_utils and the modules that import from it (its loss scalers
    # are read for the plan): the names the copies and their users spell out
    if b"FP16_Optimizer" in data or b"FP16_Module" in data or b"network_to_half" in data or b"LossScaler" in data:
        return True
    if b"amp" not in data:
        return False
    # The regex engine scans for a literal prefix more slowly than `in` does: ask `in` first.
    # re.search compiles a pattern once and keeps it: compiled at first use, not at import
    # (most files, and most pre-commit runs, never get this far).
    return (
        (b"amp." in data and re.search(_AMP_FUNCTION, data) is not None)
        or (b"cuda" in data and re.search(_CUDA_AMP, data) is not None)
        or (b"cpu" in data and re.search(_CPU_AMP, data) is not None)
    )
