"""Deliberately broken drivers and a broken fencing store, for tests only: never use them for locking.

They exist so that the test suite can show that every figure ``lockkit verify`` reports is able to fail
(``tests/test_verify_can_fail.py``), and that the model-based test of permits finds a broken semaphore or
reader-writer lock (``tests/test_permit_model.py``). Each breaks exactly one promise of a correct backend and keeps the
rest of the file:// driver. Nothing in lockkit registers them: a test makes them visible, to its own
subprocesses only, through the ordinary ``lockkit.drivers`` entry-point group (a ``.dist-info`` directory
on ``PYTHONPATH``, see :func:`entry_points_txt`), so ``lockkit verify``'s spawned workers open them by
their URL scheme exactly as they would open a third-party driver.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..cli.fencing_store import FencedStore
from ..driver import Cancel, Grant, PermitInfo, PermitMode
from ..drivers.embedded.file import FileDriver
from ..drivers.embedded.file_permits import FilePermits

__all__ = [
    "BROKEN_PERMIT_SCHEMES",
    "BROKEN_SCHEMES",
    "BackwardsFenceFileDriver",
    "FrozenFenceFileDriver",
    "FrozenFencePermitsFileDriver",
    "FrozenNoExclusionFileDriver",
    "NoExclusionFileDriver",
    "NoFencingFileDriver",
    "NoFencingNoExclusionFileDriver",
    "OverLimitFileDriver",
    "SameTokenFencedStore",
    "WriterAsReaderFileDriver",
    "entry_points_txt",
]


class FrozenFenceFileDriver(FileDriver):
    """Excludes correctly, but every lease gets fencing token 1 (the planted bug of issue 20)."""

    def acquire(
        self, name: str, token: str, ttl: float, deadline: float | None, cancel: Cancel | None = None
    ) -> Grant | None:
        grant = super().acquire(name, token, ttl, deadline, cancel)
        return None if grant is None else grant._replace(fencing_token=1)


class BackwardsFenceFileDriver(FileDriver):
    """Excludes correctly, but each new lease gets a *lower* fencing token than the one before."""

    def acquire(
        self, name: str, token: str, ttl: float, deadline: float | None, cancel: Cancel | None = None
    ) -> Grant | None:
        grant = super().acquire(name, token, ttl, deadline, cancel)
        return None if grant is None else grant._replace(fencing_token=1_000_000 - grant.fencing_token)


class NoExclusionFileDriver(FileDriver):
    """Hands out distinct, rising fencing tokens, but frees the lock the moment it grants it: no exclusion.

    Every caller gets the lock at once, so several hold it together, while the tokens stay correct.
    """

    def acquire(
        self, name: str, token: str, ttl: float, deadline: float | None, cancel: Cancel | None = None
    ) -> Grant | None:
        grant = super().acquire(name, token, ttl, deadline, cancel)
        if grant is not None:
            super().release(name, token)
        return grant

    def release(self, name: str, token: str) -> bool:
        super().release(name, token)
        return True  # the holder must not notice: a broken backend that says so is not the bug planted here


class FrozenNoExclusionFileDriver(NoExclusionFileDriver):
    """No exclusion and every fencing token 1: only the store's same-token rule can then save an update."""

    def acquire(
        self, name: str, token: str, ttl: float, deadline: float | None, cancel: Cancel | None = None
    ) -> Grant | None:
        grant = super().acquire(name, token, ttl, deadline, cancel)
        return None if grant is None else grant._replace(fencing_token=1)


_NO_FENCING = dataclasses.replace(FileDriver.guarantees, fencing="none", note="test-only: no fencing tokens")


class NoFencingFileDriver(FileDriver):
    """A correct lock that offers no fencing token, as Redlock does (its leases are not ``fenced``): for contrast."""

    guarantees = _NO_FENCING

    def acquire(
        self, name: str, token: str, ttl: float, deadline: float | None, cancel: Cancel | None = None
    ) -> Grant | None:
        grant = super().acquire(name, token, ttl, deadline, cancel)
        return None if grant is None else grant._replace(fencing_token=0)


class NoFencingNoExclusionFileDriver(NoExclusionFileDriver):
    """No exclusion and no fencing token: nothing stands between two holders' read-modify-writes."""

    guarantees = _NO_FENCING

    def acquire(
        self, name: str, token: str, ttl: float, deadline: float | None, cancel: Cancel | None = None
    ) -> Grant | None:
        grant = super().acquire(name, token, ttl, deadline, cancel)
        return None if grant is None else grant._replace(fencing_token=0)


class SameTokenFencedStore(FencedStore):
    """The store with the mutant of issue 20 (cli/fencing_store.py:80): a different lease with the current token
    is let through, as if it were the holder writing twice."""

    @staticmethod
    def _current(token: int, lease: str, max_token: int, last_lease: str) -> bool:
        return token >= max_token


class _OverLimitPermits(FilePermits):
    """Admits one permit more than the limit, and reports the limit the handles asked for (the off-by-one)."""

    def acquire_permit(
        self,
        name: str,
        token: str,
        ttl: float,
        deadline: float | None,
        limit: int,
        mode: PermitMode,
        cancel: Cancel | None = None,
    ) -> Grant | None:
        return super().acquire_permit(name, token, ttl, deadline, limit + (mode == "permit"), mode, cancel)

    def permit_holders(self, name: str) -> PermitInfo:
        info = super().permit_holders(name)
        return dataclasses.replace(info, limit=info.limit - 1) if info.limit else info


class _WriterAsReaderPermits(FilePermits):
    """Takes a writer's side as a reader's: a writer shares its rwlock with readers (tokens stay correct)."""

    def acquire_permit(
        self,
        name: str,
        token: str,
        ttl: float,
        deadline: float | None,
        limit: int,
        mode: PermitMode,
        cancel: Cancel | None = None,
    ) -> Grant | None:
        return super().acquire_permit(name, token, ttl, deadline, limit, "read" if mode == "write" else mode, cancel)


class _FrozenFencePermits(FilePermits):
    """Counts and excludes correctly, but every permit and side gets fencing token 1 (a reused fence)."""

    def acquire_permit(
        self,
        name: str,
        token: str,
        ttl: float,
        deadline: float | None,
        limit: int,
        mode: PermitMode,
        cancel: Cancel | None = None,
    ) -> Grant | None:
        grant = super().acquire_permit(name, token, ttl, deadline, limit, mode, cancel)
        return None if grant is None else grant._replace(fencing_token=1)


class OverLimitFileDriver(FileDriver):
    """Correct locks; semaphores that admit ``limit + 1`` holders."""

    def permits(self, events: object = None) -> Any:
        return _OverLimitPermits(self)


class WriterAsReaderFileDriver(FileDriver):
    """Correct locks; reader-writer locks whose writers are admitted beside readers."""

    def permits(self, events: object = None) -> Any:
        return _WriterAsReaderPermits(self)


class FrozenFencePermitsFileDriver(FileDriver):
    """Correct locks; permits and rwlock sides all get fencing token 1."""

    def permits(self, events: object = None) -> Any:
        return _FrozenFencePermits(self)


BROKEN_PERMIT_SCHEMES: dict[str, type[FileDriver]] = {
    "overlimitfile": OverLimitFileDriver,
    "writerreadsfile": WriterAsReaderFileDriver,
    "frozenpermitfile": FrozenFencePermitsFileDriver,
}
"""Broken permit drivers (``tests/test_permit_model.py`` shows the model finds each), registered with the rest."""

BROKEN_SCHEMES: dict[str, type[FileDriver]] = {
    "frozenfile": FrozenFenceFileDriver,
    "backwardsfile": BackwardsFenceFileDriver,
    "sharedfile": NoExclusionFileDriver,
    "frozensharedfile": FrozenNoExclusionFileDriver,
    "nofencefile": NoFencingFileDriver,
    "nofencesharedfile": NoFencingNoExclusionFileDriver,
}


def entry_points_txt() -> str:
    """The ``entry_points.txt`` that registers :data:`BROKEN_SCHEMES` under ``lockkit.drivers``."""
    lines = ["[lockkit.drivers]"]
    schemes = {**BROKEN_SCHEMES, **BROKEN_PERMIT_SCHEMES}
    lines += [f"{scheme} = {cls.__module__}:{cls.__qualname__}" for scheme, cls in schemes.items()]
    return "\n".join(lines) + "\n"
