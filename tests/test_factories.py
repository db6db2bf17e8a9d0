"""Project mode: functions that set up amp for their callers (``migrate.factories``) and the
callers migrated as if the function's amp.initialize followed each call (``_factory_calls``)."""

from __future__ import annotations

import pytest

from migrate.engine import migrate_source
from migrate.factories import inference_calls, read_factory
from migrate.options import ModuleFacts, Options

FACTORY = """\
import torch


def setup(model, optimizer, device, fp16=False, opt_level="O1"):
    model.to(device)
    if fp16:
        from apex import amp

        model, optimizer = amp.initialize(model, optimizer, opt_level=opt_level)
    model = torch.nn.DataParallel(model)
    return model, optimizer
"""


def test_a_factory_is_read_with_its_parameters_guard_and_returned_places() -> None:
    setup = read_factory(FACTORY, "setup", "utils.setup")
    assert setup is not None
    assert setup.name == "utils.setup"
    assert setup.parameters == ("model", "optimizer", "device", "fp16", "opt_level")
    assert setup.defaults == (("fp16", "False"), ("opt_level", '"O1"'))
    assert setup.call == "amp.initialize(model, optimizer, opt_level=opt_level)"
    assert (setup.models, setup.optimizers, setup.guard, setup.returned) == ("model", "optimizer", "fp16", (2, 0, 1))


def test_an_else_branch_is_guarded_by_the_negated_test() -> None:
    setup = read_factory(
        """\
from apex import amp


def setup(model, optimizer, fp32):
    if fp32:
        pass
    else:
        model, optimizer = amp.initialize(model, optimizer)
    return optimizer, model
""",
        "setup",
        "setup",
    )
    assert setup is not None
    assert (setup.guard, setup.returned) == ("not fp32", (2, 1, 0))


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (("if fp16:", "if fp16 and torch.cuda.is_available():"), "the guard calls code"),
        (("if fp16:", "if fp16 and USE_AMP:"), "the guard reads a module name"),
        (("opt_level=opt_level)", "opt_level=LEVELS[opt_level])"), "an argument reads a module name"),
        (
            ("    model.to(device)\n", "    model.to(device)\n    fp16 = fp16 and device != 'cpu'\n"),
            "a reassigned switch",
        ),
        (("    model.to(device)\n", "    if device == 'cpu':\n        return model, optimizer\n"), "an early return"),
        (("    model = torch.nn.DataParallel(model)\n", "    optimizer = Wrapper(optimizer)\n"), "another optimizer"),
        (("    return model, optimizer", "    return model"), "the optimizer is not returned"),
        (("device, fp16=False", "device, *rest, fp16=False"), "*args"),
        (('opt_level="O1"', "opt_level=DEFAULT_LEVEL"), "a default that is no literal"),
        (("    if fp16:\n", "    for _ in range(1):\n"), "the call runs in a loop"),
        (
            ("    model = torch.nn.DataParallel(model)\n", "    amp.state_dict()\n"),
            "another amp call",
        ),
    ],
)
def test_shapes_a_caller_cannot_take_over_are_not_read(change: tuple[str, str], why: str) -> None:
    assert change[0] in FACTORY, why
    assert read_factory(FACTORY.replace(change[0], change[1]), "setup", "setup") is None, why


def test_callers_out_of_the_run_count_only_when_they_pass_no_optimizer() -> None:
    setup = read_factory(FACTORY, "setup", "setup")
    assert setup is not None
    inference = "from utils import setup\n\n\ndef embed(encoder, cfg):\n    encoder, _ = setup(encoder, None, cfg.device, cfg.fp16)\n"
    assert inference_calls(inference, setup, "setup") == [5]
    keyword = inference.replace(
        "setup(encoder, None, cfg.device, cfg.fp16", "setup(encoder, optimizer=None, fp16=cfg.fp16"
    )
    assert inference_calls(keyword, setup, "setup") == [5]
    training = inference.replace("None", "optimizer")
    assert inference_calls(training, setup, "setup") is None
    passed_on = inference + "\n\nbuilders = [setup]\n"
    assert inference_calls(passed_on, setup, "setup") is None


TRAINER = """\
import torch
from apex import amp

from utils import setup


class Trainer:
    def __init__(self, cfg, model, optimizer):
        model, optimizer = setup(model, optimizer, cfg.device, cfg.fp16, cfg.opt_level)
        self.model, self.optimizer = model, optimizer

    def step(self, x):
        loss = self.model(x).sum()
        with amp.scale_loss(loss, self.optimizer) as scaled_loss:
            scaled_loss.backward()
        self.optimizer.step()
"""


def _facts(name: str = "setup") -> Options:
    setup = read_factory(FACTORY, "setup", name)
    assert setup is not None
    return Options(facts=ModuleFacts(factory_setups=(setup,)))


def test_a_caller_gets_the_scaler_where_the_call_returns() -> None:
    result = migrate_source(TRAINER, _facts())
    assert not result.amp_left and result.amp_migrated
    assert "apex" not in result.source
    lines = result.source.splitlines()
    call = next(n for n, line in enumerate(lines) if "= setup(" in line)
    assert lines[call + 1].strip() == (
        'self.scaler = torch.amp.GradScaler("cuda", enabled=bool(cfg.fp16) and cfg.opt_level != "O0")'
    )
    assert "self.scaler.scale(loss).backward()" in result.source
    # findings name the input's lines: the one about the run-time opt level, the call's
    (note,) = [f for f in result.findings if f.code == "AMP001"]
    assert (note.line, note.column) == (9, 28)


@pytest.mark.parametrize(
    "change",
    [
        ("model, optimizer = setup(", "return setup("),  # the result is not unpacked
        ("setup(model, optimizer, cfg.device, cfg.fp16, cfg.opt_level)", "setup(*cfg.args)"),
        ("cfg.fp16, cfg.opt_level)", "cfg.read_fp16(), cfg.opt_level)"),  # read again, it may differ
        ("cfg.fp16, cfg.opt_level)", "model.fp16, cfg.opt_level)"),  # `model` is rebound by the call
    ],
)
def test_a_caller_that_cannot_take_the_setup_over_is_migrated_as_it_is(change: tuple[str, str]) -> None:
    source = TRAINER.replace(*change)
    assert source != TRAINER
    result = migrate_source(source, _facts())
    plain = migrate_source(source, Options())
    assert result.amp_left
    assert (result.source, result.findings) == (plain.source, plain.findings)


def test_a_caller_assigning_attributes_reads_its_other_attributes_after_the_call() -> None:
    source = TRAINER.replace(
        "        model, optimizer = setup(model, optimizer, cfg.device, cfg.fp16, cfg.opt_level)\n"
        "        self.model, self.optimizer = model, optimizer\n",
        "        self.cfg = cfg\n"
        "        self.model, self.optimizer = setup(model, optimizer, self.cfg.device, self.cfg.fp16, self.cfg.opt_level)\n",
    )
    result = migrate_source(source, _facts())
    assert not result.amp_left
    assert 'enabled=bool(self.cfg.fp16) and self.cfg.opt_level != "O0"' in result.source
    # an argument read from what the call assigns would not mean the same after it
    rebinding = source.replace("self.cfg.fp16, self.cfg.opt_level)", "self.model.fp16, self.cfg.opt_level)")
    assert migrate_source(rebinding, _facts()).amp_left


def test_a_caller_passing_no_optimizer_sets_up_inference() -> None:
    source = (
        "import torch\n\nfrom utils import setup\n\n\n"
        "def embed(cfg, encoder, batches):\n"
        "    encoder, _ = setup(encoder, None, cfg.device, cfg.fp16)\n"
        "    return [encoder(batch) for batch in batches]\n"
    )
    result = migrate_source(source, _facts())
    assert not result.amp_left
    assert result.source == source  # nothing to write: Apex only cast the model's forward pass
    assert [f.code for f in result.findings] == ["AMP011"]


BRANCHED = """\
from apex import amp


def setup(model, optimizer, fp16=False, level="O1", teacher=None):
    if fp16:
        if optimizer is None:
            if teacher is None:
                model = amp.initialize(model, optimizer, opt_level=level)
            else:
                model, teacher = amp.initialize([model, teacher], optimizer, opt_level=level)
        else:
            model, optimizer = amp.initialize(model, optimizer, opt_level=level)
    return model, optimizer
"""


def test_calls_reached_only_without_an_optimizer_go_beside_the_training_one() -> None:
    setup = read_factory(BRANCHED, "setup", "setup")
    assert setup is not None
    assert setup.call == "amp.initialize(model, optimizer, opt_level=level)"
    # the training call's own results are the objects it was given: its test of them is read
    assert (setup.guard, setup.returned) == ("fp16 and not (optimizer is None)", (2, 0, 1))


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (("if optimizer is None:", "if teacher is None:"), "two calls may set up training"),
        (("if optimizer is None:", "if optimizer is not None:"), "the None test is the other way round"),
        (
            (
                "        else:\n            model, optimizer",
                "        else:\n            optimizer = optimizer or None\n            model, optimizer",
            ),
            "the optimizer is reassigned",
        ),
    ],
)
def test_branches_on_the_optimizer_that_prove_nothing_are_not_read(change: tuple[str, str], why: str) -> None:
    assert change[0] in BRANCHED, why
    assert read_factory(BRANCHED.replace(change[0], change[1]), "setup", "setup") is None, why


def test_a_guard_on_the_optimizer_reads_what_the_caller_got_back() -> None:
    setup = read_factory(BRANCHED, "setup", "setup")
    assert setup is not None
    caller = "from utils import setup\n\n\ndef train(net, opt, cfg):\n    net, opt = setup(net, opt, cfg.fp16, cfg.level)\n    return net, opt\n"
    result = migrate_source(caller, Options(facts=ModuleFacts(factory_setups=(setup,))))
    assert 'enabled=bool(cfg.fp16 and not (opt is None)) and cfg.level != "O0"' in result.source, result.source
