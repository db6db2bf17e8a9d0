"""Run settings: the frozen Config the CLI builds, and ``[tool.ampmigrate]`` loading.

Settings come from three places, later ones winning: built-in defaults, the nearest
``pyproject.toml`` with a ``[tool.ampmigrate]`` table (found by walking up from the
paths given), and command-line options.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from migrate.options import DEFAULT_SCALER_NAME, Options

# Folders no one wants migrated: VCS metadata, virtual environments, caches, builds.
# Gitignore-style patterns, so a bare name matches at any depth.
DEFAULT_EXCLUDE: tuple[str, ...] = (
    ".git/",
    ".hg/",
    ".svn/",
    ".bzr/",
    ".tox/",
    ".nox/",
    ".venv/",
    "venv/",
    ".eggs/",
    "*.egg-info/",
    "__pycache__/",
    ".mypy_cache/",
    ".pytest_cache/",
    ".ruff_cache/",
    ".ipynb_checkpoints/",
    "build/",
    "dist/",
    "_build/",
    "buck-out/",
    "node_modules/",
    "site-packages/",
)

DTYPES = ("float16", "bfloat16")
_DEVICE = re.compile(r"^[a-z][a-z0-9_]*$")
_KEYS = {
    "exclude",
    "extend-exclude",
    "respect-gitignore",
    "device",
    "dtype",
    "scaler-name",
    "select",
    "fused",
}


class ConfigError(Exception):
    """A ``[tool.ampmigrate]`` table or an option has an invalid value."""


class OutputFormat(str, Enum):
    TEXT = "text"
    JSON = "json"
    GITHUB = "github"
    SARIF = "sarif"


@dataclass(frozen=True)
class Config:
    """Everything one run needs, independent of how it was asked for."""

    write: bool = False
    check: bool = False
    diff: bool = True
    output_format: OutputFormat = OutputFormat.TEXT
    jobs: int = 1
    color: bool | None = None  # None: colour when stdout is a terminal
    report_path: Path | None = None
    options: Options = field(default_factory=Options)
    exclude: tuple[str, ...] = DEFAULT_EXCLUDE
    extend_exclude: tuple[str, ...] = ()
    respect_gitignore: bool = True
    # The folder exclude patterns are relative to: the pyproject.toml's, else the cwd.
    project_root: Path = field(default_factory=Path.cwd)
    config_file: Path | None = None
    # Where per-file results are cached (see migrate.cache); None: no cache.
    cache_dir: Path | None = None


@dataclass(frozen=True)
class FileSettings:
    """The ``[tool.ampmigrate]`` table, validated; None means "not set there"."""

    path: Path
    exclude: tuple[str, ...] | None = None
    extend_exclude: tuple[str, ...] = ()
    respect_gitignore: bool | None = None
    device: str | None = None
    dtype: str | None = None
    scaler_name: str | None = None
    select: frozenset[str] | None = None
    fused: bool | None = None


def find_pyproject(paths: list[Path]) -> Path | None:
    """The nearest pyproject.toml with a [tool.ampmigrate] table above all ``paths``.

    The search starts at the deepest folder containing every path and stops at the
    root of the repository (a folder with ``.git``), so a checkout never picks up a
    stray configuration from the home folder.
    """
    start = _common_folder(paths)
    for folder in (start, *start.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file() and _has_table(candidate):
            return candidate
        if (folder / ".git").exists():
            return None
    return None


def _common_folder(paths: list[Path]) -> Path:
    # os.path.realpath, unlike Path.resolve on Python < 3.13, never raises on a symlink loop.
    resolved = [Path(os.path.realpath(p)) for p in paths] or [Path(os.path.realpath(Path.cwd()))]
    folders = [p if p.is_dir() else p.parent for p in resolved]
    return Path(os.path.commonpath([str(f) for f in folders]))


def _default_root(paths: list[Path]) -> Path:
    """Without a configuration, patterns are relative to the cwd when it holds every path."""
    cwd = Path(os.path.realpath(Path.cwd()))
    common = _common_folder(paths)
    return cwd if common == cwd or cwd in common.parents else common


def _has_table(pyproject: Path) -> bool:
    try:
        data = pyproject.read_bytes()
    except OSError:
        return False
    # Cheap test first: most pyproject.toml files never mention us.
    return b"ampmigrate" in data and "ampmigrate" in _read_toml(pyproject).get("tool", {})


def _read_toml(pyproject: Path) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on Python 3.10 only
        import tomli as tomllib
    try:
        with pyproject.open("rb") as stream:
            return tomllib.load(stream)
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise ConfigError(f"{pyproject}: {error}") from None


def load_file_settings(pyproject: Path) -> FileSettings:
    """Read and validate the [tool.ampmigrate] table of ``pyproject``."""
    table = _read_toml(pyproject).get("tool", {}).get("ampmigrate", {})
    where = f"{pyproject}: [tool.ampmigrate]"
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be a table")
    unknown = sorted(set(table) - _KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(_KEYS))}")
    select = table.get("select")
    return FileSettings(
        path=pyproject,
        exclude=_string_list(table, "exclude", where),
        extend_exclude=_string_list(table, "extend-exclude", where) or (),
        respect_gitignore=_boolean(table, "respect-gitignore", where),
        device=validate_device(table["device"], where) if "device" in table else None,
        dtype=validate_dtype(table["dtype"], where) if "dtype" in table else None,
        scaler_name=(validate_scaler_name(table["scaler-name"], where) if "scaler-name" in table else None),
        select=(frozenset(_string_list(table, "select", where) or ()) if select is not None else None),
        fused=_boolean(table, "fused", where),
    )


def _string_list(table: dict[str, Any], key: str, where: str) -> tuple[str, ...] | None:
    if key not in table:
        return None
    value = table[key]
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ConfigError(f"{where}: {key} must be a list of strings")
    return tuple(value)


def _boolean(table: dict[str, Any], key: str, where: str) -> bool | None:
    if key not in table:
        return None
    if not isinstance(table[key], bool):
        raise ConfigError(f"{where}: {key} must be true or false")
    return bool(table[key])


def validate_device(value: object, where: str = "--device") -> str:
    if not isinstance(value, str) or not _DEVICE.match(value):
        raise ConfigError(f"{where}: device must be a torch device type such as 'cuda' or 'cpu', got {value!r}")
    return value


def validate_dtype(value: object, where: str = "--dtype") -> str:
    if value not in DTYPES:
        raise ConfigError(f"{where}: dtype must be one of {', '.join(DTYPES)}, got {value!r}")
    return str(value)


def validate_scaler_name(value: object, where: str = "--scaler-name") -> str:
    if not isinstance(value, str) or not value.isidentifier():
        raise ConfigError(f"{where}: scaler-name must be a Python identifier, got {value!r}")
    return value


def build_config(
    paths: list[Path],
    *,
    write: bool = False,
    check: bool = False,
    diff: bool | None = None,
    output_format: OutputFormat = OutputFormat.TEXT,
    jobs: int | None = None,
    color: bool | None = None,
    report_path: Path | None = None,
    device: str | None = None,
    dtype: str | None = None,
    scaler_name: str | None = None,
    select: frozenset[str] | None = None,
    exclude: tuple[str, ...] | None = None,
    extend_exclude: tuple[str, ...] = (),
    respect_gitignore: bool | None = None,
    fused: bool | None = None,
    cache: bool = False,
) -> Config:
    """Merge defaults, the project's [tool.ampmigrate] table and command-line values.

    ``cache`` turns the result cache on, in ``migrate.cache.default_cache_dir()``.
    """
    pyproject = find_pyproject(paths)
    settings = load_file_settings(pyproject) if pyproject else FileSettings(path=Path.cwd())
    if write and check:
        raise ConfigError("--write and --check cannot be used together")
    options = Options(
        device=(validate_device(device) if device is not None else settings.device or "cuda"),
        dtype=(validate_dtype(dtype) if dtype is not None else settings.dtype or "float16"),
        scaler_name=(
            validate_scaler_name(scaler_name)
            if scaler_name is not None
            else settings.scaler_name or DEFAULT_SCALER_NAME
        ),
        select=select if select is not None else settings.select,
        fused_optimizers=fused if fused is not None else (settings.fused if settings.fused is not None else True),
    )
    if jobs is not None and jobs < 1:
        raise ConfigError(f"--jobs must be at least 1, got {jobs}")
    return Config(
        write=write,
        check=check,
        # Plain runs print a diff; --check and --write print one only when asked.
        diff=diff if diff is not None else not (write or check),
        output_format=output_format,
        jobs=jobs or os.cpu_count() or 1,
        color=color,
        report_path=report_path,
        options=options,
        exclude=(
            exclude if exclude is not None else (settings.exclude if settings.exclude is not None else DEFAULT_EXCLUDE)
        ),
        extend_exclude=settings.extend_exclude + extend_exclude,
        respect_gitignore=(
            respect_gitignore
            if respect_gitignore is not None
            else (settings.respect_gitignore if settings.respect_gitignore is not None else True)
        ),
        project_root=pyproject.parent if pyproject else _default_root(paths),
        config_file=pyproject,
        cache_dir=_cache_dir() if cache else None,
    )


def _cache_dir() -> Path:
    from migrate.cache import default_cache_dir

    return default_cache_dir()
