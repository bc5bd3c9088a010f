"""The asyncio face of blocking permit drivers (``lockkit.permits.OffloadPermits``) on the offload adapter's
lanes: what tests/test_offload.py shows for locks holds for permits (issue 17's review: it kept a
ThreadPoolExecutor of its own, shared by waiting acquires and releases)."""

from __future__ import annotations

import asyncio
import time
import uuid

import lockkit
from lockkit.permits import OffloadPermits, sync_permits


def _memory_permits() -> OffloadPermits:
    locks = lockkit.connect(f"memory://offload-permits-{uuid.uuid4().hex[:8]}")
    return OffloadPermits(sync_permits(locks.backend_for("x").driver, "default"), max_threads=8)


async def test_a_permit_release_never_waits_behind_blocked_acquires() -> None:
    """More permit acquires waiting than there are threads for them: the holder's release runs at once and
    the first waiter is served (before, the release queued behind the waits until one timed out)."""
    permits = _memory_permits()
    name, holder = f"busy-{uuid.uuid4().hex[:8]}", "h" * 32
    try:
        assert await permits.acquire_permit(name, holder, 60, None, 1, "permit") is not None
        waiters = [
            asyncio.ensure_future(permits.acquire_permit(name, f"{i:032d}", 60, time.monotonic() + 30, 1, "permit"))
            for i in range(12)
        ]
        await asyncio.sleep(0.2)  # every acquire thread blocked in a wait, 4 acquires queued
        started = time.monotonic()
        assert await asyncio.wait_for(permits.release_permit(name, holder), 10)
        assert time.monotonic() - started < 5
        done, _ = await asyncio.wait(waiters, timeout=10, return_when=asyncio.FIRST_COMPLETED)
        assert len(done) == 1 and next(iter(done)).result() is not None
        for task in waiters:
            task.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
        deadline = time.monotonic() + 5
        while (await permits.permit_holders(name)).holders != 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert (await permits.permit_holders(name)).holders == 1  # the winner's; the cancelled gave theirs back
    finally:
        await permits.close()


async def test_a_cancelled_permit_acquire_leaves_nothing_held() -> None:
    """C-8 for permits on the offload lanes: cancelled at any point, nothing stays held."""
    permits = _memory_permits()
    name = f"cancel-{uuid.uuid4().hex[:8]}"
    try:
        for attempt in range(200):
            token = f"{attempt:032d}"
            task = asyncio.ensure_future(permits.acquire_permit(name, token, 60, time.monotonic() + 5, 1, "permit"))
            for _ in range(attempt % 5):
                await asyncio.sleep(0)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                continue
            await permits.release_permit(name, token)
        deadline = time.monotonic() + 5
        while (await permits.permit_holders(name)).holders and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert (await permits.permit_holders(name)).holders == 0
    finally:
        await permits.close()
