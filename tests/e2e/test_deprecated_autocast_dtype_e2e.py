"""e2e: a deprecated ``torch.cpu.amp.autocast()`` nested in an autocast of another dtype keeps
its own dtype once migrated.

``torch.cpu.amp.autocast()`` defaulted to bfloat16 (``torch.cuda.amp.autocast()`` to float16);
``torch.autocast("cpu")`` without a dtype takes the one in force where it is built, here the
outer float16 region's. The migration writes the old default out, so the inner block still
computes in bfloat16 and the run is the same, loss for loss.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from shim_runs import REPO, write_migration

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

SCRIPT = REPO / "fixtures" / "e2e" / "deprecated_autocast_nested.in.py"


def _run(script: Path, out: Path) -> dict:
    subprocess.run([sys.executable, "-W", "ignore", str(script), str(out)], check=True, cwd=script.parent)
    return json.loads(out.read_text(encoding="utf-8"))


def test_the_nested_block_keeps_its_dtype(tmp_path: Path) -> None:
    migrated = write_migration(SCRIPT, tmp_path)
    text = migrated.read_text(encoding="utf-8")
    assert "torch.cpu.amp" not in text and 'torch.autocast("cpu", dtype=torch.bfloat16)' in text
    original = _run(SCRIPT, tmp_path / "original.json")
    after = _run(migrated, tmp_path / "migrated.json")
    assert original["inner_dtype"] == after["inner_dtype"] == "torch.bfloat16"
    assert after["losses"] == original["losses"]
    # without the dtype written out, the inner block would have followed the outer float16 region
    loose = tmp_path / "loose.py"
    loose.write_text(text.replace('torch.autocast("cpu", dtype=torch.bfloat16)', 'torch.autocast("cpu")'))
    assert _run(loose, tmp_path / "loose.json")["inner_dtype"] == "torch.float16"
