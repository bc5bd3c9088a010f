"""Cancelling a waiting permit acquire on the asyncio face leaves nothing queued (every backend with permits).

A cancelled writer that stayed queued would hold back every later reader until its place lapsed; a permit
granted to a cancelled acquire would stay taken for a whole ttl. Both must be cleaned up.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest

import lockkit
from backends.servers import EtcdServer, RedisServer


@pytest.fixture(params=["memory", "file", "redis", "etcd", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "memory":
        return f"memory://sem-cancel-{uuid.uuid4().hex[:8]}"
    if request.param == "file":
        return (tmp_path / "locks").as_uri()
    server: RedisServer | EtcdServer = request.getfixturevalue(f"{request.param}_server")
    return server.url


async def _until(check: object, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await check():  # type: ignore[operator]
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached")


async def test_cancelled_writer_leaves_the_queue(url: str) -> None:
    name = f"cancel-{uuid.uuid4().hex[:8]}"
    async with lockkit.connect_async(url) as locks, lockkit.connect_async(url) as other:
        rw = locks.rwlock(name, ttl=30)
        reader = rw.read()
        await reader.acquire(timeout=5)
        writer = other.rwlock(name, ttl=30).write()
        task = asyncio.ensure_future(writer.acquire(timeout=30))

        async def queued() -> bool:
            return (await locks.permit_holders(name)).waiting_writers == 1

        await _until(queued)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

        async def left() -> bool:
            return (await locks.permit_holders(name)).waiting_writers == 0

        await _until(left)
        # the readers the writer held back may go again at once, not after its 30 s place lapses
        assert await rw.read().try_acquire() is not None
        assert not writer.owned()


async def test_cancelled_permit_wait_takes_nothing(url: str) -> None:
    name = f"cancel-{uuid.uuid4().hex[:8]}"
    async with lockkit.connect_async(url) as locks, lockkit.connect_async(url) as other:
        holder = locks.semaphore(name, limit=1, ttl=30)
        await holder.acquire(timeout=5)
        waiter = other.semaphore(name, limit=1, ttl=30)
        task = asyncio.ensure_future(waiter.acquire(timeout=30))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await holder.release()

        async def free() -> bool:
            return (await locks.permit_holders(name)).holders == 0

        await _until(free)  # the cancelled waiter did not end up holding the permit
        assert await locks.semaphore(name, limit=1, ttl=30).try_acquire() is not None
