"""The ``# ampmigrate: skip`` comment: a statement (or, heading the file, the whole file)
that carries it is left as it was."""

from __future__ import annotations

import re

SKIP_COMMENT = re.compile(r"#\s*ampmigrate:\s*skip\b")
