"""Time per training step on the CPU: the Apex shim (O1, O2) against native torch.autocast.

    python bench/shim_overhead.py [--steps 30] [--repeats 5] [--threads 1]

Models: a small MLP and a small CNN. Every variant runs in float16 on the CPU with a loss
scaler: native = ``torch.autocast("cpu", dtype=torch.float16)`` + ``GradScaler("cpu")``;
shim O1 = Apex's per-function casts + Apex's LossScaler; shim O2 = fp16 model, fp32 masters.
Printed: median milliseconds per step (over repeats) and the ratios to native autocast.
Target from issue 3: shim O1 within 1.5x of native autocast.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from migrate.shim import amp, casting
from migrate.shim.amp_state import _amp_state

Batch = tuple[torch.Tensor, torch.Tensor]


def mlp() -> tuple[torch.nn.Module, Batch]:
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 10),
    )
    return model, (torch.randn(64, 256), torch.randint(0, 10, (64,)))


def cnn() -> tuple[torch.nn.Module, Batch]:
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.Conv2d(8, 16, 3, padding=1),
        torch.nn.BatchNorm2d(16),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(16, 10),
    )
    # Small images: float16 convolutions on the CPU have no fast kernels (about 1 s per step
    # at 16x3x32x32 with 16/32 channels), and the ratio, not the absolute time, is the point.
    return model, (torch.randn(16, 3, 16, 16), torch.randint(0, 10, (16,)))


def native_step(model: torch.nn.Module, batch: Batch) -> Callable[[], None]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu")
    x, y = batch

    def step() -> None:
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

    return step


def shim_step(level: str) -> Callable[[torch.nn.Module, Batch], Callable[[], None]]:
    def make(model: torch.nn.Module, batch: Batch) -> Callable[[], None]:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        # 2**10 start: the first steps of an fp16 run at 2**16 would be skipped overflows.
        model, optimizer = amp.initialize(model, optimizer, opt_level=level, verbosity=0, max_loss_scale=2.0**10)
        x, y = batch

        def step() -> None:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            with amp.scale_loss(loss, optimizer) as scaled:
                scaled.backward()
            optimizer.step()

        return step

    return make


def time_per_step(build: Callable[[], tuple[torch.nn.Module, Batch]], make, steps: int, repeats: int) -> float:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model, batch = build()
    step = make(model, batch)
    for _ in range(5):  # warm-up: allocator, lazy scaler state, O1 cache
        step()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            step()
        samples.append((time.perf_counter() - start) / steps)
    casting.reset()
    _amp_state.reset()
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, CPU, {args.threads} thread(s), float16, "
        f"{args.steps} steps x {args.repeats} repeats (median)"
    )
    print(f"{'model':<5} {'native autocast':>16} {'shim O1':>10} {'shim O2':>10} {'O1/native':>10} {'O2/native':>10}")
    for name, build in (("mlp", mlp), ("cnn", cnn)):
        native = time_per_step(build, native_step, args.steps, args.repeats)
        o1 = time_per_step(build, shim_step("O1"), args.steps, args.repeats)
        o2 = time_per_step(build, shim_step("O2"), args.steps, args.repeats)
        print(
            f"{name:<5} {native * 1e3:>13.2f} ms {o1 * 1e3:>7.2f} ms {o2 * 1e3:>7.2f} ms "
            f"{o1 / native:>9.2f}x {o2 / native:>9.2f}x"
        )


if __name__ == "__main__":
    main()
