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
waiting and renewal are the wrapped driver's. Epoch 0 is the bare driver. The wrappers themselves are
:class:`~lockkit.drivers._async.epoch_driver.AsyncEpochDriver` and its generated blocking twin ``EpochDriver``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ..driver import Grant, Guarantees, HolderInfo, Offer
from ..errors import ConfigError, LockError

__all__ = [
    "EPOCH_SHIFT", "MAX_EPOCH", "composite_token", "lift", "lift_all", "lift_holder", "parse_epoch", "without_permits",
]  # fmt: skip

EPOCH_SHIFT = 48
MAX_EPOCH = (1 << (63 - EPOCH_SHIFT)) - 1
"""The largest epoch whose composite tokens still fit a signed 64-bit column (``BIGINT``)."""
OPTION = "fencing_epoch"

PERMITS_NOT_LIFTED = Offer(
    "not yet",
    "fencing_epoch lifts the tokens of locks only, not those of permits; for semaphores and reader-writer locks "
    "configure a second backend entry for the same servers without fencing_epoch and route permit names to it",
)


def without_permits(guarantees: Guarantees) -> Guarantees:
    """The wrapped driver's guarantees, with permits declared "not yet": the wrapper cannot pass them through
    (their fences would not carry the epoch), and a refusal must come from the data before any call."""
    if not guarantees.semaphores:
        return guarantees
    return dataclasses.replace(guarantees, semaphores=PERMITS_NOT_LIFTED)


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


def check_fencing(guarantees: Guarantees, scheme: str, where: str, *, own_epoch: bool = False) -> None:
    """Refuse ``fencing_epoch`` on a driver without tokens, or whose tokens already carry an epoch of their own
    (``own_epoch``: redis+sentinel:// and redis+cluster:// lift theirs by the master's config epoch, so a second
    lift would not fit in 64 bits and every grant after the first failover would fail)."""
    if guarantees.fencing == "none":
        raise ConfigError(
            f"{where} sets {OPTION}, but the {scheme}:// driver hands out no fencing tokens to lift; "
            "remove the option (or use a driver with fencing)"
        )
    if own_epoch:
        raise ConfigError(
            f"{where} sets {OPTION}, but the {scheme}:// driver's tokens already carry an epoch of their own "
            "(the master's config epoch, which rises at every failover); remove the option: its tokens outrank "
            "a single-node backend's already"
        )


def lift(epoch: int, grant: Grant | None) -> Grant | None:
    if grant is None:
        return None
    return Grant(composite_token(epoch, grant.fencing_token), grant.ttl, grant.sent_at)


def lift_all(epoch: int, results: Sequence[Grant | Exception | None]) -> list[Grant | Exception | None]:
    return [r if isinstance(r, Exception) else lift(epoch, r) for r in results]


def lift_holder(epoch: int, info: HolderInfo) -> HolderInfo:
    if info.fencing_token is None:
        return info
    return HolderInfo(
        info.held, info.token_hint, composite_token(epoch, info.fencing_token), info.ttl_left, info.waiters
    )
