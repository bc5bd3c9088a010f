"""lockkit.workers.Workers: the renewal scheduler's worker threads (C-13)."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from lockkit.workers import Workers


def _named(prefix: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(prefix)]


def test_calls_run_on_at_most_limit_threads_and_a_backlog_is_drained() -> None:
    workers = Workers(3, "test-workers-burst")
    gate, done = threading.Event(), []
    lock = threading.Lock()

    def call(i: int) -> None:
        gate.wait(10)
        with lock:
            done.append(i)

    for i in range(10):  # more than the limit, all at once: the rest wait in the queue
        workers.submit(call, i)
    assert len(_named("test-workers-burst")) == 3
    gate.set()
    deadline = time.monotonic() + 10
    while len(done) < 10 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sorted(done) == list(range(10))
    assert all(t.daemon for t in _named("test-workers-burst"))


def test_an_idle_thread_takes_the_next_call_instead_of_a_new_thread() -> None:
    workers = Workers(4, "test-workers-idle")
    for _ in range(20):
        finished = threading.Event()
        workers.submit(finished.set)
        assert finished.wait(10)
        deadline = time.monotonic() + 10
        while workers._idle < 1:  # until the thread counts itself waiting again (no fixed sleep: a loaded CI)
            assert time.monotonic() < deadline, "the worker never came back to wait"
            time.sleep(0.001)
    assert len(_named("test-workers-idle")) == 1


def test_a_failing_call_is_logged_and_the_thread_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    workers = Workers(1, "test-workers-fail")
    after = threading.Event()

    def boom() -> None:
        raise ValueError("boom")

    with caplog.at_level(logging.ERROR, logger="lockkit"):
        workers.submit(boom)
        workers.submit(after.set)
        assert after.wait(10)
    assert "test-workers-fail call failed" in caplog.text


def test_a_thread_that_cannot_start_runs_the_call_in_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    workers = Workers(2, "test-workers-nostart")
    ran: list[str] = []

    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    workers.submit(lambda: ran.append(threading.current_thread().name))
    assert ran == [threading.current_thread().name]


def test_a_call_raising_system_exit_leaves_the_thread_working() -> None:
    """A user's on_lost that calls sys.exit() on a worker: the thread must live on (it is counted towards the
    limit; four such deaths stopped every later call, the review of 2026-12-02 found)."""
    import sys

    workers = Workers(1, "test-workers-exit")
    after = threading.Event()
    for _ in range(3):
        workers.submit(sys.exit, 1)
    workers.submit(after.set)
    assert after.wait(10)
    assert len([t for t in _named("test-workers-exit") if t.is_alive()]) == 1


def test_the_fallback_never_waits_for_a_call_a_worker_took(monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread that cannot start: the caller runs a queued call itself, but if a busy worker took it meanwhile
    there is none left, and the caller must not wait for one (it is the renewal thread)."""
    workers = Workers(2, "test-workers-race")
    started, release, taken, go, done = (threading.Event() for _ in range(5))

    def busy() -> None:
        started.set()
        release.wait(10)

    workers.submit(busy)
    assert started.wait(10)

    def submit_when_told() -> None:
        go.wait(10)
        workers.submit(taken.set)
        done.set()

    caller = threading.Thread(target=submit_when_told, daemon=True)
    caller.start()  # before start() is made to fail below

    def refuse(self: threading.Thread) -> None:
        release.set()  # the busy worker finishes now, and takes the call this submit just queued
        assert taken.wait(10)
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    go.set()
    assert done.wait(10), "submit waited for a call a worker had already taken"
