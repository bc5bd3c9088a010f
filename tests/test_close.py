"""close() releases what the locker holds, on every backend and both faces (issue 15).

Before: a lock held at close stayed taken until its TTL on Redis, Redlock and file:// (the next waiter waited
the whole ttl), and every lease was reported lost with one WARNING each.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from pathlib import Path

import pytest

import lockkit
from lockkit.lease import LeaseState

TTL = 30.0  # long: a lock that close() did not release would make the next try_acquire fail


@pytest.fixture(params=["memory", "file", "redis", "redlock", "sentinel", "cluster", "zookeeper", "etcd", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    kind = request.param
    if kind == "memory":
        return f"memory://close-{uuid.uuid4().hex[:8]}"
    if kind == "file":
        return (tmp_path / "locks").as_uri()
    server = request.getfixturevalue(
        {
            "redis": "redis_server",
            "redlock": "redlock_servers",
            "sentinel": "sentinel_set",
            "cluster": "redis_cluster",
            "zookeeper": "zookeeper_server",
            "etcd": "etcd_server",
            "postgres": "postgres_server",
        }[kind]
    )
    url: str = server.url
    return url


def _name() -> str:
    return f"close:{uuid.uuid4().hex[:10]}"


def test_close_releases_held_locks(url: str, caplog: pytest.LogCaptureFixture) -> None:
    names = [_name() for _ in range(3)]
    lost: list[lockkit.Lease] = []
    other = lockkit.connect(url)
    try:
        locks = lockkit.connect(url)
        leases = [locks.lock(n, ttl=TTL, on_lost=lost.append).acquire(timeout=5) for n in names]
        with caplog.at_level(logging.WARNING, logger="lockkit"):
            locks.close()
        assert [lease.state for lease in leases] == [LeaseState.RELEASED] * 3
        assert not lost
        assert not [r for r in caplog.records if "lost" in r.getMessage()]
        for n in names:  # free at once, not after the 30 s TTL
            assert other.lock(n, ttl=5).try_acquire() is not None, f"{n} still held after close()"
        assert locks.stats()[next(iter(locks.stats()))]["releases"] == 3
    finally:
        other.close()


async def test_aclose_releases_held_locks(url: str) -> None:
    names = [_name() for _ in range(3)]
    locks = lockkit.connect_async(url)
    leases = [await locks.lock(n, ttl=TTL).acquire(timeout=5) for n in names]
    await locks.aclose()
    assert [lease.state for lease in leases] == [LeaseState.RELEASED] * 3
    async with lockkit.connect_async(url) as other:
        for n in names:
            assert await other.lock(n, ttl=5).try_acquire() is not None, f"{n} still held after aclose()"


def test_with_block_exit_of_the_locker_releases(url: str) -> None:
    name = _name()
    with lockkit.connect(url) as locks:
        lease = locks.lock(name, ttl=TTL).acquire(timeout=5)
    assert lease.state is LeaseState.RELEASED
    with lockkit.connect(url) as other:
        assert other.lock(name, ttl=5).try_acquire() is not None


def test_a_lock_taken_over_before_close_is_reported_once_and_untouched(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = (tmp_path / "locks").as_uri()
    name = _name()
    lost: list[lockkit.Lease] = []
    locks = lockkit.connect(url)
    lease = locks.lock(name, ttl=TTL, auto_renew=False, on_lost=lost.append).acquire(timeout=5)
    with lockkit.connect(url) as admin:
        admin.force_release(name)
        thief = admin.lock(name, ttl=TTL).acquire(timeout=5)
        with caplog.at_level(logging.WARNING, logger="lockkit"):
            locks.close()
        assert lease.state is LeaseState.LOST and lost == [lease]
        warnings = [r.getMessage() for r in caplog.records if "closing backend" in r.getMessage()]
        assert len(warnings) == 1 and "no longer this client's" in warnings[0]
        assert thief.valid and admin.holder(name).held  # the other holder's lock was not touched
        assert locks.stats()["default"]["losses"] == 1


def test_close_with_the_server_gone_gives_up_fast_and_says_so_once(
    fresh_redis: object, caplog: pytest.LogCaptureFixture
) -> None:
    server = fresh_redis()  # type: ignore[operator]
    locks = lockkit.connect(server.url + "?timeout=1&connect_timeout=1")
    leases = [locks.lock(_name(), ttl=TTL).acquire(timeout=5) for _ in range(20)]
    server.kill()
    with caplog.at_level(logging.WARNING, logger="lockkit"):
        locks.close()
    assert all(lease.state is LeaseState.LOST for lease in leases)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len([w for w in warnings if "closing backend" in w]) == 1, warnings
    assert "left 20 lock(s) held" in next(w for w in warnings if "closing backend" in w)
    assert not [w for w in warnings if "lost (" in w]  # no line per lease
    assert locks.stats()["default"]["losses"] == 20


def test_a_forked_child_closing_never_releases_its_parents_locks(tmp_path: Path) -> None:
    import os

    url = (tmp_path / "locks").as_uri()
    name = _name()
    with lockkit.connect(url) as locks:
        lease = locks.lock(name, ttl=TTL).acquire(timeout=5)
        pid = os.fork()
        if pid == 0:  # the child closes the inherited locker and exits
            try:
                locks.close()
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        assert lease.valid
        with lockkit.connect(url) as other:
            assert other.lock(name, ttl=5).try_acquire() is None  # still the parent's


def test_asyncio_run_helper_is_not_needed() -> None:
    """aclose() inside asyncio.run: releases before the loop ends (no task left behind)."""

    async def main() -> LeaseState:
        async with lockkit.connect_async(f"memory://close-{uuid.uuid4().hex[:8]}") as locks:
            lease = await locks.lock(_name(), ttl=TTL).acquire()
        return lease.state

    assert asyncio.run(main()) is LeaseState.RELEASED
