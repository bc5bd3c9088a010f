"""``redis://``, ``rediss://``, ``unix://``: locks on one Redis server (blocking and asyncio).

The drivers are written once, as asyncio code (``_async/single.py``); the blocking face is generated
from it (``_sync/single.py``, by ``scripts/unasync.py``). This module is where both are imported from.

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

from ...driver import DriverContext
from ...urls import BackendURL
from ._async.single import GUARANTEES, AsyncRedisDriver
from ._sync.single import RedisDriver as BlockingRedisDriver

__all__ = ["GUARANTEES", "AsyncRedisDriver", "RedisDriver"]


class RedisDriver(BlockingRedisDriver):
    """The blocking driver as the registry finds it (``lockkit.drivers.redis.single:RedisDriver``), which
    also asks it for the asyncio face: :meth:`from_url_async`."""

    @staticmethod
    def from_url_async(url: BackendURL, ctx: DriverContext) -> AsyncRedisDriver:
        return AsyncRedisDriver.from_url(url, ctx)
