"""``redis://``, ``rediss://``, ``unix://``: locks on one Redis server (blocking and asyncio).

URLs::

    redis://[user:password@]host[:port][/db][?option=value&…]
    rediss://…                 TLS; the certificate and host name are verified by default
    unix:///path/redis.sock?db=0

Options (see :class:`~.config.RedisOptions`): ``prefix`` (default
``lockkit:``), ``timeout`` and ``connect_timeout`` (seconds), ``pool_size``,
``health_check_interval``, ``tls_ca``/``tls_cert``/``tls_key``/
``tls_check_hostname``/``tls_insecure``, ``min_replicas``/``replica_timeout``
(WAIT after a grant), ``strict`` (refuse a server whose maxmemory-policy can
evict lock keys), ``db`` (for unix://).

**Keys** (:mod:`.keys`): ``{prefix}{<name>}`` holds the holder's token
with a PX expiry, ``…:fence`` the fencing counter, ``…:wake`` is the pub/sub
channel, ``…:queue`` and ``…:alive`` the waiter queue; ``{``, ``}`` and ``%`` in
names are percent-escaped so that every key of a lock shares one Redis Cluster
hash tag. Presence records (for ``migrate``) live under ``{prefix}presence:``.

**Operations** are one Lua script each (:mod:`.scripts`), called by SHA:
acquire takes a free lock (``SET PX`` + ``INCR`` of the fence, one round trip)
or returns the holder's PTTL and queues the waiter; renew = compare-and-
``PEXPIRE``; release = compare, then grant the lock to the first live queued
waiter (its token and TTL are part of its queue entry) and tell only it
(``PUBLISH`` of its id and fencing token on its client's own channel,
``<prefix>client:<client id>``), or delete it.
``renew_many`` is one pipeline per round. Waiters sleep on one
shared pub/sub connection (:mod:`.hub`) and re-check once at the holder's
expiry. A connection error is retried once on a fresh connection for renew and
release, never for acquire; a release retried after the connection broke under it
(it may have run, its reply lost) that finds the lock no longer ours raises
``BackendUnavailable`` (outcome unknown), not ``LockNotOwned``.

**Fair waiting.** Waiters are served in arrival order: while the lock is free
and an older live waiter is queued, a newcomer (including the process that just
released) is refused, so a releasing process cannot take the lock straight back.
A waiter's queue entry lapses 250 ms after the holder's expiry unless its
re-check refreshes it. A release grants the lock only to a waiter whose client
still listens on its channel (``PUBLISH`` counts the receivers), so a crashed
waiter's process (the server closed its connection) is skipped; a waiter that
is paused or cut off, but whose connection the server still has, receives the
lock and holds it until its TTL lapses, as a paused holder would.
At most 1,000 waiters per lock queue; more wait unordered.

**Guarantees and their limits.** One server decides, so the lock is exactly as
safe as that server: Redis replicates asynchronously, so a failover can lose a
lock that was granted (``min_replicas`` narrows the window, it does not close
it). Fencing tokens come from ``INCR`` and strictly increase while the server
keeps its data; after ``FLUSHALL``, eviction of the counter, or a restart
without persistence they start again from 1. A restart is detected at
reconnection (the server's ``run_id`` changed) and logged as a warning on the
``lockkit`` logger; a fencing-checking resource then rejects the lower tokens
(safe, but unavailable until it is reset). At first connect lockkit reads
``maxmemory-policy`` and warns unless it is ``noeviction`` (``strict=true``
refuses); an ACL that forbids ``CONFIG`` turns the check into a warning.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any, ClassVar

from redis.exceptions import RedisError

from ...driver import Cancel, DriverContext, Grant, Guarantees, HolderInfo, RenewRequest, one_renewal
from ...errors import BackendUnavailable
from ...lease import token_hint
from ...urls import BackendURL
from .config import NodeSpec, RedisOptions, redis_nodes
from .flow import (
    Flow,
    Op,
    Send,
    Wait,
    Watch,
    acquire_flow,
    adrive,
    checked,
    drive,
    leave_call,
    ms,
    release_call,
    waiter_id,
)  # fmt: skip
from .hub import Hub, LoopThread
from .keys import LockKeys, lock_keys
from .node import AsyncNode, Call, SyncNode
from .presence import announce_call, members_call, merge_members, parse_members, withdraw_call
from .scripts import FAIR_HOLDER, RENEW
from .watch import AsyncWatcher, SyncWatcher, snapshots

__all__ = ["AsyncRedisDriver", "RedisDriver"]

GUARANTEES = Guarantees(
    scope="single-node",
    fifo=True,
    fencing="strict",
    survives_failover=False,
    lifetime="ttl",
    note="One Redis server: a failover (asynchronous replication) can lose a held lock; fencing tokens "
    "restart after FLUSHALL or a restart without persistence.",
)


def unavailable(label: str, exc: BaseException) -> BackendUnavailable:
    return BackendUnavailable(f"redis {label} is unreachable: {exc}")


class _Shared:
    """What both faces compute the same way: keys, calls and reply parsing (no I/O)."""

    def __init__(self, spec: NodeSpec, options: RedisOptions, ctx: DriverContext) -> None:
        self.spec, self.options, self.clock = spec, options, ctx.clock

    def keys(self, name: str) -> LockKeys:
        return lock_keys(self.options.prefix, name)

    def flow(
        self, name: str, token: str, ttl: float, deadline: float | None, wid: str, listening: bool
    ) -> Flow[Grant | None]:
        o = self.options
        keys, label = self.keys(name), self.spec.label
        return acquire_flow(
            keys, token, ttl, deadline, self.clock, label, wid, listening, o.min_replicas, o.replica_timeout
        )

    def waiter(self, hub: Hub, name: str, ttl: float, token: str) -> tuple[str, list[tuple[Hub, bytes]]]:
        """This acquire's waiter id (a grant to it goes to the client's own channel) and the channels it watches."""
        hub.own_process()
        return waiter_id(hub.client_id, ttl, token), [(hub, self.keys(name).channel), (hub, hub.client_channel)]

    def renew_calls(self, requests: Sequence[RenewRequest]) -> list[Call]:
        return [Call(RENEW, (k.lock, k.fence), (r.token, ms(r.ttl))) for r in requests for k in (self.keys(r.name),)]

    def renew_results(
        self, requests: Sequence[RenewRequest], replies: Sequence[Any], sent_at: float
    ) -> list[Grant | Exception | None]:
        results: list[Grant | Exception | None] = []
        for request, reply in zip(requests, replies, strict=False):
            try:
                fence = checked(reply, self.spec.label, "renew")
            except BackendUnavailable as exc:
                results.append(exc)
                continue
            results.append(Grant(fence, request.ttl, sent_at) if fence >= 0 else None)
        return results

    def release_call(self, name: str, token: str | None) -> Call:
        return release_call(self.keys(name), token)

    def released(self, name: str, reply: Any, repeated: bool) -> bool:
        """A release's reply; ``repeated``: it comes from a retry after the connection broke under a sent release.

        Then "not ours" is no evidence that the lock expired or was taken: the first attempt may have run (only
        its reply lost) and deleted the key or granted it to the next waiter. Reporting that as LockNotOwned
        would mark a lease lost whose release happened; the outcome is unknown, so say so. The retry itself is
        guarded by our token like every release, so it never touches another holder's lock.
        """
        if checked(reply, self.spec.label, "release"):
            return True
        if repeated:
            raise BackendUnavailable(
                f"redis {self.spec.label}: the connection broke after the release of {name!r} was sent, and the "
                "retry found the lock no longer ours: most likely the first attempt released it (and perhaps "
                "granted it to the next waiter), else it had expired or been taken. This client does not hold "
                "it either way; do not retry the release"
            )
        return False

    def undo_calls(self, name: str, token: str, wid: str) -> list[Call]:
        """After a cancelled acquire: leave the queue, passing on the lock if a script or a release granted it."""
        return [leave_call(self.keys(name), token, wid)]

    def holder_call(self, name: str) -> Call:
        keys = self.keys(name)
        return Call(FAIR_HOLDER, (keys.lock, keys.fence, keys.alive))

    def members(self, reply: Any) -> dict[str, str]:
        return merge_members([parse_members(reply, self.spec.label)])

    def holder_info(self, reply: Any) -> HolderInfo:
        token, pttl, fence, waiters = checked(reply, self.spec.label, "holder")
        if token is None:
            return HolderInfo(False, waiters=waiters)
        ttl_left = pttl / 1000 if pttl >= 0 else None
        return HolderInfo(True, token_hint(token.decode()), int(fence) if fence else None, ttl_left, waiters)


class RedisDriver:
    guarantees: ClassVar[Guarantees] = GUARANTEES

    def __init__(self, spec: NodeSpec, options: RedisOptions, ctx: DriverContext) -> None:
        self._shared = _Shared(spec, options, ctx)
        self._node = SyncNode(spec)
        self._loop = LoopThread("lockkit-redis-pubsub")
        self._hub = Hub(spec)  # no I/O until the first wait; made here so that racing threads share one

    @classmethod
    def from_url(cls, url: BackendURL, ctx: DriverContext) -> RedisDriver:
        return cls(*redis_nodes(url), ctx)

    @classmethod
    def from_url_async(cls, url: BackendURL, ctx: DriverContext) -> AsyncRedisDriver:
        return AsyncRedisDriver(*redis_nodes(url), ctx)

    def _run(self, calls: Sequence[Call], idempotent: bool) -> list[Any]:
        try:
            return self._node.run(calls, idempotent)
        except RedisError as exc:
            raise unavailable(self._node.spec.label, exc) from exc

    def acquire(
        self, name: str, token: str, ttl: float, deadline: float | None, cancel: Cancel | None = None
    ) -> Grant | None:
        if cancel is not None and cancel.cancelled:
            return None
        wid, targets = self._shared.waiter(self._hub, name, ttl, token)
        before = snapshots(targets)  # before the first attempt; the watcher itself only if we must wait
        watcher: SyncWatcher | None = None

        def perform(op: Op) -> Any:
            nonlocal watcher
            if isinstance(op, Send):
                try:
                    return self._run(op.calls, op.idempotent)
                except BackendUnavailable:
                    if op.quiet:
                        return None
                    raise
            if watcher is None:
                watcher = SyncWatcher(self._loop, targets, cancel, wid, before)
            if isinstance(op, Watch):
                return watcher.watch(op.confirm)
            assert isinstance(op, Wait)
            return watcher.wait(op.timeout)

        try:
            listening = before[1] is not None  # this client's channel is subscribed: queue at the first attempt
            return drive(self._shared.flow(name, token, ttl, deadline, wid, listening), perform)
        except BaseException:
            # An attempt may have taken the lock (a reply lost to a timeout), the waiter may be queued, or a release
            # may have granted it the lock: leave and pass it on now, or a later release would grant the lock to
            # this abandoned token and it would stay taken for a whole TTL. Best effort: the error is what counts.
            with contextlib.suppress(Exception):
                self._run(self._shared.undo_calls(name, token, wid), True)
            raise
        finally:
            if watcher is not None:
                watcher.close()

    def renew(self, name: str, token: str, ttl: float) -> Grant | None:
        return one_renewal(self.renew_many([RenewRequest(name, token, ttl)]))

    def renew_many(self, requests: Sequence[RenewRequest]) -> list[Grant | Exception | None]:
        sent_at = self._shared.clock()
        replies = self._run(self._shared.renew_calls(requests), True)
        return self._shared.renew_results(requests, replies, sent_at)

    def release(self, name: str, token: str) -> bool:
        try:
            replies, repeated = self._node.run_again_on_error([self._shared.release_call(name, token)])
        except RedisError as exc:
            raise unavailable(self._node.spec.label, exc) from exc
        return self._shared.released(name, replies[0], repeated)

    def force_release(self, name: str) -> bool:
        return bool(
            checked(self._run([self._shared.release_call(name, None)], True)[0], self._node.spec.label, "force_release")
        )

    def holder(self, name: str) -> HolderInfo:
        return self._shared.holder_info(self._run([self._shared.holder_call(name)], True)[0])

    def announce(self, group: str, member: str, value: str, ttl: float | None) -> None:
        call = announce_call(self._shared.options.prefix, group, member, value, ttl)
        checked(self._run([call], True)[0], self._node.spec.label, "announce")

    def withdraw(self, group: str, member: str) -> None:
        call = withdraw_call(self._shared.options.prefix, group, member)
        checked(self._run([call], True)[0], self._node.spec.label, "withdraw")

    def members(self, group: str) -> dict[str, str]:
        return self._shared.members(self._run([members_call(self._shared.options.prefix, group)], True)[0])

    def ping(self) -> None:
        checked(self._run([Call(None, (), ("PING",))], True)[0], self._node.spec.label, "ping")

    def close(self) -> None:
        if self._loop.started:
            self._loop.run(self._hub.close())
        self._loop.stop()
        self._node.close()

    def __repr__(self) -> str:
        return f"RedisDriver({self._node.spec.label})"


class AsyncRedisDriver:
    """The asyncio face: redis.asyncio connections, the same scripts, flows and parsing."""

    guarantees: ClassVar[Guarantees] = GUARANTEES

    def __init__(self, spec: NodeSpec, options: RedisOptions, ctx: DriverContext) -> None:
        self._shared = _Shared(spec, options, ctx)
        self._node = AsyncNode(spec)
        self._hub = Hub(spec)  # no I/O until the first wait; made here so that racing threads share one
        self._cleanups: set[asyncio.Task[Any]] = set()

    async def _run(self, calls: Sequence[Call], idempotent: bool) -> list[Any]:
        try:
            return await self._node.run(calls, idempotent)
        except RedisError as exc:
            raise unavailable(self._node.spec.label, exc) from exc

    async def acquire(
        self, name: str, token: str, ttl: float, deadline: float | None, cancel: Cancel | None = None
    ) -> Grant | None:
        wid, targets = self._shared.waiter(self._hub, name, ttl, token)
        watcher = AsyncWatcher(targets, wid)

        async def perform(op: Op) -> Any:
            if isinstance(op, Send):
                try:
                    return await self._run(op.calls, op.idempotent)
                except BackendUnavailable:
                    if op.quiet:
                        return None
                    raise
            if isinstance(op, Watch):
                return await watcher.watch()
            assert isinstance(op, Wait)
            return await watcher.wait(op.timeout)

        try:
            listening = self._hub.snapshot(self._hub.client_channel) is not None
            return await adrive(self._shared.flow(name, token, ttl, deadline, wid, listening), perform)
        except BaseException:
            # As in the blocking face: leave, passing on what an attempt or a release may have granted (owner-checked,
            # so harmless if nothing was). In a task of its own, so that a cancel is not held up by a round trip.
            task = asyncio.get_running_loop().create_task(self._undo(name, token, wid))
            self._cleanups.add(task)
            task.add_done_callback(self._cleanups.discard)
            raise
        finally:
            watcher.close()

    async def _undo(self, name: str, token: str, wid: str) -> None:
        with contextlib.suppress(Exception):  # what is left frees itself (TTL, queue entry expiry)
            await self._run(self._shared.undo_calls(name, token, wid), True)

    async def renew(self, name: str, token: str, ttl: float) -> Grant | None:
        return one_renewal(await self.renew_many([RenewRequest(name, token, ttl)]))

    async def renew_many(self, requests: Sequence[RenewRequest]) -> list[Grant | Exception | None]:
        sent_at = self._shared.clock()
        replies = await self._run(self._shared.renew_calls(requests), True)
        return self._shared.renew_results(requests, replies, sent_at)

    async def release(self, name: str, token: str) -> bool:
        try:
            replies, repeated = await self._node.run_again_on_error([self._shared.release_call(name, token)])
        except RedisError as exc:
            raise unavailable(self._node.spec.label, exc) from exc
        return self._shared.released(name, replies[0], repeated)

    async def force_release(self, name: str) -> bool:
        reply = (await self._run([self._shared.release_call(name, None)], True))[0]
        return bool(checked(reply, self._node.spec.label, "force_release"))

    async def holder(self, name: str) -> HolderInfo:
        return self._shared.holder_info((await self._run([self._shared.holder_call(name)], True))[0])

    async def announce(self, group: str, member: str, value: str, ttl: float | None) -> None:
        call = announce_call(self._shared.options.prefix, group, member, value, ttl)
        checked((await self._run([call], True))[0], self._node.spec.label, "announce")

    async def withdraw(self, group: str, member: str) -> None:
        call = withdraw_call(self._shared.options.prefix, group, member)
        checked((await self._run([call], True))[0], self._node.spec.label, "withdraw")

    async def members(self, group: str) -> dict[str, str]:
        reply = (await self._run([members_call(self._shared.options.prefix, group)], True))[0]
        return self._shared.members(reply)

    async def ping(self) -> None:
        checked((await self._run([Call(None, (), ("PING",))], True))[0], self._node.spec.label, "ping")

    async def close(self) -> None:
        if self._cleanups:
            await asyncio.gather(*self._cleanups, return_exceptions=True)
        await self._hub.close()
        await self._node.close()

    def __repr__(self) -> str:
        return f"AsyncRedisDriver({self._node.spec.label})"
