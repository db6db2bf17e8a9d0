"""Run ``python -m migrate.shim`` jobs from one interpreter that has imported torch once.

Usage: ``python batch_run.py JOBS.json RESULTS.json PARALLEL TIMEOUT_S``

JOBS.json is a list of ``{"argv": [...], "cwd": ..., "stdout": ..., "stderr": ...}``: the
arguments of ``python -m migrate.shim``, the working directory and the files that get the
output. RESULTS.json receives the exit status of each job, in order (``-9`` for a job killed
after TIMEOUT_S).

Why: a new ``python -m migrate.shim`` spends about 4 s before the script does anything,
importing torch and then ``torch._dynamo`` (which the first optimizer pulls in), while the
tiny e2e trainings take well under a second. Here both are imported once, and each job runs in
a forked child (at most PARALLEL at a time). The child starts from the same untouched torch a
new interpreter would have (nothing of the shim is imported before the fork, and the parent
has no other thread), then does what ``python -m migrate.shim ARGV`` does: its own working
directory, ``sys.path[0]``, argv, stdout and stderr, and its exit status. Where there is no
fork (Windows), each job is a new ``python -m migrate.shim`` instead.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import traceback
from typing import Any


def _run_job(job: dict[str, Any]) -> int:
    """In the child: ``python -m migrate.shim *argv`` in ``cwd``; the exit status."""
    os.chdir(job["cwd"])
    for fd, path in ((1, job["stdout"]), (2, job["stderr"])):
        handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(handle, fd)
        os.close(handle)
    sys.path[0] = os.getcwd()  # as `python -m` sets it
    try:
        from migrate.shim.__main__ import main as shim_main

        return shim_main(job["argv"])
    except SystemExit as exit:
        if exit.code is None or isinstance(exit.code, int):
            return exit.code or 0
        print(exit.code, file=sys.stderr)
        return 1
    except BaseException:
        traceback.print_exc()
        return 1


def _fork(job: dict[str, Any]) -> int:
    """Start the job in a forked child; its pid."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        code = _run_job(job)
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code if 0 <= code <= 255 else 1)


class _Started:
    """A running job: a forked child, or (where there is no fork) a new interpreter."""

    def __init__(self, job: dict[str, Any]) -> None:
        self.started = time.monotonic()
        self.process: subprocess.Popen[bytes] | None = None
        self.pid = 0
        if hasattr(os, "fork"):
            self.pid = _fork(job)
            return
        with open(job["stdout"], "wb") as stdout, open(job["stderr"], "wb") as stderr:
            command = [sys.executable, "-m", "migrate.shim", *job["argv"]]
            self.process = subprocess.Popen(command, cwd=job["cwd"], stdout=stdout, stderr=stderr)

    def poll(self) -> int | None:
        if self.process is not None:
            return self.process.poll()
        pid, status = os.waitpid(self.pid, os.WNOHANG)
        return None if pid == 0 else os.waitstatus_to_exitcode(status)

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
        else:
            os.kill(self.pid, signal.SIGKILL)


def main(argv: list[str]) -> int:
    jobs_path, results_path, parallel, timeout = argv[0], argv[1], int(argv[2]), float(argv[3])
    with open(jobs_path, encoding="utf-8") as handle:
        jobs: list[dict[str, Any]] = json.load(handle)
    import torch
    import torch._dynamo  # noqa: F401

    codes: list[int | None] = [None] * len(jobs)
    waiting = list(range(len(jobs)))
    running: dict[int, _Started] = {}  # job index -> its run
    while waiting or running:
        while waiting and len(running) < parallel:
            index = waiting.pop(0)
            running[index] = _Started(jobs[index])
        for index, run in list(running.items()):
            code = run.poll()
            if code is not None:
                codes[index] = code
                del running[index]
            elif time.monotonic() - run.started > timeout:
                run.kill()
        time.sleep(0.01)
    with open(results_path, "w", encoding="utf-8") as handle:
        json.dump(codes, handle)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
