"""The one thread-offload adapter: an :class:`AsyncDriver` over a blocking :class:`Driver`.

Used for backends whose client has no asyncio API (kazoo, the etcd3 client) and
for the embedded drivers. Each call runs in a thread of a pool owned by the
adapter; an ``acquire`` that is waiting blocks one pool thread, so the pool is
sized for many concurrent waiters rather than for CPU work.

Cancellation cleans up: cancelling the awaiting task fires the driver's
:class:`~lockkit.driver.Cancel`, which wakes the blocked wait so that it removes
what it queued; and if the grant raced the cancel, the lock is released at once
so that a cancelled acquire never leaves a lock held.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, TypeVar

from .driver import Cancel, Driver, Grant, Guarantees, HolderInfo, RenewRequest

__all__ = ["ThreadOffloadDriver"]

log = logging.getLogger("lockkit")
T = TypeVar("T")

MAX_OFFLOAD_THREADS = 256


class ThreadOffloadDriver:
    """Runs a blocking driver's calls in worker threads so an event loop never blocks."""

    guarantees: ClassVar[Guarantees]
    finish_inline: ClassVar[bool] = True
    """Its calls await a thread's future and never cancel their own task: an asyncio release or renew runs in
    the caller's task until a cancellation arrives (``lockkit._async.cancel_safe``; issue 17)."""

    def __init__(self, driver: Driver, max_threads: int = MAX_OFFLOAD_THREADS) -> None:
        self.sync = driver
        self.guarantees = driver.guarantees  # type: ignore[misc]  # per instance: mirrors the wrapped class
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=max_threads, thread_name_prefix="lockkit-offload"
        )

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.wrap_future(self._pool.submit(fn, *args))

    async def acquire(
        self, name: str, token: str, ttl: float, deadline: float | None, cancel: Cancel | None = None
    ) -> Grant | None:
        # Our own signal, fired by the task's cancellation or by the caller's ``cancel``: cancelling the task
        # must not fire a Cancel the caller may share with other calls.
        stop = Cancel()
        unhook = cancel.on_cancel(stop.cancel) if cancel is not None else None
        future = self._pool.submit(self.sync.acquire, name, token, ttl, deadline, stop)
        try:
            # Not shielded (a shield costs a future and a turn of the loop per call, issue 17): a cancelled await
            # cancels ``future`` too, which stops it only if no thread has started it (then nothing was sent);
            # a started one runs on, ``stop`` ends its wait, and its grant, if any, is released below.
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            stop.cancel()
            future.add_done_callback(lambda done: self._release_if_granted(done, name, token))
            raise
        finally:
            if unhook is not None:
                unhook()

    def _release_if_granted(self, done: concurrent.futures.Future[Grant | None], name: str, token: str) -> None:
        if done.cancelled():
            return
        error = done.exception()
        if error is not None:
            log.debug("lockkit: a cancelled acquire of %r ended with %r", name, error)
            return
        if done.result() is None:
            return
        try:
            self.sync.release(name, token)
        except Exception:  # logged: the lock then frees when its TTL passes
            log.warning("lockkit: could not release a lock granted to a cancelled acquire", exc_info=True)

    async def renew(self, name: str, token: str, ttl: float) -> Grant | None:
        return await self._run(self.sync.renew, name, token, ttl)

    async def renew_many(self, requests: Sequence[RenewRequest]) -> list[Grant | Exception | None]:
        return await self._run(self.sync.renew_many, requests)

    async def release(self, name: str, token: str) -> bool:
        return await self._run(self.sync.release, name, token)

    async def holder(self, name: str) -> HolderInfo:
        return await self._run(self.sync.holder, name)

    async def force_release(self, name: str) -> bool:
        return await self._run(self.sync.force_release, name)

    async def ping(self) -> None:
        await self._run(self.sync.ping)

    async def close(self) -> None:
        await self._run(self.sync.close)
        self._pool.shutdown(wait=False, cancel_futures=True)
