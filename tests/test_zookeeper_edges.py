"""zookeeper:// at the edges of its contract: an unreachable server, and a reconnect that finds a stranger's node.

* A server that cannot be reached (a closed loopback port: connection refused; a FaultProxy blackhole:
  TCP connects, nothing answers) must not make ``try_acquire()`` ("one attempt, never waits") wait for
  ``connect_timeout``, nor ``acquire(timeout=T)`` outlive T: both raise ``BackendUnavailable`` saying what to
  do, within their own bound (docs/backends/zookeeper.md, "Timeouts when ZooKeeper is unreachable").
* Z-2: after a SUSPENDED → CONNECTED reconnect of the same session, a lease is restored only if its node is
  still *ours*; a node at the same path created by another session (or by our own session, but anew) is not
  our lock.

The bounds below are liveness bounds with generous slack, never speed claims; measured values are printed.
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from kazoo.client import KazooClient

import lockkit
from backends.pytest_fixtures import ProxyFactory
from backends.servers import ZooKeeperServer
from lockkit import BackendUnavailable, LeaseState
from lockkit.drivers.zookeeper import ZooKeeperDriver
from lockkit.names import encode_name

SLACK = 1.5
"""Scheduling slack on two shared cores: the bounds here are liveness bounds, never speed claims."""
CONNECT_GRACE = 1.0
"""The documented wait for a connection when the caller's timeout is shorter: min(connect_timeout, 1 s)."""


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.005) -> bool:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= end:
            return False
        time.sleep(interval)
    return True


@pytest.fixture
def chroot() -> str:
    return f"/edges-{uuid.uuid4().hex[:8]}"


def closed_port() -> int:
    """A loopback port nobody listens on (bound, then closed): connecting to it is refused at once."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def driver_of(locks: lockkit.Locker, name: str) -> ZooKeeperDriver:
    driver = locks.backend_for(name).driver
    assert isinstance(driver, ZooKeeperDriver)
    return driver


def kids(client: KazooClient, chroot: str, name: str) -> list[str]:
    path = f"{chroot}/lockkit/{encode_name(name)}"
    return sorted(client.get_children(path)) if client.exists(path) else []


def timed(call: Callable[[], object]) -> tuple[float, object]:
    """How long ``call`` took, and what it returned or raised."""
    started = time.monotonic()
    try:
        outcome: object = call()
    except lockkit.LockError as exc:
        outcome = exc
    return time.monotonic() - started, outcome


def assert_unavailable(outcome: object) -> None:
    assert isinstance(outcome, BackendUnavailable), outcome
    message = str(outcome)
    assert "ZooKeeper" in message and "connect_timeout" in message, message  # says what to change


# -- an unreachable server -------------------------------------------------------------------------


def test_try_acquire_against_a_closed_port_fails_within_the_connect_grace() -> None:
    url = f"zookeeper://127.0.0.1:{closed_port()}/edges"  # connect_timeout is the default 10 s
    with lockkit.connect(url) as locks:
        lock = locks.lock("x", ttl=5)
        took, outcome = timed(lock.try_acquire)
        print(f"try_acquire, connection refused: {took:.3f} s -> {outcome!r}")
        assert_unavailable(outcome)
        assert took <= CONNECT_GRACE + SLACK, "try_acquire waited for connect_timeout instead of its own bound"
        took, outcome = timed(lock.try_acquire)  # the client keeps connecting in the background: still bounded
        print(f"try_acquire again: {took:.3f} s")
        assert_unavailable(outcome)
        assert took <= CONNECT_GRACE + SLACK


@pytest.mark.parametrize(("timeout", "connect_timeout", "bound"), [(1.0, 10.0, 1.0), (10.0, 0.5, 0.5)])
def test_acquire_timeout_bounds_the_first_connect_to_a_closed_port(
    timeout: float, connect_timeout: float, bound: float
) -> None:
    url = f"zookeeper://127.0.0.1:{closed_port()}/edges?connect_timeout={connect_timeout}"
    with lockkit.connect(url) as locks:
        took, outcome = timed(lambda: locks.lock("x", ttl=5).acquire(timeout=timeout))
        print(f"acquire(timeout={timeout}), connect_timeout={connect_timeout}, refused: {took:.3f} s")
        assert_unavailable(outcome)
        assert took <= bound + SLACK, "the first connect was not bounded by min(timeout, connect_timeout)"


def test_blackholed_server_first_connect_is_bounded_then_recovers(
    zookeeper_server: ZooKeeperServer, fault_proxy: ProxyFactory, chroot: str
) -> None:
    proxy = fault_proxy(zookeeper_server)
    proxy.set_mode("blackhole")  # TCP connects to the proxy; the handshake never gets an answer
    with lockkit.connect(f"zookeeper://127.0.0.1:{proxy.port}{chroot}?session_timeout=4") as locks:
        lock = locks.lock("bh", ttl=5)
        took, outcome = timed(lock.try_acquire)
        print(f"try_acquire, blackholed: {took:.3f} s")
        assert_unavailable(outcome)
        assert took <= CONNECT_GRACE + SLACK
        took, outcome = timed(lambda: lock.acquire(timeout=1))
        print(f"acquire(timeout=1), blackholed: {took:.3f} s")
        assert_unavailable(outcome)
        assert took <= 1 + SLACK
        proxy.set_mode("pass")
        lease = lock.acquire(timeout=15)  # the same locker connects once the server answers
        assert lease.valid
        lock.release()


@pytest.fixture
def cut_session(
    zookeeper_server: ZooKeeperServer, fault_proxy: ProxyFactory, chroot: str
) -> Iterator[Callable[[str], tuple[lockkit.Locker, Callable[[str], None]]]]:
    """A locker connected through a proxy, so that a test can blackhole an established session."""
    lockers: list[lockkit.Locker] = []

    def make(options: str) -> tuple[lockkit.Locker, Callable[[str], None]]:
        proxy = fault_proxy(zookeeper_server)
        locks = lockkit.connect(f"zookeeper://127.0.0.1:{proxy.port}{chroot}?{options}")
        lockers.append(locks)
        locks.check()  # connected (and the base node made) before the cut
        return locks, proxy.set_mode

    yield make
    for locks in lockers:
        locks.close()


def test_blackhole_on_a_connected_session_does_not_outlive_the_callers_bound(
    cut_session: Callable[[str], tuple[lockkit.Locker, Callable[[str], None]]], zk_raw: KazooClient, chroot: str
) -> None:
    # session_timeout=8: kazoo declares the connection dead only after 2/3 of it (5.3 s), and a reply is waited
    # for up to the whole timeout: neither may stretch try_acquire or acquire(timeout=1)
    locks, set_mode = cut_session("session_timeout=8")
    set_mode("blackhole")
    try:
        took, outcome = timed(locks.lock("cut", ttl=5).try_acquire)
        print(f"try_acquire on a cut session: {took:.3f} s -> {outcome!r}")
        assert_unavailable(outcome)
        assert took <= CONNECT_GRACE + SLACK
        took, outcome = timed(lambda: locks.lock("cut", ttl=5).acquire(timeout=1))
        print(f"acquire(timeout=1) on a cut session: {took:.3f} s -> {outcome!r}")
        assert_unavailable(outcome)
        assert took <= 1 + SLACK
    finally:
        set_mode("pass")
    # a create that may have gone through is cleaned up once the session is back: no contender left behind
    assert wait_until(lambda: kids(zk_raw, chroot, "cut") == [], 10), kids(zk_raw, chroot, "cut")
    lease = locks.lock("cut", ttl=5).acquire(timeout=10)
    assert lease.valid


def test_reconnect_wait_inside_acquire_is_bounded_by_timeout_and_connect_timeout(
    cut_session: Callable[[str], tuple[lockkit.Locker, Callable[[str], None]]],
) -> None:
    locks, set_mode = cut_session("session_timeout=1.5&connect_timeout=1")
    session = driver_of(locks, "r")._session
    set_mode("blackhole")
    try:
        assert wait_until(lambda: session.session_id() is None, 10), "SUSPENDED never came"
        took, outcome = timed(lambda: locks.lock("r", ttl=5).acquire(timeout=0.5))
        print(f"acquire(timeout=0.5) while suspended: {took:.3f} s -> {outcome!r}")
        assert_unavailable(outcome)  # not LockTimeout: nobody was seen holding the lock
        assert took <= CONNECT_GRACE + SLACK
        # no timeout at all: connect_timeout (1 s) bounds the wait for the connection, as documented
        done: list[tuple[float, object]] = []
        waiter = threading.Thread(target=lambda: done.append(timed(lambda: locks.lock("r", ttl=5).acquire())))
        waiter.start()
        waiter.join(1 + 10 * SLACK)
        assert done, "acquire() with no timeout waited for the connection beyond connect_timeout"
        print(f"acquire() while suspended, connect_timeout=1: {done[0][0]:.3f} s -> {done[0][1]!r}")
        assert_unavailable(done[0][1])
        assert done[0][0] <= 1 + SLACK
    finally:
        set_mode("pass")
        waiter.join(20)


# -- Z-2: a reconnect finds a node at our path that is not our lock --------------------------------


def hold_then_cut(
    locks: lockkit.Locker, name: str, set_mode: Callable[[str], None]
) -> tuple[lockkit.Lease, threading.Event, str, tuple[int, bytes]]:
    """Hold ``name``, cut the connection, wait for SUSPENDED; the lease, a loss flag, its node, our session."""
    lost = threading.Event()
    # ttl=30, above the session timeout: renew() must not shorten the lease below the session's own deadline
    lock = locks.lock(name, ttl=30, on_lost=lambda lease: lost.set())
    lease = lock.acquire(timeout=5)
    lock.renew()  # a fresh deadline: the short outage must fit inside it
    session = driver_of(locks, name)._session
    entry = session.leases.get(lease.token)
    assert entry is not None
    client_id = session.client().client_id  # id and password, read while connected
    assert client_id is not None and client_id[0] == entry.session_id
    set_mode("blackhole")
    assert wait_until(lambda: lease.state is LeaseState.UNCERTAIN, lease.ttl), "SUSPENDED never came"
    return lease, lost, entry.path, (int(client_id[0]), bytes(client_id[1]))


def test_z2_node_recreated_by_another_session_during_disconnect_is_not_restored(
    cut_session: Callable[[str], tuple[lockkit.Locker, Callable[[str], None]]], zk_raw: KazooClient
) -> None:
    # session_timeout=6: SUSPENDED comes 4 s after the cut, which leaves the lease 2 s of its own deadline for
    # the reconnect to decide (a loss by that deadline alone would hide the bug this test is for)
    locks, set_mode = cut_session("session_timeout=6")
    lease, lost, path, (our_session, _) = hold_then_cut(locks, "z2c", set_mode)
    session = driver_of(locks, "z2c")._session
    entry = session.leases.get(lease.token)  # what a renewal batch in flight across the reconnect still holds
    assert entry is not None
    # while we are cut off: our node is deleted and another session creates a node at the very same path
    zk_raw.delete(path)
    zk_raw.create(path, b"stranger", ephemeral=True)
    stranger = zk_raw.exists(path)
    assert stranger is not None and stranger.ephemeralOwner != our_session
    set_mode("pass")
    assert lost.wait(lease.ttl + SLACK), "a lease whose path now holds another session's node was not lost"
    print(f"Z-2 (stranger's node): {lease.lost_reason}")
    assert lease.state is LeaseState.LOST and not lease.valid
    assert driver_of(locks, "z2c")._session.session_id() == our_session, "the session was meant to survive"
    # Such a batch then drops the lost entry, which deletes its node if it is still there: not the stranger's.
    session.leases.drop(entry)
    stat = zk_raw.exists(path)
    assert stat is not None and stat.czxid == stranger.czxid, "lockkit deleted a node another session created"


def test_z2_node_recreated_by_our_own_session_during_disconnect_is_not_restored(
    zookeeper_server: ZooKeeperServer,
    cut_session: Callable[[str], tuple[lockkit.Locker, Callable[[str], None]]],
    fault_proxy: ProxyFactory,
    zk_raw: KazooClient,
) -> None:
    # Our session id, but another node: the czxid, not the owner, tells it from our lock. A second client joins
    # our session (id and password, the Z-1 trick) through a proxy of its own, recreates the path, and drops
    # its connection without closing the session; then our client reconnects to the same session.
    locks, set_mode = cut_session("session_timeout=9")
    lease, lost, path, client_id = hold_then_cut(locks, "z2d", set_mode)
    our_session = client_id[0]
    ghost_proxy = fault_proxy(zookeeper_server)
    ghost = KazooClient(hosts=f"127.0.0.1:{ghost_proxy.port}", client_id=client_id, timeout=9)
    ghost.start(timeout=10)
    try:
        ghost.delete(path)
        ghost.create(path, b"same session, another node", ephemeral=True)
        ghost_proxy.set_mode("reset")  # the ghost is cut for good, without closing the session: ours takes it back
        stat = zk_raw.exists(path)
        assert stat is not None and stat.ephemeralOwner == our_session
        set_mode("pass")
        assert lost.wait(lease.ttl + SLACK), "a node recreated at our path (new czxid) was taken for our lock"
        print(f"Z-2 (our session's new node): {lease.lost_reason}")
        assert lease.state is LeaseState.LOST and not lease.valid
        assert driver_of(locks, "z2d")._session.session_id() == our_session
    finally:
        ghost.stop()  # closes our (old) session: the test is over
        ghost.close()


@pytest.mark.parametrize("timeout", [0.3, 1.5, 2.5])
def test_acquire_timeout_of_a_held_lock_on_a_healthy_server_is_a_timeout(
    zookeeper_server: ZooKeeperServer, timeout: float
) -> None:
    """Found by the model-based test (A-6): with a timeout above the connect grace, the re-check made at the
    deadline had no time left for its reply and was reported as an unreachable server."""
    name = f"held-{uuid.uuid4().hex[:8]}"
    with lockkit.connect(zookeeper_server.url) as holder, lockkit.connect(zookeeper_server.url) as other:
        lease = holder.lock(name, ttl=30).acquire(timeout=5)
        started = time.monotonic()
        with pytest.raises(lockkit.LockTimeout):
            other.lock(name, ttl=30).acquire(timeout=timeout)
        assert time.monotonic() - started >= timeout - 0.05
        assert lease.valid
        assert other.holder(name).waiters in (0, None), "the timed-out waiter left its node behind"
