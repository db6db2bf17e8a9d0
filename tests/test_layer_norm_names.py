"""FusedLayerNorm whose name other modules reach keeps it, bound to torch.nn.LayerNorm."""

from __future__ import annotations

from migrate.engine import migrate_source
from migrate.options import ModuleFacts, Options

PLAIN = """\
from apex.normalization.fused_layer_norm import FusedLayerNorm


def build(hidden):
    return FusedLayerNorm(hidden, eps=1e-12)
"""


def test_a_plain_import_only_used_here_is_rewritten_at_each_use() -> None:
    result = migrate_source(PLAIN)
    assert "FusedLayerNorm" not in result.source
    assert "return torch.nn.LayerNorm(hidden, eps=1e-12)" in result.source


def test_a_name_other_modules_import_stays_bound_to_the_torch_class() -> None:
    result = migrate_source(PLAIN, Options(facts=ModuleFacts(exported=frozenset({"FusedLayerNorm"}))))
    assert result.source.startswith("from torch.nn import LayerNorm as FusedLayerNorm\n")
    assert "return FusedLayerNorm(hidden, eps=1e-12)" in result.source
    assert "import torch\n" not in result.source  # nothing spells torch. here


def test_an_unmigratable_use_keeps_the_import_with_the_exact_replacement() -> None:
    source = PLAIN.replace("eps=1e-12", "eps=1e-12, fused=True")
    result = migrate_source(source)
    assert result.source == source
    messages = {f.code: f.message for f in result.findings}
    assert messages["AMP042"] == "FusedLayerNorm has no parameter fused: remove `fused=...` (not an Apex argument)"
    # the class is named exactly, also where it is imported from the module that defines it, and
    # the import points at the use's own finding rather than repeating a generic replacement
    assert messages["AMP040"] == (
        "apex.normalization.fused_layer_norm.FusedLayerNorm stays imported: its uses here are kept on purpose "
        "(line 5: see the findings there, which name the code to write); delete "
        "`from apex.normalization.fused_layer_norm import FusedLayerNorm` once they are migrated"
    )


def test_an_aliased_import_that_fails_keeps_the_whole_try() -> None:
    source = """\
try:
    from apex.normalization.fused_layer_norm import FusedLayerNorm as BertLayerNorm
except ImportError:
    BertLayerNorm = None


def build(hidden, *args):
    return BertLayerNorm(hidden, *args)
"""
    result = migrate_source(source)
    assert result.source == source
    assert [f.code for f in result.findings] == ["AMP040", "AMP042"]
