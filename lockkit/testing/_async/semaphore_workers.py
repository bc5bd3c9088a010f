"""Child-process workers for the semaphore conformance suite (module-level, so that ``spawn`` imports them).

This file is the source of the blocking workers too: ``scripts/unasync.py`` generates
``../_sync/semaphore_workers.py``.
"""

from __future__ import annotations

import fcntl
import os
import signal
import time
from pathlib import Path

import lockkit

from .primitives import sleep

__all__ = ["hold_and_wait", "permits_under_load"]


def _bump(counter: str, delta: int, cap: int) -> int:
    """Add ``delta`` to the shared counter under its flock; return the new value (a breach is recorded too)."""
    with open(counter, "r+", encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        inside, worst = (int(x) for x in (handle.read().split() or ["0", "0"]))
        inside += delta
        worst = max(worst, inside)
        handle.seek(0)
        handle.truncate()
        handle.write(f"{inside} {worst}")
        return inside


async def permits_under_load(url: str, name: str, limit: int, mode: str, rounds: int, counter: str, log: str) -> None:
    """Take a permit ``rounds`` times (``mode``: permit, read or write); count holders in a shared file.

    ``counter`` holds ``"<inside> <most ever inside>"``, updated under ``flock`` on entry and exit, so a
    permit handed to more than ``limit`` holders at once shows as a maximum above it.
    """
    async with lockkit.connect_async(url) as locks:
        if mode == "permit":
            handle: lockkit.AsyncPermit = locks.semaphore(name, limit=limit, ttl=10)
        else:
            rw = locks.rwlock(name, ttl=10)
            handle = rw.write() if mode == "write" else rw.read()
        for _ in range(rounds):
            async with handle as lease:
                entered = time.monotonic()
                _bump(counter, 1, limit)
                await sleep(0.002)
                _bump(counter, -1, limit)
                left = time.monotonic()
                with open(log, "a", encoding="utf-8") as out:
                    out.write(f"{entered} {left} {lease.fence or 0} {mode}\n")


async def hold_and_wait(url: str, name: str, limit: int, mode: str, ttl: float, ready: str) -> None:
    """Take one permit with ``ttl`` (auto-renewed), say so by writing ``ready``, then sleep until killed; a
    holder that finds its lease invalid (it was SIGSTOPped past its ttl and resumed) writes ``ready + ".lost"``
    and ends itself."""
    async with lockkit.connect_async(url) as locks:
        if mode == "permit":
            handle: lockkit.AsyncPermit = locks.semaphore(name, limit=limit, ttl=ttl, auto_renew=True)
        else:
            rw = locks.rwlock(name, ttl=ttl, auto_renew=True)
            handle = rw.write() if mode == "write" else rw.read()
        lease = await handle.acquire(timeout=30)
        Path(ready).write_text(f"{os.getpid()} {lease.fence or 0}")
        while True:  # renewed until SIGKILL, or frozen by SIGSTOP
            await sleep(0.05)
            if not lease.valid:
                Path(ready + ".lost").write_text("invalid")
                os.kill(os.getpid(), signal.SIGTERM)
