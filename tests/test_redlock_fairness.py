"""Redlock under contention (docs/reliability.md, L-8): a releaser does not take the lock straight back from
another client that is waiting for it, and no process starves.

A release's PUBLISH says how many subscribers it woke; when one of them is another client's, this client's
next acquire of the lock waits a few round trips first (lockkit.drivers.redis.flow.YIELD_ROUNDS), so the woken
waiter, which needs a wake-up and a round trip of its own, gets there first. Without that, a releaser that
acquires again at once wins nearly every time: it is already running, the waiter is not.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import redis

import lockkit
from backends.servers import RedlockServers
from lockkit.cli.contention import contention
from lockkit.driver import DriverContext
from lockkit.drivers.redis._sync.redlock import YIELDS_KEPT
from lockkit.drivers.redis.flow import YIELD_MIN
from lockkit.drivers.redis.keys import lock_keys
from lockkit.drivers.redis.redlock import RedlockDriver
from lockkit.testing import FakeClock
from lockkit.urls import parse_url

CYCLES = 20
"""How many times the holder releases and at once acquires again while the other client waits."""
MOST_BEFORE_THE_WAITER = 5
"""Generous: with the yield the waiter gets the lock at the first release on a quiet machine."""


def _name() -> str:
    return f"fair-{uuid.uuid4().hex[:8]}"


def _waiting(servers: RedlockServers, name: str, subscribers: int = 1) -> None:
    """Return once every master counts ``subscribers`` on the lock's wake-up channel (the waiter is waiting)."""
    channel = lock_keys("lockkit:", name).channel
    clients = [redis.Redis(host=s.host, port=s.port, socket_timeout=2) for s in servers]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if all(c.pubsub_numsub(channel)[0][1] >= subscribers for c in clients):
            return
        time.sleep(0.005)
    raise AssertionError("the waiter never subscribed to the lock's wake-up channel")


class _Listener:
    """Another client waiting for the lock, as the masters see it: a subscriber to its wake-up channel on each."""

    def __init__(self, servers: RedlockServers, name: str) -> None:
        channel = lock_keys("lockkit:", name).channel
        self.subs = [redis.Redis(host=s.host, port=s.port, socket_timeout=2).pubsub() for s in servers]
        for sub in self.subs:
            sub.subscribe(channel)
            sub.get_message(timeout=2)  # the confirmation

    def close(self) -> None:
        for sub in self.subs:
            sub.close()


ROUNDS = 5


def _median(values: list[float]) -> float:
    """The median: one round may start late (the test thread descheduled after the release returned), which
    eats into that round's pause, not the others'."""
    return sorted(values)[len(values) // 2]


def test_L8_releaser_waits_before_acquiring_again_while_another_client_listens(
    redlock_servers: RedlockServers,
) -> None:
    """The mechanism, measured as a lower bound (a pause, never a speed): with another client's subscriber on
    the lock's channel, an acquire right after this client's release waits at least YIELD_MIN first."""
    n = _name()
    listener = _Listener(redlock_servers, n)
    try:
        with lockkit.connect(redlock_servers.url) as locks:
            lock = locks.lock(n, ttl=10, auto_renew=False)
            lock.acquire(timeout=5)
            took = []
            for _ in range(ROUNDS):
                lock.release()
                started = time.monotonic()
                lock.acquire(timeout=5)
                took.append(time.monotonic() - started)
            lock.release()
    finally:
        listener.close()
    assert _median(took) >= 0.9 * YIELD_MIN, [f"{t * 1e3:.2f} ms" for t in took]


async def test_L8_async_releaser_waits_before_acquiring_again_while_another_client_listens(
    redlock_servers: RedlockServers,
) -> None:
    n = _name()
    listener = await asyncio.to_thread(_Listener, redlock_servers, n)
    try:
        async with lockkit.connect_async(redlock_servers.url) as locks:
            lock = locks.lock(n, ttl=10, auto_renew=False)
            await lock.acquire(timeout=5)
            took = []
            for _ in range(ROUNDS):
                await lock.release()
                started = time.monotonic()
                await lock.acquire(timeout=5)
                took.append(time.monotonic() - started)
            await lock.release()
    finally:
        listener.close()
    assert _median(took) >= 0.9 * YIELD_MIN, [f"{t * 1e3:.2f} ms" for t in took]


def test_L8_releaser_yields_to_a_waiting_client(redlock_servers: RedlockServers) -> None:
    n = _name()
    with lockkit.connect(redlock_servers.url) as a, lockkit.connect(redlock_servers.url) as b:
        holder = a.lock(n, ttl=10, auto_renew=False)
        holder.acquire(timeout=5)
        got = threading.Event()

        def wait_then_take() -> None:
            lock = b.lock(n, ttl=10, auto_renew=False)
            lock.acquire(timeout=20)
            got.set()
            lock.release()

        waiter = threading.Thread(target=wait_then_take)
        waiter.start()
        try:
            _waiting(redlock_servers, n)
            before = 0
            for _ in range(CYCLES):
                holder.release()
                holder.acquire(timeout=20)  # at once: the releaser is running, the waiter must first wake up
                if got.is_set():
                    break
                before += 1
            holder.release()
        finally:
            waiter.join(30)
        assert got.is_set()
        assert before <= MOST_BEFORE_THE_WAITER, f"the releaser took the lock back {before} times in a row"


async def test_L8_async_releaser_yields_to_a_waiting_client(redlock_servers: RedlockServers) -> None:
    n = _name()
    async with lockkit.connect_async(redlock_servers.url) as a, lockkit.connect_async(redlock_servers.url) as b:
        holder = a.lock(n, ttl=10, auto_renew=False)
        await holder.acquire(timeout=5)

        async def wait_then_take() -> None:
            lock = b.lock(n, ttl=10, auto_renew=False)
            await lock.acquire(timeout=20)
            await lock.release()

        waiter = asyncio.ensure_future(wait_then_take())
        await asyncio.to_thread(_waiting, redlock_servers, n)
        before = 0
        for _ in range(CYCLES):
            await holder.release()
            await holder.acquire(timeout=20)
            if waiter.done():
                break
            before += 1
        await holder.release()
        await asyncio.wait_for(waiter, 30)
        assert before <= MOST_BEFORE_THE_WAITER, f"the releaser took the lock back {before} times in a row"


def test_L8_no_process_starves(redlock_servers: RedlockServers) -> None:
    """4 processes × 3 s, ~1 ms hold: every process gets at least half as many acquisitions as the luckiest
    (a liveness bound, far below what the benchmark shows; never a speed)."""
    result = contention(redlock_servers.url, 3.0, procs=4)
    assert result.fairness >= 0.5, result.counts
    assert min(result.counts) > 0


def test_releaser_pauses_kept_stay_bounded() -> None:
    """A client that releases many contended locks and never acquires them again keeps at most YIELDS_KEPT
    pauses: the finished ones are forgotten first, the pending ones kept. No I/O (no master is reached)."""
    clock = FakeClock(1000.0)
    url = parse_url("redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3,127.0.0.1:4,127.0.0.1:5")
    driver = RedlockDriver.from_url(url, DriverContext(clock=clock))
    for i in range(YIELDS_KEPT):
        driver._yield(f"old-{i}", clock())
    clock.advance(1.0)  # every one of those pauses is over (a pause is at most retry_delay)
    driver._yield("recent", clock())
    assert set(driver._yields) == {"recent"}
    for i in range(2 * YIELDS_KEPT):  # all pending at once: the table is cleared rather than let grow
        driver._yield(f"new-{i}", clock())
    assert len(driver._yields) <= YIELDS_KEPT
    driver.close()
