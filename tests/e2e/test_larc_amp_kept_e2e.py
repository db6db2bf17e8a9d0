"""End-to-end: LARC handed to an Apex amp setup that stays (the amp module passed as a value).

Apex's ``amp.initialize`` accepts a torch optimizer or Apex's own LARC and raises TypeError on
any other wrapper, so a plain-torch LARC written beside a kept ``amp.initialize`` crashes at
start-up. The migration must keep Apex's LARC there; it then runs under the Apex shim as the
original does, with the same losses.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from shim_runs import REPO, shim_metrics, write_migration

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

SCRIPT = REPO / "fixtures" / "e2e" / "larc_amp_kept.in.py"


def test_kept_amp_setup_keeps_apex_larc_and_runs(tmp_path: Path) -> None:
    migrated = write_migration(SCRIPT, tmp_path)
    source = migrated.read_text(encoding="utf-8")
    assert "from apex.parallel.LARC import LARC" in source and "class LARC" not in source
    (tmp_path / "migrated" / "apex" / "__init__.py").unlink()  # this one runs with Apex (the shim)
    (tmp_path / "migrated" / "apex").rmdir()
    args = ["--steps", "6"]
    original = shim_metrics(SCRIPT, args, tmp_path / "original.json", original=True)
    after = shim_metrics(migrated, args, tmp_path / "migrated" / "migrated.json", original=True)
    assert after["loss"] == original["loss"] and after["weight_norm"] == original["weight_norm"]
