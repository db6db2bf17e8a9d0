"""Parsing ahead: a worker parses a file that passed the pre-filter while the main process
still walks the tree or plans the project, and keeps its trees for the file's migration
(which the main process then sends to that worker). Imported only where a file needs
parsing: a pre-commit run on files without Apex never pays for these classes.
"""

from __future__ import annotations

import gc
import io
import os
import tokenize
from dataclasses import dataclass
from typing import TYPE_CHECKING

from migrate.discovery import Candidate
from migrate.gcpause import cycle_collector_paused

if TYPE_CHECKING:
    from migrate.engine import Parsed


@dataclass(frozen=True)
class Prepare:
    """A file for a worker to parse ahead, while the main process still walks the tree or
    plans the project: its migration (a ``Job``, once its facts are known) then goes to that
    worker, which skips both parses (picklable)."""

    candidate: Candidate
    data: bytes


@dataclass(frozen=True)
class Ready:
    """A worker's answer to ``Prepare``: the worker (process id) that holds the file's trees;
    None when it holds none (the file does not decode or parse: its migration says so)."""

    path: str
    worker: int | None


# Source bytes a worker may hold parsed ahead (libcst's tree of a file takes some tens of
# times its size): a tree larger than that parses when its file is migrated, as before.
AHEAD_BYTES = 4 << 20


@dataclass(frozen=True)
class Held:
    """A file's trees, parsed ahead, as a worker keeps them (with the bytes they came from)."""

    data: bytes
    encoding: str
    parsed: Parsed


def prepare(job: Prepare, ahead: dict[str, Held]) -> Ready:
    """Parse a file ahead of its migration, in a worker; its trees stay there."""
    from migrate.engine import parse_ahead

    # The main process sends AHEAD_BYTES a worker in all, but one worker may take most of it.
    if sum(len(held.data) for held in ahead.values()) + len(job.data) > AHEAD_BYTES:
        return Ready(str(job.candidate.path), None)  # no room left here: parsed when migrated
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(job.data).readline)
        text = job.data.decode(encoding)
    except (SyntaxError, UnicodeDecodeError, LookupError):
        return Ready(str(job.candidate.path), None)
    # The trees are kept for a while: they go to the permanent generation before the cycle
    # collector runs again, else its next pass walks every node of them (tens of ms a file)
    # only to find them all alive.
    with cycle_collector_paused():
        parsed = parse_ahead(text)
        if parsed is None:
            return Ready(str(job.candidate.path), None)
        ahead[str(job.candidate.path)] = Held(job.data, encoding, parsed)
        gc.freeze()
    return Ready(str(job.candidate.path), os.getpid())
