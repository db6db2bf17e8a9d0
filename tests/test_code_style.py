"""One style, enforced: the code is black-formatted, ruff-clean and mypy-clean.

The settings live in pyproject.toml; .pre-commit-config.yaml runs the same tools on commit.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *command], cwd=ROOT, capture_output=True, text=True)


def test_black_formatted() -> None:
    result = _run("black", "--check", "--quiet", ".")
    assert result.returncode == 0, f"run `black .`:\n{result.stderr}"


def test_ruff_clean() -> None:
    result = _run("ruff", "check", "--no-cache", ".")
    assert result.returncode == 0, f"run `ruff check --fix .`:\n{result.stdout}"


TORCH = importlib.util.find_spec("torch") is not None


@pytest.mark.slow
@pytest.mark.skipif(not TORCH, reason="migrate/shim is typed against torch, which is not installed")
def test_mypy_clean() -> None:
    result = _run("mypy", "--no-incremental", "migrate")
    assert result.returncode == 0, result.stdout


@pytest.mark.slow
@pytest.mark.skipif(TORCH, reason="torch is installed: test_mypy_clean checks the whole package")
def test_mypy_clean_without_torch() -> None:
    """Without torch, everything but the shim (typed against torch) is still checked."""
    result = _run("mypy", "--no-incremental", "--exclude", "migrate/shim/", "migrate")
    assert result.returncode == 0, result.stdout
