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
    # (name, module as displayed): the project modules that import this module's Apex names
    # (``from norms import SyncBN2d``), for which its Apex import stays (AMP040 says so)
    apex_importers: tuple[tuple[str, str], ...] = ()
    # which Apex-only SyncBatchNorm options (channel_last, fuse_relu) some Python file of the project
    # (a vendored copy of Apex aside) spells; None when the project was not scanned: a SyncBatchNorm
    # class stored in a variable may be handed to the project's code only where it spells none
    apex_options_spelled: tuple[str, ...] | None = None
    # the GradScaler shared across modules: the module that creates it passes it (as a
    # keyword named ``Options.scaler_name``) to these imported functions ("f" or "mod.f")...
    passes_scaler: tuple[str, ...] = ()
    # ...and the module that defines them gives these top-level functions that parameter
    receives_scaler: tuple[str, ...] = ()
    shared_scaler: ScalerInfo | None = None
    # attributes that carry the amp module between modules (``args.amp = amp`` after amp.initialize
    # in one, ``args.amp.scale_loss(...)`` in another): they now carry the GradScaler (``_carriers``)
    carriers: frozenset[str] = frozenset()
    # (function qualname, name): the names and parameters that only ever hold None once the Apex
    # fallbacks of torch version tests go (``migrate.version_fallbacks``); their code goes with them.
    # None where no project plan looked (the module looks at its own functions alone)
    none_only: frozenset[tuple[str, str]] | None = None
    # (function name, parameter): parameters that amp.initialize is given as its loss_scale and that
    # every call of their top-level function in the project leaves at their default
    # (``version_fallbacks.holds_default``): the scale is that default's
    held_defaults: frozenset[tuple[str, str]] = frozenset()
    # top-level functions here whose only results are the Apex amp module or None
    # (``migrate.amp_factories``): (name, the test under which it imports amp or "", where its
    # callers in the project keep that result or "" where the project was not read whole)
    amp_factories: tuple[tuple[str, str, str], ...] = ()
    # the results of such a function kept here: (class, function, ``amp`` or ``self.amp``, the
    # call as spelled, the function's place), for the findings at the calls made through them
    amp_factory_results: tuple[tuple[str, str, str, str, str], ...] = ()
    # where the carrier holds the amp module: the ``if`` tests on the way to each store (``<obj>`` for
    # the object, True for a body, False for an else); the readers' own tests must say the same
    carrier_conditions: tuple[tuple[str, bool], ...] | None = None
    # names imported from a project module that copies Apex's fp16_utils (``migrate.apex_copies``):
    # (module as spelled, name, Apex path or "", where it is defined, what keeps it from being treated
    # like Apex or "", what keeps dynamic loss scaling with it from being migrated or "")
    apex_copies: tuple[tuple[str, str, str, str, str, str], ...] = ()
    # imported project functions (as this module calls them) that compute a norm of the gradients
    # they are given (``migrate.gradient_norms``): on scaled gradients, divided by the scale
    gradient_norms: tuple[str, ...] = ()
    # imported project functions (as this module calls them) that return the model they are given
    # halved under a flag (``migrate.halving_helpers``): (name as called, the model's parameter
    # index, its name, the flag's parameter index, its name, the flag's attribute, the defining module)
    halving_helpers: tuple[tuple[str, int, str, int, str, str, str], ...] = ()
    # imported project functions that use one parameter only as ``P.param_groups`` (name as called,
    # the parameter's index, its name): an FP16_Optimizer passed there may be the wrapped optimizer
    param_group_readers: tuple[tuple[str, int, str], ...] = ()
    # project functions defined here whose amp.initialize moves to their callers (``FactorySetup``):
    # it goes without a GradScaler of its own, each with what its callers out of the run do (""
    # or where they call it without an optimizer, for inference)...
    hands_off: tuple[tuple[str, str], ...] = ()
    # ...and the modules that call them set one up where each call returns
    factory_setups: tuple[FactorySetup, ...] = ()
    # top-level classes here deriving from a class of another module that keeps the GradScaler on
    # ``self`` (``ScalerInfo.klass``): their methods reach it there too
    inherited_scalers: tuple[tuple[str, ScalerInfo], ...] = ()
    # methods here that a library's runner calls (an mmcv optimizer hook's ``after_train_iter(self,
    # runner)``, a runner subclass's ``resume``), reaching the GradScaler the module that built the
    # runner keeps on it (``migrate.runner_hooks``): (class, method, the expression that reaches it)
    runner_scalers: tuple[tuple[str, str, str], ...] = ()
    # the module that builds the runner: (the runner's name, the line of the statement that builds
    # it, the model's name); the runner keeps the scaler, the model's forward runs under autocast
    runner_carrier: tuple[str, int, str] | None = None
    # imported project functions (as this module calls them) that hand the model they are given an
    # input cast to float16 by hand (``migrate.half_inputs.feeders``): (name as called, the model
    # parameter's index or -1 where keyword-only, its name, the defining module, the cast's line, the
    # cast, what it casts); an O2/O3 setup whose model goes there stays as it was
    half_feeders: tuple[tuple[str, int, str, str, int, str, str], ...] = ()


@dataclass(frozen=True)
class FactorySetup:
    """A project function that calls ``amp.initialize`` and returns what it set up, as its
    callers in other modules see it (``migrate.factories``).

    A caller's ``model, optimizer = setup(model, optimizer, device, args.fp16, args.opt_level)``
    is migrated as if ``model, optimizer = amp.initialize(model, optimizer,
    opt_level=args.opt_level, enabled=args.fp16)`` followed it: the function's own call, with
    its parameters replaced by the caller's arguments.
    """

    name: str  # the function as callers spell it ("setup" or "model_utils.setup")
    parameters: tuple[str, ...]  # its parameters in order (no *args or **kwargs)
    defaults: tuple[tuple[str, str], ...]  # parameter -> default, as literal source text
    call: str  # the amp.initialize call as written in it
    models: str  # the name of the model (or models) it passes to amp.initialize and returns...
    optimizers: str  # ...and of the optimizer(s)
    guard: str | None  # the tests that lead to the call (``fp16``), joined with ``and``; None: always
    returned: tuple[int, int, int]  # how many values it returns, where the models and the optimizers are


@dataclass(frozen=True)
class ScalerInfo:
    """What other modules need to know about a GradScaler a module creates."""

    function: str | None  # the top-level function that creates it; None: module level
    static_scale: float | None  # a fixed loss scale (``update(new_scale=...)`` holds it)
    follows: bool  # autocast is on exactly when the scaler is (``scaler.is_enabled()``)
    models: tuple[str, ...] = ()  # names of the models given to amp.initialize
    # the name holding a loss scale chosen at run time (passed on beside the scaler); None: no such name
    held_scale: str | None = None
    # a scaler its class keeps on ``self`` (made in a method): the top-level class, and the attribute
    klass: str | None = None
    attribute: str = ""
    # ...and the optimizers (``self.optimizer``) whose step its methods make with it
    stepped: tuple[str, ...] = ()


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
