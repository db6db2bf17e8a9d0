"""One style, enforced: the code is black-formatted, ruff-clean and mypy-clean.

The settings live in pyproject.toml; .pre-commit-config.yaml runs the same tools on commit.
"""

from __future__ import annotations

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


@pytest.mark.slow
def test_mypy_clean() -> None:
    result = _run("mypy", "--no-incremental", "migrate")
    assert result.returncode == 0, result.stdout
