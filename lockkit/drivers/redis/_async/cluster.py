"""The Redis Cluster driver (``redis+cluster://``, ``rediss+cluster://``): :class:`AsyncClusterDriver`.

This file is the source of the blocking :class:`ClusterDriver` too (``scripts/unasync.py`` generates
``../_sync/cluster.py``). It is the single-node driver (:mod:`.single`) with every call sent to the master of
its lock's slot; the URL, guarantees and what migrations and failovers do are documented in
:mod:`lockkit.drivers.redis.cluster`:

* **routing**: the slot map comes from ``CLUSTER NODES`` (the first seed that answers, then any known master);
  each call goes to the master of its first key's slot, on a pool of its own per master. ``MOVED`` refreshes the
  map and sends the call again (nothing ran), ``ASK`` sends it once to the importing master after ``ASKING``
  (but an acquire, which waits for the move to end: see :meth:`AsyncClusterDriver._routed`),
  ``TRYAGAIN`` and ``CLUSTERDOWN`` wait a little and send it again; a master that refuses or drops connections
  refreshes the map (its replica may have been promoted) until ``failover_wait``. Replicas are never sent a
  call: they would answer a write with ``MOVED`` anyway;
* **fencing**: every acquire, renewal and holder call is pipelined with ``CLUSTER INFO``, whose
  ``cluster_my_epoch`` (the answering master's config epoch) lifts the fence (``epoch << 48 | counter``), read
  from the same server in the same round trip: never an epoch from a stale map;
* **waking**: sharded pub/sub on the lock's master (:mod:`..cluster_hub`);
* **renewals**: one pipeline per master, all sent before any reply is read;
* **semaphores and reader-writer locks** (:class:`AsyncClusterPermits`): the scripts of ``redis://`` with
  SPUBLISH, every key and channel of a name in its slot, routed and lifted as the lock's calls are.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Sequence
from typing import Any, ClassVar

from redis.exceptions import AuthenticationError, RedisError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError

from ....driver import Cancel, DriverContext, Grant, Guarantees, HolderInfo, RenewRequest
from ....errors import BackendUnavailable, ConfigError
from ....urls import BackendURL
from ...epoch import composite_token
from ..calls import Call
from ..cluster_config import ClusterTarget, Shard, SlotMap, cluster_target, key_slot, my_epoch, parse_nodes, redirect
from ..cluster_hub import ClusterHub
from ..config import NodeSpec
from ..errors import translate
from ..flow import Flow, acquire_flow, checked, holder_info, release_call
from ..keys import LockKeys, cluster_lock_keys
from ..scripts import FAIR_ACQUIRE, FAIR_HOLDER
from ..semaphore_scripts import CLUSTER_PERMITS, SHARDED_SCRIPTS, PermitKeys, cluster_permit_keys
from .node import AsyncNode, Pending
from .primitives import pause
from .semaphore import AsyncRedisPermits
from .single import AsyncRedisDriver

__all__ = ["GUARANTEES", "AsyncClusterDriver", "AsyncClusterPermits"]

GUARANTEES = Guarantees(
    scope="single-node",
    fifo=True,
    fencing="strict",
    survives_failover=False,
    lifetime="ttl",
    note="Each lock lives on the master of its slot; a failover promotes a replica that may lack a recent grant "
    "(asynchronous replication), so a second client can take the lock. A slot migration keeps held locks. "
    "Fencing tokens carry the granting master's config epoch (epoch << 48 | counter), so they stay increasing "
    "across failovers and migrations.",
    semaphores=CLUSTER_PERMITS,  # issue 18: AsyncClusterPermits
)

_INFO = Call(None, (), ("CLUSTER", "INFO"))
_NODES = ("CLUSTER", "NODES")
_ASKING = Call(None, (), ("ASKING",))
_EPOCH_SCRIPTS = (FAIR_ACQUIRE, FAIR_HOLDER, SHARDED_SCRIPTS.acquire, SHARDED_SCRIPTS.info)
"""Calls whose replies carry a fence that an epoch must lift: pipelined with ``CLUSTER INFO``."""
_ACQUIRE_SCRIPTS = (FAIR_ACQUIRE, SHARDED_SCRIPTS.acquire)
"""Calls that may grant: never sent to a slot's importing master before the move ends (see :meth:`_routed`)."""


_ATTEMPT_EPOCH: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar("lockkit_cluster_epoch", default=None)
"""The acquire under way in this task or thread: where its attempts leave their master's epoch."""


class _Retry(Exception):
    """The calls did not run where they were sent (or may go again): find the slot's master and resend."""


class AsyncClusterDriver(AsyncRedisDriver):
    guarantees: ClassVar[Guarantees] = GUARANTEES

    def __init__(self, target: ClusterTarget, ctx: DriverContext) -> None:
        super().__init__(target.seeds[0], target.options, ctx)
        self.target = target
        self._map = SlotMap()
        self._nodes: dict[tuple[str, int], AsyncNode] = {}
        self._hub = ClusterHub(target.seeds[0], self._spec_for_slot)

    @classmethod
    def from_url(cls, url: BackendURL, ctx: DriverContext) -> AsyncClusterDriver:
        return cls(cluster_target(url), ctx)

    def _keys(self, name: str) -> LockKeys:
        return cluster_lock_keys(self.options.prefix, name)

    # -- the slot map ----------------------------------------------------------------------

    def _spec_for_slot(self, slot: int) -> NodeSpec | None:
        shard = self._map.owners[slot]
        return None if shard is None else self.target.node(shard.host, shard.port)

    def _node_of(self, shard: Shard) -> AsyncNode:
        node = self._nodes.get((shard.host, shard.port))
        if node is None:  # setdefault: two threads of the blocking face must not each keep a pool of their own
            node = self._nodes.setdefault((shard.host, shard.port), AsyncNode(self.target.node(shard.host, shard.port)))
        return node

    async def _refresh(self, first: tuple[str, int] | None = None) -> None:
        """Read the slot map from ``first``, else a known master, else a seed; raise if no node answers."""
        candidates: list[NodeSpec] = []
        if first is not None:
            candidates.append(self.target.node(*first))
        candidates += [self.target.node(s.host, s.port) for s in self._map.masters()]
        candidates += list(self.target.seeds)
        failures: list[str] = []
        seen: set[tuple[str | None, int | None]] = set()
        for spec in candidates:
            if (spec.host, spec.port) in seen:
                continue
            seen.add((spec.host, spec.port))
            known = self._nodes.get((spec.host or "", spec.port or 0))
            node = known or AsyncNode(spec)  # a seed not (yet) in the map: a node of its own, closed after
            try:
                (reply,) = await node.run([Call(None, (), _NODES)], True)
            except AuthenticationError as exc:
                raise translate(spec, exc) from exc
            except RedisError as exc:
                failures.append(str(translate(spec, exc)))
                continue
            finally:
                if known is None:
                    await node.close()
            if isinstance(reply, ResponseError):
                if "cluster support disabled" in str(reply):
                    raise ConfigError(
                        f"redis {spec.label} is not in cluster mode (cluster support disabled): use "
                        "redis://host:port for one server, or redis+sentinel:// for a Sentinel-managed one"
                    )
                failures.append(f"redis {spec.label} refused CLUSTER NODES: {reply}")
                continue
            assert spec.host is not None and spec.port is not None
            shards = parse_nodes(reply.decode(), (spec.host, spec.port))
            if not shards:
                failures.append(f"redis {spec.label} knows no master serving slots")
                continue
            self._map.replace(shards)
            return
        raise BackendUnavailable(
            f"no node of the Redis Cluster answered (tried {', '.join(s.label for s in candidates)}): "
            + "; ".join(failures)
            + ". Check that those nodes are up and reachable from this host, and that the URL lists them"
        )

    # -- running calls on the master of their slot ---------------------------------------------

    @staticmethod
    def _slot(calls: Sequence[Call]) -> int | None:
        for call in calls:
            if call.keys:
                return key_slot(call.keys[0])
        return None

    async def _routed(self, calls: Sequence[Call], by: float | None = None) -> tuple[list[Any], int, bool]:
        """The replies of ``calls`` (all of one slot) from that slot's master, its config epoch (with an
        acquire or holder call; else 0) and whether they may have run twice (sent again after their connection
        broke under them). Every call of this driver may go again (the argument of :mod:`.sentinel`'s
        ``_attempt``: the acquire finds its own token, the others are owner-checked). ``by``: as
        :meth:`AsyncNode.run`'s, an acquire attempt's deadline: each reply is awaited until then at most (a paused
        master is reported by then, not by the node's ``timeout``), and so is a master that refuses connections
        (not ``failover_wait``), after one attempt at least."""
        slot = self._slot(calls)
        lifted = any(call.script in _EPOCH_SCRIPTS for call in calls)
        acquiring = any(call.script in _ACQUIRE_SCRIPTS for call in calls)
        send = [*calls, _INFO] if lifted else list(calls)
        give_up = time.monotonic() + self.target.options.failover_wait
        if by is not None and by < give_up:
            give_up = by
        repeated, asking = False, None
        backoff = 0.02
        last: BaseException | None = None
        shard: Shard | None = None
        while True:
            try:
                if not self._map.known:
                    await self._refresh()
                shard = self._map.owners[slot] if slot is not None else self._map.masters()[0]
                if asking is not None:
                    shard, asking = asking, None
                    replies, again = await self._node_of(shard).run_again_on_error([_ASKING, *send], by)
                    replies = replies[1:]
                else:
                    if shard is None:
                        raise _Retry(f"no master serves slot {slot} (the cluster is reconfiguring)")
                    replies, again = await self._node_of(shard).run_again_on_error(send, by)
                repeated = repeated or again
                where = next((r for r in map(redirect, replies) if r is not None), None)
                if where is None:
                    epoch = my_epoch(replies[-1]) if lifted else 0
                    return (replies[:-1] if lifted else replies), epoch or 0, repeated
                last = ResponseError(f"{where.kind} {where.slot if where.slot is not None else ''}".strip())
                if where.kind == "ASK" and acquiring:
                    # Not followed: the importing master's epoch may still be below the source's until the move
                    # ends (SETSLOT NODE gives it one above all), so a grant there could carry a token below one
                    # granted before the move. Wait for the move to end: then MOVED names the new master.
                    raise _Retry("the slot is being migrated; an acquire waits until the move ends")
                if where.kind == "ASK":
                    assert where.host is not None and where.port is not None
                    asking = Shard(where.host, where.port, 0)
                    continue
                if where.kind == "MOVED":
                    assert where.host is not None and where.port is not None
                    await self._refresh((where.host, where.port))
                    continue
                raise _Retry(where.kind)  # TRYAGAIN, CLUSTERDOWN: soon again
            except AuthenticationError as exc:  # named after the master that refused, not the URL's first seed
                raise translate(self.spec if shard is None else self._node_of(shard).spec, exc) from exc
            except RedisConnectionError as exc:  # the master is down or unreachable: its replica may take over
                last = exc
                try:
                    await self._refresh()
                except BackendUnavailable as down:
                    last = down
            except _Retry as exc:
                last = exc
            except RedisError as exc:  # a timeout (a paused or cut-off master), a protocol error: as redis:// does
                raise translate(self.spec if slot is None or shard is None else self._node_of(shard).spec, exc) from exc
            if time.monotonic() >= give_up:
                raise BackendUnavailable(
                    f"redis+cluster: no master served slot {slot} within failover_wait="
                    f"{self.target.options.failover_wait:g} s (last: {last}); the cluster may be failing over or "
                    "migrating: retry, or raise failover_wait"
                )
            await pause(backoff)
            backoff = min(0.5, backoff * 2)
            if not isinstance(last, RedisConnectionError):
                try:
                    await self._refresh()
                except BackendUnavailable as down:
                    last = down

    async def _run(self, calls: Sequence[Call], idempotent: bool, by: float | None = None) -> list[Any]:
        replies, epoch, _ = await self._routed(calls, by)
        seen = _ATTEMPT_EPOCH.get()
        if seen is not None and calls and calls[0].script is FAIR_ACQUIRE:
            seen[0] = epoch
        return replies

    # -- acquire, renew, release, holder ------------------------------------------------------------

    def _flow(
        self, name: str, token: str, ttl: float, deadline: float | None, wid: str, listening: bool
    ) -> Flow[Grant | None]:
        o = self.options
        return acquire_flow(
            self._keys(name), token, ttl, deadline, self.clock, "cluster", wid, listening, o.min_replicas,
            o.replica_timeout, confirm_grants=True,
        )  # fmt: skip

    async def acquire(
        self, name: str, token: str, ttl: float, deadline: float | None, cancel: Cancel | None = None
    ) -> Grant | None:
        seen = [0]
        reset = _ATTEMPT_EPOCH.set(seen)
        try:
            grant = await super().acquire(name, token, ttl, deadline, cancel)
        finally:
            _ATTEMPT_EPOCH.reset(reset)
        if grant is None:
            return None
        # The grant is an attempt's reply (confirm_grants: never a release's message alone), and the CLUSTER INFO
        # pipelined behind it named the config epoch of the master that ran it, after it ran: the same or higher
        # than at the grant, and never above what the slot's next master will have.
        return Grant(composite_token(seen[0], grant.fencing_token), grant.ttl, grant.sent_at)

    async def renew_many(self, requests: Sequence[RenewRequest]) -> list[Grant | Exception | None]:
        """One pipeline per master, all sent before any reply is read (:meth:`_per_master`)."""
        sent_at = self.clock()
        results: list[Grant | Exception | None] = []
        append = results.append
        # _renewed's rule, one reply at a time (each carries its own master's epoch): a call per lease cost more
        for request, got in zip(requests, await self._per_master(self._renew_calls(requests)), strict=True):
            if isinstance(got, BackendUnavailable):
                append(got)
                continue
            reply, epoch = got
            if type(reply) is not int:  # a refused script: BackendUnavailable, as _renewed reports it
                append(self._renewed((request,), (reply,), sent_at, epoch)[0])
            elif reply < 0:
                append(None)  # the server no longer holds our token
            else:
                append(Grant(composite_token(epoch, reply) if epoch else reply, request.ttl, sent_at))
        return results

    async def _per_master(self, calls: Sequence[Call]) -> list[tuple[Any, int] | BackendUnavailable]:
        """Each call's reply with the config epoch of the master that ran it: one pipeline per master (with
        ``CLUSTER INFO`` last), all sent before any reply is read; a call redirected or cut off goes again on its
        own (the slow path of a migration or failover), and one that found no master gets its error."""
        if not self._map.known:
            await self._refresh()
        groups: dict[tuple[str, int], list[int]] = {}
        shards: dict[tuple[str, int], Shard] = {}
        for index, call in enumerate(calls):
            shard = self._map.owners[key_slot(call.keys[0])]
            if shard is None:
                continue
            groups.setdefault((shard.host, shard.port), []).append(index)
            shards[(shard.host, shard.port)] = shard
        results: list[tuple[Any, int] | BackendUnavailable | None] = [None] * len(calls)
        pending: list[tuple[AsyncNode, list[int], Pending | None]] = []
        for key, indexes in groups.items():
            node = self._node_of(shards[key])
            try:
                pending.append((node, indexes, await node.send([*(calls[i] for i in indexes), _INFO])))
            except RedisError:
                pending.append((node, indexes, None))
        deadline = time.monotonic() + self.options.timeout
        for node, indexes, sent in pending:
            if sent is None:
                continue
            try:
                replies = await node.receive(sent, deadline)
            except RedisError:
                continue
            epoch = my_epoch(replies[-1]) or 0
            if any(redirect(r) is not None for r in replies[:-1]):
                continue
            for i, reply in zip(indexes, replies[:-1], strict=True):
                results[i] = (reply, epoch)
        done: list[tuple[Any, int] | BackendUnavailable] = []
        for index, result in enumerate(results):
            if result is None:
                try:
                    replies, _, _ = await self._routed([calls[index], _INFO])
                    result = (replies[0], my_epoch(replies[-1]) or 0)
                except BackendUnavailable as exc:
                    result = exc
            done.append(result)
        return done

    async def release(self, name: str, token: str) -> bool:
        replies, _, repeated = await self._routed([release_call(self._keys(name), token)])
        return self._released(name, replies[0], repeated)

    async def holder(self, name: str) -> HolderInfo:
        replies, epoch, _ = await self._routed([Call(FAIR_HOLDER, self._keys(name).script_keys())])
        return holder_info(checked(replies[0], "cluster", "holder"), epoch)

    async def ping(self) -> None:
        """Every master of a fresh slot map answers, and every slot has one (``lockkit check``): one master
        down leaves the names hashing to its slots unlockable, which a ping of any single master would miss."""
        await self._refresh()
        for shard in self._map.masters():
            spec = self._node_of(shard).spec
            try:
                (reply,) = await self._node_of(shard).run([Call(None, (), ("PING",))], True)
            except RedisError as exc:
                raise translate(spec, exc) from exc
            if isinstance(reply, ResponseError):
                raise BackendUnavailable(f"redis {spec.label} answered PING with an error: {reply}")
        orphans = sum(owner is None for owner in self._map.owners)
        if orphans:
            raise BackendUnavailable(
                f"redis+cluster: {orphans} of {len(self._map.owners)} slots have no reachable master (a master is "
                "down, failing over or was removed): locks whose names hash there cannot be taken. Check the "
                "cluster with redis-cli --cluster check"
            )

    def permits(self, events: object = None) -> Any:
        """Semaphores and reader-writer locks, each name on the master of its slot (issue 18)."""
        return AsyncClusterPermits(self)

    async def close(self) -> None:
        await self._background.close([self._hub])
        for node in list(self._nodes.values()):
            await node.close()
        self._nodes.clear()

    def __repr__(self) -> str:
        return f"AsyncClusterDriver({self.target.tried})"


class AsyncClusterPermits(AsyncRedisPermits):
    """The permits of :class:`AsyncRedisPermits` on the master of each name's slot.

    Every key of a name and both its channels (``…:wake``, ``P sem{E}:client:<client id>``) share the name's hash
    tag, so each operation stays one script on one master, whose replies this driver routes like the lock's
    (``MOVED``, ``ASK`` but for an acquire, ``TRYAGAIN``, a failover) and whose waiters wait on sharded pub/sub
    there (:mod:`..cluster_hub`). Acquire and info calls are pipelined with ``CLUSTER INFO``: the fence is lifted by
    the epoch of the master that ran them; a grant told by a release's message is confirmed by one more attempt
    for that epoch (:meth:`_by_message`). Renewals go in one pipeline per master.
    """

    scripts = SHARDED_SCRIPTS

    def __init__(self, driver: AsyncClusterDriver) -> None:
        super().__init__(driver)
        self._cluster = driver
        self._label = "cluster"

    def _keys(self, name: str) -> PermitKeys:
        return cluster_permit_keys(self._cluster.options.prefix, name)

    async def _send(
        self, calls: Sequence[Call], idempotent: bool, by: float | None = None
    ) -> tuple[list[Any], int, bool]:
        return await self._cluster._routed(calls, by)

    async def _renew_replies(self, calls: Sequence[Call]) -> list[tuple[Any, int] | BackendUnavailable]:
        return await self._cluster._per_master(calls)

    def _by_message(self, mark: Any, fence: int) -> None:
        return None  # only a reply names the epoch (the CLUSTER INFO behind it): confirm with one more attempt
