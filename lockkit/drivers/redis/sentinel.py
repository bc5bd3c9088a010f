"""``redis+sentinel://``, ``rediss+sentinel://``: locks on the master of a Sentinel-managed Redis (blocking and
asyncio).

The drivers are written once, as asyncio code (``_async/sentinel.py``, asking the sentinels in
``_async/sentinels.py``); the blocking face is generated from it. This module is where both are imported from.

URLs::

    redis+sentinel://[user:password@]s1:26379,s2:26379,s3:26379/SERVICE[/db][?option=value&…]
    rediss+sentinel://…        TLS to the sentinels and to the master

The user and password are the master's; the sentinels' are the options ``sentinel_username`` and
``sentinel_password`` (masked like every password: ``***`` in every URL lockkit shows). Every option of
``redis://`` applies (``prefix``, ``timeout``, ``min_replicas``, ``strict``, TLS, …), and ``failover_wait``
(seconds, default 5): how long one call keeps asking the sentinels for a reachable master before it raises
:class:`~lockkit.BackendUnavailable`.

**Finding the master.** The first call asks the sentinels, in the URL's order, ``SENTINEL
get-master-addr-by-name SERVICE`` and ``SENTINEL MASTER SERVICE`` (for the master's config-epoch); the first
that answers is used (and asked first next time). Every fresh connection to the master checks ``ROLE`` before
it carries anything, so a lock write never reaches a replica. The sentinels are asked again when the master
refuses connections or drops them, answers ``READONLY`` or ``LOADING``, or ``ROLE`` says replica, and before the
next call after the sentinel that answered last announced ``+promoted-slave``, ``+failover-state-reconf-slaves``
(it names the promoted replica from then on, ~1 s before its ``+switch-master``) or ``+switch-master`` (one
pub/sub connection to it; also after that connection was down). What a manual failover still leaves open
(replication cut before the switch, sentinels briefly disagreeing) is in docs/backends/redis.md, R-9.
Keys, scripts, fair waiting and pub/sub waking are those of ``redis://`` (:mod:`.single`); the wake-up
connection follows the master, re-subscribes there and wakes every waiter to look again.

**Guarantees.** Sentinel keeps the lock service available across a master's failure; it does not keep the
locks. Replication is asynchronous: a grant (or renewal) the master acknowledged but had not yet sent to the
replica that is promoted is lost, and a second client can take the lock while the first still believes it
holds it. ``min_replicas=N`` (``WAIT N`` after every grant; fewer acknowledgements undo the grant and raise) closes
that for grants at least one acknowledging replica carries, if Sentinel promotes one of them; Sentinel may
still promote a replica that had not acknowledged, and renewals are not waited for. Hence
``survives_failover=False``.

**Fencing tokens** are ``config_epoch << 48 | counter`` (:func:`lockkit.drivers.epoch.composite_token`): the
counter lives in the keyspace and can go back after a failover, the sentinels' config-epoch of the master goes
up at every failover and every sentinel agrees on it. A token of the promoted master outranks every token of
the failed one, so fencing-checking storage refuses a write of a holder whose lock was lost in the failover.
A grant that arrives while the master changes is confirmed on the new master (its token comes from there, or
the acquire fails with BackendUnavailable). ``fencing_epoch`` is refused (ConfigError): the tokens carry an
epoch already.
"""

from __future__ import annotations

from typing import ClassVar

from ...driver import DriverContext
from ...urls import BackendURL
from ._async.sentinel import GUARANTEES, AsyncSentinelDriver
from ._sync.sentinel import SentinelDriver as BlockingSentinelDriver

__all__ = ["GUARANTEES", "AsyncSentinelDriver", "SentinelDriver"]


class SentinelDriver(BlockingSentinelDriver):
    """The blocking driver as the registry finds it (``lockkit.drivers.redis.sentinel:SentinelDriver``), which
    also asks it for the asyncio face: :meth:`from_url_async`."""

    tokens_carry_epoch: ClassVar[bool] = True
    """Its tokens are lifted by the master's config epoch already: ``fencing_epoch`` is refused (registry)."""

    @staticmethod
    def from_url_async(url: BackendURL, ctx: DriverContext) -> AsyncSentinelDriver:
        return AsyncSentinelDriver.from_url(url, ctx)
