"""P-9 (docs/reliability.md): a PostgreSQL server that accepts TCP but answers nothing gets bounded calls.

Every postgres process the test started is SIGSTOPped (the postmaster and its backends: the kernel still
accepts connections and acknowledges bytes, so TCP keepalives and ``tcp_user_timeout`` never fire), or a
FaultProxy the test owns is switched to blackhole. The bounds asserted are liveness bounds with CI slack;
the figures are printed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import lockkit
from backends.servers import PostgresServer
from lockkit import BackendUnavailable, LockLost
from tests._timing import timed

SLACK = 2.0


def _name() -> str:
    return f"pu-{uuid.uuid4().hex[:10]}"


def _children(pid: int) -> list[int]:
    """The direct children of ``pid`` (the postmaster's backends and workers), read from /proc."""
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == pid:
                found.append(int(entry.name))
    return found


@contextlib.contextmanager
def paused(server: PostgresServer) -> Iterator[None]:
    """SIGSTOP the server's postmaster (first: it forks no new backend) and every backend it started."""
    pids = [server.pid]
    os.kill(server.pid, signal.SIGSTOP)
    try:
        pids += _children(server.pid)
        for pid in pids[1:]:
            os.kill(pid, signal.SIGSTOP)
        yield
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def test_p9_paused_server_acquire_is_bounded(fresh_postgres: Callable[..., PostgresServer]) -> None:
    server = fresh_postgres()
    name = _name()
    with lockkit.connect(server.url) as locks:
        lock = locks.lock(name, ttl=30)
        first = lock.acquire(timeout=5)  # the driver has a live session now
        lock.release()
        with paused(server):
            took, exc = timed(lambda: locks.lock(name).try_acquire())
            print(f"P-9: try_acquire against a paused server: {type(exc).__name__} after {took:.2f} s")
            assert isinstance(exc, BackendUnavailable), exc
            assert took < 1.0 + SLACK
            took, exc = timed(lambda: locks.lock(name).acquire(timeout=0.2))
            print(f"P-9: acquire(timeout=0.2): {type(exc).__name__} after {took:.2f} s")
            assert isinstance(exc, BackendUnavailable), exc
            assert took < 1.0 + SLACK
            took, exc = timed(lambda: locks.lock(name).acquire(timeout=3))
            print(f"P-9: acquire(timeout=3): {type(exc).__name__} after {took:.2f} s")
            assert isinstance(exc, BackendUnavailable), exc
            assert took < 3.0 + SLACK
        # The server runs again: the cut sessions are gone and nothing they sent is read as a later call's.
        again = lock.acquire(timeout=10)
        assert again.valid and again.fencing_token > first.fencing_token
        assert locks.holder(name).fencing_token == again.fencing_token
        lock.release()


def test_p9_paused_server_release_renew_holder_bounded(fresh_postgres: Callable[..., PostgresServer]) -> None:
    server = fresh_postgres()
    url = server.url + "?timeout=1"
    # Three lockers (three drivers, sessions of their own): a call cut on one session ends only its leases.
    with lockkit.connect(url) as renewing, lockkit.connect(url) as releasing, lockkit.connect(url) as asking:
        renewed, released = renewing.lock(_name(), ttl=4), releasing.lock(_name(), ttl=4)
        leases = [renewed.acquire(timeout=5), released.acquire(timeout=5)]
        asking.holder(renewed.name)
        with paused(server):
            took, exc = timed(renewed.renew)
            print(f"P-9: renew(): {type(exc).__name__} after {took:.2f} s")
            assert isinstance(exc, (BackendUnavailable, LockLost)), exc
            assert took < 1.0 + SLACK
            took, exc = timed(released.release)
            print(f"P-9: release(): {type(exc).__name__}: {exc} after {took:.2f} s")
            assert took < 1.0 + SLACK
            took, exc = timed(lambda: asking.holder(renewed.name))
            print(f"P-9: holder(): {type(exc).__name__} after {took:.2f} s")
            assert isinstance(exc, BackendUnavailable), exc
            assert took < 1.0 + SLACK
            assert not any(lease.valid for lease in leases)
        # Their sessions were cut: they end at the leases' deadlines, when another client gets the locks.
        with lockkit.connect(server.url) as other:
            for lease in leases:
                other_lock = other.lock(lease.name, ttl=30)
                assert other_lock.acquire(timeout=15).fencing_token > lease.fencing_token
                assert time.monotonic() >= lease.expires_at
                other_lock.release()


def test_p9_paused_server_try_acquire_bounded_async(fresh_postgres: Callable[..., PostgresServer]) -> None:
    server = fresh_postgres()
    name = _name()

    async def main() -> None:
        async with lockkit.connect_async(server.url) as locks:
            lock = locks.lock(name, ttl=30)
            first = await lock.acquire(timeout=5)
            await lock.release()
            with paused(server):
                started = time.monotonic()
                with pytest.raises(BackendUnavailable):
                    await locks.lock(name).try_acquire()
                took = time.monotonic() - started
                print(f"P-9: async try_acquire against a paused server: BackendUnavailable after {took:.2f} s")
                assert took < 1.0 + SLACK
                started = time.monotonic()
                with pytest.raises(BackendUnavailable):
                    await locks.lock(name).acquire(timeout=3)
                took = time.monotonic() - started
                print(f"P-9: async acquire(timeout=3): BackendUnavailable after {took:.2f} s")
                assert took < 3.0 + SLACK
            again = await lock.acquire(timeout=10)
            assert again.fencing_token > first.fencing_token
            await lock.release()

    asyncio.run(main())


def test_p9_blackholed_proxy_try_acquire_bounded(postgres_server: PostgresServer, fault_proxy) -> None:  # type: ignore[no-untyped-def]
    proxy = fault_proxy(postgres_server)
    name = _name()
    url = postgres_server.url.replace(f":{postgres_server.port}/", f":{proxy.port}/")
    with lockkit.connect(url) as locks, lockkit.connect(postgres_server.url) as direct:
        warm = locks.lock(name, ttl=30)
        warm.acquire(timeout=5)
        warm.release()
        proxy.set_mode("blackhole")
        try:
            took, exc = timed(lambda: locks.lock(name, ttl=30).try_acquire())
            print(f"P-9: try_acquire through a blackhole: {type(exc).__name__} after {took:.2f} s")
            assert isinstance(exc, BackendUnavailable), exc
            assert took < 1.0 + SLACK
        finally:
            proxy.heal()
        # Whatever the server did with the cut statement, no lease of ours came of it: a late grant dies with
        # its session, so the lock is free (or becomes free) for another client.
        other_lock = direct.lock(name, ttl=30)
        other = other_lock.acquire(timeout=10)
        again_lock = locks.lock(name, ttl=30)
        assert again_lock.try_acquire() is None
        other_lock.release()
        again = again_lock.acquire(timeout=10)
        assert again.valid and again.fencing_token > other.fencing_token
        again_lock.release()


def test_p9_cut_session_keeps_its_locks_until_their_deadline(fresh_postgres: Callable[..., PostgresServer]) -> None:
    # A renewal cut for want of an answer must not end the session before the lease's deadline: a server that
    # answers again meanwhile would hand the lock to another client while the holder may still trust it.
    server = fresh_postgres()
    name = _name()
    with lockkit.connect(server.url + "?timeout=1") as locks, lockkit.connect(server.url) as other:
        lock = locks.lock(name, ttl=6, auto_renew=False)
        lease = lock.acquire(timeout=5)
        with paused(server):
            took, exc = timed(lock.renew)
            print(f"P-9: renew() of a ttl-6 lease: {type(exc).__name__} after {took:.2f} s")
            assert isinstance(exc, (BackendUnavailable, LockLost)), exc
        # The server runs again well before the lease's deadline: the lock stays held until then.
        while time.monotonic() < lease.expires_at - 0.3:
            assert other.lock(name).try_acquire() is None, "the lock was freed before the holder's deadline"
            time.sleep(0.1)
        other_lock = other.lock(name, ttl=30)
        second = other_lock.acquire(timeout=10)
        print(f"P-9: another client got the lock {time.monotonic() - lease.expires_at:+.2f} s after the deadline")
        assert time.monotonic() >= lease.expires_at
        assert second.fencing_token > lease.fencing_token
        other_lock.release()


def test_p9_paused_server_semaphore_try_acquire_bounded(fresh_postgres: Callable[..., PostgresServer]) -> None:
    server = fresh_postgres()
    name = _name()
    with lockkit.connect(server.url) as locks:
        semaphore = locks.semaphore(name, limit=2, ttl=10)
        semaphore.acquire(timeout=5)
        semaphore.release()
        with paused(server):
            took, exc = timed(lambda: locks.semaphore(name, limit=2, ttl=10).try_acquire())
            print(f"P-9: semaphore try_acquire against a paused server: {type(exc).__name__} after {took:.2f} s")
            assert isinstance(exc, BackendUnavailable), exc
            assert took < 1.0 + SLACK
        again = locks.semaphore(name, limit=2, ttl=10)
        assert again.acquire(timeout=10).valid
        again.release()
