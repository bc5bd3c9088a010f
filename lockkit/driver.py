"""The driver contract: a small protocol over plain values.

A driver talks to one backend. It knows nothing of :class:`~lockkit.Lease`,
renewal scheduling, statistics or timeouts-as-errors; the front end
(:mod:`lockkit.lock`) owns those. A driver receives a validated name, a token
(32 hex characters, 128 random bits, unique per acquisition), a validated TTL in
seconds and an absolute deadline on :attr:`DriverContext.clock`, and returns
*facts*: a :class:`Grant` or ``None``. It raises only for real failures, and
only :class:`~lockkit.errors.LockError` subclasses (``BackendUnavailable`` for
I/O), translating its client's exceptions with ``raise … from exc``.

Rules every driver keeps (the conformance suite in :mod:`lockkit.testing`
checks them):

* ``acquire`` is one atomic server operation; it never leaves a key without
  expiry and, when it gives up (deadline, cancel), removes anything it queued.
* ``renew`` and ``release`` act only if the server still holds *our* token.
* Waiting is woken by the server (pub/sub, watch, a datagram), with at most one
  re-check timed at the holder's expiry: no fixed-interval polling.
* Fencing tokens strictly increase per name for as long as the backend keeps
  its data (each driver documents when it cannot).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Literal, NamedTuple, Protocol, runtime_checkable

from .timing import Clock, default_clock

__all__ = [
    "AsyncDriver",
    # semaphores and reader-writer locks (issue 18)
    "AsyncPermitDriver",
    "Cancel",
    "Driver",
    "DriverContext",
    "Grant",
    "Guarantees",
    "HolderInfo",
    "LeaseEvents",
    "Offer",
    "PermitDriver",
    "PermitInfo",
    "PermitMode",
    "Presence",
    "RenewRequest",
    "one_renewal",
    "renew_each",
]

Scope = Literal["process", "host", "single-node", "majority", "consensus"]
Fencing = Literal["strict", "best-effort", "none"]
Lifetime = Literal["ttl", "session"]
Offered = Literal["yes", "not yet", "never"]


@dataclass(frozen=True)
class Offer:
    """Whether a driver offers a primitive beyond the mutex (semaphores, reader-writer locks), and why not.

    ``"not yet"``: it could, nobody has written it; ``"never"``: the backend cannot keep the contract.
    """

    offered: Offered
    why: str = ""

    def __bool__(self) -> bool:
        return self.offered == "yes"


NOT_YET = Offer("not yet", "this driver has no permit operations (lockkit.driver.PermitDriver) yet")


@dataclass(frozen=True)
class Guarantees:
    """What a driver promises, as data: it feeds the docs' table and the conformance suite."""

    scope: Scope
    """Who agrees on the holder: one process, one host, one server, a majority of masters, a consensus group."""
    fifo: bool
    """Waiters are served in arrival order."""
    fencing: Fencing
    """``strict``: fencing tokens strictly increase per name while the backend keeps its data."""
    survives_failover: bool
    """A held lock survives the loss of one server."""
    lifetime: Lifetime
    """``ttl``: the lock dies when its TTL passes unrenewed; ``session``: when the client session dies."""
    server_wakeup: bool = True
    """Waiters are woken by the backend rather than by polling."""
    note: str = ""
    semaphores: Offer = NOT_YET
    """Semaphores and reader-writer locks (:class:`PermitDriver`): one capability, offered or not, and why."""


class Grant(NamedTuple):
    """The server's word that a lock is ours.

    A named tuple, not a frozen dataclass: immutable all the same, and made in under half the time (one per
    acquire and per renewal, on the hot path; issue 17). Make a changed copy with ``grant._replace(...)``.
    """

    fencing_token: int
    ttl: float
    """The effective TTL in seconds, after the backend's rounding (etcd whole seconds, ZooKeeper session)."""
    sent_at: float
    """``ctx.clock()`` read just *before* the request that won was sent: validity counts from here. (A lock
    granted by another client's release, as Redis hand-offs are, counts from before the waiter's first
    request: the grant can only have come after it.)"""


@dataclass(frozen=True)
class RenewRequest:
    name: str
    token: str
    ttl: float


@dataclass(frozen=True)
class HolderInfo:
    """What the server says about a lock, for ``lockkit status`` and ``Lock.locked()``."""

    held: bool
    token_hint: str | None = None
    """A short hash prefix of the holder's token, never the token itself (:func:`lockkit.lease.token_hint`: it
    begins ``other:`` for a value that is not a lockkit token; ``None`` when there is none to hash)."""
    fencing_token: int | None = None
    ttl_left: float | None = None
    waiters: int | None = None


class LeaseEvents(Protocol):
    """How a driver with session-bound leases (ZooKeeper, etcd) reports state changes it learns of."""

    def lost(self, token: str, reason: str) -> None: ...

    def uncertain(self, token: str, reason: str) -> None: ...

    def restored(self, token: str) -> None: ...


class _NoEvents:
    def lost(self, token: str, reason: str) -> None:
        pass

    def uncertain(self, token: str, reason: str) -> None:
        pass

    def restored(self, token: str) -> None:
        pass


@dataclass
class DriverContext:
    """What the front end hands a driver when it opens it."""

    clock: Clock = default_clock
    events: LeaseEvents = field(default_factory=_NoEvents)


class Cancel:
    """A cancellation signal for a blocking ``acquire`` running in a worker thread.

    The async face sets it when the awaiting task is cancelled. A driver that
    waits registers a wake-up with :meth:`on_cancel` (notify a condition, send a
    datagram, set an event), checks :attr:`cancelled` after every wake-up, and
    then cleans up what it queued and returns ``None``.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cancelled = False
        self._hooks: list[Callable[[], None]] = []

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def on_cancel(self, hook: Callable[[], None]) -> Callable[[], None]:
        """Run ``hook`` on cancel (at once if already cancelled); returns a function that unregisters it."""
        with self._lock:
            if not self._cancelled:
                self._hooks.append(hook)

                def remove() -> None:
                    with self._lock:
                        if hook in self._hooks:
                            self._hooks.remove(hook)

                return remove
        hook()
        return lambda: None

    def cancel(self) -> None:
        with self._lock:
            if self._cancelled:
                return
            self._cancelled = True
            hooks, self._hooks = self._hooks, []
        for hook in hooks:
            hook()


@runtime_checkable
class Driver(Protocol):
    """A blocking driver. Every method may be called from any thread."""

    guarantees: ClassVar[Guarantees]

    def acquire(
        self, name: str, token: str, ttl: float, deadline: float | None, cancel: Cancel | None = None
    ) -> Grant | None:
        """Take the lock, waiting until ``deadline`` (``None``: forever; already past: one attempt).

        Returns ``None`` when the deadline passed or ``cancel`` fired, after removing
        anything it queued on the server.
        """
        ...

    def renew(self, name: str, token: str, ttl: float) -> Grant | None:
        """Extend our lock to ``ttl`` from now; ``None`` if the server no longer holds our token."""
        ...

    def renew_many(self, requests: Sequence[RenewRequest]) -> list[Grant | Exception | None]:
        """Renew several locks in one batch (one pipeline, one keepalive); results in order."""
        ...

    def release(self, name: str, token: str) -> bool:
        """Delete our lock and wake a waiter; ``False`` if the server no longer holds our token."""
        ...

    def holder(self, name: str) -> HolderInfo:
        """Who holds ``name`` now, as far as the server knows."""
        ...

    def force_release(self, name: str) -> bool:
        """Administrative: delete whoever's lock it is and wake a waiter. ``True`` if one was held."""
        ...

    def ping(self) -> None:
        """One round trip to the backend; raises ``BackendUnavailable`` if it is unreachable."""
        ...

    def close(self) -> None:
        """Release client resources (connections, sessions). Idempotent."""
        ...


@runtime_checkable
class AsyncDriver(Protocol):
    """The awaitable twin of :class:`Driver`; cancellation of ``acquire`` must clean up."""

    guarantees: ClassVar[Guarantees]

    async def acquire(
        self, name: str, token: str, ttl: float, deadline: float | None, cancel: Cancel | None = None
    ) -> Grant | None:
        """As :meth:`Driver.acquire`; cancelling the awaiting task does the same as firing ``cancel``."""
        ...

    async def renew(self, name: str, token: str, ttl: float) -> Grant | None: ...

    async def renew_many(self, requests: Sequence[RenewRequest]) -> list[Grant | Exception | None]: ...

    async def release(self, name: str, token: str) -> bool: ...

    async def holder(self, name: str) -> HolderInfo: ...

    async def force_release(self, name: str) -> bool: ...

    async def ping(self) -> None: ...

    async def close(self) -> None: ...


@runtime_checkable
class Presence(Protocol):
    """Optional driver capability: short-lived "who is alive" records, for ``migrate`` fleet safety.

    A record lives ``ttl`` seconds after its last ``announce`` (``None``: until withdrawn), counted by the
    backend (server time, a session, a lease), so that a crashed client disappears on its own.
    ``members`` returns only live records. Reads must be linearizable with announces: a client that
    announces and then reads is guaranteed to see every record announced before its own.
    """

    def announce(self, group: str, member: str, value: str, ttl: float | None) -> None: ...

    def withdraw(self, group: str, member: str) -> None: ...

    def members(self, group: str) -> dict[str, str]: ...


def one_renewal(results: Sequence[Grant | Exception | None]) -> Grant | None:
    """``renew`` written as a one-item ``renew_many``: its single result, raised if it is an error."""
    (result,) = results
    if isinstance(result, Exception):
        raise result
    return result


def renew_each(driver: Driver, requests: Sequence[RenewRequest]) -> list[Grant | Exception | None]:
    """A ``renew_many`` for drivers with no batch operation: one renew per request, errors kept per item."""
    results: list[Grant | Exception | None] = []
    for request in requests:
        try:
            results.append(driver.renew(request.name, request.token, request.ttl))
        except Exception as exc:  # kept per item: one failure must not hide the others' results
            results.append(exc)
    return results


# -- semaphores and reader-writer locks (issue 18) --------------------------------------------------------

PermitMode = Literal["permit", "read", "write"]
"""``permit``: one of ``limit`` shared slots (a semaphore); ``read``: a shared slot of a reader-writer lock (no
limit, but none while a writer holds or waits); ``write``: the whole name, alone, ahead of later readers."""


@dataclass(frozen=True)
class PermitInfo:
    """What the server says about a semaphore or reader-writer lock, for ``lockkit status``."""

    limit: int | None
    """The limit the holders use (0: a reader-writer lock), ``None`` if nobody holds or waits."""
    holders: int
    writer: bool
    """A writer holds it (reader-writer locks)."""
    waiting_writers: int
    fencing_token: int | None
    """The last fencing token handed out for the name where the backend keeps a counter (memory, file, the
    Redis schemes, postgresql); on etcd:// and zookeeper://, whose tokens are the holders' own revisions,
    the newest current holder's (``None`` when nobody holds)."""
    waiters: int | None = None
    """Waiters of every kind, where the backend can count them."""


class PermitDriver(Protocol):
    """Optional driver capability: counting permits, with the same rules as locks (see the module docstring).

    ``limit`` is the semaphore's size (0 for a reader-writer lock). A request whose limit differs from the one
    the live holders and waiters of ``name`` use raises :class:`~lockkit.errors.ConfigError`: the server's
    record carries the limit, so fleets that disagree are refused rather than silently mixed. Fencing tokens
    strictly increase per name over every grant of every mode. Permits live in their own key space: a lock and
    a semaphore of the same name are unrelated.

    A driver offers it by declaring ``Guarantees(semaphores=Offer("yes"))`` and a method
    ``permits(events: LeaseEvents | None) -> PermitDriver`` (an :class:`AsyncPermitDriver` on a native asyncio
    driver), called once per locker; a session-bound driver reports the losses of permit leases to ``events``.
    The shipped :class:`lockkit.testing.SemaphoreSuite` checks the rules (docs/semaphores.md).
    """

    def acquire_permit(
        self,
        name: str,
        token: str,
        ttl: float,
        deadline: float | None,
        limit: int,
        mode: PermitMode,
        cancel: Cancel | None = None,
    ) -> Grant | None: ...

    def renew_permits(self, requests: Sequence[RenewRequest]) -> list[Grant | Exception | None]: ...

    def release_permit(self, name: str, token: str) -> bool: ...

    def permit_holders(self, name: str) -> PermitInfo: ...

    def force_release_permits(self, name: str) -> int:
        """Administrative: drop every holder and waiter of ``name``; how many holders there were."""
        ...


class AsyncPermitDriver(Protocol):
    """The awaitable twin of :class:`PermitDriver`."""

    async def acquire_permit(
        self,
        name: str,
        token: str,
        ttl: float,
        deadline: float | None,
        limit: int,
        mode: PermitMode,
        cancel: Cancel | None = None,
    ) -> Grant | None: ...

    async def renew_permits(self, requests: Sequence[RenewRequest]) -> list[Grant | Exception | None]: ...

    async def release_permit(self, name: str, token: str) -> bool: ...

    async def permit_holders(self, name: str) -> PermitInfo: ...

    async def force_release_permits(self, name: str) -> int: ...
