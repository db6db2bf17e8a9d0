"""Where a module's project starts: apart from ``migrate.project``, whose import a warm run
(answered by a recorded plan) does without."""

from __future__ import annotations

import functools
import os

_ROOT_MARKERS = ("setup.py", "setup.cfg", "pyproject.toml", "requirements.txt", ".git")


def project_root(path: str) -> str:
    """The nearest folder above ``path`` that looks like a project's root (setup.py, .git, ...)."""
    return _root_of(os.path.dirname(os.path.abspath(path)))


@functools.lru_cache(maxsize=4096)
def _root_of(folder: str) -> str:
    # by folder, so that the files of one folder (and the folders of one tree) share the walk up
    if any(os.path.exists(os.path.join(folder, marker)) for marker in _ROOT_MARKERS):
        return folder
    parent = os.path.dirname(folder)
    return folder if parent == folder else _root_of(parent)
