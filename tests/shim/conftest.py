"""Every shim test starts from a clean amp state and an unpatched torch."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

torch = pytest.importorskip("torch", reason="the shim emulates Apex on top of torch")


@pytest.fixture(autouse=True)
def clean_amp_state() -> Iterator[None]:
    from migrate.shim import casting
    from migrate.shim.amp_state import _amp_state

    yield
    casting.reset()
    _amp_state.reset()
