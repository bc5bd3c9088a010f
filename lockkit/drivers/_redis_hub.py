"""Wake-ups for waiters: one pub/sub connection per server shared by every waiter of a driver.

A :class:`Hub` runs on an event loop: the caller's loop for the asyncio drivers,
and for the blocking drivers one background thread (:class:`LoopThread`, started
at the first contended acquire) that runs the same code. A waiter registers a
``wake`` callable for its lock's channel; the hub subscribes the channel (once,
however many waiters share it) and calls every ``wake`` of that channel when a
release publishes. A channel stays subscribed for :data:`LINGER` seconds after
its last waiter leaves, so a hot lock does not pay SUBSCRIBE/UNSUBSCRIBE on
every hand-off. If the pub/sub connection breaks, every waiter is woken (it
re-checks; a release may have been missed) and the hub reconnects with backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import threading
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

import redis.asyncio
from redis.exceptions import RedisError

from ..driver import Cancel
from ._redis_config import NodeSpec

__all__ = ["AsyncWatcher", "Hub", "LoopThread", "SyncWatcher"]

log = logging.getLogger("lockkit")
T = TypeVar("T")
LINGER = 2.0
Wake = Callable[[], None]


class Hub:
    def __init__(self, spec: NodeSpec) -> None:
        self._spec = spec
        self._waiters: dict[bytes, set[Wake]] = {}
        self._sent: set[bytes] = set()
        self._active: set[bytes] = set()
        self._confirm: dict[bytes, asyncio.Future[None]] = {}
        self._linger: dict[bytes, asyncio.TimerHandle] = {}
        self._conn: Any = None
        self._task: asyncio.Task[None] | None = None
        self._chores: set[asyncio.Task[Any]] = set()
        self._closed = False

    def _connection(self) -> Any:
        kwargs = self._spec.pool_kwargs(None)
        for pool_only in ("max_connections", "timeout"):
            kwargs.pop(pool_only)
        if self._spec.path is not None:
            return redis.asyncio.UnixDomainSocketConnection(**kwargs)
        if self._spec.tls:
            return redis.asyncio.SSLConnection(**kwargs)
        return redis.asyncio.Connection(**kwargs)

    async def watch(self, channel: bytes, wake: Wake) -> None:
        """Register ``wake`` for ``channel``; return once the server confirmed the subscription."""
        self._waiters.setdefault(channel, set()).add(wake)
        handle = self._linger.pop(channel, None)
        if handle is not None:
            handle.cancel()
        if channel in self._active or self._closed:
            return
        future = self._confirm.get(channel)
        if future is None:
            future = self._confirm[channel] = asyncio.get_running_loop().create_future()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="lockkit-redis-pubsub")
        elif self._conn is not None and channel not in self._sent:
            self._sent.add(channel)
            with contextlib.suppress(RedisError, OSError):  # the reader sees the failure and resubscribes
                await self._conn.send_command("SUBSCRIBE", channel)
        options = self._spec.options
        with contextlib.suppress(asyncio.TimeoutError):  # unconfirmed: the expiry re-check still comes
            await asyncio.wait_for(asyncio.shield(future), options.timeout + options.connect_timeout)

    def unwatch(self, channel: bytes, wake: Wake) -> None:
        waiters = self._waiters.get(channel)
        if waiters is None:
            return
        waiters.discard(wake)
        if not waiters and channel not in self._linger and not self._closed:
            self._linger[channel] = asyncio.get_running_loop().call_later(LINGER, self._drop, channel)

    def _drop(self, channel: bytes) -> None:
        self._linger.pop(channel, None)
        if self._waiters.get(channel):
            return
        self._waiters.pop(channel, None)
        self._active.discard(channel)
        future = self._confirm.pop(channel, None)
        if future is not None and not future.done():
            future.set_result(None)
        if channel in self._sent:
            self._sent.discard(channel)
            if self._conn is not None:
                self._chore(self._conn.send_command("UNSUBSCRIBE", channel))

    def _chore(self, coro: Coroutine[Any, Any, Any]) -> None:
        async def quietly() -> None:
            with contextlib.suppress(RedisError, OSError):
                await coro

        task = asyncio.get_running_loop().create_task(quietly())
        self._chores.add(task)
        task.add_done_callback(self._chores.discard)

    def _dispatch(self, reply: Any) -> None:
        if not isinstance(reply, list) or len(reply) < 2:
            return
        kind, channel = reply[0], reply[1]
        if kind == b"message":
            for wake in list(self._waiters.get(channel, ())):
                wake()
        elif kind == b"subscribe" and channel in self._sent:
            self._active.add(channel)
            future = self._confirm.pop(channel, None)
            if future is not None and not future.done():
                future.set_result(None)

    async def _run(self) -> None:
        backoff = 0.05
        while not self._closed and self._waiters:
            conn = self._connection()
            try:
                await conn.connect()
                self._conn = conn
                self._sent = set(self._waiters)
                if self._sent:
                    await conn.send_command("SUBSCRIBE", *self._sent)
                backoff = 0.05
                while True:
                    self._dispatch(await conn.read_response(timeout=math.inf))
            except (RedisError, OSError) as exc:
                if not self._closed:
                    log.debug("lockkit: pub/sub connection to redis %s failed: %s", self._spec.label, exc)
            finally:
                self._conn = None
                self._sent.clear()
                self._active.clear()
                with contextlib.suppress(Exception):
                    await conn.disconnect()
            for future in self._confirm.values():
                if not future.done():
                    future.set_result(None)
            self._confirm.clear()
            for waiters in list(self._waiters.values()):
                for wake in list(waiters):
                    wake()  # a release may have been missed while the connection was down
            await asyncio.sleep(backoff)
            backoff = min(1.0, backoff * 2)

    async def close(self) -> None:
        self._closed = True
        for handle in self._linger.values():
            handle.cancel()
        self._linger.clear()
        tasks = [t for t in (self._task, *self._chores) if t is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._waiters.clear()


class LoopThread:
    """The background event loop of a blocking driver's hubs (started lazily; one thread)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._guard = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pid = 0

    def loop(self) -> asyncio.AbstractEventLoop:
        with self._guard:
            if self._loop is None or self._pid != os.getpid():  # a forked child has no thread: start anew
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name=self._name, daemon=True)
                thread.start()
                self._loop, self._thread, self._pid = loop, thread, os.getpid()
            return self._loop

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop()).result()

    def call(self, fn: Callable[..., Any], *args: Any) -> None:
        self.loop().call_soon_threadsafe(fn, *args)

    @property
    def started(self) -> bool:
        return self._loop is not None and self._pid == os.getpid()

    def stop(self) -> None:
        with self._guard:
            loop, thread, self._loop = self._loop, self._thread, None
        if loop is None or thread is None or self._pid != os.getpid():
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        if not thread.is_alive():
            loop.close()


class SyncWatcher:
    """One blocking waiter: wakes on any hub's message for its channel, a timeout, or a cancel."""

    def __init__(self, loop: LoopThread, hubs: Sequence[Hub], channel: bytes, cancel: Cancel | None) -> None:
        self._loop, self._hubs, self._channel, self._cancel = loop, hubs, channel, cancel
        self._event = threading.Event()
        self._watching = False
        self._unhook = cancel.on_cancel(self._event.set) if cancel is not None else None

    def watch(self) -> None:
        self._watching = True

        async def subscribe() -> None:
            await asyncio.gather(*(hub.watch(self._channel, self._event.set) for hub in self._hubs))

        self._loop.run(subscribe())

    def wait(self, timeout: float | None) -> str:
        if self._cancel is not None and self._cancel.cancelled:
            return "cancelled"
        woken = self._event.wait(timeout)
        self._event.clear()
        if self._cancel is not None and self._cancel.cancelled:
            return "cancelled"
        return "woken" if woken else "timeout"

    def close(self) -> None:
        if self._unhook is not None:
            self._unhook()
        if self._watching:
            for hub in self._hubs:
                self._loop.call(hub.unwatch, self._channel, self._event.set)


class AsyncWatcher:
    """One asyncio waiter (cancellation arrives as CancelledError, not as an outcome)."""

    def __init__(self, hubs: Sequence[Hub], channel: bytes) -> None:
        self._hubs, self._channel = hubs, channel
        self._event = asyncio.Event()
        self._watching = False

    async def watch(self) -> None:
        self._watching = True
        await asyncio.gather(*(hub.watch(self._channel, self._event.set) for hub in self._hubs))

    async def wait(self, timeout: float | None) -> str:
        try:
            await asyncio.wait_for(self._event.wait(), timeout)
            woken = True
        except asyncio.TimeoutError:
            woken = False
        self._event.clear()
        return "woken" if woken else "timeout"

    def close(self) -> None:
        if self._watching:
            for hub in self._hubs:
                hub.unwatch(self._channel, self._event.set)
