"""The semaphore and reader-writer lock suite over zookeeper:// (one real server), both faces; S-8, S-9."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable

import pytest
from kazoo.client import KazooClient

import lockkit
from backends.pytest_fixtures import ProxyFactory
from backends.servers import ZooKeeperServer
from lockkit import LockNotOwned
from lockkit.drivers.zookeeper.permits import LOCK_SUFFIX, ZooKeeperPermits, permit_path
from lockkit.testing import AsyncSemaphoreSuite, SemaphoreSuite


class TestZooKeeper(SemaphoreSuite):
    @pytest.fixture
    def url(self, zookeeper_server: ZooKeeperServer) -> str:
        return zookeeper_server.url


class TestZooKeeperAsync(AsyncSemaphoreSuite):
    @pytest.fixture
    def url(self, zookeeper_server: ZooKeeperServer) -> str:
        return zookeeper_server.url


# -- faults (docs/reliability.md, S-8, S-9) --------------------------------------------------------------


def _permits(locks: lockkit.Locker, name: str) -> ZooKeeperPermits:
    permits = locks._permit_backend(name, None)[1]
    assert isinstance(permits, ZooKeeperPermits)
    return permits


def _wait_until(predicate: Callable[[], bool], timeout: float) -> bool:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= end:
            return False
        time.sleep(0.01)
    return True


def test_s8_permit_session_expired_reports_the_permits_only(zookeeper_server: ZooKeeperServer) -> None:
    url = f"{zookeeper_server.url}/s8-{uuid.uuid4().hex[:8]}?session_timeout=2"
    with lockkit.connect(url) as locks, lockkit.connect(url) as other:
        lost: list[str] = []
        permit = locks.semaphore("s8", limit=1, ttl=5, on_lost=lambda lease: lost.append("permit"))
        writer = locks.rwlock("s8-rw", ttl=5).write()
        writer_lease = writer.acquire(timeout=5)
        lease = permit.acquire(timeout=5)
        lock_lease = locks.lock("s8", ttl=5, on_lost=lambda lease: lost.append("lock")).acquire(timeout=5)
        waiting: list[lockkit.Lease] = []
        waiter = threading.Thread(target=lambda: waiting.append(other.semaphore("s8", limit=1).acquire(timeout=10)))
        waiter.start()
        session_id, password = _permits(locks, "s8")._s.client().client_id
        ghost = KazooClient(hosts=zookeeper_server.hosts, client_id=(session_id, password), timeout=2)
        ghost.start(timeout=5)
        ghost.stop()  # closes the permits' session: the server deletes its ephemeral nodes
        ghost.close()
        waiter.join(10)
        assert waiting and waiting[0].valid, "the waiter was not served after the holder's session ended"
        assert _wait_until(lambda: "permit" in lost, 5), "on_lost never fired"
        assert not lease.valid and not writer_lease.valid and lost.count("permit") == 1
        assert lock_lease.valid and "lock" not in lost, "the locks' session is not the permits'"
        with pytest.raises(LockNotOwned):
            permit.release()
        with pytest.raises(LockNotOwned):
            writer.release()
        assert other.permit_holders("s8").holders == 1, "the stale release deleted the new holder's permit"


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # kazoo's loop may die on
# the corrupted stream ("xids do not match"); the session must start again and clean up anyway
def test_s9_lost_replies_leave_no_zombie_lock_contender(
    zookeeper_server: ZooKeeperServer, fault_proxy: ProxyFactory, zk_raw: KazooClient
) -> None:
    chroot = f"/s9-{uuid.uuid4().hex[:8]}"
    proxy = fault_proxy(zookeeper_server)
    url = f"zookeeper://127.0.0.1:{proxy.port}{chroot}?session_timeout=3"
    path = permit_path(chroot, "s9")
    with lockkit.connect(f"{zookeeper_server.url}{chroot}") as other, lockkit.connect(url) as locks:
        with locks.semaphore("s9", limit=2, ttl=5):  # this session has made the nodes
            pass
        holder = other.semaphore("s9", limit=2, ttl=5)
        holder.acquire(timeout=5)
        proxy.set_mode("drop_downstream")  # our requests reach the server, its replies never come back
        outcome: list[object] = []

        def attempt() -> None:
            try:
                outcome.append(locks.semaphore("s9", limit=2, ttl=5).acquire(timeout=2.5))
            except lockkit.LockError as exc:
                outcome.append(exc)

        thread = threading.Thread(target=attempt)
        thread.start()
        assert _wait_until(lambda: len(zk_raw.get_children(path + LOCK_SUFFIX)) == 1, 5), "no create reached it"
        time.sleep(0.3)
        proxy.set_mode("pass")
        thread.join(30)
        assert outcome and not isinstance(outcome[0], lockkit.Lease), outcome
        # kazoo#429: a contender left on the semaphore's lock blocks every later acquire for the session's life
        assert _wait_until(lambda: zk_raw.get_children(path + LOCK_SUFFIX) == [], 3 + 1), "a zombie contender"
        assert len(zk_raw.get_children(path)) == 1, "a permit of the failed acquire was left behind"
        started = time.monotonic()
        again = locks.semaphore("s9", limit=2, ttl=5)
        again.acquire(timeout=10)
        assert time.monotonic() - started < 2
        again.release()
        holder.release()
