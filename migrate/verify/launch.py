"""Starting recorded runs: forked from a server that has imported torch once, or as subprocesses.

Importing torch costs seconds; a verify run of a small script a fraction of one. ``Zygote``
starts ``python -m migrate.shim.zygote`` once and has it fork a child per run, so a verify of
three or four runs pays for one import (and a test session that shares one ``Zygote`` for
one import in all). ``Subprocesses`` starts ``python -m migrate.shim.record`` per run: the
fallback where fork is not available. Both write each run's stdout and stderr to files, never
to pipes, so a chatty script cannot stall on a full pipe.

Nothing here imports torch.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

#: How long the server may take to import torch before it is given up for subprocesses.
STARTUP_TIMEOUT_S = 300.0


@dataclass
class RunSpec:
    """One recorded run: ``python -m migrate.shim.record ARGV`` in CWD with ENV."""

    label: str
    argv: list[str]
    cwd: Path
    env: dict[str, str]
    stdout: Path
    stderr: Path

    @property
    def command(self) -> list[str]:
        return [sys.executable, "-m", "migrate.shim.record", *self.argv]


class Handle(Protocol):
    """A run in flight."""

    spec: RunSpec

    def wait(self, timeout: float) -> int:
        """Wait for the run; its exit code (``-9``: killed after ``timeout`` seconds)."""

    def kill(self) -> None:
        """Stop the run now if it is still going."""


class Launcher(Protocol):
    """Starts runs."""

    def start(self, spec: RunSpec) -> Handle: ...

    def close(self) -> None: ...


def package_root() -> str:
    return str(Path(__file__).resolve().parents[2])


def base_environment() -> dict[str, str]:
    """This process's environment with the package importable."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root(), env.get("PYTHONPATH")]))
    return env


class _ProcessHandle:
    def __init__(self, spec: RunSpec) -> None:
        self.spec = spec
        with open(spec.stdout, "wb") as stdout, open(spec.stderr, "wb") as stderr:
            self.process = subprocess.Popen(spec.command, cwd=spec.cwd, env=spec.env, stdout=stdout, stderr=stderr)

    def wait(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return -9

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


class Subprocesses:
    """One ``python -m migrate.shim.record`` process per run."""

    def start(self, spec: RunSpec) -> Handle:
        return _ProcessHandle(spec)

    def close(self) -> None:
        pass


class ZygoteError(RuntimeError):
    """The fork server could not start or stopped answering."""


class _ForkedHandle:
    def __init__(self, zygote: Zygote, spec: RunSpec, run_id: str, pid: int) -> None:
        self.zygote = zygote
        self.spec = spec
        self.run_id = run_id
        self.pid = pid
        self.returncode: int | None = None

    def wait(self, timeout: float) -> int:
        if self.returncode is None:
            code = self.zygote.wait_for(self.run_id, timeout)
            if code is None:
                self.kill()
                self.zygote.wait_for(self.run_id, 30.0)
                self.returncode = -9
            else:
                self.returncode = code
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class Zygote:
    """A ``python -m migrate.shim.zygote`` server; raises ZygoteError when it cannot serve."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self._log = tempfile.TemporaryFile()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "migrate.shim.zygote"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=env or base_environment(),
        )
        self._buffer = b""
        self._codes: dict[str, int] = {}
        self._pids: dict[str, int] = {}
        self._counter = 0
        ready = self._read_until(lambda message: "ready" in message, STARTUP_TIMEOUT_S)
        if ready is None or not ready.get("ready"):
            why = (ready or {}).get("error") or self._stderr_tail() or "no answer"
            self.close()
            raise ZygoteError(f"the fork server did not start: {why}")

    def _stderr_tail(self) -> str:
        self._log.seek(0)
        return self._log.read().decode("utf-8", "replace").strip()[-2000:]

    def _read_until(self, wanted: object, timeout: float) -> dict[str, object] | None:
        """Read answers until one satisfies ``wanted`` (a predicate); None on timeout or EOF."""
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        deadline = time.monotonic() + timeout
        while True:
            while b"\n" in self._buffer:
                line, self._buffer = self._buffer.split(b"\n", 1)
                try:
                    message = json.loads(line)
                except ValueError:
                    continue
                if "rc" in message:
                    self._codes[str(message["id"])] = int(message["rc"])
                if "pid" in message and "id" in message:
                    self._pids[str(message["id"])] = int(message["pid"])
                if wanted(message):  # type: ignore[operator]
                    return dict(message)
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            readable, _, _ = select.select([fd], [], [], left)
            if not readable:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self._buffer += chunk

    def start(self, spec: RunSpec) -> Handle:
        self._counter += 1
        run_id = f"{spec.label}#{self._counter}"
        request = {
            "id": run_id,
            "argv": spec.argv,
            "cwd": str(spec.cwd),
            "env": spec.env,
            "stdout": str(spec.stdout),
            "stderr": str(spec.stderr),
        }
        assert self.process.stdin is not None
        try:
            self.process.stdin.write((json.dumps(request) + "\n").encode())
            self.process.stdin.flush()
        except OSError as error:
            raise ZygoteError(f"the fork server stopped: {error}") from None
        answer = self._read_until(lambda message: message.get("id") == run_id and "pid" in message, 60.0)
        if answer is None:
            raise ZygoteError(f"the fork server did not start the run: {self._stderr_tail() or 'no answer'}")
        return _ForkedHandle(self, spec, run_id, int(answer["pid"]))  # type: ignore[call-overload]

    def wait_for(self, label: str, timeout: float) -> int | None:
        if label not in self._codes:
            self._read_until(lambda message: message.get("id") == label and "rc" in message, timeout)
        return self._codes.get(label)

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                assert self.process.stdin is not None
                self.process.stdin.close()
                self.process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()
        self._log.close()


def default_launcher() -> Launcher:
    """A fork server where one can run, else subprocesses."""
    if not hasattr(os, "fork"):
        return Subprocesses()
    try:
        return Zygote()
    except ZygoteError:
        return Subprocesses()
