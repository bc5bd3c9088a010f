"""A backend as a locker holds it: a named driver, its statistics, and its live leases.

The backend is also the :class:`~lockkit.driver.LeaseEvents` sink of its
driver: a session-bound driver (ZooKeeper, etcd) reports "the session is
suspended / lost / back" by token, and the backend finds the lease it concerns.
"""

from __future__ import annotations

import threading
import weakref
from typing import Generic, TypeVar

from .driver import AsyncDriver, Cancel, Driver, Guarantees
from .errors import LockError
from .lease import Lease
from .metrics import BackendStats
from .timing import Clock

__all__ = ["Backend"]

D = TypeVar("D", Driver, AsyncDriver)
EARLY_LOSSES = 1024
PRUNE_AT = 1024


class Backend(Generic[D]):
    """One configured backend of a locker (sync or async, by its driver)."""

    def __init__(self, name: str, shown_url: str, clock: Clock) -> None:
        self.name = name
        self.shown_url = shown_url  # password already masked
        self.clock = clock
        self.stats = BackendStats(name)
        self._driver: D | None = None
        self.fenced = False
        self._closed = False
        self.closing = Cancel()
        """Fired when the backend closes: every acquire passes it to its driver, so one still waiting then ends
        (C-16) instead of waiting on, or handing out a lease of a closed locker that nothing would release."""
        self.acquiring: set[str] = set()
        """The tokens of the acquires in a driver call now (set.add and discard need no lock): the close waits
        for those it woke to clean up what they queued before it closes the driver under them."""
        # Token -> weak reference: a lease dropped without release must not be kept alive by the registry.
        # A plain dict of refs, pruned as it grows, rather than a WeakValueDictionary, whose Python-level
        # KeyedRef made tracking cost three times as much on every acquire.
        self._leases: dict[str, weakref.ref[Lease]] = {}
        self._prune_at = PRUNE_AT
        self._mutex = threading.Lock()
        # Session events about tokens not tracked yet: a driver may report them between returning a grant and
        # the front end tracking its lease; track() applies them. Token -> (lost?, reason); bounded.
        self._early: dict[str, tuple[bool, str]] = {}

    def attach(self, driver: D) -> None:
        self._driver = driver
        self.fenced = driver.guarantees.fencing != "none"
        """Whether its leases carry fencing tokens (read once here, not per acquire: a driver's guarantees are
        fixed when it is made)."""

    @property
    def driver(self) -> D:
        if self._closed or self._driver is None:
            raise LockError(
                f"backend {self.name!r} ({self.shown_url}) is closed; open a new locker with lockkit.connect()"
            )
        return self._driver

    @property
    def guarantees(self) -> Guarantees:
        return self.driver.guarantees

    @property
    def closed(self) -> bool:
        return self._closed

    def mark_closed(self) -> D | None:
        self._closed = True
        self.closing.cancel()  # the waiting acquires give up (their drivers clean up what they queued)
        return self._driver

    def open_driver(self) -> D | None:
        """The driver, also once the backend is closed, until :meth:`detach`: for the give-back of a grant that
        came back while the locker closed."""
        return self._driver

    def detach(self) -> None:
        """The driver is about to close: from now on nothing uses it, not even a give-back."""
        self._driver = None

    # -- lease registry ------------------------------------------------------------------

    def track(self, lease: Lease, loss_counted: bool = False) -> None:
        # Losses are counted here, where every lease passes, by the lease itself as it becomes LOST: once,
        # whichever path gets there (a renewal refused or too late, the deadline, a session event, a release
        # that finds the token gone, the locker closing). Counted by each path instead, the last two went uncounted.
        # ``loss_counted``: the lease was made with ``stats.count_loss`` among its callbacks already (the front
        # end does so: adding it here took the lease's mutex once more per acquire; issue 17).
        if not loss_counted:
            lease.add_lost_callback(self.stats.count_loss)
        with self._mutex:
            self._leases[lease.token] = weakref.ref(lease)
            if len(self._leases) >= self._prune_at:
                self._prune()
            early = self._early.pop(lease.token, None) if self._early else None
            if early is not None and not early[0]:
                # Under the mutex (it takes only the lease's own and runs no callbacks): a restored() that
                # comes right after must find the lease UNCERTAIN already, or it would be lost in between.
                lease.mark_uncertain(early[1])
        if early is not None and early[0]:
            lease.mark_lost(early[1])

    def untrack(self, lease: Lease) -> None:
        """Drop a lease from the registry, nothing more (the front end records its end itself: LockCore.finish)."""
        with self._mutex:
            self._leases.pop(lease.token, None)

    def _prune(self) -> None:
        """Drop the entries of leases that were garbage-collected without a release (under the mutex)."""
        self._leases = {token: ref for token, ref in self._leases.items() if ref() is not None}
        self._prune_at = 2 * len(self._leases) + PRUNE_AT

    def live_leases(self) -> list[Lease]:
        with self._mutex:
            refs = list(self._leases.values())
        return [lease for ref in refs if (lease := ref()) is not None]

    def _find(self, token: str) -> Lease | None:
        with self._mutex:
            ref = self._leases.get(token)
        return None if ref is None else ref()

    # -- LeaseEvents -------------------------------------------------------------------------

    def _keep_early(self, token: str, lost: bool, reason: str) -> None:
        with self._mutex:
            if not lost and self._early.get(token, (False, ""))[0]:
                return  # already lost: a later suspension must not downgrade it
            self._early[token] = (lost, reason)
            while len(self._early) > EARLY_LOSSES:
                self._early.pop(next(iter(self._early)))

    def lost(self, token: str, reason: str) -> None:
        lease = self._find(token)
        if lease is None:
            self._keep_early(token, True, reason)
            return
        lease.mark_lost(reason)

    def uncertain(self, token: str, reason: str) -> None:
        lease = self._find(token)
        if lease is None:
            self._keep_early(token, False, reason)  # a suspension before tracking must not be dropped
            return
        lease.mark_uncertain(reason)

    def restored(self, token: str) -> None:
        with self._mutex:  # with track(): the lease is found, or its early suspension is cancelled, never neither
            ref = self._leases.get(token)
            lease = None if ref is None else ref()
            if lease is None:
                if self._early.get(token, (True, ""))[0] is False:
                    del self._early[token]
                return
        lease.mark_restored()

    def __repr__(self) -> str:
        return f"Backend({self.name!r}, {self.shown_url!r}{', closed' if self._closed else ''})"
