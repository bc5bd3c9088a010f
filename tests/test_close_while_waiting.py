"""C-16: a semaphore's acquire still waiting when its locker closes ends with the closed locker's LockError
(the lock case runs in every driver's conformance suite, ``test_closing_ends_a_waiting_acquire``). Before, a
memory:// or redis:// permit waiter was handed a lease of the closed locker once a permit freed up, which
nothing then released."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import pytest

import lockkit
from backends.servers import RedisServer
from lockkit import LockError

SLACK = 5.0


def urls(redis_server: RedisServer) -> list[str]:
    return [f"memory://close-wait-{uuid.uuid4().hex[:6]}", redis_server.url]


@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_C16_closing_ends_a_waiting_semaphore_acquire(redis_server: RedisServer, kind: str) -> None:
    url = urls(redis_server)[0 if kind == "memory" else 1]
    name = f"sem-{uuid.uuid4().hex[:8]}"
    with lockkit.connect(url) as other:
        held = other.semaphore(name, 1, ttl=30)
        held.acquire()
        locker = lockkit.connect(url)
        outcome: list[BaseException | None] = []

        def wait() -> None:
            try:
                locker.semaphore(name, 1, ttl=30).acquire(timeout=30)
                outcome.append(None)
            except LockError as exc:
                outcome.append(exc)

        waiter = threading.Thread(target=wait)
        waiter.start()
        until = time.monotonic() + 10
        while (other.semaphore(name, 1).holders().waiters or 0) < 1:
            assert time.monotonic() < until, "the waiter never queued"
            time.sleep(0.01)
        started = time.monotonic()
        locker.close()
        waiter.join(SLACK)
        assert not waiter.is_alive(), "the waiter still waits after the close"
        assert time.monotonic() - started < SLACK
        (error,) = outcome
        assert isinstance(error, LockError) and "closed while this acquire waited" in str(error), repr(error)
        held.release()
        assert other.semaphore(name, 1, ttl=5).try_acquire() is not None  # nothing of the waiter's was left


async def test_C16_async_closing_ends_a_waiting_semaphore_acquire() -> None:
    url, name = f"memory://close-wait-{uuid.uuid4().hex[:6]}", "sem"
    async with lockkit.connect_async(url) as other:
        held = other.semaphore(name, 1, ttl=30)
        await held.acquire()
        locker = lockkit.connect_async(url)
        waiter = asyncio.ensure_future(locker.semaphore(name, 1, ttl=30).acquire(timeout=30))
        until = time.monotonic() + 10
        while ((await other.semaphore(name, 1).holders()).waiters or 0) < 1:
            assert time.monotonic() < until, "the waiter never queued"
            await asyncio.sleep(0.01)
        await locker.aclose()
        with pytest.raises(LockError, match="closed while this acquire waited"):
            await asyncio.wait_for(waiter, SLACK)
        await held.release()
        assert await other.semaphore(name, 1, ttl=5).try_acquire() is not None
