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


def may_share_a_program(first: str, second: str) -> bool:
    """Whether two modules may run in one program, reaching each other at run time (a hook
    found through a registry, a config string) rather than by an import the index can see.

    Within one project, each module's program spans the folder its absolute imports start
    from (the first folder above its package chain) and one level more (a script in
    ``tools/`` run with its parent on ``sys.path``). In a monorepo (microsoft/unilm), the
    subprojects' programs are apart: an mmcv runner in ``beit/`` does not reach ``minilm/``.
    """
    if project_root(first) != project_root(second):
        return False
    first, second = os.path.abspath(first), os.path.abspath(second)
    return _within(second, _program_folder(os.path.dirname(first))) or _within(
        first, _program_folder(os.path.dirname(second))
    )


@functools.lru_cache(maxsize=4096)
def _program_folder(folder: str) -> str:
    while os.path.exists(os.path.join(folder, "__init__.py")):
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    return os.path.dirname(folder)


def _within(path: str, folder: str) -> bool:
    return path.startswith(folder.rstrip(os.sep) + os.sep)
