"""Options that change what the engine writes (no I/O, no heavy imports)."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_SCALER_NAME = "scaler"


@dataclass(frozen=True)
class ModuleFacts:
    """What the project around a module tells the engine about it (project mode).

    ``amp_from``: names this module gets bound to apex.amp through project imports
    (``from common import *`` where common imports amp), as (name, line of that import).
    ``exported``: names other given modules import from this one (``"*"``: all of them),
    so an Apex import here is not unused merely because this module does not use it.
    ``frozen``: why this module's amp setup must stay as it was (its group of modules
    cannot be migrated whole); None to migrate it.
    ``package_init``: the module is a package's ``__init__.py``, whose names code outside
    the run may import (a re-exported Apex name is not unused there).
    """

    amp_from: tuple[tuple[str, int], ...] = ()
    exported: frozenset[str] = frozenset()
    frozen: str | None = None
    # the module is a package's ``__init__.py``: code outside the run may import its names
    package_init: bool = False
    # the given modules (as displayed) that import the amp module from here and keep using Apex
    # amp: the import stays for them, and says so (AMP025)
    amp_kept_by: tuple[str, ...] = ()
    # the GradScaler shared across modules: the module that creates it passes it (as a
    # keyword named ``Options.scaler_name``) to these imported functions ("f" or "mod.f")...
    passes_scaler: tuple[str, ...] = ()
    # ...and the module that defines them gives these top-level functions that parameter
    receives_scaler: tuple[str, ...] = ()
    shared_scaler: ScalerInfo | None = None
    # attributes that carry the amp module between modules (``args.amp = amp`` after amp.initialize
    # in one, ``args.amp.scale_loss(...)`` in another): they now carry the GradScaler (``_carriers``)
    carriers: frozenset[str] = frozenset()
    # where the carrier holds the amp module: the ``if`` tests on the way to each store (``<obj>`` for
    # the object, True for a body, False for an else); the readers' own tests must say the same
    carrier_conditions: tuple[tuple[str, bool], ...] | None = None
    # names imported from a project module that copies Apex's fp16_utils (``migrate.apex_copies``):
    # (module as spelled, name, Apex path or "", where it is defined, what keeps it from being treated
    # like Apex or "", what keeps dynamic loss scaling with it from being migrated or "")
    apex_copies: tuple[tuple[str, str, str, str, str, str], ...] = ()


@dataclass(frozen=True)
class ScalerInfo:
    """What other modules need to know about a GradScaler a module creates."""

    function: str | None  # the top-level function that creates it; None: module level
    static_scale: float | None  # a fixed loss scale (``update(new_scale=...)`` holds it)
    follows: bool  # autocast is on exactly when the scaler is (``scaler.is_enabled()``)
    models: tuple[str, ...] = ()  # names of the models given to amp.initialize
    # the name holding a loss scale chosen at run time (passed on beside the scaler); None: no such name
    held_scale: str | None = None


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
    facts: ModuleFacts = ModuleFacts()
    fused_optimizers: bool = True

    def rule_enabled(self, rule: str) -> bool:
        return self.select is None or rule in self.select
