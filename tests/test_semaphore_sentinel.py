"""Semaphores and reader-writer locks on redis+sentinel://: the shipped suite (both faces) and the HA faults.

The suite runs on the session's Sentinel set (a master, two replicas, three sentinels). The fault tests SIGKILL
the master of a set of their own (``fresh_sentinel``) with permits held and a writer waiting (S-20), and lose a
grant the replicas never received (S-21); lockkit gets a generous bound to follow: never a speed assertion.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from typing import Any

import pytest
import redis

import lockkit
from backends.pytest_fixtures import SentinelFactory
from backends.servers import RedisServer, SentinelSet
from lockkit.drivers.epoch import EPOCH_SHIFT
from lockkit.testing import AsyncSemaphoreSuite, SemaphoreSuite

FOLLOW = 20.0  # seconds: the sentinels' failover (~1-3 s here) plus a generous margin for a loaded machine


class TestSentinelSemaphores(SemaphoreSuite):
    @pytest.fixture
    def url(self, sentinel_set: SentinelSet) -> str:
        return sentinel_set.url


class TestSentinelSemaphoresAsync(AsyncSemaphoreSuite):
    @pytest.fixture
    def url(self, sentinel_set: SentinelSet) -> str:
        return sentinel_set.url


def name() -> str:
    return f"sem-sentinel-{uuid.uuid4().hex[:8]}"


def test_permit_tokens_carry_the_config_epoch(sentinel_set: SentinelSet) -> None:
    epoch = int(sentinel_set.sentinels[0].ask("SENTINEL", "MASTER", "mymaster")["config-epoch"])
    with lockkit.connect(sentinel_set.url) as locks:
        with locks.semaphore(name(), limit=2, ttl=5) as lease:
            assert lease.fencing_token >> EPOCH_SHIFT == epoch
        rw = locks.rwlock(name(), ttl=5)
        with rw.write() as lease:
            assert lease.fencing_token >> EPOCH_SHIFT == epoch


def _wait_for_a_replica(master: tuple[str, int], timeout: float = 30.0) -> None:
    """Until the promoted master has a replica in sync again (as tests/test_sentinel.py does)."""
    client = redis.Redis(host=master[0], port=master[1], socket_timeout=2)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            replicas = [v for k, v in client.info("replication").items() if k.startswith("slave")]
            if any(isinstance(v, dict) and v.get("state") == "online" for v in replicas):
                return
            time.sleep(0.1)
    finally:
        client.close()
    raise AssertionError(f"no replica in sync with the promoted master {master} after {timeout:.0f} s")


def _failover(group: SentinelSet) -> tuple[str, int]:
    old = group.master_address()
    group.kill_master()
    new = group.wait_for_failover(old, timeout=FOLLOW)
    _wait_for_a_replica(new)
    return new


@pytest.mark.slow
def test_S20_master_killed_with_permits_held_and_a_writer_waiting(fresh_sentinel: SentinelFactory) -> None:
    """Two permits of a semaphore and a reader of an rwlock are held (min_replicas=1: their grants are on a
    replica), a writer waits behind the reader; the master is SIGKILLed. The holders renew on the promoted master,
    the writer is served there once the reader releases, and every token after the failover ranks above every
    token before it."""
    group = fresh_sentinel()
    sem, rw = name(), name()
    url = group.url + "?min_replicas=1&replica_timeout=1&failover_wait=15"
    with lockkit.connect(url) as holders, lockkit.connect(group.url + "?failover_wait=15") as waiters:
        permits = [holders.semaphore(sem, limit=2, ttl=20, auto_renew=False) for _ in range(2)]
        held = [p.acquire(timeout=5) for p in permits]
        reader = holders.rwlock(rw, ttl=20, auto_renew=False).read()
        read = reader.acquire(timeout=5)
        before = [lease.fencing_token for lease in (*held, read)]
        got: list[Any] = []

        def write() -> None:
            try:
                got.append(waiters.rwlock(rw, ttl=10).write().acquire(timeout=FOLLOW + 20))
            except BaseException as exc:  # reported, never swallowed
                got.append(exc)

        writer = threading.Thread(target=write)
        writer.start()
        deadline = time.monotonic() + 10
        while not holders.permit_holders(rw).waiting_writers and time.monotonic() < deadline:
            time.sleep(0.02)
        assert holders.permit_holders(rw).waiting_writers == 1

        _failover(group)
        for p in permits:
            p.renew()  # on the promoted master, which has the grants (WAIT 1): renewed, or LockLost
        reader.renew()
        assert all(lease.valid for lease in (*held, read))
        assert holders.semaphore(sem, limit=2).try_acquire() is None  # the limit is kept across the failover
        assert not got
        reader.release()  # on the promoted master: the waiting writer goes (it re-queued there if it had to)
        writer.join(FOLLOW + 25)
        assert not writer.is_alive()
        (result,) = got
        assert isinstance(result, lockkit.Lease), repr(result)
        assert result.fencing_token > max(before)
        assert result.fencing_token >> EPOCH_SHIFT > read.fencing_token >> EPOCH_SHIFT
        for p in permits:
            p.release()
        after = holders.semaphore(sem, limit=2, ttl=5).acquire(timeout=5)
        assert after.fencing_token > max(before)
        holders.force_release_permits(sem)
        waiters.force_release_permits(rw)


@pytest.mark.slow
def test_S21_permit_the_replica_never_received_reports_loss(fresh_sentinel: SentinelFactory) -> None:
    """The replicas are SIGSTOPped and their links cut, a permit is granted and the master SIGKILLed: the
    promoted replica never had it, so the holder's next renewal reports the loss (never a silent success), and
    a permit granted there ranks above the lost one (the config epoch went up)."""
    group = fresh_sentinel()
    n = name()
    replicas = [r for r in group.redis if r.address != group.master_address()]
    with lockkit.connect(group.url + "?failover_wait=15") as locks:
        locks.semaphore("warm-up", limit=1, ttl=1, auto_renew=False).acquire(timeout=5)  # the master is found
        semaphore = locks.semaphore(n, limit=1, ttl=30, auto_renew=False)
        for replica in replicas:
            replica.pause()
        redis.Redis(*group.master().address).client_kill_filter(_type="replica")
        try:
            lost = semaphore.acquire(timeout=5)
            old = group.master_address()
            group.kill_master()
        finally:
            for replica in replicas:
                replica.resume()
        group.wait_for_failover(old, timeout=FOLLOW)
        with pytest.raises(lockkit.LockLost):
            semaphore.renew()
        assert not lost.valid
        with locks.semaphore(n, limit=1, ttl=5, timeout=FOLLOW) as taken:
            assert taken.fencing_token > lost.fencing_token


@pytest.mark.slow
def test_S20_async_holder_follows_and_tokens_stay_monotonic(fresh_sentinel: SentinelFactory) -> None:
    """The asyncio face: auto-renewal carries held permits across the failover; tokens after it rank above."""
    group = fresh_sentinel()
    n = name()

    async def main() -> None:
        async with lockkit.connect_async(group.url + "?min_replicas=1&replica_timeout=1&failover_wait=15") as locks:
            lease = await locks.semaphore(n, limit=2, ttl=6).acquire(timeout=5)
            before = lease.fencing_token
            await asyncio.to_thread(_failover, group)
            await asyncio.sleep(3)  # renewals run on the promoted master
            assert lease.valid
            await locks.force_release_permits(n)
            deadline = time.monotonic() + FOLLOW
            while True:  # min_replicas=1 is refused (rightly) while the sentinels reattach the replica
                try:
                    other = await locks.semaphore(n, limit=2, ttl=5, auto_renew=False).acquire(timeout=FOLLOW)
                    break
                except lockkit.BackendUnavailable as exc:
                    if "min_replicas" not in str(exc) or time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.2)
            assert other.fencing_token > before
            await locks.force_release_permits(n)

    asyncio.run(main())


@pytest.mark.slow
def test_S21_async_permit_the_replica_never_received_reports_loss(fresh_sentinel: SentinelFactory) -> None:
    """S-21 on the asyncio face: the grant the promoted replica never had is reported lost by the next renewal,
    and the next grant there ranks above it."""
    group = fresh_sentinel()
    n = name()
    replicas = [r for r in group.redis if r.address != group.master_address()]

    async def main() -> None:
        async with lockkit.connect_async(group.url + "?failover_wait=15") as locks:
            await locks.semaphore("warm-up", limit=1, ttl=1, auto_renew=False).acquire(timeout=5)
            semaphore = locks.semaphore(n, limit=1, ttl=30, auto_renew=False)
            for replica in replicas:
                replica.pause()
            redis.Redis(*group.master().address).client_kill_filter(_type="replica")
            try:
                lost = await semaphore.acquire(timeout=5)
                old = group.master_address()
                group.kill_master()
            finally:
                for replica in replicas:
                    replica.resume()
            await asyncio.to_thread(group.wait_for_failover, old, timeout=FOLLOW)
            with pytest.raises(lockkit.LockLost):
                await semaphore.renew()
            assert not lost.valid
            async with locks.semaphore(n, limit=1, ttl=5, timeout=FOLLOW) as taken:
                assert taken.fencing_token > lost.fencing_token

    asyncio.run(main())


def test_min_replicas_is_waited_for_by_permits_too(redis_server: RedisServer) -> None:
    """``min_replicas`` (every Redis scheme: here one server without replicas) makes a permit's grant WAIT for
    the replicas, as a lock's does: fewer acknowledgements give the permit back and raise, never a permit
    that a failover would silently lose."""
    n = name()
    with lockkit.connect(redis_server.url + "?min_replicas=1&replica_timeout=0.2") as locks:
        with pytest.raises(lockkit.BackendUnavailable, match="min_replicas"):
            locks.semaphore(n, limit=2, ttl=10).acquire(timeout=2)
        with pytest.raises(lockkit.BackendUnavailable, match="min_replicas"):
            locks.rwlock(n + "-rw", ttl=10).write().try_acquire()
        assert locks.permit_holders(n).holders == 0  # given back
