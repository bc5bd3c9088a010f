"""The lean connection pool of the Redis drivers, against a real server."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import pytest
import redis
from redis.exceptions import ConnectionError as RedisConnectionError

from backends.servers import RedisServer
from lockkit.drivers._redis_pool import ConnectionPool


@pytest.fixture
def pool_for(redis_server: RedisServer) -> Iterator[tuple[ConnectionPool, redis.Redis]]:
    def make() -> redis.Connection:
        return redis.Connection(host=redis_server.host, port=redis_server.port, socket_timeout=2)

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
