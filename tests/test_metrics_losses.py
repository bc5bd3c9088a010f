"""A lost lease counts once in ``losses``, whatever ended it; a refused renewal is a loss, not a renewal failure.

The "any lost lock" alert (monitoring/lockkit.rules.yml) is only as good as this count.
"""

from __future__ import annotations

import threading
import time

import pytest

import lockkit
from backends.pytest_fixtures import RedisFactory


def wait_for(event: threading.Event, what: str) -> None:
    assert event.wait(10), f"timed out waiting for {what}"


def test_closing_a_locker_counts_what_it_released_and_what_it_lost() -> None:
    locks = lockkit.connect("memory://losses-close")
    first, second = locks.lock("a", ttl=30).acquire(), locks.lock("b", ttl=30, auto_renew=False).acquire()
    with lockkit.connect("memory://losses-close") as admin:
        admin.force_release("b")  # taken away before the close: close() finds it gone, a loss
        locks.close()
    assert not first.valid and not second.valid
    stats = locks.stats()["default"]
    assert stats["releases"] == 1  # close() released "a" (tests/test_close.py)
    assert stats["losses"] == 1  # and "b", counted once


def test_a_forced_release_is_a_loss_not_a_renewal_failure() -> None:
    lost = threading.Event()
    with lockkit.connect("memory://losses-forced") as locks:
        lock = locks.lock("f", ttl=0.6, on_lost=lambda lease: lost.set())
        lock.acquire()
        assert locks.force_release("f")
        wait_for(lost, "the renewal to find the lock gone")  # a third of the TTL later
        with pytest.raises(lockkit.LockNotOwned):
            lock.release()  # the server no longer holds our token: the same loss, not a second one
        stats = locks.stats()["default"]
    assert stats["losses"] == 1
    assert stats["renewal_failures"] == 0


def test_a_direct_renew_refused_counts_one_loss() -> None:
    with lockkit.connect("memory://losses-renew") as locks:
        lock = locks.lock("r", ttl=30)
        lock.acquire()
        locks.force_release("r")
        with pytest.raises(lockkit.LockLost):
            lock.renew()
        with pytest.raises(lockkit.LockLost):
            lock.renew()  # already lost: nothing new
        stats = locks.stats()["default"]
    assert stats["losses"] == 1 and stats["renewal_failures"] == 0


def test_a_lease_that_ran_out_counts_once_however_it_is_found() -> None:
    """The deadline passes (the scheduler marks it lost), then the release finds the token gone too."""
    lost = threading.Event()
    with lockkit.connect("memory://losses-expired") as locks:
        lock = locks.lock("e", ttl=0.05, auto_renew=False, on_lost=lambda lease: lost.set())
        lock.acquire()
        wait_for(lost, "the lease's deadline")
        time.sleep(0.05)  # past the server's TTL too
        with pytest.raises(lockkit.LockNotOwned):
            lock.release()
        stats = locks.stats()["default"]
    assert stats["losses"] == 1


def test_a_release_that_finds_the_token_gone_is_a_loss() -> None:
    """Taken away and not noticed before the release (no renewal ran): the release is where it is found."""
    with lockkit.connect("memory://losses-release") as locks:
        lock = locks.lock("g", ttl=30)
        lock.acquire()
        locks.force_release("g")
        with pytest.raises(lockkit.LockNotOwned):
            lock.release()
        stats = locks.stats()["default"]
    assert stats["losses"] == 1 and stats["releases"] == 0


def test_session_events_count_a_loss_once() -> None:
    """A session-bound driver may report one lease lost more than once (and before it is tracked)."""
    with lockkit.connect("memory://losses-session") as locks:
        lease = locks.lock("s", ttl=30).acquire()
        backend = locks.backend_for("s")
        backend.lost(lease.token, "the session expired")
        backend.lost(lease.token, "the session expired")
        backend.lost("not-tracked-yet", "the session expired")  # kept until tracked; nothing to count yet
        stats = locks.stats()["default"]
    assert not lease.valid
    assert stats["losses"] == 1


def test_prometheus_counts_the_loss_to_close() -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    labels = {"backend": "losses-prom"}

    def sample(name: str) -> float:
        return prometheus_client.REGISTRY.get_sample_value(name, labels) or 0.0

    lost, released = sample("lockkit_losses_total"), sample("lockkit_releases_total")
    locks = lockkit.from_config({"backends": {"losses-prom": {"url": "memory://losses-prom"}}})
    locks.lock("p", ttl=30).acquire()
    locks.lock("q", ttl=30, auto_renew=False).acquire()
    with lockkit.connect("memory://losses-prom") as admin:
        admin.force_release("q")
        locks.close()
    assert sample("lockkit_losses_total") == lost + 1  # "q", found gone at close
    assert sample("lockkit_releases_total") == released + 1  # "p", released by close


def test_a_lock_released_by_close_is_observed_like_any_release() -> None:
    """docs/metrics.md: ``lockkit_hold_seconds`` is the time from acquiring a lock to releasing it; one that
    close() released counts there as a ``with`` block's does (it counted in releases and ttl_used only)."""
    locks = lockkit.connect("memory://observed-close")
    locks.lock("a", ttl=30).acquire()
    locks.close()
    stats = locks.stats()["default"]
    assert stats["releases"] == 1
    assert stats["hold_seconds"]["count"] == 1
    assert stats["ttl_used_ratio"]["count"] == 1


def test_a_lease_lost_to_close_is_not_observed(fresh_redis: RedisFactory) -> None:
    """docs/metrics.md: leases lost to close() are never released, so they are not observed. The server is
    paused, so the release at close fails; it used to add a ttl_used sample all the same."""
    server = fresh_redis()
    locks = lockkit.connect(f"{server.url}?timeout=0.5")
    lease = locks.lock("a", ttl=30, auto_renew=False).acquire()
    server.pause()
    try:
        locks.close()
    finally:
        server.resume()
    assert not lease.valid
    stats = locks.stats()["default"]
    assert stats["losses"] == 1 and stats["releases"] == 0
    assert stats["hold_seconds"]["count"] == 0
    assert stats["ttl_used_ratio"]["count"] == 0
