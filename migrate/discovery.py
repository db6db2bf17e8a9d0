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
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from migrate.config import Config

if TYPE_CHECKING:
    from pathspec import GitIgnoreSpec

# "name/" or "*.egg-info/": a folder name at any depth. Patterns all of this shape
# (the defaults are) are matched without importing pathspec, which costs a
# pre-commit run on one file a noticeable share of its 0.1 s.
_FOLDER_NAME_PATTERN = re.compile(r"^[^/!\\#]+/$")

SUFFIXES = (".py", ".ipynb")


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


class _Excludes:
    """The project's exclude patterns plus, while traversing, the .gitignore files."""

    def __init__(self, config: Config) -> None:
        self.root = config.project_root.resolve()
        patterns = [*config.exclude, *config.extend_exclude]
        self.respect_gitignore = config.respect_gitignore
        self.spec: GitIgnoreSpec | None = None
        self.folder_names: tuple[str, ...] = ()
        if all(_FOLDER_NAME_PATTERN.match(pattern) for pattern in patterns):
            self.folder_names = tuple(pattern[:-1] for pattern in patterns)
        else:
            from pathspec import GitIgnoreSpec

            self.spec = GitIgnoreSpec.from_lines(patterns)

    def excluded(self, path: Path, is_dir: bool, relative_to: Path) -> bool:
        """``path`` is absolute; patterns apply relative to the project root when it
        contains ``path``, else relative to the folder the user named."""
        base = self.root if _is_under(path, self.root) else relative_to
        relative = (
            path.relative_to(base).as_posix() if _is_under(path, base) else path.name
        )
        if self.spec is not None:
            return self.spec.match_file(relative + "/" if is_dir else relative)
        folders = relative.split("/") if is_dir else relative.split("/")[:-1]
        return any(
            fnmatch.fnmatchcase(folder, name)
            for folder in folders
            for name in self.folder_names
        )

    def gitignored(self, path: Path, is_dir: bool, top: Path) -> bool:
        """Whether a .gitignore between ``top`` and ``path``'s folder ignores ``path``."""
        if not self.respect_gitignore:
            return False
        for folder in path.parents:
            spec = _gitignore(folder)
            if spec is not None:
                relative = path.relative_to(folder).as_posix()
                if spec.match_file(relative + "/" if is_dir else relative):
                    return True
            if folder == top:
                break
        return False


@lru_cache(maxsize=4096)
def _gitignore(folder: Path) -> GitIgnoreSpec | None:
    try:
        lines = (
            (folder / ".gitignore")
            .read_text(encoding="utf-8", errors="replace")
            .splitlines()
        )
    except OSError:
        return None
    from pathspec import GitIgnoreSpec

    return GitIgnoreSpec.from_lines(lines)


def _is_under(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _gitignore_top(start: Path) -> Path:
    """The repository root above ``start`` (.gitignore files count up to there), or ``start``."""
    for folder in (start, *start.parents):
        if (folder / ".git").exists():
            return folder
    return start


def discover(
    paths: list[Path], config: Config
) -> tuple[list[Candidate], list[DiscoveryError]]:
    """All files to migrate under ``paths``, sorted by display name and deduplicated."""
    excludes = _Excludes(config)
    found: dict[Path, Candidate] = {}
    errors: list[DiscoveryError] = []
    for given in paths:
        absolute = Path(os.path.abspath(given))
        if not os.path.lexists(absolute):
            errors.append(DiscoveryError(str(given), "no such file or directory"))
        elif absolute.is_dir():
            if (
                excludes.excluded(absolute, True, absolute)
                and absolute != excludes.root
            ):
                continue
            top = _gitignore_top(absolute)
            _walk(absolute, str(given), absolute, top, excludes, found, errors)
        elif not excludes.excluded(absolute, False, absolute.parent):
            found.setdefault(absolute, Candidate(absolute, str(given)))
    candidates = sorted(found.values(), key=lambda candidate: candidate.display)
    return candidates, sorted(errors, key=lambda error: error.display)


def _walk(
    folder: Path,
    display: str,
    root: Path,
    top: Path,
    excludes: _Excludes,
    found: dict[Path, Candidate],
    errors: list[DiscoveryError],
) -> None:
    try:
        with os.scandir(folder) as scan:
            entries = sorted(scan, key=lambda entry: entry.name)
    except OSError as error:
        errors.append(
            DiscoveryError(display, f"cannot list folder: {error.strerror or error}")
        )
        return
    for entry in entries:
        path = folder / entry.name
        shown = os.path.normpath(os.path.join(display, entry.name))
        if entry.is_dir(follow_symlinks=False):
            if (
                excludes.excluded(path, True, root)
                or excludes.gitignored(path, True, top)
                or (
                    path / "pyvenv.cfg"
                ).exists()  # a virtual environment under any name
            ):
                continue
            _walk(path, shown, root, top, excludes, found, errors)
        elif (
            path.suffix in SUFFIXES and entry.is_file()
        ):  # is_file() drops dangling links
            if excludes.excluded(path, False, root) or excludes.gitignored(
                path, False, top
            ):
                continue
            found.setdefault(path, Candidate(path, shown))
