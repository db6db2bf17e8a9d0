"""The console script's fast path (``migrate.entry``): the same output and exit code as the
click command, without importing click; anything it does not handle goes to click."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from migrate import entry

ROOT = Path(__file__).resolve().parents[1]

APEX = (
    "import torch\nfrom apex import amp\n\n"
    "def train(model, optimizer, loader):\n"
    "    model, optimizer = amp.initialize(model, optimizer, opt_level='O1')\n"
    "    for x in loader:\n"
    "        loss = model(x)\n"
    "        with amp.scale_loss(loss, optimizer) as scaled:\n"
    "            scaled.backward()\n"
    "        optimizer.step()\n"
)
NEEDS_REVIEW = "import torch\nfrom apex import amp\n\namp.half_function(torch.mm, torch.bmm)\n"
CLEAN = "import torch\n\nx = torch.ones(2)  # no apex here\n"

# The program as the console script runs it, and the click command itself; each prints
# whether click was imported, last, on stderr.
_ENTRY = "from migrate.entry import run; run(prog_name='ampmigrate')"
_CLICK = "from migrate.cli import main; main(prog_name='ampmigrate')"
_PROBE = "import atexit, sys; atexit.register(lambda: print('click' in sys.modules, file=sys.stderr)); "


def _tree(folder: Path, broken: bool = True) -> Path:
    """A project; without ``broken``, one whose Apex setup migrates (nothing refuses it)."""
    (folder / "pkg").mkdir(parents=True)
    (folder / "pkg" / "train.py").write_text(APEX)
    (folder / "pkg" / "clean.py").write_text(CLEAN)
    if broken:
        (folder / "pkg" / "review.py").write_text(NEEDS_REVIEW)
        (folder / "pkg" / "broken.py").write_text("from apex import amp\ndef (:\n")
    return folder


def _run(program: str, args: list[str], cwd: Path, **env: str) -> tuple[int, str, str, bool]:
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "AMPMIGRATE_CACHE_DIR": str(cwd / ".cache"), **env}
    completed = subprocess.run(
        [sys.executable, "-c", _PROBE + program, *args],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        check=False,
    )
    *stderr, imported = completed.stderr.splitlines(keepends=True)
    return completed.returncode, completed.stdout, "".join(stderr), imported.strip() == "True"


@pytest.mark.parametrize(
    "args",
    [
        ["pkg"],
        ["--check", "pkg"],
        ["pkg", "--diff", "--no-cache"],
        ["--check", "pkg/clean.py"],
        ["--check", "pkg/clean.py", "pkg/review.py"],
        ["--check", "missing.py"],
        ["migrate", "--check"],  # "migrate" is a path like any other
    ],
)
def test_the_fast_path_prints_what_click_prints_without_importing_click(tmp_path: Path, args: list[str]) -> None:
    fast = _run(_ENTRY, args, _tree(tmp_path / "a"))
    slow = _run(_CLICK, args, _tree(tmp_path / "b"))
    assert fast[:3] == slow[:3]
    assert not fast[3] and slow[3]


def test_the_fast_path_writes_as_click_does(tmp_path: Path) -> None:
    fast_tree, slow_tree = _tree(tmp_path / "a", broken=False), _tree(tmp_path / "b", broken=False)
    fast = _run(_ENTRY, ["--write", "pkg"], fast_tree)
    slow = _run(_CLICK, ["--write", "pkg"], slow_tree)
    assert fast[:3] == slow[:3] and fast[0] == 0
    assert (fast_tree / "pkg" / "train.py").read_text() == (slow_tree / "pkg" / "train.py").read_text() != APEX
    assert not fast[3]


@pytest.mark.parametrize(
    "args",
    [
        ["--check", "--write", "pkg"],  # refused by the configuration: a usage error
        ["-j", "1", "--check", "pkg"],
        ["--output-format", "json", "pkg"],
        ["--help"],
        [],
        ["verify", "--help"],
        ["--check", "--", "pkg"],
    ],
)
def test_other_command_lines_go_to_click(tmp_path: Path, args: list[str]) -> None:
    fast = _run(_ENTRY, args, _tree(tmp_path / "a"))
    slow = _run(_CLICK, args, _tree(tmp_path / "b"))
    assert fast == slow
    assert fast[3]  # click handled it


def test_shell_completion_goes_to_click(tmp_path: Path) -> None:
    fast = _run(_ENTRY, ["pkg"], _tree(tmp_path), _AMPMIGRATE_COMPLETE="bash_complete", COMP_WORDS="", COMP_CWORD="0")
    assert fast[3]


def test_simple_command_lines() -> None:
    assert entry._simple(["--check", "a.py", "b"]) == (["a.py", "b"], {"check"})
    assert entry._simple(["--write", "--no-cache", "--diff", "x"]) == (["x"], {"write", "no_cache", "diff"})
    for args in ([], ["--check"], ["verify", "a", "b"], ["-j2", "a"], ["a", "-"], ["a", ""], ["--color", "a"]):
        assert entry._simple(args) is None


def test_echo_strips_colours_as_click_does(capsys: pytest.CaptureFixture[str]) -> None:
    import click

    coloured = click.style("+x", fg="green")
    for color in (None, False, True):
        entry.echo(coloured, color=color)
        ours = capsys.readouterr().out
        click.echo(coloured, color=color)
        assert ours == capsys.readouterr().out
    entry.echo("", nl=False, err=True)
    assert capsys.readouterr().err == ""
