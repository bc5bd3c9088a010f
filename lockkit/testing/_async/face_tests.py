"""The conformance tests that only the asyncio face has, written by hand and never generated.

A blocking call cannot be cancelled half-way by another party, so what a cancelled task must leave behind
has no blocking twin. :class:`~lockkit.testing.AsyncConformanceSuite` mixes these in; the blocking suite
mixes in ``../_sync/face_tests.py``'s (empty) twin.
"""

from __future__ import annotations

import asyncio
import time

import pytest

import lockkit

from .._common import HOLD_TTL, SLACK

__all__ = ["FaceTests"]


class FaceTests:
    """Task cancellation (C-8). Uses the ``locks``, ``other`` and ``name`` fixtures of the suite it is mixed into."""

    async def test_cancelled_acquire_leaves_nothing(  # C-8
        self, locks: lockkit.AsyncLocker, other: lockkit.AsyncLocker, name: str
    ) -> None:
        holder = locks.lock(name, ttl=HOLD_TTL)
        await holder.acquire()
        for _ in range(5):
            task = asyncio.ensure_future(other.lock(name).acquire())
            await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        await holder.release()
        third = locks.lock(name, ttl=HOLD_TTL)
        started = time.monotonic()
        await third.acquire(timeout=10)
        assert time.monotonic() - started < SLACK, "a cancelled waiter still stood in the queue"
        await third.release()
        await asyncio.sleep(0.2)  # a grant racing a cancel is released in the background
        assert not (await locks.holder(name)).held, "a cancelled acquire left the lock held"
