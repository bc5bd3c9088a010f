"""A clear error for the other face's context manager: ``with`` on an asyncio handle, ``async with`` on a
blocking one (both were Python's bare TypeError, outside the LockError tree, with no word of what to do).

One face-neutral base for both faces: the blocking classes are generated from the asyncio ones by token
substitution (scripts/unasync.py), so ``class AsyncLock(FaceGuard)`` becomes ``class Lock(FaceGuard)``. Each
face defines its own pair of methods, which override two of these four; the other two stay and raise. This
module lives outside ``_async`` so that it is not itself turned into a blocking twin.
"""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING

from .errors import UsageError

__all__ = ["FaceGuard"]


class FaceGuard:
    """Base of the lock and permit handles of both faces; see the module."""

    # Hidden from type checkers: there the wrong statement stays a static error ("has no attribute
    # __enter__"), and the faces' own __enter__ -> Lease / __aenter__ -> Lease are not overrides of a NoReturn.
    if not TYPE_CHECKING:

        def __enter__(self) -> None:  # reached on the asyncio face only (the blocking face defines its own)
            kind = type(self).__name__
            raise UsageError(
                f"{kind} is lockkit's asyncio face: use `async with` on it (or `await ….acquire()`) inside a "
                "coroutine, or lockkit.connect() for the blocking face, whose handles work with a plain `with`"
            )

        def __exit__(
            self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
        ) -> None:
            """Never reached (``__enter__`` raised): Python wants both before it calls either."""

        async def __aenter__(self) -> None:  # reached on the blocking face only
            kind = type(self).__name__
            raise UsageError(
                f"{kind} is lockkit's blocking face: use a plain `with` on it (or `.acquire()`), or "
                "lockkit.connect_async() for the asyncio face, whose handles work with `async with`"
            )

        async def __aexit__(
            self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
        ) -> None:
            """Never reached (``__aenter__`` raised)."""
