"""The Redlock driver's uncontended fast path (issue 17): the first attempt is made in ``acquire`` itself, without
the acquire flow, a watcher or a task, and only a failed one goes on in the flow. What it must not lose:

* a first attempt that won only a minority is undone on every master (L-3: two contenders that split the vote),
  and never taken for a grant;
* on the asyncio face, a cancel that interrupts the first attempt undoes what it may have taken, on every master
  (C-8: a cancelled acquire leaves nothing behind);
* the hubs' snapshot for a wait that may follow is taken before the first attempt, so that a release published
  between the failed attempt (with its undo, which reads the holder's PTTL) and the waiter's subscription is seen
  as missed (look again) instead of slept through until the holder's TTL (L-8: a waiting client).

Real masters (backends/servers.py), the blocking face (the asyncio face is the same source, scripts/unasync.py).
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Sequence

import pytest
import redis

from backends.pytest_fixtures import RedlockFactory
from backends.servers import RedlockServers
from lockkit.driver import DriverContext, Grant
from lockkit.drivers.redis.calls import Call
from lockkit.drivers.redis.flow import Send, redlock_acquire_flow, redlock_take
from lockkit.drivers.redis.keys import lock_keys
from lockkit.drivers.redis.quorum import FirstAttempt, NodeResult, tally_acquire
from lockkit.drivers.redis.redlock import AsyncRedlockDriver, RedlockDriver
from lockkit.drivers.redis.scripts import RELEASE
from lockkit.testing import FakeClock
from lockkit.urls import parse_url

SLACK = 2.5
"""Seconds: a generous liveness bound (the holder's TTL is 30 s, the acquire's deadline 5 s)."""


def _name() -> str:
    return f"fast-{uuid.uuid4().hex[:8]}"


def _driver(servers: RedlockServers) -> RedlockDriver:
    return RedlockDriver.from_url(parse_url(servers.url), DriverContext())


def _raw(servers: RedlockServers) -> list[redis.Redis]:
    return [redis.Redis(host=s.host, port=s.port, socket_timeout=2) for s in servers]


def test_L3_the_flow_handed_a_failed_first_attempt_goes_on_with_its_undo_on_every_master() -> None:
    """No I/O: the flow, given a first attempt that won two masters of five, sends no SET of its own first: its
    first operation is the undo (RELEASE of our token, then PTTL), to every master; a one-shot then gives up."""
    clock = FakeClock(1000.0)
    keys = lock_keys("lockkit:", "flow")
    won, lost = NodeResult([b"OK"], 0), NodeResult([None], 0)
    results = [won, won, lost, lost, lost]
    sent_at = clock()
    clock.advance(0.002)
    first = FirstAttempt(sent_at, 0.002, results, tally_acquire(results, 10.0, 0.002))
    assert redlock_take(keys, "ours", 10.0)[0].args[:2] == ("SET", keys.lock)
    flow = redlock_acquire_flow(keys, "ours", 10.0, clock(), clock, 5, 0.2, 0.0, first)
    undo = next(flow)
    assert isinstance(undo, Send) and undo.idempotent
    release, pttl = undo.calls
    assert release.script is RELEASE and release.args[0] == "ours" and pttl.args == ("PTTL", keys.lock)
    try:
        step = flow.send([NodeResult([1, -2], 0)] * 2 + [NodeResult([0, 5000], 0)] * 3)
    except StopIteration as stop:
        assert stop.value is None  # the deadline (a one-shot) has passed: no wait, no second attempt
    else:
        raise AssertionError(f"a one-shot went on after its undo: {step!r}")


def test_L3_a_first_attempt_that_won_a_minority_is_undone_on_every_master(redlock_servers: RedlockServers) -> None:
    """Another client holds three of the five masters: the first attempt wins the other two, which is no grant,
    and both are undone before the one-shot acquire returns None (the other client's keys stay)."""
    n = _name()
    key = lock_keys("lockkit:", n).lock
    masters = _raw(redlock_servers)
    for master in masters[:3]:
        assert master.set(key, "other", px=30_000)
    driver = _driver(redlock_servers)
    try:
        assert driver.acquire(n, "ours", 10.0, time.monotonic()) is None
        assert [m.get(key) for m in masters] == [b"other"] * 3 + [None] * 2
    finally:
        driver.close()
        for master in masters:
            master.delete(key)


def test_L8_a_release_after_the_failed_first_attempt_and_before_the_subscription_is_not_slept_through(
    redlock_servers: RedlockServers,
) -> None:
    """This client's hubs are still subscribed to the lock's channel (it waited for the lock a moment ago). Its
    next acquire fails (the other client holds it for 30 s); the holder releases right after the failed
    attempt's undo, and the message reaches this client's hubs before its waiter subscribes. The waiter must
    look again at once (its snapshot predates the attempt), not sleep until the deadline."""
    n = _name()
    channel = lock_keys("lockkit:", n).channel
    holder, waiter = _driver(redlock_servers), _driver(redlock_servers)
    got: list[Grant | None] = []
    try:
        # The waiter waits once, so that its hubs keep the channel subscribed for a while (hub.LINGER) after.
        assert holder.acquire(n, "h1", 30.0, None) is not None
        thread = threading.Thread(target=lambda: got.append(waiter.acquire(n, "w1", 30.0, time.monotonic() + 10)))
        thread.start()
        subscribed = time.monotonic() + 10
        while not all(hub.snapshot(channel) is not None for hub in waiter._hubs):
            assert time.monotonic() < subscribed, "the waiter never subscribed"
            time.sleep(0.005)
        assert holder.release(n, "h1")
        thread.join(10)
        assert got and got[0] is not None
        assert waiter.release(n, "w1")
        assert holder.acquire(n, "h2", 30.0, None) is not None
        assert all(hub.snapshot(channel) is not None for hub in waiter._hubs)

        fan_out = waiter._fan_out
        released: list[bool] = []

        def undo_then_release(
            calls: Sequence[Call], idempotent: bool, enough: Callable[[Sequence[NodeResult]], bool] | None = None
        ) -> list[NodeResult]:
            results = fan_out(calls, idempotent, enough)
            if not released and len(calls) == 2 and calls[0].script is RELEASE:  # the failed attempt's undo
                heard = [hub._heard.get(channel, 0) for hub in waiter._hubs]
                released.append(holder.release(n, "h2"))
                until = time.monotonic() + 5
                while any(hub._heard.get(channel, 0) == seen for hub, seen in zip(waiter._hubs, heard, strict=True)):
                    assert time.monotonic() < until, "the release's message never reached the waiter's hubs"
                    time.sleep(0.001)
            return results

        waiter._fan_out = undo_then_release  # type: ignore[method-assign]
        started = time.monotonic()
        grant = waiter.acquire(n, "w2", 30.0, started + 5)
        took = time.monotonic() - started
        assert released == [True]
        assert grant is not None
        assert took < SLACK, f"slept {took:.2f} s through a release it had missed"
        assert waiter.release(n, "w2")
    finally:
        holder.close()
        waiter.close()


async def test_c8_a_cancel_during_the_first_attempt_undoes_it_on_every_master(fresh_redlock: RedlockFactory) -> None:
    """The first attempt's SETs are written to all five masters; the first master is paused, so the fan-out
    waits for its reply, and the awaiting task is cancelled there. The four others applied the SET (a quorum:
    a grant nobody will use) and the paused one applies it when it resumes: the undo, in a task of its own,
    removes it from all five, well before the 30 s TTL."""
    group = fresh_redlock()
    driver = AsyncRedlockDriver.from_url(parse_url(group.url + "?timeout=3"), DriverContext())
    n = _name()
    key = lock_keys("lockkit:", n).lock
    masters = _raw(group)
    try:
        assert await driver.acquire(n + "-warm", "t0", 5.0, None) is not None  # connections made, scripts loaded
        assert await driver.release(n + "-warm", "t0")
        group[0].pause()
        try:
            task = asyncio.ensure_future(driver.acquire(n, "t1", 30.0, None))
            until = time.monotonic() + 5
            while sum(m.get(key) == b"t1" for m in masters[1:]) < 4:  # the SETs reached the running masters
                assert time.monotonic() < until, "the first attempt never reached the masters"
                await asyncio.sleep(0.005)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            group[0].resume()
        until = time.monotonic() + 5
        while any(m.get(key) is not None for m in masters):
            assert time.monotonic() < until, [m.get(key) for m in masters]
            await asyncio.sleep(0.01)
    finally:
        await driver.close()
