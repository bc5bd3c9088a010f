"""Session leases of the etcd driver: one etcd lease per distinct whole-second TTL, shared by every lock.

Modelled on etcd's Go ``concurrency.Session``: every key the client creates for a
lock of that TTL (held or queued) is attached to the session's lease, so a dead
client's locks all vanish together when the lease expires, and keeping a
thousand locks costs one keepalive per period.

* **Granted lazily** on the first acquire with a given ``ceil(ttl)``; etcd may
  grant more (its minimum TTL, about 2 s by default), and the granted TTL is the
  effective ttl of every lock on it.
* **Kept alive** by the renewal scheduler's ``renew_many`` (one keepalive per
  round per session, shared by rounds within a fifth of the TTL, plus one
  round trip checking that the locks' keys still exist), by waiters when nobody holds a lock (at half the TTL,
  one keepalive however many waiters), and by an acquire that finds the lease
  older than a sixth of its TTL. An idle session is not kept alive: it lapses,
  and the next acquire grants a new one.
* **Lost** when a keepalive reports TTL <= 0 (revoked by an operator, expired)
  or when no keepalive succeeded within the TTL (counted locally from the send
  time of the last good one). Every lock held on it is reported through
  ``ctx.events.lost``; a lease lost locally is revoked (best effort) so that keys
  it may still hold on the server do not linger; later acquires get a new lease.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from ...driver import Grant, LeaseEvents
from ...errors import BackendUnavailable
from ...timing import Clock, lease_deadline
from .client import EtcdClient, cmp_created, delete_op, range_op, rpc
from .keys import lock_key

__all__ = ["Held", "Session", "Sessions"]

log = logging.getLogger("lockkit")

REVOKE_TIMEOUT = 1.0
MAX_TXN_OPS = 128
"""etcd's default ``--max-txn-ops``: the most compares one transaction may carry."""
ACQUIRE_REFRESH_AGE = 1 / 6
"""An acquire keeps the lease alive first if its last keepalive is older than this share of the TTL.

A new lock's validity counts from the session's last keepalive, so the renewal scheduler would renew a
lock acquired on an older session almost at once (due at keepalive + ttl/3); keeping the session younger
than ttl/6 lets a lock held briefly be released before any renewal, for one extra keepalive per ttl/6."""


@dataclass(eq=False)
class Session:
    lease_id: int
    ttl: int
    """The TTL etcd granted (whole seconds): the effective ttl of every lock on this lease."""
    requested: int
    refreshed_at: float
    """``clock()`` just before the last successful grant or keepalive was sent."""
    dead: bool = False
    tokens: set[str] = field(default_factory=set)
    """Tokens of the locks held on this lease (reported lost with it)."""
    waiters: int = 0
    """Acquisitions queued on this lease now (:meth:`Sessions.waiting`): a lease lost locally is revoked for them."""
    keys: set[bytes] = field(default_factory=set)
    """Our keys on this lease that may exist on the server (held, queued, or orphaned): their slots are taken."""
    refresh_lock: threading.Lock = field(default_factory=threading.Lock)

    def expires_locally(self) -> float:
        return lease_deadline(self.refreshed_at, self.ttl)


@dataclass(frozen=True)
class _Orphan:
    """A key of ours whose fate is unknown (a request on it failed or was interrupted): to delete, guarded."""

    session: Session
    key: bytes
    revision: int
    """Its create_revision if known (the delete is guarded on it), else 0: guarded on ``value``."""
    value: bytes
    refused_since: float | None = None
    """``clock()`` at the first sweep whose delete of it failed (``None``: never tried, or not refused yet).

    One whose deletes keep failing for a whole TTL while its lease's keepalives succeed costs the lease. The
    clock starts at the first refusal, not at the orphaning: an orphan that waited untried (behind another
    one, or with no sweep due) must not cost every lock of its lease on its first failed delete."""


@dataclass(eq=False)
class Held:
    name: str
    key: bytes
    revision: int
    session: Session


class Sessions:
    """The driver's session leases, keyed by requested whole-second TTL, and its orphaned keys."""

    def __init__(self, client: EtcdClient, clock: Clock, events: LeaseEvents) -> None:
        self._client = client
        self._clock = clock
        self._events = events
        self._mutex = threading.Lock()
        self._grant_mutex = threading.Lock()
        self._by_ttl: dict[int, Session] = {}
        self._orphans: list[_Orphan] = []

    def get(self, ttl: float) -> Session:
        """A live session for locks of ``ttl``: granted if needed, kept alive if older than a sixth of its TTL."""
        requested = max(1, math.ceil(ttl))
        for _ in range(3):
            with self._grant_mutex:
                session = self._by_ttl.get(requested)
                if session is not None and self._clock() >= session.expires_locally():
                    self.lose(session, "no keepalive of the session lease succeeded within its TTL", revoke=True)
                    session = None
                if session is None:
                    sent_at = self._clock()
                    reply = self._client.grant(requested)
                    session = Session(int(reply.ID), int(reply.TTL), requested, sent_at)
                    with self._mutex:
                        self._by_ttl[requested] = session
                    return session
            if self.refresh(session, session.ttl * ACQUIRE_REFRESH_AGE):
                return session
        raise BackendUnavailable(
            f"etcd at {self._client.shown} keeps losing fresh session leases; retry, and check that nothing "
            "revokes them and that the cluster is healthy (etcdctl endpoint health)"
        )

    def refresh(self, session: Session, max_age: float) -> bool:
        """Keepalive unless one was sent within ``max_age``; ``False`` if the lease is gone."""
        with session.refresh_lock:
            if session.dead:
                return False
            if max_age > 0 and self._clock() - session.refreshed_at < max_age:
                return True
            sent_at = self._clock()
            granted = self._client.keepalive(session.lease_id, timeout=min(self._client.timeout, session.ttl / 2))
            if granted <= 0:
                self.lose(session, "etcd reports the session lease gone (revoked or expired)")
                return False
            session.refreshed_at = max(session.refreshed_at, sent_at)
            session.ttl = granted
            return True

    def keep_waiting_alive(self, session: Session) -> float | None:
        """Keep the lease alive for waiters only (at half its TTL); the next refresh time, None if it is gone.

        Orphaned keys are swept here too: when a client only waits, these keepalives are all that keeps its
        session lease alive, and with it every orphan on the lease (an abandoned release's key among them, which
        would otherwise stay held for as long as anyone of the client waits).
        """
        try:
            if not self.refresh(session, session.ttl / 2):
                return None
        except BackendUnavailable:
            return self._clock() + min(1.0, session.ttl / 10)  # retried; the re-check will tell if it expired
        if self._orphans:
            self.sweep()
        return session.refreshed_at + session.ttl / 2

    @contextlib.contextmanager
    def waiting(self, session: Session) -> Iterator[None]:
        """Count a waiter on ``session`` for as long as the block runs."""
        with self._mutex:
            session.waiters += 1
        try:
            yield
        finally:
            with self._mutex:
                session.waiters -= 1

    def renew_held(self, held: Sequence[Held | None], reuse: float) -> list[Grant | Exception | None]:
        """Renew these held keys (``None``: not ours any more), one keepalive and one existence check per lease.

        The one renewal of the driver's locks and permits alike: a lease's keepalive is reused if sent within
        ``reuse`` × its TTL, and every key's validity counts from that keepalive's send; a key gone from the
        server is ``None``, an unreachable etcd the error for each of that lease's keys. Orphans are swept after.
        """
        results: list[Grant | Exception | None] = [None] * len(held)
        groups: dict[int, tuple[Session, list[tuple[int, Held]]]] = {}
        for i, item in enumerate(held):
            if item is not None:
                groups.setdefault(id(item.session), (item.session, []))[1].append((i, item))
        for session, items in groups.values():
            sent_at = self._clock()
            try:
                if not self.refresh(session, session.ttl * reuse):
                    continue
                sent_at = min(sent_at, session.refreshed_at)
                alive = self.alive(session, [h for _, h in items])
            except BackendUnavailable as exc:
                for i, _ in items:
                    results[i] = exc
                continue
            for (i, item), ok in zip(items, alive, strict=True):
                results[i] = Grant(item.revision, float(session.ttl), sent_at) if ok else None
        if self.has_orphans:
            with contextlib.suppress(BackendUnavailable):
                self.sweep()
        return results

    def alive(self, session: Session, held: Sequence[Held]) -> list[bool]:
        """Which of these keys on ``session``'s lease still exist: one round trip however many there are.

        Up to 128 keys: one transaction comparing each key's create_revision with ours. More: one read of
        the keys attached to the lease (``LeaseTimeToLive`` with ``keys``), instead of a transaction per 128
        keys. A key name holds our lease id and our token's hash, so a key of that name on our lease is
        ours (tokens are never reused).
        """
        if len(held) <= MAX_TXN_OPS:
            reply = self._client.txn(
                rpc.TxnRequest(
                    compare=[cmp_created(h.key, h.revision) for h in held], failure=[range_op(h.key) for h in held]
                ),
                "renew check",
            )
            if reply.succeeded:
                return [True] * len(held)
            out = []
            for h, response in zip(held, reply.responses, strict=True):
                kvs = response.response_range.kvs
                out.append(bool(kvs) and int(kvs[0].create_revision) == h.revision)
            return out
        attached = self._client.lease_keys(session.lease_id)
        if attached is None:
            self.lose(session, "etcd reports the session lease gone (revoked or expired)")
            return [False] * len(held)
        return [h.key in attached for h in held]

    def lose(self, session: Session, reason: str, revoke: bool = False) -> None:
        """Mark ``session`` lost, report every lock held on it, and stop using it for new acquires."""
        with self._mutex:
            if session.dead:
                return
            session.dead = True
            if self._by_ttl.get(session.requested) is session:
                del self._by_ttl[session.requested]
            tokens = list(session.tokens)
        # An idle session lapsing is by design (nothing held, nothing queued): worth a warning only when it costs locks.
        log.log(
            logging.WARNING if tokens else logging.DEBUG,
            "lockkit: etcd session lease %x lost (%s); %d lock(s) affected",
            session.lease_id,
            reason,
            len(tokens),
        )
        for token in tokens:
            self._events.lost(token, reason)
        if revoke and (tokens or session.waiters):
            self._revoke(session)

    def _revoke(self, session: Session) -> None:
        try:
            self._client.revoke(session.lease_id, timeout=min(self._client.timeout, REVOKE_TIMEOUT))
        except BackendUnavailable as exc:  # the lease then expires on its own
            log.info("lockkit: could not revoke abandoned etcd lease %x: %s", session.lease_id, exc)

    # -- our keys: slots, and keys whose fate is unknown (a reply was lost) ----------------------

    def take_key(self, session: Session, prefix: str, name: str) -> bytes:
        """Reserve the key of the lowest slot of ``name`` that ``session`` is not using (see .keys)."""
        with self._mutex:
            slot = 0
            while (key := lock_key(prefix, name, session.lease_id, slot)) in session.keys:
                slot += 1
            session.keys.add(key)
            return key

    def free(self, session: Session, key: bytes) -> None:
        """``key`` is gone from the server (deleted, never created, or its lease ended): its slot is free."""
        with self._mutex:
            session.keys.discard(key)

    def orphan(self, session: Session, key: bytes, revision: int = 0, value: bytes = b"") -> None:
        """Remember a key to delete later: guarded on ``revision`` if known, else on its ``value``.

        Swept by the next acquire, renewal round, waiter keepalive or release of this client: whatever keeps the
        session lease alive also sweeps it, so an orphan never outlives the lease's keepalives for long.
        """
        with self._mutex:
            self._orphans.append(_Orphan(session, key, revision, value))

    def sweep(self) -> None:
        """Try once to delete every orphaned key (each delete guarded, so a new owner is never touched).

        It stops at the first delete that fails (etcd may be unreachable: each further one would wait a timeout);
        that one and those not tried are kept for the next sweep, the untried first.

        An orphan that etcd keeps refusing to delete for a whole TTL while its lease's keepalives succeed would
        be kept held by them for good (every other lock of the session renews the same lease): then the lease is
        given up (its locks are reported lost, it is revoked, or at least no longer kept alive, so it expires).
        """
        with self._mutex:
            orphans, self._orphans = self._orphans, []
        index = 0
        try:
            for index, orphan in enumerate(orphans):  # noqa: B007  (index: where to resume after a failure)
                if orphan.revision:
                    compare = cmp_created(orphan.key, orphan.revision)
                else:
                    compare = rpc.Compare(
                        result=rpc.Compare.EQUAL, target=rpc.Compare.VALUE, key=orphan.key, value=orphan.value
                    )
                request = rpc.TxnRequest(compare=[compare], success=[delete_op(orphan.key)])
                reply = self._client.txn(request, "cleanup delete")
                if reply.succeeded or orphan.revision:  # deleted now, or (guarded on our revision) gone already
                    self.free(orphan.session, orphan.key)
        except BackendUnavailable:  # refused or unreachable: keep what is left for the next sweep
            failed, untried = orphans[index], orphans[index + 1 :]
            if failed.refused_since is None:
                failed = dataclasses.replace(failed, refused_since=self._clock())
            with self._mutex:
                # The untried go first next time, the failed one last: an orphan etcd keeps refusing must not
                # keep the ones behind it from ever being tried.
                self._orphans[:0] = untried
                self._orphans.append(failed)
            # Only the orphan whose delete was just refused can cost its lease: the others were not tried.
            self._give_up_stuck([failed])
        except BaseException:  # an interrupt, say: keep what is left too
            with self._mutex:
                self._orphans.extend(orphans[index:])
            raise

    def _give_up_stuck(self, orphans: Sequence[_Orphan]) -> None:
        now = self._clock()
        stuck = {
            id(o.session): o.session
            for o in orphans
            if o.refused_since is not None
            and not o.session.dead
            and now - o.refused_since >= o.session.ttl
            and o.session.refreshed_at > o.refused_since
        }
        for session in stuck.values():
            self.lose(session, "a lock key on it could not be deleted for a whole TTL; lease given up", revoke=True)

    @property
    def has_orphans(self) -> bool:
        return bool(self._orphans)

    def close(self) -> None:
        """Revoke every session lease (their keys vanish with them: held locks are freed at once)."""
        with self._mutex:
            sessions, self._by_ttl = list(self._by_ttl.values()), {}
        for session in sessions:
            session.dead = True
            self._revoke(session)
