"""Why migrate.halving_helpers proves no helper that wraps its halved model in DistributedDataParallel:
the caller's ``model.float()`` would come after the wrap, and torch's DDP built over float16
parameters and made float32 afterwards no longer all-reduces their gradients; DataParallel, which
replicates its module anew at each forward, keeps working."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _worker(rank: int, store: str, results: Any) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        grads = {}
        for case in ("float_then_wrap", "half_wrap_then_float"):
            torch.manual_seed(0)
            model = torch.nn.Linear(4, 2).half()
            if case == "float_then_wrap":
                wrapped = torch.nn.parallel.DistributedDataParallel(model.float())
            else:
                wrapped = torch.nn.parallel.DistributedDataParallel(model)
                wrapped.float()
            torch.manual_seed(1 + rank)
            x = torch.randn(3, 4)
            wrapped(x).pow(2).sum().backward()
            assert model.weight.grad is not None
            grads[case] = model.weight.grad.clone()
        torch.manual_seed(0)
        local = torch.nn.Linear(4, 2).half().float()
        torch.manual_seed(1 + rank)
        local(torch.randn(3, 4)).pow(2).sum().backward()
        assert local.weight.grad is not None
        grads["local"] = local.weight.grad.clone()
        results[rank] = grads
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_ddp_made_float32_after_the_wrap_stops_averaging_gradients(tmp_path: Path) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    manager = mp.Manager()
    results = manager.dict()
    mp.spawn(_worker, args=(str(tmp_path / "store"), results), nprocs=2, join=True)
    mean = (results[0]["local"] + results[1]["local"]) / 2
    assert not torch.allclose(results[0]["local"], results[1]["local"])
    for rank in (0, 1):
        torch.testing.assert_close(results[rank]["float_then_wrap"], mean)
        # the fact the proof relies on: each process keeps its own gradient
        torch.testing.assert_close(results[rank]["half_wrap_then_float"], results[rank]["local"])


def test_data_parallel_made_float32_after_the_wrap_computes_in_float32() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2).half()
    wrapped = torch.nn.DataParallel(model)
    wrapped.float()
    out = wrapped(torch.randn(3, 4))
    assert out.dtype == torch.float32
    out.sum().backward()
    assert model.weight.grad is not None and model.weight.grad.dtype == torch.float32
