"""An etcd release abandoned half-way must not leave its key held for good (issue 12, case 4; scenario A-2).

Every lock of one client hangs on one shared session lease, kept alive by the client's other locks (renewal
rounds) and waiters (their keepalives). A key whose release did not complete therefore stays held for as long
as anything else of the client is alive, unless the driver deletes it itself: it records the key as an orphan
and deletes it, guarded on its create_revision, at the next sweep.

Real servers, real faults: ``FaultProxy`` between the client and etcd, a real SIGINT (Ctrl-C) delivered while
the release blocks. Bounds are liveness bounds with generous slack.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable

import pytest

import lockkit
from backends.pytest_fixtures import ProxyFactory
from backends.servers import EtcdServer
from lockkit.drivers.etcd.client import EtcdClient
from lockkit.drivers.etcd.keys import name_range
from lockkit.drivers.etcd.session import Sessions
from lockkit.testing import FakeClock

LESSOR_TICK = 0.5  # etcd revokes expired leases on a 500 ms tick
SLACK = 1.0  # generous: the client's gRPC channel reconnects (with backoff) after the proxy resets it


def _name() -> str:
    return f"rel-{uuid.uuid4().hex[:10]}"


def _free_within(url: str, name: str, ttl: float, bound: float) -> float | None:
    """How long a second client waited for ``name`` (None: not within ``bound``)."""
    started = time.monotonic()
    with lockkit.connect(url) as other:
        try:
            lease = other.lock(name, ttl=ttl).acquire(timeout=bound)
        except lockkit.LockTimeout:
            return None
        waited = time.monotonic() - started
        assert lease.valid
        return waited


def test_A2_etcd_failed_release_beside_a_renewed_lock_is_swept(
    etcd_server: EtcdServer, fault_proxy: ProxyFactory
) -> None:
    """The plain case (a regression test: it passed before too): the release fails, another lock renews."""
    proxy = fault_proxy(etcd_server)
    name = _name()
    with lockkit.connect(f"etcd://127.0.0.1:{proxy.port}?timeout=1") as locks:
        kept = locks.lock(_name(), ttl=3).acquire(timeout=5)
        victim = locks.lock(name, ttl=3)
        ttl = victim.acquire(timeout=5).ttl
        proxy.set_mode("reset")  # the delete never reaches etcd
        with pytest.raises(lockkit.BackendUnavailable):
            victim.release()
        proxy.heal()
        waited = _free_within(etcd_server.url, name, ttl, 2 * ttl + LESSOR_TICK + SLACK)
        print(f"A-2 (failed release, a renewed lock beside it): acquired after {waited} s (ttl {ttl:g} s)")
        assert waited is not None, "the failed release's key stayed held on the shared session lease"
        assert kept.valid


def test_A2_etcd_abandoned_release_does_not_hold_the_lock_forever(
    etcd_server: EtcdServer, fault_proxy: ProxyFactory
) -> None:
    """A release interrupted by Ctrl-C while etcd does not answer, on a client that keeps another lock renewed."""
    proxy = fault_proxy(etcd_server)
    name = _name()
    with lockkit.connect(f"etcd://127.0.0.1:{proxy.port}?timeout=3") as locks:
        kept = locks.lock(_name(), ttl=3).acquire(timeout=5)  # renewed all along: keeps the session lease alive
        victim = locks.lock(name, ttl=3)
        lease = victim.acquire(timeout=5)
        ttl = lease.ttl
        proxy.set_mode("blackhole")
        # A real SIGINT to this (the main) thread while the release blocks. The handler raises Ctrl-C's
        # KeyboardInterrupt only inside the release, so a late signal cannot interrupt the test run itself.
        releasing = threading.Event()

        def ctrl_c(signum: int, frame: object) -> None:
            if releasing.is_set():
                raise KeyboardInterrupt

        previous = signal.signal(signal.SIGINT, ctrl_c)
        main = threading.get_ident()
        interrupt = threading.Timer(0.5, lambda: signal.pthread_kill(main, signal.SIGINT))
        try:
            releasing.set()
            interrupt.start()
            with pytest.raises(KeyboardInterrupt):
                victim.release()  # blocks (etcd unreachable) until Ctrl-C interrupts it
        finally:
            releasing.clear()
            interrupt.cancel()
            signal.signal(signal.SIGINT, previous)
        proxy.reset_all()  # drop the delete still waiting in the proxy's buffers: it never reaches etcd
        proxy.heal()
        healed = time.monotonic()
        waited = _free_within(etcd_server.url, name, ttl, 2 * ttl + LESSOR_TICK + SLACK)
        print(f"A-2 (interrupted release): a second client acquired after {waited} s (granted ttl {ttl:g} s)")
        assert waited is not None, "the interrupted release's key stayed held on the shared session lease"
        assert kept.valid, "the client's other lock should have survived (its session lease was never lost)"
        assert not lease.valid, "the interrupted release's lease still says valid although its lock was freed"
        print(f"freed {time.monotonic() - healed:.3f} s after the proxy healed")


def test_A2_etcd_failed_release_is_cleaned_up_while_only_waiters_keep_the_session_alive(
    etcd_server: EtcdServer, fault_proxy: ProxyFactory
) -> None:
    """A release that fails (BackendUnavailable) on a client whose only other activity is a blocked waiter."""
    proxy = fault_proxy(etcd_server)
    name, busy = _name(), _name()
    with (
        lockkit.connect(etcd_server.url) as holder,
        lockkit.connect(f"etcd://127.0.0.1:{proxy.port}?timeout=1") as locks,
    ):
        blocker = holder.lock(busy, ttl=3)
        blocker.acquire(timeout=5)
        victim = locks.lock(name, ttl=3)
        ttl = victim.acquire(timeout=5).ttl
        got: list[lockkit.Lease] = []
        waiter_lock = locks.lock(busy, ttl=3)
        waiter = threading.Thread(target=lambda: got.append(waiter_lock.acquire(timeout=30)))
        waiter.start()  # its keepalives (every ttl/2) keep the client's session lease alive from now on
        try:
            time.sleep(0.3)
            proxy.set_mode("reset")
            with pytest.raises(lockkit.BackendUnavailable):
                victim.release()
            proxy.heal()
            waited = _free_within(etcd_server.url, name, ttl, 2 * ttl + LESSOR_TICK + SLACK)
            print(f"A-2 (failed release, a waiter keeps the lease): acquired after {waited} s (ttl {ttl:g} s)")
            assert waited is not None, "the failed release's key stayed held while the client's waiter waited"
        finally:
            blocker.release()
            waiter.join(30)
        assert got and got[0].valid, "the waiter should have got its lock once the holder released"
        waiter_lock.release()


def _ctl(server: EtcdServer, *args: str, user: str | None = "root:rootpw") -> None:
    argv = ["etcdctl", *(["--user", user] if user else []), *args]
    subprocess.run(argv, env=server.etcdctl_env(), capture_output=True, text=True, check=True, timeout=15)


def test_A2_etcd_orphan_that_cannot_be_deleted_costs_the_session_lease(
    fresh_etcd, fault_proxy: ProxyFactory  # type: ignore[no-untyped-def]
) -> None:
    """The worst case: the orphan's delete keeps being refused while keepalives succeed (here an operator
    narrowed the role's write permission to the other lock's name). The driver gives the shared lease up
    rather than keep the orphan held by it for good: the other lock is reported lost, the orphan expires."""
    server = fresh_etcd()
    name, keep = _name(), _name()
    for args in (
        ("user", "add", "root:rootpw", "--interactive=false"),
        ("role", "add", "root"),
        ("user", "grant-role", "root", "root"),
        ("role", "add", "lockkit"),
        ("role", "grant-permission", "--prefix=true", "lockkit", "readwrite", "/lockkit/"),
        ("user", "add", "lk:lk-pw", "--interactive=false"),
        ("user", "grant-role", "lk", "lockkit"),
    ):
        _ctl(server, *args, user=None)
    _ctl(server, "auth", "enable", user=None)
    proxy = fault_proxy(server)
    lost = threading.Event()
    with lockkit.connect(f"etcd://lk:lk-pw@127.0.0.1:{proxy.port}?timeout=1") as locks:
        kept = locks.lock(keep, ttl=3, on_lost=lambda _: lost.set()).acquire(timeout=5)
        victim = locks.lock(name, ttl=3)
        ttl = victim.acquire(timeout=5).ttl
        proxy.set_mode("reset")
        with pytest.raises(lockkit.BackendUnavailable):
            victim.release()
        # the role may now write only the kept lock's keys: the orphan's delete is refused from here on
        _ctl(server, "role", "revoke-permission", "lockkit", "/lockkit/", "--prefix=true")
        _ctl(server, "role", "grant-permission", "--prefix=true", "lockkit", "read", "/lockkit/")
        start, _ = name_range("/lockkit/", keep)
        _ctl(server, "role", "grant-permission", "--prefix=true", "lockkit", "readwrite", start.decode())
        proxy.heal()
        waited = _free_within(f"etcd://root:rootpw@127.0.0.1:{server.port}", name, ttl,
                              3 * ttl + LESSOR_TICK + SLACK)
        print(f"A-2 (undeletable orphan): acquired after {waited} s (ttl {ttl:g} s)")
        assert waited is not None, "an orphan that could not be deleted stayed held by the shared session lease"
        assert lost.wait(5) and not kept.valid, "giving the session lease up must report its other locks lost"


def test_A2_etcd_orphan_never_tried_does_not_cost_its_session_lease(
    fresh_etcd, fault_proxy: ProxyFactory  # type: ignore[no-untyped-def]
) -> None:
    """Two orphans on two session leases (ttl 3 and ttl 4); etcd refuses the first one's delete for good.

    The sweep stops at the first failure (etcd may be unreachable: every further delete would wait a timeout).
    The orphan behind it was never tried, so it must neither cost its lease (the ttl-4 session's other lock
    stays valid) nor wait behind the refused one for ever: a later sweep deletes it. The refused orphan's own
    lease is given up, as documented (see the test above)."""
    server = fresh_etcd()
    refused, swept, keep_a, keep_b = _name(), _name(), _name(), _name()
    for args in (
        ("user", "add", "root:rootpw", "--interactive=false"),
        ("role", "add", "root"),
        ("user", "grant-role", "root", "root"),
        ("role", "add", "lockkit"),
        ("role", "grant-permission", "--prefix=true", "lockkit", "readwrite", "/lockkit/"),
        ("user", "add", "lk:lk-pw", "--interactive=false"),
        ("user", "grant-role", "lk", "lockkit"),
    ):
        _ctl(server, *args, user=None)
    _ctl(server, "auth", "enable", user=None)
    proxy = fault_proxy(server)
    lost_a, lost_b = threading.Event(), threading.Event()
    with lockkit.connect(f"etcd://lk:lk-pw@127.0.0.1:{proxy.port}?timeout=1") as locks:
        kept_a = locks.lock(keep_a, ttl=3, on_lost=lambda _: lost_a.set()).acquire(timeout=5)
        kept_b = locks.lock(keep_b, ttl=4, on_lost=lambda _: lost_b.set()).acquire(timeout=5)
        first, second = locks.lock(refused, ttl=3), locks.lock(swept, ttl=4)
        first.acquire(timeout=5)
        ttl_b = second.acquire(timeout=5).ttl
        proxy.set_mode("reset")
        for victim in (first, second):  # orphaned in this order: the refused one first
            with pytest.raises(lockkit.BackendUnavailable):
                victim.release()
        orphaned = time.monotonic()
        # from here on the role may write every name but the first orphan's
        _ctl(server, "role", "revoke-permission", "lockkit", "/lockkit/", "--prefix=true")
        _ctl(server, "role", "grant-permission", "--prefix=true", "lockkit", "read", "/lockkit/")
        for name in (keep_a, keep_b, swept):
            start, _ = name_range("/lockkit/", name)
            _ctl(server, "role", "grant-permission", "--prefix=true", "lockkit", "readwrite", start.decode())
        proxy.heal()
        root = f"etcd://root:rootpw@127.0.0.1:{server.port}"
        waited = _free_within(root, swept, ttl_b, 2 * ttl_b + LESSOR_TICK + SLACK)
        print(f"A-2 (orphan behind a refused one): acquired after {waited} s (ttl {ttl_b:g} s)")
        assert waited is not None, "the orphan behind a refused one was never deleted"
        assert lost_a.wait(3 * 3 + SLACK), "the refused orphan's own lease should have been given up"
        time.sleep(max(0.0, orphaned + 2 * ttl_b + SLACK - time.monotonic()))  # well past the ttl-4 lease's TTL
        assert not lost_b.is_set() and kept_b.valid, "a lease was given up over an orphan it never tried to delete"
        assert not kept_a.valid


class _Lost:
    """Session-lease events as the driver reports them: which tokens were lost."""

    def __init__(self) -> None:
        self.reasons: list[str] = []

    def lost(self, token: str, reason: str) -> None:
        self.reasons.append(reason)

    def uncertain(self, token: str, reason: str) -> None:
        pass

    def restored(self, token: str) -> None:
        pass


def test_A2_etcd_orphan_clock_starts_at_its_first_refused_delete(
    etcd_server: EtcdServer, fault_proxy: ProxyFactory
) -> None:
    """An orphan that waited untried for more than a TTL, while keepalives succeeded, then fails one delete
    (a blip): the lease is kept. Only deletes that keep failing for a whole TTL from the first refusal cost it.

    Before, the clock started when the key was orphaned, so that first failed delete gave the lease up and
    reported every other lock on it lost over a single refused request."""
    proxy = fault_proxy(etcd_server)
    clock, events = FakeClock(1000.0), _Lost()
    client = EtcdClient([("127.0.0.1", proxy.port)], timeout=1.0)
    sessions = Sessions(client, clock, events)
    try:
        session = sessions.get(3)
        session.tokens.add("other-lock")
        sessions.orphan(session, f"/release-edges/{_name()}".encode(), value=b"ours")
        clock.advance(session.ttl + 1.0)  # untried for more than a TTL (no sweep came) ...
        assert sessions.refresh(session, 0)  # ... while the lease's keepalives succeed
        proxy.set_mode("reset")
        sessions.sweep()  # the first try of its delete fails
        assert not session.dead and not events.reasons, f"one failed delete cost the lease: {events.reasons}"
        assert sessions.has_orphans, "the refused orphan must be kept for the next sweep"
        proxy.heal()
        clock.advance(session.ttl + 1.0)  # refused since a whole TTL, keepalives going on
        assert _eventually(lambda: sessions.refresh(session, 0)), "the keepalive never got through after heal"
        proxy.set_mode("reset")
        sessions.sweep()
        assert session.dead and events.reasons, "an orphan refused for a whole TTL must cost its lease"
    finally:
        proxy.heal()
        sessions.close()
        client.close()


def _eventually(attempt: Callable[[], bool], within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if attempt():
                return True
        except lockkit.BackendUnavailable:
            pass
        time.sleep(0.1)
    return False
