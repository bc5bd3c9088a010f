"""Shared renewal: one scheduler per process (thread) and one per event loop (task).

Every held lease is entered in a :class:`RenewalBook`, the pure core that both
schedulers share. The book answers two questions on a monotonic clock: which
leases are due for renewal now (grouped by backend, so each backend gets one
batch: one Redis pipeline, one etcd keepalive), and which leases passed their
deadline without a successful renewal (they are lost *now*, even if a renewal
call is still hanging on a dead connection).

Renewal is due at about a third of the TTL after the last successful send;
leases due within a tenth of their TTL are pulled into the same batch so that
thousands of leases cost a few wake-ups a second, not thousands. A failed
renewal attempt (connection error) is retried until the deadline; a renewal
the server refuses (our token is gone) loses the lease at once. ``max_hold``
stops auto-renewal after that long, so a stuck holder cannot keep a lock
forever.

The schedulers never run renewal I/O on their own thread or task: a hanging
call must not delay the deadline watchdog. The thread scheduler hands each
backend's batch to a small worker pool (at most one batch in flight per
backend); the async scheduler starts a task per batch.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import math
import threading
import time
import weakref
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ._async.cancel_safe import wait_event
from .driver import Grant, RenewRequest
from .lease import Lease, LeaseState, RenewalTicket, process_id
from .metrics import BackendStats
from .timing import Clock
from .workers import Workers

__all__ = ["AsyncRenewalScheduler", "RenewalBook", "RenewalScheduler", "async_scheduler", "scheduler"]

log = logging.getLogger("lockkit")

RENEW_FRACTION = 1 / 3
COALESCE_FRACTION = 0.1
RETRY_FRACTION = 0.1
MAX_RETRY_DELAY = 1.0
IDLE_TICK = 1.0
FAILURE_LOG_INTERVAL = 5.0
GROUP_FRACTION = 0.01
"""Leases queued together whose due times lie within a hundredth of their TTL share one heap item, due at the
earliest of them. A driver that renews one lease at a time (memory://, file://) reads the clock per lease, and
grouped by exact instant each lease was an item of its own again: 100,000 items a round. Earlier is always
safe: a renewal a hundredth of a TTL early, a deadline looked at early and watched again."""


class RenewTarget(Hashable, Protocol):
    """The backend a lease lives on, as the scheduler sees it."""

    stats: BackendStats


@dataclass(eq=False)
class Entry:
    lease: Lease
    target: Any
    requested_ttl: float
    auto_renew: bool
    stop_renewing_at: float | None
    next_renew: float
    in_flight: bool = False
    ticket: RenewalTicket | None = None
    """The lease's note of the batch renewal in flight (see :meth:`Lease.renewal_started`)."""
    live: bool = True
    """Still in the book: false once removed (or replaced by a new grant), when all its heap items are stale."""
    renew_version: int = 0
    """Bumped whenever the renewal is rescheduled: renewal items of older versions are stale."""
    deadline_version: int = 0
    """Bumped whenever the deadline watch moves: deadline items of older versions are stale."""
    deadline_at: float = math.inf
    """When the live deadline item fires: never after the lease's deadline (see :meth:`RenewalBook._push`)."""
    request: RenewRequest | None = None
    """The request a batch sends for it, made once (name, token and requested ttl change only by retune)."""

    def renewing(self) -> bool:
        return self.auto_renew and (self.stop_renewing_at is None or self.next_renew < self.stop_renewing_at)

    def renew_request(self) -> RenewRequest:
        request = self.request
        if request is None:
            request = self.request = RenewRequest(self.lease.name, self.lease.token, self.requested_ttl)
        return request


_RENEW, _DEADLINE = 0, 1
_Group = tuple[list["Entry"], list[int]]
"""Entries queued for one instant, and the version (of its renewal or deadline) each was queued at. Two lists,
not a pair per entry: a pair would be one more object per lease per round for the cyclic GC to promote and
scan, and full collections were a third of a 10,000-lease round's CPU."""
_Queue = dict[int, list[tuple[list[float], _Group]]]
"""Groups being gathered before they go into the heap, by kind: each with its due time (the earliest member's,
in a one-item list so that a joining member can lower it), the last one open to members due about then."""


def renew_due(lease: Lease) -> float:
    """When to renew next: a third of the lease's ttl after the send its deadline counts from.

    Read off the lease (not off the last batch's reply), because a direct ``renew(ttl=…)`` or an overlapping
    renewal may have set a shorter deadline than the batch's own reply would.
    """
    return lease.expires_at - lease.ttl * (1 - RENEW_FRACTION)


class RenewalBook:
    """Pure bookkeeping of held leases: due renewals, passed deadlines, applying results.

    A heap of (wake time, group of entries) with lazy invalidation. Leases renewed by one batch come back
    with one send time and, nearly always, one ttl, so they are due again at one instant: they go back into
    the heap as one item, and a renewal round of ten thousand leases costs a couple of heap operations, not
    tens of thousands (per-lease heap work also grew with the log of the number held). Each member of a group
    carries the version of its entry it was queued at; an entry rescheduled since (retune, release) leaves
    its old membership stale, skipped when the group is taken.

    Each entry has one live renewal and one live deadline membership, versioned apart. The deadline watch
    stays where it is while renewals move the deadline later, and is moved only when the deadline moved
    earlier (it must never fire after it) or when it would otherwise fire before the next renewal (a wake-up
    that would find nothing to do). Renewals due on a backend whose batch is still in flight are parked on
    that backend and re-queued when the batch completes; their deadlines stay in the heap, so the watchdog
    never waits for a slow batch.
    """

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._entries: dict[int, Entry] = {}
        self._heap: list[tuple[float, int, int, float, _Group]] = []
        self._seq = itertools.count()
        self._busy: set[Any] = set()
        self._parked: dict[Any, list[Entry]] = {}
        self._warned: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()
        # Leases added since the last look: most locks are released long before anything about them is
        # due, so an add is one dict insert and the entry and heap items are made only if it is still held
        # when the scheduler next looks (which it does by the lease's first due time; see the schedulers).
        self._incoming: dict[int, tuple[Lease, Any, float, bool, float | None]] = {}

    def __len__(self) -> int:
        return len(self._entries) + len(self._incoming)

    def heap_size(self) -> int:
        """Items queued, stale ones included: the heap work a renewal round costs (pinned by the tests)."""
        return len(self._heap)

    def _admit(self) -> None:
        incoming, self._incoming = self._incoming, {}
        queued: _Queue = {}
        for lease, target, requested_ttl, auto_renew, max_hold in incoming.values():
            stop = None if max_hold is None else lease.acquired_at + max_hold
            next_renew = lease.acquired_at + lease.ttl * RENEW_FRACTION
            entry = Entry(lease, target, requested_ttl, auto_renew, stop, next_renew)
            self._entries[id(lease)] = entry
            self._push(entry, queued)
        self._flush(queued)

    def _flush(self, queued: _Queue) -> None:
        """Put what :meth:`_push` gathered into the heap: one item per (kind, instant)."""
        heap, seq = self._heap, self._seq
        for kind, groups in queued.items():
            for (at,), group in groups:
                # Renewals due within a tenth of their TTL join a batch (the first member's: pulling a renewal in
                # early is safe, and a min over the group cost a pass per item); deadlines are exact.
                window = group[0][0].lease.ttl * COALESCE_FRACTION if kind == _RENEW else 0.0
                heapq.heappush(heap, (at, next(seq), kind, window, group))

    def _push(self, entry: Entry, queued: _Queue) -> None:
        """Reschedule into ``queued`` (see :meth:`_flush`): its renewal, if due to renew and not in flight; and
        its deadline watch, if the deadline moved earlier, or if the watch would wake the scheduler before the
        next renewal for a deadline that has since moved later."""
        lease = entry.lease
        expires_at = lease.expires_at
        watched = entry.deadline_at
        if expires_at != watched and (
            expires_at < watched or entry.in_flight or not entry.renewing() or watched <= entry.next_renew
        ):
            entry.deadline_version += 1
            entry.deadline_at = _join(queued, _DEADLINE, expires_at, entry, entry.deadline_version)
        entry.renew_version += 1
        if entry.renewing() and not entry.in_flight:
            _join(queued, _RENEW, entry.next_renew, entry, entry.renew_version)

    def _reschedule(self, entry: Entry) -> None:
        queued: _Queue = {}
        self._push(entry, queued)
        self._flush(queued)

    @staticmethod
    def _current(entry: Entry, version: int, kind: int) -> bool:
        return entry.live and version == (entry.renew_version if kind == _RENEW else entry.deadline_version)

    def _any_current(self, kind: int, group: _Group) -> bool:
        """Whether a member of ``group`` is still current; drops the stale ones in front (scanned once)."""
        entries, versions = group
        for i, entry in enumerate(entries):
            if self._current(entry, versions[i], kind):
                if i:
                    del entries[:i], versions[:i]
                return True
        entries.clear()
        versions.clear()
        return False

    def add(self, lease: Lease, target: Any, requested_ttl: float, auto_renew: bool, max_hold: float | None) -> None:
        old = self._entries.pop(id(lease), None)  # re-added (a new grant for the same object): the old entry is stale
        if old is not None:
            old.live = False
        self._incoming[id(lease)] = (lease, target, requested_ttl, auto_renew, max_hold)

    def remove(self, lease: Lease) -> None:
        if self._incoming.pop(id(lease), None) is None:
            entry = self._entries.pop(id(lease), None)
            if entry is not None:
                entry.live = False  # its memberships turn stale

    def retune(self, lease: Lease, requested_ttl: float | None) -> None:
        """A direct ``renew`` changed the lease (or may have): reschedule it, renewing at ``requested_ttl`` on.

        The deadline watch moves with the lease (a shorter ttl must be watched at its own, earlier deadline)
        and the next renewal is due a third of the new ttl after it was sent.
        """
        waiting = self._incoming.get(id(lease))
        if waiting is not None:
            if requested_ttl is not None:
                self._incoming[id(lease)] = (lease, waiting[1], requested_ttl, waiting[3], waiting[4])
            return
        entry = self._entries.get(id(lease))
        if entry is None:
            return
        if requested_ttl is not None:
            entry.requested_ttl = requested_ttl
            entry.request = None
        entry.next_renew = renew_due(lease)
        self._reschedule(entry)  # while a batch is in flight only the deadline is queued; apply() queues the renewal

    def take_due(self, now: float) -> tuple[dict[Any, list[Entry]], list[Entry]]:
        """Mark due entries in flight and return them by target; also the entries past their deadline."""
        if self._incoming:
            self._admit()
        batches: dict[Any, list[Entry]] = {}
        expired: list[Entry] = []
        watch: _Queue = {}
        heap, current = self._heap, self._current
        while heap:
            at, _, kind, window, group = heap[0]
            if not self._any_current(kind, group):
                heapq.heappop(heap)
                continue
            if at > now + window:
                break
            heapq.heappop(heap)
            for entry, version in zip(*group, strict=True):
                if not current(entry, version, kind):
                    continue
                lease = entry.lease
                if lease.state in (LeaseState.LOST, LeaseState.RELEASED):
                    expired.append(entry)  # mark_lost is idempotent: already-fired leases are skipped there
                    del self._entries[id(lease)]
                    entry.live = False
                    continue
                if kind == _DEADLINE:
                    # Not lost after all: renewed since this watch was queued. Watch the deadline it has now.
                    entry.deadline_version += 1
                    entry.deadline_at = _join(watch, _DEADLINE, lease.expires_at, entry, entry.deadline_version)
                    continue
                if entry.target in self._busy and entry.target not in batches:
                    # Its deadline stays watched; the batch's completion re-queues the renewal (apply()).
                    self._parked.setdefault(entry.target, []).append(entry)
                    continue
                # The renewal membership is spent; the deadline stays watched while the batch is in flight.
                entry.in_flight = True
                entry.ticket = lease.renewal_started(now, entry.requested_ttl)
                batch = batches.get(entry.target)
                if batch is None:
                    batch = batches[entry.target] = []
                batch.append(entry)
        self._flush(watch)  # each later than now (the lease is not lost), so nothing is missed by queueing late
        self._busy.update(batches)
        return batches, expired

    def next_wakeup(self) -> float | None:
        """The next instant something is due: a deadline, or a renewal on a backend with no batch in flight.

        Renewals waiting for a busy backend are parked, not in the heap: the batch's completion wakes the
        scheduler, and counting them would make it spin while a slow batch runs.
        """
        if self._incoming:
            self._admit()
        heap = self._heap
        while heap and not self._any_current(heap[0][2], heap[0][4]):
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def apply(self, batch: Sequence[Entry], results: Sequence[Grant | BaseException | None]) -> None:
        """Record a batch's outcome: extend, lose, or schedule a retry."""
        now = self.clock()
        failures: list[tuple[Entry, BaseException]] = []
        renewed: dict[Any, int] = {}
        queued: _Queue = {}
        targets = {entry.target for entry in batch}
        self._busy -= targets
        for target in targets:
            for parked in self._parked.pop(target, []):
                if parked.live:
                    parked.renew_version += 1
                    _join(queued, _RENEW, now, parked, parked.renew_version)
        for entry, result in zip(batch, results, strict=True):
            entry.in_flight = False
            if not entry.live:
                _settle(entry, result)  # released while the batch was in flight: only the lease's note is left
                continue
            outcome = self._apply_one(entry, result, now)
            if outcome is True:
                renewed[entry.target] = renewed.get(entry.target, 0) + 1
            elif outcome is not False:
                failures.append((entry, outcome))
            self._push(entry, queued)
        self._flush(queued)
        for target, count in renewed.items():
            target.stats.count("renewals", count)  # once per batch: the counter's lock is not free
        if failures:
            first, error = failures[0]
            # One line per batch (a dead connection fails thousands of renewals at once), and at WARNING at most
            # once per FAILURE_LOG_INTERVAL per backend: retries come every tenth of a ttl, so a suspended
            # session or a dead server would otherwise write dozens of lines a second. Losses are still logged
            # one by one, as they happen.
            target = first.target
            quiet = now - self._warned.get(target, -math.inf) < FAILURE_LOG_INTERVAL
            if not quiet:
                self._warned[target] = now
            log.log(
                logging.DEBUG if quiet else logging.WARNING,
                "lockkit: renewing %d lock(s) on backend %r failed (%r: %s); retrying until their deadlines",
                len(failures),
                getattr(first.target, "name", "?"),
                first.lease.name,
                error,
            )

    def _apply_one(self, entry: Entry, result: Grant | BaseException | None, now: float) -> bool | BaseException:
        """True: renewed (the caller counts it); False: over or lost (the lease reports it); else the error,
        retried until the deadline."""
        lease = entry.lease
        # Losses are counted by the lease's backend as it becomes LOST (Backend.track), not here.
        if isinstance(result, Grant):
            # The common case without a state check of its own: extend refuses a lease that is released, lost
            # or past its deadline, and such a lease is reported by its deadline watch (or was already).
            ticket, entry.ticket = entry.ticket, None
            if lease.extend(result.sent_at, result.ttl, ticket):
                entry.next_renew = renew_due(lease)
                return True
            return False
        if lease.state in (LeaseState.LOST, LeaseState.RELEASED):
            return False
        ticket, entry.ticket = entry.ticket, None
        if result is None:  # an answer, not a failure: the token is gone (a loss)
            if ticket is not None:
                lease.renewal_refused(ticket)
            lease.mark_lost("the server no longer holds our token (expired, evicted or taken)")
            return False
        entry.target.stats.count("renewal_failures")  # an error: retried until the deadline
        if ticket is not None:
            lease.renewal_unknown(ticket)  # it may have landed: never trust more than it would have left
        entry.next_renew = now + min(MAX_RETRY_DELAY, lease.ttl * RETRY_FRACTION)
        return result

    def expire(self, entries: Sequence[Entry]) -> list[Entry]:
        """Fire ``on_lost`` for leases whose deadline passed (their ``state`` already reads LOST).

        Returns the entries whose lock the server would otherwise keep: on a backend whose locks live with the
        client's session (etcd's shared lease, a ZooKeeper session), a lease that ends at its own deadline
        (max_hold, auto_renew off, no renewal in time) is still held there for as long as the client's other
        activity keeps the session alive. The scheduler releases those (owner-checked) off its own thread.
        """
        to_release: list[Entry] = []
        for entry in entries:
            if not entry.auto_renew:
                reason = "its TTL passed (auto_renew is off)"
            elif entry.stop_renewing_at is not None and self.clock() >= entry.stop_renewing_at:
                reason = "max_hold reached: auto-renewal stopped and the TTL passed"
            else:
                reason = "no renewal succeeded before the lease's deadline"
            if entry.lease.mark_lost(reason) and _session_bound(entry.target):
                to_release.append(entry)
        return to_release

    def entries(self) -> list[Entry]:
        if self._incoming:
            self._admit()
        return list(self._entries.values())


def _join(queued: _Queue, kind: int, at: float, entry: Entry, version: int) -> float:
    """Queue ``entry`` (at ``version``) due at ``at``: in the open group of ``kind`` if that is due within
    GROUP_FRACTION of the entry's TTL, else in a new one. Returns when the group is due (never after ``at``)."""
    groups = queued.get(kind)
    if groups is None:
        groups = queued[kind] = []
    if groups:
        due, group = groups[-1]
        if abs(at - due[0]) < entry.lease.ttl * GROUP_FRACTION:
            # The group is due at its earliest member's time. A member's deadline_at, noted when it joined, may
            # then be later than the group's: safe, it only ever makes _push watch a deadline again sooner.
            due[0] = min(due[0], at)
            group[0].append(entry)
            group[1].append(version)
            return due[0]
    groups.append(([at], ([entry], [version])))
    return at


def _session_bound(target: Any) -> bool:
    try:
        return bool(target.guarantees.lifetime == "session")
    except Exception:  # a closed backend: its session is gone, and with it the lock
        return False


def _report_release(lease: Lease, outcome: bool | BaseException) -> None:
    # The loss itself was already reported (on_lost, a warning); a failed clean-up means the server keeps the lock
    # until the client's session ends, which the user must hear of too.
    if isinstance(outcome, BaseException):
        log.warning(
            "lockkit: could not free %r on the server after its lease ended (%s); it stays held until this "
            "client's session ends: close the locker, or release it with lockkit release --force",
            lease.name,
            outcome,
        )


def _settle(entry: Entry, result: Grant | BaseException | None) -> None:
    ticket, entry.ticket = entry.ticket, None
    if ticket is None:
        return
    if isinstance(result, Grant):
        entry.lease.extend(result.sent_at, result.ttl, ticket)
    elif result is None:
        entry.lease.renewal_refused(ticket)
    else:
        entry.lease.renewal_unknown(ticket)


def _requests(batch: Sequence[Entry]) -> list[RenewRequest]:
    return [e.renew_request() for e in batch]


class RenewalScheduler:
    """The process-wide renewal thread for blocking drivers."""

    def __init__(self, clock: Clock) -> None:
        self.book = RenewalBook(clock)
        # add/remove (every acquire and release) take the mutex itself: entering the Condition is a
        # Python-level call, the lock's own context manager is not. Reentrant, as the Condition's default is:
        # applying a batch's results under it can run a user's on_lost, which may release or acquire a lock.
        self._mutex = threading.RLock()
        self._cond = threading.Condition(self._mutex)
        self._thread: threading.Thread | None = None
        self._planned: float | None = None  # when the thread will wake next (None: not before notified)
        # Not a concurrent.futures executor: it refuses work once the main thread has returned, while other
        # threads may still hold locks (lockkit/workers.py, C-13)
        self._pool = Workers(4, "lockkit-renew")

    def add(self, lease: Lease, target: Any, requested_ttl: float, auto_renew: bool, max_hold: float | None) -> None:
        with self._mutex:
            self.book.add(lease, target, requested_ttl, auto_renew, max_hold)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="lockkit-renewal", daemon=True)
                self._thread.start()
            # Wake the thread only if this lease needs it sooner than it already plans to wake:
            # waking it on every acquire would cost a context switch and a scan per lock operation.
            due = min(lease.expires_at, lease.acquired_at + lease.ttl * RENEW_FRACTION)
            if self._planned is None or due < self._planned:
                self._cond.notify()

    def remove(self, lease: Lease) -> None:
        with self._mutex:
            self.book.remove(lease)

    def retune(self, lease: Lease, requested_ttl: float | None) -> None:
        """After a direct renew: the lease's deadline and ttl may have moved (see :meth:`RenewalBook.retune`)."""
        with self._cond:
            self.book.retune(lease, requested_ttl)
            self._cond.notify()

    def wake(self) -> None:
        with self._cond:
            self._cond.notify()

    def _run(self) -> None:
        while True:
            try:
                self._turn()
            except BaseException:  # it renews every lock of the process: it must outlive any one failure, even a
                # SystemExit raised by a user's on_lost run here (it would end only this thread, never the process)
                log.exception("lockkit: the renewal thread's turn failed; going on")
                time.sleep(0.01)

    def _turn(self) -> None:
        with self._cond:
            batches, expired = self.book.take_due(self.book.clock())
            if not batches and not expired:
                # With nothing due, tick once a second anyway: an acquire then needs to wake this thread
                # only if its lease is due sooner, which spares a context switch on almost every acquire.
                wake_at = self.book.next_wakeup()
                now = self.book.clock()
                wake_at = now + IDLE_TICK if wake_at is None else min(wake_at, now + IDLE_TICK)
                self._planned = wake_at
                self._cond.wait(max(0.001, wake_at - now))
                self._planned = None
                return
        for target, batch in batches.items():  # first: an on_lost run below must not cost them their turn
            self._pool.submit(self._renew_batch, target, batch)
        for entry in expired:  # one at a time: what one lease's on_lost raises must not skip the others'
            try:
                ended = self.book.expire([entry])
            except BaseException:  # SystemExit too: it would end this thread, which renews every lock
                log.exception("lockkit: an on_lost callback of %r raised", entry.lease.name)
                continue
            for done in ended:
                self._pool.submit(self._release_ended, done.target, done.lease)

    def _release_ended(self, target: Any, lease: Lease) -> None:
        """Free a session-bound lock whose lease ended (see :meth:`RenewalBook.expire`); owner-checked."""
        try:
            outcome: bool | BaseException = target.driver.release(lease.name, lease.token)
        except Exception as exc:  # best effort: the session's end frees it otherwise
            outcome = exc
        _report_release(lease, outcome)

    def _renew_batch(self, target: Any, batch: list[Entry]) -> None:
        try:
            results: Sequence[Grant | BaseException | None] = target.driver.renew_many(_requests(batch))
        except Exception as exc:  # the whole batch failed (connection): retried until each deadline
            results = [exc] * len(batch)
        with self._cond:
            self.book.apply(batch, results)
            self._cond.notify()


class AsyncRenewalScheduler:
    """The renewal task of one event loop, for async drivers."""

    def __init__(self, clock: Clock) -> None:
        self.book = RenewalBook(clock)
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._batches: set[asyncio.Task[None]] = set()
        self._planned: float | None = None  # when the task will wake next (None: when woken)

    def add(self, lease: Lease, target: Any, requested_ttl: float, auto_renew: bool, max_hold: float | None) -> None:
        self.book.add(lease, target, requested_ttl, auto_renew, max_hold)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="lockkit-renewal")
        # As in the thread scheduler: wake the task only for a lease due before it plans to look anyway
        # (waking it on every acquire cost a task switch and a book scan per lock operation).
        due = min(lease.expires_at, lease.acquired_at + lease.ttl * RENEW_FRACTION)
        if self._planned is None or due < self._planned:
            self._wakeup.set()

    def remove(self, lease: Lease) -> None:
        self.book.remove(lease)

    def retune(self, lease: Lease, requested_ttl: float | None) -> None:
        """After a direct renew: the lease's deadline and ttl may have moved (see :meth:`RenewalBook.retune`)."""
        self.book.retune(lease, requested_ttl)
        self._wakeup.set()

    async def _run(self) -> None:
        # Not ending at the first empty look: most locks are released before the task first runs, and a
        # task per acquire cost more than the lock operation's own Python.
        idle_since_last_look = False
        while True:
            batches, expired = self.book.take_due(self.book.clock())
            for entry in self.book.expire(expired):
                task = asyncio.get_running_loop().create_task(self._release_ended(entry.target, entry.lease))
                self._batches.add(task)
                task.add_done_callback(self._batches.discard)
            for target, batch in batches.items():
                task = asyncio.get_running_loop().create_task(self._renew_batch(target, batch))
                self._batches.add(task)
                task.add_done_callback(self._batches.discard)
            if batches or expired:
                continue
            wake_at = self.book.next_wakeup()
            if wake_at is None and not self._batches and idle_since_last_look:
                self._task = None  # idle for a whole tick: end; the next add starts a new task
                return
            idle_since_last_look = wake_at is None and not self._batches
            now = self.book.clock()
            # Look at least once a second, so that an add needs to wake the task only for a lease due sooner.
            wake_at = now + IDLE_TICK if wake_at is None else min(wake_at, now + IDLE_TICK)
            self._planned = wake_at
            self._wakeup.clear()
            try:
                await wait_event(self._wakeup, max(0.001, wake_at - now))
            finally:
                self._planned = None

    async def _release_ended(self, target: Any, lease: Lease) -> None:
        """As :meth:`RenewalScheduler._release_ended`, awaited."""
        try:
            outcome: bool | BaseException = await target.driver.release(lease.name, lease.token)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            outcome = exc
        _report_release(lease, outcome)

    async def _renew_batch(self, target: Any, batch: list[Entry]) -> None:
        try:
            results: Sequence[Grant | BaseException | None] = await target.driver.renew_many(_requests(batch))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            results = [exc] * len(batch)
        self.book.apply(batch, results)
        self._wakeup.set()


_process_schedulers: dict[tuple[int, Clock], RenewalScheduler] = {}
_process_guard = threading.Lock()
_loop_schedulers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Clock, AsyncRenewalScheduler]] = (
    weakref.WeakKeyDictionary()
)


def scheduler(clock: Clock) -> RenewalScheduler:
    """The one renewal thread of this process (a new one after ``fork``, which copies no threads)."""
    # Keyed by clock too, so that a test's fake clock never drives real leases' deadlines.
    last = _last_scheduler
    # The pid kept since start-up or the last fork (lease.process_id), not os.getpid(): a system call per acquire
    if last is not None and last[1] is clock and last[0] == process_id():
        return last[2]  # the hot path: every acquire and release asks, almost always for the same one
    return _find_scheduler(clock)


_last_scheduler: tuple[int, Clock, RenewalScheduler] | None = None


def _find_scheduler(clock: Clock) -> RenewalScheduler:
    global _last_scheduler
    key = (process_id(), clock)
    with _process_guard:
        found = _process_schedulers.get(key)
        if found is None:
            found = _process_schedulers[key] = RenewalScheduler(clock)
        _last_scheduler = (key[0], clock, found)
        return found


def async_scheduler(clock: Clock) -> AsyncRenewalScheduler:
    """The one renewal task of the running event loop."""
    loop = asyncio.get_running_loop()
    last = _last_async
    # The hot path, as scheduler()'s: the same loop and clock as last time. Weak references, so that the memo
    # keeps neither a closed loop nor its scheduler alive (the WeakKeyDictionary's lookup cost 0.3 µs per acquire).
    if last is not None and last[0]() is loop and last[1] is clock:
        found = last[2]()
        if found is not None:
            return found
    return _find_async_scheduler(loop, clock)


_last_async: tuple[weakref.ref[asyncio.AbstractEventLoop], Clock, weakref.ref[AsyncRenewalScheduler]] | None = None


def _find_async_scheduler(loop: asyncio.AbstractEventLoop, clock: Clock) -> AsyncRenewalScheduler:
    global _last_async
    per_loop = _loop_schedulers.setdefault(loop, {})
    found = per_loop.get(clock)
    if found is None:
        found = per_loop[clock] = AsyncRenewalScheduler(clock)
    _last_async = (weakref.ref(loop), clock, weakref.ref(found))
    return found
