"""Semaphores and reader-writer locks on redis+cluster://: the shipped suite (both faces) and the HA faults.

The suite runs on the session's cluster (three masters); its names are random, so they spread over all three.
The fault tests use clusters of their own: a semaphore's slot migrated to another master with permits held and
a waiter queued (S-22), and the master of its slot SIGKILLed with permits held, its replica promoted (S-23).
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from typing import Any

import pytest

import lockkit
from backends.pytest_fixtures import RedisClusterFactory
from backends.servers import RedisCluster
from lockkit.drivers.epoch import EPOCH_SHIFT
from lockkit.drivers.redis.cluster_config import key_slot
from lockkit.drivers.redis.semaphore_scripts import cluster_permit_keys
from lockkit.testing import AsyncSemaphoreSuite, SemaphoreSuite

SLACK = 2.0
"""A generous liveness bound for a server-driven wake-up (the machine is shared and noisy)."""


class TestClusterSemaphores(SemaphoreSuite):
    @pytest.fixture
    def url(self, redis_cluster: RedisCluster) -> str:
        return redis_cluster.url


class TestClusterSemaphoresAsync(AsyncSemaphoreSuite):
    @pytest.fixture
    def url(self, redis_cluster: RedisCluster) -> str:
        return redis_cluster.url


def name() -> str:
    return f"sem-cl-{secrets.token_hex(5)}"


def _slot(n: str) -> int:
    return key_slot(cluster_permit_keys("lockkit:", n).holders)


def test_every_key_and_channel_of_a_name_is_in_one_slot() -> None:
    keys = cluster_permit_keys("lockkit:", "tenant-{42}:api")
    slots = {key_slot(k) for k in (*keys.script_keys(), keys.channel, keys.clients + b"0123456789ab")}
    assert len(slots) == 1


def test_permit_tokens_carry_the_masters_config_epoch(redis_cluster: RedisCluster) -> None:
    n = name()
    master = redis_cluster.node_for_slot(_slot(n))
    info = master.ask("CLUSTER", "INFO")
    text = info.decode() if isinstance(info, bytes) else str(info)
    epoch = int(next(line for line in text.splitlines() if line.startswith("cluster_my_epoch:")).split(":")[1])
    with lockkit.connect(redis_cluster.url) as locks, locks.semaphore(n, limit=2, ttl=5) as lease:
        assert lease.fencing_token >> EPOCH_SHIFT == epoch
        assert locks.permit_holders(n).fencing_token == lease.fencing_token


def test_async_face_routes_and_a_release_hands_the_permit_on(redis_cluster: RedisCluster) -> None:
    """The permit waiter is granted by the release's SPUBLISH on its client's channel in the name's slot."""
    n = name()

    async def main() -> None:
        async with lockkit.connect_async(redis_cluster.url) as a, lockkit.connect_async(redis_cluster.url) as b:
            holder = a.semaphore(n, limit=1, ttl=10)
            held = await holder.acquire(timeout=5)
            waiter = asyncio.ensure_future(b.semaphore(n, limit=1, ttl=10).acquire(timeout=20))
            while not (await a.permit_holders(n)).waiters:
                await asyncio.sleep(0.02)
            released = time.monotonic()
            await holder.release()
            lease = await waiter
            assert time.monotonic() - released < SLACK
            assert lease.fencing_token > held.fencing_token
            await b.force_release_permits(n)

    asyncio.run(main())


# -- S-22: a semaphore's slot migrated to another master --------------------------------------------------


@pytest.mark.slow
def test_S22_slot_migration_keeps_permits_renewable_the_limit_kept_and_wakes_the_waiter(
    fresh_redis_cluster: RedisClusterFactory,
) -> None:
    cluster = fresh_redis_cluster()
    n = name()
    slot = _slot(n)
    source = cluster.node_for_slot(slot)
    target = next(m for m in cluster.members if m is not source)
    with (
        lockkit.connect(cluster.url) as holder_side,
        lockkit.connect(cluster.url) as waiter_side,
        lockkit.connect(cluster.url) as third,
    ):
        permits = [holder_side.semaphore(n, limit=2, ttl=30, auto_renew=False) for _ in range(2)]
        held = [p.acquire(timeout=5) for p in permits]
        got: list[Any] = []

        def wait() -> None:
            try:
                got.append((waiter_side.semaphore(n, limit=2, ttl=10).acquire(timeout=30), time.monotonic()))
            except BaseException as exc:  # reported, never swallowed
                got.append(exc)

        waiter = threading.Thread(target=wait)
        waiter.start()
        deadline = time.monotonic() + 10
        while not holder_side.permit_holders(n).waiters and time.monotonic() < deadline:
            time.sleep(0.02)
        assert holder_side.permit_holders(n).waiters == 1

        cluster.start_migration(slot, source, target)
        permits[0].renew()  # MIGRATING, keys still on the source: served there
        moved = cluster.move_slot_keys(slot, source, target)
        assert moved, "the slot's keys were on the source"
        assert source.ask("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
        assert target.ask("CLUSTER", "COUNTKEYSINSLOT", slot) >= 3  # holders, meta, queue (and more)
        # A third client's attempt in the middle of the move waits for it to end (an acquire does not follow ASK),
        # then finds both permits taken: the limit is kept.
        tried: list[Any] = []
        attempt = threading.Thread(target=lambda: tried.append(third.semaphore(n, limit=2).try_acquire()))
        attempt.start()
        time.sleep(0.3)
        assert not tried
        cluster.finish_migration(slot, target)
        attempt.join(10)
        assert tried == [None]
        for p in permits:
            p.renew()  # MOVED: the map is refreshed, renewed on the new master
        assert third.semaphore(n, limit=2).try_acquire() is None
        assert all(lease.valid for lease in held) and not got
        time.sleep(0.5)  # the waiter's subscriptions move to the new master (sunsubscribe, MOVED)
        released = time.monotonic()
        permits[0].release()
        waiter.join(30)
        (result,) = got
        assert not isinstance(result, BaseException), repr(result)
        lease, woken = result
        assert woken - released < SLACK, f"the waiter took {woken - released:.2f} s after the release"
        # the counter moved with the keys, and the new master's epoch is at least the old one's
        assert lease.fencing_token > max(h.fencing_token for h in held)
        waiter_side.force_release_permits(n)


@pytest.mark.slow
def test_S22_async_face_follows_a_slot_migration(fresh_redis_cluster: RedisClusterFactory) -> None:
    """The asyncio face through the same move: auto-renewal carries the permit, the writer is woken after it."""
    cluster = fresh_redis_cluster()
    n = name()
    slot = _slot(n)
    source = cluster.node_for_slot(slot)
    target = next(m for m in cluster.members if m is not source)

    def move() -> None:
        cluster.start_migration(slot, source, target)
        moved = cluster.move_slot_keys(slot, source, target)
        assert moved, "the slot's keys were on the source"
        time.sleep(0.5)  # renewals run in the ASK phase (ttl 1.5 s: one every 0.5 s)
        cluster.finish_migration(slot, target)

    async def main() -> None:
        async with lockkit.connect_async(cluster.url) as a, lockkit.connect_async(cluster.url) as b:
            reader = a.rwlock(n, ttl=1.5).read()
            held = await reader.acquire(timeout=5)
            writer = asyncio.ensure_future(b.rwlock(n, ttl=5).write().acquire(timeout=30))
            while not (await a.permit_holders(n)).waiting_writers:
                await asyncio.sleep(0.02)
            await asyncio.to_thread(move)
            await asyncio.sleep(1.5)  # a whole TTL on the new master: renewed there, or lost
            assert held.valid
            assert not writer.done()
            released = time.monotonic()
            await reader.release()
            lease = await writer
            assert time.monotonic() - released < SLACK
            assert lease.fencing_token > held.fencing_token
            await b.force_release_permits(n)

    asyncio.run(main())


# -- S-23: the master of a semaphore's slot SIGKILLed -------------------------------------------------------


@pytest.mark.slow
def test_S23_master_killed_permits_followed_waiter_served_tokens_above(
    fresh_redis_cluster: RedisClusterFactory,
) -> None:
    """Two permits held (min_replicas=1: their grants are on the replica) and a permit waiter queued; the slot's
    master is SIGKILLed. The holders renew on the promoted replica, the waiter is served there after a release, and its
    token ranks above every earlier one (the promoted replica's epoch is above the dead master's)."""
    cluster = fresh_redis_cluster(replicas=1)
    n = name()
    slot = _slot(n)
    url = cluster.url + "?failover_wait=15"
    with lockkit.connect(url + "&min_replicas=1&replica_timeout=1") as holder_side, lockkit.connect(url) as waiter_side:
        permits = [holder_side.semaphore(n, limit=2, ttl=20, auto_renew=False) for _ in range(2)]
        held = [p.acquire(timeout=5) for p in permits]
        got: list[Any] = []

        def wait() -> None:
            try:
                got.append(waiter_side.semaphore(n, limit=2, ttl=5, auto_renew=False).acquire(timeout=40))
            except BaseException as exc:  # reported, never swallowed
                got.append(exc)

        waiter = threading.Thread(target=wait)
        waiter.start()
        deadline = time.monotonic() + 10
        while not holder_side.permit_holders(n).waiters and time.monotonic() < deadline:
            time.sleep(0.02)
        master = cluster.node_for_slot(slot)
        master.kill()
        for p in permits:
            p.renew()  # follows the promoted replica (the grants were acknowledged by it)
        assert all(lease.valid for lease in held)
        promoted = cluster.node_for_slot(slot)
        assert promoted is not master and promoted.running
        time.sleep(0.5)  # the waiter's channels move to the promoted replica
        permits[0].release()
        waiter.join(45)
        assert not waiter.is_alive()
        (result,) = got
        assert isinstance(result, lockkit.Lease), repr(result)
        assert result.fencing_token > max(h.fencing_token for h in held)
        assert result.fencing_token >> EPOCH_SHIFT > held[0].fencing_token >> EPOCH_SHIFT
        permits[1].release()
        waiter_side.force_release_permits(n)


@pytest.mark.slow
def test_S23_permit_the_replica_never_received_is_reported_lost(fresh_redis_cluster: RedisClusterFactory) -> None:
    """The replica is SIGSTOPped and its link cut, a permit is granted, the master SIGKILLed, the replica resumes
    and is promoted without it: the holder's next renewal reports the loss; a permit granted there ranks above."""
    cluster = fresh_redis_cluster(replicas=1)
    n = name()
    slot = _slot(n)
    master = cluster.node_for_slot(slot)
    replica = cluster.replica_of(master)
    with lockkit.connect(cluster.url + "?failover_wait=20") as locks:
        semaphore = locks.semaphore(n, limit=1, ttl=30, auto_renew=False)
        replica.pause()
        try:
            master.ask("CLIENT", "KILL", "TYPE", "replica")  # it cannot reconnect while stopped
            held = semaphore.acquire(timeout=5)
            master.kill()
        finally:
            replica.resume()
        with pytest.raises(lockkit.LockLost):
            semaphore.renew()  # on the promoted replica, which never had the permit
        assert not held.valid
        assert cluster.node_for_slot(slot) is replica
        with locks.semaphore(n, limit=1, ttl=5, timeout=20) as after:
            assert after.fencing_token > held.fencing_token
