"""``apex.parallel`` under the shim in a real ``gloo`` process group, and the plain-torch helpers
the apex_parallel rule writes: both must do what Apex did."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from migrate.engine import migrate_source
from migrate.rules import apex_parallel
from migrate.shim import parallel


@pytest.fixture
def group(tmp_path: Path) -> Iterator[None]:
    """A one-process gloo group, as `torchrun --nproc_per_node=1` would give."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def helper(template: str, name: str) -> Any:
    """The helper the rule writes into a module, executed on its own."""
    namespace: dict[str, Any] = {"torch": torch}
    exec(template.format(name=name), namespace)
    return namespace[name]


class WithUnused(torch.nn.Module):
    """A model with a parameter its forward never uses (Apex accepted that)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
        self.unused = torch.nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)  # type: ignore[no-any-return]


def small_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return WithUnused()


def test_apex_ddp_is_torch_ddp_with_apex_settings_in_a_one_process_group(group: None) -> None:
    model = small_model()
    wrapped = parallel.DistributedDataParallel(model, delay_allreduce=True)
    inner = wrapped._ddp
    assert isinstance(inner, torch.nn.parallel.DistributedDataParallel)
    assert inner.find_unused_parameters
    reference = small_model()
    x = torch.randn(6, 4)
    for _ in range(2):  # a second step fails in torch DDP when unused parameters are not allowed
        wrapped(x).sum().backward()
        reference(x).sum().backward()
    for (name, param), expected in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(param.grad, expected.grad, msg=name)
    assert model.unused.weight.grad is None
    assert all(key.startswith("module.") for key in wrapped.state_dict())
    wrapped.disable_allreduce()
    assert not inner.require_backward_grad_sync
    wrapped.enable_allreduce()
    assert inner.require_backward_grad_sync


def test_apex_ddp_without_a_group_calls_the_module() -> None:
    model = small_model()
    wrapped = parallel.DistributedDataParallel(model)
    assert wrapped._ddp is None
    x = torch.randn(3, 4)
    torch.testing.assert_close(wrapped(x), model(x))


def test_shim_reducer_and_the_rules_helper_agree(group: None) -> None:
    written = helper(apex_parallel._REDUCER, "Reducer")
    for reducer_class in (parallel.Reducer, written):
        model = small_model()
        model(torch.randn(5, 4)).sum().backward()
        before = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
        reducer_class(model).reduce()  # one process: the average is the gradient itself
        for param, old in zip(model.parameters(), before):
            if old is None:
                assert param.grad is None  # a parameter without a gradient is skipped
            else:
                torch.testing.assert_close(param.grad, old, rtol=0, atol=0)
        nested = [[torch.ones(2)], (torch.full((3,), 2.0),)]
        reducer_class(nested).reduce()
        assert nested[0][0].tolist() == [1.0, 1.0] and nested[1][0].tolist() == [2.0] * 3


def test_shim_flat_dist_call_and_the_rules_helper_agree(group: None) -> None:
    written = helper(apex_parallel._FLAT_DIST_CALL, "flat_dist_call")
    for function in (parallel.flat_dist_call, written):
        tensors = [torch.arange(3.0), torch.ones(2, dtype=torch.float64)]
        function(tensors, dist.all_reduce)
        function(tensors, dist.broadcast, (0,))
        assert tensors[0].tolist() == [0.0, 1.0, 2.0] and tensors[1].dtype is torch.float64


def test_syncbn_process_groups_from_shim_and_helper(group: None) -> None:
    written = helper(apex_parallel._SYNCBN_GROUP, "create_syncbn_process_group")
    for function in (parallel.create_syncbn_process_group, written):
        assert function(0) is None
        mine = function(1)
        assert mine is not None and dist.get_world_size(mine) == 1


@pytest.mark.parametrize("clip", [True, False])
def test_the_rules_larc_steps_like_apex_larc(clip: bool) -> None:
    written = helper(apex_parallel._LARC, "LARC")
    results = []
    for larc_class in (parallel.LARC, written):
        torch.manual_seed(0)
        weight = torch.nn.Parameter(torch.randn(4, 3))
        bias = torch.nn.Parameter(torch.zeros(3))  # a zero norm: LARC leaves its gradient alone
        inner = torch.optim.SGD([weight, bias], lr=0.1, momentum=0.9, weight_decay=1e-2)
        optimizer = larc_class(inner, trust_coefficient=0.02, clip=clip)
        for step in range(4):
            optimizer.zero_grad()
            ((weight * (step + 1)).sum(1) + bias.sum()).pow(2).sum().backward()
            optimizer.step()
        assert inner.param_groups[0]["weight_decay"] == 1e-2  # given back after each step
        results.append((weight.detach().clone(), bias.detach().clone(), optimizer.state_dict()["state"]))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=0, atol=0)
    torch.testing.assert_close(results[0][1], results[1][1], rtol=0, atol=0)


# --------------------------------------------------------------------------- two processes

HOOK_CASES = {
    "average": "model = DDP(model)\n",
    "predivide": "model = DDP(model, gradient_predivide_factor=4.0)\n",
    "sum": "model = DDP(model, gradient_average=False)\n",
    "sum_predivide": "model = DDP(model, gradient_average=False, gradient_predivide_factor=4.0)\n",
}


def migrated_wrap(case: str) -> str:
    """The rule's output for one Apex DDP call, as code that wraps ``model``."""
    source = "from apex.parallel import DistributedDataParallel as DDP\n" + HOOK_CASES[case]
    lines = migrate_source(source).source.splitlines()
    return "\n".join(line for line in lines if line.startswith("model"))


def _two_process_worker(rank: int, store: str, results: Any) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        kwargs = {
            "average": {},
            "predivide": {"gradient_predivide_factor": 4.0},
            "sum": {"gradient_average": False},
            "sum_predivide": {"gradient_average": False, "gradient_predivide_factor": 4.0},
        }
        x = torch.full((3, 4), float(rank + 1))
        out = {}
        for case in HOOK_CASES:
            torch.manual_seed(0)
            apex_model = torch.nn.Linear(4, 2)
            wrapped = parallel.DistributedDataParallel(apex_model, **kwargs[case])
            wrapped(x).sum().backward()
            torch.manual_seed(0)
            namespace: dict[str, Any] = {"torch": torch, "model": torch.nn.Linear(4, 2)}
            exec(migrated_wrap(case), namespace)
            namespace["model"](x).sum().backward()
            torch.manual_seed(0)
            local = torch.nn.Linear(4, 2)
            local(x).sum().backward()
            out[case] = (
                apex_model.weight.grad.clone(),
                namespace["model"].module.weight.grad.clone(),
                local.weight.grad,
            )
        results[rank] = out
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_processes_average_and_sum_like_apex(tmp_path: Path) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    manager = mp.Manager()
    results = manager.dict()
    mp.spawn(_two_process_worker, args=(str(tmp_path / "store"), results), nprocs=2, join=True)
    local_grads = {rank: {case: grads[2] for case, grads in results[rank].items()} for rank in (0, 1)}
    for rank in (0, 1):
        for case, (apex_grad, migrated_grad, _) in results[rank].items():
            total = local_grads[0][case] + local_grads[1][case]
            expected = total / 2 if case in ("average", "predivide") else total / (4.0 if "predivide" in case else 1.0)
            torch.testing.assert_close(apex_grad, expected, msg=f"shim {case}")
            torch.testing.assert_close(migrated_grad, apex_grad, msg=f"migrated {case}")
