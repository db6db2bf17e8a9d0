"""``cuda_on_cpu`` and ``python -m migrate.shim --native``: CUDA training code runs on the CPU.

Each case runs in a fresh interpreter, because ``install()`` patches torch for the process.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="cuda_on_cpu is for machines without CUDA")

CUDA_TRAINING_SCRIPT = textwrap.dedent("""
    import json, sys
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cudnn.benchmark = True
    torch.cuda.manual_seed_all(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cuda")
    legacy_scaler = torch.cuda.amp.GradScaler()
    inputs = torch.randn(32, 8, device=device)
    targets = torch.randn(32, 1).cuda(non_blocking=True)
    # A prefetcher in the style of Apex's ImageNet example, timed with CUDA events.
    side_stream, start, end = torch.cuda.Stream(), torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    with torch.cuda.stream(side_stream):
        inputs = inputs.cuda(non_blocking=True)
    torch.cuda.current_stream().wait_stream(side_stream)
    inputs.record_stream(torch.cuda.current_stream())
    end.record()
    torch.cuda.synchronize()
    elapsed_ms = start.elapsed_time(end)
    with torch.autocast("cuda"):
        hidden = model[0](inputs)
        loss = torch.nn.functional.mse_loss(model(inputs).float(), targets)
    with torch.cuda.amp.autocast():
        legacy_dtype = str(model[0](inputs).dtype)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        explicit_dtype = str(model[0](inputs).dtype)
    with torch.autocast("cuda", enabled=False):
        disabled_dtype = str(model[0](inputs).dtype)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    torch.cuda.synchronize()
    print(json.dumps({
        "argv": sys.argv[1:],
        "name": __name__,
        "path0": sys.path[0],
        "cuda_available": torch.cuda.is_available(),
        "param_device": str(next(model.parameters()).device),
        "input_device": str(inputs.device),
        "device_type": device.type,
        "autocast_linear_dtype": str(hidden.dtype),
        "legacy_autocast_dtype": legacy_dtype,
        "explicit_dtype": explicit_dtype,
        "disabled_dtype": disabled_dtype,
        "weight_dtype": str(model[0].weight.dtype),
        "scaler_enabled": scaler.is_enabled(),
        "legacy_scaler_enabled": legacy_scaler.is_enabled(),
        "scale": scaler.get_scale(),
        "elapsed_ms": elapsed_ms,
    }))
    """)


def run_shim(script: Path, *args: str, native: bool = True) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable,
        "-m",
        "migrate.shim",
        *(["--native"] if native else []),
        str(script),
    ]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=120, check=False)


# One run of a training script (seconds), read by the tests marked slow below.
@pytest.fixture(scope="module")
def cuda_script_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    script = tmp_path_factory.mktemp("cuda") / "train_cuda.py"
    script.write_text(CUDA_TRAINING_SCRIPT)
    completed = run_shim(script, "--epochs", "1")
    assert completed.returncode == 0, completed.stderr
    report: dict[str, object] = json.loads(completed.stdout.strip().splitlines()[-1])
    report["script_dir"] = str(script.parent)
    return report


@pytest.mark.slow
def test_cuda_script_runs_as_main_with_its_arguments(
    cuda_script_report: dict[str, object],
) -> None:
    assert cuda_script_report["name"] == "__main__"
    assert cuda_script_report["argv"] == ["--epochs", "1"]
    assert cuda_script_report["path0"] == cuda_script_report["script_dir"]


@pytest.mark.slow
def test_cuda_placement_stays_on_cpu_and_keeps_cuda_code_path(
    cuda_script_report: dict[str, object],
) -> None:
    assert cuda_script_report["cuda_available"] is True
    assert cuda_script_report["device_type"] == "cuda"
    assert cuda_script_report["param_device"] == "cpu"
    assert cuda_script_report["input_device"] == "cpu"
    assert cuda_script_report["elapsed_ms"] >= 0  # streams and events exist and time


@pytest.mark.slow
def test_cuda_autocast_computes_linear_in_float16_on_cpu(
    cuda_script_report: dict[str, object],
) -> None:
    assert cuda_script_report["autocast_linear_dtype"] == "torch.float16"
    assert cuda_script_report["legacy_autocast_dtype"] == "torch.float16"
    assert cuda_script_report["weight_dtype"] == "torch.float32"


@pytest.mark.slow
def test_explicit_dtype_and_enabled_flag_are_kept(
    cuda_script_report: dict[str, object],
) -> None:
    assert cuda_script_report["explicit_dtype"] == "torch.bfloat16"
    assert cuda_script_report["disabled_dtype"] == "torch.float32"


@pytest.mark.slow
def test_cuda_grad_scalers_are_enabled_on_cpu(
    cuda_script_report: dict[str, object],
) -> None:
    assert cuda_script_report["scaler_enabled"] is True
    assert cuda_script_report["legacy_scaler_enabled"] is True
    assert cuda_script_report["scale"] in (65536.0, 32768.0)


@pytest.mark.slow
def test_script_exit_status_and_traceback_come_through(tmp_path: Path) -> None:
    failing = tmp_path / "fails.py"
    failing.write_text("import sys\nprint('before')\nraise ValueError('boom in script')\n")
    completed = run_shim(failing)
    assert completed.returncode == 1
    assert "ValueError: boom in script" in completed.stderr
    exiting = tmp_path / "exits.py"
    exiting.write_text("import sys\nsys.exit(3)\n")
    assert run_shim(exiting).returncode == 3


def test_unknown_option_is_a_usage_error(tmp_path: Path) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "migrate.shim", "--bogus", "x.py"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert completed.returncode == 2
    assert "usage:" in completed.stderr


def test_install_is_idempotent_in_one_process() -> None:
    code = (
        "import torch\n"
        "from migrate.shim import cuda_on_cpu\n"
        "cuda_on_cpu.install(); first = torch.autocast\n"
        "cuda_on_cpu.install()\n"
        "assert torch.autocast is first and cuda_on_cpu.is_installed()\n"
        "with torch.autocast('cuda'):\n"
        "    out = torch.nn.Linear(2, 2).cuda()(torch.ones(1, 2).cuda())\n"
        "assert out.dtype == torch.float16, out.dtype\n"
    )
    completed = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr


APEX_SCRIPT = textwrap.dedent("""
    import json, sys
    import torch
    from apex import amp
    from apex.optimizers import FusedAdam

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 1)).cuda()
    optimizer = FusedAdam(model.parameters(), lr=1e-2)
    model, optimizer = amp.initialize(model, optimizer, opt_level=sys.argv[1], verbosity=0)
    x, y = torch.randn(16, 4).cuda(), torch.randn(16, 1).cuda()
    for _ in range(3):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
    print(json.dumps({"weight": str(model[0].weight.dtype), "bn": str(model[1].weight.dtype),
                      "amp": amp.state_dict()["loss_scaler0"]}))
    """)


@pytest.mark.slow
def test_apex_script_runs_unmodified_under_the_shim(tmp_path: Path) -> None:
    script = tmp_path / "train_apex.py"
    script.write_text(APEX_SCRIPT)
    completed = run_shim(script, "O2", native=False)
    assert completed.returncode == 0, completed.stderr
    report = json.loads(completed.stdout.strip().splitlines()[-1])
    assert report["weight"] == "torch.float16" and report["bn"] == "torch.float32"
    assert report["amp"]["loss_scale"] <= 2.0**16
    if importlib.util.find_spec("apex") is None:  # --native installs no Apex stand-in
        native = run_shim(script, "O2", native=True)
        assert native.returncode != 0 and "No module named 'apex'" in native.stderr


DISTRIBUTED_CUDA_SCRIPT = textwrap.dedent("""
    import json, os, sys
    import torch
    import torch.distributed as dist

    overflow_buf = torch.cuda.IntTensor([0])
    torch.cuda.set_device(0)
    dist.init_process_group(backend="nccl", init_method=f"file://{sys.argv[1]}", rank=0, world_size=1)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.BatchNorm2d(4))
    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model).cuda()
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[torch.cuda.current_device()])
    out = ddp(torch.randn(2, 3, 5, 5).cuda())
    out.sum().backward()
    print(json.dumps({
        "backend": dist.get_backend(),
        "buf": [overflow_buf.device.type, str(overflow_buf.dtype)],
        "device_ids": ddp.device_ids,
        "grad": model[0].weight.grad is not None,
        "running_mean_moved": bool(model[1].running_mean.abs().sum() > 0),
    }))
    del ddp, out
    dist.destroy_process_group()
    # Gloo's worker threads can abort interpreter shutdown ("terminate called without an
    # active exception", seen once in CI): a torch teardown race, not the shim's mapping.
    sys.stdout.flush()
    os._exit(0)
""")


def test_a_one_process_nccl_ddp_script_with_sync_batchnorm_runs_on_gloo(tmp_path: Path) -> None:
    script = tmp_path / "ddp.py"
    script.write_text(DISTRIBUTED_CUDA_SCRIPT)
    completed = run_shim(script, str(tmp_path / "store"))
    assert completed.returncode == 0, completed.stderr
    report = json.loads(completed.stdout.strip().splitlines()[-1])
    assert report == {
        "backend": "gloo",
        "buf": ["cpu", "torch.int32"],
        "device_ids": None,
        "grad": True,
        "running_mean_moved": True,
    }
