"""What a recorded run produced, read back from the JSON lines ``migrate.shim.record`` writes."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_LOW_PRECISION = ("float16", "bfloat16")
#: Why a run stopped, in words (``summary.stopped``).
STOP_REASONS = {
    "limit": "stopped at --steps",
    "end": "the script ended",
    "exit": "the script exited",
    "error": "the script failed",
}


def _number(value: Any) -> float | None:
    """A recorded number: floats as they are, ``"inf"``/``"nan"`` as the floats they name."""
    if value is None:
        return None
    return float(value)


@dataclass
class Step:
    """One optimizer step of one run."""

    index: int
    optimizer: int
    taken: bool
    skip: str | None  # "overflow" (the scaler found inf/NaN) or "forced" (skipped by verify)
    injected: bool  # the overflow behind this skip was planted by verify
    loss: float | None  # the losses scaled since the previous step, summed
    loss_count: int
    loss_source: str | None
    scales: list[float | None]
    dynamic: bool | None
    grad_norm: float | None
    update_norm: float | None
    param_norm: float | None

    @classmethod
    def from_json(cls, entry: dict[str, Any]) -> Step:
        return cls(
            index=int(entry["step"]),
            optimizer=int(entry["optimizer"]),
            taken=bool(entry["taken"]),
            skip=entry.get("skip"),
            injected=bool(entry.get("injected")),
            loss=_number(entry.get("loss")),
            loss_count=int(entry.get("loss_count", 0)),
            loss_source=entry.get("loss_source"),
            scales=[_number(scale) for scale in entry.get("scales", [])],
            dynamic=entry.get("dynamic"),
            grad_norm=_number(entry.get("grad_norm")),
            update_norm=_number(entry.get("update_norm")),
            param_norm=_number(entry.get("param_norm")),
        )

    def value(self, quantity: str) -> float | None:
        return getattr(self, quantity)  # type: ignore[no-any-return]

    @property
    def finite_grads(self) -> bool:
        return self.grad_norm is None or math.isfinite(self.grad_norm)


@dataclass
class RunRecord:
    """What one recorded run produced."""

    label: str
    command: list[str]
    returncode: int
    stdout: str
    stderr: str
    meta: dict[str, Any] = field(default_factory=dict)
    steps: list[Step] = field(default_factory=list)
    scalers: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0

    @classmethod
    def read(cls, label: str, command: list[str], returncode: int, out: Path, stdout: Path, stderr: Path) -> RunRecord:
        record = cls(
            label,
            command,
            returncode,
            stdout.read_text(encoding="utf-8", errors="replace") if stdout.exists() else "",
            stderr.read_text(encoding="utf-8", errors="replace") if stderr.exists() else "",
        )
        if out.exists():
            for line in out.read_text(encoding="utf-8").splitlines():
                try:
                    entry = json.loads(line)
                except ValueError:  # a run killed in the middle of a line
                    continue
                kind = entry.pop("kind", None)
                if kind == "meta":
                    record.meta = entry
                elif kind == "step":
                    record.steps.append(Step.from_json(entry))
                elif kind == "scaler":
                    record.scalers.append(entry)
                elif kind == "summary":
                    record.summary = entry
        return record

    @property
    def failed(self) -> bool:
        return self.returncode != 0

    @property
    def skipped(self) -> dict[int, str]:
        """Skipped steps and why: ``overflow`` or ``forced``."""
        return {step.index: step.skip or "overflow" for step in self.steps if not step.taken}

    @property
    def stopped(self) -> str:
        """Why the run stopped, in words."""
        if self.returncode == -9:
            return "killed (timeout)"
        if self.failed:
            return f"the script failed (exit {self.returncode})"
        return STOP_REASONS.get(str(self.summary.get("stopped")), "the script ended")

    @property
    def low_precision_share(self) -> float | None:
        counts = self.summary.get("matmul_dtypes", {})
        total = sum(counts.values())
        if not total:
            return None
        return sum(counts.get(name, 0) for name in _LOW_PRECISION) / total

    def loss_op_shares(self) -> dict[str, float]:
        """Loss op -> share of its calls on float16/bfloat16 inputs."""
        totals: dict[str, int] = {}
        low: dict[str, int] = {}
        for key, count in self.summary.get("loss_op_dtypes", {}).items():
            op, _, dtype = key.partition(":")
            totals[op] = totals.get(op, 0) + count
            if dtype in _LOW_PRECISION:
                low[op] = low.get(op, 0) + count
        return {op: low.get(op, 0) / total for op, total in totals.items() if total}

    @property
    def forced_fp32(self) -> int:
        return int(self.summary.get("forced_fp32", 0))

    def first_scaler(self, impl: str) -> dict[str, Any] | None:
        return next((scaler for scaler in self.scalers if scaler.get("impl") == impl), None)
