"""``redlock://``: one lock across N independent Redis masters (Redlock), blocking and asyncio.

URL: ``redlock://[user:password@]h1:p1,h2:p2,h3:p3,h4:p4,h5:p5[/db][?option=value&…]``. N ≥ 3
(5 is usual; an even N is warned about because it tolerates no more failures than N − 1); a
master listed twice is a :class:`~lockkit.errors.ConfigError` (it would count twice towards a
quorum). Options as for ``redis://`` (``timeout`` is the per-master timeout, 0.25 s by default)
plus ``tls=true`` and ``retry_delay`` (upper bound of the random delay after a split vote).

**How it works.** Every request goes to all masters at once: the commands are written to every
master first, then the replies are read against one shared deadline, so a slow or blackholed
master costs one ``timeout``, not one per master, and no thread is needed. The same Lua scripts
and key layout as the single-node driver are used (:mod:`.scripts`,
:mod:`.keys`), without the fencing counter. A grant needs a quorum (N // 2 + 1) *and* a
positive validity, ``ttl − elapsed − (ttl × 0.01 + 2 ms)``, measured from before the first
request; otherwise the round is undone on *all* masters (a timed-out one may have applied it)
before waiting: for the release's wake-up when someone holds a quorum, or for a random delay
after a split vote. A renewal holds only on a quorum within validity, and a master whose
``run_id`` changed since the acquire (it restarted, perhaps without our key) does not count.

**Guarantees and their limits.** Safety rests on timing: bounded clock drift between masters
and clients, and no process pause longer than the validity; a master restarted without
persistence forgets its keys (the run_id guard catches it on renew, not before a second client
wins), and a server clock jump can expire a key early. **No fencing token**: a per-master
counter max is not monotonic across quorums, and a max-register read and written by majority
can hand the *same* token to two clients in exactly the overlap that fencing exists for
(Kleppmann's objection), so ``fencing_token`` is always 0 and the guarantees say
``fencing="none"``. Use etcd or ZooKeeper where correctness needs fencing. Replicas given as
masters are not detected. Waiting is not FIFO (per-master queues could disagree on
the head and split the vote): a release wakes every waiter of the lock.

**Presence records** (for ``migrate``, :mod:`.presence`): an announce or
withdraw goes to every master and stands once a majority applied it; ``members``
is the union of the live records read from at least a majority.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from typing import Any, ClassVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from ...driver import Cancel, DriverContext, Grant, Guarantees, HolderInfo, RenewRequest, one_renewal
from ...errors import BackendUnavailable
from ...lease import token_hint
from ...urls import BackendURL
from .config import NodeSpec, RedlockOptions, redlock_nodes
from .flow import Flow, Op, Send, Wait, Watch, adrive, drive, ms, redlock_acquire_flow
from .hub import Hub, LoopThread
from .keys import lock_keys
from .node import AsyncNode, Call, SyncNode, pack_calls
from .presence import announce_call, members_call, merge_members, parse_members, withdraw_call
from .quorum import NodeResult, count_ok, count_repeated_misses, quorum, tally_renew
from .scripts import FORCE_RELEASE, HOLDER, RELEASE, RENEW
from .watch import AsyncWatcher, SyncWatcher

__all__ = ["AsyncRedlockDriver", "RedlockDriver"]

GUARANTEES = Guarantees(
    scope="majority",
    fifo=False,
    fencing="none",
    survives_failover=True,
    lifetime="ttl",
    note="A majority of independent Redis masters; safe only under bounded clock drift and pauses, "
    "and it offers no fencing token (fencing_token is always 0).",
)
MAX_TRACKED = 100_000


class _Shared:
    """Keys, calls, tallies and the per-lease restart record, shared by both faces (no I/O)."""

    def __init__(self, specs: list[NodeSpec], options: RedlockOptions, ctx: DriverContext) -> None:
        self.specs, self.options, self.clock = specs, options, ctx.clock
        self.need = quorum(len(specs))
        self.epochs: dict[str, tuple[int | None, ...]] = {}

    def flow(
        self, name: str, token: str, ttl: float, deadline: float | None
    ) -> Flow[tuple[Grant, tuple[int | None, ...]] | None]:
        keys = lock_keys(self.options.prefix, name)
        return redlock_acquire_flow(keys, token, ttl, deadline, self.clock, len(self.specs), self.options.retry_delay)

    def granted(self, token: str, result: tuple[Grant, tuple[int | None, ...]] | None) -> Grant | None:
        if result is None:
            return None
        if len(self.epochs) >= MAX_TRACKED:  # leases lost without a release: forget the oldest
            self.epochs.pop(next(iter(self.epochs)), None)
        self.epochs[token] = result[1]
        return result[0]

    def renew_calls(self, requests: Sequence[RenewRequest]) -> list[Call]:
        return [Call(RENEW, (lock_keys(self.options.prefix, r.name).lock,), (r.token, ms(r.ttl))) for r in requests]

    def renew_results(
        self, requests: Sequence[RenewRequest], results: list[NodeResult], sent_at: float
    ) -> list[Grant | Exception | None]:
        elapsed = self.clock() - sent_at
        out: list[Grant | Exception | None] = []
        for i, request in enumerate(requests):
            verdict = tally_renew(results, i, self.epochs.get(request.token), request.ttl, elapsed)
            if verdict == "held":
                out.append(Grant(0, request.ttl, sent_at))
            elif verdict == "unreachable":
                out.append(self.unreachable(results, i, "renew"))
            else:
                self.epochs.pop(request.token, None)
                out.append(None)
        return out

    def release_call(self, name: str, token: str | None) -> Call:
        keys = lock_keys(self.options.prefix, name)
        if token is None:
            return Call(FORCE_RELEASE, (keys.lock,), (keys.channel,))
        return Call(RELEASE, (keys.lock,), (token, keys.channel))

    def unreachable(self, results: list[NodeResult], index: int, what: str) -> BackendUnavailable:
        _, reached = count_ok(results, index)
        return BackendUnavailable(f"redlock {what}: reached {reached} of {len(results)} masters, needs {self.need}")

    def released(self, token: str | None, results: list[NodeResult], name: str = "") -> bool:
        ok, reached = count_ok(results)
        if token is not None:
            self.epochs.pop(token, None)
            if ok >= self.need:
                return True
            # A master whose release was retried after the connection broke under it may have run the first
            # attempt (only its reply lost): its "not ours" then means "already released by us". If those could
            # make up the quorum, the outcome is unknown: not LockNotOwned, which would mark the lease lost.
            if ok + count_repeated_misses(results) >= self.need:
                raise BackendUnavailable(
                    f"redlock: the connection to some masters broke after the release of {name!r} was sent, and "
                    "their retries found the lock no longer ours: most likely the first attempt released it there, "
                    "else it had expired or been taken. This client does not hold it either way; do not retry the "
                    "release"
                )
            if reached < self.need:
                raise self.unreachable(results, 0, "release")
            return False
        return ok > 0

    def written(self, results: list[NodeResult], what: str) -> None:
        """A presence write stands once a majority of masters applied it."""
        if count_ok(results)[0] < self.need:
            raise self.unreachable(results, 0, what)

    def members(self, results: list[NodeResult]) -> dict[str, str]:
        views = [
            parse_members(r.replies[0], spec.label)
            for r, spec in zip(results, self.specs, strict=True)
            if not isinstance(r.replies, BaseException) and isinstance(r.replies[0], list)
        ]
        if len(views) < self.need:
            raise self.unreachable(results, 0, "members")
        return merge_members(views)

    def holder_call(self, name: str) -> Call:
        return Call(HOLDER, (lock_keys(self.options.prefix, name).lock,))

    def holder_info(self, results: list[NodeResult]) -> HolderInfo:
        seen: dict[bytes, list[int]] = {}
        reached = 0
        for result in results:
            if isinstance(result.replies, BaseException) or not isinstance(result.replies[0], list):
                continue
            reached += 1
            token, pttl, _ = result.replies[0]
            if token is not None:
                seen.setdefault(token, []).append(int(pttl))
        if reached < self.need:
            raise self.unreachable(results, 0, "holder")
        for token, pttls in seen.items():
            if len(pttls) >= self.need:
                left = sorted(pttls, reverse=True)[self.need - 1]
                return HolderInfo(True, token_hint(token.decode()), None, left / 1000 if left >= 0 else None)
        return HolderInfo(False)


class RedlockDriver:
    guarantees: ClassVar[Guarantees] = GUARANTEES

    def __init__(self, specs: list[NodeSpec], options: RedlockOptions, ctx: DriverContext) -> None:
        self._shared = _Shared(specs, options, ctx)
        self._nodes = [SyncNode(spec) for spec in specs]
        self._loop = LoopThread("lockkit-redlock-pubsub")
        self._hubs = [Hub(spec) for spec in specs]  # no I/O until the first wait

    @classmethod
    def from_url(cls, url: BackendURL, ctx: DriverContext) -> RedlockDriver:
        return cls(*redlock_nodes(url), ctx)

    @classmethod
    def from_url_async(cls, url: BackendURL, ctx: DriverContext) -> AsyncRedlockDriver:
        return AsyncRedlockDriver(*redlock_nodes(url), ctx)

    def _fan_out(self, calls: Sequence[Call], idempotent: bool) -> list[NodeResult]:
        pending: list[Any] = []
        payload = pack_calls(calls)  # the same bytes go to every master
        for node in self._nodes:  # write to every master before reading any reply
            try:
                pending.append(node.send(calls, payload))
            except (RedisError, OSError) as exc:
                pending.append(exc)
        deadline = time.monotonic() + self._shared.options.timeout
        results: list[NodeResult] = []
        for node, sent in zip(self._nodes, pending, strict=True):
            repeated = False
            try:
                if isinstance(sent, BaseException):
                    raise sent
                replies: Any = node.receive(sent, deadline)
            except RedisConnectionError as exc:
                replies = exc
                if idempotent:  # a stale pooled connection: once more on a fresh one
                    with contextlib.suppress(RedisError, OSError):
                        replies = node.run(calls, False)
                        repeated = not isinstance(sent, BaseException)  # sent: it may have run, its reply lost
            except (RedisError, OSError) as exc:
                replies = exc
            results.append(NodeResult(replies, node.state.epoch, repeated))
        return results

    def acquire(
        self, name: str, token: str, ttl: float, deadline: float | None, cancel: Cancel | None = None
    ) -> Grant | None:
        if cancel is not None and cancel.cancelled:
            return None
        channel = lock_keys(self._shared.options.prefix, name).channel
        for hub in self._hubs:
            hub.own_process()
        # made before the first attempt: its snapshot of the hubs must predate it
        watcher = SyncWatcher(self._loop, [(hub, channel) for hub in self._hubs], cancel)

        def perform(op: Op) -> Any:
            if isinstance(op, Send):
                return self._fan_out(op.calls, op.idempotent)
            if isinstance(op, Watch):
                return watcher.watch()
            assert isinstance(op, Wait)
            return watcher.wait(op.timeout)

        try:
            return self._shared.granted(token, drive(self._shared.flow(name, token, ttl, deadline), perform))
        finally:
            watcher.close()

    def renew(self, name: str, token: str, ttl: float) -> Grant | None:
        return one_renewal(self.renew_many([RenewRequest(name, token, ttl)]))

    def renew_many(self, requests: Sequence[RenewRequest]) -> list[Grant | Exception | None]:
        sent_at = self._shared.clock()
        results = self._fan_out(self._shared.renew_calls(requests), True)
        return self._shared.renew_results(requests, results, sent_at)

    def release(self, name: str, token: str) -> bool:
        return self._shared.released(token, self._fan_out([self._shared.release_call(name, token)], True), name)

    def force_release(self, name: str) -> bool:
        return self._shared.released(None, self._fan_out([self._shared.release_call(name, None)], True))

    def holder(self, name: str) -> HolderInfo:
        return self._shared.holder_info(self._fan_out([self._shared.holder_call(name)], True))

    def announce(self, group: str, member: str, value: str, ttl: float | None) -> None:
        call = announce_call(self._shared.options.prefix, group, member, value, ttl)
        self._shared.written(self._fan_out([call], True), "announce")

    def withdraw(self, group: str, member: str) -> None:
        call = withdraw_call(self._shared.options.prefix, group, member)
        self._shared.written(self._fan_out([call], True), "withdraw")

    def members(self, group: str) -> dict[str, str]:
        return self._shared.members(self._fan_out([members_call(self._shared.options.prefix, group)], True))

    def ping(self) -> None:
        results = self._fan_out([Call(None, (), ("PING",))], True)
        if sum(not isinstance(r.replies, BaseException) for r in results) < self._shared.need:
            raise self._shared.unreachable(results, 0, "ping")

    def close(self) -> None:
        if self._loop.started:
            for hub in self._hubs:
                self._loop.run(hub.close())
        self._loop.stop()
        for node in self._nodes:
            node.close()

    def __repr__(self) -> str:
        return f"RedlockDriver({','.join(s.label for s in self._shared.specs)})"


class AsyncRedlockDriver:
    """The asyncio face: the same flow, tallies and scripts over redis.asyncio connections."""

    guarantees: ClassVar[Guarantees] = GUARANTEES

    def __init__(self, specs: list[NodeSpec], options: RedlockOptions, ctx: DriverContext) -> None:
        self._shared = _Shared(specs, options, ctx)
        self._nodes = [AsyncNode(spec) for spec in specs]
        self._hubs = [Hub(spec) for spec in specs]  # no I/O until the first wait
        self._cleanups: set[asyncio.Task[Any]] = set()

    async def _fan_out(self, calls: Sequence[Call], idempotent: bool) -> list[NodeResult]:
        pending: list[Any] = []
        payload = pack_calls(calls)
        for node in self._nodes:
            try:
                pending.append(await node.send(calls, payload))
            except (RedisError, OSError) as exc:
                pending.append(exc)
        deadline = time.monotonic() + self._shared.options.timeout
        results: list[NodeResult] = []
        for node, sent in zip(self._nodes, pending, strict=True):
            repeated = False
            try:
                if isinstance(sent, BaseException):
                    raise sent
                replies: Any = await node.receive(sent, deadline)
            except RedisConnectionError as exc:
                replies = exc
                if idempotent:
                    with contextlib.suppress(RedisError, OSError):
                        replies = await node.run(calls, False)
                        repeated = not isinstance(sent, BaseException)
            except (RedisError, OSError) as exc:
                replies = exc
            results.append(NodeResult(replies, node.state.epoch, repeated))
        return results

    async def acquire(
        self, name: str, token: str, ttl: float, deadline: float | None, cancel: Cancel | None = None
    ) -> Grant | None:
        channel = lock_keys(self._shared.options.prefix, name).channel
        for hub in self._hubs:
            hub.own_process()
        watcher = AsyncWatcher([(hub, channel) for hub in self._hubs])

        async def perform(op: Op) -> Any:
            if isinstance(op, Send):
                return await self._fan_out(op.calls, op.idempotent)
            if isinstance(op, Watch):
                return await watcher.watch()
            assert isinstance(op, Wait)
            return await watcher.wait(op.timeout)

        async def attempt() -> Grant | None:
            try:
                return self._shared.granted(token, await adrive(self._shared.flow(name, token, ttl, deadline), perform))
            finally:
                watcher.close()

        # The flow runs shielded: a cancel in the middle of a fan-out would leave requests sent to some masters
        # with their replies unread on pooled connections. The caller's cancel interrupts the next wait instead,
        # and a grant that raced the cancel is undone on every master.
        inner = asyncio.ensure_future(attempt())
        try:
            return await asyncio.shield(inner)
        except asyncio.CancelledError:
            watcher.interrupt()
            inner.add_done_callback(lambda done: self._undo_after(done, name, token))
            raise

    def _undo_after(self, done: asyncio.Future[Grant | None], name: str, token: str) -> None:
        if done.cancelled() or (done.exception() is None and done.result() is None):
            return
        task = asyncio.get_running_loop().create_task(self._undo(name, token))
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)

    async def _undo(self, name: str, token: str) -> None:
        with contextlib.suppress(BackendUnavailable):
            await self.release(name, token)

    async def renew(self, name: str, token: str, ttl: float) -> Grant | None:
        return one_renewal(await self.renew_many([RenewRequest(name, token, ttl)]))

    async def renew_many(self, requests: Sequence[RenewRequest]) -> list[Grant | Exception | None]:
        sent_at = self._shared.clock()
        results = await self._fan_out(self._shared.renew_calls(requests), True)
        return self._shared.renew_results(requests, results, sent_at)

    async def release(self, name: str, token: str) -> bool:
        results = await self._fan_out([self._shared.release_call(name, token)], True)
        return self._shared.released(token, results, name)

    async def force_release(self, name: str) -> bool:
        return self._shared.released(None, await self._fan_out([self._shared.release_call(name, None)], True))

    async def holder(self, name: str) -> HolderInfo:
        return self._shared.holder_info(await self._fan_out([self._shared.holder_call(name)], True))

    async def announce(self, group: str, member: str, value: str, ttl: float | None) -> None:
        call = announce_call(self._shared.options.prefix, group, member, value, ttl)
        self._shared.written(await self._fan_out([call], True), "announce")

    async def withdraw(self, group: str, member: str) -> None:
        call = withdraw_call(self._shared.options.prefix, group, member)
        self._shared.written(await self._fan_out([call], True), "withdraw")

    async def members(self, group: str) -> dict[str, str]:
        return self._shared.members(await self._fan_out([members_call(self._shared.options.prefix, group)], True))

    async def ping(self) -> None:
        results = await self._fan_out([Call(None, (), ("PING",))], True)
        if sum(not isinstance(r.replies, BaseException) for r in results) < self._shared.need:
            raise self._shared.unreachable(results, 0, "ping")

    async def close(self) -> None:
        if self._cleanups:
            await asyncio.gather(*self._cleanups, return_exceptions=True)
        for hub in self._hubs:
            await hub.close()
        for node in self._nodes:
            await node.close()

    def __repr__(self) -> str:
        return f"AsyncRedlockDriver({','.join(s.label for s in self._shared.specs)})"
