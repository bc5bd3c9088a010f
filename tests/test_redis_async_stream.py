"""The asyncio Redis stream reads into a buffer of its own (issue 17): replies of any size arrive whole.

``lockkit/drivers/redis/_async/stream.py`` hands asyncio's transport one buffer per connection
(:class:`asyncio.BufferedProtocol`) instead of taking a new ``bytes`` per read (which asyncio asks for with
``recv(256 KiB)``, an ``mmap`` per read in some processes); each read is copied out of it at once, so a reply
that spans many reads, or many replies in one read, come out exactly as the server sent them.
"""

from __future__ import annotations

import asyncio
import time

import redis

from backends.servers import RedisServer
from lockkit.drivers.redis._async.connection import AsyncConnection
from lockkit.drivers.redis.calls import pack
from lockkit.drivers.redis.config import redis_nodes
from lockkit.urls import parse_url


def _connection(server: RedisServer) -> AsyncConnection:
    spec, _ = redis_nodes(parse_url(server.url))
    return AsyncConnection(spec)


def test_async_stream_reads_into_its_own_buffer(redis_server: RedisServer) -> None:
    async def main() -> None:
        conn = _connection(redis_server)
        await conn.connect()
        try:
            assert isinstance(conn._stream._protocol, asyncio.BufferedProtocol)  # type: ignore[union-attr]
        finally:
            await conn.close()

    asyncio.run(main())


def test_async_replies_larger_than_the_read_buffer_arrive_whole(redis_server: RedisServer) -> None:
    value = bytes(range(256)) * 1200  # 300 KiB: several reads of the stream's buffer
    key = f"stream-big-{time.monotonic_ns()}"
    redis.Redis(host=redis_server.host, port=redis_server.port).set(key, value, px=60_000)

    async def main() -> None:
        conn = _connection(redis_server)
        await conn.connect()
        try:
            for _ in range(3):  # the buffer is reused from one read (and one reply) to the next
                await conn.send(pack([("GET", key)]))
                assert (await conn.read(1, time.monotonic() + 5)) == [value]
            counter = key + ":n"
            await conn.send(pack([("INCR", counter)] * 30_000))  # ~240 KB of small replies
            assert await conn.read(30_000, time.monotonic() + 10) == list(range(1, 30_001))
            await conn.send(pack([("GET", key), ("DEL", key, counter)]))
            assert await conn.read(2, time.monotonic() + 5) == [value, 2]
        finally:
            await conn.close()

    asyncio.run(main())
