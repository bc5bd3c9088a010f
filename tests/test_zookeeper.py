"""zookeeper:// driver: URL and layout rules, server scenarios Z-4 (herd), Z-5, Z-6 (ACL), C-8 (cancel storm),
and a migration from file:// to zookeeper:// (presence records: tests/test_zookeeper_presence.py).

The fault scenarios that kill, pause or cut things are in test_zookeeper_faults.py.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

import lockkit
from backends.pytest_fixtures import ZooKeeperFactory
from backends.servers import ZooKeeperServer
from lockkit import ConfigError, LockError, LockNotOwned, LockTimeout
from lockkit.driver import DriverContext, RenewRequest
from lockkit.drivers.zookeeper import ZooKeeperDriver
from lockkit.drivers.zookeeper.nodes import contenders, sequence
from lockkit.names import encode_name
from lockkit.urls import parse_url

SECRET = "s3cr3t-XYZ"


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.005) -> bool:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= end:
            return False
        time.sleep(interval)
    return True


def driver_of(locks: lockkit.Locker, name: str = "x") -> ZooKeeperDriver:
    driver = locks.backend_for(name).driver
    assert isinstance(driver, ZooKeeperDriver)
    return driver


def open_driver(url: str) -> ZooKeeperDriver:
    return ZooKeeperDriver.from_url(parse_url(url), DriverContext())


@pytest.fixture
def chroot() -> str:
    return f"/zk-{uuid.uuid4().hex[:8]}"


def parent_of(chroot: str, name: str) -> str:
    return f"{chroot}/lockkit/{encode_name(name)}"


def kids(client: KazooClient, path: str) -> list[str]:
    return list(client.get_children(path)) if client.exists(path) else []


# -- no server -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "zookeeper://",
        "zookeeper://h/a/../b",
        "zookeeper://h/a//b",
        "zookeeper://h/zookeeper/x",
        "zookeeper://h?sesion_timeout=3",
        "zookeeper://h?session_timeout=0",
        "zookeeper://h?session_timeout=abc",
        "zookeeper://h?connect_timeout=-1",
        "zookeeper://user@h",
        f"zookeeper://:{SECRET}@h",
    ],
)
def test_bad_urls_are_config_errors(url: str) -> None:
    with pytest.raises(ConfigError) as info:
        open_driver(url)
    assert SECRET not in str(info.value)


def test_url_parts_and_no_password_anywhere() -> None:
    driver = open_driver(f"zookeeper://app:{SECRET}@zk1,zk2:2182,[::1]:2183/svc/locks/?session_timeout=3")
    session = driver._session
    assert session.hosts == "zk1:2181,zk2:2182,[::1]:2183"
    assert session.layout.base == "/svc/locks/lockkit"
    assert session.options.session_timeout == 3
    assert driver.session_timeout == 3  # the requested value until a server negotiates one
    assert SECRET not in repr(driver) and "***" in repr(driver)
    driver.close()


def test_layout_and_queue_order() -> None:
    assert contenders(["b__lock__0000000010", "junk", "a__lock__0000000002", "c__lock__0000000011"]) == [
        "a__lock__0000000002",
        "b__lock__0000000010",
        "c__lock__0000000011",
    ]
    assert sequence("abc__lock__0000000007") == 7 and sequence("__lock__1") is None and sequence("x") is None
    for odd in ["/", ".", "..", "zookeeper", "a/b", "ü", "x" * 512]:
        component = encode_name(odd)
        assert "/" not in component and component not in (".", "..") and "." not in component


# -- one shared server ---------------------------------------------------------------------------


def test_effective_ttl_is_the_negotiated_session_timeout(zookeeper_server: ZooKeeperServer, chroot: str) -> None:
    # the test server allows 0.4–20 s: a 30 s request is clamped to 20 s and reported, not hidden
    with lockkit.connect(f"{zookeeper_server.url}{chroot}?session_timeout=30") as locks:
        lease = locks.lock("t", ttl=2).acquire(timeout=5)
        assert lease.ttl == pytest.approx(20.0)
        assert driver_of(locks, "t").session_timeout == pytest.approx(20.0)


def test_renew_many_is_one_round_trip_for_many_locks(zookeeper_server: ZooKeeperServer, chroot: str) -> None:
    driver = open_driver(f"{zookeeper_server.url}{chroot}?session_timeout=4")
    try:
        tokens = [uuid.uuid4().hex for _ in range(100)]
        for i, token in enumerate(tokens):
            assert driver.acquire(f"many-{i}", token, 5, None) is not None
        kazoo = driver._session.client()
        calls: list[str] = []
        for method in ("exists_async", "get_async", "get_children_async", "create_async", "delete_async"):
            original = getattr(kazoo, method)
            setattr(kazoo, method, lambda *a, _m=method, _o=original, **k: (calls.append(_m), _o(*a, **k))[1])
        requests = [RenewRequest(f"many-{i}", token, 5) for i, token in enumerate(tokens)]
        results = driver.renew_many(requests)  # the first batch reads each node once and sets our watch on it
        assert all(r is not None and not isinstance(r, Exception) for r in results)
        assert calls == ["exists_async"] * (len(tokens) + 1), calls
        calls.clear()
        results = driver.renew_many(requests)  # from then on: one request per batch, whatever the count
        assert all(r is not None and not isinstance(r, Exception) for r in results)
        assert calls == ["exists_async"], calls
        # a node deleted behind our back is reported by the next batch (the watch fired), not hidden
        other = open_driver(f"{zookeeper_server.url}{chroot}")
        assert other.force_release("many-7")
        other.close()
        assert wait_until(lambda: driver.renew_many(requests[7:8]) == [None], 2)
        assert driver.release("many-8", tokens[8]) and not driver.release("many-8", tokens[8])
    finally:
        driver.close()


def test_z5_parent_recreated_fencing_keeps_increasing(
    zookeeper_server: ZooKeeperServer, chroot: str, zk_raw: KazooClient
) -> None:
    url = f"{zookeeper_server.url}{chroot}?session_timeout=2"
    with lockkit.connect(url) as locks, lockkit.connect(url) as other:
        lost = threading.Event()
        first = locks.lock("p", ttl=5, on_lost=lambda lease: lost.set())
        old = first.acquire()
        got: list[lockkit.Lease] = []
        waiter = threading.Thread(target=lambda: got.append(other.lock("p", ttl=5).acquire(timeout=10)))
        waiter.start()
        assert wait_until(lambda: len(kids(zk_raw, parent_of(chroot, "p"))) == 2, 5)
        wipe = zk_raw.transaction()  # an administrator wipes the name mid-contention, atomically
        for child in zk_raw.get_children(parent_of(chroot, "p")):
            wipe.delete(f"{parent_of(chroot, 'p')}/{child}")
        wipe.delete(parent_of(chroot, "p"))
        assert all(result is True for result in wipe.commit())
        waiter.join(10)
        assert got and got[0].valid, "the waiter did not queue again under the recreated parent"
        assert lost.wait(2) and not old.valid
        assert got[0].fencing_token > old.fencing_token, "czxid must increase across a recreated parent"
        with pytest.raises(LockNotOwned):
            first.release()
        assert other.holder("p").held and len(zk_raw.get_children(parent_of(chroot, "p"))) == 1


def test_parents_are_containers_that_do_not_leak(fresh_zookeeper: ZooKeeperFactory) -> None:
    server = fresh_zookeeper(extra_args=["-Dznode.container.checkIntervalMs=200"])
    with lockkit.connect(f"{server.url}/leak") as locks:
        for i in range(5):
            with locks.lock(f"short-lived-{i}", ttl=5):
                pass
        checker = KazooClient(hosts=server.hosts)
        checker.start(timeout=10)
        try:
            assert wait_until(lambda: checker.get_children("/leak/lockkit") == [], 5), "parent nodes leaked"
            # and a name whose container was reaped works again (the parent is recreated)
            with locks.lock("short-lived-0", ttl=5) as lease:
                assert lease.valid
        finally:
            checker.stop()
            checker.close()


def test_z4_herd_each_release_wakes_exactly_one_waiter(
    zookeeper_server: ZooKeeperServer, chroot: str, zk_raw: KazooClient
) -> None:
    url = f"{zookeeper_server.url}{chroot}?session_timeout=4"
    waiters = 50
    lockers = [lockkit.connect(url) for _ in range(waiters + 1)]
    lists: list[int] = [0] * (waiters + 1)
    order: list[int] = []
    go = [threading.Event() for _ in range(waiters + 1)]
    try:
        for i, locker in enumerate(lockers):
            driver_of(locker).ping()
            kazoo = driver_of(locker)._session.client()
            original = kazoo.get_children_async

            def counted(*args: object, _i: int = i, _o: Callable[..., object] = original, **kw: object) -> object:
                lists[_i] += 1
                return _o(*args, **kw)

            kazoo.get_children_async = counted

        def hold(i: int) -> None:
            lock = lockers[i].lock("herd", ttl=5)
            lock.acquire(timeout=60)
            order.append(i)
            go[i].wait(60)
            lock.release()

        threads = [threading.Thread(target=hold, args=(i,)) for i in range(waiters + 1)]
        for i, thread in enumerate(threads):  # queue one by one so the expected FIFO order is known
            thread.start()
            assert wait_until(lambda n=i + 1: len(kids(zk_raw, parent_of(chroot, "herd"))) == n, 5)
        assert order == [0]
        herd = parent_of(chroot, "herd")
        assert wait_until(lambda: sum(_watchers_by_path(zookeeper_server, herd).values()) == waiters + 1, 5)
        watches = _watchers_by_path(zookeeper_server, herd)
        print(f"Z-4: {sum(watches.values())} watches on {len(watches)} contender nodes")
        holder_node = contenders(zk_raw.get_children(parent_of(chroot, "herd")))[0]
        for path, count in watches.items():  # each waiter watches its predecessor; the holder its own node
            assert count <= (2 if path.endswith(holder_node) else 1), (path, count)
        for step in range(5):
            before = sum(lists)
            go[step].set()
            assert wait_until(lambda n=step + 2: len(order) == n, 10)
            assert wait_until(lambda b=before: sum(lists) - b >= 1, 2)
            time.sleep(0.05)
            assert sum(lists) - before == 1, "a release woke more than one waiter"
        for event in go:
            event.set()
        for thread in threads:
            thread.join(60)
        assert order == list(range(waiters + 1)), "waiters were not served in FIFO order"
    finally:
        for event in go:
            event.set()
        for locker in lockers:
            locker.close()


def _watchers_by_path(server: ZooKeeperServer, parent: str) -> dict[str, int]:
    """Parse the ``wchp`` four-letter word: per watched path, how many sessions watch it."""
    counts: dict[str, int] = {}
    path = None
    for line in server.four_letter_word("wchp").splitlines():
        if not line.strip():
            continue
        if not line.startswith(("\t", " ")):
            path = line.strip()
        elif path is not None and path.startswith(parent + "/"):
            counts[path] = counts.get(path, 0) + 1
    return counts


def test_z6_acl_wrong_or_missing_credentials_fail_clearly(zookeeper_server: ZooKeeperServer, chroot: str) -> None:
    host = f"{zookeeper_server.host}:{zookeeper_server.port}"
    with lockkit.connect(f"zookeeper://app:{SECRET}@{host}{chroot}?session_timeout=2") as owner:
        lock = owner.lock("guarded", ttl=5)
        lease = lock.acquire(timeout=5)
        for url in (f"zookeeper://{host}{chroot}", f"zookeeper://app:wrong-{SECRET}x@{host}{chroot}"):
            with lockkit.connect(url) as intruder:
                started = time.monotonic()
                with pytest.raises(LockError) as info:
                    intruder.lock("guarded", ttl=5).acquire(timeout=5)
                assert time.monotonic() - started < 3, "a credential problem must fail fast, not hang"
                assert "user:password" in str(info.value)
                chain: BaseException | None = info.value
                while chain is not None:
                    assert SECRET not in str(chain) and SECRET not in repr(chain)
                    chain = chain.__cause__
                with pytest.raises(LockError):
                    intruder.lock("another", ttl=5).acquire(timeout=5)
        anonymous = KazooClient(hosts=zookeeper_server.hosts)
        anonymous.start(timeout=10)
        try:
            node = contenders(
                owner.backend_for("guarded")
                .driver._session.client()
                .get_children(  # type: ignore[attr-defined]
                    parent_of(chroot, "guarded")
                )
            )[0]
            with pytest.raises(NoAuthError):
                anonymous.delete(f"{parent_of(chroot, 'guarded')}/{node}")
        finally:
            anonymous.stop()
            anonymous.close()
        assert lease.valid and owner.holder("guarded").held
        assert SECRET not in repr(owner) and SECRET not in repr(lock) and SECRET not in repr(lease)
        lock.release()


async def test_c8_cancellation_storm_async_leaves_no_node(
    zookeeper_server: ZooKeeperServer, chroot: str, zk_raw: KazooClient
) -> None:
    url = f"{zookeeper_server.url}{chroot}?session_timeout=4"
    async with lockkit.connect_async(url) as locks, lockkit.connect_async(url) as other:
        holder = locks.lock("storm", ttl=5)
        await holder.acquire()
        parent = parent_of(chroot, "storm")
        # count the blocking acquires still running in offload threads: a cancelled task returns at once,
        # its thread finishes (and cleans up) just after
        sync = other.backend_for("storm").driver.sync  # type: ignore[attr-defined]
        running = [0]
        original = sync.acquire

        def counted(*args: object) -> object:
            running[0] += 1
            try:
                return original(*args)
            finally:
                running[0] -= 1

        sync.acquire = counted
        rng = random.Random(8)
        for i in range(200):
            task = asyncio.ensure_future(other.lock("storm", ttl=5).acquire())
            await asyncio.sleep(rng.uniform(0, 0.01))
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            for _ in range(400):
                if running[0] == 0:
                    break
                await asyncio.sleep(0.005)
            assert running[0] == 0, f"iteration {i}: a cancelled acquire is still running"
            assert len(zk_raw.get_children(parent)) == 1, f"iteration {i}: a cancelled acquire leaked its node"
        await holder.release()
        third = other.lock("storm", ttl=5)
        await asyncio.wait_for(third.acquire(), 5)  # no deadlock, no ghost in the queue
        await third.release()


def test_c8_timeouts_storm_sync_leaves_no_node(
    zookeeper_server: ZooKeeperServer, chroot: str, zk_raw: KazooClient
) -> None:
    url = f"{zookeeper_server.url}{chroot}?session_timeout=4"
    with lockkit.connect(url) as locks, lockkit.connect(url) as other:
        holder = locks.lock("storm", ttl=5)
        holder.acquire()
        rng = random.Random(8)

        def contend() -> None:
            for _ in range(25):
                with pytest.raises(LockTimeout):
                    other.lock("storm", ttl=5).acquire(timeout=rng.uniform(0, 0.02))

        threads = [threading.Thread(target=contend) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert (
            zk_raw.get_children(parent_of(chroot, "storm")) != []
            and len(zk_raw.get_children(parent_of(chroot, "storm"))) == 1
        ), "a timed-out acquire leaked its node"
        holder.release()
        assert other.lock("storm", ttl=5).try_acquire() is not None


# -- migrate: file:// -> zookeeper:// (the ZooKeeper driver's presence records guard the fleet) -----------------


def test_migrate_from_file_to_zookeeper(
    zookeeper_server: ZooKeeperServer, chroot: str, zk_raw: KazooClient, tmp_path: Path
) -> None:
    old_url, new_url = (tmp_path / "old").as_uri(), f"{zookeeper_server.url}{chroot}?session_timeout=2"

    def config(phase: str) -> Path:
        path = tmp_path / f"lockkit-{phase}.toml"
        path.write_text(
            f'default = "main"\n[backends.old]\nurl = "{old_url}"\n[backends.new]\nurl = "{new_url}"\n'
            f'[backends.main]\nmigrate = {{ from = "old", to = "new", phase = "{phase}", presence_ttl = 3 }}\n'
        )
        return path

    fleet = f"{chroot}/lockkit-presence/{encode_name('lockkit-migrate:main')}"
    with lockkit.from_config(config("both")) as both:
        with both.lock("mz", ttl=5) as lease:
            assert both.holder("mz", backend="old").held and both.holder("mz", backend="new").held
            assert len(kids(zk_raw, parent_of(chroot, "mz"))) == 1 and lease.valid
            assert both.lock("mz").try_acquire() is None
        assert not both.holder("mz", backend="old").held and not both.holder("mz", backend="new").held
    assert kids(zk_raw, fleet) == [], "a closed client left its presence record in ZooKeeper"
    old = lockkit.from_config(config("old"))
    try:
        assert old.lock("mz:guard").try_acquire() is not None  # announces phase 'old' in both backends
        (member,) = kids(zk_raw, fleet)
        assert zk_raw.get(f"{fleet}/{member}")[1].ephemeralOwner != 0  # ephemeral: it lives with old's session
        refused = pytest.raises(ConfigError, match=r"1 client\(s\) in phase 'old' are alive")
        with lockkit.from_config(config("new")) as new, refused:
            new.lock("mz:guard").try_acquire()
    finally:
        old.close()  # withdraws its records
    with lockkit.from_config(config("new")) as new:
        with new.lock("mz:guard", ttl=5) as lease:
            assert lease.fencing_token >= 1 << 48  # phase 'new': the epoch switched, ZooKeeper's czxid inside
        epoch = f"{chroot}/lockkit-presence/{encode_name('lockkit-migrate:main:epoch')}/epoch"
        assert zk_raw.get(epoch)[1].ephemeralOwner == 0  # the epoch record is permanent
