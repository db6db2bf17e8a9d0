"""Worker processes that parse files, so that no single file can take the run down.

libcst's parser is native code: an input it cannot handle can crash the process or
eat all memory. Every parse therefore happens in a worker process, one file at a time,
and each worker has bounds:

- memory: its address space may grow by ``MEMORY_LIMIT`` (Linux), so a runaway parse
  fails with MemoryError or dies instead of swapping the machine to a halt;
- time: each file gets ``cpu_seconds(size)`` of CPU time (the kernel stops the worker
  after that, even when the main process is gone) and a wall-clock allowance the main
  process enforces;
- a crash (SIGSEGV, an abort) fails that file only: the worker is replaced and the
  others carry on;
- Ctrl-C reaches the main process only, which decides what an interrupt means;
- a worker whose main process has died exits (without interrupting a write), rather than
  carrying on alone.

The pool is generic: ``setup(settings)`` runs once in each worker and returns the
function applied to each job there; ``lost(job, reason)`` builds the result of a job
whose worker died.
"""

from __future__ import annotations

import heapq
import itertools
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from migrate.atomic import WRITE_LOCK

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from multiprocessing.context import DefaultContext, ForkContext
    from multiprocessing.process import BaseProcess

MEMORY_LIMIT = 4 << 30  # bytes of address space a worker may add to what it starts with
CPU_SECONDS = 60.0  # per file, plus CPU_SECONDS_PER_MB for each MB of it
CPU_SECONDS_PER_MB = 60.0
# Wall-clock allowance for a file, over its CPU allowance: other processes compete for
# the cores, so wall time runs ahead of CPU time on a busy machine.
WALL_FACTOR = 4.0
# After Ctrl-C the files in progress get this long to finish (their writes are atomic
# either way); a second Ctrl-C stops them at once.
GRACE_SECONDS = 10.0


def cpu_seconds(size: int) -> float:
    """The CPU time a file of ``size`` bytes may take."""
    return CPU_SECONDS + CPU_SECONDS_PER_MB * size / 1e6


@dataclass
class _Worker:
    process: BaseProcess
    connection: Connection
    job: Any = None
    started: float = 0.0
    deadline: float = 0.0
    fresh: bool = True  # not yet given a job


@dataclass
class Pool:
    """Up to ``jobs`` worker processes, started when work arrives.

    ``submit`` queues a job (largest first), ``poll`` collects what is done without
    waiting (or waits up to ``timeout``), ``drain`` waits for everything. Results come
    back through ``done`` in completion order.

    A job may prefer a worker (by process id; the one that holds something of it, such
    as its parsed tree): that worker takes it before any other job, and another worker
    takes it only when it has nothing else to do, or when the preferred one is gone.
    """

    jobs: int
    setup: Callable[[Any], Callable[[Any], Any]]
    settings: Any
    lost: Callable[[Any, str], Any]
    done: Callable[[Any], None]
    workers: list[_Worker] = field(default_factory=list)
    queue: list[tuple[int, int, Any, float]] = field(default_factory=list)
    preferred: dict[int, list[tuple[int, int, Any, float]]] = field(default_factory=dict)
    counter: itertools.count[int] = field(default_factory=itertools.count)
    submitted: int = 0

    def submit(self, job: Any, size: int, prefer: int | None = None, dispatch: bool = True) -> None:
        """Queue ``job``; ``dispatch=False`` leaves it queued until the next ``poll`` (so that
        a batch is queued whole before any worker picks from it)."""
        item = (-size, next(self.counter), job, cpu_seconds(size))
        if prefer is not None and any(worker.process.pid == prefer for worker in self.workers):
            heapq.heappush(self.preferred.setdefault(prefer, []), item)
        else:
            heapq.heappush(self.queue, item)
        self.submitted += 1
        if dispatch:
            self._dispatch()

    def drop(self, unwanted: Callable[[Any], bool]) -> None:
        """Forget the queued jobs (none in progress) that ``unwanted`` selects."""
        for queue in (self.queue, *self.preferred.values()):
            queue[:] = [item for item in queue if not unwanted(item[2])]
            heapq.heapify(queue)

    @property
    def pending(self) -> int:
        """Jobs submitted and not yet done."""
        queued = len(self.queue) + sum(len(queue) for queue in self.preferred.values())
        return queued + sum(worker.job is not None for worker in self.workers)

    @property
    def busy(self) -> bool:
        return self._waiting() or any(worker.job is not None for worker in self.workers)

    def _waiting(self) -> bool:
        return bool(self.queue) or any(self.preferred.values())

    def _take(self, worker: _Worker | None) -> tuple[int, int, Any, float]:
        """The next job for ``worker``: its own first, then any job no worker is preferred
        for, then the largest one another worker is preferred for (that one is busy)."""
        own = self.preferred.get(worker.process.pid or 0) if worker is not None else None
        if own:
            return heapq.heappop(own)
        if self.queue:
            return heapq.heappop(self.queue)
        return heapq.heappop(min((queue for queue in self.preferred.values() if queue), key=lambda queue: queue[0]))

    def _dispatch(self) -> None:
        while self._waiting():
            worker = next((w for w in self.workers if w.job is None), None)
            if worker is None:
                if len(self.workers) >= self.jobs:
                    return
                try:
                    worker = self._start()
                except OSError as error:  # no process to be had (EAGAIN, ENOMEM)
                    if self.workers:
                        return  # the running ones will take the queue
                    _, _, job, _ = self._take(None)
                    self.done(self.lost(job, f"cannot start a worker process: {error.strerror or error}"))
                    continue
            item = self._take(worker)
            _, _, job, cpu = item
            try:
                worker.connection.send((job, cpu))
            except (OSError, ValueError):  # it died while idle: the job goes to another
                self._retire(worker)
                if worker.fresh:
                    self.done(self.lost(job, "the worker process died as it started (please report this)"))
                else:
                    heapq.heappush(self.queue, item)
                continue
            worker.fresh = False
            worker.job = job
            worker.started = time.monotonic()
            worker.deadline = worker.started + WALL_FACTOR * cpu + 30.0

    def _start(self) -> _Worker:
        context = _context()
        parent_end, child_end = context.Pipe()
        process = context.Process(
            target=_worker_main,
            args=(child_end, self.setup, self.settings, os.getpid()),
            daemon=True,
            name="ampmigrate-worker",
        )
        # Started with SIGINT ignored (a worker inherits that), so that Ctrl-C reaches
        # only this process, even in the instant before the worker sets up.
        previous = _ignore_sigint()
        try:
            process.start()
        finally:
            _restore_sigint(previous)
        child_end.close()
        worker = _Worker(process, parent_end)
        self.workers.append(worker)
        return worker

    def poll(self, timeout: float = 0.0) -> None:
        """Collect finished jobs (waiting up to ``timeout`` for one), then dispatch more."""
        from multiprocessing.connection import wait

        running = [worker for worker in self.workers if worker.job is not None]
        if running:
            now = time.monotonic()
            timeout = max(0.0, min(timeout, *(worker.deadline - now for worker in running)))
            watched: dict[Any, _Worker] = {}
            for worker in running:
                watched[worker.connection] = worker
                watched[worker.process.sentinel] = worker
            ready = wait(list(watched), timeout)
            for worker in {id(watched[obj]): watched[obj] for obj in ready}.values():
                self._collect(worker)
            now = time.monotonic()
            for worker in running:
                if worker.job is not None and now > worker.deadline:
                    self._fail(worker, f"took more than {worker.deadline - worker.started:.0f} s; stopped")
        self._dispatch()

    def _collect(self, worker: _Worker) -> None:
        job = worker.job
        try:
            if worker.connection.poll():
                result = worker.connection.recv()
                worker.job = None
                self.done(result)
                return
        except (EOFError, OSError):
            pass
        if worker.process.is_alive():
            return  # woken by the pipe closing ahead of the exit: the sentinel follows
        worker.process.join()
        self._retire(worker)
        self.done(self.lost(job, _death_reason(worker.process.exitcode)))

    def _fail(self, worker: _Worker, reason: str) -> None:
        job = worker.job
        worker.process.kill()
        worker.process.join()
        self._retire(worker)
        self.done(self.lost(job, reason))

    def _retire(self, worker: _Worker) -> None:
        worker.job = None
        worker.connection.close()
        if worker in self.workers:
            self.workers.remove(worker)
        for item in self.preferred.pop(worker.process.pid or 0, []):  # any worker takes them now
            heapq.heappush(self.queue, item)

    def drain(self) -> None:
        """Wait until every submitted job is done."""
        while self.busy:
            self.poll(timeout=1.0)

    def interrupt(self, grace: float = GRACE_SECONDS) -> None:
        """Ctrl-C: drop the queue, let the files in progress finish (a second Ctrl-C kills)."""
        self.queue.clear()
        self.preferred.clear()
        end = time.monotonic() + grace
        try:
            while self.busy and time.monotonic() < end:
                self.poll(timeout=0.2)
        except KeyboardInterrupt:
            pass
        for worker in list(self.workers):
            if worker.job is not None:
                self._fail(worker, "interrupted before this file was done; left as it was or fully written")

    def close(self) -> None:
        """Stop every worker (idle ones exit when told; any other is killed)."""
        for worker in self.workers:
            if worker.job is None:
                try:
                    worker.connection.send(None)
                except (OSError, ValueError):
                    pass
        for worker in self.workers:
            worker.process.join(timeout=5 if worker.job is None else 0)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join()
            worker.connection.close()
        self.workers.clear()


def forks() -> bool:
    """Whether workers are forked from this process (and so share what it imported)."""
    return sys.platform.startswith("linux")


def _context() -> ForkContext | DefaultContext:
    import multiprocessing

    # fork starts a worker in milliseconds and shares what is already imported; where it
    # is not available (Windows, macOS default) the platform's default is used.
    if forks():
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context()


def _ignore_sigint() -> Any:
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGINT, signal.SIG_IGN)


def _restore_sigint(previous: Any) -> None:
    if previous is not None:
        signal.signal(signal.SIGINT, previous)


def _death_reason(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        number = -exitcode
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        if name == "SIGXCPU":
            return "took more CPU time than allowed for its size; stopped"
        if name == "SIGKILL":
            return "the worker process was killed (SIGKILL; out of memory?)"
        return f"the worker process crashed ({name}) on this file (please report this)"
    return f"the worker process exited unexpectedly (exit code {exitcode}) (please report this)"


def _worker_main(
    connection: Connection,
    setup: Callable[[Any], Callable[[Any], Any]],
    settings: Any,
    parent: int,
) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _limit_memory(MEMORY_LIMIT)
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True, name="parent-watch").start()
    handle = setup(settings)
    while True:
        try:
            message = connection.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        job, cpu = message
        _limit_cpu(cpu)
        result = handle(job)
        try:
            connection.send(result)
        except (OSError, ValueError):
            return


def _watch_parent(parent: int) -> None:
    """Exit as soon as the main process is gone, but never in the middle of a write."""
    while True:
        time.sleep(0.2)
        if os.getppid() != parent:
            with WRITE_LOCK:
                os._exit(1)


def _limit_memory(extra: int) -> None:
    """Cap this process's address space at its current size plus ``extra`` bytes.

    Relative, not absolute: a worker forked from a large process (a test run that has
    imported torch) starts with gigabytes of mappings it will never touch.
    """
    try:
        import resource

        with open("/proc/self/statm") as statm:  # Linux: sizes in pages
            size = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        soft = size + extra
        if hard != resource.RLIM_INFINITY:
            soft = min(soft, hard)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    except (ImportError, OSError, ValueError):
        pass  # elsewhere the limit is not enforced reliably anyway


def _limit_cpu(seconds: float) -> None:
    """Let the kernel stop this worker once the current file has used ``seconds`` of CPU."""
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return
    usage = resource.getrusage(resource.RUSAGE_SELF)
    used = usage.ru_utime + usage.ru_stime
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = int(used + seconds) + 1
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    try:
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
    except (OSError, ValueError):
        pass
