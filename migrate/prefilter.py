"""A cheap byte-level test run before any parsing.

A file that cannot contain a use of Apex or of the deprecated ``torch.cuda.amp`` /
``torch.cpu.amp`` forms is never parsed, and libcst is not even imported when no
file passes this test. False positives are fine (the engine then finds nothing);
false negatives are not.
"""

from __future__ import annotations

import re

# "apex" covers every Apex import; "amp" in a torch.cuda/torch.cpu context covers the
# deprecated native forms, also when reached through `from torch.cuda import amp`; the
# amp functions themselves cover code that gets the amp module from elsewhere (a
# parameter, a star import, a notebook's %run), which must be reported, not passed over.
_NEEDLE = re.compile(
    rb"apex|(?:cuda|cpu)\b[\s\\]*(?:\.|import)[\s\\(]*amp|scale_loss|master_params|amp\.(?:initialize|state_dict|load_state_dict)"
)


def may_need_migration(data: bytes | str) -> bool:
    """Return False only when ``data`` certainly has nothing to migrate."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    return _NEEDLE.search(data) is not None
