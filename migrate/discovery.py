"""Finding the files to migrate: ``*.py`` and ``*.ipynb`` under the given paths.

Folders are searched recursively, skipping excluded folders (VCS metadata, virtual
environments, builds: see ``config.DEFAULT_EXCLUDE``), anything a ``.gitignore`` ignores,
and symlinked folders (which can loop). Files named on the command line are always
taken, whatever their suffix, unless the project's exclude patterns match them:
pre-commit passes every staged file by name and expects the project's excludes to hold.

Each real file is found once, however many names lead to it. A symlinked file met while
searching a folder is followed only when its target lies inside the paths given (so a
run never writes outside them); a link that loops is reported for its path. Discovery
streams what it finds, so the runner can start work before the walk is over.
"""

from __future__ import annotations

import fnmatch
import os
import re
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from migrate.atomic import TEMP_SUFFIX, is_temp_name
from migrate.config import Config

SUFFIXES = (".py", ".ipynb")
# "name/" or "*.egg-info/": a folder name at any depth. When every pattern has this
# shape (the defaults do) they are matched by folder name alone, without pathspec,
# whose import costs a pre-commit run on one file a noticeable share of its 0.1 s.
_FOLDER_NAME_PATTERN = re.compile(r"^[^/!\\#\[]+/$")
# "/build", "docs/_build", "/a/b.py": a path anchored at the .gitignore's folder (a slash at
# the start or in the middle), with no wildcard, escape, space or empty part. Under the
# walk's condition (the folders above an entry are not ignored) it matches exactly that
# relative path; anything under it is never asked about.
_ANCHORED_LITERAL = re.compile(r"^/?[^/*?\[\\\s!#]+(?:/[^/*?\[\\\s]+)*$")
# pathspec names a group in each pattern's regex; several patterns joined in one
# alternation may not repeat a group name.
_NAMED_GROUP = re.compile(r"\(\?P<\w+>")


APEX_CHECKOUT = (
    "a copy of NVIDIA Apex's own sources (its apex/ package, csrc/ and setup.py), not migrated: it is the "
    "library the project imports, not the project's code; delete it once nothing imports apex any more"
)


# A .gitignore pattern can match a file git tracks (CenterPoint's `**dist**`, meant for dist/,
# also matches tools/dist_test.py): git keeps tracking it, but the walk skips it. Said aloud
# when it uses Apex, so that no Apex is left without a word.
IGNORED_APEX_FILE = (
    "not migrated: a .gitignore pattern matches it, yet it uses Apex (git still tracks a file added before "
    "or despite the pattern): name it on the command line, or run with --no-respect-gitignore, to migrate it"
)


def _uses_apex(path: str) -> bool:
    """Whether the file at ``path`` mentions Apex (the prefilter's own first test)."""
    try:
        with open(path, "rb") as file:
            return b"apex" in file.read()
    except OSError:
        return False


def _is_apex_checkout(folder: str, names: set[str]) -> bool:
    """A vendored clone of NVIDIA/apex (openai/jukebox's ``apex/``): its ``apex`` package, CUDA
    sources and build script. Rewriting Apex's own modules, tests and examples migrates nothing of
    the project's (and changes what Apex's tests check)."""
    return (
        "apex" in names
        and "csrc" in names
        and "setup.py" in names
        and os.path.isfile(os.path.join(folder, "apex", "__init__.py"))
    )


@dataclass(frozen=True)
class Candidate:
    """A file to migrate: where it is, and how to name it to the user."""

    path: str
    display: str
    # Known to be a regular file (the folder listing said so): no need to stat it again.
    regular: bool = False

    @property
    def is_notebook(self) -> bool:
        return self.path.endswith(".ipynb")


if TYPE_CHECKING:
    from typing import TypeAlias

    from migrate.records import DiscoveryError, Leftover, Notice

    Found: TypeAlias = Candidate | DiscoveryError | Notice | Leftover


class Translations(Protocol):
    """Where pathspec's translations of gitignore lines are remembered (``cache.Translations``):
    a warm run over a tree of .gitignore files then neither imports pathspec nor translates."""

    def get(self, lines: str) -> Any: ...

    def put(self, lines: str, translation: list[Any] | None) -> None: ...


# Whether a path relative to a .gitignore's folder is ignored (is_dir says which kind).
_Matcher = Callable[[str, bool], bool]
# A .gitignore in force while walking: the folder it sits in, and its matcher.
_Ignore = tuple[str, _Matcher]


def compile_gitignore(lines: list[str], translations: Translations | None = None) -> _Matcher:
    """A matcher for the patterns of one .gitignore, for a walk that prunes as it goes.

    The matcher answers for an entry whose parent folders were already found not ignored
    (the walk never enters an ignored folder). Under that condition most patterns need no
    regular expression: a pattern without a slash (``__pycache__/``, ``*.pyc``, ``data``)
    can only match the entry's own name, so it is a set lookup or a suffix test. The
    rest become one regular expression (compiled once, not once per pattern); a file with
    a negated pattern, where order matters, goes to pathspec's GitIgnoreSpec whole.
    Compiling a thousand patterns one by one costs more than walking a large tree.
    """
    names: set[str] = set()
    folder_names: set[str] = set()
    paths: set[str] = set()
    folder_paths: set[str] = set()
    suffixes: list[str] = []
    folder_suffixes: list[str] = []
    rest: list[str] = []
    for line in lines:
        if not line or line.startswith("#"):
            continue
        if line.startswith("!"):
            return _ordered_matcher(lines, translations)
        folder_only = line.endswith("/")
        body = line[:-1] if folder_only else line
        if "/" in body and _ANCHORED_LITERAL.match(body) and not {".", ".."} & set(body.split("/")):
            # a path relative to the .gitignore's folder, without wildcards: compared whole
            (folder_paths if folder_only else paths).add(body.removeprefix("/"))
        elif not body or "/" in body or "\\" in body or body != body.strip():
            rest.append(line)  # wildcards with a slash, escaped or spaced: pathspec translates it
        elif not any(char in body for char in "*?["):
            (folder_names if folder_only else names).add(body)
        elif body[0] == "*" and not any(char in body[1:] for char in "*?["):
            (folder_suffixes if folder_only else suffixes).append(body[1:])
        else:
            rest.append(line)
    translated, match = _joined_regex(rest, translations)
    if not translated:
        return _ordered_matcher(lines, translations)
    name_suffixes, folder_name_suffixes = tuple(suffixes), tuple(suffixes + folder_suffixes)
    folder_names |= names
    folder_paths |= paths

    def matcher(relative: str, is_dir: bool) -> bool:
        name = relative[relative.rfind("/") + 1 :]
        if is_dir:
            if name in folder_names or name.endswith(folder_name_suffixes) or relative in folder_paths:
                return True
        elif name in names or name.endswith(name_suffixes) or relative in paths:
            return True
        return match is not None and match(relative + "/" if is_dir else relative) is not None

    return matcher


def _joined_regex(
    lines: list[str], translations: Translations | None = None
) -> tuple[bool, Callable[[str], re.Match[str] | None] | None]:
    """One compiled alternation of pathspec's regexes for ``lines`` (None for no line),
    and whether the translation worked."""
    if not lines:
        return True, None
    translated, joined = _remembered(
        translations,
        "\n".join(lines),
        lambda known: isinstance(known, list)
        and len(known) == 2
        and isinstance(known[0], bool)
        and isinstance(known[1], str | None),
        lambda: list(_translate(lines)),
    )
    if not translated:
        return False, None
    if joined is None:
        return True, None
    try:
        return True, re.compile(joined).match
    except re.error:
        return False, None


def _remembered(
    translations: Translations | None, key: str, valid: Callable[[Any], bool], translate: Callable[[], Any]
) -> Any:
    """The translation remembered under ``key`` if ``valid`` accepts it, else ``translate()``'s
    (remembered for the next run)."""
    known = translations.get(key) if translations is not None else None
    if not valid(known):
        known = translate()
        if translations is not None:
            translations.put(key, known)
    return known


def _translate(lines: list[str]) -> tuple[bool, str | None]:
    """pathspec's regexes for ``lines`` as one alternation (None: no pattern), and whether
    each line could be translated on its own, none a negation (else pathspec must match the
    file whole)."""
    each = _translate_each(lines)
    if each is None or not all(include for include, _ in each):
        return False, None
    regexes = [_NAMED_GROUP.sub("(?:", regex) for _, regex in each]
    return True, "|".join(regexes) if regexes else None


def _whole_path_matcher(lines: list[str], translations: Translations | None = None) -> _Matcher:
    """A matcher with GitIgnoreSpec's answers for any path, its folders unchecked."""
    translated, match = _joined_regex([line for line in lines if line and not line.startswith("#")], translations)
    if not translated:
        return _ordered_matcher(lines, translations)
    if match is None:
        return lambda relative, is_dir: False
    return lambda relative, is_dir: match(relative + "/" if is_dir else relative) is not None


def _ordered_matcher(lines: list[str], translations: Translations | None = None) -> _Matcher:
    """GitIgnoreSpec's answers for patterns whose order matters (negations): each pattern's
    own regex, the last match deciding, and a match of the path itself (a file pattern)
    before a match through one of its folders (pathspec's "directory mark").

    Decided as pathspec's own matcher decides (``pathspec._backends.simple.gitignore``), from
    translations a warm run reads back rather than importing pathspec; pathspec itself
    when a pattern cannot be translated on its own.
    """
    known = _remembered(
        translations,
        "\0ordered\n" + "\n".join(lines),
        lambda known: isinstance(known, list) and all(_is_ordered_pattern(item) for item in known),
        lambda: _translate_each(lines),
    )
    if known is None:
        return _pathspec_matcher(lines)
    try:
        patterns = [(bool(include), re.compile(regex).search) for include, regex in known]
    except re.error:
        return _pathspec_matcher(lines)
    patterns.reverse()  # the last match decides: looked for from the end

    def matcher(relative: str, is_dir: bool) -> bool:
        path = relative + "/" if is_dir else relative
        decided: bool | None = None
        for include, search in patterns:
            found = search(path)
            if found is None:
                continue
            if not found.groupdict().get(_DIR_MARK):
                return include  # the path itself matched: this pattern decides
            if decided is None:
                decided = include  # matched through a folder: unless a file pattern matches
        return bool(decided)

    return matcher


# The group pathspec's regexes name when a pattern matched a folder above the path.
_DIR_MARK = "ps_d"


def _is_ordered_pattern(item: Any) -> bool:
    return isinstance(item, list) and len(item) == 2 and isinstance(item[0], bool) and isinstance(item[1], str)


def _translate_each(lines: list[str]) -> list[list[Any]] | None:
    """(whether it ignores, regex) for each pattern of ``lines`` in order; None when one has no
    regular expression of its own."""
    from pathspec.patterns.gitignore.spec import GitIgnoreSpecPattern

    patterns: list[list[Any]] = []
    for line in lines:
        regex, include = GitIgnoreSpecPattern.pattern_to_regex(line)
        if include is None:
            continue
        if not isinstance(regex, str):
            return None
        patterns.append([bool(include), regex])
    return patterns


def _pathspec_matcher(lines: list[str]) -> _Matcher:
    from pathspec import GitIgnoreSpec

    spec = GitIgnoreSpec.from_lines(lines)
    return lambda relative, is_dir: spec.match_file(relative + "/" if is_dir else relative)


class _Excludes:
    """The project's exclude patterns, matched on paths relative to the project root."""

    def __init__(self, config: Config, translations: Translations | None = None) -> None:
        self.root = os.path.realpath(config.project_root)
        patterns = [*config.exclude, *config.extend_exclude]
        self.matcher: _Matcher | None = None
        self.folder_name: re.Pattern[str] | None = None
        if all(_FOLDER_NAME_PATTERN.match(pattern) for pattern in patterns):
            names = "|".join(fnmatch.translate(pattern[:-1]) for pattern in patterns)
            self.folder_name = re.compile(names or "(?!)")
        else:
            # Also asked about files named on the command line, whose folders nobody
            # checked: whole-path matching, not compile_gitignore's entry-name shortcut.
            self.matcher = _whole_path_matcher(patterns, translations)

    def relative(self, path: str, fallback_base: str) -> str:
        """``path`` relative to the project root, or to ``fallback_base`` outside it."""
        for base in (self.root, fallback_base):
            if path.startswith(base + os.sep):
                return path[len(base) + 1 :].replace(os.sep, "/")
        return os.path.basename(path)

    def excluded(self, relative: str, is_dir: bool) -> bool:
        """Whether the patterns exclude this root-relative path (or a folder above it)."""
        if self.matcher is not None:
            return self.matcher(relative, is_dir)
        assert self.folder_name is not None
        folders = relative.split("/") if is_dir else relative.split("/")[:-1]
        return any(self.folder_name.match(folder) for folder in folders)


def _load_gitignore(folder: str, translations: Translations | None = None) -> _Matcher | None:
    try:
        with open(os.path.join(folder, ".gitignore"), encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    return compile_gitignore(lines, translations)


def _gitignored(path: str, is_dir: bool, ignores: tuple[_Ignore, ...]) -> bool:
    for folder, matcher in ignores:
        if matcher(path[len(folder) + 1 :].replace(os.sep, "/"), is_dir):
            return True
    return False


def _ignored_folder(folder: str, ignores: tuple[_Ignore, ...]) -> bool:
    """Whether ``folder`` or a folder between it and a .gitignore above ignores it.

    The walk checks entries by their own names only (see compile_gitignore), so the
    folders above its starting point are checked here, from the top down.
    """
    for base, matcher in ignores:
        parts = folder[len(base) + 1 :].split(os.sep)
        if any(matcher("/".join(parts[: depth + 1]), True) for depth in range(len(parts))):
            return True
    return False


def _ancestor_ignores(folder: str, translations: Translations | None = None) -> tuple[_Ignore, ...]:
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
        matcher = _load_gitignore(ancestor, translations)
        if matcher is not None:
            ignores.append((ancestor, matcher))
    return tuple(ignores)


def discover(
    paths: list[Path], config: Config, translations: Translations | None = None
) -> tuple[list[Candidate], list[DiscoveryError]]:
    """All files to migrate under ``paths`` and the paths that failed, sorted by display name."""
    from migrate.records import DiscoveryError

    candidates: list[Candidate] = []
    errors: list[DiscoveryError] = []
    for item in iter_discover(paths, config, translations):
        if isinstance(item, Candidate):
            candidates.append(item)
        elif isinstance(item, DiscoveryError):
            errors.append(item)
    candidates.sort(key=lambda candidate: candidate.display)
    return candidates, sorted(errors, key=lambda error: error.display)


def iter_discover(
    paths: list[Path],
    config: Config,
    translations: Translations | None = None,
    listings: dict[str, set[str]] | None = None,
) -> Iterator[Found]:
    """Everything found under ``paths``, as it is found (in no particular order).

    Each real file is yielded once. Symlinked files met while walking come last: the
    file itself, when it is also found under its own name, is preferred to a link.
    ``translations`` remembers how gitignore patterns translate, from run to run;
    ``listings``, when given, receives the names in each folder searched (by its path).
    """
    walk = _Walk(_Excludes(config, translations), config.respect_gitignore, translations)
    walk.listings = listings
    walk.set_roots(paths)
    for given in paths:
        absolute = os.path.abspath(given)
        if not os.path.lexists(absolute):
            from migrate.records import DiscoveryError  # rare: made where needed

            yield DiscoveryError(str(given), "no such file or directory")
        elif os.path.isdir(absolute):
            ignores = _ancestor_ignores(absolute, translations) if config.respect_gitignore else ()
            if _ignored_folder(absolute, ignores):
                continue  # a .gitignore above ignores the folder itself, so all in it
            walk.base = absolute
            yield from walk.folder(absolute, os.path.realpath(absolute), os.path.normpath(given), ignores, top=True)
        elif not walk.excludes.excluded(walk.excludes.relative(absolute, os.path.dirname(absolute)), False):
            # Named on the command line: followed wherever it leads (the user asked for it).
            yield from walk.given_file(absolute, str(given))
        else:
            from migrate.records import Notice  # rare: made where needed

            # pre-commit names every staged file and expects the project's excludes to hold
            yield Notice(str(given), "not migrated: the exclude patterns of the configuration match it")
    yield from walk.links()


class _Walk:
    """The state of one discovery. A plain class: making a dataclass costs a run about 1.5 ms."""

    def __init__(self, excludes: _Excludes, respect_gitignore: bool, translations: Translations | None) -> None:
        self.excludes = excludes
        self.respect_gitignore = respect_gitignore
        self.translations = translations
        # real paths of the folders and files given: links may lead only inside them
        self.root_folders: tuple[str, ...] = ()
        self.root_files: frozenset[str] = frozenset()
        self.seen: set[str] = set()  # real paths already yielded
        # symlinked files met while walking: (path, display, real path), decided at the end
        self.deferred: list[tuple[str, str, str]] = []
        self.leftover_folders: set[str] = set()
        self.base = ""  # the folder being walked: exclude patterns fall back to it outside the project
        self.listings: dict[str, set[str]] | None = None  # the names in each folder searched

    def set_roots(self, paths: list[Path]) -> None:
        folders, files = [], set()
        for given in paths:
            real = os.path.realpath(given)
            if os.path.isdir(real):
                folders.append(real)
            else:
                files.add(real)
        self.root_folders = tuple(folders)
        self.root_files = frozenset(files)

    def inside(self, real: str) -> bool:
        return real in self.root_files or any(
            real == folder or real.startswith(os.path.join(folder, "")) for folder in self.root_folders
        )

    def given_file(self, absolute: str, display: str) -> Iterator[Found]:
        real = os.path.realpath(absolute)
        if real not in self.seen:
            self.seen.add(real)
            yield Candidate(absolute, display)
        # A killed run's temporary files sit beside the files it was writing.
        folder = os.path.dirname(absolute)
        if folder not in self.leftover_folders:
            self.leftover_folders.add(folder)
            try:
                with os.scandir(folder) as scan:
                    names = [entry.name for entry in scan if is_temp_name(entry.name)]
            except OSError:
                names = []
            shown_folder = os.path.dirname(display)
            for name in sorted(names):
                from migrate.records import Leftover  # rare: made where needed

                yield Leftover(os.path.join(folder, name), os.path.join(shown_folder, name))

    def folder(
        self, folder: str, real_folder: str, display: str, ignores: tuple[_Ignore, ...], top: bool = False
    ) -> Iterator[Found]:
        """Everything under ``folder``; a loop over a stack, not recursion, so that each item
        found is handed over once rather than through one generator per folder level."""
        stack = [(folder, real_folder, display, ignores, top)]
        folder_name = self.excludes.folder_name
        excludes = self.excludes
        seen = self.seen
        while stack:
            folder, real_folder, display, ignores, top = stack.pop()
            try:
                with os.scandir(folder) as scan:
                    entries = list(scan)
            except OSError as error:
                from migrate.records import DiscoveryError  # rare: made where needed

                yield DiscoveryError(display, f"cannot list folder: {error.strerror or error}")
                continue
            names = {entry.name for entry in entries}
            if self.listings is not None:
                self.listings[folder] = names
            if "pyvenv.cfg" in names and not top:
                continue  # a virtual environment, whatever its name
            if not top and _is_apex_checkout(folder, names):
                from migrate.records import Notice  # rare: made where needed

                yield Notice(display, APEX_CHECKOUT)
                continue
            if self.respect_gitignore and ".gitignore" in names:
                matcher = _load_gitignore(folder, self.translations)
                if matcher is not None:
                    ignores = (*ignores, (folder, matcher))
            prefix = "" if display == "." else display + "/"
            for entry in entries:
                name = entry.name
                is_dir = entry.is_dir(follow_symlinks=False)
                if not is_dir and not name.endswith(SUFFIXES):
                    if name.endswith(TEMP_SUFFIX) and is_temp_name(name):
                        from migrate.records import Leftover  # rare: made where needed

                        yield Leftover(entry.path, prefix + name)
                    continue
                path = entry.path
                if folder_name is not None:
                    if is_dir and folder_name.match(name):
                        continue
                elif excludes.excluded(excludes.relative(path, self.base), is_dir):
                    continue
                if ignores and _gitignored(path, is_dir, ignores):
                    if not is_dir and _uses_apex(path):
                        from migrate.records import Notice  # rare: made where needed

                        yield Notice(prefix + name, IGNORED_APEX_FILE)
                    continue
                if is_dir:
                    stack.append((path, real_folder + os.sep + name, prefix + name, ignores, False))
                elif entry.is_symlink():
                    yield from self.link(path, prefix + name)
                else:
                    real = real_folder + os.sep + name
                    if real not in seen:
                        seen.add(real)
                        yield Candidate(path, prefix + name, regular=entry.is_file(follow_symlinks=False))

    def link(self, path: str, display: str) -> Iterator[Found]:
        try:
            info = os.stat(path)
        except FileNotFoundError:
            return  # dangling: nothing to migrate
        except OSError as error:  # a loop, or a folder on the way that cannot be searched
            from migrate.records import DiscoveryError  # rare: made where needed

            yield DiscoveryError(display, f"cannot follow symlink: {error.strerror or error}")
            return
        if stat.S_ISREG(info.st_mode):
            self.deferred.append((path, display, os.path.realpath(path)))

    def links(self) -> Iterator[Found]:
        for path, display, real in sorted(self.deferred, key=lambda item: item[1]):
            if real in self.seen:
                continue  # the same file, already found under another name
            if not self.inside(real):
                from migrate.records import Notice  # rare: made where needed

                yield Notice(display, f"not followed: a symlink to {real}, outside the paths given")
                continue
            self.seen.add(real)
            yield Candidate(path, display)
