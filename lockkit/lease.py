"""The Lease: what a holder knows about its hold on a lock, on a monotonic clock.

A lease moves through one small state machine::

    HELD ──(renewal fails / server says gone / deadline passes)──► LOST
    HELD ──(session suspended)──► UNCERTAIN ──(reconnected, still ours)──► HELD
    HELD / UNCERTAIN ──(released)──► RELEASED

``valid`` is true only while the state is HELD, the monotonic clock is before
:attr:`Lease.expires_at`, and we are in the process that acquired it (a forked
child never inherits a lock). Checking validity never touches the network, so
:meth:`Lease.ensure_valid` answers even when the server is unreachable.

The object is live: auto-renewal moves ``expires_at`` forward, and loss is seen
by every holder of the reference (the ``with`` block's ``lease`` included).

A renewal *replaces* the deadline with what the server now has (send time + the
renewal's ttl − drift), so ``renew(ttl=1)`` on a lease granted for 30 s leaves
one second of validity, not 29. Renewals that overlap in flight (the scheduler's
batch and a direct ``renew``, or two threads) may reach the server in either
order, so each one's result is capped by the lowest deadline any overlapping
renewal could have set; a renewal whose outcome is unknown (it raised, or its
caller was cancelled) caps the deadline the same way, since it may have landed.
"""

from __future__ import annotations

import enum
import hashlib
import logging
import math
import os
import threading
from collections.abc import Callable

from .errors import ConfigError, LockLost
from .timing import DRIFT_FACTOR, DRIFT_FLOOR, Clock, lease_deadline

__all__ = ["FOREIGN_HINT", "Lease", "LeaseState", "is_lockkit_hint", "process_id", "token_hint"]

log = logging.getLogger("lockkit")

_pid = os.getpid()
"""This process's id, refreshed in a forked child (below): ``os.getpid()`` is a system call (0.2-0.9 µs on
this project's VMs) and it was asked three times per acquire+release (issue 17)."""


def _forked() -> None:
    global _pid
    _pid = os.getpid()


if hasattr(os, "register_at_fork"):  # not on Windows, where there is no fork
    os.register_at_fork(after_in_child=_forked)


def process_id() -> int:
    """``os.getpid()``, read from the value kept since start-up or the last ``fork`` (no system call)."""
    return _pid


FOREIGN_HINT = "other:"
"""Begins the hint of a token lockkit could not have made: the holder is another client (``lockkit status``)."""

_HEX = "0123456789abcdef"


def token_hint(token: str) -> str:
    """A short, non-reversible tag for a token (tokens are capabilities: never log them).

    Eight hex digits of its hash; marked with :data:`FOREIGN_HINT` when the token is not of lockkit's form (32
    lower-case hex characters, ``new_token``): a value another client wrote where a holder's token goes, so
    that ``status`` can say the holder is not a lockkit client rather than show it as a lockkit lease.
    """
    digest = hashlib.sha256(token.encode()).hexdigest()[:8]
    return digest if len(token) == 32 and not token.strip(_HEX) else FOREIGN_HINT + digest


def is_lockkit_hint(hint: str | None) -> bool:
    """Whether a :attr:`HolderInfo.token_hint <lockkit.driver.HolderInfo.token_hint>` is a lockkit lease's.

    No hint (an empty value, as etcdctl's) and a :data:`FOREIGN_HINT` are another client's. Where a backend
    keeps only a hash of the holder's data (ZooKeeper's nodes), another client's holder cannot be told apart.
    """
    return hint is not None and not hint.startswith(FOREIGN_HINT)


class LeaseState(enum.Enum):
    HELD = "held"
    UNCERTAIN = "uncertain"
    LOST = "lost"
    RELEASED = "released"


_HELD = LeaseState.HELD

LostCallback = Callable[["Lease"], None]


class RenewalTicket:
    """One renewal in flight: the lowest deadline it, or any renewal overlapping it, could leave behind."""

    __slots__ = ("cap", "cap_ttl", "floor", "ttl")

    def __init__(self, floor: float, ttl: float) -> None:
        self.floor = floor  # lease_deadline(send time, requested ttl): what it sets at the least, if it lands
        self.ttl = ttl
        # The lowest floor of the renewals that overlapped this one. Not its own: its own reply says what the
        # server really gave (a ZooKeeper renewal reports the session timeout, whatever ttl was asked for).
        self.cap = math.inf
        self.cap_ttl = ttl

    def overlaps(self, other: RenewalTicket) -> None:
        if other.floor < self.cap:
            self.cap, self.cap_ttl = other.floor, other.ttl


class Lease:
    """One acquisition of one lock."""

    __slots__ = (
        "__weakref__", "_callbacks", "_clock", "_expires_at", "_fencing_token", "_in_flight", "_mutex", "_pid",
        "_reason", "_state", "_ttl", "acquired_at", "backend", "kind", "name", "token",
    )  # fmt: skip

    def __init__(
        self,
        *,
        name: str,
        token: str,
        fencing_token: int | None,
        ttl: float,
        sent_at: float,
        clock: Clock,
        backend: str = "default",
        on_lost: list[LostCallback] | None = None,
        kind: str = "lock",
    ) -> None:
        self.name = name
        self.kind = kind
        """What it holds, for messages: ``lock``, ``semaphore`` (a permit) or ``rwlock`` (one side)."""
        self.token = token
        self._fencing_token = fencing_token
        self.backend = backend
        self.acquired_at = sent_at
        self._clock = clock
        self._ttl = ttl
        # lease_deadline(sent_at, ttl), inline: one call less per acquire (tests/test_front_lean.py pins them equal)
        self._expires_at = sent_at + ttl - (ttl * DRIFT_FACTOR + DRIFT_FLOOR)
        self._state = _HELD
        self._reason: str | None = None
        self._callbacks: list[LostCallback] = [] if on_lost is None else list(on_lost)
        self._pid = _pid
        self._mutex = threading.Lock()
        self._in_flight: list[RenewalTicket] | None = None  # made by the first renewal: most leases never renew

    # -- what holders read -------------------------------------------------------------

    @property
    def ttl(self) -> float:
        """The effective TTL of the last grant or renewal, after the backend's rounding."""
        return self._ttl

    @property
    def expires_at(self) -> float:
        """Monotonic instant after which the lease must not be trusted (send time + ttl − drift)."""
        return self._expires_at

    @property
    def state(self) -> LeaseState:
        live = self._state in (LeaseState.HELD, LeaseState.UNCERTAIN)
        if live and self._clock() >= self._expires_at:
            return LeaseState.LOST
        return self._state

    @property
    def lost_reason(self) -> str | None:
        if self._reason is None and self.state is LeaseState.LOST:
            return "the lease's TTL passed without a successful renewal"
        return self._reason

    @property
    def valid(self) -> bool:
        return self._state is _HELD and self._clock() < self._expires_at and self._pid == _pid

    def ours(self) -> bool:
        """Whether this process acquired the lease (a forked child never inherits a lock)."""
        return self._pid == _pid

    def ttl_used(self, now: float) -> float | None:
        """The share of the TTL gone at ``now`` since the grant or last renewal (``None`` for a TTL of 0): near 1,
        one more pause (GC, swap, a slow network) and another holder gets the lock while this one still runs
        (``lockkit_ttl_used_ratio``, observed at release)."""
        ttl = self._ttl
        return 1.0 - (self._expires_at - now) / ttl if ttl > 0 else None

    def remaining(self) -> float:
        """Seconds of validity left (0 once invalid). Never uses the wall clock."""
        if not self.valid:
            return 0.0
        return max(0.0, self._expires_at - self._clock())

    def ensure_valid(self) -> None:
        """Raise :class:`LockLost` unless the lease is valid now. No network I/O."""
        if self.valid:
            return
        if _pid != self._pid:
            raise LockLost(
                f"{self.kind} {self.name!r} was acquired by process {self._pid}, not this one; "
                "a forked child must acquire its own locks"
            )
        if self._state is LeaseState.RELEASED:
            raise LockLost(f"{self.kind} {self.name!r} was released; acquire it again before relying on it")
        if self._state is LeaseState.UNCERTAIN:
            raise LockLost(f"{self.kind} {self.name!r} is uncertain: {self._reason}; do not act until it is restored")
        raise LockLost(
            f"{self.kind} {self.name!r} was lost: {self.lost_reason}; stop the work that relied on it and acquire "
            "it again"
        )

    def add_lost_callback(self, callback: LostCallback) -> None:
        """Call ``callback(lease)`` once when the lease is lost (at once if it already is)."""
        with self._mutex:
            if self._state is not LeaseState.LOST:
                self._callbacks.append(callback)
                return
        self._call(callback)

    @property
    def fencing_token(self) -> int:
        """The fencing token: strictly increasing per name on backends with fencing (``Guarantees.fencing``).

        On a backend that hands out none (Redlock), reading it raises :class:`~lockkit.ConfigError` rather than
        return a number: a constant would pass every ``token >= last`` check of a fenced store, a lock that
        looks safe and is not. Check :attr:`fenced` first where either kind of backend may be configured.
        """
        token = self._fencing_token
        if token is None:
            raise ConfigError(
                f"lock {self.name!r} is on backend {self.backend!r}, whose driver hands out no fencing tokens: a "
                "number here would pass every fencing check. Route the call sites that fence to a backend with "
                'fencing (require = ["fencing"] on the route in lockkit.toml), or test lease.fenced first'
            )
        return token

    @property
    def fenced(self) -> bool:
        """Whether this lease carries a fencing token (its backend declares fencing)."""
        return self._fencing_token is not None

    @property
    def fence(self) -> int | None:
        """The fencing token, or ``None`` on a backend without fencing (for code that handles both)."""
        return self._fencing_token

    @property
    def owner_pid(self) -> int:
        return self._pid

    def __repr__(self) -> str:
        return (
            f"Lease(name={self.name!r}, backend={self.backend!r}, token=<{token_hint(self.token)}…>, "
            f"fencing_token={self._fencing_token}, ttl={self._ttl:g}, state={self.state.value}, "
            f"remaining={self.remaining():.3f})"
        )

    # -- what the front end and the renewal scheduler call ------------------------------

    def renewal_started(self, sent_at: float, ttl: float) -> RenewalTicket:
        """Note a renewal about to be sent at (or after) ``sent_at`` asking for ``ttl``; pass the ticket on."""
        ticket = RenewalTicket(lease_deadline(sent_at, ttl), ttl)
        with self._mutex:
            in_flight = self._in_flight
            if in_flight is None:
                in_flight = self._in_flight = []
            for other in in_flight:
                other.overlaps(ticket)
                ticket.overlaps(other)
            in_flight.append(ticket)
        return ticket

    def _settle(self, ticket: RenewalTicket | None) -> None:
        in_flight = self._in_flight
        if ticket is not None and in_flight and ticket in in_flight:
            in_flight.remove(ticket)

    def extend(self, sent_at: float, ttl: float, ticket: RenewalTicket | None = None) -> bool:
        """Record a successful renewal that was sent at ``sent_at``. False if the lease is already over.

        The new deadline replaces the old one: the server now expires the lock ``ttl`` after it applied this
        renewal, whatever the earlier ttl was. ``ticket`` (from :meth:`renewal_started`) caps it by every
        renewal that overlapped this one in flight, because the server may have applied those last.
        """
        with self._mutex:
            self._settle(ticket)
            if self._state not in (LeaseState.HELD, LeaseState.UNCERTAIN):
                return False
            if self._clock() >= self._expires_at:
                return False  # a renewal that comes back after the deadline must not revive the lease
            deadline = lease_deadline(sent_at, ttl)
            if ticket is not None and ticket.cap < deadline:
                deadline, ttl = ticket.cap, ticket.cap_ttl
            self._ttl = ttl
            self._expires_at = deadline
            return True

    def renewal_unknown(self, ticket: RenewalTicket) -> None:
        """A renewal failed or was abandoned with its outcome unknown: it may have landed, so cap by it."""
        floor, ttl = (ticket.floor, ticket.ttl) if ticket.floor <= ticket.cap else (ticket.cap, ticket.cap_ttl)
        with self._mutex:
            self._settle(ticket)
            if floor < self._expires_at:
                self._expires_at = floor
                self._ttl = min(self._ttl, ttl)

    def renewal_refused(self, ticket: RenewalTicket) -> None:
        """The server answered that our token is gone: the ticket is settled (the lease is lost anyway)."""
        with self._mutex:
            self._settle(ticket)

    def mark_uncertain(self, reason: str) -> None:
        with self._mutex:
            if self._state is LeaseState.HELD:
                self._state = LeaseState.UNCERTAIN
                self._reason = reason

    def mark_restored(self) -> None:
        with self._mutex:
            if self._state is LeaseState.UNCERTAIN:
                self._state = LeaseState.HELD
                self._reason = None

    def mark_released(self) -> None:
        with self._mutex:
            if self._state in (LeaseState.HELD, LeaseState.UNCERTAIN):
                self._state = LeaseState.RELEASED

    def mark_lost(self, reason: str, *, warn: bool = True) -> bool:
        """Move to LOST and fire the callbacks once. False if it was already over.

        ``warn=False`` when the caller reports the loss itself, once for many leases (a closing locker).
        """
        with self._mutex:
            if self._state in (LeaseState.LOST, LeaseState.RELEASED):
                return False
            self._state = LeaseState.LOST
            self._reason = reason
            callbacks, self._callbacks = self._callbacks, []
        if warn:
            log.warning("lockkit: %s %r lost (%s)", self.kind, self.name, reason)
        for callback in callbacks:
            self._call(callback)
        return True

    def _call(self, callback: LostCallback) -> None:
        try:
            callback(self)
        except Exception:  # a user callback must not stop the scheduler; its failure is still shown
            log.exception("lockkit: on_lost callback for %r raised", self.name)
