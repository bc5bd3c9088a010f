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
  our key still exists and what is now below it.
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

import contextlib
import threading
from collections.abc import Sequence
from typing import Any, ClassVar, NamedTuple

from ...driver import Cancel, DriverContext, Grant, Guarantees, HolderInfo, RenewRequest
from ...errors import BackendUnavailable, LockError
from ...lease import token_hint
from ...urls import BackendURL
from .client import EtcdClient, cmp_created, delete_op, grpc, range_op, rpc
from .config import EtcdOptions, open_client
from .keys import name_range
from .presence import PresenceRecords
from .session import Held, Session, Sessions
from .watch import Watch, Watcher

__all__ = ["EtcdDriver", "EtcdOptions"]


class _Requeue:
    """Our queued key vanished (session lease revoked or expired, or deleted): queue again."""


_REQUEUE = _Requeue()


class _Placed(NamedTuple):
    revision: int
    predecessor: bytes | None
    seen: int
    """The revision at which ``predecessor`` was read: watch from the next one."""
    sent_at: float


class EtcdDriver:
    guarantees: ClassVar[Guarantees] = Guarantees(
        scope="consensus",
        fifo=True,
        fencing="strict",
        survives_failover=True,
        lifetime="session",
        note="Raft consensus; one session lease per client and TTL; fencing token = the key's create_revision.",
    )

    def __init__(self, client: EtcdClient, options: EtcdOptions, ctx: DriverContext) -> None:
        self._client = client
        self._prefix = options.prefix
        self._clock = ctx.clock
        self._events = ctx.events
        self._sessions = Sessions(client, ctx.clock, ctx.events)
        self._watcher = Watcher(client)
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
        start, end = name_range(self._prefix, name)
        for _ in range(100):  # a re-queue happens only when our queued key vanished (lease revoked, deleted)
            if cancel is not None and cancel.cancelled:
                return None
            if self._sessions.has_orphans:
                self._sessions.sweep()
            session = self._sessions.get(ttl)
            key = self._sessions.take_key(session, self._prefix, name)
            one_shot = deadline is not None and self._clock() >= deadline
            try:
                placed = self._place(session, key, token, start, end, one_shot)
            except BaseException:  # failed or interrupted (Ctrl-C): the create may have been applied
                self._sessions.orphan(session, key, value=token.encode())
                raise
            if placed is None or isinstance(placed, _Requeue):  # nothing was created
                self._sessions.free(session, key)
                if placed is None:
                    return None
                continue
            if placed.predecessor is None:
                return self._granted(name, token, key, placed.revision, session, placed.sent_at)
            try:
                result = self._wait(name, token, key, session, placed, start, end, deadline, cancel)
            except BaseException:  # still queued, or granted to nobody who will use it: deleted by a later sweep
                self._forget(token)  # (an interrupt can come after _granted recorded the lock)
                self._sessions.orphan(session, key, placed.revision)
                raise
            if not isinstance(result, _Requeue):
                return result
            self._sessions.free(session, key)  # our queued key vanished
        raise BackendUnavailable(f"etcd at {self._client.shown}: our queued key kept vanishing; giving up")

    def _place(
        self, session: Session, key: bytes, token: str, start: bytes, end: bytes, one_shot: bool
    ) -> _Placed | _Requeue | None:
        """Create our key (one txn) and learn our predecessor; None: a one-shot attempt found it taken."""
        put = rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=token.encode(), lease=session.lease_id))
        if one_shot:  # put only if nobody holds or waits: nothing to clean up when it fails
            empty = rpc.Compare(
                result=rpc.Compare.EQUAL, target=rpc.Compare.CREATE, key=start, range_end=end, create_revision=0
            )
            request = rpc.TxnRequest(compare=[empty], success=[put])
        else:
            request = rpc.TxnRequest(
                compare=[cmp_created(key, 0)],
                success=[put, range_op(start, end, newest_first=True, limit=2)],
                failure=[range_op(key)],
            )
        fresh = min(self._clock(), session.refreshed_at)
        try:
            reply = self._client.call("KV", "Txn", request)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:  # "requested lease not found": revoked or expired
                self._sessions.lose(session, "etcd reports the session lease gone (revoked or expired)")
                return _REQUEUE
            raise self._client.translate(exc, "acquire") from exc
        revision = int(reply.header.revision)
        if one_shot:
            return _Placed(revision, None, revision, fresh) if reply.succeeded else None
        if not reply.succeeded:  # our key exists: a create whose reply was lost, retried
            kvs = reply.responses[0].response_range.kvs
            if not kvs or kvs[0].value != token.encode():
                raise BackendUnavailable(f"etcd at {self._client.shown}: lock key collision; retry")
            mine = int(kvs[0].create_revision)
            below = self._client.range(range_op(start, end, newest_first=True, limit=1, below=mine - 1).request_range)
            pred = below.kvs[0].key if below.kvs else None
            return _Placed(mine, pred, int(below.header.revision), fresh)
        kvs = reply.responses[1].response_range.kvs
        return _Placed(revision, kvs[1].key if len(kvs) > 1 else None, revision, fresh)

    def _wait(
        self,
        name: str,
        token: str,
        key: bytes,
        session: Session,
        placed: _Placed,
        start: bytes,
        end: bytes,
        deadline: float | None,
        cancel: Cancel | None,
    ) -> Grant | _Requeue | None:
        """Sleep until our predecessor's delete, re-check, repeat; the Grant, None (gave up) or _REQUEUE."""
        revision, pred = placed.revision, placed.predecessor or b""
        stop = threading.Event()
        handle, check_now = self._watcher.watch_after(pred, placed.seen, start, end)

        def wake() -> None:
            stop.set()
            handle.fire()

        unhook = cancel.on_cancel(wake) if cancel is not None else None
        with self._mutex:
            session.waiters += 1
        failures = 0
        consumed: Watch | None = None  # the handle whose wake-up was already counted
        next_refresh = session.refreshed_at + session.ttl / 2
        try:
            while True:
                now = self._clock()
                if stop.is_set() or (deadline is not None and now >= deadline):
                    handle.cancel()
                    self._abandon(session, key, revision)
                    return None
                if not check_now:
                    waits = [next_refresh - now] + ([deadline - now] if deadline is not None else [])
                    if not handle.event.wait(max(0.001, min(waits))):
                        refresh = self._sessions.keep_waiting_alive(session)
                        if refresh is None:
                            handle.cancel()
                            return _REQUEUE
                        next_refresh = refresh
                        continue
                    if stop.is_set():
                        continue
                check_now = False
                if handle.event.is_set() and handle is not consumed:  # the delete came, or the watch failed
                    # (cancelled after the re-check, on every path below: sending the cancel now would compete
                    # with the re-check, which is on the hand-off's critical path). Counted once per wake-up,
                    # so that failed re-checks keep backing off while the event stays set.
                    consumed = handle
                    failures = failures + 1 if handle.failed else 0
                    if failures:  # the stream broke or etcd refused the watch: back off before re-watching
                        stop.wait(min(1.0, 0.02 * 2**failures))
                try:
                    check = self._client.txn(
                        rpc.TxnRequest(
                            compare=[cmp_created(key, revision)],
                            success=[range_op(start, end, newest_first=True, limit=1, below=revision - 1)],
                        ),
                        "re-check",
                    )
                except BackendUnavailable:
                    failures += 1
                    stop.wait(min(1.0, 0.02 * 2**failures))
                    check_now = True
                    continue
                if not check.succeeded:  # our key is gone: lease revoked/expired, or deleted by an operator
                    handle.cancel()
                    with contextlib.suppress(BackendUnavailable):
                        self._sessions.refresh(session, 0)
                    return _REQUEUE
                kvs = check.responses[0].response_range.kvs
                if not kvs:
                    handle.cancel()
                    if self._clock() - session.refreshed_at > session.ttl / 3 and not self._sessions.refresh(
                        session, session.ttl / 3
                    ):
                        return _REQUEUE
                    return self._granted(name, token, key, revision, session, session.refreshed_at)
                if kvs[0].key == pred and not handle.event.is_set():
                    continue  # the live watch started before this read: it will see pred's delete
                handle.cancel()
                pred = kvs[0].key
                handle, check_now = self._watcher.watch_after(pred, int(check.header.revision), start, end)
        finally:
            handle.cancel()  # idempotent; here for the exits no branch above covers (an unexpected error)
            with self._mutex:
                session.waiters -= 1
            if unhook is not None:
                unhook()

    def _abandon(self, session: Session, key: bytes, revision: int) -> None:
        try:
            self._client.txn(rpc.TxnRequest(compare=[cmp_created(key, revision)], success=[delete_op(key)]), "dequeue")
        except BackendUnavailable:
            self._sessions.orphan(session, key, revision)
        else:
            self._sessions.free(session, key)

    def _granted(self, name: str, token: str, key: bytes, revision: int, session: Session, sent_at: float) -> Grant:
        with self._mutex:
            self._held[token] = Held(name, key, revision, session)
            session.tokens.add(token)
        return Grant(revision, float(session.ttl), sent_at)

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
        results: list[Grant | Exception | None] = [None] * len(requests)
        groups: dict[int, tuple[Session, list[tuple[int, Held]]]] = {}
        with self._mutex:
            for i, request in enumerate(requests):
                held = self._held.get(request.token)
                if held is not None and held.name == request.name:
                    groups.setdefault(id(held.session), (held.session, []))[1].append((i, held))
        for session, items in groups.values():
            sent_at = self._clock()
            try:
                if not self._sessions.refresh(session, session.ttl * reuse):
                    continue
                sent_at = min(sent_at, session.refreshed_at)
                alive = self._sessions.alive(session, [h for _, h in items])
            except BackendUnavailable as exc:
                for i, _ in items:
                    results[i] = exc
                continue
            for (i, held), ok in zip(items, alive, strict=True):
                results[i] = Grant(held.revision, float(session.ttl), sent_at) if ok else None
        if self._sessions.has_orphans:
            with contextlib.suppress(BackendUnavailable):
                self._sessions.sweep()
        return results

    def _delete_if(self, key: bytes, revision: int) -> bool:
        reply = self._client.txn(
            rpc.TxnRequest(compare=[cmp_created(key, revision)], success=[delete_op(key)]), "release"
        )
        return bool(reply.succeeded)

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
            token_hint(kv.value.decode("utf-8", "replace")),
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

    def ping(self) -> None:
        self._client.range(rpc.RangeRequest(key=self._prefix.encode(), count_only=True), "ping")

    def close(self) -> None:
        self._watcher.close()
        self._sessions.close()
        self._client.close()
