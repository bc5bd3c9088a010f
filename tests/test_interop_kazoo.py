"""lockkit and kazoo's own ``Lock`` recipe share one lock (docs/interop.md, issue 16).

Both directions, one FIFO queue of mixed waiters, fencing by ``czxid`` across both, the documented rule "a new
kazoo ``Lock`` per acquisition" (a reused one fails once lockkit's container parent was reaped), and
``lockkit status`` hashing a kazoo holder's identifier.
"""

from __future__ import annotations

import hashlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import LockTimeout as KazooLockTimeout
from kazoo.exceptions import NoNodeError
from kazoo.recipe.lock import Lock

import lockkit
from backends.servers import ZooKeeperServer
from lockkit import LockTimeout
from lockkit.drivers.zookeeper import nodes
from lockkit.names import encode_name

QUIET = 1.0


@pytest.fixture
def name() -> str:
    return f"interop v1.2/é-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def path(name: str) -> str:
    return "/lockkit/" + encode_name(name)


@pytest.fixture
def locks(zookeeper_server: ZooKeeperServer) -> Iterator[lockkit.Locker]:
    with lockkit.connect(zookeeper_server.url) as locker:
        yield locker


def czxid(zk: KazooClient, lock: Lock) -> int:
    return int(zk.exists(f"{lock.path}/{lock.node}").czxid)


def wait_children(zk: KazooClient, path: str, n: int) -> None:
    end = time.monotonic() + 10
    while len(zk.get_children(path)) != n:
        assert time.monotonic() < end, f"expected {n} contenders under {path}"
        time.sleep(0.02)


def test_kazoo_holder_blocks_lockkit(locks: lockkit.Locker, zk_raw: KazooClient, name: str, path: str) -> None:
    kz = Lock(zk_raw, path)
    assert kz.acquire(timeout=5)
    lock = locks.lock(name, ttl=5)
    assert lock.try_acquire() is None
    with pytest.raises(LockTimeout):
        lock.acquire(timeout=QUIET)
    info = locks.holder(name)
    assert info.held and info.fencing_token == czxid(zk_raw, kz)
    token = czxid(zk_raw, kz)
    kz.release()
    lease = lock.acquire(timeout=10)
    assert lease.fencing_token > token
    lock.release()


def test_lockkit_holder_blocks_kazoo(locks: lockkit.Locker, zk_raw: KazooClient, name: str, path: str) -> None:
    lock = locks.lock(name, ttl=5)
    lease = lock.acquire(timeout=5)
    kz = Lock(zk_raw, path)
    with pytest.raises(KazooLockTimeout):
        kz.acquire(timeout=QUIET)
    got = threading.Event()
    thread = threading.Thread(target=lambda: kz.acquire(timeout=10) and got.set())
    thread.start()
    try:
        wait_children(zk_raw, path, 2)
        assert not got.wait(0.3)
        lock.release()
        assert got.wait(10), "kazoo was not woken by lockkit's release"
        assert czxid(zk_raw, kz) > lease.fencing_token
    finally:
        thread.join(15)
        kz.release()


def test_mixed_queue_is_fifo(zookeeper_server: ZooKeeperServer, zk_raw: KazooClient, name: str, path: str) -> None:
    """lockkit holder, then waiters kazoo, lockkit, kazoo, lockkit: served in exactly that order."""
    order: list[tuple[str, int]] = []
    go_on = {label: threading.Event() for label in ("K1", "L1", "K2", "L2")}
    threads: list[threading.Thread] = []

    def kazoo_waiter(label: str) -> None:
        kz = Lock(zk_raw, path)
        assert kz.acquire(timeout=30)
        order.append((label, czxid(zk_raw, kz)))
        go_on[label].wait(30)
        kz.release()

    def lockkit_waiter(locker: lockkit.Locker, label: str) -> None:
        lock = locker.lock(name, ttl=5)
        lease = lock.acquire(timeout=30)
        order.append((label, lease.fencing_token))
        go_on[label].wait(30)
        lock.release()

    with lockkit.connect(zookeeper_server.url) as a, lockkit.connect(zookeeper_server.url) as b, \
            lockkit.connect(zookeeper_server.url) as c:
        head = a.lock(name, ttl=5)
        first = head.acquire(timeout=5)
        waiters: list[tuple[str, Callable[..., None], tuple[Any, ...]]] = [
            ("K1", kazoo_waiter, ("K1",)), ("L1", lockkit_waiter, (b, "L1")),
            ("K2", kazoo_waiter, ("K2",)), ("L2", lockkit_waiter, (c, "L2")),
        ]
        try:
            for i, (_, target, args) in enumerate(waiters):
                threads.append(threading.Thread(target=target, args=args))
                threads[-1].start()
                wait_children(zk_raw, path, i + 2)  # queued before the next one arrives
            head.release()
            for i, (label, _, _) in enumerate(waiters):
                end = time.monotonic() + 10
                while len(order) < i + 1:
                    assert time.monotonic() < end, f"{label} was not served; served: {order}"
                    time.sleep(0.01)
                time.sleep(0.2)  # nobody else gets in while it holds
                assert [who for who, _ in order] == [who for who, _, _ in waiters[: i + 1]]
                go_on[label].set()
            tokens = [first.fencing_token, *(token for _, token in order)]
            assert tokens == sorted(tokens) and len(set(tokens)) == 5, tokens
        finally:
            for event in go_on.values():
                event.set()
            for thread in threads:
                thread.join(30)


def test_a_reused_kazoo_lock_fails_after_the_parent_is_reaped(fresh_zookeeper: Callable[..., ZooKeeperServer],
                                                             name: str, path: str) -> None:
    """docs/interop.md: "a new kazoo Lock object per acquisition". lockkit's parents are container nodes, which
    the server reaps once empty; a kazoo Lock creates its parent only on its first acquire."""
    server = fresh_zookeeper(extra_args=["-Dznode.container.checkIntervalMs=200"])
    zk = KazooClient(hosts=server.hosts)
    zk.start(timeout=10)
    try:
        with lockkit.connect(server.url) as locks:
            lock = locks.lock(name, ttl=5)
            lock.acquire(timeout=5)  # lockkit makes the parent: a container
            reused = Lock(zk, path)
            with pytest.raises(KazooLockTimeout):
                reused.acquire(timeout=0.2)  # its one parent check happens now
            lock.release()
            end = time.monotonic() + 15
            while zk.exists(path) is not None:  # reaped by the server's container manager
                assert time.monotonic() < end, "the container parent was not reaped"
                time.sleep(0.1)
            with pytest.raises(NoNodeError):
                reused.acquire(timeout=1)
            fresh = Lock(zk, path)  # the documented rule: a new Lock for every acquisition
            assert fresh.acquire(timeout=5)
            assert lock.try_acquire() is None
            fresh.release()
            assert lock.try_acquire() is not None
            lock.release()
    finally:
        zk.stop()
        zk.close()


def test_status_hashes_a_kazoo_holders_identifier(locks: lockkit.Locker, zk_raw: KazooClient, name: str,
                                                 path: str) -> None:
    kz = Lock(zk_raw, path, identifier="db-password=hunter2")
    assert kz.acquire(timeout=5)
    try:
        info = locks.holder(name)
        assert info.held and info.token_hint == hashlib.sha256(b"db-password=hunter2").hexdigest()[:8]
    finally:
        kz.release()
    bare = Lock(zk_raw, path)  # kazoo's default identifier: empty data
    assert bare.acquire(timeout=5)
    try:
        assert locks.holder(name).token_hint is None
    finally:
        bare.release()
    lock = locks.lock(name, ttl=5)
    lock.acquire(timeout=5)
    try:  # lockkit's own hint is shown as it is
        [child] = zk_raw.get_children(path)
        assert locks.holder(name).token_hint == zk_raw.get(f"{path}/{child}")[0].decode()
    finally:
        lock.release()


@pytest.mark.parametrize("child, seq", [
    ("0123abcd__lock__0000000007", 7),
    ("_c_6f1c2a51-9a4e-4f0e-8f3b-2d5b1f0f9c11-lock-0000000012", 12),
    ("lease_holder", None),
    ("x-72057594037927936-0000000003", None),  # ZooKeeper's WriteLock recipe: not a contender to either layout
])
def test_both_layouts_parse_both_node_names(child: str, seq: int | None) -> None:
    assert nodes.sequence(child) == seq
