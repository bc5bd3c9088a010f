"""``redlock://``: one lock across N independent Redis masters (Redlock), blocking and asyncio.

The drivers are written once, as asyncio code (``_async/redlock.py``); the blocking face is generated
from it (``_sync/redlock.py``, by ``scripts/unasync.py``). This module is where both are imported from.

URL: ``redlock://[user:password@]h1:p1,h2:p2,h3:p3,h4:p4,h5:p5[/db][?option=value&…]``. N ≥ 3
(5 is usual; an even N is warned about because it tolerates no more failures than N − 1); a
master listed twice is a :class:`~lockkit.errors.ConfigError` (it would count twice towards a
quorum). Options as for ``redis://`` (``timeout`` is the per-master timeout, 0.25 s by default)
plus ``tls=true`` and ``retry_delay`` (upper bound of the random delay after a split vote).

**How it works.** Every request goes to all masters at once: the commands are written to every
master first, then the replies are read against one shared deadline, so a slow or blackholed
master costs one ``timeout``, not one per master, and no thread is needed. An acquire's first attempt
and a release stop reading once the replies read so far decide (a quorum won, a quorum released): the
later masters' replies are read before the next command on their connections (L-9). The acquire is a plain
``SET NX PX`` (no script: the cheapest a master can do); release, renew and undo use the single-node
driver's Lua scripts (:mod:`.scripts`) and key layout (:mod:`.keys`), without the fencing counter. A
grant needs a quorum (N // 2 + 1) *and* a positive validity, ``ttl − elapsed − (ttl × 0.01 + 2 ms)``,
measured from before the first request; otherwise the round is undone on *all* masters (a timed-out one
may have applied it) before waiting: for the release's wake-up when someone holds a quorum, or, after a
split vote or a race, for a random pause of at most three round trips (and ``retry_delay``) that ignores
wake-ups, so that the losers do not retry in step. Only a retry that every master answered with "taken"
is not undone (our key is nowhere, unless an earlier undo missed a master: then it is undone too): a retry
also asks each master the lock's ``PTTL``, which a first attempt leaves to its undo. A renewal holds only
on a quorum within validity, and a master whose ``run_id`` changed since the acquire (it restarted,
perhaps without our key) does not count. An acquire's first attempt is made by the driver itself, without the
retry machinery (no watcher, flow runner or task: most acquires end with it); only a failed one goes on in
:func:`.flow.redlock_acquire_flow`, and the hubs' snapshot its wait compares against is taken before that first
attempt, so a release published in between is not slept through.

**Guarantees and their limits.** Safety rests on timing: bounded clock drift between masters
and clients, and no process pause longer than the validity; a master restarted without
persistence forgets its keys (the run_id guard catches it on renew, not before a second client
wins), and a server clock jump can expire a key early. **No fencing token**: a per-master
counter max is not monotonic across quorums, and a max-register read and written by majority
can hand the *same* token to two clients in exactly the overlap that fencing exists for
(Kleppmann's objection), so the guarantees say ``fencing="none"`` and a lease carries no
fencing token (``lease.fenced`` is false; reading ``lease.fencing_token`` raises ``ConfigError``).
Use etcd or ZooKeeper where correctness needs fencing. Replicas given as masters are not
detected. Waiting is not FIFO (per-master queues could disagree on the head and split the
vote): a release wakes every waiter of the lock. So that a releaser that acquires again at once does not
take the lock straight back from a client that waits for it (it is already running, the waiter must wake
up first), a release whose ``PUBLISH`` reached another client's subscriber makes this client's next
acquire of that lock wait a few round trips first (:data:`.flow.YIELD_ROUNDS`; docs/backends/redis.md,
"Redlock fairness").

**Presence records** (for ``migrate``, :mod:`.presence`): an announce or
withdraw goes to every master and stands once a majority applied it; ``members``
is the union of the live records read from at least a majority.
"""

from __future__ import annotations

from ...driver import DriverContext
from ...urls import BackendURL
from ._async.redlock import GUARANTEES, MAX_TRACKED, AsyncRedlockDriver
from ._sync.redlock import RedlockDriver as BlockingRedlockDriver

__all__ = ["GUARANTEES", "MAX_TRACKED", "AsyncRedlockDriver", "RedlockDriver"]


class RedlockDriver(BlockingRedlockDriver):
    """The blocking driver as the registry finds it (``lockkit.drivers.redis.redlock:RedlockDriver``), which
    also asks it for the asyncio face: :meth:`from_url_async`."""

    @staticmethod
    def from_url_async(url: BackendURL, ctx: DriverContext) -> AsyncRedlockDriver:
        return AsyncRedlockDriver.from_url(url, ctx)
