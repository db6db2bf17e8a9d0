"""migrate.halving_helpers: which project functions are proven to halve the model they are given."""

from __future__ import annotations

import textwrap

import pytest

from migrate.halving_helpers import GroupReader, HalvingHelper, halving_helpers_in, param_group_readers_in

LOAD_MODEL = """
def load_model(model, checkpoint, args, verbose=False):
    if checkpoint is not None:
        start_model = model
        start_model.load_state_dict(torch.load(checkpoint))
    if args.fp16:
        logger.info("half")
        model.half()
    model.to(args.device)
    if args.n_gpu > 1:
        model = torch.nn.DataParallel(model)
    return model
"""


def test_dialogpts_load_model_is_proven() -> None:
    assert halving_helpers_in(LOAD_MODEL) == {"load_model": HalvingHelper(0, "model", 2, "args", "fp16")}


@pytest.mark.parametrize(
    "source",
    [
        # moved with .cuda(), wrapped under another test, logged in and after the half's if
        LOAD_MODEL.replace("model.to(args.device)", "model.cuda()"),
        LOAD_MODEL.replace("if args.n_gpu > 1:", "if torch.cuda.device_count() > 1 and not args.cpu:"),
        LOAD_MODEL.replace("    return model", "    logging.info('data parallel')\n    return model"),
    ],
    ids=["cuda", "wrapped_under_another_test", "logged_after"],
)
def test_moves_wraps_and_logs_after_the_half_are_proven(source: str) -> None:
    assert halving_helpers_in(textwrap.dedent(source)) == {"load_model": HalvingHelper(0, "model", 2, "args", "fp16")}


@pytest.mark.parametrize(
    "source",
    [
        # wrapped in DistributedDataParallel after the half: made float32 afterwards, torch's DDP
        # no longer all-reduces the gradients
        LOAD_MODEL.replace("torch.nn.DataParallel(model)", "torch.nn.parallel.DistributedDataParallel(model)"),
        LOAD_MODEL.replace(
            "    if args.n_gpu > 1:\n        model = torch.nn.DataParallel(model)",
            "    if args.local_rank != -1:\n        model = DistributedDataParallel(model, device_ids=[args.local_rank])",
        ),
        # a dtype read or a hook after the half: what they keep outlives the caller's model.float()
        LOAD_MODEL.replace(
            "    return model", "    model.fp16 = next(model.parameters()).dtype == torch.float16\n    return model"
        ),
        LOAD_MODEL.replace('        logger.info("half")', "        model.register_forward_pre_hook(to_half)"),
        # a cast after the half (of the model, or of an alias of it)
        LOAD_MODEL.replace("    return model", "    model.float()\n    return model"),
        LOAD_MODEL.replace("start_model.load_state_dict(torch.load(checkpoint))", "start_model.float()"),
        # a move that may cast
        LOAD_MODEL.replace("model.to(args.device)", "model.to(args.dtype)"),
        # the half under an else too, or nested deeper
        LOAD_MODEL.replace("        model.half()\n", "        model.half()\n    else:\n        pass\n"),
        "def f(model, args):\n    if args.ok:\n        if args.fp16:\n            model.half()\n    return model\n",
        # something else returned, or the model rebound before the half
        LOAD_MODEL.replace("    return model", "    return model, 1"),
        "def f(model, args):\n    model = Wrapper(model)\n    if args.fp16:\n        model.half()\n    return model\n",
        # the flag rebound, or the function defined twice
        "def f(model, args):\n    args = other\n    if args.fp16:\n        model.half()\n    return model\n",
        LOAD_MODEL + LOAD_MODEL,
        # the flag is no parameter
        "def f(model):\n    if ARGS.fp16:\n        model.half()\n    return model\n",
    ],
    ids=[
        "ddp_after",
        "ddp_after_under_local_rank",
        "dtype_read",
        "hook_in_the_if",
        "float_after",
        "alias_cast",
        "to_dtype",
        "else_branch",
        "nested",
        "returns_tuple",
        "rebound_before",
        "flag_rebound",
        "defined_twice",
        "global_flag",
    ],
)
def test_shapes_that_are_not_proven(source: str) -> None:
    assert halving_helpers_in(textwrap.dedent(source)) == {}


SET_LR = """
def set_lr(optimizer, step, lr):
    for group in optimizer.param_groups:
        group["lr"] = lr * step
"""


def test_a_function_touching_only_param_groups_reads_them() -> None:
    assert param_group_readers_in(SET_LR) == {"set_lr": GroupReader(0, "optimizer")}


@pytest.mark.parametrize(
    "extra",
    ["    optimizer.step()\n", "    keep(optimizer)\n", "    optimizer.param_groups = []\n", "    optimizer = None\n"],
    ids=["steps_it", "passes_it_on", "sets_the_groups", "rebinds_it"],
)
def test_a_function_doing_more_with_the_optimizer_does_not(extra: str) -> None:
    assert param_group_readers_in(SET_LR + extra) == {}
