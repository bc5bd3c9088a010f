"""The thread-offload adapter (:mod:`lockkit.offload`), the asyncio face of the blocking drivers."""

from __future__ import annotations

import asyncio
import time
import uuid

import lockkit
from lockkit.offload import ThreadOffloadDriver


async def test_c8_offloaded_acquire_cancelled_at_any_point_never_leaves_the_lock_held() -> None:
    """C-8 on the offload adapter, whose acquire is not shielded (issue 17): a cancel that comes before a
    worker thread started the call stops it, one that comes while it runs or after it granted the lock has
    the grant released; either way the lock ends up free."""
    name = f"offload-{uuid.uuid4().hex[:8]}"
    async with lockkit.connect_async(f"memory://offload-{uuid.uuid4().hex[:8]}") as locks:
        assert isinstance(locks.backend_for(name).driver, ThreadOffloadDriver)
        won = 0
        for attempt in range(300):
            lock = locks.lock(name, ttl=60, auto_renew=False)
            task = asyncio.ensure_future(lock.acquire(timeout=5))
            for _ in range(attempt % 5):  # cancel at a different point of the call each time
                await asyncio.sleep(0)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                continue
            won += 1  # finished before the cancel reached it: ours to release
            await lock.release()
        deadline = time.monotonic() + 5
        while (await locks.holder(name)).held and time.monotonic() < deadline:
            await asyncio.sleep(0.02)  # a grant that raced a cancel is released from its worker thread
        assert not (await locks.holder(name)).held, f"a cancelled acquire left the lock held ({won} won)"
