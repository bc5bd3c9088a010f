"""Safety at the API's edges (docs/reliability.md, A-1 and A-2), against real servers.

A-1: ``renew(ttl=…)`` with a ttl shorter or longer than the one the lease has, on both faces. The server's
expiry moves to the new ttl; the lease must follow it (never say ``valid`` after the server could have expired
it), and automatic renewal must go on at the new ttl's pace.

A-2: an asyncio ``release()`` (or ``renew()``) cancelled at an await point. The lease's state must match the
server's afterwards: released on both sides, or held on both sides and still renewed — never ``valid`` while
the server let the lock go, never held on the server with nobody renewing it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from pathlib import Path

import pytest

import lockkit
from backends.servers import EtcdServer, RedisServer, RedlockServers, ZooKeeperServer
from lockkit.configured_backend import Backend
from lockkit.lease import Lease
from lockkit.testing import FakeClock


@pytest.fixture
def memory_url() -> str:
    return f"memory://edges-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def file_url(tmp_path: Path) -> str:
    return (tmp_path / "locks").as_uri()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url


@pytest.fixture
def redlock_url(redlock_servers: RedlockServers) -> str:
    return redlock_servers.url


@pytest.fixture
def zookeeper_url(zookeeper_server: ZooKeeperServer) -> str:
    return zookeeper_server.url


@pytest.fixture
def etcd_url(etcd_server: EtcdServer) -> str:
    return etcd_server.url


def _url(request: pytest.FixtureRequest, backend: str) -> str:
    return str(request.getfixturevalue(f"{backend}_url"))


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


# -- renew(ttl) --------------------------------------------------------------------------------------

TTL_BACKENDS = ["memory", "file", "redis", "redlock"]
"""Backends whose lock lives by its TTL, so renew(ttl) moves the server's expiry (etcd rounds ttls to whole
seconds on one shared session lease and ZooKeeper ties the lock to its session: the ttl-follows part of A-1
is theirs only as far as the lease reports the effective ttl; their direct renew is covered by A-2)."""


@pytest.mark.parametrize("backend", TTL_BACKENDS)
def test_A1_renew_with_shorter_ttl_leaves_no_second_valid_holder(request: pytest.FixtureRequest, backend: str) -> None:
    """renew(ttl=1) without auto-renewal: the lease ends when the server's key does, not 30 s later."""
    url = _url(request, backend)
    name = _name("a1-short")
    with lockkit.connect(url) as first, lockkit.connect(url) as second:
        lock = first.lock(name, ttl=30, auto_renew=False)
        lease = lock.acquire(timeout=5)
        time.sleep(1.2)  # the renewal scheduler has looked at (admitted) the lease by now
        lock.renew(ttl=1)
        assert lease.remaining() <= 1.0, f"after renew(ttl=1) the lease still claims {lease.remaining():.1f} s"
        assert lease.ttl == pytest.approx(1.0, abs=0.01)
        deadline = time.monotonic() + 5
        other = None
        while other is None and time.monotonic() < deadline:
            # Both faces of the invariant at once: whenever the second client holds, the first is not valid.
            other = second.lock(name, ttl=3).try_acquire()
            if other is None:
                time.sleep(0.05)
        assert other is not None, "the server kept the lock although its ttl was shortened to 1 s"
        assert not lease.valid, f"two valid holders: the first lease still says {lease.remaining():.1f} s left"


@pytest.mark.parametrize("backend", TTL_BACKENDS)
def test_A1_renew_with_shorter_ttl_renews_at_the_new_ttl(request: pytest.FixtureRequest, backend: str) -> None:
    """renew(ttl=1) with auto-renewal on: the schedule adopts the 1 s ttl, so the lock stays held and valid."""
    url = _url(request, backend)
    name = _name("a1-sched")
    lost: list[Lease] = []
    with lockkit.connect(url) as first, lockkit.connect(url) as second:
        lock = first.lock(name, ttl=30, on_lost=lost.append)
        lease = lock.acquire(timeout=5)
        time.sleep(1.2)
        lock.renew(ttl=1)
        for _ in range(5):  # 2.5 s: several periods of the new ttl, far short of the old ttl's first renewal
            time.sleep(0.5)
            taken = second.lock(name, ttl=3).try_acquire()
            assert taken is None, "a second client acquired: renewal went on at the old ttl's pace"
            assert lease.valid, f"the lease was lost: {lease.lost_reason}"
        assert not lost
        assert lease.remaining() <= 1.0
        lock.release()


@pytest.mark.parametrize("backend", TTL_BACKENDS)
def test_A1_renew_with_longer_ttl_moves_the_deadline_out(request: pytest.FixtureRequest, backend: str) -> None:
    url = _url(request, backend)
    name = _name("a1-long")
    with lockkit.connect(url) as first, lockkit.connect(url) as second:
        lock = first.lock(name, ttl=2, auto_renew=False)
        lease = lock.acquire(timeout=5)
        lock.renew(ttl=6)
        assert lease.remaining() > 5.0
        time.sleep(2.5)  # past the first ttl: the server must still hold it for us
        assert lease.valid
        assert second.lock(name, ttl=3).try_acquire() is None
        lock.release()


@pytest.mark.parametrize("backend", TTL_BACKENDS)
async def test_A1_async_renew_with_shorter_ttl_leaves_no_second_valid_holder(
    request: pytest.FixtureRequest, backend: str
) -> None:
    """The asyncio face of the first A-1 test: ``await lock.renew(ttl=1)`` ends the lease with the server's key."""
    url = _url(request, backend)
    name = _name("a1-ashort")
    async with lockkit.connect_async(url) as first, lockkit.connect_async(url) as second:
        lock = first.lock(name, ttl=30, auto_renew=False)
        lease = await lock.acquire(timeout=5)
        await asyncio.sleep(1.2)  # the renewal scheduler has looked at (admitted) the lease by now
        await lock.renew(ttl=1)
        assert lease.remaining() <= 1.0, f"after renew(ttl=1) the lease still claims {lease.remaining():.1f} s"
        assert lease.ttl == pytest.approx(1.0, abs=0.01)
        deadline = time.monotonic() + 5
        other = None
        while other is None and time.monotonic() < deadline:
            other = await second.lock(name, ttl=3).try_acquire()
            if other is None:
                await asyncio.sleep(0.05)
        assert other is not None, "the server kept the lock although its ttl was shortened to 1 s"
        assert not lease.valid, f"two valid holders: the first lease still says {lease.remaining():.1f} s left"


@pytest.mark.parametrize("backend", TTL_BACKENDS)
async def test_A1_async_renew_with_shorter_ttl_renews_at_the_new_ttl(
    request: pytest.FixtureRequest, backend: str
) -> None:
    """The asyncio face: after ``await lock.renew(ttl=1)`` the renewal task keeps the 1 s ttl's pace."""
    url = _url(request, backend)
    name = _name("a1-asched")
    lost: list[Lease] = []
    async with lockkit.connect_async(url) as first, lockkit.connect_async(url) as second:
        lock = first.lock(name, ttl=30, on_lost=lost.append)
        lease = await lock.acquire(timeout=5)
        await asyncio.sleep(1.2)
        await lock.renew(ttl=1)
        for _ in range(5):  # 2.5 s: several periods of the new ttl, far short of the old ttl's first renewal
            await asyncio.sleep(0.5)
            taken = await second.lock(name, ttl=3).try_acquire()
            assert taken is None, "a second client acquired: renewal went on at the old ttl's pace"
            assert lease.valid, f"the lease was lost: {lease.lost_reason}"
        assert not lost
        assert lease.remaining() <= 1.0
        await lock.release()


@pytest.mark.parametrize("backend", TTL_BACKENDS)
async def test_A1_async_renew_with_longer_ttl_moves_the_deadline_out(
    request: pytest.FixtureRequest, backend: str
) -> None:
    url = _url(request, backend)
    name = _name("a1-along")
    async with lockkit.connect_async(url) as first, lockkit.connect_async(url) as second:
        lock = first.lock(name, ttl=2, auto_renew=False)
        lease = await lock.acquire(timeout=5)
        await lock.renew(ttl=6)
        assert lease.remaining() > 5.0
        await asyncio.sleep(2.5)  # past the first ttl: the server must still hold it for us
        assert lease.valid
        assert await second.lock(name, ttl=3).try_acquire() is None
        await lock.release()


def test_A1_renewal_tickets_cap_overlapping_renewals() -> None:
    """Two renewals in flight at once may land on the server in either order: the lease trusts the lower."""
    clock = FakeClock(100.0)
    lease = Lease(name="n", token="t" * 32, fencing_token=1, ttl=30, sent_at=clock.now, clock=clock)
    batch = lease.renewal_started(clock.now, 30)  # the scheduler's renewal, still in flight
    clock.advance(0.1)
    direct = lease.renewal_started(clock.now, 1)  # renew(ttl=1) sent meanwhile on another connection
    assert lease.extend(clock.now, 1, direct)
    assert lease.expires_at < clock.now + 1
    clock.advance(0.1)
    assert lease.extend(clock.now - 0.2, 30, batch)  # the batch's reply arrives last: it may have landed first
    assert lease.expires_at < clock.now + 1, "a reordered 30 s renewal must not outvote the 1 s one"
    unknown = lease.renewal_started(clock.now, 0.5)
    lease.renewal_unknown(unknown)  # it raised: it may still have reached the server
    assert lease.expires_at <= clock.now + 0.5


# -- cancelled async release / renew -----------------------------------------------------------------

CANCEL_BACKENDS = ["memory", "file", "redis", "zookeeper", "etcd"]
CANCEL_POINTS = [0, 1, 2, 3, 5, 8, 0.001, 0.003, 0.01]
"""Loop iterations (int) or seconds (float) to let the release run before cancelling it."""


async def _let_run(point: float) -> None:
    if isinstance(point, int):
        for _ in range(point):
            await asyncio.sleep(0)
    else:
        await asyncio.sleep(point)


async def _server_holds(url: str, name: str) -> bool:
    async with lockkit.connect_async(url) as probe:
        return await probe.lock(name).locked()


@pytest.mark.parametrize("backend", CANCEL_BACKENDS)
async def test_A2_cancelled_async_release_leaves_the_lease_matching_the_server(
    request: pytest.FixtureRequest, backend: str
) -> None:
    url = _url(request, backend)
    ttl = 2.0
    async with lockkit.connect_async(url) as locks:
        for point in CANCEL_POINTS:
            name = _name("a2-release")
            lock = locks.lock(name, ttl=ttl)
            lease = await lock.acquire(timeout=5)
            task = asyncio.ensure_future(lock.release())
            await _let_run(point)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await asyncio.sleep(0.3)  # whatever was still running settles
            held = await _server_holds(url, name)
            if lease.valid:
                assert held, f"cancel after {point}: the lease says valid but the server released {name!r}"
                await asyncio.sleep(ttl * 1.2)  # held on both sides: it must still be renewed
                assert lease.valid, f"cancel after {point}: held, but nobody renewed it ({lease.lost_reason})"
                assert await _server_holds(url, name)
                await lock.release()
            else:
                assert not held, f"cancel after {point}: the lease is over but the server still holds {name!r}"
            assert not lock.owned() or lease.valid


@pytest.mark.parametrize("backend", CANCEL_BACKENDS)
async def test_A2_cancelled_async_renew_never_trusts_more_than_the_server_has(
    request: pytest.FixtureRequest, backend: str
) -> None:
    url = _url(request, backend)
    async with lockkit.connect_async(url) as locks:
        for point in CANCEL_POINTS[:6]:
            name = _name("a2-renew")
            lock = locks.lock(name, ttl=30, auto_renew=False)
            lease = await lock.acquire(timeout=5)
            task = asyncio.ensure_future(lock.renew(ttl=2))
            await _let_run(point)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await asyncio.sleep(0.3)
            if backend in ("memory", "file", "redis"):
                # The renew either ran (2 s on the server) or never started (30 s): the lease may claim at most
                # what the server has. A renew that started completes in the background.
                if task.cancelled() and lease.remaining() > 2:
                    assert await _server_holds(url, name)
                else:
                    assert lease.remaining() <= 2.0, f"cancel after {point}: {lease.remaining():.1f} s claimed"
            assert lease.valid
            await lock.release()


def test_A2_cancelled_release_leaves_no_unawaited_task_error(memory_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """A release that fails after its caller was cancelled is logged, not lost as 'exception never retrieved'."""

    async def scenario() -> None:
        async with lockkit.connect_async(memory_url) as locks:
            lock = locks.lock(_name("a2-log"), ttl=0.3, auto_renew=False)
            await lock.acquire(timeout=5)
            await asyncio.sleep(0.4)  # expired: the release will find the lock gone
            task = asyncio.ensure_future(lock.release())
            await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.sleep(0.2)

    asyncio.run(scenario())
    assert "Task exception was never retrieved" not in caplog.text


# -- a ZooKeeper suspension reported between the grant and the front end's tracking ------------------------


def test_suspension_reported_before_the_lease_is_tracked_is_not_dropped() -> None:
    """The issue's suspicion, confirmed: ``Backend.uncertain`` dropped events for untracked tokens.

    A session driver (ZooKeeper, etcd) reports SUSPENDED by token from its own thread; if that lands after the
    driver returned the grant but before the front end tracked the lease, the lease used to start HELD on a
    suspended session. Driven here at the boundary the race crosses: the event comes first, then track().
    """
    backend: Backend[lockkit.Locker] = Backend("zk", "zookeeper://127.0.0.1:1", time.monotonic)  # type: ignore[type-var]
    lease = Lease(name="n", token="a" * 32, fencing_token=1, ttl=10, sent_at=time.monotonic(), clock=time.monotonic)
    backend.uncertain(lease.token, "session suspended")
    backend.track(lease)
    assert not lease.valid and lease.state is lockkit.LeaseState.UNCERTAIN
    backend.restored(lease.token)
    assert lease.valid

    restored_early = Lease(
        name="m", token="b" * 32, fencing_token=2, ttl=10, sent_at=time.monotonic(), clock=time.monotonic
    )
    backend.uncertain(restored_early.token, "session suspended")
    backend.restored(restored_early.token)  # back before tracking: nothing is left to apply
    backend.track(restored_early)
    assert restored_early.valid

    lost_then_suspended = Lease(
        name="o", token="c" * 32, fencing_token=3, ttl=10, sent_at=time.monotonic(), clock=time.monotonic
    )
    backend.lost(lost_then_suspended.token, "session expired")
    backend.uncertain(lost_then_suspended.token, "session suspended")
    backend.track(lost_then_suspended)
    assert lost_then_suspended.state is lockkit.LeaseState.LOST


@pytest.mark.parametrize("backend", ["zookeeper", "etcd"])
def test_max_hold_frees_a_session_bound_lock_while_the_session_lives_on(
    request: pytest.FixtureRequest, backend: str
) -> None:
    """max_hold ends the lease; on etcd and ZooKeeper the lock must not stay on the server with the session.

    Another lock of the same client is renewed all along, so the session (etcd's shared lease, the ZooKeeper
    session) stays alive: only a release can free the ended lock.
    """
    url = _url(request, backend)
    name = _name("maxhold")
    with lockkit.connect(url) as first, lockkit.connect(url) as second:
        keeper = first.lock(_name("keeper"), ttl=2).acquire(timeout=5)
        lost: list[Lease] = []
        lease = first.lock(name, ttl=2, max_hold=1, on_lost=lost.append).acquire(timeout=10)
        taken = second.lock(name, ttl=2).acquire(timeout=lease.ttl + 1 + 6)
        assert taken.valid and lost and not lease.valid
        assert keeper.valid, "the client's other lock must be unaffected"
