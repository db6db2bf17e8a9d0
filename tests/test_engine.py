"""The pure engine: behaviours that fixture pairs cannot show on their own."""

from __future__ import annotations

import libcst as cst
import pytest

import migrate.engine
import migrate.rules
from migrate.engine import InternalError, SourceSyntaxError, migrate_source
from migrate.findings import CODES
from migrate.options import Options
from migrate.rules import RulesOutcome

BASIC = """\
import torch
from apex import amp

model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
for x, y in loader:
    loss = criterion(model(x), y)
    optimizer.zero_grad()
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()
"""


def test_file_without_apex_is_returned_untouched() -> None:
    source = "import torch\n\n\ndef f(x):  # a comment\n    return x*2\n"
    result = migrate_source(source)
    assert result.source is source
    assert not result.changed and result.findings == ()


def test_a_removed_first_import_leaves_no_blank_line_at_the_top() -> None:
    source = (
        "from apex.parallel import DistributedDataParallel as DDP\n\nimport torch\n\nm = DDP(torch.nn.Linear(2, 2))\n"
    )
    result = migrate_source(source)
    assert result.source.startswith("import torch\n")


def test_crlf_line_endings_survive() -> None:
    result = migrate_source(BASIC.replace("\n", "\r\n"))
    assert result.changed
    assert "\r\n" in result.source
    assert "\n" not in result.source.replace("\r\n", "")


def test_syntax_error_names_the_position() -> None:
    with pytest.raises(SourceSyntaxError) as caught:
        migrate_source("from apex import amp\ndef broken(:\n")
    assert caught.value.line == 2


def test_output_that_does_not_compile_is_an_internal_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_rules(module, source, options):
        broken = cst.Module(body=[cst.SimpleStatementLine([cst.Return()])])
        return RulesOutcome(broken, [], amp_left=False, amp_migrated=False)

    monkeypatch.setattr(migrate.engine, "run_rules", broken_rules)
    with pytest.raises(InternalError):
        migrate_source("from apex import amp\n")


def test_scaler_name_option_and_clash_avoidance() -> None:
    assert "amp_scaler = torch.amp.GradScaler" in migrate_source(BASIC, Options(scaler_name="amp_scaler")).source
    clashing = BASIC.replace("import torch\n", "import torch\nscaler = object()\n")
    result = migrate_source(clashing).source
    assert "grad_scaler = torch.amp.GradScaler" in result
    assert "scaler = object()" in result


def test_device_and_dtype_options() -> None:
    result = migrate_source(BASIC, Options(device="xpu", dtype="bfloat16")).source
    assert 'torch.amp.GradScaler("xpu")' in result
    assert 'torch.autocast("xpu", dtype=torch.bfloat16)' in result


def test_select_limits_the_rules() -> None:
    source = "import torch\nwith torch.cuda.amp.autocast():\n    pass\n" + BASIC.split("\n", 1)[1]
    result = migrate_source(source, Options(select=frozenset({"torch_cuda_amp"})))
    assert 'torch.autocast("cuda", dtype=torch.float16)' in result.source
    assert "amp.initialize" in result.source


def test_file_level_skip_comment() -> None:
    result = migrate_source("# ampmigrate: skip\n" + BASIC)
    assert result.skipped and not result.changed
    assert [f.code for f in result.findings] == ["AMP050"]


def test_line_level_skip_comment_leaves_that_construct() -> None:
    source = (
        "import torch\nwith torch.cuda.amp.autocast():  # ampmigrate: skip\n    pass\nx = torch.cuda.amp.GradScaler()\n"
    )
    result = migrate_source(source)
    assert "torch.cuda.amp.autocast():  # ampmigrate: skip" in result.source
    assert 'torch.amp.GradScaler("cuda")' in result.source
    assert "AMP050" in [f.code for f in result.findings]


def test_update_follows_the_last_step_of_two_optimizers() -> None:
    source = """\
from apex import amp
[g, d], [opt_g, opt_d] = amp.initialize([g, d], [opt_g, opt_d])
for z in loader:
    loss_d = d(g(z))
    with amp.scale_loss(loss_d, opt_d) as s:
        s.backward()
    opt_d.step()
    loss_g = d(g(z))
    with amp.scale_loss(loss_g, opt_g) as s:
        s.backward()
    opt_g.step()
"""
    lines = migrate_source(source).source.splitlines()
    assert lines.count("    scaler.update()") == 1
    assert lines.index("    scaler.update()") == lines.index("    scaler.step(opt_g)") + 1
    assert "    scaler.step(opt_d)" in lines


def test_unscale_precedes_clipping() -> None:
    source = BASIC.replace(
        "    optimizer.step()\n",
        "    torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), 1.0)\n    optimizer.step()\n",
    )
    lines = migrate_source(source).source.splitlines()
    unscale = lines.index("    scaler.unscale_(optimizer)")
    assert lines[unscale + 1].lstrip().startswith("torch.nn.utils.clip_grad_norm_(")
    assert "optimizer.param_groups" in lines[unscale + 1]


def test_not_apex_amp_is_left_alone() -> None:
    source = "from mxnet.contrib import amp\namp.init()\nwith amp.scale_loss(loss, trainer) as s:\n    s.backward()\n"
    result = migrate_source(source)
    assert not result.changed and result.findings == ()


def test_a_parameter_named_amp_shadows_the_import() -> None:
    source = """\
from apex import amp

def train(loss, optimizer, amp=None):
    with amp.scale_loss(loss, optimizer) as s:
        s.backward()
"""
    result = migrate_source(source)
    assert "with amp.scale_loss(loss, optimizer) as s:" in result.source


def test_inference_only_initialize_is_removed_and_reported() -> None:
    result = migrate_source("from apex import amp\nmodel = amp.initialize(model, opt_level='O1')\n")
    assert result.source.strip() == ""
    assert [f.code for f in result.findings] == ["AMP011"]


def test_every_finding_code_is_documented() -> None:
    for code, entry in CODES.items():
        assert code.startswith("AMP") and len(code) == 6
        assert entry.summary and entry.what_to_do


@pytest.mark.parametrize("rule", migrate.rules.RULES, ids=migrate.rules.RULE_NAMES)
def test_rules_document_themselves(rule) -> None:
    doc = rule.__doc__ or ""
    assert doc.startswith(f"{rule.RULE}: ")
    for section in ("What it rewrites", "Before::", "After::", "References"):
        assert section in doc, f"{rule.RULE} lacks {section!r}"


def test_rendering_reuses_input_text_exactly() -> None:
    """Untouched statements come from the input text; the result must be libcst's own."""
    from pathlib import Path

    from migrate.rules import run_rules
    from migrate.rules._render import render

    for case in sorted((Path(__file__).resolve().parent.parent / "fixtures").glob("*/*.in.py")):
        source = case.read_text(encoding="utf-8")
        module = cst.parse_module(source)
        updated = run_rules(module, source, Options()).module
        if updated is not module:
            assert render(module, updated, source) == updated.code, case.name


def test_a_substitute_never_drops_an_edit_made_inside_it() -> None:
    """``Plan.substitute`` writes a node built from the original: if another rule edited
    something inside it, applying it raises (the file fails, unchanged) instead of losing it."""
    from migrate.rules._plan import LostEditError, Plan

    original = cst.parse_expression("f(g(x))")
    assert isinstance(original, cst.Call)
    replacement = cst.parse_expression("h(g(x))")
    plan = Plan()
    plan.substitute(original, replacement)
    assert plan.replace[original](original) is replacement
    assert plan.replace[original](original.deep_clone()) is replacement  # equal, not edited
    edited_inside = original.with_changes(args=[cst.Arg(cst.parse_expression("k(x)"))])
    with pytest.raises(LostEditError):
        plan.replace[original](edited_inside)
