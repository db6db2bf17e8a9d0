"""``apex.multi_tensor_apply`` and ``amp_C`` under the shim, and the apex_multi_tensor rule's
torch code: the migrated fixtures must compute what Apex's kernels computed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from migrate.shim import amp_c
from migrate.shim.multi_tensor import multi_tensor_applier

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "fixtures" / "apex_multi_tensor"


def flag() -> torch.Tensor:
    return torch.zeros(1, dtype=torch.int)


def test_scale_rounds_once_from_float32_and_flags_non_finite_input() -> None:
    source = [torch.tensor([1.0, 3.0], dtype=torch.float16), torch.tensor([65504.0], dtype=torch.float16)]
    out = [torch.zeros(2), torch.zeros(1)]
    overflow = flag()
    multi_tensor_applier(amp_c.multi_tensor_scale, overflow, [source, out], 1 / 3)
    assert out[0].tolist() == [torch.tensor(1 / 3).item(), 1.0]
    assert out[1].item() == 65504.0 / 3 or abs(out[1].item() - 65504.0 / 3) < 1e-2  # float32, not float16
    assert overflow.item() == 0
    source[0][0] = float("inf")
    multi_tensor_applier(amp_c.multi_tensor_scale, overflow, [source, out], 1.0)
    assert overflow.item() == 1
    multi_tensor_applier(amp_c.multi_tensor_scale, overflow, [[torch.ones(1)], [torch.ones(1)]], 1.0)
    assert overflow.item() == 1, "the kernel never clears the flag"


def test_axpby_checks_the_argument_it_is_told_to() -> None:
    xs, ys, out = [torch.tensor([1.0, float("nan")])], [torch.tensor([2.0, 3.0])], [torch.zeros(2)]
    overflow = flag()
    amp_c.multi_tensor_axpby(2048, overflow, [xs, ys, out], 2.0, 0.5, 1)
    assert overflow.item() == 0 and out[0][0].item() == 3.0
    amp_c.multi_tensor_axpby(2048, overflow, [xs, ys, out], 2.0, 0.5, -1)
    assert overflow.item() == 1


def test_l2norm_shapes_and_values() -> None:
    tensors = [torch.tensor([3.0, 4.0], dtype=torch.float16), torch.tensor([12.0])]
    total, per_tensor = multi_tensor_applier(amp_c.multi_tensor_l2norm, flag(), [tensors], False)
    assert total.dtype is torch.float32 and total.shape == (1,) and total.item() == 13.0
    assert per_tensor.numel() == 0
    total, per_tensor = multi_tensor_applier(amp_c.multi_tensor_l2norm, flag(), [tensors], True)
    assert per_tensor.tolist() == [5.0, 12.0]
    unscaled, _ = amp_c.multi_tensor_unscale_l2norm(2048, flag(), [tensors], torch.tensor([0.5]))
    assert unscaled.item() == 6.5


def test_the_applier_passes_apexs_chunk_size() -> None:
    seen = []
    multi_tensor_applier(lambda chunk, *rest: seen.append(chunk), flag(), [[]])
    assert seen == [2048 * 32] and multi_tensor_applier.available


def test_unemulated_kernels_say_what_to_use() -> None:
    with pytest.raises(AttributeError, match="torch.optim"):
        amp_c.multi_tensor_adam  # noqa: B018


DRIVER = r"""
import importlib.util, json, sys
import torch

def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

def tensors(seed, dtype, sizes=(3, 5)):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=g).to(dtype) for n in sizes]

def same(a, b, exact=True):
    if isinstance(a, (list, tuple)):
        return all(same(x, y, exact) for x, y in zip(a, b))
    if torch.is_tensor(a):
        return bool(torch.equal(a, b)) if exact else bool(torch.allclose(a, b, rtol=1e-6, atol=0))
    return a == b

fixtures = sys.argv[1]
checks = {}
for case in ["copy_this_to_that", "unscale_allreduced_grads_flag_read", "clip_grad_norm_fp32", "axpby_accumulate_and_per_tensor_norms"]:
    original = load(f"{fixtures}/{case}.in.py", case + "_in")
    migrated = load(f"{fixtures}/{case}.out.py", case + "_out")
    results = []
    for poison in (False, True):
        outs = []
        for module in (original, migrated):
            src = tensors(1, torch.float16)
            if poison:
                src[1][2] = float("inf")
            dst = [torch.zeros(3), torch.zeros(5)]
            buf = torch.zeros(1, dtype=torch.int)
            if case == "copy_this_to_that":
                buf.fill_(1)  # a set flag takes the kernel branch (a clear one copies in a loop)
                module._multi_tensor_copy_this_to_that(src, dst, buf)
                outs.append((dst, buf))
            elif case == "unscale_allreduced_grads_flag_read":
                outs.append((module.unscale_into_masters(src, dst, 1000.0), dst))
            elif case == "clip_grad_norm_fp32":
                grads = tensors(2, torch.float32)
                norm = module.clip_grad_norm_fp32(grads, grads, 0.5)
                outs.append((torch.tensor(norm), grads))
            else:
                acc = module.Accumulator(buf)
                stash = tensors(3, torch.float32)
                overflow = acc.accumulate(src, stash, 4.0)
                ratios = acc.trust_ratios(tensors(4, torch.float32), tensors(5, torch.float32))
                outs.append((overflow, stash, buf, ratios))
        exact = case not in ("clip_grad_norm_fp32", "axpby_accumulate_and_per_tensor_norms")
        results.append(same(outs[0], outs[1], exact))
    checks[case] = results
print(json.dumps(checks))
"""


def test_migrated_fixtures_compute_what_apexs_kernels_computed(tmp_path: Path) -> None:
    """Each original runs on the shim's amp_C, its migration on torch._foreach_*, in one process."""
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "migrate.shim", str(driver), str(FIXTURES)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    checks = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(checks) == {
        "copy_this_to_that",
        "unscale_allreduced_grads_flag_read",
        "clip_grad_norm_fp32",
        "axpby_accumulate_and_per_tensor_norms",
    }
    for case, (finite, with_inf) in checks.items():
        assert finite, f"{case}: the migration computes something else than Apex's kernel"
        assert with_inf, f"{case}: the migration handles a non-finite input (and its flag) differently"
