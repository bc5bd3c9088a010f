"""C-15 (docs/reliability.md): the server is paused (SIGSTOP) while an acquire is already waiting.

The other unresponsive-server tests (C-10, E-8, P-9) pause the server before the call. Here a second client
holds the lock, the waiter's ``acquire(timeout=3)`` is blocked on the server's wake-up (a pub/sub
subscription, a watch, a ZooKeeper exists-watch, a wait in PostgreSQL), and the server is paused about 0.5 s
into that wait. The waiter must come back (``BackendUnavailable`` where the server is named, never a lease) within
its timeout plus the backend's operation timeout plus slack, on both faces; once the server answers again
the lock is free for a later acquire, with a higher fencing token. A waiter whose server is paused for less
than that and then resumed keeps waiting, and gets the lock when the holder releases.

The bounds are liveness bounds with CI slack; the figures are printed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

import lockkit
from lockkit import BackendUnavailable
from tests.test_postgres_unresponsive import _children

TIMEOUT = 3.0
PAUSE_AT = 0.5
SLACK = 1.0
OP_TIMEOUT = {
    "redis": 2.0,  # the timeout option's default
    "redlock": 0.25,  # its per-master timeout's default
    "zookeeper": 1.0,  # no timeout option: a call whose own time is up waits CONNECT_GRACE more, at most
    "etcd": 5.0,
    "postgresql": 5.0,
}
BACKENDS = sorted(OP_TIMEOUT)
FACES = ["blocking", "asyncio"]


@dataclass
class Target:
    """A server of the test's own, and how to stop and resume all of its processes."""

    kind: str
    url: str
    pause: Callable[[], None]
    resume: Callable[[], None]


def _postgres_target(server: Any) -> Target:
    stopped: list[int] = []

    def pause() -> None:
        os.kill(server.pid, signal.SIGSTOP)  # the postmaster first: it forks no new backend meanwhile
        stopped.append(server.pid)
        for pid in _children(server.pid):
            os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)

    def resume() -> None:
        while stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(stopped.pop(), signal.SIGCONT)

    return Target("postgresql", server.url, pause, resume)


@pytest.fixture
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    kind = request.param
    if kind == "postgresql":
        made = _postgres_target(request.getfixturevalue("fresh_postgres")())
    elif kind == "redlock":
        members = request.getfixturevalue("fresh_redlock")(n=3)

        def pause() -> None:
            for member in members.members:  # every master: no quorum answers
                member.pause()

        def resume() -> None:
            for member in members.members:
                member.resume()

        made = Target(kind, members.url, pause, resume)
    else:
        server = request.getfixturevalue(f"fresh_{kind}")()
        made = Target(kind, server.url, server.pause, server.resume)
    try:
        yield made
    finally:
        made.resume()  # before the factory's teardown stops it (a stopped process ignores SIGTERM)


def _name() -> str:
    return f"pw-{uuid.uuid4().hex[:10]}"


def _bound(kind: str) -> float:
    return TIMEOUT + OP_TIMEOUT[kind] + SLACK


@contextlib.contextmanager
def _timers(*plan: tuple[float, Callable[[], None]]) -> Iterator[None]:
    timers = [threading.Timer(delay, action) for delay, action in plan]
    for timer in timers:
        timer.daemon = True
        timer.start()
    try:
        yield
    finally:
        for timer in timers:
            timer.cancel()


Plan = list[tuple[float, Callable[[], None]]]


def _token(lease: Any) -> int | None:
    return lease.fencing_token if lease.fenced else None  # (redlock hands out no fencing tokens)


def _wait_blocking(
    url: str, name: str, timeout: float, plan: Plan, then: threading.Event | None, report: list[Any]
) -> None:
    """The waiter: reports (seconds taken, the fencing token or the exception) of one acquire by a locker of its
    own, with ``plan`` run meanwhile; with ``then``, once it is set, the token of a second acquire by the same
    locker (what the first left in the queue must not keep it from the lock)."""
    with lockkit.connect(url) as locks:
        lock = locks.lock(name, ttl=30)
        assert lock.try_acquire() is None  # held by the other client; the connection or session is warm
        started = time.monotonic()
        with _timers(*plan):
            try:
                outcome: Any = _token(lock.acquire(timeout=timeout))
                lock.release()
            except lockkit.LockError as exc:
                outcome = exc
        report.append((time.monotonic() - started, outcome))
        if then is not None:
            assert then.wait(60)
            report.append(_token(lock.acquire(timeout=20)))
            lock.release()


def _wait_async(
    url: str, name: str, timeout: float, plan: Plan, then: threading.Event | None, report: list[Any]
) -> None:
    async def main() -> None:
        async with lockkit.connect_async(url) as locks:
            lock = locks.lock(name, ttl=30)
            assert await lock.try_acquire() is None
            started = time.monotonic()
            with _timers(*plan):
                try:
                    outcome: Any = _token(await lock.acquire(timeout=timeout))
                    await lock.release()
                except lockkit.LockError as exc:
                    outcome = exc
            report.append((time.monotonic() - started, outcome))
            if then is not None:
                assert await asyncio.to_thread(then.wait, 60)
                report.append(_token(await lock.acquire(timeout=20)))
                await lock.release()

    asyncio.run(main())


def _run(face: str, url: str, name: str, timeout: float, plan: Plan, then: threading.Event | None = None) -> Any:
    """Run the waiter on a thread of its own, so that a hang is seen (and the server resumed) here."""
    result: list[Any] = []
    failed: list[BaseException] = []

    def body() -> None:
        try:
            (_wait_blocking if face == "blocking" else _wait_async)(url, name, timeout, plan, then, result)
        except BaseException as exc:  # reported in the test's thread
            failed.append(exc)

    worker = threading.Thread(target=body, name="c15-waiter", daemon=True)
    worker.start()
    return worker, result, failed


@pytest.mark.parametrize("face", FACES)
@pytest.mark.parametrize("target", BACKENDS, indirect=True)
def test_C15_server_paused_while_an_acquire_waits_is_bounded(target: Target, face: str) -> None:
    kind = target.kind
    bound = _bound(kind)
    name = _name()
    then = threading.Event()
    with lockkit.connect(target.url) as holding:
        holder = holding.lock(name, ttl=30)
        held = holder.acquire(timeout=10)
        worker, result, failed = _run(face, target.url, name, TIMEOUT, [(PAUSE_AT, target.pause)], then)
        for _ in range(int((bound + 5) / 0.05)):  # until the first acquire returned, or well past its bound
            if result or failed or not worker.is_alive():
                break
            worker.join(0.05)
        hung = not (result or failed)
        target.resume()  # whatever happened: the clean-ups may go on now
        # the server answers again: the holder gives the lock back; what the waiter left in the queue is cleaned
        # up (or lapses), and the waiter's locker's next acquire gets it, with a higher token
        if held.valid:  # (a PostgreSQL holder's heartbeat may have been cut meanwhile: its session ended)
            holder.release()
        then.set()
        worker.join(60)
    assert not failed, failed
    assert len(result) == 2, f"the waiter did not finish even 60 s after SIGCONT: {result}"
    (took, outcome), later = result
    print(f"C-15 {kind} {face}: {type(outcome).__name__} after {took:.2f} s (bound {bound:g} s)")
    assert not hung, f"still waiting {bound + 5:g} s after the acquire began ({took:.2f} s in all)"
    # the server is named (not a LockTimeout, whose advice fits a busy lock; etcd and ZooKeeper said that before)
    assert isinstance(outcome, BackendUnavailable), outcome
    assert took < bound, f"{type(outcome).__name__} after {took:.2f} s, bound {bound:g} s"
    if held.fenced:
        assert later > held.fencing_token


@pytest.mark.parametrize("face", FACES)
@pytest.mark.parametrize("target", BACKENDS, indirect=True)
def test_C15_a_waiter_resumed_before_its_bound_gets_the_lock_on_release(target: Target, face: str) -> None:
    name = _name()
    with lockkit.connect(target.url) as holding:
        holder = holding.lock(name, ttl=30)
        held = holder.acquire(timeout=10)
        # paused 0.5 s into the wait for 1 s (shorter than every backend's operation timeout but redlock's),
        # then the holder releases 1 s after the resume
        plan = [(PAUSE_AT, target.pause), (PAUSE_AT + 1.0, target.resume), (PAUSE_AT + 2.0, holder.release)]
        worker, result, failed = _run(face, target.url, name, 20.0, plan)
        worker.join(40)
        target.resume()
        worker.join(10)
        assert not failed, failed
        assert result, "the waiter did not return"
        took, outcome = result[0]
        print(f"C-15 resumed {target.kind} {face}: {type(outcome).__name__} after {took:.2f} s")
        if isinstance(outcome, BaseException):
            raise outcome
        if held.fenced:
            assert outcome > held.fencing_token  # the waiter's lease, after the holder's
        assert took < PAUSE_AT + 2.0 + 10.0


def _wait_for_permit(url: str, name: str, face: str, pause: Callable[[], None]) -> tuple[float, Any]:
    """(seconds taken, the outcome) of one semaphore ``acquire(timeout=3)`` of a locker of its own."""

    def blocking() -> tuple[float, Any]:
        with lockkit.connect(url) as locks:
            permit = locks.semaphore(name, limit=1, ttl=30)
            assert permit.try_acquire() is None
            started = time.monotonic()
            with _timers((PAUSE_AT, pause)):
                try:
                    outcome: Any = permit.acquire(timeout=TIMEOUT)
                except lockkit.LockError as exc:
                    outcome = exc
            return time.monotonic() - started, outcome

    async def asyncio_face() -> tuple[float, Any]:
        async with lockkit.connect_async(url) as locks:
            permit = locks.semaphore(name, limit=1, ttl=30)
            assert await permit.try_acquire() is None
            started = time.monotonic()
            with _timers((PAUSE_AT, pause)):
                try:
                    outcome: Any = await permit.acquire(timeout=TIMEOUT)
                except lockkit.LockError as exc:
                    outcome = exc
            return time.monotonic() - started, outcome

    return blocking() if face == "blocking" else asyncio.run(asyncio_face())


PERMIT_CASES = [
    pytest.param(kind, face)
    for kind in BACKENDS
    if kind != "redlock"  # (no permits)
    for face in FACES
]


@pytest.mark.parametrize(("target", "face"), PERMIT_CASES, indirect=["target"])
def test_C15_server_paused_while_a_semaphore_acquire_waits_is_bounded(target: Target, face: str) -> None:
    bound = _bound(target.kind)
    name = _name()
    with lockkit.connect(target.url) as holding:
        holder = holding.semaphore(name, limit=1, ttl=30)
        holder.acquire(timeout=10)
        result: list[Any] = []
        worker = threading.Thread(
            target=lambda: result.append(_wait_for_permit(target.url, name, face, target.pause)), daemon=True
        )
        worker.start()
        worker.join(bound + 5)
        target.resume()
        worker.join(60)
        assert result, "the waiter did not return even 60 s after SIGCONT"
        took, outcome = result[0]
        print(f"C-15 semaphore {target.kind} {face}: {type(outcome).__name__} after {took:.2f} s (bound {bound:g} s)")
        assert isinstance(outcome, BackendUnavailable), outcome  # the server is named (see above)
        assert took < bound, f"{type(outcome).__name__} after {took:.2f} s, bound {bound:g} s"
        # (the holder's own connection may still be coming back, or its permit gone with a renewal cut meanwhile:
        # what this test asserts is the waiter's bound)
        with contextlib.suppress(lockkit.LockError):
            holder.release()
