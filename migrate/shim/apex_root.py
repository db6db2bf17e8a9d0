"""What ``import apex`` gives under the shim.

Its subpackages (``apex.amp``, ``apex.fp16_utils``, ...) are reached through the alias
finder in ``migrate.shim``, so every route to ``apex.amp`` yields the same module object.
"""

from __future__ import annotations

# The shim stands in for the last Apex releases that still had apex.amp.
__version__ = "0.1+ampmigrate.shim"
