"""The front end of one lock: :class:`Lock` (blocking). :class:`~lockkit.aio.AsyncLock` is its twin.

Everything the two faces share lives in :class:`LockCore`, which does no I/O:
argument checks, token creation, turning a driver's :class:`Grant` into a
:class:`Lease`, statistics and the lease registry. The faces only make the
driver call (blocking or awaited) and register the lease with their renewal
scheduler, so the two cannot drift apart.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

from .backend import Backend
from .driver import Driver, Grant
from .errors import ConfigError, LockError, LockLost, LockNotOwned, LockTimeout
from .lease import Lease, LostCallback, RenewalTicket, token_hint
from .names import validate_name
from .renewal import scheduler
from .timing import deadline_after, validate_timeout, validate_ttl

__all__ = ["Lock", "LockCore"]

log = logging.getLogger("lockkit")

DEFAULT_TTL = 30.0


class _TokenSource:
    """128-bit tokens from the OS CSPRNG, drawn 256 at a time.

    A token is a capability, so never ``random`` or uuid1. One ``getrandom`` call per token cost ~40 µs
    on some virtual machines; slicing a 4 KiB draw keeps every bit from the CSPRNG at a fraction of that.
    The pool is dropped after ``fork`` so that parent and child never hand out the same token.
    """

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._pool = b""
        self._pid = 0

    def take(self) -> str:
        with self._mutex:
            if len(self._pool) < 16 or self._pid != os.getpid():
                self._pool = secrets.token_bytes(4096)
                self._pid = os.getpid()
            token, self._pool = self._pool[:16], self._pool[16:]
        return token.hex()


_tokens = _TokenSource()


def new_token() -> str:
    """A fresh lease token: 128 random bits as 32 hex characters."""
    return _tokens.take()


class LockCore:
    """I/O-free state of one lock handle, shared by the blocking and the async face."""

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
    ) -> None:
        self.name = validate_name(name)
        self.ttl = validate_ttl(ttl)
        self.timeout = validate_timeout(timeout, "timeout")
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

    @property
    def clock(self) -> Callable[[], float]:
        return self.backend.clock

    def begin(self, timeout: object) -> tuple[str, float | None]:
        """Check we may acquire; return a fresh token and the absolute deadline."""
        wait = validate_timeout(self.timeout if timeout is _DEFAULT else timeout)
        self.backend.driver  # raises if the locker is closed  # noqa: B018
        with self.mutex:
            if self.lease is not None and self.lease.valid:
                raise LockError(
                    f"this Lock object already holds {self.name!r}; release it first "
                    "(use one Lock object per holder: locks are not reentrant)"
                )
        return new_token(), deadline_after(self.clock, wait)

    def granted(self, token: str, grant: Grant, waited: float) -> Lease:
        lease = Lease(
            name=self.name,
            token=token,
            fencing_token=grant.fencing_token,
            ttl=grant.ttl,
            sent_at=grant.sent_at,
            clock=self.clock,
            backend=self.backend.name,
            on_lost=[self.on_lost] if self.on_lost else None,
        )
        with self.mutex:
            self.lease = lease
        self.backend.track(lease)
        self.backend.stats.count_and_observe("acquisitions", "wait", waited)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("lockkit: acquired %r token=%s fencing=%d", self.name, token_hint(token), grant.fencing_token)
        return lease

    def timed_out(self, timeout: object) -> LockTimeout:
        self.backend.stats.count("timeouts")
        wait = self.timeout if timeout is _DEFAULT else timeout
        return LockTimeout(
            f"lock {self.name!r} on backend {self.backend.name!r} was not free within {wait} s; "
            "retry later, or pass a larger timeout"
        )

    def held_lease(self, action: str) -> Lease:
        """The lease a release/renew acts on; ``LockNotOwned`` if this handle holds none here."""
        with self.mutex:
            lease = self.lease
        if lease is None:
            raise LockNotOwned(f"cannot {action} {self.name!r}: this Lock object does not hold it")
        if lease.owner_pid != os.getpid():
            raise LockNotOwned(
                f"cannot {action} {self.name!r}: it was acquired by process {lease.owner_pid}; "
                "a forked child never inherits its parent's locks"
            )
        return lease

    def finish(self, lease: Lease, released: bool) -> None:
        """Forget a lease that was released (counted) or found gone."""
        with self.mutex:
            if self.lease is lease:
                self.lease = None
        self.backend.forget(lease)
        held = max(0.0, self.clock() - lease.acquired_at)
        if released:
            self.backend.stats.count_and_observe("releases", "hold", held)
        else:
            self.backend.stats.observe("hold", held)

    def after_release(self, lease: Lease, ok: bool) -> None:
        """Forget the lease; ``LockNotOwned`` if the server no longer held our token."""
        self.finish(lease, released=ok)
        if not ok:
            raise self.release_failed(lease)
        lease.mark_released()

    def release_failed(self, lease: Lease) -> LockNotOwned:
        lease.mark_lost("the server no longer held our token at release (expired or taken over)")
        return LockNotOwned(
            f"lock {self.name!r} was no longer ours at release (it expired or was taken); "
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
            if lease.mark_lost("renew found the server no longer holds our token"):
                self.backend.stats.count("losses")
            raise LockLost(f"lock {self.name!r} was lost: the server no longer holds our token")
        if not lease.extend(grant.sent_at, grant.ttl, ticket):
            lease.ensure_valid()
            raise LockLost(f"lock {self.name!r} was lost before the renewal completed")
        self.backend.stats.count("renewals")
        return lease

    def check_renewable(self, lease: Lease) -> None:
        if not lease.valid:
            lease.ensure_valid()

    def exit_error(self, lease: Lease | None) -> LockLost | None:
        """What ``__exit__`` must tell the block if the lock was lost while it ran."""
        if lease is not None and not lease.valid and lease.owner_pid == os.getpid():
            return LockLost(
                f"lock {self.name!r} was lost while the with-block ran ({lease.lost_reason}); "
                "its work may have overlapped another holder's"
            )
        return None

    def describe(self) -> str:
        held = self.lease is not None and self.lease.valid
        return f"name={self.name!r}, backend={self.backend.name!r}, ttl={self.ttl:g}, {'held' if held else 'not held'}"


_DEFAULT: Any = object()
"""Marks "use the timeout given to ``locker.lock()``" (None there means wait forever)."""


class Lock:
    """A handle on one named lock. Create it with :meth:`lockkit.Locker.lock`.

    A ``Lock`` holds at most one lease at a time and is not reentrant. Use one
    ``Lock`` object per holder; to lock the same name from several threads,
    give each thread its own ``Lock`` (they then exclude each other).
    """

    def __init__(self, core: LockCore) -> None:
        self._core = core

    @property
    def name(self) -> str:
        return self._core.name

    @property
    def lease(self) -> Lease | None:
        """The current lease, if this handle holds one (valid or not)."""
        return self._core.lease

    def _driver(self) -> Driver:
        driver: Driver = self._core.backend.driver
        return driver

    def _start(self, token: str, grant: Grant, started: float) -> Lease:
        core = self._core
        lease = core.granted(token, grant, core.clock() - started)
        scheduler(core.clock).add(lease, core.backend, core.ttl, core.auto_renew, core.max_hold)
        return lease

    def acquire(self, timeout: float | None = _DEFAULT) -> Lease:
        """Block until held; raise :class:`LockTimeout` after ``timeout`` seconds (``None``: wait forever)."""
        core = self._core
        token, deadline = core.begin(timeout)
        started = core.clock()
        try:
            grant = self._driver().acquire(core.name, token, core.ttl, deadline)
        except LockError:
            core.backend.stats.count("errors")
            raise
        if grant is None:
            raise core.timed_out(timeout)
        return self._start(token, grant, started)

    def try_acquire(self) -> Lease | None:
        """One attempt, never waits: the lease, or ``None`` if someone else holds the lock."""
        try:
            return self.acquire(timeout=0)
        except LockTimeout:
            return None

    def renew(self, ttl: float | None = None) -> Lease:
        """Extend the lease to ``ttl`` (default: the lock's ttl) from now; :class:`LockLost` if it is gone.

        The new deadline replaces the old one, shorter or longer, and automatic renewal goes on with the new
        ttl: ``renew(ttl=1)`` on a lease granted for 30 s leaves about one second of validity.
        """
        core = self._core
        lease = core.held_lease("renew")
        want, ticket = core.start_renewal(lease, ttl)
        renewals = scheduler(core.clock)
        try:
            grant = self._driver().renew(core.name, lease.token, want)
        except BaseException as exc:
            core.renew_errored(lease, ticket, exc)
            renewals.retune(lease, None)
            raise
        try:
            return core.renewed(lease, grant, ticket)
        finally:
            renewals.retune(lease, want)

    def release(self) -> None:
        """Release the lock; :class:`LockNotOwned` if it was not ours any more (nothing is deleted then)."""
        core = self._core
        lease = core.held_lease("release")
        scheduler(core.clock).remove(lease)
        try:
            ok = self._driver().release(core.name, lease.token)
        except BaseException as exc:
            core.release_errored(lease, exc)
            raise
        core.after_release(lease, ok)

    def locked(self) -> bool:
        """Whether anyone holds the lock now, as the server sees it (one round trip)."""
        return self._driver().holder(self._core.name).held

    def owned(self) -> bool:
        """Whether this handle holds a valid lease now (no network I/O)."""
        lease = self._core.lease
        return lease is not None and lease.valid

    def __enter__(self) -> Lease:
        return self.acquire()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        lease = self._core.lease
        lost = self._core.exit_error(lease)
        try:
            self.release()
        except LockError:
            if exc is None and lost is None:
                raise
            if exc is not None:
                log.warning("lockkit: releasing %r after an error in its block failed", self.name, exc_info=True)
        if lost is not None and exc is None:
            raise lost

    def __repr__(self) -> str:
        return f"Lock({self._core.describe()})"
