"""A project's own copy of apex.fp16_utils: recognised by its shape, migrated like Apex's, or left
with a finding that says why (see also fixtures/project/local_fp16_copy and fp16_lookalike)."""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import pytest

from migrate.apex_copies import scan
from migrate.config import Config
from migrate.engine import migrate_source
from migrate.project import summarize, summary_from_json, summary_to_json
from migrate.runner import Status, run

COPY = Path(__file__).resolve().parent.parent / "fixtures" / "project" / "local_fp16_copy" / "in"

SCRIPT = """\
import torch
from fp16 import FP16_Module, FP16_Optimizer


def train(model, loader):
    model = FP16_Module(model.cuda())
    optimizer = FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), static_loss_scale=128.0)
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda())
        optimizer.zero_grad()
        optimizer.backward(loss)
        optimizer.step()
"""


def _project(tmp_path: Path, script: str = SCRIPT, edit: tuple[str, str, str] | None = None) -> Path:
    """The fixture's copy (``fp16/``) beside ``train.py``; ``edit``: (file, old, new) in the copy."""
    root = tmp_path / "project"
    shutil.copytree(COPY / "fp16", root / "fp16")
    (root / "train.py").write_text(script)
    if edit is not None:
        name, old, new = edit
        text = (root / "fp16" / name).read_text()
        assert old in text
        (root / "fp16" / name).write_text(text.replace(old, new))
    return root


def _review(root: Path, *paths: Path) -> tuple[str, list[str]]:
    """(train.py's text after the run, its findings as ``CODE message``)."""
    results = run(list(paths) or [root], Config(write=True, jobs=1))
    result = next(r for r in results if Path(r.path).name == "train.py")
    assert result.status is not Status.FAILED, result.error
    return (root / "train.py").read_text(), [f"{d.code} {d.message}" for d in result.diagnostics]


def test_scan_finds_the_apex_shaped_definitions() -> None:
    found = {}
    for name in ("fp16.py", "loss_scaler.py", "fp16util.py"):
        found.update(scan(ast.parse((COPY / "fp16" / name).read_text())))
    kinds = {name: definition["kind"] for name, definition in found.items()}
    assert kinds == {
        "FP16_Module": "wrapper",
        "FP16_Optimizer": "optimizer",
        "LossScaler": "static_scaler",
        "DynamicLossScaler": "dynamic_scaler",
        "to_python_float": "to_python_float",
        "clip_grad_norm": "torch_clip",
    }
    assert found["FP16_Optimizer"]["static"] == "LossScaler"
    assert found["FP16_Optimizer"]["dynamic"][0] == "DynamicLossScaler"
    assert found["FP16_Optimizer"]["clip"] == "clip_grad_norm"


@pytest.mark.parametrize(
    "old, new",
    [
        ("static_loss_scale=1.0,", "static_loss_scale=128.0,"),  # another default scale
        ("def clip_master_grads(self, max_norm, norm_type=2):", "def clip_norm(self, max_norm, norm_type=2):"),
        ("dynamic_loss_args=None)", "dynamic_loss_args=None, mpu=None)"),  # another constructor
        ("    @property\n    def loss_scale(self):", "    def loss_scale(self):"),
    ],
    ids=["default_scale", "no_clip_master_grads", "extra_parameter", "loss_scale_not_a_property"],
)
def test_scan_leaves_out_an_optimizer_of_another_shape(old: str, new: str) -> None:
    text = (COPY / "fp16" / "fp16.py").read_text()
    assert old in text
    assert "FP16_Optimizer" not in scan(ast.parse(text.replace(old, new)))


def test_scan_leaves_out_a_wrapper_that_does_not_halve() -> None:
    text = (COPY / "fp16" / "fp16.py").read_text().replace("module.half())", "module)")
    assert "FP16_Module" not in scan(ast.parse(text))


def test_a_clip_bound_to_something_else_on_one_path_is_not_torch_s() -> None:
    source = "import torch\nimport mpu\nif mpu.ready:\n    clip_grad_norm = mpu.clip_grad_norm\nelse:\n"
    source += "    clip_grad_norm = torch.nn.utils.clip_grad_norm_\n"
    assert "clip_grad_norm" not in scan(ast.parse(source))


def test_summary_with_copy_facts_round_trips_through_json() -> None:
    path = str(COPY / "fp16" / "fp16.py")
    summary = summarize(path, (COPY / "fp16" / "fp16.py").read_text())
    assert summary is not None and summary.apex_defs
    assert summary_from_json(path, json.loads(json.dumps(summary_to_json(summary)))) == summary


def test_static_setup_from_the_copy_migrates(tmp_path: Path) -> None:
    root = _project(tmp_path)
    text, findings = _review(root)
    assert "FP16_" not in text and "GradScaler" in text and "torch.autocast" in text
    assert any(f.startswith("AMP041 FP16_Optimizer (") and "a local copy of apex" in f for f in findings)
    assert (root / "fp16" / "fp16.py").read_text() == (COPY / "fp16" / "fp16.py").read_text()


def test_static_setup_at_module_level_migrates(tmp_path: Path) -> None:
    # the names the copy's import binds stay the copy's where the script uses them at its top level
    script = "\n".join(
        line[4:] if line.startswith("    ") else line
        for line in SCRIPT.replace("def train(model, loader):\n", "model, loader = build()\n").splitlines()
    )
    text, findings = _review(_project(tmp_path, script + "\n"))
    assert "FP16_" not in text and "GradScaler" in text and "torch.autocast" in text
    assert any(f.startswith("AMP041 FP16_Optimizer (") and "a local copy of apex" in f for f in findings)


def test_model_parallel_clip_leaves_the_setup(tmp_path: Path) -> None:
    old = "clip_grad_norm = torch.nn.utils.clip_grad_norm_\n"
    root = _project(
        tmp_path, edit=("fp16util.py", old, "def clip_grad_norm(params, max_norm, norm_type=2):\n    pass\n")
    )
    text, findings = _review(root)
    assert text == SCRIPT
    assert len([f for f in findings if f.startswith("AMP040")]) == 1
    assert any("its clip_master_grads clips with `clip_grad_norm`" in f for f in findings), findings


def test_another_name_from_the_copy_in_use_leaves_the_setup(tmp_path: Path) -> None:
    script = SCRIPT.replace("FP16_Module, FP16_Optimizer", "FP16_Module, FP16_Optimizer, fp32_to_fp16")
    script = script.replace("model(x.cuda())", "model(fp32_to_fp16(x.cuda()))")
    root = _project(tmp_path, script)
    text, findings = _review(root)
    assert text == script
    assert any("also uses `fp32_to_fp16` from the copy" in f for f in findings), findings


def test_single_file_names_the_copy_to_include(tmp_path: Path) -> None:
    root = _project(tmp_path)
    text, findings = _review(root, root / "train.py")
    assert text == SCRIPT
    assert any("fp16.py, which holds the copy, was not given" in f for f in findings), findings


def test_without_project_facts_a_copy_like_import_is_reported_and_left() -> None:
    result = migrate_source(SCRIPT)
    assert result.source == SCRIPT
    assert [f.code for f in result.findings] == ["AMP040"]
    assert "did not read" in result.findings[0].message


def test_library_fp16_optimizer_is_no_copy() -> None:
    source = SCRIPT.replace("from fp16 import", "from deepspeed.runtime.fp16.fused_optimizer import")
    result = migrate_source(source)
    assert result.source == source and not result.findings


def test_star_import_of_the_copy_is_reported_and_left(tmp_path: Path) -> None:
    script = SCRIPT.replace("from fp16 import FP16_Module, FP16_Optimizer", "from fp16 import *")
    root = _project(tmp_path, script)
    text, findings = _review(root)
    assert text == script
    assert any("comes through `from fp16 import *`" in f for f in findings), findings


def test_model_halved_in_another_function_leaves_the_setup(tmp_path: Path) -> None:
    script = SCRIPT.replace(
        "def train(model, loader):\n    model = FP16_Module(model.cuda())\n",
        "def build(model):\n    return FP16_Module(model.cuda())\n\n\ndef train(model, loader):\n    model = build(model)\n",
    )
    root = _project(tmp_path, script)
    text, findings = _review(root)
    assert text == script
    assert any("line 6 makes the model float16 (`FP16_Module`) in another function" in f for f in findings), findings


def test_model_halved_in_another_module_leaves_the_setup(tmp_path: Path) -> None:
    script = SCRIPT.replace("from fp16 import FP16_Module, FP16_Optimizer", "from fp16 import FP16_Optimizer")
    script = script.replace("import torch\n", "import torch\nfrom models import build\n")
    script = script.replace("model = FP16_Module(model.cuda())", "model = build(model)")
    root = _project(tmp_path, script)
    (root / "models.py").write_text(
        "from fp16 import FP16_Module\n\n\ndef build(model):\n    return FP16_Module(model)\n"
    )
    text, findings = _review(root)
    assert text == script
    assert any("models.py makes the model float16 with `FP16_Module`" in f for f in findings), findings


def test_wrapper_without_its_own_state_dict_notes_the_key_prefix(tmp_path: Path) -> None:
    old = '    def state_dict(self, destination=None, prefix="", keep_vars=False):\n'
    old += "        return self.module.state_dict(destination=destination, prefix=prefix, keep_vars=keep_vars)\n"
    root = _project(tmp_path, edit=("fp16.py", old, ""))
    text, findings = _review(root)
    assert "FP16_Module" not in text
    assert any(f.startswith("AMP041 FP16_Module (") and "lose the `module.` prefix" in f for f in findings), findings
    # the fixture's copy delegates its state_dict to the child: the keys do not change
    text, findings = _review(_project(tmp_path / "delegating"))
    assert not any("prefix" in f for f in findings), findings


DYNAMIC_SCRIPT = SCRIPT.replace("static_loss_scale=128.0", "dynamic_loss_scale=True{args}")


def test_pre2019_dynamic_scaler_becomes_a_scaler_from_its_start_with_a_floor(tmp_path: Path) -> None:
    root = _project(tmp_path, DYNAMIC_SCRIPT.format(args=', dynamic_loss_args={"scale_window": 500}'))
    text, findings = _review(root)
    assert 'torch.amp.GradScaler("cuda", init_scale=4294967296.0, growth_interval=500)' in text
    assert "if scaler.get_scale() < 1.0:\n            scaler.update(new_scale=1.0)" in text
    assert "FP16_Optimizer" not in text and [f.split()[0] for f in findings] == ["AMP041"]


@pytest.mark.parametrize(
    "edit, args, why",
    [
        # Megatron's copies: hysteresis and a configurable floor
        (
            (
                "loss_scaler.py",
                "scale_window=1000):",
                "scale_window=1000, min_scale=1, delayed_shift=1):",
            ),
            "",
            "pre-2019 fp16_utils DynamicLossScaler",
        ),
        # no floor of 1
        (
            ("loss_scaler.py", "max(self.cur_scale / self.scale_factor, 1)", "self.cur_scale / self.scale_factor"),
            "",
            "pre-2019 fp16_utils DynamicLossScaler",
        ),
        # another factor: GradScaler would halve and double
        (None, ', dynamic_loss_args={"scale_factor": 4}', "scale_factor=4.0"),
    ],
)
def test_other_dynamic_scalers_stay(tmp_path: Path, edit: tuple[str, str, str] | None, args: str, why: str) -> None:
    root = _project(tmp_path, DYNAMIC_SCRIPT.format(args=args), edit)
    text, findings = _review(root)
    assert text == DYNAMIC_SCRIPT.format(args=args)
    assert any(f.startswith("AMP040") and why in f for f in findings), findings


def test_pre2019_dynamic_scale_chosen_at_run_time_follows_the_test(tmp_path: Path) -> None:
    """The copy's pre-2019 schedule where the run-time test holds (start 2**32, window 1000, a floor
    of 1), its static default of 1.0 held where it fails."""
    script = SCRIPT.replace("def train(model, loader):", "def train(model, loader, dynamic):").replace(
        "static_loss_scale=128.0", "dynamic_loss_scale=dynamic"
    )
    root = _project(tmp_path, script)
    text, findings = _review(root)
    assert (
        'scaler = torch.amp.GradScaler("cuda", init_scale=4294967296.0 if dynamic else 1.0, growth_interval=1000)'
        in text
    )
    assert "scaler.update(new_scale=None if dynamic else 1.0)" in text
    assert "if dynamic and scaler.get_scale() < 1.0:\n            scaler.update(new_scale=1.0)" in text
    assert "FP16_Optimizer" not in text
    assert any(f.startswith("AMP002") for f in findings), findings
