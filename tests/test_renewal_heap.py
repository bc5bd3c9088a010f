"""The renewal book's work per round does not grow with the number of leases held (issue 17).

Counted, not timed: the heap items a round leaves behind, and the objects the Redis driver makes per renewal.
"""

from __future__ import annotations

import gc
import uuid

import lockkit
from lockkit.driver import RenewRequest
from lockkit.renewal import RenewalBook, _requests


class TickingClock:
    """A fake monotonic clock that moves a microsecond on every read, as a driver renewing one lease at a time
    sees it (memory:// and file:// read the clock per lease, so no two renewals share a send time)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1e-6
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def test_a_renewal_round_of_many_leases_costs_a_few_heap_items_not_one_per_lease() -> None:
    clock = TickingClock()
    n, ttl = 2000, 30.0
    with lockkit.connect(f"memory://heap-{uuid.uuid4().hex[:8]}", clock=clock) as locks:
        leases = [locks.lock(f"h{i}", ttl=ttl, auto_renew=False).acquire() for i in range(n)]
        backend = locks.backend_for("h0")
        book = RenewalBook(clock)
        for lease in leases:
            book.add(lease, backend, ttl, True, None)
        for _ in range(4):
            clock.advance(ttl / 3)
            batches, expired = book.take_due(clock())
            assert not expired and len(batches[backend]) == n  # every lease renewed in one batch
            book.apply(batches[backend], backend.driver.renew_many(_requests(batches[backend])))
            assert book.next_wakeup() is not None
            # One renewal group and a deadline group or two; per lease this was three heap items a round.
            assert book.heap_size() <= 8, book.heap_size()
        assert all(lease.valid for lease in leases)
        assert locks.stats()["default"]["renewals"] == 4 * n


def test_redis_renewal_calls_are_made_once_per_request_and_dropped_with_it() -> None:
    with lockkit.connect("redis://127.0.0.1:1") as locks:  # no I/O: only the calls are built
        driver = locks.backend_for("x").driver
        request = RenewRequest("x", "token-1", 2.0)
        first = driver._renew_calls([request])
        assert driver._renew_calls([request])[0] is first[0]  # no new objects per round for the GC
        assert driver._renew_calls([RenewRequest("x", "token-1", 2.0)])[0] is first[0]  # equal requests, one call
        assert driver._renew_calls([RenewRequest("x", "token-1", 3.0)])[0] is not first[0]  # a new ttl: a new call
        del request, first
        gc.collect()
        assert len(driver._renewals) == 0  # weak: a released lease's request takes its call with it
