"""The Redis drivers' own transport against a real server: the lean pools, the connections, the reply reader."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import struct
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.exceptions import AuthenticationError, NoPermissionError, NoScriptError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

import lockkit
from backends.pytest_fixtures import RedisFactory
from backends.servers import RedisServer
from lockkit.drivers.redis._async.connection import AsyncConnection
from lockkit.drivers.redis._async.primitives import AsyncConnectionPool
from lockkit.drivers.redis._sync.connection import Connection
from lockkit.drivers.redis.calls import pack
from lockkit.drivers.redis.config import NodeSpec, redis_nodes
from lockkit.drivers.redis.pool import ConnectionPool
from lockkit.drivers.redis.resp import NOT_YET, Replies, error_reply
from lockkit.urls import parse_url


def spec_for(url: str) -> NodeSpec:
    spec, _ = redis_nodes(parse_url(url))
    return spec


@pytest.fixture
def pool_for(redis_server: RedisServer) -> Iterator[tuple[ConnectionPool, redis.Redis]]:
    spec = spec_for(redis_server.url + "?timeout=2")
    pool = ConnectionPool(lambda: Connection(spec), size=1, wait=0.2)
    admin = redis.Redis(host=redis_server.host, port=redis_server.port)
    yield pool, admin
    pool.disconnect()
    admin.close()


def call(conn: Connection, *command: Any) -> Any:
    conn.send(pack([command]))
    return conn.read(1, time.monotonic() + 2)[0]


def test_exhausted_pool_waits_then_names_the_option(pool_for: tuple[ConnectionPool, redis.Redis]) -> None:
    pool, _ = pool_for
    first = pool.get()
    with pytest.raises(RedisConnectionError, match="pool_size"):
        pool.get()
    got: list[object] = []
    waiter = threading.Thread(target=lambda: got.append(pool.get()))
    waiter.start()
    pool.release(first)  # hands the one connection to the waiting thread
    waiter.join(2)
    assert got == [first]


def test_connection_killed_while_idle_is_replaced_before_use(pool_for: tuple[ConnectionPool, redis.Redis]) -> None:
    pool, admin = pool_for
    conn = pool.get()
    assert call(conn, "PING") == b"PONG"
    conn_id = call(conn, "CLIENT", "ID")
    pool.release(conn)
    assert admin.client_kill_filter(_id=conn_id) == 1
    again = pool.get()  # the select() probe sees EOF and reconnects before anything is sent
    assert again is conn and call(again, "PING") == b"PONG" and call(again, "CLIENT", "ID") != conn_id
    pool.release(again)


def test_forked_child_never_uses_the_parents_socket(pool_for: tuple[ConnectionPool, redis.Redis]) -> None:
    pool, _ = pool_for
    conn = pool.get()
    parent_id = call(conn, "CLIENT", "ID")
    pool.release(conn)
    pid = os.fork()
    if pid == 0:  # the child: a fresh connection of its own, and the parent's is not shut down
        try:
            mine = pool.get()
            code = 0 if mine is not conn and call(mine, "CLIENT", "ID") != parent_id else 1
        except BaseException:
            code = 2
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    again = pool.get()
    assert again is conn and call(again, "CLIENT", "ID") == parent_id  # still the same connection in the parent
    pool.release(again)


def test_a_forked_child_of_an_asyncio_locker_never_uses_the_parents_socket(redis_server: RedisServer) -> None:
    """docs/backends/redis.md: a forked child never uses its parent's connections, on both faces. The asyncio
    pool had no fork hook: a child forked from a process whose asyncio locker had made calls (a worker that runs
    its own ``asyncio.run``) took the parent's connection, whose transport belongs to the parent's event loop,
    and its acquire failed (exit code 2 here before the fix)."""
    name = f"fork-{uuid.uuid4().hex[:8]}"

    async def parent() -> None:
        async with lockkit.connect_async(redis_server.url + "?timeout=1") as locks:
            lock = locks.lock(name + "-parent", ttl=5)
            await lock.acquire(timeout=2)  # the pool holds a connection now
            await lock.release()
            pid = os.fork()
            if pid == 0:
                os._exit(_in_the_child(locks))
            _, status = await asyncio.get_running_loop().run_in_executor(None, os.waitpid, pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0
            again = locks.lock(name + "-parent", ttl=5)  # the parent's connection is still its own, and clean
            await again.acquire(timeout=2)
            await again.release()

    def _in_the_child(locks: lockkit.AsyncLocker) -> int:
        outcome: list[int] = []

        async def child() -> None:
            lock = locks.lock(name + "-child", ttl=5)
            await lock.acquire(timeout=2)
            await lock.release()

        def run() -> None:  # a loop of the child's own (this thread's loop is the parent's, running)
            try:
                asyncio.run(child())
                outcome.append(0)
            except lockkit.BackendUnavailable:
                outcome.append(1)
            except BaseException:
                outcome.append(2)

        signal.signal(signal.SIGALRM, lambda *_: os._exit(3))
        signal.alarm(10)
        thread = threading.Thread(target=run)
        thread.start()
        thread.join()
        return outcome[0] if outcome else 4

    asyncio.run(parent())


def test_an_idle_connection_is_pinged_before_use(redis_server: RedisServer) -> None:
    conn = Connection(spec_for(redis_server.url + "?health_check_interval=0.1"))
    try:
        conn.ready()  # connects
        before = call(conn, "INFO", "commandstats")
        time.sleep(0.15)
        conn.ready()  # idle for longer than health_check_interval: one PING
        conn.ready()  # just used: none
        after = call(conn, "INFO", "commandstats")
    finally:
        conn.close()

    def pings(info: bytes) -> int:
        line = next((x for x in info.split(b"\r\n") if x.startswith(b"cmdstat_ping:")), b"calls=0,")
        return int(line.split(b"calls=")[1].split(b",")[0])

    assert pings(after) - pings(before) == 1


# -- the reply reader (lockkit/drivers/redis/resp.py) through a connection -----------------------------------------


def test_reader_reads_every_reply_type_in_step(pool_for: tuple[ConnectionPool, redis.Redis]) -> None:
    pool, admin = pool_for
    big = os.urandom(300_000)  # several socket reads
    admin.set("resp:big", big)
    admin.set("resp:text", "x")
    script = "return {1, {2, false, 'x'}, 'y', redis.status_reply('OK')}"
    conn = pool.get()
    try:
        conn.send(
            pack(
                [
                    ("GET", "resp:big"),
                    ("INCR", "resp:text"),  # an error reply between others: the stream stays in step
                    ("EVAL", script, 0),
                    ("GET", "resp:missing"),
                    ("EVALSHA", "0" * 40, 0),
                    ("PING",),
                ]
            )
        )
        big_reply, error, nested, missing, noscript, pong = conn.read(6, time.monotonic() + 2)
    finally:
        pool.release(conn)
    assert big_reply == big
    assert isinstance(error, ResponseError) and "not an integer" in str(error)
    assert nested == [1, [2, None, b"x"], b"y", b"OK"]
    assert missing is None
    assert isinstance(noscript, NoScriptError)
    assert pong == b"PONG"


def test_reader_parses_replies_cut_anywhere() -> None:
    wire = b":-12\r\n$5\r\nab\r\nc\r\n*3\r\n+OK\r\n$-1\r\n*1\r\n:7\r\n-NOSCRIPT No matching script\r\n*-1\r\n"
    for cut in range(1, len(wire)):
        replies = Replies()
        replies.feed(wire[:cut])
        got: list[Any] = []
        while (reply := replies.next()) is not NOT_YET:
            got.append(reply)
        replies.feed(wire[cut:])
        while (reply := replies.next()) is not NOT_YET:
            got.append(reply)
        assert got[:3] == [-12, b"ab\r\nc", [b"OK", None, [7]]] and got[4] is None, cut
        assert isinstance(got[3], NoScriptError) and str(got[3]) == "No matching script"
        assert not replies.pending()


def test_error_replies_map_to_redis_py_exception_classes() -> None:
    assert isinstance(error_reply("NOPERM User x has no permissions"), NoPermissionError)
    assert isinstance(error_reply("WRONGPASS invalid username-password pair"), AuthenticationError)
    assert isinstance(error_reply("NOAUTH Authentication required."), AuthenticationError)
    assert isinstance(error_reply("ERR max number of clients reached"), RedisConnectionError)
    plain = error_reply("ERR value is not an integer or out of range")
    assert type(plain) is ResponseError and str(plain) == "value is not an integer or out of range"
    assert type(error_reply("WRONGTYPE Operation against a key")) is ResponseError


def test_reader_times_out_at_the_callers_deadline(redis_server: RedisServer) -> None:
    conn = Connection(spec_for(redis_server.url + "?timeout=0.6"))
    try:
        conn.ready()
        conn.send(pack([("BLPOP", "resp:never", 5)]))
        started = time.monotonic()
        with pytest.raises(RedisTimeoutError):
            conn.read(1, started + 0.2)
        early = time.monotonic() - started
        started = time.monotonic()
        with pytest.raises(RedisTimeoutError):
            conn.next_reply(None)  # the connection's own timeout is back
        own = time.monotonic() - started
    finally:
        conn.close()
    assert 0.15 <= early < 0.5 and 0.5 <= own < 1.2, (early, own)


def test_reader_reports_a_connection_closed_by_the_server(pool_for: tuple[ConnectionPool, redis.Redis]) -> None:
    pool, admin = pool_for
    conn = pool.get()
    try:
        client_id = call(conn, "CLIENT", "ID")
        admin.client_kill_filter(_id=client_id)
        conn.send(pack([("PING",)]))
        with pytest.raises(RedisConnectionError):
            conn.read(1, time.monotonic() + 2)
    finally:
        conn.drop()
        pool.release(conn)


@pytest.mark.parametrize("health_check_interval", [0, 30])
def test_a_refused_login_is_a_clear_config_error(fresh_redis: RedisFactory, health_check_interval: int) -> None:
    server = fresh_redis(password="pw-XYZ-right")
    wrong = f"redis://:pw-XYZ-wrong@{server.host}:{server.port}/0?health_check_interval={health_check_interval}"
    without = f"redis://{server.host}:{server.port}/0?health_check_interval={health_check_interval}"
    for url in (wrong, without):
        with lockkit.connect(url) as locks, pytest.raises(lockkit.ConfigError) as info:
            locks.lock("refused", ttl=2).acquire(timeout=1)
        message = str(info.value)
        assert "refused the login of user 'default'" in message and "URL" in message, message
        assert "pw-XYZ" not in message


async def test_a_refused_login_is_a_clear_config_error_async(fresh_redis: RedisFactory) -> None:
    server = fresh_redis(password="pw-XYZ-right")
    async with lockkit.connect_async(f"redis://:pw-XYZ-wrong@{server.host}:{server.port}/0") as locks:
        with pytest.raises(lockkit.ConfigError) as info:
            await locks.lock("refused", ttl=2).acquire(timeout=1)
    message = str(info.value)
    assert "refused the login of user 'default'" in message and "pw-XYZ" not in message, message


def test_an_unknown_database_is_a_clear_backend_error(redis_server: RedisServer) -> None:
    url = f"redis://{redis_server.host}:{redis_server.port}/999"
    with lockkit.connect(url) as locks, pytest.raises(lockkit.BackendUnavailable, match="SELECT 999"):
        locks.lock("nodb", ttl=2).acquire(timeout=1)


# -- the asyncio twins ---------------------------------------------------------------------------------------------


async def test_async_pool_waits_hands_over_and_survives_a_cancelled_waiter(redis_server: RedisServer) -> None:
    spec = spec_for(redis_server.url)
    pool = AsyncConnectionPool(lambda: AsyncConnection(spec), size=1, wait=0.2)
    try:
        first = await pool.get()
        with pytest.raises(RedisConnectionError, match="pool_size"):
            await pool.get()
        gave_up = asyncio.ensure_future(pool.get())
        await asyncio.sleep(0.01)
        gave_up.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gave_up
        waiting = asyncio.ensure_future(pool.get())
        await asyncio.sleep(0.01)
        pool.release(first)  # to the live waiter, not the cancelled one
        assert await asyncio.wait_for(waiting, 2) is first
        await first.send(pack([("PING",)]))
        assert await first.read(1, time.monotonic() + 2) == [b"PONG"]
    finally:
        await pool.disconnect()


async def test_async_connection_killed_while_idle_is_replaced_before_use(redis_server: RedisServer) -> None:
    admin = redis.Redis(host=redis_server.host, port=redis_server.port)
    conn = AsyncConnection(spec_for(redis_server.url))
    try:
        await conn.ready()
        await conn.send(pack([("CLIENT", "ID")]))
        (conn_id,) = await conn.read(1, time.monotonic() + 2)
        assert admin.client_kill_filter(_id=conn_id) == 1
        for _ in range(100):  # the loop hears of the close while the connection sits idle
            await asyncio.sleep(0.01)
        await conn.ready()
        await conn.send(pack([("CLIENT", "ID")]))
        assert (await conn.read(1, time.monotonic() + 2))[0] != conn_id
    finally:
        await conn.close()
        admin.close()


async def test_async_reader_times_out_at_each_reads_own_deadline(redis_server: RedisServer) -> None:
    """The asyncio reader's timer is armed once per connection and re-armed lazily (issue 17): a timer armed
    by an earlier read must neither let a later read with a nearer deadline wait too long nor cut one with a
    later deadline short."""
    conn = AsyncConnection(spec_for(redis_server.url + "?timeout=0.6"))
    try:
        await conn.ready()
        await conn.send(pack([("PING",)]))  # answered at once: its timer (0.6 s on) stays armed, unneeded
        assert await conn.read(1, time.monotonic() + 0.6) == [b"PONG"]
        await conn.send(pack([("BLPOP", "resp:never", 5)]))
        started = time.monotonic()
        with pytest.raises(RedisTimeoutError):
            await conn.read(1, started + 0.2)  # nearer than the armed timer
        early = time.monotonic() - started
        conn.drop()  # the BLPOP's reply is still due: a connection that timed out is never reused
        await conn.ready()
        await conn.send(pack([("PING",)]))  # its timer (0.15 s on) stays armed, unneeded
        assert await conn.read(1, time.monotonic() + 0.15) == [b"PONG"]
        await conn.send(pack([("BLPOP", "resp:never", 5)]))
        started = time.monotonic()
        with pytest.raises(RedisTimeoutError):
            await conn.next_reply(None)  # the connection's own 0.6 s, not what is left of the PING's
        own = time.monotonic() - started
    finally:
        await conn.close()
    assert 0.15 <= early < 0.5 and 0.5 <= own < 1.2, (early, own)


# -- unix:// --------------------------------------------------------------------------------------------------------


@pytest.fixture
def unix_redis(fresh_redis: RedisFactory, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = Path(tmp_path_factory.mktemp("sock")) / "redis.sock"
    fresh_redis(extra_args=["--unixsocket", str(path), "--unixsocketperm", "700"])
    yield path


def test_unix_socket_locks_wakes_waiters_and_selects_its_database(unix_redis: Path) -> None:
    name = f"unix-{uuid.uuid4().hex[:8]}"
    url = f"unix://{unix_redis}?db=3"
    with lockkit.connect(url) as a, lockkit.connect(url) as b:
        lock = a.lock(name, ttl=2)
        lease = lock.acquire(timeout=2)
        assert lease.fencing_token >= 1 and b.holder(name).held
        threading.Timer(0.2, lock.release).start()
        b.lock(name, ttl=2).acquire(timeout=3)  # woken through a pub/sub connection on the socket
        admin = redis.Redis(unix_socket_path=str(unix_redis), db=3)
        assert admin.exists(f"lockkit:{{{name}}}") == 1
        admin.close()


async def test_unix_socket_async(unix_redis: Path) -> None:
    name = f"unix-{uuid.uuid4().hex[:8]}"
    async with lockkit.connect_async(f"unix://{unix_redis}") as locks:
        lock = locks.lock(name, ttl=2)
        await lock.acquire(timeout=2)
        waiter = asyncio.ensure_future(locks.lock(name, ttl=2).acquire(timeout=3))
        await asyncio.sleep(0.2)
        await lock.release()
        assert (await waiter).fencing_token >= 2


# -- the blocking transport's system calls and limits (issue 17) ----------------------------------------------------


def _held_in_another_thread(lock: Any) -> tuple[threading.Event, threading.Event, threading.Thread]:
    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            held.set()
            done.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    assert held.wait(5)
    return held, done, thread


def test_a_forked_child_gets_a_connection_though_another_parent_thread_held_the_pool(
    pool_for: tuple[ConnectionPool, redis.Redis],
) -> None:
    """A pool's mutex held by another of the parent's threads at the fork stays held in the child for ever
    (that thread does not exist there): the child must not wait for it, and still never reuse the parent's
    socket."""
    pool, _ = pool_for
    conn = pool.get()
    parent_id = call(conn, "CLIENT", "ID")
    pool.release(conn)
    _, done, thread = _held_in_another_thread(pool._mutex)
    try:
        pid = os.fork()
        if pid == 0:  # the child: a pool.get that hangs is cut by the alarm (exit code 3)
            code = 3
            try:
                signal.signal(signal.SIGALRM, lambda *_: os._exit(3))
                signal.alarm(5)
                mine = pool.get()
                code = 0 if mine is not conn and call(mine, "CLIENT", "ID") != parent_id else 1
            except BaseException:
                code = 2
            os._exit(code)
    finally:
        done.set()
        thread.join(5)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    again = pool.get()
    assert again is conn and call(again, "CLIENT", "ID") == parent_id
    pool.release(again)


def test_a_connection_on_a_descriptor_above_1023_is_checked_and_used(
    pool_for: tuple[ConnectionPool, redis.Redis],
) -> None:
    """C-12's staleness check must work in a process with many files open: ``select`` refuses a descriptor
    above 1023 (ValueError), ``poll`` does not."""
    pool, admin = pool_for
    spare = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        conn = pool.get()  # made now: its socket gets a descriptor above the spare ones
        try:
            assert conn._stream is not None and conn._stream._sock.fileno() > 1023
            conn_id = call(conn, "CLIENT", "ID")
        finally:
            pool.release(conn)
        again = pool.get()  # checked for staleness (healthy)
        assert again is conn and call(again, "CLIENT", "ID") == conn_id
        pool.release(again)
        assert admin.client_kill_filter(_id=conn_id) == 1
        time.sleep(0.05)
        again = pool.get()  # checked again: the server closed it, so it is replaced before use
        assert call(again, "CLIENT", "ID") != conn_id
        pool.release(again)
    finally:
        for fd in spare:
            os.close(fd)
        pool.disconnect()


def test_a_tcp_connection_lets_the_kernel_time_its_reads_and_writes(redis_server: RedisServer) -> None:
    """On Linux a plain socket is blocking with SO_RCVTIMEO/SO_SNDTIMEO, so that CPython polls before no
    send or recv (2 system calls per master per command of a Redlock fan-out); its timeouts still hold (see
    test_reader_times_out_at_the_callers_deadline and the write test below)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("kernel socket timeouts are used on Linux only")
    conn = Connection(spec_for(redis_server.url + "?timeout=0.6"))
    try:
        conn.ready()
        assert conn._stream is not None
        sock = conn._stream._sock
        assert sock.gettimeout() is None  # blocking: CPython calls recv/send directly
        for option in (socket.SO_RCVTIMEO, socket.SO_SNDTIMEO):
            seconds, micros = struct.unpack("@ll", sock.getsockopt(socket.SOL_SOCKET, option, 16))
            assert 0.59 <= seconds + micros / 1e6 <= 0.65
        assert call(conn, "PING") == b"PONG"
    finally:
        conn.close()


def test_c10_a_write_to_a_paused_server_times_out(fresh_redis: RedisFactory) -> None:
    """C-10: a server that stops reading fills the socket buffers; the write fails with a timeout after about
    the connection's own timeout, as before the kernel kept the timeouts."""
    server = fresh_redis()
    conn = Connection(spec_for(server.url + "?timeout=0.5"))
    try:
        conn.ready()
        server.pause()
        try:
            started = time.monotonic()
            with pytest.raises(RedisTimeoutError, match="writing"):
                conn.send(pack([("SET", "big", b"x" * (64 << 20))]))
            took = time.monotonic() - started
        finally:
            server.resume()
    finally:
        conn.drop()
    assert 0.4 <= took < 5, took
