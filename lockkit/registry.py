"""Which driver serves which URL scheme: built-in table plus the ``lockkit.drivers`` entry points.

Nothing here imports a backend client until a URL of that scheme is opened,
so ``import lockkit`` stays light. A third-party driver registers a class with
``from_url(url, ctx) -> Driver`` (and optionally ``from_url_async``) under the
entry-point group ``lockkit.drivers``, with the scheme as the entry's name.

One option is lockkit's own, for every driver with fencing: ``fencing_epoch`` (URL query or config key) is
taken off the URL here and wraps the driver in :mod:`lockkit.drivers.epoch`, so no driver needs to know it
(refused where the driver hands out no tokens, or tokens that carry an epoch of their own: Sentinel, Cluster).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import types
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, cast

from .driver import AsyncDriver, Driver, DriverContext, Guarantees
from .errors import ConfigError
from .offload import ThreadOffloadDriver
from .urls import BackendURL

if TYPE_CHECKING:
    from .config import Settings

__all__ = [
    "DriverFactory",
    "builtin_schemes",
    "declared_guarantees",
    "load_factory",
    "open_async_driver",
    "open_driver",
]


class DriverFactory(Protocol):
    guarantees: ClassVar[Guarantees]

    @classmethod
    def from_url(cls, url: BackendURL, ctx: DriverContext) -> Driver: ...


@dataclass(frozen=True)
class _Builtin:
    target: str
    extra: str | None
    client: str | None = None


_BUILTIN: dict[str, _Builtin] = {
    "memory": _Builtin("lockkit.drivers.embedded.memory:MemoryDriver", None),
    "file": _Builtin("lockkit.drivers.embedded.file:FileDriver", None),
    "redis": _Builtin("lockkit.drivers.redis.single:RedisDriver", "redis", "redis"),
    "rediss": _Builtin("lockkit.drivers.redis.single:RedisDriver", "redis", "redis"),
    "unix": _Builtin("lockkit.drivers.redis.single:RedisDriver", "redis", "redis"),
    "redis+sentinel": _Builtin("lockkit.drivers.redis.sentinel:SentinelDriver", "redis", "redis"),
    "rediss+sentinel": _Builtin("lockkit.drivers.redis.sentinel:SentinelDriver", "redis", "redis"),
    "redis+cluster": _Builtin("lockkit.drivers.redis.cluster:ClusterDriver", "redis", "redis"),
    "rediss+cluster": _Builtin("lockkit.drivers.redis.cluster:ClusterDriver", "redis", "redis"),
    "redlock": _Builtin("lockkit.drivers.redis.redlock:RedlockDriver", "redis", "redis"),
    "zookeeper": _Builtin("lockkit.drivers.zookeeper.zookeeper_driver:ZooKeeperDriver", "zookeeper", "kazoo"),
    "etcd": _Builtin("lockkit.drivers.etcd.etcd_driver:EtcdDriver", "etcd", "pyetcd"),
    "etcds": _Builtin("lockkit.drivers.etcd.etcd_driver:EtcdDriver", "etcd", "pyetcd"),
    "postgresql": _Builtin("lockkit.drivers.postgres.driver:PostgresDriver", "postgres", "psycopg"),
    "postgres": _Builtin("lockkit.drivers.postgres.driver:PostgresDriver", "postgres", "psycopg"),
}


def builtin_schemes() -> list[str]:
    return sorted(_BUILTIN)


def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group="lockkit.drivers")}


def _import(target: str) -> Any:
    module_name, _, attr = target.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def load_factory(scheme: str) -> DriverFactory:
    """The driver class for ``scheme``; a clear :class:`ConfigError` if unknown or not installed."""
    builtin = _BUILTIN.get(scheme)
    if builtin is not None:
        try:
            return cast(DriverFactory, _import(builtin.target))
        except ModuleNotFoundError as exc:
            if builtin.client and exc.name and exc.name.split(".")[0] == builtin.client:
                raise ConfigError(
                    f"the {scheme}:// driver needs the {builtin.client!r} package: "
                    f"pip install 'lockkit[{builtin.extra}]'"
                ) from exc
            raise
    plugins = _entry_points()
    if scheme in plugins:
        try:
            return cast(DriverFactory, plugins[scheme].load())
        except ImportError as exc:
            raise ConfigError(
                f"the driver registered for {scheme}:// failed to import: {exc}; check that its package is "
                "installed in this environment and imports cleanly"
            ) from exc
    known = ", ".join(sorted(set(_BUILTIN) | set(plugins)))
    raise ConfigError(f"unknown lock backend scheme {scheme!r}; known schemes: {known}. Fix the URL's scheme")


def _split_epoch(url: BackendURL) -> tuple[int | None, BackendURL]:
    """The ``fencing_epoch`` option (None if absent) and the URL without it: it is lockkit's, not the driver's."""
    if "fencing_epoch" not in url.options:
        return None, url
    from .drivers.epoch import parse_epoch

    epoch = parse_epoch(url.options["fencing_epoch"], f"{url}: option")
    rest = types.MappingProxyType({k: v for k, v in url.options.items() if k != "fencing_epoch"})
    return epoch, dataclasses.replace(url, options=rest)


def _factory(url: BackendURL) -> tuple[DriverFactory, int, BackendURL]:
    epoch, url = _split_epoch(url)
    factory = load_factory(url.scheme)
    if epoch is not None:  # setting it is the mistake on such a driver, 0 included (as a config file's key)
        from .drivers.epoch import check_fencing

        own_epoch = bool(getattr(factory, "tokens_carry_epoch", False))
        check_fencing(factory.guarantees, url.scheme, f"{url}:", own_epoch=own_epoch)
    return factory, epoch or 0, url


def _lifted(driver: Driver, epoch: int) -> Driver:
    if not epoch:
        return driver
    from .drivers._sync.epoch_driver import EpochDriver

    return EpochDriver(driver, epoch)


def open_driver(url: BackendURL, ctx: DriverContext) -> Driver:
    """The driver for ``url``; with ``fencing_epoch``, wrapped so that its tokens carry the epoch."""
    factory, epoch, url = _factory(url)
    return _lifted(factory.from_url(url, ctx), epoch)


def open_async_driver(url: BackendURL, ctx: DriverContext) -> AsyncDriver:
    """The native async driver where the client has one, else the thread-offload adapter."""
    factory, epoch, url = _factory(url)
    native = getattr(factory, "from_url_async", None)
    if native is None:
        return ThreadOffloadDriver(_lifted(factory.from_url(url, ctx), epoch))
    driver = cast(AsyncDriver, native(url, ctx))
    if not epoch:
        return driver
    from .drivers._async.epoch_driver import AsyncEpochDriver

    return AsyncEpochDriver(driver, epoch)


def declared_guarantees(settings: Settings) -> dict[str, Guarantees]:
    """What each configured backend's driver declares, read from its class: nothing is connected.

    A ``migrate`` backend offers the weaker of its two sides in each respect, whatever its phase: a migration
    passes through every phase, and a route must hold on each (see
    :func:`lockkit.drivers.migrate.combined_guarantees`).
    """
    from .urls import parse_url

    out: dict[str, Guarantees] = {}
    for spec in settings.backends.values():
        if spec.migrate is None:
            out[spec.name] = load_factory(parse_url(spec.url).scheme).guarantees
    for spec in settings.backends.values():
        if spec.migrate is not None:
            from .drivers.migrate import combined_guarantees

            old, new = out[spec.migrate["from"]], out[spec.migrate["to"]]
            out[spec.name] = combined_guarantees(old, new, "both")
    return out
