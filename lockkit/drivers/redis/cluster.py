"""``redis+cluster://``, ``rediss+cluster://``: locks on a Redis Cluster, each on the master of its slot
(blocking and asyncio).

The drivers are written once, as asyncio code (``_async/cluster.py``, with the slot map in :mod:`.cluster_config`
and the sharded wake-ups in :mod:`.cluster_hub`); the blocking face is generated from it. This module is where
both are imported from.

URLs::

    redis+cluster://[user:password@]h1:p1,h2:p2,h3:p3[?option=value&…]
    rediss+cluster://…         TLS to every node

The hosts are seeds (one reachable node is enough: it tells the whole map). Every option of ``redis://``
applies but ``db`` (a cluster has database 0 only), and ``failover_wait`` (seconds, default 5): how long one call
keeps looking for the master of its slot during a failover or a migration before BackendUnavailable.

**Slots.** Every key of one lock shares the hash tag ``{E}`` (:mod:`.keys`), so all of them, the lock's
channel and its clients' channels (``<prefix>{E}:client:<id>``: a script may only SPUBLISH in its own slot)
live on one master, where each operation stays one script. The fair queue is the one of ``redis://``, in the
lock's slot. Waiting uses sharded pub/sub (SSUBSCRIBE, Redis 7) on that master.

**A slot migration** (``SETSLOT … MIGRATING/IMPORTING``, ``MIGRATE … KEYS``, ``SETSLOT … NODE``) moves a held lock
with its keys: it stays exclusive and renewable (calls follow ``ASK`` and ``MOVED``), its fencing counter moves
with it, and the waiters re-subscribe on the new master and look again; a release that comes in between finds
no listener and frees the lock, so a waiter may lose its place in line (not the lock).

**A failover** (a master dies, a replica is promoted) keeps the service, not necessarily the locks: replication
is asynchronous, so a grant the replica had not received is lost and another client can take the lock; the first
learns it at its next renewal (LockLost), never silently. ``min_replicas`` narrows the window as with Sentinel.

**Fencing tokens** are ``config_epoch << 48 | counter``, the epoch being the granting master's own
(``cluster_my_epoch`` of a ``CLUSTER INFO`` pipelined with each acquire, renewal and holder call). A promoted
replica and a master that imported a slot take an epoch above every other, so the tokens of a slot's new master
outrank its old one's, even where the counter went back. A grant by a release's hand-off is confirmed by one
more attempt (which reads the epoch). ``fencing_epoch`` is refused (ConfigError): the tokens carry an epoch
already.
"""

from __future__ import annotations

from typing import ClassVar

from ...driver import DriverContext
from ...urls import BackendURL
from ._async.cluster import GUARANTEES, AsyncClusterDriver
from ._sync.cluster import ClusterDriver as BlockingClusterDriver

__all__ = ["GUARANTEES", "AsyncClusterDriver", "ClusterDriver"]


class ClusterDriver(BlockingClusterDriver):
    """The blocking driver as the registry finds it (``lockkit.drivers.redis.cluster:ClusterDriver``), which also
    asks it for the asyncio face: :meth:`from_url_async`."""

    tokens_carry_epoch: ClassVar[bool] = True
    """Its tokens are lifted by the master's config epoch already: ``fencing_epoch`` is refused (registry)."""

    @staticmethod
    def from_url_async(url: BackendURL, ctx: DriverContext) -> AsyncClusterDriver:
        return AsyncClusterDriver.from_url(url, ctx)
