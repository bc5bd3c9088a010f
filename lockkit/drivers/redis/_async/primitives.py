"""What the asyncio face of the Redis drivers does its own way, written by hand (``../_sync/primitives.py`` is
its blocking twin, with the same names).

* the connections: :func:`open_pool` and :func:`read_replies`;
* :class:`AsyncBackground`: what runs beside the callers of a driver — the watchers of its waiters, and the
  clean-up of an acquire that ended early, which runs in a task of its own here (a cancelled caller is not
  held up by a round trip) and inline on the blocking face.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, ParamSpec, TypeVar

import redis.asyncio
from redis.exceptions import ResponseError

from ....driver import Cancel
from ..config import NodeSpec
from ..hub import Hub, Snapshot
from ..watch import AsyncWatcher

__all__ = ["AsyncBackground", "AsyncConnectionPool", "open_pool", "read_replies"]

T = TypeVar("T")
P = ParamSpec("P")


async def _mark_fresh(conn: Any) -> None:
    await conn.on_connect()
    conn.lockkit_fresh = True


class AsyncConnectionPool:
    """redis.asyncio's blocking pool, with the three calls a node makes."""

    def __init__(self, spec: NodeSpec) -> None:
        kwargs = spec.pool_kwargs(_mark_fresh)
        if spec.path is not None:
            kwargs["connection_class"] = redis.asyncio.UnixDomainSocketConnection
        elif spec.tls:
            kwargs["connection_class"] = redis.asyncio.SSLConnection
        self._pool: Any = redis.asyncio.BlockingConnectionPool(**kwargs)

    async def get(self) -> Any:
        return await self._pool.get_connection()

    async def release(self, conn: Any) -> None:
        await self._pool.release(conn)

    async def disconnect(self) -> None:
        await self._pool.disconnect()


def open_pool(spec: NodeSpec) -> AsyncConnectionPool:
    return AsyncConnectionPool(spec)


def _remaining(deadline: float) -> float:
    return max(0.001, deadline - time.monotonic())


async def read_replies(conn: Any, count: int, deadline: float) -> list[Any]:
    """Read ``count`` replies; the first may wait until ``deadline`` (monotonic). Error replies are returned
    as redis-py's exception objects."""
    replies: list[Any] = []
    for i in range(count):
        try:
            replies.append(await (conn.read_response(timeout=_remaining(deadline)) if i == 0 else conn.read_response()))
        except ResponseError as exc:
            replies.append(exc)
    return replies


class AsyncBackground:
    """What runs beside an asyncio driver's callers: its waiters' watchers and the clean-ups of acquires."""

    def __init__(self, name: str) -> None:
        self._cleanups: set[asyncio.Task[Any]] = set()

    def watcher(
        self,
        targets: Sequence[tuple[Hub, bytes]],
        cancel: Cancel | None,
        wid: str | None = None,
        before: list[Snapshot] | None = None,
    ) -> AsyncWatcher:
        """A waiter on ``targets`` (see :class:`..watch.AsyncWatcher`)."""
        return AsyncWatcher(targets, cancel, wid, before)

    def clean_up(self, step: Callable[P, Coroutine[Any, Any, None]], *args: P.args, **kwargs: P.kwargs) -> None:
        """Run ``step(*args, **kwargs)`` in a task of its own, so that a cancelled caller is not held up by a
        round trip; :meth:`close` waits for it."""
        task = asyncio.get_running_loop().create_task(step(*args, **kwargs))
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)

    async def shielded(
        self,
        attempt: Callable[[], Coroutine[Any, Any, T | None]],
        watcher: AsyncWatcher,
        undo: Callable[[], Coroutine[Any, Any, None]],
    ) -> T | None:
        """Run an acquire's ``attempt()`` in a task the caller's cancel does not reach.

        A cancel in the middle of a Redlock fan-out would leave requests sent to some masters with their
        replies unread on pooled connections. The caller's cancel interrupts the watcher's next wait instead,
        and a grant that raced the cancel (or an attempt that failed half-way) is undone with ``undo()``.
        """
        inner = asyncio.ensure_future(attempt())
        try:
            return await asyncio.shield(inner)
        except asyncio.CancelledError:
            watcher.interrupt()
            inner.add_done_callback(lambda done: self._undo_after(done, undo))
            raise

    def _undo_after(self, done: asyncio.Future[T | None], undo: Callable[[], Coroutine[Any, Any, None]]) -> None:
        if done.cancelled() or (done.exception() is None and done.result() is None):
            return
        self.clean_up(undo)

    async def close(self, hubs: Sequence[Hub]) -> None:
        """Wait for the clean-ups still running, then close the hubs."""
        if self._cleanups:
            await asyncio.gather(*self._cleanups, return_exceptions=True)
        for hub in hubs:
            await hub.close()
