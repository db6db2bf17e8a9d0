"""No expected output uses a name its input did not define.

A migration that writes ``scaler.is_enabled()`` in a method where only ``self.scaler`` exists
compiles, passes a second pass unchanged, and fails with NameError on its first step. The
fixture harness cannot see that; ruff's undefined-name checks can, over every expected output
(``.out.py`` and project ``out/`` trees) against its input.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
# F405: a name that may come from a star import, which the migration may remove
_CODES = "F821,F823,F405"
_QUOTED = re.compile(r"`([^`]+)`")


def _undefined_by_file() -> dict[Path, set[str]]:
    command = [sys.executable, "-m", "ruff", "check", "--isolated", "--no-cache", "--exit-zero"]
    command += ["--select", _CODES, "--output-format", "json", str(FIXTURES)]
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    names: dict[Path, set[str]] = defaultdict(set)
    for finding in json.loads(result.stdout):
        quoted = _QUOTED.search(finding["message"])
        if quoted:
            names[Path(finding["filename"]).resolve()].add(quoted.group(1))
    return names


def _input_of(output: Path) -> Path | None:
    if output.name.endswith(".out.py"):
        return output.with_name(output.name[: -len(".out.py")] + ".in.py")
    parts = output.relative_to(FIXTURES).parts
    if "out" in parts:
        index = parts.index("out")
        return FIXTURES.joinpath(*parts[:index], "in", *parts[index + 1 :])
    return None


def test_no_expected_output_gains_an_undefined_name() -> None:
    pytest.importorskip("ruff")
    undefined = _undefined_by_file()
    gained = []
    for path, names in sorted(undefined.items()):
        source = _input_of(path)
        if source is None:
            continue
        new = names - undefined.get(source.resolve(), set())
        if new:
            gained.append(f"{path.relative_to(FIXTURES)}: {', '.join(sorted(new))}")
    assert not gained, "expected outputs use names their inputs never defined:\n" + "\n".join(gained)


def test_each_expected_output_is_compared_with_its_own_input() -> None:
    case = FIXTURES / "amp_import" / "from_apex_import_amp.out.py"
    assert _input_of(case) == FIXTURES / "amp_import" / "from_apex_import_amp.in.py"
    tree = FIXTURES / "project" / "package_reexport" / "out" / "engine" / "loop.py"
    assert _input_of(tree) == FIXTURES / "project" / "package_reexport" / "in" / "engine" / "loop.py"
    assert _input_of(FIXTURES / "amp_import" / "from_apex_import_amp.in.py") is None
