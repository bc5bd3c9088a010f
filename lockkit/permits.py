"""Finding a backend's permit operations (semaphores, reader-writer locks): the capability, asked as data.

A driver offers them when its :attr:`Guarantees.semaphores <lockkit.driver.Guarantees.semaphores>` says
``"yes"`` and it has a ``permits()`` method returning a :class:`~lockkit.driver.PermitDriver` (blocking) or
:class:`~lockkit.driver.AsyncPermitDriver` (native asyncio). Anything else is refused here with the driver's
own reason, so ``locks.semaphore()`` on a backend without them fails at once with a :class:`ConfigError`
that says whether it is "not yet" or "never" and why, before any server is asked.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, cast

from .driver import (
    AsyncPermitDriver,
    Cancel,
    Grant,
    Guarantees,
    LeaseEvents,
    PermitDriver,
    PermitInfo,
    PermitMode,
    RenewRequest,
)
from .errors import ConfigError
from .offload import MAX_OFFLOAD_THREADS, Offload, ThreadOffloadDriver

__all__ = ["OffloadPermits", "async_permits", "check_offered", "offering_schemes", "sync_permits"]

log = logging.getLogger("lockkit")


def check_offered(guarantees: Guarantees, backend: str) -> None:
    """Raise the refusal for a backend that does not offer permits (as its Guarantees declare)."""
    offer = guarantees.semaphores
    if offer:
        return
    raise ConfigError(
        f"backend {backend!r} does not offer semaphores or reader-writer locks ({offer.offered}: {offer.why}). "
        f"Route this name to a backend that offers them ({', '.join(offering_schemes())}; see docs/semaphores.md)"
    )


def offering_schemes() -> list[str]:
    """The built-in schemes whose drivers offer permits, as ``scheme://`` (read from each driver's class: the
    refusal names the alternatives that are true of this installation, not a list written once)."""
    from .registry import builtin_schemes, load_factory  # the registry imports drivers lazily, and so here

    offering = []
    for scheme in builtin_schemes():
        try:
            if load_factory(scheme).guarantees.semaphores:
                offering.append(f"{scheme}://")
        except ConfigError:  # its client package is not installed
            continue
    return offering


def _native(driver: Any, guarantees: Guarantees, backend: str, events: LeaseEvents | None) -> Any:
    check_offered(guarantees, backend)
    make = getattr(driver, "permits", None)
    if make is None:
        # A wrapper that mirrors its driver's guarantees (fencing_epoch=, a migrate backend) but cannot pass
        # permits through: their fences would not carry the epoch, or they would live on one side only.
        raise ConfigError(
            f"backend {backend!r} does not offer semaphores or reader-writer locks through "
            f"{type(driver).__name__} (not yet: a fencing_epoch option or a migrate backend); route them to a "
            "backend configured without it"
        )
    return make(events)


def sync_permits(driver: Any, backend: str, events: LeaseEvents | None = None) -> PermitDriver:
    """``driver``'s permit operations; a session-bound one reports the losses of permit leases to ``events``."""
    return cast(PermitDriver, _native(driver, driver.guarantees, backend, events))


def async_permits(driver: Any, backend: str, events: LeaseEvents | None = None) -> AsyncPermitDriver:
    if isinstance(driver, ThreadOffloadDriver):
        return OffloadPermits(sync_permits(driver.sync, backend, events))
    return cast(AsyncPermitDriver, _native(driver, driver.guarantees, backend, events))


class OffloadPermits:
    """A blocking :class:`PermitDriver` for the asyncio face: calls run in worker threads of its own
    :class:`~lockkit.offload.Offload`, as :class:`~lockkit.offload.ThreadOffloadDriver` runs locks (a release
    never queues behind blocked acquires, a forked child starts threads of its own), and a cancelled acquire
    gives back what it was granted."""

    def __init__(self, sync: PermitDriver, max_threads: int = MAX_OFFLOAD_THREADS) -> None:
        self.sync = sync
        self._offload = Offload("permit", max_threads)

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await self._offload.run(fn, *args)

    async def acquire_permit(
        self,
        name: str,
        token: str,
        ttl: float,
        deadline: float | None,
        limit: int,
        mode: PermitMode,
        cancel: Cancel | None = None,
    ) -> Grant | None:
        stop = Cancel()
        unhook = cancel.on_cancel(stop.cancel) if cancel is not None else None
        try:
            args = (name, token, ttl, deadline, limit, mode, stop)
            return await self._offload.wait(
                self.sync.acquire_permit, args, stop, lambda: self.sync.release_permit(name, token)
            )
        finally:
            if unhook is not None:
                unhook()

    async def renew_permits(self, requests: Sequence[RenewRequest]) -> list[Grant | Exception | None]:
        return cast("list[Grant | Exception | None]", await self._run(self.sync.renew_permits, requests))

    async def release_permit(self, name: str, token: str) -> bool:
        return bool(await self._run(self.sync.release_permit, name, token))

    async def permit_holders(self, name: str) -> PermitInfo:
        return cast(PermitInfo, await self._run(self.sync.permit_holders, name))

    async def force_release_permits(self, name: str) -> int:
        return int(await self._run(self.sync.force_release_permits, name))

    async def close(self) -> None:
        close = getattr(self.sync, "close", None)
        try:
            if close is not None:  # a driver's own permit sessions (etcd)
                await self._run(close)
        finally:
            self._offload.close()
