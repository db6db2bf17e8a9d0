"""ampmigrate: migrate NVIDIA Apex mixed precision (apex.amp) to native torch.amp.

This module holds the version only, so that ``import migrate.shim`` pulls in neither
libcst nor click, and ``import migrate.cli`` never pulls in torch.
"""

__version__ = "0.1.0"
