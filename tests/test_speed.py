"""Parsing ahead (issue 11, "Faster where it is slow"): workers parse the files that pass the
pre-filter while the main process still walks the tree and plans the project, and each
file's migration goes to the worker that holds its trees. Same output, fewer parses.

The engine is patched in this process: workers are forked from it (Linux), so they run
the patched code.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import libcst as cst
import pytest

import migrate.engine
from migrate import ahead, runner, workers
from migrate.ahead import Prepare, Ready
from migrate.config import build_config
from migrate.discovery import Candidate
from migrate.options import ModuleFacts, Options
from migrate.records import Job
from migrate.runner import FileResult, Settings, Status, run

APEX = """\
import torch
from apex import amp


def train(model, optimizer, loader):
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    for x, y in loader:
        loss = model(x, y)
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
"""

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork and signals: Linux")

REAL_PARSE = migrate.engine.parse


def migrate_tree(root: Path, monkeypatch: pytest.MonkeyPatch, **options: object) -> dict[str, FileResult]:
    monkeypatch.chdir(root)
    results = run([Path(".")], build_config([Path(".")], **options))  # type: ignore[arg-type]
    return {result.path: result for result in results}


def test_a_migration_takes_the_trees_parsed_ahead_and_says_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(Options(), write=False, want_diff=True, cache_dir=None, fingerprint=None)
    candidate = Candidate("train.py", "train.py")
    data = APEX.encode()
    job = Job(candidate, data, Options())
    expected = runner._setup_worker(settings)(job)
    assert isinstance(expected, FileResult) and expected.status is Status.CHANGED

    handle = runner._setup_worker(settings)
    ready = handle(Prepare(candidate, data))
    assert ready == Ready("train.py", os.getpid())

    def no_second_parse(source: str) -> cst.Module:
        raise AssertionError("parsed again")

    monkeypatch.setattr(migrate.engine, "parse", no_second_parse)
    assert handle(job) == expected
    assert handle(job) == expected  # migrated again (a project's second pass): still no parse
    # other bytes under the same path are parsed anew (and here, refused)
    changed = Job(candidate, data + b"\n", Options())
    assert "parsed again" in handle(changed).error  # type: ignore[union-attr]


def test_a_file_that_does_not_parse_is_not_held_and_its_migration_says_why() -> None:
    settings = Settings(Options(), write=False, want_diff=False, cache_dir=None, fingerprint=None)
    candidate = Candidate("bad.py", "bad.py")
    handle = runner._setup_worker(settings)
    data = b"from apex import amp\ndef (:\n"
    assert handle(Prepare(candidate, data)) == Ready("bad.py", None)
    result = handle(Job(candidate, data, Options()))
    assert isinstance(result, FileResult) and result.error.startswith("cannot parse: line 2")
    skipped = b"# ampmigrate: skip\nfrom apex import amp\n"
    assert handle(Prepare(candidate, skipped)) == Ready("bad.py", None)
    assert handle(Job(candidate, skipped, Options())).status is Status.SKIPPED  # type: ignore[union-attr]


def segfault_on_poison(source: str) -> cst.Module:
    if "poison" in source:
        import faulthandler

        faulthandler.disable()  # pytest's would print this worker's stack: expected here
        os.kill(os.getpid(), signal.SIGSEGV)
    return REAL_PARSE(source)


@linux_only
@pytest.mark.parametrize("jobs", [1, 2])
def test_a_parse_that_crashes_ahead_fails_that_file_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, jobs: int
) -> None:
    monkeypatch.setattr(migrate.engine, "parse", segfault_on_poison)
    for index in range(5):
        (tmp_path / f"m{index}.py").write_text(("# poison\n" if index == 2 else "") + APEX)
    results = migrate_tree(tmp_path, monkeypatch, write=True, jobs=jobs)
    assert results["m2.py"].status is Status.FAILED
    assert results["m2.py"].error.startswith("the worker process crashed (SIGSEGV) on this file")
    assert (tmp_path / "m2.py").read_text() == "# poison\n" + APEX
    for name in ("m0.py", "m1.py", "m3.py", "m4.py"):
        assert results[name].status is Status.CHANGED and results[name].written, results[name]


# -- the pool's preferred jobs ----------------------------------------------------


def _run_job(settings: object) -> object:
    def handle(job: str) -> tuple[str, int]:
        if job == "die":
            os._exit(3)
        return job, os.getpid()

    return handle


def _lost(job: str, reason: str) -> tuple[str, str]:
    return job, reason


def _drain(pool: workers.Pool) -> None:
    end = time.monotonic() + 60
    while pool.busy and time.monotonic() < end:
        pool.poll(timeout=0.5)
    assert not pool.busy


def test_a_worker_takes_the_jobs_it_is_preferred_for_first() -> None:
    done: list[object] = []
    pool = workers.Pool(1, _run_job, None, _lost, done.append)
    try:
        pool.submit("first", 1)
        _drain(pool)
        worker = done[0][1]  # type: ignore[index]
        pool.submit("large", 1000, dispatch=False)
        pool.submit("mine", 1, prefer=worker, dispatch=False)
        pool.submit("nobody's", 10, prefer=worker + 100000, dispatch=False)  # no such worker
        pool.submit("stale", 5, dispatch=False)
        pool.drop(lambda job: job == "stale")
        _drain(pool)
        assert [job for job, _ in done[1:]] == ["mine", "large", "nobody's"]  # type: ignore[misc]
    finally:
        pool.close()


@linux_only
def test_the_jobs_preferring_a_worker_that_died_go_to_another() -> None:
    done: list[object] = []
    pool = workers.Pool(1, _run_job, None, _lost, done.append)
    try:
        pool.submit("first", 1)
        _drain(pool)
        worker = done[0][1]  # type: ignore[index]
        pool.submit("die", 1)
        pool.submit("mine", 1, prefer=worker, dispatch=False)
        _drain(pool)
        assert done[1][0] == "die" and "exit code 3" in done[1][1]  # type: ignore[index]
        assert done[2][0] == "mine" and done[2][1] != worker  # type: ignore[index]
    finally:
        pool.close()


def test_a_worker_holds_no_more_than_its_room(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ahead, "AHEAD_BYTES", len(APEX) * 2 + 10)
    handle = runner._setup_worker(Settings(Options(), write=False, want_diff=False, cache_dir=None, fingerprint=None))
    held = [handle(Prepare(Candidate(f"m{index}.py", f"m{index}.py"), APEX.encode())) for index in range(3)]
    assert [ready.worker for ready in held] == [os.getpid(), os.getpid(), None]  # type: ignore[union-attr]


def test_trees_parsed_ahead_leave_the_cycle_collectors_sight_before_it_runs_again() -> None:
    # A collection right after the parse would walk every node of the trees just kept, only to
    # find them all alive (tens of ms a file): they are frozen first.
    import gc

    settings = Settings(Options(), write=False, want_diff=False, cache_dir=None, fingerprint=None)
    handle = runner._setup_worker(settings)
    source = APEX + "".join(f"\n\ndef helper_{n}(x):\n    return [x * i for i in range({n})]\n" for n in range(300))
    pending: list[int] = []

    def note(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            pending.append(gc.get_count()[0])

    was_enabled = gc.isenabled()
    gc.enable()
    gc.callbacks.append(note)
    try:
        frozen = gc.get_freeze_count()
        assert handle(Prepare(Candidate("big.py", "big.py"), source.encode())) == Ready("big.py", os.getpid())
        assert gc.isenabled()
    finally:
        gc.callbacks.remove(note)
        if not was_enabled:
            gc.disable()
    assert gc.get_freeze_count() - frozen > 10_000  # the trees
    assert all(count < 5_000 for count in pending), pending


def test_a_file_migrated_again_with_new_facts_takes_the_trees_of_its_first_migration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a project's group settles in further passes: the worker that migrated a file keeps its
    # trees (it says so, and the main process sends the file's next migration there)
    settings = Settings(Options(), write=False, want_diff=True, cache_dir=None, fingerprint=None)
    candidate = Candidate("train.py", "train.py")
    data = APEX.encode()
    frozen = Options(facts=ModuleFacts(frozen="the setup continues elsewhere"))
    expected = [runner._setup_worker(settings)(Job(candidate, data, options)) for options in (Options(), frozen)]

    handle = runner._setup_worker(settings)
    first = handle(Job(candidate, data, Options()))
    assert isinstance(first, FileResult) and first.held_by == os.getpid()

    def no_second_parse(source: str) -> cst.Module:
        raise AssertionError("parsed again")

    monkeypatch.setattr(migrate.engine, "parse", no_second_parse)
    again = handle(Job(candidate, data, frozen))
    assert [first, again] == expected and again.status is Status.UNCHANGED  # type: ignore[union-attr]


@linux_only
def test_a_run_with_workers_puts_what_it_froze_back_in_the_cycle_collectors_sight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the main process freezes what it has imported before forking workers (their collections
    # skip it), and undoes that at the end: a library caller or a test session goes on
    import gc

    (tmp_path / "train.py").write_text(APEX)
    gc.unfreeze()
    frozen_during: list[int] = []
    real_close = workers.Pool.close

    def close(pool: workers.Pool) -> None:
        frozen_during.append(gc.get_freeze_count())
        real_close(pool)

    monkeypatch.setattr(workers.Pool, "close", close)
    results = migrate_tree(tmp_path, monkeypatch, jobs=2)
    assert results["train.py"].status is Status.CHANGED
    assert frozen_during and frozen_during[0] > 0
    assert gc.get_freeze_count() == 0


@linux_only
def test_the_main_process_freezes_what_it_imported_before_the_cycle_collector_is_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # else the collector's first pass after the engine's import walks every object it made
    import gc

    (tmp_path / "train.py").write_text(APEX)
    collecting_at_freeze: list[bool] = []
    real_freeze = gc.freeze

    def freeze() -> None:
        collecting_at_freeze.append(gc.isenabled())
        real_freeze()

    monkeypatch.setattr(gc, "freeze", freeze)
    gc.unfreeze()
    assert gc.isenabled()
    results = migrate_tree(tmp_path, monkeypatch, jobs=1)
    assert results["train.py"].status is Status.CHANGED
    assert collecting_at_freeze and not collecting_at_freeze[0]
    assert gc.isenabled() and gc.get_freeze_count() == 0
