"""A paused (SIGSTOP: the kernel still accepts the bytes, nothing answers) or refusing master of a
``redis+sentinel://`` or ``redis+cluster://`` URL is reported by about the acquire's timeout, at least 1 s, as on
``redis://`` (docs/semantics.md, C-10).

An audit (F11) measured 2.0 s for ``acquire(timeout=0.2)`` and ``try_acquire()`` on both: their attempts waited
out the node's whole ``timeout`` (2 s) whatever the acquire's deadline, and a cluster master that refused
connections was retried until ``failover_wait`` (5 s). Now an attempt's reply, the checked hello of a connection
made for it, and the retries of a refused cluster master are bounded by the acquire's deadline (at least 1 s).
Neither set-up can fail over (no replica; sentinels that wait a minute), so the bound is the driver's own.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import pytest

import lockkit
from backends.pytest_fixtures import RedisClusterFactory, SentinelFactory
from backends.servers import RedisServer
from lockkit.drivers.redis.cluster_config import key_slot
from lockkit.drivers.redis.keys import cluster_lock_keys
from lockkit.drivers.redis.semaphore_scripts import cluster_permit_keys
from tests._timing import timed_failure

FLOOR = 1.45
"""An attempt's wait has a 1 s floor (ATTEMPT_WAIT); before the fix every case took the node's 2 s or more."""


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def while_paused(server: RedisServer, calls: list[Callable[[], Any]]) -> list[float]:
    """How long each of ``calls`` took to raise BackendUnavailable with ``server`` SIGSTOPped."""
    server.pause()
    try:
        return [timed_failure(call, lockkit.BackendUnavailable) for call in calls]
    finally:
        server.resume()


def test_C10_sentinel_a_paused_master_is_reported_by_the_acquire_deadline(fresh_sentinel: SentinelFactory) -> None:
    group = fresh_sentinel(replicas=0, down_after_ms=60_000)
    lock_name, permit_name = name("s-paused"), name("s-sem")
    with lockkit.connect(group.url) as locks:
        with locks.lock(f"{lock_name}-warm", ttl=5):
            pass  # located, a warm pooled connection
        took = while_paused(
            group.master(),
            [
                lambda: locks.lock(lock_name, ttl=5).acquire(timeout=0.2),
                lambda: locks.lock(lock_name, ttl=5).try_acquire(),
                lambda: locks.semaphore(permit_name, limit=2, ttl=5).acquire(timeout=0.2),
            ],
        )
        with locks.lock(lock_name, ttl=5) as lease:  # served again once it answers
            assert lease.valid
    assert max(took) < FLOOR, took  # before: 2.0 s each (the node's timeout)


def test_C10_sentinel_async_a_paused_master_is_reported_by_the_acquire_deadline(
    fresh_sentinel: SentinelFactory,
) -> None:
    group = fresh_sentinel(replicas=0, down_after_ms=60_000)
    lock_name = name("s-paused-async")

    async def main() -> float:
        async with lockkit.connect_async(group.url) as locks:
            async with locks.lock(f"{lock_name}-warm", ttl=5):
                pass
            master = group.master()
            master.pause()
            try:
                started = asyncio.get_running_loop().time()
                with pytest.raises(lockkit.BackendUnavailable):
                    await locks.lock(lock_name, ttl=5).acquire(timeout=0.2)
                return asyncio.get_running_loop().time() - started
            finally:
                master.resume()

    took = asyncio.run(main())
    assert took < FLOOR, took


def test_C10_cluster_a_paused_or_refusing_master_is_reported_by_the_acquire_deadline(
    fresh_redis_cluster: RedisClusterFactory,
) -> None:
    cluster = fresh_redis_cluster()
    target = cluster.masters()[0]

    def on_target(prefix: str, slot_of: Callable[[str], bytes]) -> str:
        return next(
            n for n in (name(prefix) for _ in range(10_000)) if cluster.node_for_slot(key_slot(slot_of(n))) is target
        )

    lock_name = on_target("c-paused", lambda n: cluster_lock_keys("lockkit:", n).lock)
    permit_name = on_target("c-sem", lambda n: cluster_permit_keys("lockkit:", n).holders)
    with lockkit.connect(cluster.url) as locks:
        with locks.lock(lock_name, ttl=5):
            pass  # mapped, a warm connection to the target
        took = while_paused(
            target,
            [
                lambda: locks.lock(lock_name, ttl=5).acquire(timeout=0.2),
                lambda: locks.lock(lock_name, ttl=5).try_acquire(),
                lambda: locks.semaphore(permit_name, limit=2, ttl=5).acquire(timeout=0.2),
            ],
        )
        with locks.lock(lock_name, ttl=5) as lease:  # served again once it answers
            assert lease.valid
        target.kill()  # refuses connections now; no replica can take over
        refused = timed_failure(lambda: locks.lock(lock_name, ttl=5).acquire(timeout=0.2), lockkit.BackendUnavailable)
    assert max(took) < FLOOR and refused < FLOOR + 0.5, (took, refused)  # before: 2.0 s each, refused 5.2 s
