"""The asyncio Redis reader lets the event loop turn a few times before it blocks on a reply (issue 17).

``AsyncStream.turns_before_reply`` (lockkit/drivers/redis/_async/stream.py) saves the wake-up of a vCPU that
went to sleep right after a send; these tests pin what must hold whatever it saves: the turns are bounded, the
loop runs other tasks during them, none are taken when the reply is already there, and a caller cancelled
during them (the first place an acquire now suspends after its send) leaves no lock behind.
"""

from __future__ import annotations

import asyncio
import time

import pytest

import lockkit
from backends.servers import RedisServer
from lockkit.drivers.redis._async import stream as stream_module
from lockkit.drivers.redis._async.connection import AsyncConnection
from lockkit.drivers.redis.calls import pack
from lockkit.drivers.redis.config import redis_nodes
from lockkit.urls import parse_url


def _connection(server: RedisServer) -> AsyncConnection:
    spec, _ = redis_nodes(parse_url(server.url))
    return AsyncConnection(spec)


async def _turns_of(awaitable_factory: object) -> int:
    """How many turns the loop made (a ticker task's steps) while ``awaitable_factory()`` ran."""
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    try:
        before = ticks
        await awaitable_factory()  # type: ignore[operator]
        return ticks - before
    finally:
        task.cancel()


def test_the_turns_before_a_reply_are_bounded_and_let_other_tasks_run(redis_server: RedisServer) -> None:
    async def main() -> None:
        conn = _connection(redis_server)
        await conn.connect()
        stream = conn._stream
        assert stream is not None
        try:
            stream._round_trip = 0.0  # a connection whose replies come fast (its login's may not have, under load)
            # nothing was sent: no reply comes, so every turn allowed is taken, and no more
            window = stream_module.REPLY_WINDOW
            stream_module.REPLY_WINDOW = 10.0  # bounded by the count alone here
            try:
                turned = await _turns_of(stream.turns_before_reply)
            finally:
                stream_module.REPLY_WINDOW = window
            assert turned == stream_module.REPLY_TURNS >= 1
            # a window already over ends them before the first
            stream_module.REPLY_WINDOW = 0.0
            try:
                assert await _turns_of(stream.turns_before_reply) == 0
            finally:
                stream_module.REPLY_WINDOW = window
            # a connection whose replies take long (a remote server) takes none: they could not catch its reply
            stream._round_trip = 2 * stream_module.REPLY_TURNS_UP_TO
            assert await _turns_of(stream.turns_before_reply) == 0
            # ...and learns from its round trips: fast replies bring the turns back
            for _ in range(40):
                await conn.send(pack([("PING",)]))
                assert await conn.read(1, time.monotonic() + 5) == [b"PONG"]
            assert stream._round_trip < 2 * stream_module.REPLY_TURNS_UP_TO
        finally:
            await conn.close()

    asyncio.run(main())


def test_no_turn_is_taken_when_the_reply_is_already_there(redis_server: RedisServer) -> None:
    async def main() -> None:
        conn = _connection(redis_server)
        await conn.connect()
        stream = conn._stream
        assert stream is not None
        try:
            await conn.send(pack([("PING",)]))
            deadline = time.monotonic() + 5
            while not stream._protocol.data and time.monotonic() < deadline:
                await asyncio.sleep(0.001)
            window = stream_module.REPLY_WINDOW
            stream_module.REPLY_WINDOW = 10.0
            stream._round_trip = 0.0
            try:
                assert await _turns_of(stream.turns_before_reply) == 0
            finally:
                stream_module.REPLY_WINDOW = window
            assert await conn.read(1, time.monotonic() + 5) == [b"PONG"]
        finally:
            await conn.close()

    asyncio.run(main())


@pytest.mark.parametrize("turn", range(1, 4))
def test_an_acquire_cancelled_during_the_turns_leaves_no_lock_behind(redis_server: RedisServer, turn: int) -> None:
    """Cancelled ``turn`` loop turns after its send (inside the turns before the reply, or just after them), the
    acquire may have taken the lock on the server; its clean-up must pass it on, and the connection it used must
    not hand its late reply to the next command."""
    name = f"turns-cancel-{turn}-{time.monotonic_ns()}"

    async def main() -> None:
        async with lockkit.connect_async(redis_server.url) as locks:
            warm = locks.lock(f"{name}-warm", ttl=30)  # connected, scripts loaded: the cancel lands after a send
            await warm.acquire()
            await warm.release()
            window = stream_module.REPLY_WINDOW
            stream_module.REPLY_WINDOW = 10.0  # the turns are what is being cancelled: never cut short here
            try:
                handle = locks.lock(name, ttl=30)
                task = asyncio.create_task(handle.acquire())
                for _ in range(turn):
                    await asyncio.sleep(0)
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
                else:
                    # the reply came within the turns and the acquire finished before the cancel: only the
                    # first turn (the task's first suspension after its send) is sure to be cancelled
                    assert turn > 1
                    await handle.release()
            finally:
                stream_module.REPLY_WINDOW = window
            # the name is free again well within its 30 s ttl, and the connections carry the right replies
            other = locks.lock(name, ttl=30)
            lease = await other.acquire(timeout=5)
            assert lease.valid
            assert not await locks.lock(name, ttl=30).try_acquire()
            await other.release()
            assert await locks.lock(name, ttl=30).try_acquire()

    asyncio.run(main())
