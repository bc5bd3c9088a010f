"""Small asyncio helpers that behave the same on Python 3.10 to 3.13."""

from __future__ import annotations

import asyncio

__all__ = ["wait_event"]


async def wait_event(event: asyncio.Event, timeout: float | None) -> bool:
    """Wait until ``event`` is set (True) or ``timeout`` passes (False).

    Not ``asyncio.wait_for``: before Python 3.12 it can swallow a cancellation of the caller when the event
    is set at the same moment (bpo-37658 / gh-86296), and a cancelled ``acquire`` must never carry on and
    take the lock. ``asyncio.wait`` always lets the caller's cancellation through.
    """
    if event.is_set():
        return True
    waiter = asyncio.ensure_future(event.wait())
    try:
        done, _ = await asyncio.wait({waiter}, timeout=timeout)
    finally:
        waiter.cancel()
    return bool(done)
