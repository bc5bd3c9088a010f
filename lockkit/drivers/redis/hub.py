"""Wake-ups for waiters: one pub/sub connection per server shared by every waiter of a driver.

A :class:`Hub` runs on an event loop: the caller's loop for the asyncio drivers,
and for the blocking drivers one background thread (:class:`LoopThread`, started
at the first contended acquire) that runs the same code. A waiter registers a
``wake`` callable for its lock's channel; the hub subscribes the channel (once,
however many waiters share it) and calls every ``wake`` of that channel with the
message when a release publishes (a fair release names the one waiter it is
for; an empty message is for everyone). A channel stays subscribed for
:data:`LINGER` seconds after its last waiter leaves, so a hot lock does not pay
SUBSCRIBE/UNSUBSCRIBE on every hand-off, and a waiter that registers while the
channel is live and silent since its last attempt (:meth:`Hub.snapshot`) needs
no second attempt before sleeping. If the pub/sub connection breaks, every
waiter is woken (it re-checks; a release may have been missed) and the hub
reconnects with backoff. A connection that went silent is found by a health
check: after ``health_check_interval`` seconds without traffic the hub sends a
PING, and if nothing comes back within ``timeout`` it drops the connection
(waking everyone) and reconnects, so a half-dead subscriber (a NAT or proxy that
dropped it silently) is replaced instead of leaving waiters to their timers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import secrets
import threading
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from redis.exceptions import RedisError, ResponseError

from ._async.connection import AsyncConnection
from .calls import pack
from .config import NodeSpec
from .keys import client_channel

__all__ = ["Hub", "LoopThread", "Snapshot", "Wake", "forks", "snapshot_all"]

_forks = 0
"""How many forks lie between this process and the one that imported lockkit (an at-fork hook counts them)."""


def _forked() -> None:
    global _forks
    _forks += 1


if hasattr(os, "register_at_fork"):  # not on Windows, where there is no fork
    os.register_at_fork(after_in_child=_forked)


def forks() -> int:
    """Changes in a child made by ``os.fork``: a driver compares it, which costs no system call (``getpid``
    does, on every acquire), before it asks its hubs to :meth:`Hub.own_process`."""
    return _forks


log = logging.getLogger("lockkit")
T = TypeVar("T")
LINGER = 2.0
_PING = pack([("PING",)])
Wake = Callable[[bytes], None]
Snapshot = tuple[int, int] | None
Lost = Callable[[bytes, set[Wake], "tuple[str, int] | None"], None]
"""Sharded hubs (redis+cluster://): told of a channel this server no longer serves, its waiters (no longer
registered here), and where a ``MOVED`` reply said it went (None: not said)."""


def snapshot_all(hubs: Sequence[Hub], channel: bytes) -> list[Snapshot]:
    """:meth:`Hub.snapshot` of ``channel`` on every hub, at once all ``None`` while no hub has any channel
    subscribed (a client that has not waited lately: most of them, on every uncontended acquire)."""
    for hub in hubs:
        if hub._active:  # read without a lock, as snapshot() does: a channel subscribed after this read is new
            return [hub.snapshot(channel) for hub in hubs]
    return [None] * len(hubs)


def _refusal(exc: BaseException) -> bool:
    """A server's refusal of the subscription itself (an ACL's ``NOPERM``), not a failed connection."""
    return isinstance(exc, ResponseError)


class Hub:
    def __init__(self, spec: NodeSpec, lost: Lost | None = None) -> None:
        """``lost``: make this a hub of shard channels (SSUBSCRIBE, Redis 7), which hands the channels whose slot
        moved away (a ``MOVED`` reply, an unasked ``sunsubscribe``) or whose connection failed to ``lost``."""
        self._spec = spec
        self._on_lost = lost
        self._sub, self._unsub = (b"SSUBSCRIBE", b"SUNSUBSCRIBE") if lost else (b"SUBSCRIBE", b"UNSUBSCRIBE")
        self._kinds = (b"smessage", b"ssubscribe") if lost else (b"message", b"subscribe")
        self._fresh()

    def _fresh(self) -> None:
        """The state of a hub that has not connected yet (also what a forked child starts from)."""
        self._pid = os.getpid()
        self.client_id = secrets.token_hex(6)
        self.client_channel = client_channel(self._spec.options.prefix, self.client_id)
        """Where a fair release tells one of this client's waiters that it was granted the lock."""
        self._waiters: dict[bytes, set[Wake]] = {}
        self._sent: set[bytes] = set()
        self._active: set[bytes] = set()
        self._confirm: dict[bytes, asyncio.Future[None]] = {}
        self._linger: dict[bytes, asyncio.TimerHandle] = {}
        self._conn: AsyncConnection | None = None
        self._generation = getattr(self, "_generation", 0) + 1
        """Bumped whenever the connection comes or goes: a snapshot across it is void."""
        self._heard: dict[bytes, int] = {}
        """Messages received per channel."""
        self._rewake: set[bytes] = set()
        """Channels subscribed again on a new connection: their waiters are woken once more when it is confirmed."""
        self._last_traffic = 0.0
        self._task: asyncio.Task[None] | None = None
        self._chores: set[asyncio.Task[Any]] = set()
        self._closed = False
        self._refusal_told = False
        """A refused subscription was logged as a warning (once per hub: it is retried, each time at DEBUG)."""

    def own_process(self) -> None:
        """Call before a wait: a forked child must not pass for its parent's client (same id, so the parent's
        subscription would look like the child listening) nor touch the parent's connection; it starts afresh."""
        if self._pid != os.getpid():
            self._fresh()  # the parent's objects are dropped, never closed: they are the parent's

    def snapshot(self, channel: bytes) -> Snapshot:
        """Taken before an attempt (from any thread): ``None`` unless ``channel`` is subscribed right now."""
        generation = self._generation  # read first: a drop after this read changes it
        if channel not in self._active:
            return None
        return generation, self._heard.get(channel, 0)

    async def watch(self, channel: bytes, wake: Wake, before: Snapshot = None) -> bool:
        """Register ``wake`` for ``channel``; return once the server confirmed the subscription.

        Returns ``False`` only if the channel was subscribed and silent since ``before`` was taken: then no
        message can have been missed in between. ``True``: the caller must look again before sleeping.
        """
        self._register(channel, wake)
        return await self._subscribed(channel, before)

    def watch_soon(self, channel: bytes, wake: Wake, before: Snapshot) -> None:
        """:meth:`watch` for a blocking waiter, scheduled from its thread without waiting for the loop.

        ``wake`` is registered at once (so an ``unwatch`` scheduled after this cannot be overtaken); if the
        waiter must look again (a message may have slipped past, or the subscription was new), ``wake(b"")``
        is called once the subscription is confirmed, which is what a blocking round trip would have achieved.
        """
        self._register(channel, wake)

        async def confirm() -> None:
            if await self._subscribed(channel, before):
                wake(b"")

        self._chore(confirm())

    def _register(self, channel: bytes, wake: Wake) -> None:
        self._waiters.setdefault(channel, set()).add(wake)
        handle = self._linger.pop(channel, None)
        if handle is not None:
            handle.cancel()

    async def _subscribed(self, channel: bytes, before: Snapshot) -> bool:
        if self._closed:
            return True
        if channel in self._active:
            return before is None or before != (self._generation, self._heard.get(channel, 0))
        future = self._confirm.get(channel)
        if future is None:
            future = self._confirm[channel] = asyncio.get_running_loop().create_future()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="lockkit-redis-pubsub")
        elif self._conn is not None and channel not in self._sent:
            self._sent.add(channel)
            with contextlib.suppress(RedisError, OSError):  # the reader sees the failure and resubscribes
                await self._conn.send(pack([(self._sub, channel)]))
        options = self._spec.options
        with contextlib.suppress(asyncio.TimeoutError):  # unconfirmed: the expiry re-check still comes
            await asyncio.wait_for(asyncio.shield(future), options.timeout + options.connect_timeout)
        return True

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
        self._heard.pop(channel, None)
        self._generation += 1  # a snapshot taken before this unsubscribe must not match a later subscription
        future = self._confirm.pop(channel, None)
        if future is not None and not future.done():
            future.set_result(None)
        if channel in self._sent:
            self._sent.discard(channel)
            if self._conn is not None:
                self._chore(self._conn.send(pack([(self._unsub, channel)])))

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
        if kind == b"sunsubscribe" and channel in self._sent:  # not asked for: its slot moved to another node
            self._hand_over([channel], None)
        elif kind == self._kinds[0]:
            self._heard[channel] = self._heard.get(channel, 0) + 1
            data = reply[2] if len(reply) > 2 and isinstance(reply[2], bytes) else b""
            for wake in list(self._waiters.get(channel, ())):
                wake(data)
        elif kind == self._kinds[1] and channel in self._sent:
            self._active.add(channel)
            future = self._confirm.pop(channel, None)
            if future is not None and not future.done():
                future.set_result(None)
            if channel in self._rewake:
                self._rewake.discard(channel)
                for wake in list(self._waiters.get(channel, ())):
                    wake(b"")

    async def _health_check(self, conn: AsyncConnection) -> None:
        """PING a connection that has been silent for ``health_check_interval``; drop it if no reply comes."""
        options = self._spec.options
        loop = asyncio.get_running_loop()
        while True:
            idle = loop.time() - self._last_traffic
            if idle < options.health_check_interval:
                await asyncio.sleep(options.health_check_interval - idle)
                continue
            pinged = loop.time()
            with contextlib.suppress(RedisError, OSError):
                await conn.send(_PING)
            await asyncio.sleep(options.timeout)
            if self._last_traffic < pinged:
                log.warning(
                    "lockkit: the pub/sub connection to redis %s did not answer a PING within %g s; reconnecting",
                    self._spec.label,
                    options.timeout,
                )
                conn.drop()  # the reader fails and the hub reconnects, waking everyone
                return

    def retarget(self, spec: NodeSpec) -> None:
        """Connect to ``spec``'s server from the next (re)connection on (Sentinel: the master moved). The current
        connection is left alone: the old master is dead or demoted, and Sentinel closes a demoted master's
        clients, so it breaks by itself, and the reconnection re-subscribes on the new master and wakes every
        waiter to look again there."""
        self._spec = spec

    async def _run(self) -> None:
        backoff = 0.05
        woken = False  # everyone was woken because a connection failed or dropped
        loop = asyncio.get_running_loop()
        while not self._closed and self._waiters:
            conn = AsyncConnection(self._spec)
            checker: asyncio.Task[None] | None = None
            try:
                await conn.connect()
                self._conn = conn
                self._generation += 1
                self._sent = set(self._waiters)
                # After a drop every waiter was woken and looked again at once, while nothing listened: a waiter
                # that queued then can be skipped by a release as if it had crashed. Wake them again once the
                # new subscription is confirmed (the first connection's waiters have their own confirmation).
                self._rewake = set(self._sent) if woken else set()
                woken = False
                if self._sent and self._on_lost is None:
                    await conn.send(pack([(self._sub, *self._sent)]))
                elif self._sent:  # shard channels: one command each (one command's channels must share a slot)
                    await conn.send(pack([(self._sub, channel) for channel in self._sent]))
                backoff = 0.05
                self._last_traffic = loop.time()
                if self._spec.options.health_check_interval > 0:
                    checker = loop.create_task(self._health_check(conn))
                while True:
                    reply = await conn.next_reply(math.inf)
                    if isinstance(reply, RedisError) and not self._redirected(reply):
                        raise reply  # a refused SUBSCRIBE (an ACL): drop it, and so try again later
                    self._last_traffic = loop.time()
                    self._dispatch(reply)
            except (RedisError, OSError) as exc:
                if not self._closed and _refusal(exc) and not self._refusal_told:
                    self._refusal_told = True
                    log.warning(
                        "lockkit: redis %s refused this client's pub/sub subscription (%s); it is retried, and until "
                        "it is granted waiters are not woken by releases (they look again on timers, and a release "
                        "may skip their queue entries as dead) and a sentinel's failover announcements are not "
                        "heard. Give the user +subscribe and the channels (the ACL rules of docs/backends/redis.md)",
                        self._spec.label,
                        exc,
                    )
                elif not self._closed:
                    log.debug("lockkit: pub/sub connection to redis %s failed: %s", self._spec.label, exc)
            finally:
                if checker is not None:
                    checker.cancel()
                self._conn = None
                self._generation += 1
                self._sent.clear()
                self._active.clear()
                with contextlib.suppress(Exception):
                    await conn.close()
            for future in self._confirm.values():
                if not future.done():
                    future.set_result(None)
            self._confirm.clear()
            if self._on_lost is not None and not self._closed:
                # A shard's server that fails is most often gone for good (a failover promotes a replica): hand
                # every channel back, to be placed again on whichever server the slot map names by then.
                self._hand_over(list(self._waiters), None)
                continue
            for waiters in list(self._waiters.values()):
                for wake in list(waiters):
                    wake(b"")  # a release may have been missed while the connection was down
            woken = True
            await asyncio.sleep(backoff)
            backoff = min(1.0, backoff * 2)

    def _redirected(self, reply: RedisError) -> bool:
        """Sharded: a ``MOVED``/``ASK`` reply to an SSUBSCRIBE, whose channels go to ``lost`` (True); else False."""
        words = str(reply).split()
        if self._on_lost is None or len(words) != 3 or words[0] not in ("MOVED", "ASK") or not words[1].isdigit():
            return False
        from redis.crc import key_slot

        host, _, port = words[2].rpartition(":")
        where = (host, int(port)) if words[0] == "MOVED" and port.isdigit() else None  # ASK: the move is not done
        slot = int(words[1])
        self._hand_over([c for c in self._sent if c not in self._active and key_slot(c) == slot], where)
        return True

    def _hand_over(self, channels: list[bytes], where: tuple[str, int] | None) -> None:
        """Sharded: stop serving ``channels`` here and give their waiters to ``lost``."""
        assert self._on_lost is not None
        for channel in channels:
            self._sent.discard(channel)
            self._active.discard(channel)
            self._heard.pop(channel, None)
            self._generation += 1
            handle = self._linger.pop(channel, None)
            if handle is not None:
                handle.cancel()
            future = self._confirm.pop(channel, None)
            if future is not None and not future.done():
                future.set_result(None)
            self._on_lost(channel, self._waiters.pop(channel, set()), where)

    def serves(self, channel: bytes) -> bool:
        """Whether ``channel`` has waiters here (sharded: it was not handed over)."""
        return channel in self._waiters

    async def close(self) -> None:
        self._closed = True
        for handle in self._linger.values():
            handle.cancel()
        self._linger.clear()
        conn = self._conn
        if conn is not None:
            # Close it ourselves and wait until the loop let go of the socket: the blocking face stops the loop
            # right after this, and a socket it still held would be left open.
            with contextlib.suppress(Exception):
                await conn.close()
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
