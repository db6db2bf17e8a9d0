"""``migrate.gradient_norms``: which functions are proven to compute a norm of gradients."""

from __future__ import annotations

import ast

import pytest

from migrate.gradient_norms import gradient_norms_in, is_gradient_norm

SWIN = """\
def get_grad_norm(parameters, norm_type=2):
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    parameters = list(filter(lambda p: p.grad is not None, parameters))
    norm_type = float(norm_type)
    total_norm = 0
    for p in parameters:
        param_norm = p.grad.data.norm(norm_type)
        total_norm += param_norm.item() ** norm_type
    total_norm = total_norm ** (1. / norm_type)
    return total_norm
"""


def _proven(source: str) -> bool:
    definition = ast.parse(source).body[0]
    assert isinstance(definition, ast.FunctionDef)
    return is_gradient_norm(definition)


@pytest.mark.parametrize(
    "source",
    [
        SWIN,
        "def norm(ps):\n    return max(p.grad.abs().max().item() for p in ps)\n",
        "def norm(ps, n=2.0):\n"
        "    ps = [p for p in ps if p.grad is not None]\n"
        "    return torch.norm(torch.stack([torch.norm(p.grad.detach(), n) for p in ps]), n)\n",
    ],
)
def test_norms_of_the_gradients_are_proven(source: str) -> None:
    assert _proven(source)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (("    total_norm = total_norm ** (1. / norm_type)\n", ""), "a sum of squares: degree 2"),
        (("p.grad.data.norm", "p.data.norm"), "a norm of the weights"),
        (("total_norm = 0\n", "total_norm = 1\n"), "a sum that starts away from zero"),
        (("    return total_norm", "    return total_norm + 1"), "a constant added"),
        (("    return total_norm", "    p.grad.mul_(2)\n    return total_norm"), "the gradients changed"),
        (
            (
                "param_norm = p.grad.data.norm(norm_type)",
                "param_norm = p.grad.data.norm(norm_type)\n        p.seen = 1",
            ),
            "a store",
        ),
        (("norm_type=2)", "norm_type=2, scale=1)"), "a third parameter"),
        (("    for p in parameters:", "    for p in helpers(parameters):"), "an unknown call"),
        (("    return total_norm", "    return"), "nothing returned"),
    ],
)
def test_other_functions_are_not(change: tuple[str, str], why: str) -> None:
    assert change[0] in SWIN, why
    assert not _proven(SWIN.replace(*change)), why


def test_a_module_names_its_norms_defined_once() -> None:
    other = "def get_lr(optimizer):\n    return optimizer.param_groups[0]['lr']\n"
    assert gradient_norms_in(SWIN + "\n" + other) == {"get_grad_norm"}
    assert gradient_norms_in(SWIN + "\n" + SWIN) == set()  # redefined: which one runs depends on order
    assert gradient_norms_in("def get_grad_norm(\n") == set()
