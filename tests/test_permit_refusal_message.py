"""A refused semaphore names the backends that do offer them, as this installation's drivers declare."""

from __future__ import annotations

import pytest

import lockkit
from lockkit.driver import Guarantees, Offer
from lockkit.permits import check_offered, offering_schemes
from lockkit.registry import builtin_schemes, load_factory


def test_the_refusal_lists_exactly_the_offering_schemes() -> None:
    refusing = Guarantees("single-node", True, "strict", False, "ttl", semaphores=Offer("never", "x" * 40))
    with pytest.raises(lockkit.ConfigError) as caught:
        check_offered(refusing, "orders")
    message = str(caught.value)
    offering = offering_schemes()
    assert "memory://" in offering and "redlock://" not in offering
    for scheme in builtin_schemes():
        offers = bool(load_factory(scheme).guarantees.semaphores)
        assert (f"{scheme}://" in offering) is offers, scheme
    assert f"({', '.join(offering)};" in message
    assert "'orders'" in message and "(never: " in message


def test_permit_handles_say_what_they_hold() -> None:
    """A semaphore's or rwlock side's errors name it as such, not as a lock."""
    with lockkit.connect("memory://permit-messages") as locks:
        permit = locks.semaphore("exports", limit=1, ttl=5)
        permit.acquire()
        with pytest.raises(lockkit.LockTimeout, match=r"^semaphore 'exports' .* not free within 0.05 s"):
            locks.semaphore("exports", limit=1, ttl=5).acquire(timeout=0.05)
        with pytest.raises(lockkit.LockError, match="this semaphore handle already holds 'exports'"):
            permit.acquire()
        permit.release()
        with pytest.raises(lockkit.LockNotOwned, match="this semaphore handle does not hold it"):
            permit.release()
        rw = locks.rwlock("prices", ttl=5)
        with rw.write(), pytest.raises(lockkit.LockTimeout, match=r"^rwlock read side 'prices' "):
            rw.read().acquire(timeout=0.05)
        with pytest.raises(lockkit.LockNotOwned, match="this lock handle does not hold it"):
            locks.lock("plain").release()


def test_a_lost_permit_is_reported_as_a_permit(caplog: pytest.LogCaptureFixture) -> None:
    """A permit's or rwlock side's loss says "semaphore"/"rwlock", in the error and in the log line (it said
    "lock 'exports' lost")."""
    with lockkit.connect("memory://permit-loss-messages") as locks:
        permit = locks.semaphore("exports", limit=2, ttl=5, auto_renew=False)
        lease = permit.acquire()
        assert lease.kind == "semaphore"
        locks.force_release_permits("exports")
        with (
            caplog.at_level("WARNING", logger="lockkit"),
            pytest.raises(lockkit.LockLost, match=r"^semaphore 'exports' was lost"),
        ):
            permit.renew()
        assert "lockkit: semaphore 'exports' lost" in caplog.text
        with pytest.raises(lockkit.LockLost, match=r"^semaphore 'exports' was lost"):
            lease.ensure_valid()
        writer = locks.rwlock("prices", ttl=5, auto_renew=False).write()
        assert writer.acquire().kind == "rwlock"
        locks.force_release_permits("prices")
        with pytest.raises(lockkit.LockLost, match=r"^rwlock 'prices' was lost"):
            writer.renew()
        assert locks.lock("plain", ttl=5).acquire().kind == "lock"
