"""The shared renewal scheduler: one thread, batches per backend, loss on time."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid

import pytest

import lockkit
from lockkit.renewal import RenewalBook, scheduler
from lockkit.testing import FakeClock


def _threads() -> set[str]:
    return {t.name for t in threading.enumerate()}


def test_many_locks_one_scheduler_thread() -> None:
    with lockkit.connect("memory://renew-many") as locks:
        held = [locks.lock(f"n{i}", ttl=0.6) for i in range(500)]
        for lock in held:
            lock.acquire()
        time.sleep(1.5)  # 2.5 TTLs: every lease survives only through renewal
        assert all(lock.owned() for lock in held)
        names = [t for t in _threads() if t.startswith("lockkit")]
        assert names.count("lockkit-renewal") == 1
        assert len(names) <= 5, names  # the renewal thread + at most 4 pool workers, not one per lock
        assert locks.stats()["default"]["renewals"] >= 500
        for lock in held:
            lock.release()


def test_max_hold_stops_renewal_and_reports_loss() -> None:
    lost = threading.Event()
    with lockkit.connect("memory://max-hold") as locks:
        lock = locks.lock("capped", ttl=0.3, max_hold=0.5, on_lost=lambda lease: lost.set())
        started = time.monotonic()
        lease = lock.acquire()
        assert lost.wait(3)
        held_for = time.monotonic() - started
        assert 0.5 <= held_for <= 0.5 + 0.3 + 0.5
        assert "max_hold" in (lease.lost_reason or "")


def test_auto_renew_off_fires_on_lost_at_the_deadline() -> None:
    lost = threading.Event()
    with lockkit.connect("memory://no-renew") as locks:
        lease = locks.lock("short", ttl=0.2, auto_renew=False, on_lost=lambda lease: lost.set()).acquire()
        assert lost.wait(2)
        assert time.monotonic() >= lease.expires_at


def test_book_batches_and_coalesces() -> None:
    clock = FakeClock(0.0)
    with lockkit.connect(f"memory://book-{uuid.uuid4().hex[:8]}", clock=clock) as locks:
        leases = [locks.lock(f"b{i}", ttl=3, auto_renew=False).acquire() for i in range(3)]
        backend = locks.backend_for("b0")
        book = RenewalBook(clock)
        for lease in leases:
            book.add(lease, backend, 3, True, None)
        assert book.next_wakeup() == 1.0  # ttl/3
        clock.set(0.75)  # within the coalescing window (ttl/10) of the due time
        batches, expired = book.take_due(clock.now)
        assert list(batches) == [backend] and len(batches[backend]) == 3 and not expired
        results = backend.driver.renew_many(
            [
                lockkit.driver.RenewRequest(e.lease.name, e.lease.token, 3)  # type: ignore[attr-defined]
                for e in batches[backend]
            ]
        )
        book.apply(batches[backend], results)
        assert all(lease.expires_at > 3 for lease in leases)
        clock.set(100.0)
        _, expired = book.take_due(clock.now)
        book.expire(expired)
        assert len(expired) == 3 and all(lease.lost_reason for lease in leases)


def test_scheduler_is_per_process_and_clock() -> None:
    assert scheduler(time.monotonic) is scheduler(time.monotonic)
    assert scheduler(FakeClock(0.0)) is not scheduler(time.monotonic)


def test_book_does_not_spin_while_a_batch_is_in_flight() -> None:
    clock = FakeClock(0.0)
    with lockkit.connect(f"memory://book-busy-{uuid.uuid4().hex[:8]}", clock=clock) as locks:
        leases = [locks.lock(f"s{i}", ttl=3, auto_renew=False).acquire() for i in range(2)]
        backend = locks.backend_for("s0")
        book = RenewalBook(clock)
        book.add(leases[0], backend, 3, True, None)
        clock.set(0.95)
        _batches, _ = book.take_due(clock.now)  # s0 goes in flight
        book.add(leases[1], backend, 3, True, None)  # due at once, but its backend is busy
        clock.set(1.5)
        assert book.take_due(clock.now) == ({}, [])
        # only the deadlines remain to wake for: the batch's completion wakes the scheduler for the rest
        assert book.next_wakeup() == min(lease.expires_at for lease in leases)


def test_a_renewal_landing_after_release_does_not_fire_on_lost() -> None:
    clock = FakeClock(0.0)
    fired: list[str] = []
    with lockkit.connect(f"memory://book-release-{uuid.uuid4().hex[:8]}", clock=clock) as locks:
        lock = locks.lock("r", ttl=3, auto_renew=False, on_lost=lambda lease: fired.append(lease.name))
        lease = lock.acquire()
        backend = locks.backend_for("r")
        book = RenewalBook(clock)
        book.add(lease, backend, 3, True, None)
        clock.set(1.0)
        batches, _ = book.take_due(clock.now)
        book.remove(lease)  # what Lock.release does before the driver call
        lock.release()
        book.apply(batches[backend], [None])  # the in-flight renewal finds the key gone
        assert fired == [] and lease.state.value == "released"


def test_on_lost_may_release_and_acquire_locks_from_the_renewal_thread() -> None:
    """A loss found by a renewal runs the user's on_lost on the scheduler's thread: it may use lockkit there."""
    done = threading.Event()
    with lockkit.connect("memory://on-lost-reentry") as locks:
        other = locks.lock("other", ttl=5)
        other.acquire()
        victim: lockkit.Lock

        def on_lost(lease: lockkit.Lease) -> None:
            other.release()  # removes a lease from the scheduler
            with locks.lock("again", ttl=5):  # adds one, and removes it
                pass
            with contextlib.suppress(lockkit.LockError):
                victim.release()
            done.set()

        victim = locks.lock("victim", ttl=0.3, on_lost=on_lost)
        victim.acquire()
        assert locks.force_release("victim")  # the next renewal finds it gone
        assert done.wait(3), "on_lost did not finish: the renewal thread is stuck"
        with locks.lock("after", ttl=5):  # and the scheduler still takes new leases
            pass


def test_A1_retune_moves_the_deadline_watch_and_the_renewal_pace_to_the_new_ttl() -> None:
    """After renew(ttl=1) on a 30 s lease the book watches the new deadline and renews every ~1/3 s."""
    clock = FakeClock(0.0)
    with lockkit.connect(f"memory://book-retune-{uuid.uuid4().hex[:8]}", clock=clock) as locks:
        lock = locks.lock("t", ttl=30, auto_renew=False)
        lease = lock.acquire()
        backend = locks.backend_for("t")
        book = RenewalBook(clock)
        book.add(lease, backend, 30, True, None)
        assert book.next_wakeup() == 10.0
        clock.set(1.0)
        grant = backend.driver.renew("t", lease.token, 1)
        assert lease.extend(grant.sent_at, grant.ttl)
        book.retune(lease, 1)
        assert book.next_wakeup() == pytest.approx(lease.expires_at - 2 / 3)  # a third of the new ttl after its send
        clock.set(1.4)
        batches, _ = book.take_due(clock.now)
        assert [e.requested_ttl for e in batches[backend]] == [1]
        book.apply(batches[backend], [None])  # say the server lost it: the book must not wait 30 s to tell
        assert lease.state.value == "lost"


def test_A1_a_batch_reply_landing_after_a_shorter_direct_renew_cannot_lengthen_the_lease() -> None:
    clock = FakeClock(0.0)
    with lockkit.connect(f"memory://book-overlap-{uuid.uuid4().hex[:8]}", clock=clock) as locks:
        lock = locks.lock("o", ttl=30, auto_renew=False)
        lease = lock.acquire()
        backend = locks.backend_for("o")
        book = RenewalBook(clock)
        book.add(lease, backend, 30, True, None)
        clock.set(10.0)
        batches, _ = book.take_due(clock.now)  # the 30 s renewal goes in flight
        clock.set(10.1)
        ticket = lease.renewal_started(clock.now, 1)
        assert lease.extend(clock.now, 1, ticket)  # renew(ttl=1) answered first
        book.retune(lease, 1)
        book.apply(batches[backend], [lockkit.driver.Grant(fencing_token=1, ttl=30, sent_at=10.0)])  # type: ignore[attr-defined]
        assert lease.expires_at <= 11.1 and lease.ttl == 1
        assert book.next_wakeup() is not None and book.next_wakeup() <= 10.5  # type: ignore[operator]


def test_repeated_renewal_failures_warn_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    """Retries come every tenth of a ttl: a dead backend must not write dozens of warnings a second."""
    clock = FakeClock(0.0)
    with lockkit.connect(f"memory://book-warn-{uuid.uuid4().hex[:8]}", clock=clock) as locks:
        lease = locks.lock("w", ttl=30, auto_renew=False).acquire()
        backend = locks.backend_for("w")
        book = RenewalBook(clock)
        book.add(lease, backend, 30, True, None)
        clock.set(10.0)
        with caplog.at_level("DEBUG", logger="lockkit"):
            for _ in range(20):
                batches, _ = book.take_due(clock.now)
                book.apply(batches[backend], [lockkit.BackendUnavailable("down")])
                clock.advance(1.0)  # the next retry (min(1 s, ttl/10))
        failed = [r for r in caplog.records if "renewing 1 lock(s)" in r.getMessage()]
        assert len(failed) == 20
        assert [r.levelname for r in failed].count("WARNING") == 4  # t = 10, 15, 20, 25
