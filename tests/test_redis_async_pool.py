"""The asyncio Redis node's checkout (issue 17): a pooled connection is handed out as it is only when it is fit.

The node skips :meth:`AsyncConnection.ready` for a connection that is connected, was not closed by the server
while it sat idle, and is not due a health check (``AsyncConnection.fit``); every other one is made ready
first, so even a non-idempotent acquire never goes out on a dead connection (C-12).
"""

from __future__ import annotations

import asyncio
import uuid

import redis

import lockkit
from backends.pytest_fixtures import RedisFactory
from backends.servers import RedisServer


def _raw(server: RedisServer) -> redis.Redis:
    return redis.Redis(host=server.host, port=server.port, socket_timeout=2)


def _name() -> str:
    return f"pool-{uuid.uuid4().hex[:8]}"


async def _take_and_release(locks: lockkit.AsyncLocker) -> None:
    lock = locks.lock(_name(), ttl=5)
    await lock.acquire()
    await lock.release()


def test_C12_async_acquire_after_the_server_closed_the_idle_connection(fresh_redis: RedisFactory) -> None:
    """The server closes the pooled connection while it sits idle: the next acquire (not retried on an error,
    as it is not idempotent) goes out on a new connection and succeeds, instead of failing on the dead one."""
    server = fresh_redis()  # its own: every other client's connection is cut too
    raw = _raw(server)

    async def main() -> None:
        async with lockkit.connect_async(server.url) as locks:
            driver = locks.backend_for("pool").driver
            await _take_and_release(locks)
            pooled = list(driver._node.pool._idle)
            assert len(pooled) == 1
            killed = raw.client_kill_filter(_type="normal", skipme=True)
            assert killed >= 1
            for _ in range(100):  # the loop sees the EOF on its own: the connection is stale now
                if pooled[0]._stream is None or pooled[0]._stream.stale():
                    break
                await asyncio.sleep(0.01)
            lock = locks.lock(_name(), ttl=5)
            assert (await lock.acquire(timeout=0)).valid
            await lock.release()

    asyncio.run(main())


def test_async_checkout_pings_a_connection_idle_for_longer_than_the_health_check_interval(
    redis_server: RedisServer,
) -> None:
    raw = _raw(redis_server)

    def pings() -> int:
        return int(raw.info("commandstats").get("cmdstat_ping", {}).get("calls", 0))

    async def main() -> None:
        async with lockkit.connect_async(redis_server.url + "?health_check_interval=0.3") as locks:
            await _take_and_release(locks)
            before = pings()
            await _take_and_release(locks)  # used a moment ago: no PING
            assert pings() == before
            await asyncio.sleep(0.45)
            await _take_and_release(locks)  # idle for longer than the interval: a PING
            assert pings() >= before + 1

    asyncio.run(main())
