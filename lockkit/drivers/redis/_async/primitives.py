"""What the asyncio face of the Redis drivers does its own way, written by hand (``../_sync/primitives.py`` is
its blocking twin, with the same names).

* the connection pool, :class:`AsyncConnectionPool` (the bytes themselves move through :mod:`.stream`);
* :class:`AsyncBackground`: what runs beside the callers of a driver — the watchers of its waiters, and the
  clean-up of an acquire that ended early, which runs in a task of its own here (a cancelled caller is not
  held up by a round trip) and inline on the blocking face.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import weakref
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, ParamSpec, TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError

from ....driver import Cancel
from ..hub import Hub, Snapshot
from ..watch import AsyncWatcher
from .connection import AsyncConnection

__all__ = ["AsyncBackground", "AsyncConnectionPool", "pause"]

T = TypeVar("T")
P = ParamSpec("P")


async def pause(seconds: float) -> None:
    """Wait a little before trying again (Sentinel: between questions while a failover is under way)."""
    await asyncio.sleep(seconds)


def _fail(waiter: asyncio.Future[Any], error: Exception) -> None:
    if not waiter.done():
        waiter.set_exception(error)


_pools: weakref.WeakSet[AsyncConnectionPool] = weakref.WeakSet()
"""Every live asyncio pool of this process, for the fork hook below."""
_inherited: list[set[AsyncConnection]] = []
"""A forked child's copies of its parent's connections, kept unused and untouched (see ``_after_fork``)."""


def _forget_the_parents_connections() -> None:
    for pool in list(_pools):
        pool._after_fork()


if hasattr(os, "register_at_fork"):  # not on Windows, where there is no fork
    os.register_at_fork(after_in_child=_forget_the_parents_connections)


class AsyncConnectionPool:
    """The asyncio twin of :class:`..pool.ConnectionPool`: at most ``size`` connections, reused last in first
    out, each made fit by :meth:`~.connection.AsyncConnection.ready` before it is handed out; a caller waits up
    to ``wait`` seconds for one. One event loop uses it, so it needs no lock. Fork safe as the blocking pool is:
    a forked child starts with an empty pool."""

    def __init__(self, make: Callable[[], AsyncConnection], size: int, wait: float) -> None:
        self._make, self._size, self._wait = make, size, wait
        self._idle: list[AsyncConnection] = []
        self._all: set[AsyncConnection] = set()
        self._waiters: collections.deque[asyncio.Future[AsyncConnection]] = collections.deque()
        _pools.add(self)

    def _after_fork(self) -> None:
        """In a forked child: forget the parent's connections. A child that used them (a new ``asyncio.run`` in
        a worker forked from a process whose asyncio locker had made calls) wrote its commands on the parent's
        sockets, and the replies went to whichever process read first: the child's own loop never reads those
        sockets, so it waited out the timeout, and the parent found stray replies. They are not closed either:
        their transports belong to the parent's event loop, whose epoll instance the child shares, and
        unregistering them there would take them from the parent's loop too. They are kept, unused."""
        if self._all:
            _inherited.append(self._all)
        self._idle, self._all, self._waiters = [], set(), collections.deque()

    async def get(self, ready: bool = True) -> AsyncConnection:
        """A connection, made fit to carry commands unless ``ready`` is false (the caller then calls its
        :meth:`~.connection.AsyncConnection.ready` itself, or returns it)."""
        if self._idle:
            conn = self._idle.pop()
        elif len(self._all) < self._size:
            conn = self._make()
            self._all.add(conn)
        else:
            conn = await self._wait_for_one()
        if ready:
            try:
                await conn.ready()
            except BaseException:
                self.release(conn)
                raise
        return conn

    async def _wait_for_one(self) -> AsyncConnection:
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[AsyncConnection] = loop.create_future()
        self._waiters.append(waiter)
        error = RedisConnectionError(
            f"no connection free within {self._wait:g} s (all {self._size} in use; raise the pool_size option)"
        )
        handle = loop.call_later(self._wait, _fail, waiter, error)
        try:
            return await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self.release(waiter.result())  # handed over just as this caller gave up: pass it on
            raise
        finally:
            handle.cancel()
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)

    def release(self, conn: AsyncConnection) -> None:
        if conn not in self._all:
            return
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        self._idle.append(conn)

    async def disconnect(self) -> None:
        """Close every connection (the pool stays usable: later gets connect afresh)."""
        for conn in list(self._all):
            await conn.close()


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

    def clean_up_later(self, step: Callable[P, Coroutine[Any, Any, None]], *args: P.args, **kwargs: P.kwargs) -> None:
        """:meth:`clean_up` (on this face every clean-up runs in a task of its own; the blocking twin differs)."""
        self.clean_up(step, *args, **kwargs)

    def listen(self, hub: Hub, channel: bytes, wake: Callable[[bytes], None]) -> None:
        """Keep ``wake`` registered on ``hub``'s ``channel`` until the hub closes (Sentinel: ``+switch-master``);
        the subscription is confirmed in a task of its own, which :meth:`close` waits for."""
        task = asyncio.get_running_loop().create_task(hub.watch(channel, wake))
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
