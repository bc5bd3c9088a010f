"""One acquisition's key in a lock's queue: placed, waited on, then granted, given up or vanished.

A :class:`Waiter` owns one contender's key and ``create_revision`` for the whole
acquisition, as etcd's Go ``concurrency.Mutex`` owns ``myKey`` and ``myRev``, so
the driver's acquire reads as the protocol (see :mod:`.etcd_driver`):

* :meth:`Waiter.place`: one transaction puts our key under the session lease if
  it does not exist, and reads the two newest keys of the name's range. Ours
  alone: granted (one round trip). Otherwise the other key is our predecessor.
  A one-shot attempt puts its key only if the range is empty, so a failed
  ``try_acquire`` leaves nothing behind. A create whose reply was lost and is
  retried finds our key again by its value (the token).
* :meth:`Waiter.wait`: sleep until the predecessor's delete (reported by the
  driver's shared watch, :mod:`.watch`), then re-check in one transaction that
  our key still exists and what is now below it; repeat. Before granting we
  know our key exists (its lease was alive then) and that the session's last
  keepalive is recent (etcd #11456).
* :meth:`Waiter.abandon`: we give up (deadline, cancel): delete our key, guarded
  on our ``create_revision`` so that nobody else's key is touched; if that
  fails the key is left to the session's orphan sweep.
* :meth:`Waiter.orphan`: a request on our key failed or was interrupted, so its
  fate is unknown: the sweep deletes it later (guarded on the revision if we
  learnt it, else on our token).

The key's slot (see :mod:`.keys`) is reserved on construction and freed as soon
as the key is known to be gone; a granted key keeps it until its release.
"""

from __future__ import annotations

import contextlib
import enum
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...driver import Cancel
from ...errors import BackendUnavailable
from ...timing import Clock
from . import wire
from .client import EtcdClient, cmp_created, delete_op, grpc, range_op, rpc
from .keys import name_range
from .session import Session, Sessions
from .watch import Watch, Watcher

__all__ = ["Queue", "State", "Waiter"]


class State(enum.Enum):
    """Where one acquisition's key stands."""

    NEW = "new"
    """Its slot is reserved; nothing was sent yet."""
    QUEUED = "queued"
    """Our key exists, with a predecessor below it."""
    GRANTED = "granted"
    """Our key exists and nothing is below it: we hold the lock."""
    TAKEN = "taken"
    """A one-shot attempt found the name taken; nothing was created."""
    VANISHED = "vanished"
    """Our key is gone (its lease revoked or expired, or deleted): queue again."""
    ABANDONED = "abandoned"
    """We gave up (deadline, cancel): the key was deleted, or left to the sweep."""
    ORPHANED = "orphaned"
    """A request on the key failed or was interrupted: left to the sweep."""


@dataclass(frozen=True)
class Queue:
    """What every waiter of one driver shares: its connection, session leases, watch stream and clock."""

    client: EtcdClient
    sessions: Sessions
    watcher: Watcher
    clock: Clock
    prefix: str


class Waiter:
    """One acquisition's key on ``session``'s lease, and its ``create_revision`` once placed (the fencing token)."""

    def __init__(self, queue: Queue, session: Session, name: str, token: str) -> None:
        self._queue = queue
        self.session = session
        self.start, self.end = name_range(queue.prefix, name)
        self.key = queue.sessions.take_key(session, queue.prefix, name)
        self._value = token.encode()
        self.state = State.NEW
        self.revision = 0
        """Our key's create_revision, once placed (0 before)."""
        self.valid_from = 0.0
        """When granted: the clock time the lock's validity counts from (a keepalive's or the create's send time)."""
        self.unanswered: BackendUnavailable | None = None
        """Why giving up our place (:meth:`abandon`) got no answer: the cluster stopped answering while we waited."""
        self._predecessor = b""
        self._seen = 0
        """The revision at which ``_predecessor`` was read: a wait watches for its delete after it."""

    @property
    def granted(self) -> bool:
        return self.state is State.GRANTED

    @property
    def vanished(self) -> bool:
        """Our queued key went without us (lease revoked or expired, key deleted): the caller queues again."""
        return self.state is State.VANISHED

    # -- place -----------------------------------------------------------------------------------

    def place(self, one_shot: bool) -> State:
        """Create our key (one transaction) and learn our predecessor: GRANTED, QUEUED, TAKEN or VANISHED.

        A failure or an interrupt leaves the key to the sweep (the create may have been applied), then raises.
        """
        try:
            return self._place(one_shot)
        except BaseException:
            self.orphan()
            raise

    def _place(self, one_shot: bool) -> State:
        # encoded by .wire: the one request every acquire sends (the generated classes cost ~8 µs here)
        put = wire.put(self.key, self._value, self.session.lease_id)
        if one_shot:  # put only if nobody holds or waits: nothing to clean up when it fails
            request = wire.txn((wire.compare_range_empty(self.start, self.end),), (put,))
        else:  # the two newest keys, names only: the second one (if any) is our predecessor
            request = wire.txn(
                (wire.compare_created(self.key, 0),),
                (put, wire.range_newest(self.start, self.end, 2, keys_only=True)),
                (wire.range_key(self.key),),
            )
        # validity counts from before the create was sent, or from the session's last keepalive if older
        fresh = min(self._queue.clock(), self.session.refreshed_at)
        client = self._queue.client
        try:
            reply = client.call("RawKV", "Txn", request)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:  # "requested lease not found": revoked or expired
                self._queue.sessions.lose(self.session, "etcd reports the session lease gone (revoked or expired)")
                return self._gone(State.VANISHED)
            raise client.translate(exc, "acquire") from exc
        revision = int(reply.header.revision)
        if one_shot:
            if not reply.succeeded:
                return self._gone(State.TAKEN)
            self.revision, self.valid_from, self.state = revision, fresh, State.GRANTED
            return self.state
        if reply.succeeded:
            kvs = reply.responses[1].response_range.kvs
            self.revision, self._seen = revision, revision
            predecessor = kvs[1].key if len(kvs) > 1 else None
        else:  # our key exists: a create whose reply was lost, retried
            kvs = reply.responses[0].response_range.kvs
            if not kvs or kvs[0].value != self._value:
                raise BackendUnavailable(f"etcd at {client.shown}: lock key collision; retry")
            self.revision = int(kvs[0].create_revision)
            below = client.range(self._below(self.revision).request_range)
            self._seen = int(below.header.revision)
            predecessor = below.kvs[0].key if below.kvs else None
        if predecessor is None:
            self.valid_from, self.state = fresh, State.GRANTED
        else:
            self._predecessor, self.state = predecessor, State.QUEUED
        return self.state

    @property
    def _recheck(self) -> bytes:
        """Our key still exists (created at our revision), and the newest key created before it, if any."""
        below = wire.range_newest(self.start, self.end, 1, below=self.revision - 1, keys_only=True)
        return wire.txn((wire.compare_created(self.key, self.revision),), (below,))

    def _below(self, revision: int) -> Any:
        """A read of the newest key of the name's range created before ``revision``."""
        return range_op(self.start, self.end, newest_first=True, limit=1, below=revision - 1)

    # -- wait ------------------------------------------------------------------------------------

    def wait(self, deadline: float | None, cancel: Cancel | None) -> State:
        """Wait for the keys before ours to go: GRANTED, ABANDONED (deadline, cancel) or VANISHED.

        Server-woken: the shared watch fires on our predecessor's delete (or on any watch failure), and every
        wake-up is followed by one re-check transaction, so a spurious wake costs one read and never grants.
        A failure or an interrupt leaves the key to the sweep, then raises.
        """
        if self.state is not State.QUEUED:
            return self.state
        try:
            with self._queue.sessions.waiting(self.session):
                return self._wait(deadline, cancel)
        except BaseException:
            self.orphan()
            raise

    def _wait(self, deadline: float | None, cancel: Cancel | None) -> State:
        clock, sessions, session = self._queue.clock, self._queue.sessions, self.session
        stop = threading.Event()
        handle, check_now = self._watch(self._predecessor, self._seen)

        def wake() -> None:
            stop.set()
            handle.fire()  # the current handle (rebound below when the predecessor changes)

        unhook: Callable[[], None] | None = cancel.on_cancel(wake) if cancel is not None else None
        failures = 0
        consumed: Watch | None = None  # the handle whose wake-up was already counted
        next_refresh = session.refreshed_at + session.ttl / 2
        try:
            while True:
                now = clock()
                if stop.is_set() or (deadline is not None and now >= deadline):
                    handle.cancel()
                    self.abandon()
                    return self.state
                if not check_now:
                    waits = [next_refresh - now] + ([deadline - now] if deadline is not None else [])
                    if not handle.event.wait(max(0.001, min(waits))):
                        refresh = sessions.keep_waiting_alive(session)
                        if refresh is None:  # the lease is gone, and our key with it
                            handle.cancel()
                            return self._gone(State.VANISHED)
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
                    check = self._queue.client.txn_bytes(self._recheck, "re-check")
                except BackendUnavailable:
                    failures += 1
                    stop.wait(min(1.0, 0.02 * 2**failures))
                    check_now = True
                    continue
                if not check.succeeded:  # our key is gone: lease revoked/expired, or deleted by an operator
                    handle.cancel()
                    with contextlib.suppress(BackendUnavailable):
                        sessions.refresh(session, 0)  # learn now whether the lease is gone too
                    return self._gone(State.VANISHED)
                kvs = check.responses[0].response_range.kvs
                if not kvs:  # nothing below us: ours, once the session is known to be alive (etcd #11456)
                    handle.cancel()
                    if clock() - session.refreshed_at > session.ttl / 3 and not sessions.refresh(
                        session, session.ttl / 3
                    ):
                        return self._gone(State.VANISHED)
                    self.valid_from, self.state = session.refreshed_at, State.GRANTED
                    return self.state
                if kvs[0].key == self._predecessor and not handle.event.is_set():
                    continue  # the live watch started before this read: it will see the predecessor's delete
                handle.cancel()
                self._predecessor, self._seen = kvs[0].key, int(check.header.revision)
                handle, check_now = self._watch(self._predecessor, self._seen)
        finally:
            handle.cancel()  # idempotent; here for the exits no branch above covers (an unexpected error)
            if unhook is not None:
                unhook()

    def _watch(self, predecessor: bytes, seen: int) -> tuple[Watch, bool]:
        return self._queue.watcher.watch_after(predecessor, seen, self.start, self.end)

    # -- give up -----------------------------------------------------------------------------------

    def abandon(self) -> None:
        """Delete our key, guarded on our create_revision; if that fails, leave it to the sweep.

        Idempotent, and safe whatever happened before: a key never created, already gone or already left to
        the sweep costs nothing; one whose lease was lost meanwhile is deleted if it is still there (the guard
        keeps a newer contender's key safe).
        """
        if self.state is State.NEW:  # nothing was sent: nothing to delete
            self._gone(State.ABANDONED)
            return
        if self.state not in (State.QUEUED, State.GRANTED):
            return
        delete = rpc.TxnRequest(compare=[cmp_created(self.key, self.revision)], success=[delete_op(self.key)])
        try:
            self._queue.client.txn(delete, "dequeue")
        except BackendUnavailable as exc:
            self.orphan()
            self.state = State.ABANDONED
            self.unanswered = exc
        else:
            self._gone(State.ABANDONED)

    def orphan(self) -> None:
        """Our key's fate is unknown (a request on it failed or was interrupted): the sweep deletes it later.

        Guarded on our create_revision if we learnt it, else on our token (a create whose reply was lost).
        Idempotent; nothing happens if the key is known to be gone or was left to the sweep already.
        """
        if self.state not in (State.NEW, State.QUEUED, State.GRANTED):
            return
        self.state = State.ORPHANED
        if self.revision:
            self._queue.sessions.orphan(self.session, self.key, self.revision)
        else:
            self._queue.sessions.orphan(self.session, self.key, value=self._value)

    def _gone(self, state: State) -> State:
        """Our key does not exist on the server (never created, deleted, or gone with its lease): free its slot."""
        self._queue.sessions.free(self.session, self.key)
        self.state = state
        return state
