"""Lockers: the entry point that routes lock names to configured backends.

:class:`Locker` (blocking) and :class:`AsyncLocker` (asyncio) share routing,
backend set-up and statistics through :class:`_LockerBase`; they differ only
in how they open drivers and await them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Generic, TypeVar

from .aio import AsyncLock
from .backend import Backend
from .config import BackendSpec, Settings, load_file, resolve_settings
from .driver import AsyncDriver, Driver, DriverContext, HolderInfo
from .errors import ConfigError, LockError
from .lease import LostCallback
from .lock import DEFAULT_TTL, Lock, LockCore
from .names import validate_name
from .offload import ThreadOffloadDriver
from .registry import open_async_driver, open_driver
from .renewal import async_scheduler, scheduler
from .timing import Clock, default_clock
from .urls import BackendURL, parse_url

__all__ = ["AsyncLocker", "Locker", "connect", "connect_async", "from_config", "from_config_async"]

log = logging.getLogger("lockkit")

D = TypeVar("D", Driver, AsyncDriver)


def _backend_url(spec: BackendSpec, source: str) -> BackendURL:
    try:
        url = parse_url(spec.url)
    except ConfigError as exc:
        raise ConfigError(f"{source}: backend {spec.name!r}: {exc}") from None
    if spec.options:
        merged = dict(url.options)
        for key, value in spec.options.items():
            if key in merged:
                raise ConfigError(f"{source}: backend {spec.name!r}: option {key!r} is set in both url and table")
            merged[key] = value
        url = BackendURL(url.scheme, url.hosts, url.path, url.username, url.password, merged)
    return url


class _LockerBase(Generic[D]):
    def __init__(self, settings: Settings, clock: Clock | None) -> None:
        self.settings = settings
        self.clock = clock or default_clock
        self._backends: dict[str, Backend[D]] = {}
        self._closed = False
        try:
            for spec in settings.backends.values():
                if spec.migrate is not None:
                    shown = f"migrate {spec.migrate['from']} -> {spec.migrate['to']} ({spec.migrate['phase']})"
                else:
                    url = _backend_url(spec, settings.source)
                    shown = str(url)
                backend: Backend[D] = Backend(spec.name, shown, self.clock)
                ctx = DriverContext(clock=self.clock, events=backend)
                try:
                    if spec.migrate is not None:
                        driver = self._wrap(self._open_migrate(spec, ctx))
                    else:
                        driver = self._open(url, ctx)
                except ConfigError as exc:
                    raise ConfigError(f"{settings.source}: backend {spec.name!r}: {exc}") from None
                backend.attach(driver)
                self._backends[spec.name] = backend
        except BaseException:
            self._abandon()
            raise

    def _open(self, url: BackendURL, ctx: DriverContext) -> D:
        raise NotImplementedError

    def _wrap(self, driver: Driver) -> D:
        """The face's view of a blocking driver (itself, or a thread offload for asyncio)."""
        raise NotImplementedError

    def _open_migrate(self, spec: BackendSpec, ctx: DriverContext) -> Driver:
        from .drivers.migrate import MigrateDriver, MigrateOptions

        assert spec.migrate is not None
        migrate = spec.migrate
        try:
            ttl = float(migrate.get("presence_ttl", "15"))
        except ValueError:
            raise ConfigError(f"migrate.presence_ttl must be a number, got {migrate['presence_ttl']!r}") from None
        options = MigrateOptions(migrate["phase"], migrate.get("group", spec.name), ttl)
        # The components get their own connections, and report session events to the migrate backend.
        old = open_driver(_backend_url(self.settings.backends[migrate["from"]], self.settings.source), ctx)
        try:
            new = open_driver(_backend_url(self.settings.backends[migrate["to"]], self.settings.source), ctx)
        except BaseException:
            old.close()
            raise
        return MigrateDriver(old, new, options, ctx)

    def _abandon(self) -> None:
        """Close what a failed constructor already opened (best effort, synchronous drivers only)."""
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

    def backend_for(self, name: str, backend: str | None = None) -> Backend[D]:
        self._check_open()
        return self._backends[self.settings.route(validate_name(name), backend)]

    def backends(self) -> list[str]:
        return list(self._backends)

    def _core(self, name: object, ttl: object, backend: str | None, **kwargs: Any) -> LockCore:
        valid = validate_name(name)
        return LockCore(self.backend_for(valid, backend), valid, ttl, **kwargs)

    def stats(self) -> dict[str, dict[str, Any]]:
        """Per backend: acquisitions, timeouts, errors, renewals, losses, wait and hold quantiles."""
        return {name: backend.stats.snapshot() for name, backend in self._backends.items()}

    def guarantees(self) -> dict[str, Any]:
        return {name: backend.guarantees for name, backend in self._backends.items()}

    def describe(self) -> dict[str, str]:
        """Backend name → URL with the password masked."""
        return {name: backend.shown_url for name, backend in self._backends.items()}

    def __repr__(self) -> str:
        shown = ", ".join(f"{n}={b.shown_url}" for n, b in self._backends.items())
        return f"{type(self).__name__}({shown}{', closed' if self._closed else ''})"


class Locker(_LockerBase[Driver]):
    """Blocking locker. Use :func:`connect` or :func:`from_config` to make one."""

    def _open(self, url: BackendURL, ctx: DriverContext) -> Driver:
        return open_driver(url, ctx)

    def _wrap(self, driver: Driver) -> Driver:
        return driver

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
    ) -> Lock:
        """A handle on lock ``name`` (nothing is sent to the server until you acquire it)."""
        return Lock(
            self._core(name, ttl, backend, auto_renew=auto_renew, on_lost=on_lost, max_hold=max_hold, timeout=timeout)
        )

    def holder(self, name: str, *, backend: str | None = None) -> HolderInfo:
        return self.backend_for(name, backend).driver.holder(name)

    def force_release(self, name: str, *, backend: str | None = None) -> bool:
        """Administrative: delete the lock whoever holds it (their next renew reports it lost)."""
        target = self.backend_for(name, backend)
        done = target.driver.force_release(name)
        log.warning(
            "lockkit: force-released %r on backend %r by pid %d (held: %s)", name, target.name, os.getpid(), done
        )
        return done

    def migrations(self) -> dict[str, Any]:
        """The migrate backends of this configuration: name → their :class:`MigrateDriver`."""
        from .drivers.migrate import MigrateDriver

        self._check_open()
        return {n: b.driver for n, b in self._backends.items() if isinstance(b.driver, MigrateDriver)}

    def check(self) -> dict[str, float | LockError]:
        """Round-trip time in seconds per backend, or the error that reaching it raised."""
        self._check_open()
        out: dict[str, float | LockError] = {}
        for name, backend in self._backends.items():
            start = self.clock()
            try:
                backend.driver.ping()
                out[name] = self.clock() - start
            except LockError as exc:
                out[name] = exc
        return out

    def close(self) -> None:
        """Close every backend's connections; held leases stop renewing and are reported lost.

        No release is sent lock by lock. What the server does with the locks then depends on the backend:
        etcd and ZooKeeper end the client's session lease or session, which frees its locks at once; on
        Redis, Redlock and file:// they stay until their TTL passes. Release what you hold first when the
        next holder should not wait.
        """
        if self._closed:
            return
        self._closed = True
        renewals = scheduler(self.clock)
        for backend in self._backends.values():
            leases = backend.live_leases()
            driver = backend.mark_closed()
            backend.stats.apply_queued()
            for lease in leases:
                renewals.remove(lease)
                lease.mark_lost("its locker was closed")
            if driver is not None:
                driver.close()

    def __enter__(self) -> Locker:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class AsyncLocker(_LockerBase[AsyncDriver]):
    """Asyncio locker. Use :func:`connect_async` or :func:`from_config_async` to make one."""

    def _open(self, url: BackendURL, ctx: DriverContext) -> AsyncDriver:
        return open_async_driver(url, ctx)

    def _wrap(self, driver: Driver) -> AsyncDriver:
        return ThreadOffloadDriver(driver)

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
        return AsyncLock(
            self._core(name, ttl, backend, auto_renew=auto_renew, on_lost=on_lost, max_hold=max_hold, timeout=timeout)
        )

    async def holder(self, name: str, *, backend: str | None = None) -> HolderInfo:
        return await self.backend_for(name, backend).driver.holder(name)

    async def force_release(self, name: str, *, backend: str | None = None) -> bool:
        target = self.backend_for(name, backend)
        done = await target.driver.force_release(name)
        log.warning(
            "lockkit: force-released %r on backend %r by pid %d (held: %s)", name, target.name, os.getpid(), done
        )
        return done

    async def check(self) -> dict[str, float | LockError]:
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
        if self._closed:
            return
        self._closed = True
        renewals = async_scheduler(self.clock)
        for backend in self._backends.values():
            leases = backend.live_leases()
            driver = backend.mark_closed()
            backend.stats.apply_queued()
            for lease in leases:
                renewals.remove(lease)
                lease.mark_lost("its locker was closed")
            if driver is not None:
                await driver.close()

    async def __aenter__(self) -> AsyncLocker:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


def connect(url: str | None = None, *, clock: Clock | None = None) -> Locker:
    """A blocking locker for ``url``, or from ``LOCKKIT_URL`` / ``lockkit.toml`` / the embedded default."""
    return Locker(resolve_settings(url), clock)


def connect_async(url: str | None = None, *, clock: Clock | None = None) -> AsyncLocker:
    """The asyncio twin of :func:`connect` (use it as ``async with``, or call ``aclose()``)."""
    return AsyncLocker(resolve_settings(url), clock)


def from_config(path: str | os.PathLike[str] | Mapping[str, Any], *, clock: Clock | None = None) -> Locker:
    """A blocking locker from a ``lockkit.toml`` path (or an already-parsed mapping)."""
    return Locker(_settings(path), clock)


def from_config_async(path: str | os.PathLike[str] | Mapping[str, Any], *, clock: Clock | None = None) -> AsyncLocker:
    return AsyncLocker(_settings(path), clock)


def _settings(path: str | os.PathLike[str] | Mapping[str, Any]) -> Settings:
    if isinstance(path, Mapping):
        from .config import parse_settings

        return parse_settings(path, "<mapping>")
    return load_file(path)
