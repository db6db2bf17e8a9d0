"""Unused Apex imports: removed from a module nobody imports them from, kept where they may be re-exported."""

from __future__ import annotations

from pathlib import Path

import pytest

from migrate.config import build_config
from migrate.engine import migrate_source
from migrate.options import ModuleFacts, Options
from migrate.runner import run

SOURCE = """\
try:
    from apex.parallel import DistributedDataParallel as Apex_DDP
    from apex.multi_tensor_apply import multi_tensor_applier
except ImportError:
    raise ImportError("Please install apex")


def build(model):
    return model
"""


def _run(exported: frozenset[str]) -> tuple[str, list[str]]:
    result = migrate_source(SOURCE, Options(facts=ModuleFacts(exported=exported)))
    return result.source, [f"{f.line}:{f.code} {f.message}" for f in result.findings]


def test_unused_names_nobody_imports_from_here_go_with_their_try() -> None:
    source, findings = _run(frozenset())
    assert "apex" not in source and "try" not in source
    assert findings == []


@pytest.mark.parametrize("exported", [frozenset({"Apex_DDP"}), frozenset({"*"})])
def test_a_name_other_modules_import_from_here_stays(exported: frozenset[str]) -> None:
    source, findings = _run(exported)
    assert "from apex.parallel import DistributedDataParallel as Apex_DDP" in source
    kept = [f for f in findings if "Apex_DDP" in f]
    assert kept and kept[0].startswith("2:AMP040") and "other modules of the project import" in kept[0]
    if exported == frozenset({"*"}):  # a star import reaches every module-level name
        assert "multi_tensor_applier" in source
    else:
        assert "multi_tensor_applier" not in source


def test_an_unused_name_inside_a_function_is_not_reachable_from_outside() -> None:
    source = "def f():\n    from apex.optimizers import FusedAdam\n    return 1\n"
    result = migrate_source(source, Options(facts=ModuleFacts(exported=frozenset({"*"}))))
    assert result.source == "def f():\n    return 1\n"


def test_a_package_init_keeps_names_its_importers_may_use(tmp_path: Path) -> None:
    """A run given a package's ``__init__.py`` cannot see the code outside the run that imports
    the package: its unused Apex names stay (with why); a plain module's go."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text(SOURCE)
    (package / "helpers.py").write_text(SOURCE)
    results = {Path(r.path).name: r for r in run([package], build_config([package], write=True))}
    assert (package / "__init__.py").read_text() == SOURCE
    assert "apex" not in (package / "helpers.py").read_text()
    kept = [d.message for d in results["__init__.py"].diagnostics if "Apex_DDP" in d.message]
    assert kept and "package's __init__.py" in kept[0]
