"""The handle on one named lock: :class:`AsyncLock`, written once for both faces.

This file is the source of :class:`lockkit.Lock` too: ``scripts/unasync.py`` generates
``lockkit/_sync/lock.py`` from it. Everything that is not I/O lives in :class:`~lockkit.lock_core.LockCore`;
what differs per face beyond ``await`` (the renewal scheduler, finishing a release whose caller was
cancelled) comes from the face's ``primitives`` module.
"""

from __future__ import annotations

import contextlib
import logging
from types import TracebackType

from ..driver import AsyncDriver, Grant
from ..errors import LockError, LockNotOwned, LockTimeout
from ..face_guard import FaceGuard
from ..lease import Lease, RenewalTicket
from ..lock_core import LATE_GRANTS, USE_LOCK_TIMEOUT, LockCore, new_token
from ..renewal import AsyncRenewalScheduler
from .primitives import async_scheduler, finish_even_if_cancelled

__all__ = ["AsyncLock"]

log = logging.getLogger("lockkit")


class AsyncLock(FaceGuard):
    """A handle on one named lock. Create it with :meth:`lockkit.AsyncLocker.lock`.

    Each ``AsyncLock`` holds at most one lease at a time and is not reentrant. Use one ``AsyncLock`` object
    per holder; to lock the same name from several threads or tasks, give each its own ``AsyncLock`` (they
    then exclude each other).
    """

    def __init__(self, core: LockCore) -> None:
        self._core = core
        self._renewals: AsyncRenewalScheduler | None = None
        """The scheduler the current lease was given to (the one a release must take it from, whichever event
        loop runs the release; and one lookup per lease, not one per call)."""

    @property
    def name(self) -> str:
        """The validated lock name."""
        return self._core.name

    @property
    def lease(self) -> Lease | None:
        """The current lease, if this handle holds one (valid or not)."""
        return self._core.lease

    def _driver(self) -> AsyncDriver:
        driver: AsyncDriver = self._core.backend.driver
        return driver

    def _renewals_of_lease(self) -> AsyncRenewalScheduler:
        return self._renewals or async_scheduler(self._core.clock)

    @staticmethod
    def _inline(driver: AsyncDriver) -> bool:
        """Whether the driver lets a release or renew run in the caller's task until a cancellation arrives: it
        declares ``finish_inline`` when its calls never cancel the task they run in (see
        :func:`~lockkit._async.cancel_safe.finish_even_if_cancelled`); any other driver's run shielded."""
        return getattr(driver, "finish_inline", False) is True

    async def acquire(self, timeout: float | None = USE_LOCK_TIMEOUT) -> Lease:
        """Wait until held; raise :class:`LockTimeout` after ``timeout`` seconds (``None``: wait forever).

        On the asyncio face, cancelling the caller removes whatever the wait queued on the server.
        """
        core = self._core
        token, deadline, started = core.begin(timeout)
        late = 0
        backend = core.backend
        acquiring = backend.acquiring
        while True:
            acquiring.add(token)
            try:  # until it leaves ``acquiring``, the close waits for it before closing the driver
                try:
                    grant = await self._take(token, deadline)
                except LockError as exc:
                    backend.stats.count("errors")
                    if backend.closed:  # the driver's own word for it ("driver closed", "connection closed")
                        raise core.closed_while_waiting() from exc
                    raise
                if backend.closed:  # closed while it waited (C-16): a grant now would be a closed locker's
                    if grant is not None:
                        await self._give_back(token)
                    raise core.closed_while_waiting()
            finally:
                acquiring.discard(token)
            if grant is None:
                raise core.timed_out(timeout)
            lease = core.granted(token, grant, started)
            if lease is not None:
                break
            # The grant arrived after its own validity ran out: never held, so never handed out (with-blocks ran
            # unlocked on such leases). Give it back, and try again with a fresh token while there is time.
            late += 1
            await self._give_back(token)
            if late >= LATE_GRANTS or (deadline is not None and core.clock() >= deadline):
                raise core.too_late(grant, late)
            token = new_token()
        renewals = self._renewals = async_scheduler(backend.clock)
        renewals.add(lease, backend, core.ttl, core.auto_renew, core.max_hold)
        return lease

    async def _take(self, token: str, deadline: float | None) -> Grant | None:
        """The driver call that wins the grant (a permit handle asks its backend's permit operations instead)."""
        core = self._core
        backend = core.backend
        driver: AsyncDriver = backend.driver
        return await driver.acquire(core.name, token, core.ttl, deadline, backend.closing)

    async def _give_back(self, token: str) -> None:
        """Release, owner-checked, a grant that came too late to be trusted, or while the locker closed; best
        effort (it lapses at its ttl)."""
        driver = self._core.backend.open_driver()
        if driver is not None:
            with contextlib.suppress(LockError):
                await driver.release(self._core.name, token)

    async def try_acquire(self) -> Lease | None:
        """One attempt, never waits: the lease, or ``None`` if someone else holds the lock."""
        try:
            return await self.acquire(timeout=0)
        except LockTimeout:
            return None

    async def renew(self, ttl: float | None = None) -> Lease:
        """Extend the lease to ``ttl`` (default: the lock's ttl) from now; :class:`LockLost` if it is gone.

        The new deadline replaces the old one, shorter or longer, and automatic renewal goes on with the new
        ttl: ``renew(ttl=1)`` on a lease granted for 30 s leaves about one second of validity. On the asyncio
        face, cancelling the caller does not abandon the renewal half-way: it completes in the background and
        the lease records its outcome.
        """
        core = self._core
        lease = core.held_lease("renew")
        want, ticket = core.start_renewal(lease, ttl)
        inline = self._inline(self._driver())
        return await finish_even_if_cancelled(self._renew(lease, want, ticket), ("renewing", core.name), inline)

    async def _renew(self, lease: Lease, want: float, ticket: RenewalTicket) -> Lease:
        core = self._core
        renewals = self._renewals_of_lease()
        try:
            grant = await self._driver().renew(core.name, lease.token, want)
        except BaseException as exc:
            core.renew_errored(lease, ticket, exc)
            renewals.retune(lease, None)
            raise
        try:
            return core.renewed(lease, grant, ticket)
        finally:
            renewals.retune(lease, want)

    async def release(self) -> None:
        """Release the lock; :class:`LockNotOwned` if it was not ours any more (nothing is deleted then).

        On the asyncio face, cancelling the caller does not abandon the release half-way: it completes in the
        background, so the lease never says ``valid`` after the server let the lock go, nor is the lock left
        held with nobody renewing it.
        """
        core = self._core
        lease = core.held_lease("release")
        (self._renewals or async_scheduler(core.backend.clock)).remove(lease)
        driver = self._driver()  # once per release: it raises if the locker is closed
        inline = self._inline(driver)
        await finish_even_if_cancelled(self._release(lease, driver), ("releasing", core.name), inline)

    async def _release(self, lease: Lease, driver: AsyncDriver) -> Lease:
        core = self._core
        try:
            ok = await driver.release(core.name, lease.token)
        except BaseException as exc:
            core.release_errored(lease, exc)
            raise
        core.after_release(lease, ok)
        return lease

    async def locked(self) -> bool:
        """Whether anyone holds the lock now, as the server sees it (one round trip)."""
        return (await self._driver().holder(self._core.name)).held

    def owned(self) -> bool:
        """Whether this handle holds a valid lease now (no network I/O)."""
        lease = self._core.lease
        return lease is not None and lease.valid

    async def __aenter__(self) -> Lease:
        return await self.acquire()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        lease = self._core.lease
        lost = self._core.exit_error(lease)
        try:
            await self.release()
        except LockError as error:
            if exc is None and lost is None:
                # A loss found only now, by the release (the server no longer held our token: expired, or taken
                # over while the block ran, with no renewal in between to notice): the block's work may have
                # overlapped another holder's, which is what LockLost says; LockNotOwned alone was missed by
                # ``except LockLost`` handlers. Other release errors (unreachable, …) stay as they are.
                found = self._core.exit_error(lease) if isinstance(error, LockNotOwned) else None
                if found is not None:
                    raise found from error
                raise
            if exc is not None:
                log.warning("lockkit: releasing %r after an error in its block failed", self.name, exc_info=True)
        if lost is not None and exc is None:
            raise lost

    def __repr__(self) -> str:
        return f"AsyncLock({self._core.describe()})"
