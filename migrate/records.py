"""The records only some runs make: a file that passed the pre-filter (its task, its job for
a worker, the findings placed in it) and what discovery reports besides files.

Apart from the modules every run imports: making a dataclass costs about 1.5 ms, and a
pre-commit run on a file without Apex, which makes none of these, has 0.1 s in all.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from migrate.discovery import Candidate
from migrate.options import Options


@dataclass(frozen=True)
class Diagnostic:
    """A finding placed in a file (and, for notebooks, a cell) for the user."""

    path: str
    line: int
    column: int
    code: str
    message: str
    fixed: bool
    cell: int | None = None  # 1-based cell number in a notebook

    @property
    def location(self) -> str:
        return self.path if self.cell is None else f"{self.path}:cell {self.cell}"

    def format(self) -> str:
        return f"{self.location}:{self.line}:{self.column}: {self.code} {self.message}"


@dataclass(frozen=True)
class DiscoveryError:
    """A path that could not be searched (missing, unreadable folder, symlink loop)."""

    display: str
    reason: str


@dataclass(frozen=True)
class Notice:
    """Something the user should know that is not a failure (a link not followed)."""

    display: str
    message: str


@dataclass(frozen=True)
class Leftover:
    """A temporary file of an earlier ``--write`` found beside the files."""

    path: str
    display: str


@dataclass(frozen=True)
class Task:
    """A file that passed the pre-filter: its bytes as read, and its stat for the write
    (``file_stat``) or as looked at before reading (``seen``, at time ``looked_at``)."""

    candidate: Candidate
    data: bytes
    file_stat: os.stat_result | None
    seen: os.stat_result | None = None
    looked_at: float = 0.0
    # the stat index says an earlier run took the file as it is now (its results are likely cached)
    known: bool = False


@dataclass(frozen=True)
class Job:
    """One file for a worker: its bytes (the very ones the project plan read) and its
    options, facts included (picklable)."""

    candidate: Candidate
    data: bytes
    options: Options
