"""E-8 (docs/reliability.md): an acquire against a paused etcd shares its deadline among its requests.

The etcd process the test started is SIGSTOPped (the kernel still accepts and acknowledges, so gRPC sees no
error, only silence). An acquire's requests (the session lease's grant or keepalive, the create transaction,
a sweep) each wait at most what is left of about max(T, 1 s), so ``acquire(timeout=T)`` and ``try_acquire()``
raise BackendUnavailable by about T (at least 1 s), not after one ``timeout`` per request. The bounds asserted
are liveness bounds with CI slack; the figures are printed.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable

import pytest

import lockkit
from backends.servers import EtcdServer
from lockkit import BackendUnavailable
from tests._timing import timed

SLACK = 2.0


def _name() -> str:
    return f"eu-{uuid.uuid4().hex[:10]}"


def test_e8_paused_etcd_acquire_shares_its_deadline(fresh_etcd: Callable[..., EtcdServer]) -> None:
    server = fresh_etcd()
    name = _name()
    with lockkit.connect(server.url) as locks:
        lock = locks.lock(name, ttl=10)
        first = lock.acquire(timeout=5)  # a session lease exists now
        lock.release()
        server.pause()
        try:
            took, exc = timed(lambda: locks.lock(name, ttl=10).try_acquire())
            print(f"E-8: try_acquire against a paused etcd: {type(exc).__name__} after {took:.2f} s")
            assert isinstance(exc, BackendUnavailable), exc
            assert took < 1.0 + SLACK
            took, exc = timed(lambda: locks.lock(name, ttl=10).acquire(timeout=0.2))
            print(f"E-8: acquire(timeout=0.2): {type(exc).__name__} after {took:.2f} s")
            assert isinstance(exc, BackendUnavailable), exc
            assert took < 1.0 + SLACK
            took, exc = timed(lambda: locks.lock(name, ttl=10).acquire(timeout=3))
            print(f"E-8: acquire(timeout=3): {type(exc).__name__} after {took:.2f} s")
            assert isinstance(exc, BackendUnavailable), exc
            assert took < 3.0 + SLACK
        finally:
            server.resume()
        # etcd answers again: the keys the failed attempts may have left are swept, and the lock is free.
        again = lock.acquire(timeout=15)
        assert again.fencing_token > first.fencing_token
        lock.release()


def test_e8_paused_etcd_try_acquire_bounded_async(fresh_etcd: Callable[..., EtcdServer]) -> None:
    server = fresh_etcd()
    name = _name()

    async def main() -> None:
        async with lockkit.connect_async(server.url) as locks:
            lock = locks.lock(name, ttl=10)
            await lock.acquire(timeout=5)
            await lock.release()
            server.pause()
            try:
                started = time.monotonic()
                with pytest.raises(BackendUnavailable):
                    await locks.lock(name, ttl=10).try_acquire()
                took = time.monotonic() - started
                print(f"E-8: async try_acquire against a paused etcd: BackendUnavailable after {took:.2f} s")
                assert took < 1.0 + SLACK
            finally:
                server.resume()

    asyncio.run(main())


def test_e8_paused_etcd_semaphore_try_acquire_bounded(fresh_etcd: Callable[..., EtcdServer]) -> None:
    server = fresh_etcd()
    name = _name()
    with lockkit.connect(server.url) as locks:
        semaphore = locks.semaphore(name, limit=2, ttl=10)
        semaphore.acquire(timeout=5)
        semaphore.release()
        server.pause()
        try:
            took, exc = timed(lambda: locks.semaphore(name, limit=2, ttl=10).try_acquire())
            print(f"E-8: semaphore try_acquire against a paused etcd: {type(exc).__name__} after {took:.2f} s")
            assert isinstance(exc, BackendUnavailable), exc
            assert took < 1.0 + SLACK
        finally:
            server.resume()
