"""Options that change what the engine writes (no I/O, no heavy imports)."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_SCALER_NAME = "scaler"


@dataclass(frozen=True)
class Options:
    """What the generated torch.amp code looks like.

    ``device`` and ``dtype`` go into every ``torch.autocast`` and ``GradScaler`` the
    engine writes; ``scaler_name`` is the preferred variable name of the scaler (a
    free name is picked if the file already uses it); ``select`` limits the run to
    some rules (by rule name, e.g. ``"amp_scale_loss"``), ``None`` meaning all;
    ``fused_optimizers`` writes ``fused=True`` into the torch Adam/AdamW that replace
    ``FusedAdam`` (needs torch 2.0 on CUDA, 2.4 on the CPU).
    """

    device: str = "cuda"
    dtype: str = "float16"
    scaler_name: str = DEFAULT_SCALER_NAME
    select: frozenset[str] | None = None
    fused_optimizers: bool = True

    def rule_enabled(self, rule: str) -> bool:
        return self.select is None or rule in self.select
