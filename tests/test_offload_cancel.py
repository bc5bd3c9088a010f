"""A cancelled asyncio acquire on an offloaded face (memory://, file://, etcd://, zookeeper://, postgresql://
run their blocking driver in worker threads) returns only after what it queued is gone.

docs/semantics.md: "A waiter that times out or is cancelled removes whatever it queued before returning." A
docs audit found the cancelled task returning while its worker thread was still leaving the queue: right after
the CancelledError, ``holder().waiters`` still counted it (file:// in 3 of 4 runs here). The adapter now waits
(at most ``lockkit.offload.CANCEL_WAIT``) for a started call to end before the cancellation goes on.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

import lockkit


@pytest.mark.parametrize("scheme", ["memory", "file"])
def test_a_cancelled_offloaded_acquire_has_left_the_queue_when_it_returns(scheme: str, tmp_path: Path) -> None:
    url = f"memory://cancel-{uuid.uuid4().hex[:6]}" if scheme == "memory" else (tmp_path / "locks").as_uri()

    async def main() -> None:
        async with lockkit.connect_async(url) as locks:
            for round_ in range(5):
                name = f"cancel-{round_}"
                holder = locks.lock(name, ttl=10)
                await holder.acquire()
                task = asyncio.create_task(locks.lock(name, ttl=10).acquire())
                for _ in range(200):  # until the waiter is queued (it waits in a worker thread)
                    if (await locks.holder(name)).waiters:
                        break
                    await asyncio.sleep(0.01)
                assert (await locks.holder(name)).waiters == 1
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                assert (await locks.holder(name)).waiters == 0, f"round {round_}: the cancelled waiter is still queued"
                await holder.release()

    asyncio.run(main())
