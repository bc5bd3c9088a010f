"""The entry point that routes lock names to configured backends: :class:`AsyncLocker`, written once.

This file is the source of :class:`lockkit.Locker` too: ``scripts/unasync.py`` generates
``lockkit/_sync/locker.py`` from it.
"""

from __future__ import annotations

import functools
import getpass
import logging
import os
from collections.abc import Callable
from types import TracebackType
from typing import Any, Literal, ParamSpec, TypeVar

from ..config import BackendSpec, Settings, backend_url, where_backend
from ..configured_backend import Backend
from ..driver import AsyncDriver, AsyncPermitDriver, Driver, DriverContext, HolderInfo, PermitInfo, PermitMode
from ..errors import ConfigError, LockError
from ..face_guard import FaceGuard
from ..guarded import NameTemplate, enter_call, leave_call
from ..lease import Lease, LostCallback
from ..lock_core import DEFAULT_TTL, LockCore
from ..names import validate_name
from ..permits import async_permits
from ..registry import declared_guarantees, open_async_driver, open_driver
from ..routes import check_requirements
from ..timing import Clock, default_clock
from ..urls import BackendURL
from .lock import AsyncLock
from .permit_view import AsyncPermitView
from .primitives import Guarded, async_scheduler, check_guarded, face_driver, pause
from .semaphore import AsyncPermit, AsyncRWLock, AsyncSemaphore

__all__ = ["CLOSE_RELEASE_SECONDS", "AsyncLocker"]

log = logging.getLogger("lockkit")

P = ParamSpec("P")
T = TypeVar("T")

CLOSE_RELEASE_SECONDS = 5.0
"""How long closing a locker spends releasing the locks still held, in all, before it gives up on the rest."""
CLOSE_POLL = 0.005
"""How often the close looks whether the acquires it woke have left their drivers (a few milliseconds each)."""


class AsyncLocker(FaceGuard):
    """Routes lock names to the configured backends and hands out :class:`AsyncLock` handles.

    Make one with :func:`lockkit.connect_async` or :func:`lockkit.from_config_async`, and close it when done.
    """

    def __init__(self, settings: Settings, clock: Clock | None = None) -> None:
        self.settings = settings
        self.clock = clock or default_clock
        self._backends: dict[str, Backend[AsyncDriver]] = {}
        # Per backend, its permit operations seen as a lock driver (opened at the first semaphore or rwlock):
        # the scheduler renews and the close releases permits through them as it does locks.
        self._permit_backends: dict[str, tuple[Backend[AsyncDriver], AsyncPermitDriver]] = {}
        self._closed = False
        if any(route.require for route in settings.routes):  # before anything connects
            check_requirements(settings.routes, declared_guarantees(settings), f"{settings.source}: [routes]")
        try:
            for spec in settings.backends.values():
                self._backends[spec.name] = self._open_backend(spec)
        except BaseException:
            self._abandon()
            raise

    def _open_backend(self, spec: BackendSpec) -> Backend[AsyncDriver]:
        source = self.settings.source
        url = None if spec.migrate is not None else backend_url(spec, source)
        if url is None:
            assert spec.migrate is not None
            shown = f"migrate {spec.migrate['from']} -> {spec.migrate['to']} ({spec.migrate['phase']})"
        else:
            shown = str(url)
        backend: Backend[AsyncDriver] = Backend(spec.name, shown, self.clock)
        ctx = DriverContext(clock=self.clock, events=backend)
        try:
            backend.attach(self._open_driver(spec, url, ctx))
        except ConfigError as exc:
            raise ConfigError(f"{where_backend(source, spec.name)}{exc}") from None
        return backend

    def _open_driver(self, spec: BackendSpec, url: BackendURL | None, ctx: DriverContext) -> AsyncDriver:
        if url is None:
            return face_driver(self._open_migrate(spec, ctx))
        return open_async_driver(url, ctx)

    def _open_migrate(self, spec: BackendSpec, ctx: DriverContext) -> Driver:
        from ..drivers.migrate import MigrateDriver, MigrateOptions

        assert spec.migrate is not None
        migrate = spec.migrate
        try:
            ttl = float(migrate.get("presence_ttl", "15"))
        except ValueError:
            raise ConfigError(
                f"migrate.presence_ttl must be a number, got {migrate['presence_ttl']!r}; "
                "give seconds from 1 to 3600, e.g. presence_ttl = 30"
            ) from None
        options = MigrateOptions(migrate["phase"], migrate.get("group", spec.name), ttl)
        # The components are blocking drivers on both faces, with their own connections; they report session
        # events to the migrate backend.
        backends, source = self.settings.backends, self.settings.source
        old = open_driver(backend_url(backends[migrate["from"]], source), ctx)
        try:
            new = open_driver(backend_url(backends[migrate["to"]], source), ctx)
        except BaseException:
            old.close()
            raise
        return MigrateDriver(old, new, options, ctx)

    def _abandon(self) -> None:
        """Close what a failed constructor already opened (best effort, blocking drivers only: no loop to await)."""
        for backend in self._backends.values():
            driver = backend.mark_closed()
            backend.stats.apply_queued()
            close = getattr(driver, "close", None)
            if close is not None and isinstance(driver, Driver):
                try:
                    close()
                except Exception:
                    log.debug("lockkit: closing a half-opened backend failed", exc_info=True)

    def _check_open(self) -> None:
        if self._closed:
            raise LockError("this locker is closed; open a new one with lockkit.connect()")

    def backend_for(self, name: str, backend: str | None = None) -> Backend[AsyncDriver]:
        """The backend lock ``name`` goes to: ``backend`` if given, else the first matching route."""
        return self._routed(validate_name(name), backend)

    def _routed(self, valid: str, backend: str | None) -> Backend[AsyncDriver]:
        """:meth:`backend_for` a name validated already."""
        if self._closed:
            self._check_open()  # raises
        settings = self.settings
        # No routes and no backend named: the default, without a call to look for a route (once per handle)
        chosen = settings.route(valid, backend) if backend is not None or settings.routes else settings.default
        return self._backends[chosen]

    def backends(self) -> list[str]:
        """The names of the configured backends."""
        return list(self._backends)

    def stats(self) -> dict[str, dict[str, Any]]:
        """Per backend: acquisitions, timeouts, errors, renewals, losses, wait and hold quantiles."""
        return {name: backend.stats.snapshot() for name, backend in self._backends.items()}

    def guarantees(self) -> dict[str, Any]:
        """Per backend: what its driver promises (:class:`lockkit.Guarantees`)."""
        return {name: backend.guarantees for name, backend in self._backends.items()}

    def describe(self) -> dict[str, str]:
        """Backend name → URL with the password masked."""
        return {name: backend.shown_url for name, backend in self._backends.items()}

    def lock(
        self,
        name: str,
        ttl: float = DEFAULT_TTL,
        *,
        backend: str | None = None,
        auto_renew: bool = True,
        on_lost: LostCallback | None = None,
        max_hold: float | None = None,
        timeout: float | None = None,
    ) -> AsyncLock:
        """A handle on lock ``name`` (nothing is sent to the server until you acquire it)."""
        valid = validate_name(name)  # once per handle: routing and the handle take it as it is
        core = LockCore(
            self._routed(valid, backend),
            valid,
            ttl,
            auto_renew=auto_renew,
            on_lost=on_lost,
            max_hold=max_hold,
            timeout=timeout,
            name_checked=True,
        )
        return AsyncLock(core)

    def locked(
        self,
        name: str,
        ttl: float = DEFAULT_TTL,
        *,
        backend: str | None = None,
        auto_renew: bool = True,
        on_lost: LostCallback | None = None,
        max_hold: float | None = None,
        timeout: float | None = None,
        limit: int | None = None,
        side: Literal["read", "write"] | None = None,
    ) -> Callable[[Guarded[P, T]], Guarded[P, T]]:
        """Decorate a function so that each call runs holding lock ``name``; the same arguments as :meth:`lock`.

        ``name`` may name the function's parameters in braces (``"report:{day}"``), formatted from each call's
        arguments. Inside the call, :func:`lockkit.current_lease` is the lease it holds. Errors are those of
        :meth:`AsyncLock.acquire` and of leaving ``async with`` (``LockTimeout``, ``LockLost``, …).
        ``limit=N`` holds one permit of semaphore ``name`` instead of a lock, ``side="read"`` or ``"write"``
        one side of reader-writer lock ``name`` (docs/semaphores.md).
        """
        if limit is not None and side is not None:
            raise ConfigError(
                "locked() takes limit= (a semaphore) or side= (a reader-writer lock), not both; drop one of them"
            )
        if side is not None and side not in ("read", "write"):
            raise ConfigError(
                f'side must be "read" or "write", got {side!r}; pass side="read" to share the lock with other '
                'readers, or side="write" to hold it alone'
            )
        template = NameTemplate(name)
        options: dict[str, Any] = {
            "backend": backend,
            "auto_renew": auto_renew,
            "on_lost": on_lost,
            "max_hold": max_hold,
            "timeout": timeout,
        }

        def handle(formatted: str) -> AsyncLock:
            if limit is not None:
                return self.semaphore(formatted, limit, ttl, **options)
            if side is not None:
                rw = self.rwlock(formatted, ttl, **options)
                return rw.write() if side == "write" else rw.read()
            return self.lock(formatted, ttl, **options)

        if not template.fields:
            handle(name)  # a bad name, ttl, limit or option (or a backend without semaphores) fails here

        def decorate(fn: Guarded[P, T]) -> Guarded[P, T]:
            check_guarded(fn)
            signature = template.check(fn)

            @functools.wraps(fn)
            async def run_locked(*args: P.args, **kwargs: P.kwargs) -> T:
                lock = handle(template.format(signature, args, kwargs))
                async with lock as lease:
                    entry = enter_call(lease)
                    try:
                        return await fn(*args, **kwargs)
                    finally:
                        leave_call(entry)

            return run_locked

        return decorate

    # -- semaphores and reader-writer locks (issue 18) --------------------------------------------------

    def _permit_backend(self, name: str, backend: str | None) -> tuple[Backend[AsyncDriver], AsyncPermitDriver]:
        target = self.backend_for(name, backend)
        found = self._permit_backends.get(target.name)
        if found is None:
            view: Backend[AsyncDriver] = Backend(target.name, target.shown_url, self.clock)
            view.stats = target.stats  # one set of statistics per backend, locks and permits together
            # ConfigError where the backend offers none; a session-bound driver reports permit losses to the view
            permits = async_permits(target.driver, target.name, view)
            view.attach(AsyncPermitView(permits, target.guarantees))
            found = self._permit_backends[target.name] = (view, permits)
        return found

    def _permit(
        self,
        cls: type[AsyncPermit],
        name: str,
        limit: int,
        mode: PermitMode,
        ttl: object,
        backend: str | None,
        options: dict[str, Any],
    ) -> AsyncPermit:
        valid = validate_name(name)
        view, permits = self._permit_backend(valid, backend)
        return cls(LockCore(view, valid, ttl, **options), permits, limit, mode)

    def semaphore(
        self,
        name: str,
        limit: int,
        ttl: float = DEFAULT_TTL,
        *,
        backend: str | None = None,
        auto_renew: bool = True,
        on_lost: LostCallback | None = None,
        max_hold: float | None = None,
        timeout: float | None = None,
    ) -> AsyncSemaphore:
        """A handle on one permit of semaphore ``name``: at most ``limit`` holders at once (docs/semaphores.md).

        The other arguments are those of :meth:`lock`. A backend that offers no semaphores raises
        :class:`ConfigError` here, saying why.
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ConfigError(
                f"a semaphore's limit must be a whole number of at least 1, got {limit!r}; pass an int, e.g. limit=3"
            )
        options = {"auto_renew": auto_renew, "on_lost": on_lost, "max_hold": max_hold, "timeout": timeout}
        handle = self._permit(AsyncSemaphore, name, limit, "permit", ttl, backend, options)
        assert isinstance(handle, AsyncSemaphore)
        return handle

    def rwlock(
        self,
        name: str,
        ttl: float = DEFAULT_TTL,
        *,
        backend: str | None = None,
        auto_renew: bool = True,
        on_lost: LostCallback | None = None,
        max_hold: float | None = None,
        timeout: float | None = None,
    ) -> AsyncRWLock:
        """Reader-writer lock ``name``: ``.read()`` and ``.write()`` give handles (docs/semaphores.md).

        The other arguments are those of :meth:`lock`, and apply to every handle it gives.
        """
        options = {"auto_renew": auto_renew, "on_lost": on_lost, "max_hold": max_hold, "timeout": timeout}
        valid = validate_name(name)
        self._permit(AsyncPermit, valid, 0, "read", ttl, backend, options)  # bad arguments fail here, at once

        def make(mode: PermitMode) -> AsyncPermit:
            return self._permit(AsyncPermit, valid, 0, mode, ttl, backend, options)

        return AsyncRWLock(valid, make)

    async def permit_holders(self, name: str, *, backend: str | None = None) -> PermitInfo:
        """Who holds and waits for semaphore or rwlock ``name`` (one round trip)."""
        _, permits = self._permit_backend(name, backend)
        return await permits.permit_holders(name)

    async def force_release_permits(self, name: str, *, backend: str | None = None) -> int:
        """Administrative: drop every holder and waiter of semaphore or rwlock ``name``; how many held."""
        _, permits = self._permit_backend(name, backend)
        count = await permits.force_release_permits(name)
        log.warning(
            "lockkit: %s (pid %d) force-released %d permit(s) of %r", _user_name(), os.getpid(), count, name
        )
        return count

    async def holder(self, name: str, *, backend: str | None = None) -> HolderInfo:
        """Who holds ``name`` now, as its backend sees it (one round trip)."""
        return await self.backend_for(name, backend).driver.holder(name)

    async def force_release(self, name: str, *, backend: str | None = None) -> bool:
        """Administrative: delete the lock whoever holds it (their next renew reports it lost)."""
        target = self.backend_for(name, backend)
        done = await target.driver.force_release(name)
        log.warning(
            "lockkit: %s (pid %d) force-released %r on backend %r (%s)",
            _user_name(),
            os.getpid(),
            name,
            target.name,
            "it was held" if done else "it was not held",
        )
        return done

    def migrations(self) -> dict[str, Any]:
        """The migrate backends of this configuration: name → their :class:`MigrateDriver`."""
        from ..drivers.migrate import MigrateDriver
        from ..offload import ThreadOffloadDriver

        self._check_open()
        found: dict[str, Any] = {}
        for name, backend in self._backends.items():
            driver: Any = backend.driver
            if isinstance(driver, ThreadOffloadDriver):
                driver = driver.sync
            if isinstance(driver, MigrateDriver):
                found[name] = driver
        return found

    async def check(self) -> dict[str, float | LockError]:
        """Round-trip time in seconds per backend, or the error that reaching it raised."""
        self._check_open()
        out: dict[str, float | LockError] = {}
        for name, backend in self._backends.items():
            start = self.clock()
            try:
                await backend.driver.ping()
                out[name] = self.clock() - start
            except LockError as exc:
                out[name] = exc
        return out

    async def aclose(self) -> None:
        """Release what this locker's locks hold, then close every backend's connections.

        Each held lock is released (owner-checked, as :meth:`AsyncLock.release` does), one backend after
        another, for at most :data:`CLOSE_RELEASE_SECONDS` in all; a backend that fails to answer gets no
        further attempts. What could not be released is reported once per backend (a WARNING on the
        ``lockkit`` logger, the ``losses`` statistic, each lease's ``on_lost``): it stays taken on the server
        until its TTL passes (Redis, Redlock, file://) or the client's session ends (etcd, ZooKeeper, which
        the close itself ends). Locks a forked child inherited from its parent are the parent's: never
        released here. Idempotent.
        """
        if self._closed:
            return
        self._closed = True
        renewals = async_scheduler(self.clock)
        deadline = self.clock() + CLOSE_RELEASE_SECONDS
        # Permits first, through their views (closing a view closes only its own worker threads), then locks.
        everything = [view for view, _ in self._permit_backends.values()] + list(self._backends.values())
        for backend in everything:
            leases = [lease for lease in backend.live_leases() if lease.owner_pid == os.getpid()]
            for lease in leases:
                renewals.remove(lease)
            driver = backend.mark_closed()  # wakes the acquires still waiting: they end with a LockError
            if driver is not None:
                await self._let_waiters_leave(backend, deadline)
                await self._release_at_close(backend, driver, leases, deadline)
            backend.stats.apply_queued()
            backend.detach()
            if driver is not None:
                await driver.close()

    async def _let_waiters_leave(self, backend: Backend[Any], deadline: float) -> None:
        """Give the acquires the close woke the time to clean up what they queued on the server (a queue entry,
        a watch), within the close's budget, so that the driver is not closed under them (C-16)."""
        while backend.acquiring and self.clock() < deadline:
            await pause(CLOSE_POLL)

    async def _release_at_close(
        self, backend: Backend[AsyncDriver], driver: AsyncDriver, leases: list[Lease], deadline: float
    ) -> None:
        kept: list[Lease] = []
        why = ""
        for lease in leases:
            released = False
            if not why and self.clock() >= deadline:
                why = f"the {CLOSE_RELEASE_SECONDS:g} s allowed for releasing at close ran out"
            answered = False
            if not why:
                try:
                    released = await driver.release(lease.name, lease.token)
                    answered = True
                except Exception as exc:  # unreachable or refused: spare the rest of this backend the wait
                    why = f"releasing {lease.name!r} failed: {exc}"
            backend.untrack(lease)
            if answered:  # observed as any release is (LockCore.finish): its hold time and the TTL share used
                now = backend.clock()
                backend.stats.ended(released, max(0.0, now - lease.acquired_at), lease.ttl_used(now))
            if released:
                lease.mark_released()
            else:
                kept.append(lease)  # lost to the close (not observed: never released) or found gone
        lost = [lease for lease in kept if lease.mark_lost("its locker was closed", warn=False)]  # counted as losses
        if not lost:
            return
        if why:
            log.warning(
                "lockkit: closing backend %r left %d lock(s) held on the server (%s); they stay taken until their "
                "TTL passes or the session ends: release locks before closing, or check the backend",
                backend.name,
                len(lost),
                why,
            )
        else:
            log.warning(
                "lockkit: closing backend %r found %d lock(s) no longer this client's (expired or taken over "
                "before the close); nothing of another holder's was touched",
                backend.name,
                len(lost),
            )

    async def __aenter__(self) -> AsyncLocker:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        shown = ", ".join(f"{n}={b.shown_url}" for n, b in self._backends.items())
        return f"{type(self).__name__}({shown}{', closed' if self._closed else ''})"


def _user_name() -> str:
    """Who is acting, for the audit line of a forced release: the login name, else the uid."""
    try:
        return getpass.getuser()
    except Exception:  # no USER/LOGNAME and no passwd entry (a bare container)
        return f"uid {os.getuid()}"
