"""lockkit and the real ``etcdctl lock`` (Go's ``concurrency.Mutex``) share one lock (docs/interop.md, issue 16).

Both directions of exclusion, one FIFO queue of mixed waiters, and fencing: the ``create_revision`` of each
holder's key (lockkit's token, and what docs/interop.md tells a Go client to use) increases across both
clients, while the header revision a contended Go Mutex reports does not.
"""

from __future__ import annotations

import json
import queue
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import lockkit
from backends.servers import EtcdServer
from lockkit import LockTimeout
from lockkit.names import encode_name

QUIET = 1.0
"""How long a blocked contender must stay blocked to count as excluded (seconds)."""


class Etcdctl:
    """``etcdctl -w json lock KEY``: holds the lock from the line it prints until it is terminated."""

    def __init__(self, server: EtcdServer, key: str) -> None:
        self.proc = subprocess.Popen(
            ["etcdctl", "--dial-timeout=2s", "-w", "json", "lock", "--ttl", "10", key],
            env=server.etcdctl_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self._lines: queue.Queue[str] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)

    def granted(self, timeout: float) -> dict[str, Any] | None:
        """The JSON reply printed on acquisition (a get of its key), or None if it did not come in time."""
        try:
            return json.loads(self._lines.get(timeout=timeout))  # type: ignore[no-any-return]
        except queue.Empty:
            return None

    def release(self) -> None:
        self.proc.terminate()  # etcdctl unlocks on SIGTERM, then exits
        self.proc.wait(timeout=10)
        self._close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._close()

    def _close(self) -> None:
        self._reader.join(5)  # the pipe ends with the process
        assert self.proc.stdout is not None
        self.proc.stdout.close()


def create_revision(reply: dict[str, Any]) -> int:
    return int(reply["kvs"][0]["create_revision"])


@pytest.fixture
def name() -> str:
    # '.', '/', space and non-ASCII: the name only matches if etcdctl is given lockkit's exact encoding
    return f"interop v1.2/é-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def locks(etcd_server: EtcdServer) -> Iterator[lockkit.Locker]:
    with lockkit.connect(etcd_server.url) as locker:
        yield locker


@pytest.fixture
def etcdctl(etcd_server: EtcdServer, name: str) -> Iterator[Any]:
    started: list[Etcdctl] = []

    def start() -> Etcdctl:
        proc = Etcdctl(etcd_server, "/lockkit/" + encode_name(name))
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill()


def contenders(server: EtcdServer, name: str) -> int:
    out = subprocess.run(
        ["etcdctl", "get", "--prefix", f"/lockkit/{encode_name(name)}/", "--keys-only", "-w", "json"],
        env=server.etcdctl_env(), capture_output=True, text=True, check=True, timeout=15,
    ).stdout
    return int(json.loads(out).get("count", 0))


def wait_contenders(server: EtcdServer, name: str, n: int) -> None:
    end = time.monotonic() + 10
    while contenders(server, name) != n:
        assert time.monotonic() < end, f"expected {n} contenders for {name!r}"
        time.sleep(0.02)


def test_the_unencoded_name_is_another_lock(locks: lockkit.Locker, etcd_server: EtcdServer, name: str) -> None:
    # what an ordinary URL escaper would give: '.' kept. It is a different key range, so no exclusion.
    other = Etcdctl(etcd_server, "/lockkit/" + encode_name(name).replace("%2E", "."))
    try:
        assert other.granted(10) is not None
        lock = locks.lock(name)
        assert lock.try_acquire() is not None
        lock.release()
    finally:
        other.kill()


def test_etcdctl_holder_blocks_lockkit(locks: lockkit.Locker, etcdctl: Any, name: str) -> None:
    holder = etcdctl()
    assert holder.granted(10) is not None
    lock = locks.lock(name, ttl=5)
    assert lock.try_acquire() is None
    with pytest.raises(LockTimeout):
        lock.acquire(timeout=QUIET)
    assert locks.holder(name).held
    holder.release()
    lock.acquire(timeout=10)  # woken by the etcdctl's delete
    lock.release()


def test_lockkit_holder_blocks_etcdctl(locks: lockkit.Locker, etcdctl: Any, etcd_server: EtcdServer,
                                       name: str) -> None:
    lock = locks.lock(name, ttl=5)
    lease = lock.acquire(timeout=5)
    waiter = etcdctl()
    assert waiter.granted(QUIET) is None
    wait_contenders(etcd_server, name, 2)
    lock.release()
    reply = waiter.granted(10)
    assert reply is not None
    assert create_revision(reply) > lease.fencing_token


def test_mixed_queue_is_fifo(etcd_server: EtcdServer, etcdctl: Any, name: str) -> None:
    """lockkit holder, then waiters etcdctl, lockkit, etcdctl, lockkit: served in exactly that order."""
    with lockkit.connect(etcd_server.url) as a, lockkit.connect(etcd_server.url) as b, \
            lockkit.connect(etcd_server.url) as c:
        head = a.lock(name, ttl=5)
        first = head.acquire(timeout=5)
        got: dict[str, threading.Event] = {"L1": threading.Event(), "L2": threading.Event()}
        leases: dict[str, Any] = {}
        done: dict[str, threading.Event] = {"L1": threading.Event(), "L2": threading.Event()}

        def lockkit_waiter(locker: lockkit.Locker, label: str) -> None:
            lock = locker.lock(name, ttl=5)
            leases[label] = lock.acquire(timeout=30)
            got[label].set()
            done[label].wait(30)
            lock.release()

        e1 = etcdctl()
        wait_contenders(etcd_server, name, 2)
        threads = [threading.Thread(target=lockkit_waiter, args=(b, "L1"))]
        threads[0].start()
        wait_contenders(etcd_server, name, 3)
        e2 = etcdctl()
        wait_contenders(etcd_server, name, 4)
        threads.append(threading.Thread(target=lockkit_waiter, args=(c, "L2")))
        threads[1].start()
        wait_contenders(etcd_server, name, 5)
        try:
            assert e1.granted(0.2) is None
            head.release()
            r1 = e1.granted(10)
            assert r1 is not None, "the first waiter (etcdctl) was not served"
            assert not got["L1"].wait(0.3) and e2.granted(0.1) is None and not got["L2"].is_set()
            e1.release()
            assert got["L1"].wait(10), "the second waiter (lockkit) was not served"
            assert e2.granted(0.3) is None and not got["L2"].is_set()
            done["L1"].set()
            r2 = e2.granted(10)
            assert r2 is not None, "the third waiter (etcdctl) was not served"
            assert not got["L2"].wait(0.3)
            e2.release()
            assert got["L2"].wait(10), "the fourth waiter (lockkit) was not served"
            done["L2"].set()
            tokens = [first.fencing_token, create_revision(r1), leases["L1"].fencing_token, create_revision(r2),
                      leases["L2"].fencing_token]
            assert tokens == sorted(tokens) and len(set(tokens)) == 5, tokens
        finally:
            for event in done.values():
                event.set()
            for thread in threads:
                thread.join(30)


def test_fencing_is_create_revision_not_header_revision(etcd_server: EtcdServer, etcdctl: Any, name: str) -> None:
    """lockkit holds; etcdctl queues; a lockkit waiter queues behind it. The etcdctl holder's create_revision
    is below the next lockkit token (so fencing with create_revision works across both), while the revision
    etcdctl's reply (and a contended Go Mutex's Header()) carries is above it (so fencing with it would refuse
    the next holder: the failure of issue 16)."""
    with lockkit.connect(etcd_server.url) as a, lockkit.connect(etcd_server.url) as b:
        head = a.lock(name, ttl=5)
        first = head.acquire(timeout=5)
        go = etcdctl()
        wait_contenders(etcd_server, name, 2)
        result: queue.Queue[Any] = queue.Queue()
        tail = b.lock(name, ttl=5)
        thread = threading.Thread(target=lambda: result.put(tail.acquire(timeout=30)))
        thread.start()
        try:
            wait_contenders(etcd_server, name, 3)
            head.release()
            reply = go.granted(10)
            assert reply is not None
            go.release()
            last = result.get(timeout=30)
            assert first.fencing_token < create_revision(reply) < last.fencing_token
            assert int(reply["header"]["revision"]) > last.fencing_token
            assert b.holder(name).fencing_token == last.fencing_token
            tail.release()
        finally:
            go.kill()
            thread.join(30)


def test_status_of_an_etcdctl_holder_shows_no_raw_value(locks: lockkit.Locker, etcdctl: Any, name: str) -> None:
    holder = etcdctl()
    reply = holder.granted(10)
    assert reply is not None
    info = locks.holder(name)
    # etcdctl's key has an empty value: no hint, reported as "holder not a lockkit client"
    assert info.held and info.token_hint is None and info.fencing_token == create_revision(reply)
