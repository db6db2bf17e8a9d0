"""Finding the files to migrate: ``*.py`` and ``*.ipynb`` under the given paths.

Folders are searched recursively in sorted order, skipping excluded folders (VCS
metadata, virtual environments, builds: see ``config.DEFAULT_EXCLUDE``), anything a
``.gitignore`` ignores, and symlinked folders (which can loop). Files named on the
command line are always taken, whatever their suffix, unless the project's exclude
patterns match them: pre-commit passes every staged file by name and expects the
project's excludes to hold.
"""

from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from migrate.config import Config

if TYPE_CHECKING:
    from pathspec import GitIgnoreSpec

SUFFIXES = (".py", ".ipynb")
# "name/" or "*.egg-info/": a folder name at any depth. When every pattern has this
# shape (the defaults do) they are matched by folder name alone, without pathspec,
# whose import costs a pre-commit run on one file a noticeable share of its 0.1 s.
_FOLDER_NAME_PATTERN = re.compile(r"^[^/!\\#\[]+/$")


@dataclass(frozen=True)
class Candidate:
    """A file to migrate: where it is, and how to name it to the user."""

    path: Path
    display: str

    @property
    def is_notebook(self) -> bool:
        return self.path.suffix == ".ipynb"


@dataclass(frozen=True)
class DiscoveryError:
    """A path that could not be searched (missing, unreadable folder)."""

    display: str
    reason: str


# A .gitignore in force while walking: the folder it sits in, and its patterns.
_Ignore = tuple[str, "GitIgnoreSpec"]


class _Excludes:
    """The project's exclude patterns, matched on paths relative to the project root."""

    def __init__(self, config: Config) -> None:
        self.root = str(config.project_root.resolve())
        patterns = [*config.exclude, *config.extend_exclude]
        self.spec: GitIgnoreSpec | None = None
        self.folder_name: re.Pattern[str] | None = None
        if all(_FOLDER_NAME_PATTERN.match(pattern) for pattern in patterns):
            names = "|".join(fnmatch.translate(pattern[:-1]) for pattern in patterns)
            self.folder_name = re.compile(names or "(?!)")
        else:
            from pathspec import GitIgnoreSpec

            self.spec = GitIgnoreSpec.from_lines(patterns)

    def relative(self, path: str, fallback_base: str) -> str:
        """``path`` relative to the project root, or to ``fallback_base`` outside it."""
        for base in (self.root, fallback_base):
            if path.startswith(base + os.sep):
                return path[len(base) + 1 :].replace(os.sep, "/")
        return os.path.basename(path)

    def excluded(self, relative: str, is_dir: bool) -> bool:
        """Whether the patterns exclude this root-relative path (or a folder above it)."""
        if self.spec is not None:
            return self.spec.match_file(relative + "/" if is_dir else relative)
        assert self.folder_name is not None
        folders = relative.split("/") if is_dir else relative.split("/")[:-1]
        return any(self.folder_name.match(folder) for folder in folders)

    def excluded_entry(self, relative: str, name: str, is_dir: bool) -> bool:
        """The same for an entry met while walking, whose parents were already checked."""
        if self.spec is not None:
            return self.spec.match_file(relative + "/" if is_dir else relative)
        assert self.folder_name is not None
        return is_dir and self.folder_name.match(name) is not None


def _load_gitignore(folder: str) -> GitIgnoreSpec | None:
    try:
        with open(os.path.join(folder, ".gitignore"), encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    from pathspec import GitIgnoreSpec

    return GitIgnoreSpec.from_lines(lines)


def _gitignored(path: str, is_dir: bool, ignores: tuple[_Ignore, ...]) -> bool:
    for folder, spec in ignores:
        relative = path[len(folder) + 1 :].replace(os.sep, "/")
        if spec.match_file(relative + "/" if is_dir else relative):
            return True
    return False


def _ancestor_ignores(folder: str) -> tuple[_Ignore, ...]:
    """The .gitignore files above ``folder`` up to its repository root (none outside one)."""
    chain = []
    current = folder
    while True:
        chain.append(current)
        if os.path.exists(os.path.join(current, ".git")):
            break
        parent = os.path.dirname(current)
        if parent == current:
            return ()  # not in a git repository: only .gitignore files met while walking count
        current = parent
    ignores = []
    for ancestor in reversed(chain[1:]):
        spec = _load_gitignore(ancestor)
        if spec is not None:
            ignores.append((ancestor, spec))
    return tuple(ignores)


def discover(paths: list[Path], config: Config) -> tuple[list[Candidate], list[DiscoveryError]]:
    """All files to migrate under ``paths``, sorted by display name and deduplicated."""
    excludes = _Excludes(config)
    found: dict[str, Candidate] = {}
    errors: list[DiscoveryError] = []
    for given in paths:
        absolute = os.path.abspath(given)
        if not os.path.lexists(absolute):
            errors.append(DiscoveryError(str(given), "no such file or directory"))
        elif os.path.isdir(absolute):
            ignores = _ancestor_ignores(absolute) if config.respect_gitignore else ()
            walk = _Walk(excludes, absolute, config.respect_gitignore, found, errors)
            walk.folder(absolute, os.path.normpath(given), ignores)
        elif not excludes.excluded(excludes.relative(absolute, os.path.dirname(absolute)), False):
            found.setdefault(absolute, Candidate(Path(absolute), str(given)))
    candidates = sorted(found.values(), key=lambda candidate: candidate.display)
    return candidates, sorted(errors, key=lambda error: error.display)


@dataclass
class _Walk:
    excludes: _Excludes
    root: str
    respect_gitignore: bool
    found: dict[str, Candidate]
    errors: list[DiscoveryError]

    def folder(self, folder: str, display: str, ignores: tuple[_Ignore, ...]) -> None:
        try:
            with os.scandir(folder) as scan:
                entries = sorted(scan, key=lambda entry: entry.name)
        except OSError as error:
            reason = f"cannot list folder: {error.strerror or error}"
            self.errors.append(DiscoveryError(display, reason))
            return
        if self.respect_gitignore and any(e.name == ".gitignore" for e in entries):
            spec = _load_gitignore(folder)
            if spec is not None:
                ignores = (*ignores, (folder, spec))
        for entry in entries:
            path = entry.path
            is_dir = entry.is_dir(follow_symlinks=False)
            if not is_dir and not entry.name.endswith(SUFFIXES):
                continue
            relative = self.excludes.relative(path, self.root)
            if self.excludes.excluded_entry(relative, entry.name, is_dir) or (
                ignores and _gitignored(path, is_dir, ignores)
            ):
                continue
            shown = display + "/" + entry.name if display != "." else entry.name
            if is_dir:
                # A virtual environment under any name has a pyvenv.cfg.
                if not os.path.exists(os.path.join(path, "pyvenv.cfg")):
                    self.folder(path, shown, ignores)
            elif entry.is_file():  # follows file symlinks; drops dangling ones
                self.found.setdefault(path, Candidate(Path(path), shown))
