"""The byte pre-filter: never a false negative, and the same answers as the one regex it replaced."""

from __future__ import annotations

import random
import re

import pytest

from migrate.prefilter import may_need_migration

# The pre-filter as one alternation (five times slower on a real tree), with the amp
# functions that code reaching amp from elsewhere (a parameter, a star import) uses.
REFERENCE = re.compile(
    rb"apex|(?:cuda|cpu)\b[\s\\]*(?:\.|import)[\s\\(]*amp|scale_loss|master_params"
    rb"|amp\.(?:initialize|state_dict|load_state_dict)"
    rb"|FP16_Optimizer|FP16_Module|network_to_half|LossScaler"
)


@pytest.mark.parametrize(
    "source",
    [
        "from apex import amp",
        "import apex.optimizers as fused",
        "x = torch.cuda.amp.autocast()",
        "from torch.cuda import amp",
        "from torch.cuda import (amp, nvtx)",
        "with torch.cpu.amp.autocast():",
        "y = torch.cuda.\\\n    amp.GradScaler()",
        "with handle.scale_loss(loss, opt) as scaled:",
        "clip(master_params(opt), 1.0)",
        "model, opt = amp.initialize(model, opt)",
        "amp.load_state_dict(checkpoint['amp'])",
        "from fp16 import FP16_Module, FP16_Optimizer",  # a project's own copy of apex.fp16_utils
        "from fp16util import network_to_half",
        "class DynamicLossScaler:",
    ],
)
def test_what_may_need_migration_passes(source: str) -> None:
    assert may_need_migration(source.encode())


@pytest.mark.parametrize(
    "source", ["import torch\nx = torch.amp.autocast('cuda')", "clamp(cuda_x)", "sample = 1", "FP16_PyT_ckpt = path"]
)
def test_what_cannot_is_dropped(source: str) -> None:
    assert not may_need_migration(source.encode())


def test_same_answers_as_the_reference_regex() -> None:
    pieces = [
        b"apex",
        b"ape",
        b"cuda",
        b"cpu",
        b"amp",
        b".",
        b" ",
        b"\\",
        b"(",
        b"import",
        b"x",
        b"\n",
        b"_",
        b"scale_loss",
        b"master_params",
        b"initialize",
        b"state_dict",
        b"load_",
        b"scale",
        b"FP16_",
        b"Optimizer",
        b"Module",
        b"LossScaler",
    ]
    rng = random.Random(11)
    for _ in range(20000):
        data = b"".join(rng.choice(pieces) for _ in range(rng.randint(0, 8)))
        assert may_need_migration(data) == (REFERENCE.search(data) is not None), data
