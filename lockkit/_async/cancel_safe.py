"""Small asyncio helpers that behave the same on Python 3.10 to 3.13."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["finish_even_if_cancelled", "wait_event"]

log = logging.getLogger("lockkit")
T = TypeVar("T")

_unawaited: set[asyncio.Task[Any]] = set()
"""Shielded tasks whose caller was cancelled: referenced here so that the loop does not drop them."""


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


async def finish_even_if_cancelled(step: Coroutine[Any, Any, T], what: str) -> T:
    """Run ``step`` to its end even if the awaiting task is cancelled meanwhile.

    For the calls that must not stop half-way: a release (or renew) abandoned between sending and reading
    the reply would leave the lease's state out of step with the server's (released there but still
    ``valid`` here, or still held there with nobody renewing it). The caller's cancellation still reaches
    the caller at once; the step goes on in its own task and records its outcome on the lease, and an
    error nobody is left to see is logged.
    """
    task = asyncio.ensure_future(step)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        if not task.done():
            _unawaited.add(task)
            task.add_done_callback(lambda done: _report(done, what))
        raise


def _report(task: asyncio.Task[Any], what: str) -> None:
    _unawaited.discard(task)
    if task.cancelled():
        log.warning("lockkit: %s was cancelled after its caller (the event loop is closing?)", what)
        return
    error = task.exception()
    if error is not None:
        log.warning("lockkit: %s, finished after its caller was cancelled, raised %r", what, error)
