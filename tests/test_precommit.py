"""The pre-commit hooks, installed from this repository by pre-commit itself."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
AUTOCAST = "import torch\n\nwith torch.cuda.amp.autocast():\n    y = 1\n"
MIGRATED = 'import torch\n\nwith torch.autocast("cuda", dtype=torch.float16):\n    y = 1\n'
CLEAN = "import torch\n\nx = torch.ones(2)\n"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("git") is None, reason="needs git"),
    pytest.mark.skipif(not (ROOT / ".git").exists(), reason="needs this project as a git checkout"),
]


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A git repository whose .pre-commit-config.yaml uses this project's hooks at HEAD.

    pre-commit installs the hooks from the committed tree, as it would from a tag.
    """
    path = tmp_path_factory.mktemp("precommit")
    git("init", "-q", cwd=path)
    head = git("rev-parse", "HEAD", cwd=ROOT)
    (path / ".pre-commit-config.yaml").write_text(
        f"repos:\n  - repo: {ROOT}\n    rev: {head}\n    hooks:\n      - id: ampmigrate\n      - id: ampmigrate-check\n"
    )
    git("add", ".pre-commit-config.yaml", cwd=path)
    return path


def pre_commit(repo: Path, hook: str, *files: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PRE_COMMIT_HOME": str(repo.parent / "pre-commit-home")}
    env.pop("PYTHONPATH", None)  # the hook must run from its own installed environment
    return subprocess.run(
        [sys.executable, "-m", "pre_commit", "run", hook, "--files", *files],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_check_hook_fails_on_apex_file_and_passes_on_clean_file(repo: Path) -> None:
    (repo / "train.py").write_text(AUTOCAST)
    (repo / "clean.py").write_text(CLEAN)
    git("add", "train.py", "clean.py", cwd=repo)
    failing = pre_commit(repo, "ampmigrate-check", "train.py")
    assert failing.returncode == 1, failing.stdout + failing.stderr
    assert "would migrate train.py" in failing.stdout
    assert (repo / "train.py").read_text() == AUTOCAST
    passing = pre_commit(repo, "ampmigrate-check", "clean.py")
    assert passing.returncode == 0, passing.stdout + passing.stderr


def test_check_hook_runs_on_notebooks(repo: Path) -> None:
    cell = {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": []}
    notebook = {
        "cells": [{**cell, "source": AUTOCAST.splitlines(keepends=True)}],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    (repo / "train.ipynb").write_text(json.dumps(notebook, indent=1) + "\n")
    git("add", "train.ipynb", cwd=repo)
    result = pre_commit(repo, "ampmigrate-check", "train.ipynb")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "would migrate train.ipynb" in result.stdout


def test_rewrite_hook_migrates_and_fails_the_commit_then_passes(repo: Path) -> None:
    (repo / "train2.py").write_text(AUTOCAST)
    (repo / "clean2.py").write_text(CLEAN)
    git("add", "train2.py", "clean2.py", cwd=repo)
    rewriting = pre_commit(repo, "ampmigrate", "train2.py", "clean2.py")
    assert rewriting.returncode == 1, rewriting.stdout + rewriting.stderr
    assert "files were modified by this hook" in rewriting.stdout
    assert (repo / "train2.py").read_text() == MIGRATED
    assert (repo / "clean2.py").read_text() == CLEAN
    assert pre_commit(repo, "ampmigrate", "train2.py", "clean2.py").returncode == 0
    assert pre_commit(repo, "ampmigrate-check", "train2.py", "clean2.py").returncode == 0


def test_no_matching_files_is_a_clean_no_op(repo: Path) -> None:
    (repo / "notes.txt").write_text("apex amp\n")
    git("add", "notes.txt", cwd=repo)
    result = pre_commit(repo, "ampmigrate-check", "notes.txt")
    assert result.returncode == 0
    assert "no files to check" in result.stdout.lower()
