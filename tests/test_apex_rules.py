"""The rules for Apex beyond amp: DDP and the rest of apex.parallel, fused optimizers and norms,
multi-tensor kernels, and the findings that tell the user what to write instead."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from migrate.cli import main
from migrate.engine import migrate_source
from migrate.options import Options

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
REVIEW_CODES = ("AMP010", "AMP032", "AMP040", "AMP042")


def messages(source: str, code: str, options: Options = Options()) -> list[str]:
    return [f.message for f in migrate_source(source, options).findings if f.code == code]


# --------------------------------------------------------------------------- findings name the code


# amp functions without a rewrite, besides what the fixtures hold
AMP_LEFTOVERS = (
    "import torch\nfrom apex import amp\n\n"
    'amp.register_half_function(torch, "bmm")\n'
    'amp.register_float_function(torch, "sigmoid")\n'
    'amp.register_promote_function(torch, "cat")\n'
    "handle = amp.init(enabled=True)\n"
    "amp.load_state_dict(a, b)\n"
    "amp.state_dict(destination)\n"
    "params = amp.master_params(opt, 1)\n"
    "model, opt = amp.initialize(model, opt, opt_levle='O1')\n\n\n"
    "@amp.half_function\ndef f(x):\n    return x\n\n\n"
    "@amp.promote_function\ndef g(x):\n    return x\n"
)


def _review_findings() -> list[tuple[str, str, str]]:
    sources = [
        (f"{case.parent.name}/{case.name}", case.read_text(encoding="utf-8"))
        for case in sorted(FIXTURES.glob("*/*.in.py"))
    ]
    found = []
    for name, source in [*sources, ("amp leftovers", AMP_LEFTOVERS)]:
        for finding in migrate_source(source).findings:
            if finding.code in REVIEW_CODES:
                found.append((name, finding.code, finding.message))
    return found


REVIEW_FINDINGS = _review_findings()


def test_the_fixtures_produce_review_findings_of_every_kind() -> None:
    assert {code for _, code, _ in REVIEW_FINDINGS} >= {"AMP032", "AMP040", "AMP042"}


@pytest.mark.parametrize("case, code, message", REVIEW_FINDINGS, ids=[f"{c}:{k}" for c, k, _ in REVIEW_FINDINGS])
def test_review_findings_give_the_code_to_write(case: str, code: str, message: str) -> None:
    assert "`" in message, f"{case}: {code} names no code to write: {message}"
    for vague in ("its torch equivalent", "unknown keyword", "by hand", "an unknown"):
        assert vague not in message, f"{case}: {code} is vague: {message}"


def test_amp_functions_without_a_rewrite_say_what_to_write() -> None:
    source = (
        "import torch\nfrom apex import amp\n\n"
        "handle = amp.init(enabled=True)\n"
        "cast = amp.float_function\n"
        "register = amp.register_half_function\n"
    )
    found = messages(source, "AMP032")
    assert any("`@amp.float_function` on a def" in m and "cast to float32" in m for m in found)
    assert any("amp.register_half_function has no automatic rewrite" in m and "float16" in m for m in found)
    # amp.init has its rule (amp_init); left out of --select, its finding says what that rule writes
    from migrate.rules import RULE_NAMES

    without_init = Options(select=frozenset(RULE_NAMES) - {"amp_init"})
    found = messages(source, "AMP032", without_init)
    assert any("amp.init has no automatic rewrite" in m and "torch.amp.GradScaler" in m for m in found)


# --------------------------------------------------------------------------- DDP

DDP_IMPORT = "import torch\nfrom apex.parallel import DistributedDataParallel as DDP\n\n\n"


def ddp_line(source: str) -> str:
    migrated = migrate_source(DDP_IMPORT + source).source
    return next(line.strip() for line in migrated.splitlines() if "DistributedDataParallel(" in line)


def test_ddp_keeps_apex_buffer_and_unused_parameter_behaviour() -> None:
    line = ddp_line("def wrap(model):\n    return DDP(model)\n")
    assert line == (
        "return torch.nn.parallel.DistributedDataParallel(model, broadcast_buffers=False, "
        "find_unused_parameters=True)"
    )


@pytest.mark.parametrize(
    "body, device",
    [
        ("    model.cuda(args.gpu)\n    model = DDP(model)\n", "args.gpu"),
        ("    model = model.cuda(device=args.local_rank)\n    model = DDP(model)\n", "args.local_rank"),
        (
            "    torch.cuda.set_device(args.local_rank)\n    model = model.cuda()\n    model = DDP(model)\n",
            "args.local_rank",
        ),
        ("    model = model.cuda().half()\n    model = DDP(model)\n", "torch.cuda.current_device()"),
        ("    model = DDP(model.cuda(args.gpu))\n", "args.gpu"),
        # where the module may be on the CPU, no device_ids (Apex took none)
        ("    model.to(device)\n    model = DDP(model)\n", None),
        ("    if args.gpu is not None:\n        model.cuda(args.gpu)\n    model = DDP(model)\n", None),
        ("    other.cuda(0)\n    model = DDP(model)\n", None),
        ("    model = DDP(model)\n    model.cuda(0)\n", None),
        # the last move counts; a set_device after .cuda() leaves the device open
        ("    model.cuda(0)\n    model.cuda(args.gpu)\n    model = DDP(model)\n", "args.gpu"),
        ("    model.cuda()\n    torch.cuda.set_device(args.gpu)\n    model = DDP(model)\n", None),
        (
            "    if args.distributed:\n        torch.cuda.set_device(args.gpu)\n    model.cuda()\n    model = DDP(model)\n",
            "torch.cuda.current_device()",
        ),
    ],
)
def test_device_ids_follow_where_the_code_put_the_module(body: str, device: str | None) -> None:
    line = ddp_line("def wrap(model, args, device, other):\n" + body)
    if device is None:
        assert "device_ids" not in line
    else:
        assert f"device_ids=[{device}]" in line


def test_message_size_becomes_bucket_cap_mb_unless_everything_is_delayed() -> None:
    assert "bucket_cap_mb=args.bucket * 4 / 2**20" in ddp_line("m = DDP(model, message_size=args.bucket)\n")
    assert "bucket_cap_mb" not in ddp_line("m = DDP(model, message_size=1e7, delay_allreduce=True)\n")


def test_gradient_average_false_registers_a_summing_hook() -> None:
    migrated = migrate_source(DDP_IMPORT + "model = DDP(model, gradient_average=False)\n").source
    assert (
        "model.register_comm_hook(None, lambda _, bucket: torch.distributed.all_reduce(bucket.buffer(), "
        "async_op=True).get_future().then(lambda fut: fut.value()[0]))"
    ) in migrated


def test_gradient_average_at_run_time_is_reported_with_the_hook() -> None:
    source = DDP_IMPORT + "model = DDP(model, gradient_average=args.avg)\n"
    assert migrate_source(source).source == source
    (message,) = messages(source, "AMP042")
    assert "register_comm_hook(None, lambda _, bucket:" in message


def test_unknown_ddp_keyword_is_named() -> None:
    (message,) = messages(DDP_IMPORT + "model = DDP(model, device_ids=[0])\n", "AMP042")
    assert "keyword device_ids" in message and "torch.nn.parallel.DistributedDataParallel(module" in message


def test_allreduce_switches_only_in_files_that_use_apex_ddp() -> None:
    assert (
        "require_backward_grad_sync = False"
        in migrate_source(DDP_IMPORT + "m = DDP(model)\nm.disable_allreduce()\n").source
    )
    plain = "class Mine:\n    def disable_allreduce(self):\n        pass\n\n\nMine().disable_allreduce()\n"
    assert migrate_source(plain).source == plain


def test_larc_helper_is_written_once_and_the_import_goes() -> None:
    source = "from apex.parallel.LARC import LARC\n\na = LARC(opt1)\nb = LARC(opt2, clip=False)\n"
    migrated = migrate_source(source).source
    assert migrated.count("class LARC:") == 1
    assert "apex" not in migrated.replace("apex.parallel.LARC in plain torch", "")
    compile(migrated, "larc", "exec")


def test_a_larc_name_taken_by_the_module_gets_a_fresh_helper_name() -> None:
    source = "import apex\n\nLARC = 3\nopt = apex.parallel.LARC(opt)\n"
    migrated = migrate_source(source).source
    assert "class grad_LARC:" in migrated and "opt = grad_LARC(opt)" in migrated and "LARC = 3" in migrated


# --------------------------------------------------------------------------- optimizers and norms


def test_fused_adam_gets_fused_true_unless_asked_not_to() -> None:
    source = "from apex.optimizers import FusedAdam, FusedSGD\n\na = FusedAdam(p, lr=1e-3)\ns = FusedSGD(p, 0.1, momentum=0.9)\n"
    fused = migrate_source(source).source
    plain = migrate_source(source, Options(fused_optimizers=False)).source
    assert "a = torch.optim.AdamW(p, lr=1e-3, weight_decay=0.0, fused=True)" in fused
    assert "a = torch.optim.AdamW(p, lr=1e-3, weight_decay=0.0)" in plain
    # torch's fused SGD moves its momentum on a step GradScaler skips: never fused
    assert "s = torch.optim.SGD(p, 0.1, momentum=0.9)" in fused


def test_no_fused_on_the_command_line_and_in_pyproject(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "train.py").write_text("from apex.optimizers import FusedAdam\nopt = FusedAdam(params)\n")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["train.py", "--no-fused"], catch_exceptions=False)
    assert "+opt = torch.optim.AdamW(params, weight_decay=0.0)\n" in result.stdout
    (tmp_path / ".git").mkdir()
    (tmp_path / "pyproject.toml").write_text("[tool.ampmigrate]\nfused = false\n")
    result = CliRunner().invoke(main, ["train.py"], catch_exceptions=False)
    assert "+opt = torch.optim.AdamW(params, weight_decay=0.0)\n" in result.stdout
    result = CliRunner().invoke(main, ["train.py", "--fused"], catch_exceptions=False)
    assert "+opt = torch.optim.AdamW(params, weight_decay=0.0, fused=True)\n" in result.stdout


@pytest.mark.parametrize(
    "call, argument, replacement",
    [
        ("FusedAdam(p, bias_correction=False)", "bias_correction=False", "torch.optim.AdamW(params"),
        ("FusedAdam(p, max_grad_norm=5.0)", "max_grad_norm", "torch.nn.utils.clip_grad_norm_(params, max_grad_norm)"),
        ("FusedAdam(p, amsgrad=True)", "amsgrad=True", "amsgrad=True)`"),
        ("FusedSGD(p, 0.1, wd_after_momentum=True)", "wd_after_momentum=True", "torch._foreach_mul_(params"),
    ],
)
def test_optimizer_arguments_without_twin_name_argument_and_replacement(
    call: str, argument: str, replacement: str
) -> None:
    source = f"from apex.optimizers import FusedAdam, FusedSGD\nopt = {call}\n"
    (message,) = messages(source, "AMP042")
    assert argument in message and replacement in message


def test_lamb_names_its_internal_clipping_norm() -> None:
    source = "from apex.optimizers import FusedLAMB\nopt = FusedLAMB(p, lr=1e-3, max_grad_norm=args.clip)\n"
    found = messages(source, "AMP040")
    assert any("max_grad_norm=args.clip" in m and "clip_grad_norm_(params, args.clip)" in m for m in found)


def test_rms_norm_eps_is_written_out_only_when_apex_used_its_default() -> None:
    source = "from apex.normalization import FusedRMSNorm, MixedFusedRMSNorm\na = FusedRMSNorm(8)\nb = MixedFusedRMSNorm(8, 1e-6)\n"
    migrated = migrate_source(source).source
    assert "a = torch.nn.RMSNorm(8, eps=1e-5)" in migrated
    assert "b = torch.nn.RMSNorm(8, 1e-6)" in migrated


# --------------------------------------------------------------------------- multi-tensor kernels

KERNEL = "import amp_C\nfrom apex.multi_tensor_apply import multi_tensor_applier\n\n\ndef f(a, b, buf):\n"


def test_a_flag_nobody_reads_goes_with_the_kernel() -> None:
    migrated = migrate_source(
        KERNEL + "    multi_tensor_applier(amp_C.multi_tensor_scale, torch.zeros(1), [a, a], 0.5)\n"
    ).source
    assert "    torch._foreach_mul_(a, 0.5)\n" in migrated and "logical_or_" not in migrated
    assert "amp_C" not in migrated and "apex" not in migrated


def test_a_flag_read_later_is_kept() -> None:
    migrated = migrate_source(
        KERNEL + "    multi_tensor_applier(amp_C.multi_tensor_scale, buf, [a, b], 1 / s)\n    return buf.item()\n"
    ).source
    assert "buf.logical_or_(torch.stack([t.isfinite().all() for t in a]).logical_not().any())" in migrated
    assert "torch._foreach_copy_(b, [t.float() * (1 / s) for t in a])" in migrated


def test_comprehension_variables_do_not_capture_the_users_names() -> None:
    migrated = migrate_source(
        KERNEL + "    t = 2.0\n    multi_tensor_applier(amp_C.multi_tensor_scale, torch.zeros(1), [a, b], t)\n"
    ).source
    assert "[t_.float() * t for t_ in a]" in migrated


def test_an_unrewritten_kernel_keeps_amp_c_and_says_what_to_write() -> None:
    source = KERNEL + "    multi_tensor_applier(amp_C.multi_tensor_adam, buf, [a], 1e-3)\n"
    assert migrate_source(source).source == source
    assert any(re.search(r"torch\.optim\.AdamW\(params, .*fused=True\)", m) for m in messages(source, "AMP040"))


# modelled on ruinmessi/ASFF main.py: a nested function uses the optimizer FP16_Optimizer wraps (zero_grad there:
# ASFF's `set_lr`, which only writes the groups' learning rates, now migrates)
NESTED_USE = """import torch
from apex.fp16_utils import FP16_Optimizer


def train(model, loader, half):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if half:
        model.half()
        optimizer = FP16_Optimizer(optimizer, verbose=False)

    def clear():
        optimizer.zero_grad()

    for step, (x, y) in enumerate(loader):
        clear()
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        if half:
            optimizer.backward(loss)
        else:
            loss.backward()
        optimizer.step()
"""


def test_a_use_that_stops_the_model_and_the_uses_is_named_once() -> None:
    result = migrate_source(NESTED_USE)
    assert result.source == NESTED_USE
    [kept] = [f.message for f in result.findings if f.code == "AMP040" and "left as it was" in f.message]
    assert kept.count("is used in a nested function") == 1, kept
