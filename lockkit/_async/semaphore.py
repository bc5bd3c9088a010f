"""Semaphores and reader-writer locks: :class:`AsyncSemaphore`, :class:`AsyncRWLock`, written once for both faces.

A permit handle *is* a lock handle (:class:`~lockkit.AsyncLock`) whose grant comes from the backend's permit
operations: the lease, renewal through the shared scheduler, loss reporting, ``with``/``async with``,
``renew(ttl)`` and release are the lock's own code, so they keep the lock's guarantees word for word.
``scripts/unasync.py`` generates ``lockkit/_sync/semaphore.py`` (``Semaphore``, ``RWLock``) from this file.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from ..driver import AsyncPermitDriver, Grant, PermitInfo, PermitMode
from ..errors import LockError
from ..lock_core import LockCore
from .lock import AsyncLock

__all__ = ["AsyncPermit", "AsyncRWLock", "AsyncSemaphore"]


class AsyncPermit(AsyncLock):
    """One permit of a semaphore, or one side (read or write) of a reader-writer lock.

    Like a lock handle it holds at most one lease at a time and is not reentrant: use one handle per holder.
    """

    def __init__(self, core: LockCore, permits: AsyncPermitDriver, limit: int, mode: PermitMode) -> None:
        super().__init__(core)
        self._permits = permits
        self._limit = limit
        self._mode = mode
        core.kind = {"permit": "semaphore", "read": "rwlock read side", "write": "rwlock write side"}[mode]

    @property
    def mode(self) -> PermitMode:
        """``permit`` (a semaphore's), ``read`` or ``write``."""
        return self._mode

    async def _take(self, token: str, deadline: float | None) -> Grant | None:
        core = self._core
        permits = self._permits
        return await permits.acquire_permit(
            core.name, token, core.ttl, deadline, self._limit, self._mode, core.backend.closing
        )

    async def _give_back(self, token: str) -> None:
        with contextlib.suppress(LockError):
            await self._permits.release_permit(self._core.name, token)

    async def holders(self) -> PermitInfo:
        """How many hold and wait, the limit they use, the last fencing token (one round trip)."""
        return await self._permits.permit_holders(self._core.name)

    def __repr__(self) -> str:
        kind = f"limit={self._limit}" if self._mode == "permit" else f"mode={self._mode}"
        return f"{type(self).__name__}({self._core.describe()}, {kind})"


class AsyncSemaphore(AsyncPermit):
    """A handle on one permit of semaphore ``name``: at most ``limit`` holders at once, fleet-wide.

    Create it with :meth:`lockkit.AsyncLocker.semaphore`. Every holder of a name must use the same ``limit``:
    a handle whose limit disagrees with the live holders' is refused with :class:`~lockkit.ConfigError`.
    """

    @property
    def limit(self) -> int:
        return self._limit


class AsyncRWLock:
    """Reader-writer lock ``name``: many readers at once, or one writer alone, with writer preference.

    Create it with :meth:`lockkit.AsyncLocker.rwlock`; take a side with ``async with rw.read()`` or
    ``async with rw.write()``. Each call of :meth:`read` or :meth:`write` returns a new handle, so one
    ``AsyncRWLock`` may serve many concurrent holders. A waiting writer holds back readers that come after
    it, so a stream of readers cannot starve it; a writer's fencing token is above every earlier reader's
    and writer's.
    """

    def __init__(self, name: str, make: Callable[[PermitMode], AsyncPermit]) -> None:
        self.name = name
        self._make = make

    def read(self) -> AsyncPermit:
        """A new handle on the shared (read) side."""
        return self._make("read")

    def write(self) -> AsyncPermit:
        """A new handle on the exclusive (write) side."""
        return self._make("write")

    async def holders(self) -> PermitInfo:
        """Readers or writer holding, writers waiting, the last fencing token (one round trip)."""
        return await self._make("read").holders()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"
