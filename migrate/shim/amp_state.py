"""The process-wide amp state (``apex.amp._amp_state``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from migrate.shim.casting import AmpHandle, NoOpHandle
    from migrate.shim.properties import Properties
    from migrate.shim.scaler import LossScaler


class AmpState:
    """What ``amp.initialize`` decided; attributes appear as Apex's do (``handle`` only for O1)."""

    # Declared, not assigned: Apex code tests their presence (``hasattr``), and
    # ``amp.disable_casts`` outside O1 must raise AttributeError as it did in Apex.
    opt_properties: Properties
    loss_scalers: list[LossScaler]
    handle: AmpHandle | NoOpHandle
    min_loss_scale: float | None
    max_loss_scale: float

    def __init__(self) -> None:
        self.hard_override = False
        self.allow_incoming_model_not_fp32 = False
        self.verbosity = 1

    def reset(self) -> None:
        """Forget everything ``initialize`` set (tests, or a second training run in-process)."""
        for name in (
            "opt_properties",
            "loss_scalers",
            "handle",
            "min_loss_scale",
            "max_loss_scale",
        ):
            self.__dict__.pop(name, None)
        self.verbosity = 1


_amp_state = AmpState()


def maybe_print(message: str) -> None:
    """Print unless ``verbosity=0`` (Apex printed on rank 0 only; the shim is single-process)."""
    if _amp_state.verbosity > 0:
        print(message)


def master_params(optimizer: Any) -> Any:
    """Every param the optimizer steps: the fp32 masters under O2, the model params otherwise."""
    for group in optimizer.param_groups:
        yield from group["params"]
