"""The shim runs Apex code that reaches into ``apex.amp._amp_state`` unmodified, in every
spelling real code uses (ViT-pytorch, NVIDIA BERT and GNMT, mmgeneration, Apex's own tests)."""

from __future__ import annotations

import subprocess
import sys

SPELLINGS = """
import migrate.shim
migrate.shim.install()
import torch
import apex.amp._amp_state
from apex import amp
from apex.amp import _amp_state as imported
from apex.amp._amp_state import _amp_state as from_module

assert imported is from_module is amp._amp_state is apex.amp._amp_state
from_module.allow_incoming_model_not_fp32 = True
model = torch.nn.Linear(4, 1).half()  # refused without the switch
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = amp.initialize(model, optimizer, opt_level="O1", verbosity=0)
amp._amp_state.loss_scalers[0]._loss_scale = 2**20
assert imported.loss_scalers[0].loss_scale() == apex.amp._amp_state.loss_scalers[0]._loss_scale == 2**20
assert from_module.opt_properties.opt_level == "O1" and from_module.handle is not None
print("ok")
"""


def test_every_spelling_of_the_private_state_is_one_object() -> None:
    done = subprocess.run([sys.executable, "-c", SPELLINGS], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("ok")
