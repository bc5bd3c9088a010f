"""``etcd://h1:2379,h2:2379`` and ``etcds://`` (TLS): consensus locks on etcd v3, one session lease per client.

Guarantees: the lock state lives in etcd's Raft log, so a lock survives the loss
of a minority of members; waiters are served in arrival order (FIFO by
``create_revision``); the fencing token is the holder key's ``create_revision``,
which strictly increases per name (it is etcd's global revision) for as long as
the cluster keeps its data. The model is etcd's Go ``client/v3/concurrency``
(``mutex.go``, ``session.go``).

Key layout (see :mod:`.keys`)::

    <prefix><encode_name(name)>/<lease-id hex>-<slot>  = token

(the slot tells apart one session's simultaneous contenders for a name; key
names are reused, because etcd's range reads slow down with every deleted key
name until compaction).

* **acquire** is one transaction: if our key does not exist, put it under the
  session lease and read the two newest keys of the name's range. If ours is the
  only one we hold the lock (one round trip). Otherwise the other key is our
  predecessor: we wait for its delete (reported by the driver's one watch on the
  lock's range, see :mod:`.watch`), then re-check in one transaction that
  our key still exists and what is now below it. One :class:`~.waiter.Waiter`
  owns the acquisition's key and revision through all of this (:mod:`.waiter`).
  Before reporting "acquired" we know our key exists (so its lease was alive at
  that revision) and that the session's last keepalive is recent (etcd #11456).
  A one-shot attempt (deadline already past) puts its key only if the name's
  range is empty, so a failed ``try_acquire`` leaves nothing to clean up.
* A waiter that times out or is cancelled deletes its key (guarded on its
  ``create_revision``); a key whose create reply was lost is deleted later by
  token (guarded on its value) or dies with the session.
* A key whose fate is unknown (a create, wait or release that failed, timed
  out or was interrupted) is an *orphan*: deleted, guarded, by the next sweep,
  which runs with whatever keeps the session lease alive (acquires, renewal
  rounds, waiters' keepalives, releases). One that stays undeletable for a whole
  TTL while keepalives succeed costs the lease (see :mod:`.session`), so
  it cannot be kept held for good by the client's other locks.
* **release / renew** are guarded on our key's ``create_revision``: a stale
  release never deletes a newer key of the same name (etcd #22082). ``renew``
  is a keepalive of the session lease plus a check that our key still exists;
  ``renew_many`` sends one keepalive per session and checks all its keys in one
  more round trip (a transaction for up to 128 keys, etcd's default
  ``--max-txn-ops``; beyond that one read of the keys attached to the lease).
* **presence** records (``announce``/``withdraw``/``members``, for the migrate
  backend) live under ``<prefix>.presence/``, each on its own lease: see
  :mod:`.presence`.
* Every request fails over to the next member on UNAVAILABLE, keepalives
  included (:mod:`.client`).

Deviations: a lock lives as long as its session lease, so a lock acquired with
``auto_renew=False`` stays held while other locks or waiters of the same client
and TTL keep the session alive (``lifetime="session"``). The effective ttl is
the granted whole-second lease TTL, at least etcd's minimum (about 2 s by
default). ``renew(ttl=…)`` cannot change a lease's TTL: it reports the session's.
Blocking client only: asyncio goes through :mod:`lockkit.offload`.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, ClassVar

from ...driver import Cancel, DriverContext, Grant, Guarantees, HolderInfo, LeaseEvents, Offer, RenewRequest
from ...errors import BackendUnavailable, LockError
from ...lease import token_hint
from ...urls import BackendURL
from . import wire
from .client import MIN_ACQUIRE_BOUND, EtcdClient, range_op, rpc
from .config import EtcdOptions, open_client
from .keys import name_range
from .presence import PresenceRecords
from .session import REVOKE_TIMEOUT, Held, Sessions
from .waiter import Queue, State, Waiter
from .watch import Watcher

__all__ = ["EtcdDriver", "EtcdOptions"]


class EtcdDriver:
    guarantees: ClassVar[Guarantees] = Guarantees(
        scope="consensus",
        fifo=True,
        fencing="strict",
        survives_failover=True,
        lifetime="session",
        note="Raft consensus; one session lease per client and TTL; fencing token = the key's create_revision.",
        semaphores=Offer("yes"),  # issue 18: .semaphore
    )

    def __init__(self, client: EtcdClient, options: EtcdOptions, ctx: DriverContext) -> None:
        self._client = client
        self._prefix = options.prefix
        self._clock = ctx.clock
        self._events = ctx.events
        self._sessions = Sessions(client, ctx.clock, ctx.events)
        self._watcher = Watcher(client)
        self._queue = Queue(client, self._sessions, self._watcher, ctx.clock, options.prefix)
        self._mutex = threading.Lock()
        self._held: dict[str, Held] = {}
        self._presence = PresenceRecords(client, options.prefix)

    @classmethod
    def from_url(cls, url: BackendURL, ctx: DriverContext) -> EtcdDriver:
        client, options = open_client(url)
        return cls(client, options, ctx)

    # -- acquire ---------------------------------------------------------------------------------

    def acquire(
        self, name: str, token: str, ttl: float, deadline: float | None, cancel: Cancel | None = None
    ) -> Grant | None:
        # The acquire's requests share one budget (about the deadline, at least MIN_ACQUIRE_BOUND): against a
        # silent cluster the session's keepalive and the create then fail by about the deadline, not after one
        # timeout each (docs/semantics.md). A wait with no deadline keeps the per-request timeout only.
        budget = None if deadline is None else max(deadline - self._clock(), MIN_ACQUIRE_BOUND)
        with self._client.within(budget):
            return self._acquire(name, token, ttl, deadline, cancel)

    def _acquire(
        self, name: str, token: str, ttl: float, deadline: float | None, cancel: Cancel | None
    ) -> Grant | None:
        for _ in range(100):  # a re-queue happens only when our queued key vanished (lease revoked, deleted)
            if cancel is not None and cancel.cancelled:
                return None
            if self._sessions.has_orphans:
                self._sessions.sweep()
            waiter = Waiter(self._queue, self._sessions.get(ttl), name, token)
            one_shot = deadline is not None and self._clock() >= deadline
            try:
                if waiter.place(one_shot) is State.QUEUED:
                    waiter.wait(deadline, cancel)
                if waiter.granted:
                    return self._granted(name, token, waiter)
            except BaseException:  # failed or interrupted (Ctrl-C), perhaps after _granted recorded the lock:
                self._forget(token)  # granted to nobody who will use it,
                waiter.orphan()  # so a later sweep deletes the key (a no-op if the waiter already left it there)
                raise
            if waiter.unanswered is not None and not (cancel is not None and cancel.cancelled):
                # At the deadline the cluster did not answer our dequeue (C-15): say so, not "the lock was not
                # free", whose advice (retry later, a larger timeout) does not fit. The sweep deletes the key.
                raise BackendUnavailable(
                    f"etcd at {self._client.shown} stopped answering while this acquire waited: giving up its "
                    f"place at its deadline got no answer ({waiter.unanswered}); check the cluster, then retry"
                ) from waiter.unanswered
            if not waiter.vanished:  # a one-shot attempt found the name taken, or we gave up (deadline, cancel)
                return None
        raise BackendUnavailable(
            f"etcd at {self._client.shown}: our queued key kept vanishing; giving up. Retry, and check that "
            "nothing else deletes keys under the prefix or revokes leases"
        )

    def _granted(self, name: str, token: str, waiter: Waiter) -> Grant:
        with self._mutex:
            self._held[token] = Held(name, waiter.key, waiter.revision, waiter.session)
            waiter.session.tokens.add(token)
        return Grant(waiter.revision, float(waiter.session.ttl), waiter.valid_from)

    # -- renew, release -----------------------------------------------------------------------------

    def renew(self, name: str, token: str, ttl: float) -> Grant | None:
        result = self._renew([RenewRequest(name, token, ttl)], reuse=0.0)[0]
        if isinstance(result, Exception):
            raise result
        return result

    def renew_many(self, requests: Sequence[RenewRequest]) -> list[Grant | Exception | None]:
        # A batch shares a keepalive sent within the last fifth of the TTL, and its locks' validity then
        # counts from that keepalive: batches due at different moments fall into step, so that however many
        # locks a session holds, renewing them costs about one keepalive per period (ttl/3). A fifth keeps
        # the next renewal (at the keepalive + ttl/3) out of the scheduler's coalescing window (ttl/10).
        return self._renew(requests, reuse=0.2)

    def _renew(self, requests: Sequence[RenewRequest], reuse: float) -> list[Grant | Exception | None]:
        with self._mutex:
            held = [self._held.get(r.token) for r in requests]
        return self._sessions.renew_held([h if h is not None and h.name == r.name else None
                                          for h, r in zip(held, requests, strict=True)], reuse)  # fmt: skip

    def _delete_if(self, key: bytes, revision: int) -> bool:
        request = wire.txn((wire.compare_created(key, revision),), (wire.delete(key),))  # see .wire
        return bool(self._client.txn_bytes(request, "release").succeeded)

    def _forget(self, token: str) -> Held | None:
        with self._mutex:
            held = self._held.pop(token, None)
            if held is not None:
                held.session.tokens.discard(token)
        return held

    def release(self, name: str, token: str) -> bool:
        held = self._forget(token)
        if held is None or held.name != name:
            return self._release_by_value(name, token)
        try:
            deleted = self._delete_if(held.key, held.revision)
        except BaseException as exc:
            # Failed, timed out or interrupted (Ctrl-C, an exception raised into the thread): the delete may not
            # have run. Nothing tracks the key now, and the session lease it hangs on is kept alive by every other
            # lock and waiter of this client, so left alone it would stay held for good. The next sweep deletes
            # it (guarded on our create_revision: a newer holder's key is never touched).
            self._sessions.orphan(held.session, held.key, held.revision)
            if not isinstance(exc, LockError):
                # The front end handles a failed release (a LockError); after an interrupt its lease may
                # still say valid while the sweep frees the lock: report it lost so that nothing trusts it.
                self._events.lost(token, "its release was interrupted; the lock is freed by a later cleanup")
            raise
        self._sessions.free(held.session, held.key)
        if self._sessions.has_orphans:  # etcd answers again: a good moment to delete what earlier failures left
            self._sessions.sweep()
        return deleted

    def _release_by_value(self, name: str, token: str) -> bool:
        """A token this driver does not track (another handle of the same client): find its key by value."""
        start, end = name_range(self._prefix, name)
        reply = self._client.range(range_op(start, end).request_range)
        for kv in reply.kvs:
            if kv.value == token.encode():
                return self._delete_if(kv.key, int(kv.create_revision))
        return False

    # -- administration ------------------------------------------------------------------------------

    def _first(self, name: str) -> Any:
        start, end = name_range(self._prefix, name)
        return self._client.range(range_op(start, end, limit=1).request_range, "status read")

    def holder(self, name: str) -> HolderInfo:
        reply = self._first(name)
        if not reply.kvs:
            return HolderInfo(False, waiters=0)
        kv = reply.kvs[0]
        left = self._client.time_to_live(int(kv.lease)) if kv.lease else None
        return HolderInfo(
            True,
            # lockkit's value is the token, shown only as its hash; so is another client's value (etcdctl lock
            # and Go's Mutex write an empty one: no hint, "not a lockkit client")
            token_hint(kv.value.decode("utf-8", "replace")) if kv.value else None,
            int(kv.create_revision),
            None if left is None else float(max(left, 0)),
            int(reply.count) - 1,
        )

    def force_release(self, name: str) -> bool:
        reply = self._first(name)
        return bool(reply.kvs) and self._delete_if(reply.kvs[0].key, int(reply.kvs[0].create_revision))

    # -- presence (the migrate backend's fleet guard; see .presence) ----------------------------

    def announce(self, group: str, member: str, value: str, ttl: float | None) -> None:
        self._presence.announce(group, member, value, ttl)

    def withdraw(self, group: str, member: str) -> None:
        self._presence.withdraw(group, member)

    def members(self, group: str) -> dict[str, str]:
        return self._presence.members(group)

    # -- semaphores and reader-writer locks (issue 18; see .semaphore) ------------------------------

    def permits(self, events: LeaseEvents | None = None) -> Any:
        """Permits on their own session leases, whose losses are reported to ``events`` (the permit handles')."""
        from .semaphore import EtcdPermits

        return EtcdPermits(self._client, self._watcher, self._prefix, self._clock, events or self._events)

    def ping(self) -> None:
        self._client.range(rpc.RangeRequest(key=self._prefix.encode(), count_only=True), "ping")

    def close(self) -> None:
        self._watcher.close()
        # The revokes share one bound: a silent cluster costs about REVOKE_TIMEOUT in all, not that per TTL in use.
        with self._client.within(REVOKE_TIMEOUT):
            self._sessions.close()
        self._client.close()
