"""The ``fencing_epoch`` wrapper (see :mod:`lockkit.drivers.epoch`): :class:`AsyncEpochDriver`, written once.

``scripts/unasync.py`` generates the blocking ``EpochDriver`` from this file.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from ...driver import AsyncDriver, Cancel, Grant, Guarantees, HolderInfo, RenewRequest
from ...errors import LockError
from ..epoch import lift, lift_all, lift_holder, without_permits

__all__ = ["AsyncEpochDriver"]


class AsyncEpochDriver:
    """A driver whose fencing tokens carry ``epoch`` in their top bits; everything else is the inner driver's."""

    guarantees: ClassVar[Guarantees]

    def __init__(self, inner: AsyncDriver, epoch: int) -> None:
        self.inner = inner
        self.epoch = epoch
        # per instance: mirrors the wrapped driver, but for permits, which it does not pass through
        self.guarantees = without_permits(inner.guarantees)  # type: ignore[misc]

    async def acquire(
        self, name: str, token: str, ttl: float, deadline: float | None, cancel: Cancel | None = None
    ) -> Grant | None:
        grant = await self.inner.acquire(name, token, ttl, deadline, cancel)
        try:
            return lift(self.epoch, grant)
        except LockError:
            await self.inner.release(name, token)  # a token that cannot be lifted must not leave the lock held
            raise

    async def renew(self, name: str, token: str, ttl: float) -> Grant | None:
        return lift(self.epoch, await self.inner.renew(name, token, ttl))

    async def renew_many(self, requests: Sequence[RenewRequest]) -> list[Grant | Exception | None]:
        return lift_all(self.epoch, await self.inner.renew_many(requests))

    async def release(self, name: str, token: str) -> bool:
        return await self.inner.release(name, token)

    async def holder(self, name: str) -> HolderInfo:
        return lift_holder(self.epoch, await self.inner.holder(name))

    async def force_release(self, name: str) -> bool:
        return await self.inner.force_release(name)

    async def ping(self) -> None:
        await self.inner.ping()

    async def close(self) -> None:
        await self.inner.close()
