"""zookeeper://: kazoo's connection thread waits through one ``poll`` call (lockkit/drivers/zookeeper/poll.py).

:func:`poll_select` must answer exactly as kazoo's ``selector_select`` does, since kazoo's connection loop reads
its answer to tell a reply, a request to send, a timeout and a dropped connection apart; each case is checked
against kazoo's own function on real sockets. Dropped and cut connections through the real server are
ZooKeeper's fault scenarios (tests/test_zookeeper_faults.py), which run on the same wait.
"""

from __future__ import annotations

import os
import resource
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kazoo.handlers.utils import selector_select

import lockkit
from backends.servers import ZooKeeperServer
from lockkit.drivers.zookeeper import ZooKeeperDriver
from lockkit.drivers.zookeeper.poll import poll_select

Select = Callable[..., tuple[list[Any], list[Any], list[Any]]]
BOTH: list[Select] = [selector_select, poll_select]


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def test_lockkits_kazoo_client_waits_through_poll(zookeeper_server: ZooKeeperServer) -> None:
    with lockkit.connect(f"{zookeeper_server.url}/zkp-{uuid.uuid4().hex[:8]}") as locks:
        driver = locks.backend_for("x").driver
        assert isinstance(driver, ZooKeeperDriver)
        kz = driver._session.client()
        assert kz.handler.select is poll_select
        calls = []
        kz.handler.select = lambda *args, **kwargs: calls.append(args) or poll_select(*args, **kwargs)
        with locks.lock("poll") as lease:  # the real traffic goes through it, and works
            assert lease.valid
        assert calls  # every wait of the connection thread: for work, for a writable socket, for a reply
        permits = driver.permits()  # semaphores and reader-writer locks: a session of their own, the same client
        try:
            assert permits._s.client().handler.select is poll_select
        finally:
            permits.close()


@pytest.mark.parametrize("select_", BOTH, ids=["kazoo", "lockkit"])
def test_readable_writable_and_timeout_as_kazoo_reports_them(
    select_: Select, pair: tuple[socket.socket, socket.socket]
) -> None:
    a, b = pair
    assert select_([a], [], [], 0.02) == ([], [], [])  # nothing to read: a timeout, after about the timeout
    started = time.monotonic()
    select_([a], [], [], 0.05)
    assert time.monotonic() - started >= 0.045
    assert select_([a], [], [], 0.0005) == ([], [], [])  # under a millisecond: still a wait, not an error
    assert select_([], [a], [], 1) == ([], [a], [])
    b.send(b"x")
    assert select_([a, b], [], [], 1) == ([a], [], [])
    assert select_([a], [a], [], 1) == ([a, a], [], [])  # ready both ways: listed as readable, twice
    assert select_([b, a], [], [], None) == ([a], [], [])  # no timeout: wait for as long as it takes


@pytest.mark.parametrize("select_", BOTH, ids=["kazoo", "lockkit"])
def test_a_hung_up_peer_is_readable_so_the_next_recv_sees_it(
    select_: Select, pair: tuple[socket.socket, socket.socket]
) -> None:
    a, b = pair
    b.close()
    assert select_([a], [], [], 1) == ([a], [], [])
    assert a.recv(1) == b""  # what kazoo's _read turns into ConnectionDropped


@pytest.mark.parametrize("select_", BOTH, ids=["kazoo", "lockkit"])
def test_bad_arguments_raise_as_kazoos_do(select_: Select, pair: tuple[socket.socket, socket.socket]) -> None:
    a, _b = pair
    with pytest.raises(ValueError):
        select_([a], [], [], -1)
    with pytest.raises(TypeError):
        select_([a], [], [], "1")
    closed = socket.socket()
    closed.close()
    with pytest.raises(TypeError):  # kazoo's fileobj_to_fd: "Invalid file descriptor: -1"
        select_([closed], [], [], 0)


def test_no_descriptor_ceiling(pair: tuple[socket.socket, socket.socket]) -> None:
    """kazoo left ``select.select`` for its 1024-descriptor limit; a busy process's socket may lie above it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if max(soft, hard) < 2100:
        pytest.skip("this process may not open a descriptor above 2048")
    if soft < 2100:
        resource.setrlimit(resource.RLIMIT_NOFILE, (2100, hard))
    a, b = pair
    high = os.dup2(a.fileno(), 2050)
    try:
        far = socket.socket(fileno=high)
        try:
            b.send(b"x")
            assert poll_select([far], [], [], 1) == ([far], [], [])
        finally:
            far.close()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
