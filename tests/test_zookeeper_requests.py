"""zookeeper://: the requests an uncontended acquire sends, and the safety of the fresh-name multi.

A name whose parent the session has not seen lately (a fresh name: a lock per order id) is acquired with one
``multi`` that makes the parent and our node together: one request and one round trip instead of three round
trips (create, createContainer, create again, each with a list). The multi fails as a whole, creating
nothing, whenever the parent exists; the acquire then queues under it as usual. Request counts are
deterministic, so they are asserted; times never are.
Parent nodes that disappear or already exist are Z-5's territory (tests/test_zookeeper.py).
"""

from __future__ import annotations

import collections
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kazoo.client import KazooClient

import lockkit
from backends.servers import ZooKeeperServer
from lockkit import LockTimeout
from lockkit.drivers.zookeeper import ZooKeeperDriver
from lockkit.names import encode_name


@pytest.fixture
def chroot() -> str:
    return f"/zkr-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def locks(zookeeper_server: ZooKeeperServer, chroot: str) -> Iterator[lockkit.Locker]:
    with lockkit.connect(f"{zookeeper_server.url}{chroot}") as locker:
        driver_of(locker).ping()  # session and base node exist: only lock traffic is counted below
        yield locker


def driver_of(locks: lockkit.Locker) -> ZooKeeperDriver:
    driver = locks.backend_for("x").driver
    assert isinstance(driver, ZooKeeperDriver)
    return driver


def parent_of(chroot: str, name: str) -> str:
    return f"{chroot}/lockkit/{encode_name(name)}"


def counting(locks: lockkit.Locker) -> tuple[collections.Counter[str], Callable[[], None]]:
    """Count the requests of the locker's kazoo client by type (every request goes through ``_call``)."""
    kazoo = driver_of(locks)._session.client()
    counted: collections.Counter[str] = collections.Counter()
    original = kazoo._call

    def call(request: Any, result: Any) -> Any:
        counted[type(request).__name__] += 1
        return original(request, result)

    kazoo._call = call

    def undo() -> None:
        kazoo._call = original

    return counted, undo


def test_fresh_name_acquire_is_one_pipelined_round_trip(
    locks: lockkit.Locker, chroot: str, zk_raw: KazooClient
) -> None:
    counted, undo = counting(locks)
    try:
        lock = locks.lock(f"order-{uuid.uuid4().hex}", ttl=5)
        lease = lock.acquire()
        acquired = dict(counted)
        node = zk_raw.get_children(parent_of(chroot, lock.name))
        lock.release()
    finally:
        undo()
    # parent and node in one multi: no create that fails first, no createContainer, no list
    assert acquired == {"Multi": 1}
    assert counted["Delete"] == 1 and sum(counted.values()) == 2
    # the fencing token is the node's czxid (the multi's zxid, which the parent shares); that the parent is a
    # container the server reaps is tests/test_zookeeper.py::test_parents_are_containers_that_do_not_leak
    [child] = node
    parent = parent_of(chroot, lock.name)
    assert lease.fencing_token == zk_raw.exists(parent).czxid
    assert zk_raw.get_children(parent) == []
    assert child.endswith("__lock__0000000000")


def test_fresh_name_token_is_the_created_nodes_czxid(locks: lockkit.Locker, chroot: str, zk_raw: KazooClient) -> None:
    with locks.lock(f"order-{uuid.uuid4().hex}", ttl=5) as lease:
        parent = parent_of(chroot, lease.name)
        [child] = zk_raw.get_children(parent)
        assert lease.fencing_token == zk_raw.exists(f"{parent}/{child}").czxid
    with locks.lock(lease.name, ttl=5) as again:  # the same name, parent now known: a plain create
        assert again.fencing_token > lease.fencing_token


def test_name_in_use_sends_no_multi(locks: lockkit.Locker) -> None:
    lock = locks.lock(f"hot-{uuid.uuid4().hex}", ttl=5)
    lock.acquire()
    lock.release()
    counted, undo = counting(locks)
    try:
        for _ in range(5):
            lock.acquire()
            lock.release()
    finally:
        undo()
    # (the parent is reaped only by a container check after 60 s idle: not in this test's time)
    assert counted == {"Create2": 5, "GetChildren": 5, "Delete": 5}


def test_multi_behind_a_create_that_found_the_parent_creates_nothing(
    zookeeper_server: ZooKeeperServer, chroot: str, zk_raw: KazooClient
) -> None:
    """A name another client holds is new to this session: the multi is sent, fails, and leaves no node;
    the acquire then queues under the existing parent (and times out here)."""
    name = f"held-{uuid.uuid4().hex}"
    parent = parent_of(chroot, name)
    url = f"{zookeeper_server.url}{chroot}"
    with lockkit.connect(url) as holder_side, lockkit.connect(url) as waiter_side:
        held = holder_side.lock(name, ttl=5)
        holder = held.acquire()
        counted, undo = counting(waiter_side)
        try:
            with pytest.raises(LockTimeout):
                waiter_side.lock(name, ttl=5).acquire(timeout=0.3)
        finally:
            undo()
        assert counted["Multi"] == 1 and counted["Create2"] == 1  # the multi failed; a plain create queued
        assert len(zk_raw.get_children(parent)) == 1  # the holder's node only: nothing queued or left behind
        assert holder.valid
        held.release()
        with waiter_side.lock(name, ttl=5) as lease:  # and the name works from that session
            assert lease.fencing_token > holder.fencing_token
            assert len(zk_raw.get_children(parent)) == 1


def test_waiter_queues_behind_a_holder_on_a_name_new_to_its_session(
    zookeeper_server: ZooKeeperServer, chroot: str, zk_raw: KazooClient
) -> None:
    name = f"queue-{uuid.uuid4().hex}"
    url = f"{zookeeper_server.url}{chroot}"
    with lockkit.connect(url) as holder_side, lockkit.connect(url) as waiter_side:
        held = holder_side.lock(name, ttl=5)
        holder = held.acquire()
        got: list[lockkit.Lease] = []
        queued = waiter_side.lock(name, ttl=5)
        waiter = threading.Thread(target=lambda: got.append(queued.acquire(timeout=10)))
        waiter.start()
        parent = parent_of(chroot, name)
        end = time.monotonic() + 5
        while len(zk_raw.get_children(parent)) < 2 and time.monotonic() < end:
            time.sleep(0.01)
        assert len(zk_raw.get_children(parent)) == 2  # holder and waiter, no third node from the multi
        assert not got
        held.release()
        waiter.join(10)
        assert got and got[0].valid and got[0].fencing_token > holder.fencing_token
        queued.release()


def test_parent_reaped_while_known_is_made_again_with_the_node(
    locks: lockkit.Locker, chroot: str, zk_raw: KazooClient
) -> None:
    """Z-5: the session saw the parent, then it was deleted (as the server reaps an empty container)."""
    lock = locks.lock(f"reaped-{uuid.uuid4().hex}", ttl=5)
    first = lock.acquire()
    lock.release()
    zk_raw.delete(parent_of(chroot, lock.name))
    counted, undo = counting(locks)
    try:
        lease = lock.acquire()
    finally:
        undo()
    assert counted == {"Create2": 1, "GetChildren": 1, "Multi": 1}  # the create fails, then the multi
    assert lease.fencing_token > first.fencing_token
    assert lease.valid
    lock.release()


def test_try_acquire_on_a_fresh_name_is_one_round_trip(locks: lockkit.Locker, chroot: str, zk_raw: KazooClient) -> None:
    counted, undo = counting(locks)
    lock = locks.lock(f"job-{uuid.uuid4().hex}", ttl=5)
    try:
        lease = lock.try_acquire()
    finally:
        undo()
    assert lease is not None and lease.valid
    assert counted == {"GetChildren": 1, "Multi": 1}  # the look and the multi, pipelined; no create, no 2nd list
    parent = parent_of(chroot, lock.name)
    [child] = zk_raw.get_children(parent)
    assert lease.fencing_token == zk_raw.exists(f"{parent}/{child}").czxid
    assert locks.holder(lock.name).held
    lock.release()
    assert zk_raw.get_children(parent) == []


def test_try_acquire_of_a_name_held_elsewhere_queues_nothing(
    zookeeper_server: ZooKeeperServer, chroot: str, zk_raw: KazooClient
) -> None:
    name = f"job-{uuid.uuid4().hex}"
    url = f"{zookeeper_server.url}{chroot}"
    with lockkit.connect(url) as holder_side, lockkit.connect(url) as other:
        held = holder_side.lock(name, ttl=5)
        held.acquire()
        driver_of(other).ping()
        counted, undo = counting(other)
        try:
            assert other.lock(name, ttl=5).try_acquire() is None
        finally:
            undo()
        assert counted == {"GetChildren": 1, "Multi": 1}  # the multi failed (the parent exists): nothing made
        assert len(zk_raw.get_children(parent_of(chroot, name))) == 1
        held.release()
        lease = other.lock(name, ttl=5).try_acquire()  # free now, parent known: list, then create + list
        assert lease is not None and lease.fencing_token > 0


def test_a_release_sends_the_next_waiters_list_from_the_watch(zookeeper_server: ZooKeeperServer, chroot: str) -> None:
    """Z-4: the woken waiter's one list is sent by its predecessor watch, on kazoo's callback thread, not
    after the acquiring thread is scheduled: that wake-up is off the hand-off's critical path."""
    name = f"handoff-{uuid.uuid4().hex}"
    url = f"{zookeeper_server.url}{chroot}"
    with lockkit.connect(url) as holder_side, lockkit.connect(url) as waiter_side:
        held = holder_side.lock(name, ttl=5)
        holder = held.acquire()
        kazoo = driver_of(waiter_side)._session.client()
        driver_of(waiter_side).ping()
        lists: list[str] = []
        original = kazoo._call

        def call(request: Any, result: Any) -> Any:
            if type(request).__name__ == "GetChildren":
                lists.append(threading.current_thread().name)
            return original(request, result)

        kazoo._call = call
        queued = waiter_side.lock(name, ttl=5)
        got: list[lockkit.Lease] = []
        waiter = threading.Thread(target=lambda: got.append(queued.acquire(timeout=10)), name="the-acquirer")
        try:
            waiter.start()
            end = time.monotonic() + 5
            while len(lists) < 1 and time.monotonic() < end:  # queued: create + list, then the watch
                time.sleep(0.01)
            time.sleep(0.2)
            assert lists == ["the-acquirer"]
            held.release()
            waiter.join(10)
        finally:
            kazoo._call = original
        assert got and got[0].valid and got[0].fencing_token > holder.fencing_token
        assert len(lists) == 2 and lists[1] != "the-acquirer", lists  # one list per wake-up, sent by the watch
        queued.release()


def _queue_behind(holder_side: lockkit.Locker, waiter_side: lockkit.Locker, name: str) -> tuple[Any, Any, Any]:
    """The waiter's lock queued behind the holder's (its exists-watch on the holder's node answered)."""
    held = holder_side.lock(name, ttl=5)
    waiting = waiter_side.lock(name, ttl=5)
    with waiting:  # the waiter's session has seen the parent: a plain create, no multi
        pass
    holder = held.acquire()
    got: list[Any] = []
    thread = threading.Thread(target=lambda: got.append(waiting.acquire(timeout=10)))
    return held, holder, (waiting, thread, got)


def test_a_woken_waiters_list_is_sent_on_kazoos_connection_thread(
    zookeeper_server: ZooKeeperServer, chroot: str
) -> None:
    """The predecessor's deletion is handled as the connection thread reads it: the list is queued there, ahead
    of kazoo's hand-off of the event to its callback thread (lockkit/drivers/zookeeper/client.py,
    ``_tell_deletions``), and the hand-off still costs the same five requests per acquire + release."""
    url = f"{zookeeper_server.url}{chroot}"
    name = f"wake-{uuid.uuid4().hex}"
    with lockkit.connect(url) as holder_side, lockkit.connect(url) as waiter_side:
        held, holder, (waiting, thread, got) = _queue_behind(holder_side, waiter_side, name)
        kazoo = driver_of(waiter_side)._session.client()
        sent: list[tuple[str, int]] = []
        original = kazoo._call

        def call(request: Any, result: Any) -> Any:
            sent.append((type(request).__name__, threading.get_ident()))
            return original(request, result)

        kazoo._call = call
        connection_thread = kazoo._connection._connection_routine  # (None once the client stops)
        try:
            thread.start()
            deadline = time.monotonic() + 10
            while not any(kind == "Exists" for kind, _ in sent) and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.2)  # the exists-watch's reply: the waiter now waits for the deletion
            held.release()
            thread.join(10)
            assert got and got[0].valid and got[0].fencing_token > holder.fencing_token
            waiting.release()
        finally:
            kazoo._call = original
    assert [kind for kind, _ in sent] == ["Create2", "GetChildren", "Exists", "GetChildren", "Delete"]
    assert sent[3][1] == connection_thread.ident, "the list after the deletion was not sent by the connection thread"


def test_a_deletion_hook_that_fails_leaves_the_watch_to_send_the_list(
    zookeeper_server: ZooKeeperServer, chroot: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hook runs on the thread that keeps the session alive: what it raises is dropped there, the
    connection stays up, and the predecessor's watch callback sends the list instead."""

    def broken(self: ZooKeeperDriver, c: Any, sid: int) -> Callable[[], None]:
        def fail() -> None:
            raise RuntimeError("a hook that fails")

        return fail

    monkeypatch.setattr(ZooKeeperDriver, "_relist", broken)
    url = f"{zookeeper_server.url}{chroot}"
    name = f"wake-{uuid.uuid4().hex}"
    with lockkit.connect(url) as holder_side, lockkit.connect(url) as waiter_side:
        held, holder, (waiting, thread, got) = _queue_behind(holder_side, waiter_side, name)
        thread.start()
        time.sleep(0.3)
        held.release()
        thread.join(10)
        assert got and got[0].valid and got[0].fencing_token > holder.fencing_token
        waiting.release()
        with waiter_side.lock(name, ttl=5) as again:  # the session survived the hook's failure
            assert again.valid
