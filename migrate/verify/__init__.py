"""``ampmigrate verify``: does the migration train like the original?

The original runs under the Apex shim, the migration natively, each in a child of a fork server
that imported torch once (``launch``), recorded step by step (``migrate.shim.record``):
the losses, the loss scale, skipped steps, gradient and update norms. Overflows are planted in
the original and replayed in the migration, so that loss scaling is exercised; an fp32 run of
the original calibrates the tolerances (``session``). ``judge`` decides, ``report`` tells.

This package does not import torch: everything torch-related runs in the child processes.
"""

from __future__ import annotations

from migrate.verify.command import run_cli
from migrate.verify.judge import FACTOR, RESOLUTION, Finding, Judgement, judge
from migrate.verify.records import RunRecord, Step
from migrate.verify.session import (
    DEFAULT_STEPS,
    EXIT_DIVERGE,
    EXIT_ERROR,
    EXIT_MATCH,
    GROWTH_INTERVAL,
    Session,
    VerifyResult,
    compare,
    default_overflow_steps,
)

__all__ = [
    "DEFAULT_STEPS",
    "EXIT_DIVERGE",
    "EXIT_ERROR",
    "EXIT_MATCH",
    "FACTOR",
    "GROWTH_INTERVAL",
    "RESOLUTION",
    "Finding",
    "Judgement",
    "RunRecord",
    "Session",
    "Step",
    "VerifyResult",
    "compare",
    "default_overflow_steps",
    "judge",
    "run_cli",
]
