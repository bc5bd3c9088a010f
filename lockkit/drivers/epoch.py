"""``fencing_epoch``: any driver with fencing tokens, its tokens lifted to ``(epoch << 48) | token``.

The supported end of a migration (docs/migration.md, step 4). A ``migrate`` backend in phase ``new`` hands out
``(1 << 48) | token`` of the new backend, and storage that checks fencing tokens keeps the highest it saw. A
plain client of the new backend would hand out the bare token, far below, and every fenced write would be
refused; staying on phase ``new`` keeps the old backend alive only for presence records. A backend entry with
``fencing_epoch = 1`` (or the URL option ``?fencing_epoch=1``) returns exactly what phase ``new`` returns, from
the new backend alone::

    [backends.etcd]
    url = "etcd://etcd-1:2379"
    fencing_epoch = 1

Phase ``new`` clients and these plain ones lock the same backend and compute the same tokens, so they may run
side by side during the last roll. The wrapper changes tokens only (grants, renewals, ``holder``); locking,
waiting and renewal are the wrapped driver's. Epoch 0 is the bare driver.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from ..driver import AsyncDriver, Cancel, Driver, Grant, Guarantees, HolderInfo, RenewRequest
from ..errors import ConfigError, LockError

__all__ = ["EPOCH_SHIFT", "MAX_EPOCH", "AsyncEpochDriver", "EpochDriver", "composite_token", "parse_epoch"]

EPOCH_SHIFT = 48
MAX_EPOCH = (1 << (63 - EPOCH_SHIFT)) - 1
"""The largest epoch whose composite tokens still fit a signed 64-bit column (``BIGINT``)."""
OPTION = "fencing_epoch"


def composite_token(epoch: int, token: int) -> int:
    """``(epoch << 48) | token``: every token of a higher epoch ranks above every token of a lower one."""
    if not 0 <= token < 1 << EPOCH_SHIFT:
        raise LockError(f"fencing token {token} does not fit in 48 bits; it cannot be combined with an epoch")
    return (epoch << EPOCH_SHIFT) | token


def parse_epoch(raw: str, where: str) -> int:
    """The epoch a config value or URL option names; a :class:`ConfigError` naming ``where`` and the key if bad."""
    if not (raw.isascii() and raw.isdigit()) or int(raw) > MAX_EPOCH:
        raise ConfigError(
            f"{where} {OPTION} = {raw!r}: expected a whole number from 0 to {MAX_EPOCH} "
            "(1 to continue the tokens of a finished migration; see docs/migration.md)"
        )
    return int(raw)


def check_fencing(guarantees: Guarantees, scheme: str, where: str) -> None:
    if guarantees.fencing == "none":
        raise ConfigError(
            f"{where} sets {OPTION}, but the {scheme}:// driver hands out no fencing tokens to lift; "
            "remove the option (or use a driver with fencing)"
        )


def _lift(epoch: int, grant: Grant | None) -> Grant | None:
    if grant is None:
        return None
    return Grant(composite_token(epoch, grant.fencing_token), grant.ttl, grant.sent_at)


def _lift_all(epoch: int, results: Sequence[Grant | Exception | None]) -> list[Grant | Exception | None]:
    return [r if isinstance(r, Exception) else _lift(epoch, r) for r in results]


def _lift_holder(epoch: int, info: HolderInfo) -> HolderInfo:
    if info.fencing_token is None:
        return info
    return HolderInfo(
        info.held, info.token_hint, composite_token(epoch, info.fencing_token), info.ttl_left, info.waiters
    )


class EpochDriver:
    """A blocking driver whose fencing tokens carry ``epoch`` in their top bits."""

    guarantees: ClassVar[Guarantees]

    def __init__(self, inner: Driver, epoch: int) -> None:
        self.inner = inner
        self.epoch = epoch
        self.guarantees = inner.guarantees  # type: ignore[misc]  # per instance: mirrors the wrapped driver

    def acquire(
        self, name: str, token: str, ttl: float, deadline: float | None, cancel: Cancel | None = None
    ) -> Grant | None:
        grant = self.inner.acquire(name, token, ttl, deadline, cancel)
        try:
            return _lift(self.epoch, grant)
        except LockError:
            self.inner.release(name, token)  # a token that cannot be lifted must not leave the lock held
            raise

    def renew(self, name: str, token: str, ttl: float) -> Grant | None:
        return _lift(self.epoch, self.inner.renew(name, token, ttl))

    def renew_many(self, requests: Sequence[RenewRequest]) -> list[Grant | Exception | None]:
        return _lift_all(self.epoch, self.inner.renew_many(requests))

    def release(self, name: str, token: str) -> bool:
        return self.inner.release(name, token)

    def holder(self, name: str) -> HolderInfo:
        return _lift_holder(self.epoch, self.inner.holder(name))

    def force_release(self, name: str) -> bool:
        return self.inner.force_release(name)

    def ping(self) -> None:
        self.inner.ping()

    def close(self) -> None:
        self.inner.close()


class AsyncEpochDriver:
    """The asyncio twin of :class:`EpochDriver`, over a native :class:`AsyncDriver`."""

    guarantees: ClassVar[Guarantees]

    def __init__(self, inner: AsyncDriver, epoch: int) -> None:
        self.inner = inner
        self.epoch = epoch
        self.guarantees = inner.guarantees  # type: ignore[misc]  # per instance: mirrors the wrapped driver

    async def acquire(self, name: str, token: str, ttl: float, deadline: float | None) -> Grant | None:
        grant = await self.inner.acquire(name, token, ttl, deadline)
        try:
            return _lift(self.epoch, grant)
        except LockError:
            await self.inner.release(name, token)  # a token that cannot be lifted must not leave the lock held
            raise

    async def renew(self, name: str, token: str, ttl: float) -> Grant | None:
        return _lift(self.epoch, await self.inner.renew(name, token, ttl))

    async def renew_many(self, requests: Sequence[RenewRequest]) -> list[Grant | Exception | None]:
        return _lift_all(self.epoch, await self.inner.renew_many(requests))

    async def release(self, name: str, token: str) -> bool:
        return await self.inner.release(name, token)

    async def holder(self, name: str) -> HolderInfo:
        return _lift_holder(self.epoch, await self.inner.holder(name))

    async def force_release(self, name: str) -> bool:
        return await self.inner.force_release(name)

    async def ping(self) -> None:
        await self.inner.ping()

    async def close(self) -> None:
        await self.inner.close()
