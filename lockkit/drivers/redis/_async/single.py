"""The single-node Redis driver (``redis://``, ``rediss://``, ``unix://``): :class:`AsyncRedisDriver`.

This file is the source of the blocking :class:`RedisDriver` too: ``scripts/unasync.py`` generates
``../_sync/single.py`` from it. The URLs, keys, scripts and guarantees are documented in
:mod:`lockkit.drivers.redis.single`; what to send and how to wait lives in :mod:`..flow` (no I/O); what the
faces do their own way (connections, watchers, clean-ups) comes from this face's ``primitives``.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from collections.abc import Sequence
from typing import Any, ClassVar

from redis.exceptions import RedisError

from ....driver import Cancel, DriverContext, Grant, Guarantees, HolderInfo, Offer, RenewRequest, one_renewal
from ....errors import BackendUnavailable
from ....lease import process_id
from ....urls import BackendURL
from ...epoch import composite_token
from ..calls import Call
from ..config import NodeSpec, RedisOptions, redis_nodes
from ..errors import translate
from ..flow import (
    Flow,
    Op,
    Send,
    Wait,
    Watch,
    acquire_flow,
    checked,
    holder_info,
    leave_call,
    ms,
    release_call,
    waiter_id,
)
from ..hub import Hub
from ..keys import LockKeys, lock_keys
from ..presence import announce_call, members_call, merge_members, parse_members, withdraw_call
from ..scripts import FAIR_HOLDER, RENEW
from ..watch import AsyncWatcher, snapshots
from .drive import adrive
from .node import AsyncNode
from .primitives import AsyncBackground

__all__ = ["ATTEMPT_WAIT", "GUARANTEES", "AsyncRedisDriver"]

ATTEMPT_WAIT = 1.0
"""The least an acquire attempt waits for its reply however close its deadline (docs/semantics.md: an
unresponsive server is reported by about the acquire's timeout, at least 1 s)."""

GUARANTEES = Guarantees(
    scope="single-node",
    fifo=True,
    fencing="strict",
    survives_failover=False,
    lifetime="ttl",
    note="One Redis server: a failover (asynchronous replication) can lose a held lock; fencing tokens "
    "restart after FLUSHALL or a restart without persistence.",
    semaphores=Offer("yes"),  # issue 18: ..semaphore_scripts
)


class AsyncRedisDriver:
    guarantees: ClassVar[Guarantees] = GUARANTEES
    finish_inline: ClassVar[bool] = True
    """Its calls (and those of the Sentinel and cluster drivers built on it) never cancel the task they run in,
    so an asyncio release or renew runs in the caller's task (``lockkit._async.cancel_safe``; issue 17)."""

    def __init__(self, spec: NodeSpec, options: RedisOptions, ctx: DriverContext) -> None:
        self.spec, self.options, self.clock = spec, options, ctx.clock
        self._node = AsyncNode(spec)
        self._background = AsyncBackground("lockkit-redis-pubsub")
        self._hub = Hub(spec)  # no I/O until the first wait; made here so that racing threads share one
        # The renewal scheduler sends the same request objects every round (one per held lease), so their calls
        # are made once: making them anew cost more than the pipeline's own I/O at 10,000 leases, and left three
        # objects per lease per round for the cyclic GC. Weak keys: a call is dropped with its request.
        self._renewals: weakref.WeakKeyDictionary[RenewRequest, Call] = weakref.WeakKeyDictionary()
        self._pid = process_id()
        self._wid_heads: dict[tuple[str, float], str] = {}
        """``<client id>.<ttl ms>.`` by client id and ttl: a waiter id is one of these and the token (issue 17: the
        id made and checked by the grammar's regular expression was 1.9 µs of every acquire)."""

    @classmethod
    def from_url(cls, url: BackendURL, ctx: DriverContext) -> AsyncRedisDriver:
        return cls(*redis_nodes(url), ctx)

    def _keys(self, name: str) -> LockKeys:
        return lock_keys(self.options.prefix, name)

    async def _run(self, calls: Sequence[Call], idempotent: bool, by: float | None = None) -> list[Any]:
        try:
            return await self._node.run(calls, idempotent, by)
        except RedisError as exc:
            raise translate(self.spec, exc) from exc

    async def _one(self, call: Call, what: str) -> Any:
        """The reply of one idempotent call, a refused script raised as :class:`BackendUnavailable`."""
        replies = await self._run([call], True)
        return checked(replies[0], self.spec.label, what)

    def _flow(
        self, name: str, token: str, ttl: float, deadline: float | None, wid: str, listening: bool
    ) -> Flow[Grant | None]:
        o = self.options
        return acquire_flow(
            self._keys(name), token, ttl, deadline, self.clock, self.spec.label, wid, listening, o.min_replicas,
            o.replica_timeout,
        )  # fmt: skip

    async def acquire(
        self, name: str, token: str, ttl: float, deadline: float | None, cancel: Cancel | None = None
    ) -> Grant | None:
        """Take ``name`` for ``token``, waiting in line until ``deadline``; ``None`` if not by then, or once
        ``cancel`` is set (what the wait queued is removed first). On the asyncio face, cancelling the
        awaiting task removes it too."""
        if cancel is not None and cancel.cancelled:
            return None
        hub = self._hub
        if self._pid != process_id():  # forked: the hub starts afresh (a pid kept, not a getpid() per acquire)
            hub.own_process()
            self._pid = process_id()
        wid = self._waiter_id(hub.client_id, ttl, token)  # a release's grant to it goes to the client's own channel
        keys = self._keys(name)
        # the client's channel for this lock: ``<prefix>client:<id>`` (redis://), in the lock's slot on a cluster
        own = keys.clients + hub.client_id.encode() if keys.sharded else hub.client_channel
        targets = [(hub, keys.channel), (hub, own)]
        before = snapshots(targets)  # before the first attempt; the watcher itself only if we must wait
        watcher: AsyncWatcher | None = None

        async def perform(op: Op) -> Any:
            nonlocal watcher
            if isinstance(op, Send):
                # An attempt's reply is awaited until the acquire's deadline (at least ATTEMPT_WAIT), if that is
                # sooner than the node's timeout: acquire(timeout=T) reports an unresponsive server by about T.
                # Not a leave (idempotent): it runs after the deadline, and must still remove the waiter.
                by = None
                if deadline is not None and not op.idempotent:
                    by = time.monotonic() + max(deadline - self.clock(), ATTEMPT_WAIT)
                try:
                    return await self._run(op.calls, op.idempotent, by)
                except BackendUnavailable:
                    if op.quiet:
                        return None
                    raise
            if watcher is None:
                watcher = self._background.watcher(targets, cancel, wid, before)
            if isinstance(op, Watch):
                return await watcher.watch(op.confirm)
            assert isinstance(op, Wait)
            return await watcher.wait(op.timeout)

        try:
            listening = before[1] is not None  # this client's channel is subscribed: queue at the first attempt
            return await adrive(self._flow(name, token, ttl, deadline, wid, listening), perform)
        except BaseException as exc:
            # An attempt may have taken the lock (a reply lost to a timeout), the waiter may be queued, or a release
            # may have granted it the lock: leave and pass it on now, or a later release would grant the lock to
            # this abandoned token and it would stay taken for a whole TTL. Best effort: the error is what counts.
            # After an error (an unresponsive server, most often) the blocking face does it in the background, so
            # that the caller hears of the error by its deadline, not one more timeout later; after an interrupt
            # (Ctrl-C) in the caller's thread, before the process may exit.
            clean_up = self._background.clean_up_later if isinstance(exc, Exception) else self._background.clean_up
            clean_up(self._leave, name, token, wid)
            raise
        finally:
            if watcher is not None:
                watcher.close()

    def _waiter_id(self, client_id: str, ttl: float, token: str) -> str:
        """:func:`~..flow.waiter_id`, its head checked by the grammar once per client id and ttl."""
        head = self._wid_heads.get((client_id, ttl))
        if head is None:
            if len(self._wid_heads) >= 256:  # a bounded memo: ttls vary little in practice
                self._wid_heads.clear()
            head = self._wid_heads[client_id, ttl] = waiter_id(client_id, ttl, "-")[:-1]
        # The grammar's token part ([!-~]+): printable ASCII without a space. Lockkit's own tokens are hex.
        assert token and token.isascii() and token.isprintable() and " " not in token, token
        return head + token

    async def _leave(self, name: str, token: str, wid: str) -> None:
        """Leave the queue, passing on the lock if a script or a release granted it (owner-checked, so harmless
        if nothing was)."""
        with contextlib.suppress(Exception):  # what is left frees itself (TTL, queue entry expiry)
            await self._run([leave_call(self._keys(name), token, wid)], True)

    async def renew(self, name: str, token: str, ttl: float) -> Grant | None:
        return one_renewal(await self.renew_many([RenewRequest(name, token, ttl)]))

    async def renew_many(self, requests: Sequence[RenewRequest]) -> list[Grant | Exception | None]:
        sent_at = self.clock()
        replies = await self._run(self._renew_calls(requests), True)
        return self._renewed(requests, replies, sent_at, 0)

    def _renewed(
        self, requests: Sequence[RenewRequest], replies: Sequence[Any], sent_at: float, epoch: int
    ) -> list[Grant | Exception | None]:
        """Each renewal's result: a Grant counted from ``sent_at`` (its fence lifted by ``epoch``, 0: as it is),
        ``None`` if the server no longer held our token, or the error of a refused script."""
        results: list[Grant | Exception | None] = []
        for request, reply in zip(requests, replies, strict=False):
            try:
                fence = checked(reply, self.spec.label, "renew")
            except BackendUnavailable as exc:
                results.append(exc)
                continue
            lifted = composite_token(epoch, fence) if epoch and fence >= 0 else fence
            results.append(Grant(lifted, request.ttl, sent_at) if fence >= 0 else None)
        return results

    def _renew_calls(self, requests: Sequence[RenewRequest]) -> list[Call]:
        made = self._renewals
        calls: list[Call] = []
        for r in requests:
            call = made.get(r)  # keyed by value: an equal request (same name, token and ttl) sends the same call
            if call is None:
                call = made[r] = Call(RENEW, self._keys(r.name).script_keys(2), (r.token, ms(r.ttl)))
            calls.append(call)
        return calls

    async def release(self, name: str, token: str) -> bool:
        try:
            replies, repeated = await self._node.run_again_on_error([release_call(self._keys(name), token)])
        except RedisError as exc:
            raise translate(self.spec, exc) from exc
        return self._released(name, replies[0], repeated)

    def _released(self, name: str, reply: Any, repeated: bool) -> bool:
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

    async def force_release(self, name: str) -> bool:
        return bool(await self._one(release_call(self._keys(name), None), "force_release"))

    async def holder(self, name: str) -> HolderInfo:
        return holder_info(await self._one(Call(FAIR_HOLDER, self._keys(name).script_keys()), "holder"))

    async def announce(self, group: str, member: str, value: str, ttl: float | None) -> None:
        await self._one(announce_call(self.options.prefix, group, member, value, ttl), "announce")

    async def withdraw(self, group: str, member: str) -> None:
        await self._one(withdraw_call(self.options.prefix, group, member), "withdraw")

    async def members(self, group: str) -> dict[str, str]:
        replies = await self._run([members_call(self.options.prefix, group)], True)
        return merge_members([parse_members(replies[0], self.spec.label)])

    async def ping(self) -> None:
        await self._one(Call(None, (), ("PING",)), "ping")

    async def close(self) -> None:
        await self._background.close([self._hub])
        await self._node.close()

    def permits(self, events: object = None) -> Any:
        """Semaphores and reader-writer locks on this server (issue 18: :mod:`..semaphore_scripts`)."""
        from .semaphore import AsyncRedisPermits

        return AsyncRedisPermits(self)

    def __repr__(self) -> str:
        return f"AsyncRedisDriver({self.spec.label})"
