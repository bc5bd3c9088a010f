"""What one lock handle knows, with no I/O: :class:`LockCore`, shared by :class:`~lockkit.Lock` and
:class:`~lockkit.AsyncLock`.

Argument checks, token creation, turning a driver's :class:`Grant` into a :class:`Lease`, statistics and
the lease registry live here. The faces (``lockkit/_async/lock.py``, written by hand, and
``lockkit/_sync/lock.py``, generated from it) only make the driver call and register the lease with their
renewal scheduler.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
from collections.abc import Callable
from typing import Any

from .configured_backend import Backend
from .driver import Grant
from .errors import BackendUnavailable, ConfigError, LockError, LockLost, LockNotOwned, LockTimeout
from .lease import Lease, LostCallback, RenewalTicket, token_hint
from .names import validate_name
from .timing import validate_timeout, validate_ttl

__all__ = ["DEFAULT_TTL", "LATE_GRANTS", "USE_LOCK_TIMEOUT", "LockCore", "new_token"]

log = logging.getLogger("lockkit")

DEFAULT_TTL = 30.0
LATE_GRANTS = 3
"""How many grants in a row an acquire gives back for arriving after their validity ran out (see
:meth:`LockCore.granted`) before it raises :class:`BackendUnavailable`: a pause of this process passes, a
server or network slower than the ttl does not."""


class _TokenSource:
    """128-bit tokens from the OS CSPRNG, drawn 256 at a time.

    A token is a capability, so never ``random`` or uuid1. One ``getrandom`` call per token cost ~40 µs
    on some virtual machines; slicing a 4 KiB draw keeps every bit from the CSPRNG at a fraction of that.
    The pool is dropped in a forked child (:meth:`after_fork`, an ``os.register_at_fork`` hook: there is no
    fork where that is missing) so that parent and child never hand out the same token.
    """

    def __init__(self) -> None:
        self.after_fork()

    def after_fork(self) -> None:
        """A fresh mutex and no pool: a child forked while another thread of its parent held the mutex would
        otherwise wait on it for ever at its first token (the thread that held it does not exist there)."""
        self._mutex = threading.Lock()
        self._pool = ""  # the draw in hex: a token is a slice of it, no copy of the rest and no hex() per token
        self._next = 0

    def take(self) -> str:
        with self._mutex:
            at = self._next
            pool = self._pool
            if at >= len(pool):
                pool = self._pool = secrets.token_bytes(4096).hex()
                at = 0
            self._next = at + 32
        return pool[at : at + 32]


_tokens = _TokenSource()
if hasattr(os, "register_at_fork"):  # not on Windows, where there is no fork
    os.register_at_fork(after_in_child=_tokens.after_fork)


def new_token() -> str:
    """A fresh lease token: 128 random bits as 32 hex characters."""
    return _tokens.take()


USE_LOCK_TIMEOUT: Any = object()
"""Marks "use the timeout given to ``locker.lock()``" (None there means wait forever)."""


class LockCore:
    """I/O-free state of one lock handle, shared by the blocking and the async face."""

    __slots__ = (
        "_kind", "auto_renew", "backend", "lease", "max_hold", "mutex", "name", "noun", "on_lost", "timeout", "ttl",
    )  # fmt: skip

    def __init__(
        self,
        backend: Backend[Any],
        name: object,
        ttl: object = DEFAULT_TTL,
        *,
        auto_renew: bool = True,
        on_lost: LostCallback | None = None,
        max_hold: object = None,
        timeout: object = None,
        name_checked: bool = False,
    ) -> None:
        # name_checked: the locker validated the name already, to route it (once per handle, not twice)
        self.name: str = name if name_checked else validate_name(name)  # type: ignore[assignment]
        self.ttl = validate_ttl(ttl)
        self.timeout = None if timeout is None else validate_timeout(timeout, "timeout")
        self.max_hold = None if max_hold is None else validate_ttl(max_hold, "max_hold")
        if not isinstance(auto_renew, bool):
            raise ConfigError(f"auto_renew must be True or False, got {auto_renew!r}")
        if on_lost is not None and not callable(on_lost):
            raise ConfigError(f"on_lost must be a callable taking the lost Lease, got {type(on_lost).__name__}")
        self.backend = backend
        self.auto_renew = auto_renew
        self.on_lost = on_lost
        self.lease: Lease | None = None
        self.mutex = threading.Lock()
        self._kind = self.noun = "lock"

    @property
    def kind(self) -> str:
        """What the handle holds, for its messages: ``lock``, or (set by the permit handles) ``semaphore``,
        ``rwlock read side``, ``rwlock write side``."""
        return self._kind

    @kind.setter
    def kind(self, kind: str) -> None:
        self._kind = kind
        # noun: ``lock``, ``semaphore`` or ``rwlock`` (of either side), for messages and Lease.kind; kept with
        # the kind instead of derived from it per acquire
        self.noun = kind.split(" ", 1)[0]

    @property
    def clock(self) -> Callable[[], float]:
        return self.backend.clock

    def begin(self, timeout: object) -> tuple[str, float | None, float]:
        """Check we may acquire; return a fresh token, the absolute deadline and the instant the wait starts."""
        wait = self.timeout if timeout is USE_LOCK_TIMEOUT else validate_timeout(timeout)
        backend = self.backend
        backend.driver  # raises if the locker is closed  # noqa: B018
        lease = self.lease  # one read: the mutex guards what granted() and finish() change together
        if lease is not None and lease.valid:
            raise LockError(
                f"this {self.kind} handle already holds {self.name!r}; release it first "
                f"(use one handle per holder: a {self.kind} handle is not reentrant)"
            )
        now = backend.clock()  # the deadline and the wait statistic count from one reading
        return new_token(), None if wait is None else now + wait, now

    def granted(self, token: str, grant: Grant, started: float) -> Lease | None:
        """The lease of ``grant`` (won by an acquire that began at ``started``), registered and counted; ``None``
        if the grant came too late to be trusted at all: its validity (send time + ttl − drift) had run out when
        it arrived — a reply slower than the ttl, or this process paused in between. Nothing is registered then:
        the face gives the grant back and tries again (:data:`LATE_GRANTS`), as Redlock does (L-7)."""
        backend = self.backend
        stats = backend.stats
        clock = backend.clock
        # Its backend counts a loss through one of the lease's callbacks (see Backend.track), given here
        count: LostCallback = stats.count_loss
        on_lost = [count] if self.on_lost is None else [self.on_lost, count]
        lease = Lease(
            name=self.name,
            token=token,
            # None, not the driver's constant 0, where the backend declares no fencing: see Lease.fencing_token
            fencing_token=grant.fencing_token if backend.fenced else None,
            ttl=grant.ttl,
            sent_at=grant.sent_at,
            clock=clock,
            backend=backend.name,
            on_lost=on_lost,
            kind=self.noun,
        )
        now = clock()
        if now >= lease.expires_at:
            return None
        with self.mutex:
            self.lease = lease
        backend.track(lease, loss_counted=True)
        stats.acquired(now - started)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("lockkit: acquired %r token=%s fencing=%d", self.name, token_hint(token), grant.fencing_token)
        return lease

    def too_late(self, grant: Grant, times: int) -> BackendUnavailable:
        """What an acquire raises when its grants kept arriving after their own validity had run out."""
        self.backend.stats.count("errors")
        return BackendUnavailable(
            f"{self.kind} {self.name!r} on backend {self.backend.name!r}: the grant arrived after its ttl "
            f"({grant.ttl:g} s) had run out ({times} time{'s' if times > 1 else ''} in a row, each given back "
            "unused), so it was never held: the backend, the network or this process is too slow for that ttl. "
            "Use a longer ttl, or check the server's and this process's latency"
        )

    def closed_while_waiting(self) -> LockError:
        """An acquire whose locker was closed while it waited (C-16): it holds nothing."""
        return LockError(
            f"{self.kind} {self.name!r}: its locker was closed while this acquire waited (backend "
            f"{self.backend.name!r}); nothing is held. Open a new locker with lockkit.connect() to acquire again"
        )

    def timed_out(self, timeout: object) -> LockTimeout:
        self.backend.stats.count("timeouts")
        wait = self.timeout if timeout is USE_LOCK_TIMEOUT else timeout
        return LockTimeout(
            f"{self.kind} {self.name!r} on backend {self.backend.name!r} was not free within {wait} s; "
            "retry later, or pass a larger timeout"
        )

    def held_lease(self, action: str) -> Lease:
        """The lease a release/renew acts on; ``LockNotOwned`` if this handle holds none here."""
        lease = self.lease  # one read (see begin)
        if lease is None:
            raise LockNotOwned(
                f"cannot {action} {self.name!r}: this {self.kind} handle does not hold it; acquire it first "
                "(a handle releases and renews only what it acquired itself)"
            )
        if not lease.ours():
            raise LockNotOwned(
                f"cannot {action} {self.name!r}: it was acquired by process {lease.owner_pid}; "
                "a forked child never inherits its parent's locks: acquire the lock in this process"
            )
        return lease

    def finish(self, lease: Lease, released: bool) -> None:
        """Forget a lease that was released (counted) or found gone."""
        with self.mutex:
            if self.lease is lease:
                self.lease = None
        backend = self.backend
        backend.untrack(lease)
        now = backend.clock()
        backend.stats.ended(released, max(0.0, now - lease.acquired_at), lease.ttl_used(now))

    def after_release(self, lease: Lease, ok: bool) -> None:
        """Forget the lease; ``LockNotOwned`` if the server no longer held our token."""
        self.finish(lease, released=ok)
        if not ok:
            raise self.release_failed(lease)
        lease.mark_released()

    def release_failed(self, lease: Lease) -> LockNotOwned:
        lease.mark_lost("the server no longer held our token at release (expired or taken over)")
        return LockNotOwned(
            f"{self.noun} {self.name!r} was no longer ours at release (it expired or was taken); "
            "nothing was deleted. Use a longer ttl or keep auto_renew on"
        )

    def release_errored(self, lease: Lease, error: BaseException) -> None:
        """A release raised (or its task was cancelled): the server may still hold the lock until its TTL.

        The lease is no longer trusted either way, and nothing renews it any more (it left the scheduler
        before the call), so it must not keep saying ``valid``.
        """
        if isinstance(error, LockError):
            self.backend.stats.count("errors")
        lease.mark_released()
        self.finish(lease, released=False)

    def start_renewal(self, lease: Lease, ttl: object) -> tuple[float, RenewalTicket]:
        """Check a direct renew and note it on the lease before it is sent (see :meth:`Lease.renewal_started`)."""
        self.check_renewable(lease)
        want = self.ttl if ttl is None else validate_ttl(ttl)
        return want, lease.renewal_started(self.clock(), want)

    def renew_errored(self, lease: Lease, ticket: RenewalTicket, error: BaseException) -> None:
        """A direct renew raised or was cancelled: it may have reached the server, so cap the lease by it."""
        if isinstance(error, LockError):
            self.backend.stats.count("errors")
        lease.renewal_unknown(ticket)

    def renewed(self, lease: Lease, grant: Grant | None, ticket: RenewalTicket | None = None) -> Lease:
        if grant is None:
            if ticket is not None:
                lease.renewal_refused(ticket)
            lease.mark_lost("renew found the server no longer holds our token")  # counted by the backend
            raise LockLost(
                f"{self.noun} {self.name!r} was lost: the server no longer holds our token; stop the work that "
                "relied on it and acquire it again (a longer ttl, or auto_renew, keeps it held)"
            )
        if not lease.extend(grant.sent_at, grant.ttl, ticket):
            lease.ensure_valid()
            raise LockLost(
                f"{self.noun} {self.name!r} was lost before the renewal completed; stop the work that relied on "
                "it and acquire it again (renew well before the ttl runs out: auto_renew does, at a third of it)"
            )
        self.backend.stats.count("renewals")
        return lease

    def check_renewable(self, lease: Lease) -> None:
        if not lease.valid:
            lease.ensure_valid()

    def exit_error(self, lease: Lease | None) -> LockLost | None:
        """What ``__exit__`` must tell the block if the lock was lost while it ran."""
        if lease is not None and not lease.valid and lease.ours():
            return LockLost(
                f"{self.noun} {self.name!r} was lost while the with-block ran ({lease.lost_reason}); "
                "its work may have overlapped another holder's: check it, and use a longer ttl or keep auto_renew on"
            )
        return None

    def describe(self) -> str:
        held = self.lease is not None and self.lease.valid
        return f"name={self.name!r}, backend={self.backend.name!r}, ttl={self.ttl:g}, {'held' if held else 'not held'}"
