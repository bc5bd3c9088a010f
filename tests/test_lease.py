"""The Lease state machine and validity maths on a fake monotonic clock."""

from __future__ import annotations

import time
from typing import Any

import pytest

from lockkit import LeaseState, LockLost
from lockkit.lease import Lease
from lockkit.testing import FakeClock
from lockkit.timing import drift, lease_deadline, validate_timeout, validate_ttl


def _lease(clock: FakeClock, ttl: float = 10.0, **kwargs: object) -> Lease:
    return Lease(name="n", token="t" * 32, fencing_token=7, ttl=ttl, sent_at=clock.now, clock=clock, **kwargs)  # type: ignore[arg-type]


def test_validity_counts_from_send_minus_drift() -> None:
    clock = FakeClock(1000.0)
    lease = _lease(clock)
    assert lease.expires_at == pytest.approx(1000 + 10 - (10 * 0.01 + 0.002))
    assert lease.remaining() == pytest.approx(10 - drift(10))
    clock.set(lease.expires_at - 1e-6)
    assert lease.valid
    clock.set(lease.expires_at)
    assert not lease.valid and lease.remaining() == 0 and lease.state is LeaseState.LOST
    with pytest.raises(LockLost, match="TTL passed"):
        lease.ensure_valid()


def test_renewal_that_returns_after_the_deadline_does_not_revive() -> None:
    clock = FakeClock(1000.0)
    lease = _lease(clock, ttl=3)
    sent = clock.now + 1
    clock.advance(3.5)  # the renew request hung past the deadline
    assert not lease.extend(sent, 3)
    assert not lease.valid


def test_extend_replaces_the_deadline_with_what_the_server_has() -> None:
    """A-1: a renewal sets the server's expiry to its own ttl, shorter or longer, so the lease follows it."""
    clock = FakeClock(1000.0)
    lease = _lease(clock, ttl=10)
    clock.advance(1)
    assert lease.extend(clock.now, 1)
    assert lease.expires_at == pytest.approx(lease_deadline(clock.now, 1)) and lease.ttl == 1
    assert lease.extend(clock.now, 20)
    assert lease.expires_at == pytest.approx(lease_deadline(clock.now, 20))


def test_overlapping_renewals_trust_the_lowest_deadline_either_could_leave() -> None:
    clock = FakeClock(1000.0)
    lease = _lease(clock, ttl=10)
    older = lease.renewal_started(clock.now, 10)
    clock.advance(0.5)
    newer = lease.renewal_started(clock.now, 1)
    assert lease.extend(clock.now, 1, newer)
    assert lease.extend(clock.now - 0.5, 10, older)  # a reordered, older renewal: it may have landed first
    assert lease.expires_at == pytest.approx(lease_deadline(clock.now, 1)) and lease.ttl == 1
    later = lease.renewal_started(clock.now + 0.1, 10)  # after both: no overlap, it counts in full
    assert lease.extend(clock.now + 0.1, 10, later)
    assert lease.expires_at == pytest.approx(lease_deadline(clock.now + 0.1, 10))


def test_lost_fires_callbacks_once_and_late_callbacks_at_once() -> None:
    clock = FakeClock(1000.0)
    seen: list[str] = []
    lease = _lease(clock, on_lost=[lambda _lease: seen.append("a")])
    assert lease.mark_lost("test")
    assert not lease.mark_lost("again")
    lease.add_lost_callback(lambda _lease: seen.append("late"))
    assert seen == ["a", "late"]
    assert lease.lost_reason == "test"


def test_callback_errors_do_not_escape(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock(1000.0)

    def boom(lease: Lease) -> None:
        raise RuntimeError("callback failed")

    lease = _lease(clock, on_lost=[boom])
    lease.mark_lost("test")
    assert "on_lost callback" in caplog.text


def test_uncertain_then_restored() -> None:
    clock = FakeClock(1000.0)
    lease = _lease(clock)
    lease.mark_uncertain("session suspended")
    assert not lease.valid
    with pytest.raises(LockLost, match="uncertain"):
        lease.ensure_valid()
    lease.mark_restored()
    assert lease.valid
    lease.mark_uncertain("again")
    clock.set(lease.expires_at + 1)
    assert lease.state is LeaseState.LOST


def test_released_lease_is_not_valid() -> None:
    lease = _lease(FakeClock(1000.0))
    lease.mark_released()
    assert not lease.valid
    assert not lease.mark_lost("after release")
    with pytest.raises(LockLost, match="released"):
        lease.ensure_valid()


def test_token_never_in_repr() -> None:
    lease = _lease(FakeClock(1000.0))
    assert lease.token not in repr(lease) and "fencing_token=7" in repr(lease)


def test_wall_clock_jumps_change_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    lease = Lease(name="n", token="t" * 32, fencing_token=1, ttl=60, sent_at=time.monotonic(), clock=time.monotonic)
    before = lease.remaining()
    real = time.time
    for jump in (3600, -3600):
        monkeypatch.setattr(time, "time", lambda j=jump: real() + j)
        assert lease.valid and abs(lease.remaining() - before) < 1


def test_ttl_and_timeout_validation() -> None:
    assert validate_ttl(1) == 1.0
    assert validate_timeout(None) is None and validate_timeout(0) == 0.0
    assert lease_deadline(0, 100) == pytest.approx(100 - 1.002)


def test_backend_registry_does_not_keep_dropped_leases_alive() -> None:
    import gc

    from lockkit import configured_backend as backend_module
    from lockkit.configured_backend import Backend

    clock = FakeClock(1000.0)
    registry: Backend[Any] = Backend("b", "memory://", clock)
    kept = Lease(name="kept", token="k" * 32, fencing_token=1, ttl=10, sent_at=clock.now, clock=clock)
    registry.track(kept)
    for i in range(backend_module.PRUNE_AT + 10):  # dropped without a release, as a careless caller might
        registry.track(Lease(name=f"n{i}", token=f"{i:032x}", fencing_token=1, ttl=10, sent_at=clock.now, clock=clock))
    gc.collect()
    assert registry.live_leases() == [kept]
    assert len(registry._leases) < backend_module.PRUNE_AT  # the dead entries were pruned as it grew
    registry.lost("k" * 32, "test")
    assert not kept.valid


def test_a_renewal_reply_is_not_capped_by_its_own_request() -> None:
    """A backend may give more than was asked (ZooKeeper: the session timeout; etcd: whole seconds)."""
    clock = FakeClock(1000.0)
    lease = _lease(clock, ttl=6)
    ticket = lease.renewal_started(clock.now, 5)
    assert lease.extend(clock.now, 6, ticket)
    assert lease.ttl == 6 and lease.expires_at == pytest.approx(lease_deadline(clock.now, 6))
    unknown = lease.renewal_started(clock.now, 1)
    lease.renewal_unknown(unknown)  # but one whose outcome is unknown counts at what it asked for
    assert lease.expires_at == pytest.approx(lease_deadline(clock.now, 1))


def test_an_unknown_renewal_is_capped_by_a_shorter_one_still_in_flight() -> None:
    """Killed mutant (mutmut, renewal_unknown): renewal A (10 s) fails while B (1 s) is still in flight; the
    server may have applied B after A, so until B answers the lease may claim no more than B would leave."""
    clock = FakeClock(1000.0)
    lease = _lease(clock, ttl=30)
    a = lease.renewal_started(clock.now, 10)
    b = lease.renewal_started(clock.now, 1)
    lease.renewal_unknown(a)
    assert lease.expires_at == pytest.approx(lease_deadline(clock.now, 1))
    assert lease.extend(clock.now, 1, b)
    assert lease.expires_at == pytest.approx(lease_deadline(clock.now, 1))
