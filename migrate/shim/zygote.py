"""A fork server for ``ampmigrate verify``: import torch once, fork one child per recorded run.

Importing torch (and ``torch._dynamo``, which the CUDA-to-CPU mapping pulls in) takes seconds
while a verify run of a small script takes a fraction of one; a verify needs three runs or more.
``python -m migrate.shim.zygote`` imports everything once, then serves requests, one JSON line
each on stdin::

    {"id": "original", "argv": [...record arguments...], "cwd": DIR, "env": {...},
     "stdout": FILE, "stderr": FILE}

and answers on stdout with ``{"id": ..., "pid": N}`` once the child is forked and
``{"id": ..., "rc": CODE}`` when it has ended (a negative code: killed by that signal). The
first line it writes is ``{"ready": true}``, or ``{"ready": false, "error": ...}`` when it cannot
serve (no ``fork``, or CUDA already initialised: a forked child could not use it). End of input
ends the server; children still running are killed.

Each child is a fresh copy of a process that has imported torch and the shim modules but
installed nothing and run nothing, so the runs do not see each other.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import sys
import time
import traceback
from typing import Any

# The answers go to a copy of the original stdout; fd 1 itself then points at stderr, so that
# nothing printed while importing can be mistaken for an answer.
_protocol_fd = -1


def _send(message: dict[str, Any]) -> None:
    os.write(_protocol_fd, (json.dumps(message) + "\n").encode())


def _child(request: dict[str, Any]) -> int:
    """In the forked child: redirect, move, set the environment, record; the exit code."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    from migrate.shim import record

    try:
        return record.main(list(request["argv"]))
    except SystemExit as exit_:
        code = exit_.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)
        return 1
    except BaseException:
        traceback.print_exc()
        return 1


def _preload() -> str | None:
    """Import what every run needs; a reason not to serve, or None."""
    if not hasattr(os, "fork"):
        return "os.fork is not available"
    import torch

    torch.set_num_threads(1)
    try:
        import torch._dynamo
    except Exception:
        pass
    import migrate.shim.amp
    import migrate.shim.cuda_on_cpu
    import migrate.shim.fp16_utils
    import migrate.shim.normalization
    import migrate.shim.optimizers
    import migrate.shim.parallel
    import migrate.shim.record
    import migrate.shim.run  # noqa: F401

    if torch.cuda.is_initialized():
        return "CUDA was initialised while importing: forked children could not use it"
    return None


def serve() -> int:
    """Answer requests until stdin closes."""
    global _protocol_fd
    _protocol_fd = os.dup(1)
    os.dup2(2, 1)
    reason = _preload()
    if reason is not None:
        _send({"ready": False, "error": reason})
        return 1
    sys.stdout.flush()
    sys.stderr.flush()
    _send({"ready": True, "pid": os.getpid()})
    children: dict[int, str] = {}
    selector = selectors.DefaultSelector()
    selector.register(0, selectors.EVENT_READ)
    pending = b""
    open_input = True
    while open_input or children:
        if open_input and selector.select(timeout=0.01 if children else None):
            chunk = os.read(0, 65536)
            if not chunk:
                open_input = False
                for pid in children:
                    os.kill(pid, signal.SIGKILL)
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    code = 1
                    try:
                        selector.close()
                        os.close(_protocol_fd)
                        code = _child(request)
                    finally:
                        sys.stdout.flush()
                        sys.stderr.flush()
                        os._exit(code)
                children[pid] = request["id"]
                _send({"id": request["id"], "pid": pid})
        elif not open_input:
            time.sleep(0.01)
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            run_id = children.pop(pid, None)
            if run_id is not None:
                _send({"id": run_id, "rc": os.waitstatus_to_exitcode(status)})
    return 0


if __name__ == "__main__":
    code = serve()
    sys.stdout.flush()
    sys.stderr.flush()
    # Nothing to clean up, and tearing torch down takes seconds.
    os._exit(code)
