"""The Redlock driver (``redlock://``, one lock across N independent masters): :class:`AsyncRedlockDriver`.

This file is the source of the blocking :class:`RedlockDriver` too: ``scripts/unasync.py`` generates
``../_sync/redlock.py`` from it. How Redlock works here and what it guarantees is documented in
:mod:`lockkit.drivers.redis.redlock`; the acquire loop lives in :mod:`..flow` and the quorum arithmetic in
:mod:`..quorum` (no I/O); what the faces do their own way comes from this face's ``primitives``.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ....driver import Cancel, DriverContext, Grant, Guarantees, HolderInfo, RenewRequest, one_renewal
from ....errors import BackendUnavailable, ConfigError
from ....lease import token_hint
from ....urls import BackendURL
from ..calls import Call, pack_calls
from ..config import NodeSpec, RedlockOptions, redlock_nodes
from ..errors import refused_logins
from ..flow import YIELD_MIN, YIELD_ROUNDS, Op, Send, Wait, Watch, ms, redlock_acquire_flow, redlock_take
from ..hub import Hub, forks, snapshot_all
from ..keys import LockKeys, lock_keys
from ..presence import announce_call, members_call, merge_members, parse_members, withdraw_call
from ..quorum import (
    UNREAD,
    FirstAttempt,
    NodeResult,
    count_ok,
    count_released,
    count_repeated_misses,
    node_result,
    others_woken,
    quorum,
    released_quorum,
    tally_acquire,
    tally_renew,
    won_quorum,
)
from ..scripts import FORCE_RELEASE, HOLDER, RELEASE, RENEW
from ..semaphore_scripts import REDLOCK_PERMITS
from .connection import AsyncConnection, stale_connections
from .drive import adrive
from .node import AsyncNode, Pending
from .primitives import AsyncBackground

__all__ = ["GUARANTEES", "AsyncRedlockDriver"]

GUARANTEES = Guarantees(
    scope="majority",
    fifo=False,
    fencing="none",
    survives_failover=True,
    lifetime="ttl",
    note="A majority of independent Redis masters; safe only under bounded clock drift and pauses, "
    "and it offers no fencing token (a lease is not fenced; reading fencing_token raises ConfigError).",
    semaphores=REDLOCK_PERMITS,  # issue 18: the reason is in ..semaphore_scripts
)
MAX_TRACKED = 100_000
YIELDS_KEPT = 1024
"""Pending releaser's pauses kept per driver before the finished ones are forgotten."""

Epochs = tuple[int | None, ...]
"""Each master's restart count (:attr:`..config.NodeState.epoch`) when a lease was granted; None: not reached."""


class AsyncRedlockDriver:
    guarantees: ClassVar[Guarantees] = GUARANTEES
    finish_inline: ClassVar[bool] = True
    """Its calls (fan-outs over the nodes, which the single-node driver uses too) never cancel the task they run
    in, so an asyncio release or renew runs in the caller's task, not a task of its own
    (``lockkit._async.cancel_safe``; issue 17)."""

    def __init__(self, specs: list[NodeSpec], options: RedlockOptions, ctx: DriverContext) -> None:
        self.specs, self.options, self.clock = specs, options, ctx.clock
        self.need = quorum(len(specs))
        self._won = functools.partial(won_quorum, need=self.need)
        self._released = functools.partial(released_quorum, need=self.need)
        self._epochs: dict[str, Epochs] = {}
        """The masters' epochs at each lease's grant: a master restarted since (perhaps without our key) does
        not count towards a renewal's quorum."""
        self._nodes = [AsyncNode(spec) for spec in specs]
        self._background = AsyncBackground("lockkit-redlock-pubsub")
        self._hubs = [Hub(spec) for spec in specs]  # no I/O until the first wait
        self._forks = forks()
        """The process the hubs belong to, as :func:`..hub.forks` counts it (see Hub.own_process)."""
        self._unverified = True
        """Until every master has answered with a run_id of its own: two URL entries may name one server
        (127.0.0.1 and localhost), which the URL check cannot see (L-6; see :meth:`_refuse_shared_masters`)."""
        self._recent: tuple[str, LockKeys] | None = None
        """The last name whose keys were made, and its keys (lock_keys costs about as much as a tally)."""
        self._yields: dict[str, float] = {}
        """Per lock this client released while another client waited for it: until when (on ``clock``) its next
        acquire lets the waiter have it (flow.YIELD_ROUNDS)."""

    @classmethod
    def from_url(cls, url: BackendURL, ctx: DriverContext) -> AsyncRedlockDriver:
        return cls(*redlock_nodes(url), ctx)

    def _keys(self, name: str) -> LockKeys:
        recent = self._recent  # one read: the blocking face's other threads may replace it meanwhile
        if recent is not None and recent[0] == name:  # the release of the lock just acquired: the same keys
            return recent[1]
        keys = lock_keys(self.options.prefix, name)
        self._recent = (name, keys)
        return keys

    async def _fan_out(
        self, calls: Sequence[Call], idempotent: bool, enough: Callable[[Sequence[NodeResult]], bool] | None = None
    ) -> list[NodeResult]:
        """``calls`` sent to every master, then every master's replies read against one deadline. With ``enough``,
        reading stops once the replies read so far (from the first masters on) decide the outcome: the later
        masters' replies stay unread on their connections, marked :data:`..quorum.UNREAD` in the results, and are
        read by the next command on those connections (:meth:`AsyncNode.park`; issue 17: an acquire or release
        waits for the quorum, not for the slowest master)."""
        nodes = self._nodes
        payload = pack_calls(calls)  # the same bytes go to every master
        conns: list[AsyncConnection | BaseException] = []
        pending: list[Pending | BaseException] = []
        current = -1  # the master whose send is under way: a send gives its connection back on any error itself
        try:
            for node in nodes:
                try:
                    conns.append(await node.checkout())
                except (RedisError, OSError) as exc:
                    conns.append(exc)
            # One look at every connection for one that the server closed while it sat idle (one system call
            # on the blocking face, not one per master), before anything is sent on any of them.
            stale = stale_connections(conns)
            for current, node in enumerate(nodes):  # write to every master before reading any reply
                conn = conns[current]
                if isinstance(conn, BaseException):
                    pending.append(conn)
                    continue
                try:
                    if conn.owed is not None:  # the replies an earlier fan-out left unread: read first
                        try:
                            stale[current] = await node.settle(conn, stale[current])
                        except RedisTimeoutError as exc:  # not come yet: the connection went back, owing them
                            pending.append(exc)
                            continue
                    pending.append(await node.send(calls, payload, conn, stale[current]))
                except (RedisError, OSError) as exc:
                    pending.append(exc)
        except BaseException:  # interrupted (a signal, a cancel): no connection stays checked out
            for index, (node, conn) in enumerate(zip(nodes, conns, strict=False)):
                item = pending[index] if index < len(pending) else conn
                if index != current and not isinstance(item, BaseException):
                    node.abandon(item)
            raise
        deadline = time.monotonic() + self.options.timeout
        results: list[NodeResult] = []
        failed = False
        index = 0
        try:  # interrupted anywhere here (a reply, a retry): the later masters' replies will not be read
            for index, sent in enumerate(pending):
                node = nodes[index]
                if not isinstance(sent, BaseException):
                    try:
                        results.append(node_result((await node.receive(sent, deadline), node.state.epoch, False)))
                        # Enough read to decide: the later masters' replies wait on their connections.
                        if enough is not None and index + 1 >= self.need and enough(results) and self._park_rest(
                            pending, results
                        ):
                            break
                        continue  # the usual way: nothing else per master
                    except (RedisError, OSError) as exc:
                        error: BaseException = exc
                else:  # nothing was sent: no reply to wait for
                    error = sent
                replies, repeated = await self._again(node, calls, idempotent, error, sent is not error)
                failed = failed or isinstance(replies, BaseException)
                results.append(node_result((replies, node.state.epoch, repeated)))
        except BaseException:
            for later, item in zip(nodes[index + 1 :], pending[index + 1 :], strict=True):
                if not isinstance(item, BaseException):
                    later.abandon(item)
            raise
        if failed:  # only a failed master can have refused the login
            errors = [r.replies if isinstance(r.replies, BaseException) else None for r in results]
            refused = refused_logins(self.specs, errors, self.need)
            if refused is not None:  # no quorum is possible with these credentials: say so, not "unreachable"
                raise refused
        if self._unverified:
            self._refuse_shared_masters()
        return results

    def _park_rest(self, pending: list[Pending | BaseException], results: list[NodeResult]) -> bool:
        """Leave the replies of the masters after ``results`` unread (see :meth:`_fan_out`), if that is safe: not
        while some master has not yet said which server it is (the shared-masters check needs every hello). A
        later master's epoch in the results is the one before any hello it owes: if that hello shows a restart,
        its epoch moves on and the lease's renewals stop counting that master, as they would have from the start."""
        start = len(results)
        rest = pending[start:]
        if not rest or self._unverified:
            return False
        for node, sent in zip(self._nodes[start:], rest, strict=True):
            if isinstance(sent, BaseException):  # nothing was sent there: the error stands, no retry is needed
                results.append(node_result((sent, node.state.epoch, False)))
            else:
                node.park(sent)
                results.append(node_result((UNREAD, node.state.epoch, False)))
        return True

    def _refuse_shared_masters(self) -> None:
        """A ``ConfigError`` if two masters answered with one run_id: a quorum counted over them is fake (one
        server's vote counted twice). Checked after each fan-out until every master has answered; the keys a
        refused acquire set are undone before the error is raised (the client never holds the lock)."""
        owners: dict[str, str] = {}
        for spec, node in zip(self.specs, self._nodes, strict=True):
            run_id = node.state.run_id
            if run_id is None:
                continue
            other = owners.setdefault(run_id, spec.label)
            if other != spec.label:
                raise ConfigError(
                    f"redlock: masters {other} and {spec.label} are one Redis server (the same run_id): a quorum "
                    "counted over them is not a majority of independent servers. List each server once"
                )
        self._unverified = len(owners) < len(self._nodes)

    async def _again(
        self, node: AsyncNode, calls: Sequence[Call], idempotent: bool, error: BaseException, sent: bool
    ) -> tuple[list[Any] | BaseException, bool]:
        """What a master that failed in a fan-out answers: idempotent calls once more on a fresh connection
        after a connection error (a stale pooled connection), else the error; and whether the calls may have run
        twice (``sent``: the error came after they were sent, so they may have run, only the reply lost)."""
        if idempotent and isinstance(error, RedisConnectionError):
            with contextlib.suppress(RedisError, OSError):
                return await node.run(calls, False), sent
        return error, False

    def _granted(self, token: str, result: tuple[Grant, Epochs] | None) -> Grant | None:
        if result is None:
            return None
        if len(self._epochs) >= MAX_TRACKED:  # leases lost without a release: forget the oldest
            self._epochs.pop(next(iter(self._epochs)), None)
        self._epochs[token] = result[1]
        return result[0]

    async def acquire(
        self, name: str, token: str, ttl: float, deadline: float | None, cancel: Cancel | None = None
    ) -> Grant | None:
        """Take ``name`` for ``token`` on a quorum of masters, retrying until ``deadline``; ``None`` if not by
        then, or once ``cancel`` is set. On the asyncio face, cancelling the awaiting task undoes a grant that
        raced it on every master."""
        if cancel is not None and cancel.cancelled:
            return None
        keys = self._keys(name)
        pause = 0.0
        if self._yields:
            until = self._yields.pop(name, None)
            if until is not None:
                pause = until - self.clock()
        if forks() != self._forks:  # forked since the hubs last looked (one check here, not one per master)
            for hub in self._hubs:
                hub.own_process()
            self._forks = forks()
        channel = keys.channel
        # Taken before the first attempt, for the watcher of a wait that may follow it: a release published
        # between that attempt and the watcher's subscription is then seen as missed (the flow looks again)
        # instead of being slept through (Hub.snapshot; tests/test_redlock_fast_path.py, L-8).
        before = snapshot_all(self._hubs, channel)
        first = None
        if pause <= 0:
            # The uncontended fast path: the first attempt made here, without the flow, its runner, a watcher
            # or a task (most acquires end with it). A failed one goes on in the flow below, from its results.
            sent_at = self.clock()  # before the first send: the validity counts from here
            try:
                results = await self._fan_out(redlock_take(keys, token, ttl), False, self._won)
            except ConfigError:
                # Refused (logins on too many masters, or two masters that are one server): the SETs went out
                # to the masters that accepted and took there. Undo them, or the name stays half-taken for a ttl.
                await self._undo(name, token)
                raise
            except Exception:
                raise  # not an interruption (below): no other verdict of a fan-out leaves anything to undo
            except BaseException:
                # Interrupted half-way (an asyncio cancel, a signal): the SET may have reached some masters, a
                # quorum even. Undo it on every master (owner-checked), so it does not hold them for a TTL.
                self._background.clean_up(self._undo, name, token)
                raise
            elapsed = self.clock() - sent_at
            tally = tally_acquire(results, ttl, elapsed)
            if tally.granted:
                return self._granted(token, (Grant(0, ttl, sent_at), tally.epochs))
            first = FirstAttempt(sent_at, elapsed, results, tally)
        watcher = self._background.watcher([(hub, channel) for hub in self._hubs], cancel, None, before)

        async def perform(op: Op) -> Any:
            if isinstance(op, Send):
                return await self._fan_out(op.calls, op.idempotent)
            if isinstance(op, Watch):
                return await watcher.watch()
            assert isinstance(op, Wait)
            return await watcher.wait(op.timeout)

        async def attempt() -> Grant | None:
            try:
                flow = redlock_acquire_flow(
                    keys, token, ttl, deadline, self.clock, len(self.specs), self.options.retry_delay, pause, first
                )
                return self._granted(token, await adrive(flow, perform))
            except ConfigError:  # refused half-way: undo what the masters that accepted took, as above
                await self._undo(name, token)
                raise
            finally:
                watcher.close()

        return await self._background.shielded(attempt, watcher, lambda: self._undo(name, token))

    async def _undo(self, name: str, token: str) -> None:
        # ConfigError: refused again by the masters that refused the acquire, once the others have released.
        with contextlib.suppress(BackendUnavailable, ConfigError):
            await self.release(name, token)

    async def renew(self, name: str, token: str, ttl: float) -> Grant | None:
        return one_renewal(await self.renew_many([RenewRequest(name, token, ttl)]))

    async def renew_many(self, requests: Sequence[RenewRequest]) -> list[Grant | Exception | None]:
        sent_at = self.clock()
        calls = [Call(RENEW, self._keys(r.name).script_keys(1), (r.token, ms(r.ttl))) for r in requests]
        results = await self._fan_out(calls, True)
        elapsed = self.clock() - sent_at
        out: list[Grant | Exception | None] = []
        for i, request in enumerate(requests):
            verdict = tally_renew(results, i, self._epochs.get(request.token), request.ttl, elapsed)
            if verdict == "held":
                out.append(Grant(0, request.ttl, sent_at))
            elif verdict == "unreachable":
                out.append(self._unreachable(results, i, "renew"))
            else:
                self._epochs.pop(request.token, None)
                out.append(None)
        return out

    def _release_call(self, name: str, token: str | None) -> Call:
        keys = self._keys(name)
        if token is None:
            return Call(FORCE_RELEASE, keys.script_keys(1), (keys.channel,))
        return Call(RELEASE, keys.script_keys(1), (token, keys.channel))

    def _unreachable(self, results: list[NodeResult], index: int, what: str) -> BackendUnavailable:
        _, reached = count_ok(results, index)
        return BackendUnavailable(
            f"redlock {what}: reached {reached} of {len(results)} masters, needs {self.need}; "
            "check that a majority of the masters is up, then retry"
        )

    async def release(self, name: str, token: str) -> bool:
        call = self._release_call(name, token)
        sent_at = self.clock()
        results = await self._fan_out([call], True, self._released)
        if self._epochs:
            self._epochs.pop(token, None)
        ok, reached, woke = count_released(results)
        if ok >= self.need:
            # Only a master whose release woke a subscriber besides ours can tell of another client waiting.
            if woke:
                channel = call.args[1]
                if others_woken(results, lambda i: self._hubs[i].snapshot(channel) is not None):
                    self._yield(name, sent_at)
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
            raise self._unreachable(results, 0, "release")
        return False

    def _yield(self, name: str, sent_at: float) -> None:
        """Someone else waits for ``name``, which this client just released: its next acquire waits a little."""
        now = self.clock()
        pause = min(self.options.retry_delay, max(YIELD_MIN, YIELD_ROUNDS * (now - sent_at)))
        if len(self._yields) >= YIELDS_KEPT:  # most are over (a pause is at most retry_delay): forget those
            # list() copies in one C call: the blocking face's other threads pop from this dict meanwhile
            self._yields = {n: until for n, until in list(self._yields.items()) if until > now}
            if len(self._yields) >= YIELDS_KEPT:
                self._yields.clear()  # a forgotten pause only lets this client go first once
        self._yields[name] = now + pause

    async def force_release(self, name: str) -> bool:
        results = await self._fan_out([self._release_call(name, None)], True)
        return count_ok(results)[0] > 0

    async def holder(self, name: str) -> HolderInfo:
        results = await self._fan_out([Call(HOLDER, self._keys(name).script_keys(1))], True)
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
            raise self._unreachable(results, 0, "holder")
        for token, pttls in seen.items():
            if len(pttls) >= self.need:
                left = sorted(pttls, reverse=True)[self.need - 1]
                return HolderInfo(True, token_hint(token.decode()), None, left / 1000 if left >= 0 else None)
        return HolderInfo(False)

    def _written(self, results: list[NodeResult], what: str) -> None:
        """A presence write stands once a majority of masters applied it."""
        if count_ok(results)[0] < self.need:
            raise self._unreachable(results, 0, what)

    async def announce(self, group: str, member: str, value: str, ttl: float | None) -> None:
        call = announce_call(self.options.prefix, group, member, value, ttl)
        self._written(await self._fan_out([call], True), "announce")

    async def withdraw(self, group: str, member: str) -> None:
        call = withdraw_call(self.options.prefix, group, member)
        self._written(await self._fan_out([call], True), "withdraw")

    async def members(self, group: str) -> dict[str, str]:
        results = await self._fan_out([members_call(self.options.prefix, group)], True)
        views = [
            parse_members(r.replies[0], spec.label)
            for r, spec in zip(results, self.specs, strict=True)
            if not isinstance(r.replies, BaseException) and isinstance(r.replies[0], list)
        ]
        if len(views) < self.need:
            raise self._unreachable(results, 0, "members")
        return merge_members(views)

    async def ping(self) -> None:
        results = await self._fan_out([Call(None, (), ("PING",))], True)
        if sum(not isinstance(r.replies, BaseException) for r in results) < self.need:
            raise self._unreachable(results, 0, "ping")

    async def close(self) -> None:
        await self._background.close(self._hubs)
        for node in self._nodes:
            await node.close()

    def __repr__(self) -> str:
        return f"AsyncRedlockDriver({','.join(s.label for s in self.specs)})"
