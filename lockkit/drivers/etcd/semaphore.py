"""``etcd://`` semaphores and reader-writer locks: revision order under a session lease (etcd's recipes).

Layout (``E`` = :func:`lockkit.names.encode_name` of the name, which never yields ``.``, so no lock's range
contains these keys)::

    <prefix>.sem/E/<lease-id, 16 hex>-<slot>   = "<mode> <limit> <token>"   (mode: permit | read | write)

Every contender (holder or waiter) owns one key, put under a session lease of its ttl. The keys of a name in
``create_revision`` order are the queue, and whether a key holds is a function of the keys before it:

* a ``permit`` holds when fewer than ``limit`` keys are before it (the first ``limit`` keys hold);
* a ``read`` holds when no ``write`` key is before it (a reader waits only for the writers before it, so a
  writer holds back every reader that comes after it: writer preference);
* a ``write`` holds when it is the first key.

So grants come in revision order, and the fencing token is the key's ``create_revision``: it strictly
increases per name, and a writer's is above every earlier holder's. A waiter watches the keys that block it
(for a writer, its predecessor; for a reader, the writers before it; for a permit, the keys before it) and
re-checks in one transaction once enough of them are deleted to let it hold (a permit with ``b`` keys before
it needs ``b - limit + 1`` of their deletes, a reader every writer's): no key can join *before* it (revisions
only grow), so counting the deletes it watches is exact, and the transaction, not the count, decides. (A
re-check on every delete made each release cost a transaction per waiter: with 16 contenders for a
semaphore of limit 1, handoffs ran at half the mutex's rate.) It keeps its session alive while it waits.
A key whose fate is unknown (a reply lost) is left to the session's sweep, as lock keys are (:mod:`.session`).
The session leases are this object's own (:class:`~.session.Sessions` with the permit handles' events), so a
lost lease reports exactly the permits on it. Values carry the limit: a contender that finds another limit
among the keys deletes its own and raises.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...driver import Cancel, Grant, LeaseEvents, PermitInfo, PermitMode, RenewRequest
from ...errors import BackendUnavailable
from ...timing import Clock
from ..embedded.permits import limit_mismatch
from .client import MIN_ACQUIRE_BOUND, EtcdClient, cmp_created, delete_op, grpc, range_op, rpc
from .keys import name_range
from .session import REVOKE_TIMEOUT, Held, Session, Sessions
from .watch import Watch, Watcher

__all__ = ["EtcdPermits"]

SPACE = ".sem/"
MAX_WATCHED = 64
"""A waiter watches at most this many blocking keys (the oldest); it re-checks at its keepalives anyway."""


@dataclass(frozen=True)
class _Entry:
    key: bytes
    revision: int
    mode: str
    limit: int


def _entries(kvs: Any) -> list[_Entry]:
    out = []
    for kv in kvs:
        parts = kv.value.decode("utf-8", "replace").split(" ", 2)
        try:
            mode, limit = parts[0], int(parts[1])
        except (IndexError, ValueError):  # not a lockkit permit key: counted as exclusive, never as ours
            mode, limit = "write", -1
        out.append(_Entry(bytes(kv.key), int(kv.create_revision), mode, limit))
    return sorted(out, key=lambda e: e.revision)


def _blockers(entries: Sequence[_Entry], revision: int, mode: str, limit: int) -> list[_Entry]:
    """The keys that keep the key created at ``revision`` from holding (none: it holds)."""
    before = [e for e in entries if e.revision < revision]
    if mode == "permit":
        return [] if len(before) < limit else before[:MAX_WATCHED]
    if mode == "read":
        return [e for e in before if e.mode == "write"][:MAX_WATCHED]
    return before[-1:]


def _deletes_needed(entries: Sequence[_Entry], revision: int, mode: str, limit: int, blockers: Sequence[_Entry]) -> int:
    """How many of ``blockers``' deletes could let the key created at ``revision`` hold: 1 (re-check on every
    delete) where the watched blockers are not all of them (a writer's predecessor, over MAX_WATCHED)."""
    if mode == "permit":
        before = sum(1 for e in entries if e.revision < revision)
        return before - limit + 1 if before <= MAX_WATCHED else 1
    if mode == "read":
        writers = sum(1 for e in entries if e.revision < revision and e.mode == "write")
        return len(blockers) if writers <= MAX_WATCHED else 1
    return 1


def _holding(entries: Sequence[_Entry]) -> list[_Entry]:
    return [e for e in entries if not _blockers(entries, e.revision, e.mode, e.limit if e.limit > 0 else 1)]


class EtcdPermits:
    """The :class:`~lockkit.driver.PermitDriver` of one :class:`~.etcd_driver.EtcdDriver`."""

    def __init__(self, client: EtcdClient, watcher: Watcher, prefix: str, clock: Clock, events: LeaseEvents) -> None:
        self._client = client
        self._watcher = watcher
        self._prefix = prefix + SPACE
        self._clock = clock
        self._sessions = Sessions(client, clock, events)
        self._mutex = threading.Lock()
        self._held: dict[str, Held] = {}

    # -- acquire -----------------------------------------------------------------------------------

    def acquire_permit(
        self,
        name: str,
        token: str,
        ttl: float,
        deadline: float | None,
        limit: int,
        mode: PermitMode,
        cancel: Cancel | None = None,
    ) -> Grant | None:
        # One budget for the acquire's requests, as the lock driver's acquire (E-8).
        budget = None if deadline is None else max(deadline - self._clock(), MIN_ACQUIRE_BOUND)
        with self._client.within(budget):
            return self._acquire_permit(name, token, ttl, deadline, limit, mode, cancel)

    def _acquire_permit(
        self,
        name: str,
        token: str,
        ttl: float,
        deadline: float | None,
        limit: int,
        mode: PermitMode,
        cancel: Cancel | None,
    ) -> Grant | None:
        for _ in range(100):  # again only when our queued key vanished (its lease revoked or expired)
            if cancel is not None and cancel.cancelled:
                return None
            if self._sessions.has_orphans:
                self._sessions.sweep()
            session = self._sessions.get(ttl)
            outcome = self._contend(session, name, token, ttl, deadline, limit, mode, cancel)
            if outcome != "vanished":
                return outcome if isinstance(outcome, Grant) else None
        raise BackendUnavailable(
            f"etcd at {self._client.shown}: our queued permit key kept vanishing; giving up. Retry, and check "
            "that nothing else deletes keys under the prefix or revokes leases"
        )

    def _contend(
        self,
        session: Session,
        name: str,
        token: str,
        ttl: float,
        deadline: float | None,
        limit: int,
        mode: PermitMode,
        cancel: Cancel | None,
    ) -> Grant | str | None:
        client, sessions = self._client, self._sessions
        start, end = name_range(self._prefix, name)
        key = sessions.take_key(session, self._prefix, name)
        value = f"{mode} {limit} {token}".encode()
        put = rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value, lease=session.lease_id))
        request = rpc.TxnRequest(
            compare=[cmp_created(key, 0)], success=[put, range_op(start, end)], failure=[range_op(key)]
        )
        revision = 0
        try:
            try:
                reply = client.call("KV", "Txn", request)
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.NOT_FOUND:  # "requested lease not found": revoked or expired
                    sessions.lose(session, "etcd reports the session lease gone (revoked or expired)")
                    sessions.free(session, key)
                    return "vanished"
                raise client.translate(exc, "permit acquire") from exc
            if reply.succeeded:
                revision = int(reply.header.revision)
                entries, seen = _entries(reply.responses[1].response_range.kvs), revision
            else:  # our key exists: a create whose reply was lost, retried
                kvs = reply.responses[0].response_range.kvs
                if not kvs or kvs[0].value != value:
                    raise BackendUnavailable(f"etcd at {client.shown}: permit key collision; retry")
                revision = int(kvs[0].create_revision)
                listing = client.range(range_op(start, end).request_range)
                entries, seen = _entries(listing.kvs), int(listing.header.revision)
            with sessions.waiting(session):
                return self._wait(session, name, key, revision, token, entries, seen, deadline, limit, mode, cancel)
        except BaseException:
            # Failed or interrupted: the key may exist (a create applied, its reply lost); the sweep deletes it.
            if revision:
                sessions.orphan(session, key, revision)
            else:
                sessions.orphan(session, key, value=value)
            raise

    def _wait(
        self,
        session: Session,
        name: str,
        key: bytes,
        revision: int,
        token: str,
        entries: list[_Entry],
        seen: int,
        deadline: float | None,
        limit: int,
        mode: PermitMode,
        cancel: Cancel | None,
    ) -> Grant | str | None:
        client, sessions, clock = self._client, self._sessions, self._clock
        start, end = name_range(self._prefix, name)
        woken = threading.Event()
        unhook = cancel.on_cancel(woken.set) if cancel is not None else None
        handles: list[Watch] = []
        next_refresh = session.refreshed_at + session.ttl / 2
        try:
            while True:
                others = [e for e in entries if e.revision != revision]
                wrong = next((e.limit for e in others if e.limit != limit), None)
                if wrong is not None:
                    self._delete(session, key, revision)
                    raise limit_mismatch(name, wrong, limit)
                blockers = _blockers(entries, revision, mode, limit)
                if not blockers:  # ours, once the session is known to be alive (etcd #11456)
                    if clock() - session.refreshed_at > session.ttl / 3 and not sessions.refresh(
                        session, session.ttl / 3
                    ):
                        sessions.free(session, key)
                        return "vanished"
                    with self._mutex:
                        self._held[token] = Held(name, key, revision, session)
                        session.tokens.add(token)
                    return Grant(revision, float(session.ttl), session.refreshed_at)
                now = clock()
                if (cancel is not None and cancel.cancelled) or (deadline is not None and now >= deadline):
                    self._delete(session, key, revision)
                    return None
                for handle in handles:
                    handle.cancel()
                woken.clear()
                handles, check_now = [], False
                for blocker in blockers:
                    handle, again = self._watcher.watch_after(blocker.key, seen, start, end)
                    original, handle.event = handle.event, woken  # any blocker's delete wakes this one event
                    check_now = check_now or again or (original.is_set() and not handle.deleted)
                    handles.append(handle)
                needed = _deletes_needed(entries, revision, mode, limit, blockers)
                while not check_now:
                    woken.clear()  # before counting: a delete seen after the count sets it again
                    if sum(h.deleted for h in handles) >= needed or any(h.failed for h in handles):
                        break
                    if (cancel is not None and cancel.cancelled) or (deadline is not None and clock() >= deadline):
                        break
                    waits = [next_refresh - clock()] + ([deadline - clock()] if deadline is not None else [])
                    if woken.wait(max(0.001, min(waits))):
                        continue
                    if deadline is not None and clock() >= deadline:
                        break
                    refresh = sessions.keep_waiting_alive(session)
                    if refresh is None:  # the lease is gone, and our key with it
                        sessions.free(session, key)
                        return "vanished"
                    next_refresh = refresh
                check = client.txn(
                    rpc.TxnRequest(compare=[cmp_created(key, revision)], success=[range_op(start, end)]), "re-check"
                )
                if not check.succeeded:  # our key is gone: lease revoked/expired, or deleted by an operator
                    with contextlib.suppress(BackendUnavailable):
                        sessions.refresh(session, 0)
                    sessions.free(session, key)
                    return "vanished"
                entries, seen = _entries(check.responses[0].response_range.kvs), int(check.header.revision)
        finally:
            for handle in handles:
                handle.cancel()
            if unhook is not None:
                unhook()

    def _delete(self, session: Session, key: bytes, revision: int) -> None:
        """Delete our key, guarded on its create_revision; if that fails, leave it to the sweep."""
        try:
            self._client.txn(
                rpc.TxnRequest(compare=[cmp_created(key, revision)], success=[delete_op(key)]), "permit dequeue"
            )
        except BackendUnavailable:
            self._sessions.orphan(session, key, revision)
        else:
            self._sessions.free(session, key)

    # -- renew, release ------------------------------------------------------------------------------

    def renew_permits(self, requests: Sequence[RenewRequest]) -> list[Grant | Exception | None]:
        with self._mutex:
            held = [self._held.get(r.token) for r in requests]
        # the locks' renewal (Sessions.renew_held), with renew_many's keepalive reuse: a fifth of the TTL
        return self._sessions.renew_held([h if h is not None and h.name == r.name else None
                                          for h, r in zip(held, requests, strict=True)], 0.2)  # fmt: skip

    def release_permit(self, name: str, token: str) -> bool:
        with self._mutex:
            held = self._held.pop(token, None)
            if held is not None:
                held.session.tokens.discard(token)
        if held is None or held.name != name:
            return False
        try:
            reply = self._client.txn(
                rpc.TxnRequest(compare=[cmp_created(held.key, held.revision)], success=[delete_op(held.key)]),
                "permit release",
            )
        except BaseException:
            self._sessions.orphan(held.session, held.key, held.revision)  # deleted by a later sweep
            raise
        self._sessions.free(held.session, held.key)
        return bool(reply.succeeded)

    # -- administration ------------------------------------------------------------------------------

    def _listing(self, name: str) -> list[_Entry]:
        start, end = name_range(self._prefix, name)
        return _entries(self._client.range(range_op(start, end).request_range, "status read").kvs)

    def permit_holders(self, name: str) -> PermitInfo:
        entries = self._listing(name)
        if not entries:
            return PermitInfo(None, 0, False, 0, None, 0)
        holding = _holding(entries)
        waiting_writers = sum(1 for e in entries if e.mode == "write" and e not in holding)
        return PermitInfo(
            entries[0].limit,
            len(holding),
            any(e.mode == "write" for e in holding),
            waiting_writers,
            max(e.revision for e in holding) if holding else None,
            len(entries) - len(holding),
        )

    def force_release_permits(self, name: str) -> int:
        # Every holder and waiter in ONE delete: removed one by one, the holders' keys went first and a waiter
        # could see itself holding before its own key went, leaving it a lease the server no longer had (a
        # third client then got the "only" permit: tests/test_permit_force_release.py). The count is of the
        # holders among the keys this delete removed.
        start, end = name_range(self._prefix, name)
        request = rpc.DeleteRangeRequest(key=start, range_end=end, prev_kv=True)
        reply = self._client.guarded("force release", lambda: self._client.call("KV", "DeleteRange", request))
        return len(_holding(_entries(reply.prev_kvs)))

    def close(self) -> None:
        with self._client.within(REVOKE_TIMEOUT):  # the revokes share one bound, as the lock driver's close
            self._sessions.close()
