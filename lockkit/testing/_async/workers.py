"""Child-process workers for the conformance suite (module-level, so that ``spawn`` can import them).

This file is the source of the blocking workers too: ``scripts/unasync.py`` generates ``../_sync/workers.py``.
"""

from __future__ import annotations

import time
from pathlib import Path

import lockkit

from .primitives import sleep

__all__ = ["increment_under_lock"]


async def increment_under_lock(url: str | None, name: str, counter: str, rounds: int, log: str) -> None:
    """Read-modify-write a counter file ``rounds`` times under the lock, logging enter/exit times.

    ``url=None`` uses ``lockkit.connect_async()``'s own resolution (``LOCKKIT_URL``, ``LOCKKIT_CONFIG``, …).
    """
    async with lockkit.connect_async(url) as locks:
        lock = locks.lock(name, ttl=10)
        for _ in range(rounds):
            async with lock as lease:
                entered = time.monotonic()
                path = Path(counter)
                value = int(path.read_text() or "0")
                await sleep(0.001)  # widen the race window: without the lock, updates are lost
                path.write_text(str(value + 1))
                left = time.monotonic()
                with open(log, "a", encoding="utf-8") as handle:
                    handle.write(f"{entered} {left} {lease.fence or 0}\n")
