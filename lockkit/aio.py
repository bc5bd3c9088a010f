"""The awaitable face: :class:`AsyncLock`, the twin of :class:`lockkit.Lock`.

It shares :class:`~lockkit.lock.LockCore` with the blocking face and differs
only in awaiting the driver and in using the event loop's renewal task. Drivers
with a native asyncio client (Redis) are awaited directly; the others run in
threads through :class:`~lockkit.offload.ThreadOffloadDriver`, and a cancelled
``acquire`` still removes whatever it queued on the server.
"""

from __future__ import annotations

import logging
from types import TracebackType

from ._aio import finish_even_if_cancelled
from .driver import AsyncDriver, Grant
from .errors import LockError, LockTimeout
from .lease import Lease, RenewalTicket
from .lock import _DEFAULT, LockCore
from .renewal import async_scheduler

__all__ = ["AsyncLock"]

log = logging.getLogger("lockkit")


class AsyncLock:
    """A handle on one named lock for asyncio code. Create it with :meth:`lockkit.AsyncLocker.lock`."""

    def __init__(self, core: LockCore) -> None:
        self._core = core

    @property
    def name(self) -> str:
        return self._core.name

    @property
    def lease(self) -> Lease | None:
        return self._core.lease

    def _driver(self) -> AsyncDriver:
        driver: AsyncDriver = self._core.backend.driver
        return driver

    def _start(self, token: str, grant: Grant, started: float) -> Lease:
        core = self._core
        lease = core.granted(token, grant, core.clock() - started)
        async_scheduler(core.clock).add(lease, core.backend, core.ttl, core.auto_renew, core.max_hold)
        return lease

    async def acquire(self, timeout: float | None = _DEFAULT) -> Lease:
        core = self._core
        token, deadline = core.begin(timeout)
        started = core.clock()
        try:
            grant = await self._driver().acquire(core.name, token, core.ttl, deadline)
        except LockError:
            core.backend.stats.count("errors")
            raise
        if grant is None:
            raise core.timed_out(timeout)
        return self._start(token, grant, started)

    async def try_acquire(self) -> Lease | None:
        try:
            return await self.acquire(timeout=0)
        except LockTimeout:
            return None

    async def renew(self, ttl: float | None = None) -> Lease:
        """Extend the lease to ``ttl`` (default: the lock's ttl) from now; :class:`LockLost` if it is gone.

        As :meth:`lockkit.Lock.renew`: the new deadline replaces the old one and automatic renewal goes on
        with the new ttl. Cancelling the caller does not abandon the renewal half-way: it completes in the
        background and the lease records its outcome.
        """
        core = self._core
        lease = core.held_lease("renew")
        want, ticket = core.start_renewal(lease, ttl)
        return await finish_even_if_cancelled(self._renew(lease, want, ticket), f"renewing {core.name!r}")

    async def _renew(self, lease: Lease, want: float, ticket: RenewalTicket) -> Lease:
        core = self._core
        renewals = async_scheduler(core.clock)
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

        Cancelling the caller does not abandon the release half-way: it completes in the background, so the
        lease never says ``valid`` after the server let the lock go, nor is the lock left held with nobody
        renewing it.
        """
        core = self._core
        lease = core.held_lease("release")
        async_scheduler(core.clock).remove(lease)
        await finish_even_if_cancelled(self._release(lease), f"releasing {core.name!r}")

    async def _release(self, lease: Lease) -> None:
        core = self._core
        try:
            ok = await self._driver().release(core.name, lease.token)
        except BaseException as exc:
            core.release_errored(lease, exc)
            raise
        core.after_release(lease, ok)

    async def locked(self) -> bool:
        return (await self._driver().holder(self._core.name)).held

    def owned(self) -> bool:
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
        except LockError:
            if exc is None and lost is None:
                raise
            if exc is not None:
                log.warning("lockkit: releasing %r after an error in its block failed", self.name, exc_info=True)
        if lost is not None and exc is None:
            raise lost

    def __repr__(self) -> str:
        return f"AsyncLock({self._core.describe()})"
