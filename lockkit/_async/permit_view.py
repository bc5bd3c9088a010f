"""A backend's permit operations seen as a lock driver: :class:`AsyncPermitView`, written once for both faces.

The renewal scheduler, the lease registry and closing a locker all speak the lock driver's contract
(``renew_many``, ``release``, ``holder``). Seen through this view, the permits of one backend are one more
target for them: one renewal batch per backend, loss reported exactly as a lock's. Only acquiring differs
(it needs the limit and the mode), and the permit handles (:mod:`.semaphore`) call that directly.
``scripts/unasync.py`` generates ``lockkit/_sync/permit_view.py`` from this file.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from ..driver import AsyncPermitDriver, Cancel, Grant, Guarantees, HolderInfo, PermitInfo, RenewRequest, one_renewal
from ..errors import LockError

__all__ = ["AsyncPermitView"]


class AsyncPermitView:
    """The lock-driver face of one backend's :class:`~lockkit.driver.AsyncPermitDriver`."""

    guarantees: ClassVar[Guarantees]

    def __init__(self, permits: AsyncPermitDriver, guarantees: Guarantees) -> None:
        self.permits = permits
        self.guarantees = guarantees  # type: ignore[misc]  # per instance: mirrors the backend's driver

    async def acquire(
        self, name: str, token: str, ttl: float, deadline: float | None, cancel: Cancel | None = None
    ) -> Grant | None:
        raise LockError("a permit is acquired with its limit and mode (acquire_permit), never through this view")

    async def renew(self, name: str, token: str, ttl: float) -> Grant | None:
        return one_renewal(await self.permits.renew_permits([RenewRequest(name, token, ttl)]))

    async def renew_many(self, requests: Sequence[RenewRequest]) -> list[Grant | Exception | None]:
        return await self.permits.renew_permits(requests)

    async def release(self, name: str, token: str) -> bool:
        return await self.permits.release_permit(name, token)

    async def info(self, name: str) -> PermitInfo:
        return await self.permits.permit_holders(name)

    async def holder(self, name: str) -> HolderInfo:
        info = await self.permits.permit_holders(name)
        return HolderInfo(info.holders > 0, None, info.fencing_token, None, info.waiters)

    async def force_release(self, name: str) -> bool:
        return await self.permits.force_release_permits(name) > 0

    async def ping(self) -> None:
        pass

    async def close(self) -> None:
        close = getattr(self.permits, "close", None)
        if close is not None:
            await close()
