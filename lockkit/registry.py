"""Which driver serves which URL scheme: built-in table plus the ``lockkit.drivers`` entry points.

Nothing here imports a backend client until a URL of that scheme is opened,
so ``import lockkit`` stays light. A third-party driver registers a class with
``from_url(url, ctx) -> Driver`` (and optionally ``from_url_async``) under the
entry-point group ``lockkit.drivers``, with the scheme as the entry's name.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, cast

from .driver import AsyncDriver, Driver, DriverContext, Guarantees
from .errors import ConfigError
from .offload import ThreadOffloadDriver
from .urls import BackendURL

__all__ = ["DriverFactory", "builtin_schemes", "load_factory", "open_async_driver", "open_driver"]


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
    "memory": _Builtin("lockkit.drivers.memory:MemoryDriver", None),
    "file": _Builtin("lockkit.drivers.file:FileDriver", None),
    "redis": _Builtin("lockkit.drivers.redis:RedisDriver", "redis", "redis"),
    "rediss": _Builtin("lockkit.drivers.redis:RedisDriver", "redis", "redis"),
    "unix": _Builtin("lockkit.drivers.redis:RedisDriver", "redis", "redis"),
    "redlock": _Builtin("lockkit.drivers.redlock:RedlockDriver", "redis", "redis"),
    "zookeeper": _Builtin("lockkit.drivers.zookeeper:ZooKeeperDriver", "zookeeper", "kazoo"),
    "etcd": _Builtin("lockkit.drivers.etcd:EtcdDriver", "etcd", "pyetcd"),
    "etcds": _Builtin("lockkit.drivers.etcd:EtcdDriver", "etcd", "pyetcd"),
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
            raise ConfigError(f"the driver registered for {scheme}:// failed to import: {exc}") from exc
    known = ", ".join(sorted(set(_BUILTIN) | set(plugins)))
    raise ConfigError(f"unknown lock backend scheme {scheme!r}; known schemes: {known}")


def open_driver(url: BackendURL, ctx: DriverContext) -> Driver:
    return load_factory(url.scheme).from_url(url, ctx)


def open_async_driver(url: BackendURL, ctx: DriverContext) -> AsyncDriver:
    """The native async driver where the client has one, else the thread-offload adapter."""
    factory = load_factory(url.scheme)
    native = getattr(factory, "from_url_async", None)
    if native is not None:
        return cast(AsyncDriver, native(url, ctx))
    return ThreadOffloadDriver(factory.from_url(url, ctx))
