"""lockkit's zookeeper:// semaphores and reader-writer locks share kazoo's recipes (docs/backends/zookeeper.md).

Both directions against kazoo's own ``ReadLock``, ``WriteLock`` and ``Semaphore`` on the same nodes: a writer of
either client excludes the other's readers and writers, readers of both overlap, a kazoo writer waiting holds
back a lockkit reader (writer preference across clients), a kazoo lease counts against lockkit's limit and
the other way round, a limit mismatch is refused by both, and fencing tokens (``czxid``) rise across both.
A kazoo recipe object is made per acquisition, as docs/interop.md asks (the parents are container nodes).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import LockTimeout as KazooLockTimeout
from kazoo.recipe.lock import ReadLock, Semaphore, WriteLock

import lockkit
from backends.servers import ZooKeeperServer
from lockkit import ConfigError, LockTimeout
from lockkit.drivers.zookeeper.permits import LOCK_SUFFIX, permit_path

QUIET = 1.0


@pytest.fixture
def name() -> str:
    return f"interop-permits v1/é-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def path(name: str) -> str:
    return permit_path("", name)


@pytest.fixture
def locks(zookeeper_server: ZooKeeperServer) -> Iterator[lockkit.Locker]:
    with lockkit.connect(zookeeper_server.url) as locker:
        yield locker


def _czxid(zk: KazooClient, path: str, node: str | None) -> int:
    return int(zk.exists(f"{path}/{node}").czxid)


def test_path_is_documented(path: str) -> None:
    # '-' is percent-encoded too, so that no name's node ends in "-__lock__" (kazoo's Semaphore lock path)
    assert permit_path("/app", "a-b/c") == "/app/lockkit-permits/a%2Db%2Fc"
    assert "-" not in path.rpartition("/")[2]


# -- reader-writer locks -------------------------------------------------------------------------------


def test_kazoo_writer_excludes_lockkit(locks: lockkit.Locker, zk_raw: KazooClient, name: str, path: str) -> None:
    writer = WriteLock(zk_raw, path)
    assert writer.acquire(timeout=5)
    rw = locks.rwlock(name, ttl=5)
    assert rw.read().try_acquire() is None and rw.write().try_acquire() is None
    with pytest.raises(LockTimeout):
        rw.read().acquire(timeout=QUIET)
    assert locks.permit_holders(name).writer
    token = _czxid(zk_raw, path, writer.node)
    writer.release()
    reader = rw.read()
    lease = reader.acquire(timeout=10)
    assert lease.fencing_token > token
    reader.release()
    assert zk_raw.get_children(path) == [], "lockkit's queued nodes were left behind"


def test_lockkit_writer_excludes_kazoo(locks: lockkit.Locker, zk_raw: KazooClient, name: str, path: str) -> None:
    writer = locks.rwlock(name, ttl=5).write()
    lease = writer.acquire(timeout=5)
    with pytest.raises(KazooLockTimeout):
        ReadLock(zk_raw, path).acquire(timeout=QUIET)
    assert not WriteLock(zk_raw, path).acquire(blocking=False)
    writer.release()
    kazoo_reader = ReadLock(zk_raw, path)
    assert kazoo_reader.acquire(timeout=5)
    assert _czxid(zk_raw, path, kazoo_reader.node) > lease.fencing_token
    kazoo_reader.release()


def test_lockkit_and_kazoo_readers_overlap(locks: lockkit.Locker, zk_raw: KazooClient, name: str, path: str) -> None:
    kazoo_reader = ReadLock(zk_raw, path)
    assert kazoo_reader.acquire(timeout=5)
    reader = locks.rwlock(name, ttl=5).read()
    assert reader.acquire(timeout=5).valid
    other = ReadLock(zk_raw, path)
    assert other.acquire(timeout=5), "a kazoo reader must join a lockkit reader"
    info = locks.permit_holders(name)
    assert (info.limit, info.holders, info.writer) == (0, 3, False)
    for held in (other, kazoo_reader):
        held.release()
    reader.release()


def test_waiting_kazoo_writer_holds_back_lockkit_readers(
    locks: lockkit.Locker, zk_raw: KazooClient, name: str, path: str
) -> None:
    reader = locks.rwlock(name, ttl=5).read()
    first = reader.acquire(timeout=5)
    writer = WriteLock(zk_raw, path)
    got: list[bool] = []
    waiting = threading.Thread(target=lambda: got.append(writer.acquire(timeout=20)))
    waiting.start()
    end = time.monotonic() + 10
    while locks.permit_holders(name).waiting_writers < 1:
        assert time.monotonic() < end, "the kazoo writer never queued"
        time.sleep(0.02)
    assert locks.rwlock(name).read().try_acquire() is None, "a reader after a waiting writer must wait"
    reader.release()
    waiting.join(10)
    assert got == [True]
    assert _czxid(zk_raw, path, writer.node) > first.fencing_token
    writer.release()


def test_lockkit_writer_waits_for_kazoo_reader_and_is_woken(
    locks: lockkit.Locker, zk_raw: KazooClient, name: str, path: str
) -> None:
    kazoo_reader = ReadLock(zk_raw, path)
    assert kazoo_reader.acquire(timeout=5)
    writer = locks.rwlock(name, ttl=5).write()
    result: list[lockkit.Lease] = []
    waiting = threading.Thread(target=lambda: result.append(writer.acquire(timeout=20)))
    waiting.start()
    time.sleep(0.3)
    assert not result
    released = time.monotonic()
    kazoo_reader.release()
    waiting.join(10)
    assert result and result[0].valid and time.monotonic() - released < 2.0  # woken by the watch
    writer.release()


# -- semaphores ----------------------------------------------------------------------------------------


def test_kazoo_leases_count_against_lockkit(locks: lockkit.Locker, zk_raw: KazooClient, name: str, path: str) -> None:
    kazoo_lease = Semaphore(zk_raw, path, "kazoo-holder", max_leases=2)
    assert kazoo_lease.acquire(timeout=5)
    first = locks.semaphore(name, limit=2, ttl=5)
    lease = first.acquire(timeout=5)
    assert lease.fencing_token > _czxid(zk_raw, path, kazoo_lease.create_path.rpartition("/")[2])
    assert locks.semaphore(name, limit=2).try_acquire() is None
    info = locks.permit_holders(name)
    assert (info.limit, info.holders) == (2, 2)
    kazoo_lease.release()
    second = locks.semaphore(name, limit=2, ttl=5)
    assert second.acquire(timeout=5).valid
    first.release()
    second.release()


def test_lockkit_permits_count_against_kazoo(locks: lockkit.Locker, zk_raw: KazooClient, name: str, path: str) -> None:
    held = [locks.semaphore(name, limit=2, ttl=5) for _ in range(2)]
    for permit in held:
        permit.acquire(timeout=5)
    assert zk_raw.get(path)[0] == b"2", "the limit is the node's data, as kazoo stores it"
    assert not Semaphore(zk_raw, path, max_leases=2).acquire(blocking=False)
    with pytest.raises(KazooLockTimeout):
        Semaphore(zk_raw, path, max_leases=2).acquire(timeout=QUIET)
    assert zk_raw.get_children(path + LOCK_SUFFIX) == [], "kazoo cleaned up its lock contender"
    held[0].release()
    kazoo_lease = Semaphore(zk_raw, path, max_leases=2)
    assert kazoo_lease.acquire(timeout=5)
    kazoo_lease.release()
    held[1].release()


def test_lockkit_waiter_woken_by_kazoo_release(
    locks: lockkit.Locker, zk_raw: KazooClient, name: str, path: str
) -> None:
    kazoo_lease = Semaphore(zk_raw, path, max_leases=1)
    assert kazoo_lease.acquire(timeout=5)
    permit = locks.semaphore(name, limit=1, ttl=5)
    result: list[lockkit.Lease] = []
    waiting = threading.Thread(target=lambda: result.append(permit.acquire(timeout=20)))
    waiting.start()
    time.sleep(0.3)
    assert not result
    released = time.monotonic()
    kazoo_lease.release()
    waiting.join(10)
    assert result and time.monotonic() - released < 2.0
    permit.release()


def test_limit_mismatch_refused_both_ways(locks: lockkit.Locker, zk_raw: KazooClient, name: str, path: str) -> None:
    kazoo_lease = Semaphore(zk_raw, path, max_leases=2)
    assert kazoo_lease.acquire(timeout=5)
    with pytest.raises(ConfigError, match="same limit"):
        locks.semaphore(name, limit=3).acquire(timeout=5)
    with pytest.raises(ConfigError, match="reader-writer"):
        locks.rwlock(name).read().acquire(timeout=5)
    assert len(zk_raw.get_children(path)) == 1, "a refused contender leaves nothing behind"
    kazoo_lease.release()
    with locks.semaphore(name, limit=3, ttl=5):  # nobody holds: lockkit sets the limit anew
        assert zk_raw.get(path)[0] == b"3"
        with pytest.raises(ValueError, match="Inconsistent max leases"):
            Semaphore(zk_raw, path, max_leases=2).acquire(timeout=5)


def test_lockkit_reader_refused_beside_kazoo_semaphore_and_back(
    locks: lockkit.Locker, zk_raw: KazooClient, name: str, path: str
) -> None:
    kazoo_reader = ReadLock(zk_raw, path)
    assert kazoo_reader.acquire(timeout=5)
    with pytest.raises(ConfigError, match="reader-writer lock"):
        locks.semaphore(name, limit=2).try_acquire()
    assert zk_raw.get_children(path + LOCK_SUFFIX) == [], "the refused semaphore's lock contender is gone"
    kazoo_reader.release()


def test_given_up_waiter_leaves_no_lock_contender(
    locks: lockkit.Locker, zk_raw: KazooClient, name: str, path: str
) -> None:
    # kazoo#429: a zombie contender on the semaphore's lock blocks every later acquire. lockkit deletes its own.
    kazoo_lease = Semaphore(zk_raw, path, max_leases=1)
    assert kazoo_lease.acquire(timeout=5)
    with pytest.raises(LockTimeout):
        locks.semaphore(name, limit=1, ttl=5).acquire(timeout=QUIET)
    assert zk_raw.get_children(path + LOCK_SUFFIX) == []
    assert zk_raw.get_children(path) == [kazoo_lease.create_path.rpartition("/")[2]]
    kazoo_lease.release()
    other = Semaphore(zk_raw, path, max_leases=1)
    assert other.acquire(timeout=5), "nothing of lockkit's holds the semaphore back"
    other.release()


def test_mixed_fleet_never_exceeds_the_limit(
    zookeeper_server: ZooKeeperServer, zk_raw: KazooClient, name: str, path: str
) -> None:
    # lockkit's one-write acquire (a multi that needs an empty queue on P-__lock__) and kazoo's rule (count,
    # then create, under the lock) on one semaphore at once: never more than the limit inside.
    limit, seconds = 2, 4.0
    inside, most, rounds = [0], [0], {"lockkit": 0, "kazoo": 0}
    guard = threading.Lock()
    stop = time.monotonic() + seconds
    failures: list[BaseException] = []

    def enter(who: str) -> None:
        with guard:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
            rounds[who] += 1
        time.sleep(0.002)
        with guard:
            inside[0] -= 1

    def lockkit_worker() -> None:
        try:
            with lockkit.connect(zookeeper_server.url) as locks:
                while time.monotonic() < stop:
                    permit = locks.semaphore(name, limit=limit, ttl=5)
                    permit.acquire(timeout=20)
                    try:
                        enter("lockkit")
                    finally:
                        permit.release()
        except BaseException as exc:  # reported below
            failures.append(exc)

    def kazoo_worker() -> None:
        client = KazooClient(hosts=zookeeper_server.hosts)
        client.start(timeout=10)
        try:
            while time.monotonic() < stop:
                permit = Semaphore(client, path, max_leases=limit)  # a new object per acquisition
                assert permit.acquire(timeout=20)
                try:
                    enter("kazoo")
                finally:
                    permit.release()
        except BaseException as exc:
            failures.append(exc)
        finally:
            client.stop()
            client.close()

    workers = [threading.Thread(target=lockkit_worker) for _ in range(5)]
    workers += [threading.Thread(target=kazoo_worker) for _ in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert not failures, failures
    print(f"mixed fleet: {rounds}, most inside {most[0]}")
    assert most[0] <= limit and rounds["lockkit"] > 0 and rounds["kazoo"] > 0
