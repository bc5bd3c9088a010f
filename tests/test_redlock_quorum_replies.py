"""L-9 (docs/reliability.md): a Redlock acquire or release answers once a quorum of masters has, and the later
masters' replies are read by the next command on their connections (issue 17). These tests pause the *last*
master of the URL (SIGSTOP), whose reply the fan-out reads last: before, every acquire and release waited out
the whole per-node ``timeout`` for it.

What must hold: the replies left unread are never another command's (every later result is right and every
master ends clean); a master whose reply was left unread still counts for the lease's renewals (its ``SET``
took: ``RENEW`` is owner-checked); a master that stays paused costs each command at most a short wait
(``SETTLE_WAIT``), not a ``timeout``, and is not asked meanwhile.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable

import redis

import lockkit
from backends.pytest_fixtures import RedlockFactory
from backends.servers import RedisServer
from lockkit.drivers.redis._sync.node import SETTLE_WAIT

TIMEOUT = 3.0
"""The per-node timeout of these tests' URLs: long, so that waiting it out once is plain in a test's time."""
QUICK = TIMEOUT / 2
"""An acquire or release that did not wait out a ``TIMEOUT`` (a liveness bound with generous slack)."""


def name() -> str:
    return f"quorum-{uuid.uuid4().hex[:8]}"


def raw(server: RedisServer) -> redis.Redis:
    return redis.Redis(host=server.host, port=server.port, socket_timeout=5)


def lock_key(n: str) -> bytes:
    return f"lockkit:{{{n}}}".encode()


def url(ports: list[int]) -> str:
    return "redlock://" + ",".join(f"127.0.0.1:{p}" for p in ports) + f"/0?timeout={TIMEOUT:g}"


def wait_for_key(server: RedisServer, n: str, present: bool = True) -> None:
    until = time.monotonic() + 10
    while (raw(server).exists(lock_key(n)) == 1) != present:
        assert time.monotonic() < until, f"the key of {n!r} never {'came' if present else 'went'} on {server.port}"
        time.sleep(0.005)


def timed(call: Callable[[], object]) -> float:
    started = time.monotonic()
    call()
    return time.monotonic() - started


def warm(locks: lockkit.Locker) -> None:
    """One acquire and release: every master has said which server it is (L-6's check reads every reply); then a
    call that reads every master's reply (``holder``), so that none is still owed when a test pauses one."""
    n = name()
    with locks.lock(n, ttl=5):
        pass
    assert not locks.holder(n).held


def test_L9_an_acquire_does_not_wait_for_the_last_master(fresh_redlock: RedlockFactory) -> None:
    group = fresh_redlock()
    last = group[4]
    with lockkit.connect(url([s.port for s in group])) as locks:
        warm(locks)
        n = name()
        lock = locks.lock(n, ttl=10, auto_renew=False)
        last.pause()
        try:
            took = timed(lock.acquire)
        finally:
            last.resume()
        assert took < QUICK, f"the acquire waited {took:.2f} s for the paused master"
        wait_for_key(last, n)  # the paused master ran the SET once it went on: its reply is owed
        assert timed(lock.release) < QUICK
        for server in group:  # the owed reply was read, not taken for the release's: it ran everywhere
            assert raw(server).exists(lock_key(n)) == 0, f"master {server.port} kept the lock"
        assert not locks.holder(n).held
        with locks.lock(n, ttl=5) as lease:
            assert all(raw(server).get(lock_key(n)) == lease.token.encode() for server in group[:3])


async def test_L9_async_an_acquire_does_not_wait_for_the_last_master(fresh_redlock: RedlockFactory) -> None:
    group = fresh_redlock()
    last = group[4]
    async with lockkit.connect_async(url([s.port for s in group])) as locks:
        warmed = name()
        async with locks.lock(warmed, ttl=5):
            pass
        assert not (await locks.holder(warmed)).held
        n = name()
        lock = locks.lock(n, ttl=10, auto_renew=False)
        last.pause()
        try:
            started = time.monotonic()
            await lock.acquire()
            took = time.monotonic() - started
        finally:
            last.resume()
        assert took < QUICK, f"the acquire waited {took:.2f} s for the paused master"
        wait_for_key(last, n)
        started = time.monotonic()
        await lock.release()
        assert time.monotonic() - started < QUICK
        for server in group:
            assert raw(server).exists(lock_key(n)) == 0, f"master {server.port} kept the lock"
        assert not (await locks.holder(n)).held


def test_L9_a_master_whose_reply_was_not_read_counts_for_renewals(fresh_redlock: RedlockFactory) -> None:
    """The acquire reads masters 0-2 (a quorum, all won) and leaves 3 and 4 unread (4 is paused). Masters 0 and
    1 then die: the renewal's quorum is 2, 3 and 4 — it holds only if the two whose grants were never read at
    the acquire count (their epochs kept), as they should: their SETs took, and RENEW is owner-checked."""
    group = fresh_redlock()
    with lockkit.connect(url([s.port for s in group])) as locks:
        warm(locks)
        n = name()
        lock = locks.lock(n, ttl=10, auto_renew=False)
        group[4].pause()
        try:
            lock.acquire()
        finally:
            group[4].resume()
        wait_for_key(group[4], n)
        group[0].kill()
        group[1].kill()
        lease = lock.renew(ttl=10)
        assert lease.valid
        for server in group[2:]:
            assert raw(server).pttl(lock_key(n)) > 5_000, f"master {server.port} was not renewed"


def test_L9_a_master_that_stays_paused_costs_each_call_a_short_wait(fresh_redlock: RedlockFactory) -> None:
    group = fresh_redlock()
    last = group[4]
    rounds = 10
    names = [name() for _ in range(rounds)]
    with lockkit.connect(url([s.port for s in group])) as locks:
        warm(locks)
        last.pause()
        try:
            started = time.monotonic()
            for n in names:
                with locks.lock(n, ttl=5, auto_renew=False):
                    pass
            took = time.monotonic() - started
        finally:
            last.resume()
        # Each call waits at most SETTLE_WAIT for the paused master's owed reply; before, each waited TIMEOUT.
        assert took < rounds * (SETTLE_WAIT * 2) + QUICK, f"{rounds} acquire+release took {took:.2f} s"
        for n in names:  # every lock was freed on a quorum at once
            assert sum(raw(server).exists(lock_key(n)) for server in group[:4]) == 0
        # Back from its pause, the master answers the one command that reached it; nothing is left unread.
        wait_for_key(last, names[0])
        n = name()
        with locks.lock(n, ttl=5) as lease:
            wait_for_key(last, n)
            assert raw(last).get(lock_key(n)) == lease.token.encode()
        wait_for_key(last, n, present=False)


def test_L9_C12_a_connection_closed_while_it_owed_replies_is_replaced_before_use(
    fresh_redlock: RedlockFactory,
) -> None:
    """Masters that drop connections idle for 1 s (Redis ``timeout 1``, C-12): the connections whose replies the
    acquire left unread are closed by the time of the next call, after those replies. The next acquire reads
    them, sees the close, and connects afresh before its SET: every master holds the new lock (a SET sent on the
    closed connection would have been lost there)."""
    group = fresh_redlock(extra_args=["--timeout", "1"])
    with lockkit.connect(url([s.port for s in group])) as locks:
        warm(locks)
        first = locks.lock(name(), ttl=10, auto_renew=False)
        first.acquire()  # masters 3 and 4: replies left unread
        time.sleep(2.5)  # the servers close the idle connections (their cron looks about every 100 ms)
        n = name()
        with locks.lock(n, ttl=10, auto_renew=False) as lease:
            for server in group[3:]:
                wait_for_key(server, n)
                assert raw(server).get(lock_key(n)) == lease.token.encode()


async def test_L9_async_a_cancel_while_owed_replies_are_awaited_loses_nothing(fresh_redlock: RedlockFactory) -> None:
    """An acquire cancelled while its fan-out waits for the replies an earlier one left unread (the last master
    is paused, so that wait lasts up to SETTLE_WAIT): the connection goes back to the pool still owing them,
    nothing of the cancelled acquire stays on the masters, and after the resume every call is right."""
    group = fresh_redlock()
    last = group[4]
    async with lockkit.connect_async(url([s.port for s in group])) as locks:
        warmed = name()
        async with locks.lock(warmed, ttl=5):
            pass
        assert not (await locks.holder(warmed)).held
        first, second = name(), name()
        held = locks.lock(first, ttl=10, auto_renew=False)
        last.pause()
        try:
            await held.acquire()  # master 4's reply owed
            other = locks.lock(second, ttl=10, auto_renew=False)
            task = asyncio.ensure_future(other.acquire())
            await asyncio.sleep(SETTLE_WAIT / 3)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            else:  # a loaded machine let it finish first (it did without master 4): let it go
                await other.release()
        finally:
            last.resume()
        wait_for_key(last, first)
        await held.release()
        until = time.monotonic() + 10
        while any(raw(server).exists(lock_key(second)) for server in group):  # the cancelled acquire is undone
            assert time.monotonic() < until, "the cancelled acquire's keys stayed"
            await asyncio.sleep(0.01)
        for server in group:
            assert raw(server).exists(lock_key(first)) == 0
        for _ in range(5):
            n = name()
            async with locks.lock(n, ttl=5) as lease:
                assert sum(raw(server).get(lock_key(n)) == lease.token.encode() for server in group) >= 3
