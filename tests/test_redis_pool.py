"""The lean connection pool of the Redis drivers, against a real server."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator

import pytest
import redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from backends.pytest_fixtures import RedisFactory
from backends.servers import RedisServer
from lockkit.drivers.redis.pool import ConnectionPool
from lockkit.drivers.redis.resp import read_replies


@pytest.fixture
def pool_for(redis_server: RedisServer) -> Iterator[tuple[ConnectionPool, redis.Redis]]:
    def make() -> redis.Connection:
        return redis.Connection(host=redis_server.host, port=redis_server.port, socket_timeout=2, protocol=2)

    pool = ConnectionPool(make, size=1, wait=0.2)
    admin = redis.Redis(host=redis_server.host, port=redis_server.port)
    yield pool, admin
    pool.disconnect()
    admin.close()


def ping(conn: redis.Connection) -> object:
    conn.send_command("PING")
    return conn.read_response()


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
    assert ping(conn) in (b"PONG", "PONG")
    conn.send_command("CLIENT", "ID")
    conn_id = conn.read_response()
    pool.release(conn)
    assert admin.client_kill_filter(_id=conn_id) == 1
    again = pool.get()  # the select() probe sees EOF and reconnects before anything is sent
    assert ping(again) in (b"PONG", "PONG")
    pool.release(again)


def test_forked_child_never_uses_the_parents_socket(pool_for: tuple[ConnectionPool, redis.Redis]) -> None:
    pool, _ = pool_for
    conn = pool.get()
    parent_sock = conn._sock
    pool.release(conn)
    pid = os.fork()
    if pid == 0:  # the child: a fresh connection of its own, and the parent's is not shut down
        try:
            mine = pool.get()
            code = 0 if mine is not conn and ping(mine) in (b"PONG", "PONG") else 1
        except BaseException:
            code = 2
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    again = pool.get()
    assert again is conn and again._sock is parent_sock  # still connected in the parent
    assert ping(again) in (b"PONG", "PONG")
    pool.release(again)


# -- lockkit's own reply reader (lockkit/drivers/redis/resp.py) ----------------------------------------------------


def test_reader_reads_every_reply_type_in_step(pool_for: tuple[ConnectionPool, redis.Redis]) -> None:
    pool, admin = pool_for
    big = os.urandom(300_000)  # several socket reads
    admin.set("resp:big", big)
    admin.set("resp:text", "x")
    script = "return {1, {2, false, 'x'}, 'y', redis.status_reply('OK')}"
    conn = pool.get()
    try:
        conn.send_packed_command(
            conn.pack_commands(
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
        big_reply, error, nested, missing, noscript, pong = read_replies(conn, 6, time.monotonic() + 2)
    finally:
        pool.release(conn)
    assert big_reply == big
    assert isinstance(error, ResponseError) and "not an integer" in str(error)
    assert nested == [1, [2, None, b"x"], b"y", b"OK"]
    assert missing is None
    assert isinstance(noscript, NoScriptError)
    assert pong == b"PONG"


def test_reader_times_out_at_the_callers_deadline(pool_for: tuple[ConnectionPool, redis.Redis]) -> None:
    pool, _ = pool_for
    conn = pool.get()
    try:
        conn.send_packed_command(conn.pack_command("BLPOP", "resp:never", 5))
        started = time.monotonic()
        with pytest.raises(RedisTimeoutError):
            read_replies(conn, 1, started + 0.2)
        waited = time.monotonic() - started
        assert conn._sock.gettimeout() == 2  # the connection's own timeout is back
    finally:
        conn.disconnect()
        pool.release(conn)
    assert 0.15 <= waited < 1.0


def test_reader_reports_a_connection_closed_by_the_server(pool_for: tuple[ConnectionPool, redis.Redis]) -> None:
    pool, admin = pool_for
    conn = pool.get()
    try:
        conn.send_packed_command(conn.pack_command("CLIENT", "ID"))
        (client_id,) = read_replies(conn, 1, time.monotonic() + 2)
        admin.client_kill_filter(_id=client_id)
        conn.send_packed_command(conn.pack_command("PING"))
        with pytest.raises(RedisConnectionError):
            read_replies(conn, 1, time.monotonic() + 2)
    finally:
        conn.disconnect()
        pool.release(conn)


@pytest.mark.parametrize("health_check_interval", [0, 30])  # 0: no redis-py PING reads the refusal first
def test_a_refused_login_is_a_clear_backend_error(fresh_redis: RedisFactory, health_check_interval: int) -> None:
    import lockkit

    server = fresh_redis(password="pw-XYZ-right")
    wrong = f"redis://:pw-XYZ-wrong@{server.host}:{server.port}/0?health_check_interval={health_check_interval}"
    without = f"redis://{server.host}:{server.port}/0?health_check_interval={health_check_interval}"
    for url in (wrong, without):
        with lockkit.connect(url) as locks, pytest.raises(lockkit.BackendUnavailable) as info:
            locks.lock("refused", ttl=2).acquire(timeout=1)
        message = str(info.value)
        assert "unreachable" in message and ("auth" in message.lower() or "pass" in message.lower()), message
        assert "pw-XYZ" not in message
