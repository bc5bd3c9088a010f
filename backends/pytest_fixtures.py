"""pytest fixtures for lockkit's integration tests.

Enable with ``pytest_plugins = ["backends.pytest_fixtures"]`` in the root conftest.

Session-scoped, shared (do not kill/pause/restart these; clean up your own keys):
``redis_server``, ``redlock_servers`` (5 masters), ``sentinel_set`` (master, 2 replicas, 3 sentinels),
``zookeeper_server``, ``etcd_server``.

Function-scoped factories, for tests that kill, pause or restart a server; every
server or proxy they create is stopped at teardown, even when the test fails:
``fresh_redis(**kw)``, ``fresh_redlock(n=5, **kw)``, ``fresh_zookeeper(**kw)``,
``fresh_etcd(**kw)``, ``fresh_etcd_cluster(n=3, **kw)``, ``fresh_sentinel(replicas=2, sentinels=3, **kw)``,
``fault_proxy(server_or_host, port=None, **kw)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

from backends.proxy import FaultProxy
from backends.servers import (
    EtcdCluster,
    EtcdServer,
    PostgresServer,
    RedisServer,
    RedlockServers,
    SentinelSet,
    Server,
    ZooKeeperServer,
)

__all__ = [
    "etcd_server",
    "fault_proxy",
    "fresh_etcd",
    "fresh_etcd_cluster",
    "fresh_postgres",
    "fresh_redis",
    "fresh_redlock",
    "fresh_sentinel",
    "fresh_zookeeper",
    "postgres_server",
    "redis_server",
    "redlock_servers",
    "sentinel_set",
    "zookeeper_server",
]

S = TypeVar("S", bound=Server)
T = TypeVar("T")

RedisFactory = Callable[..., RedisServer]
RedlockFactory = Callable[..., RedlockServers]
ZooKeeperFactory = Callable[..., ZooKeeperServer]
EtcdFactory = Callable[..., EtcdServer]
EtcdClusterFactory = Callable[..., EtcdCluster]
SentinelFactory = Callable[..., SentinelSet]
ProxyFactory = Callable[..., FaultProxy]


def _stop_all(objs: list[Any]) -> None:
    """Stop everything (last started first); re-raise the first error after trying all."""
    first: BaseException | None = None
    for obj in reversed(objs):
        try:
            obj.stop()
        except BaseException as exc:
            first = first or exc
    objs.clear()
    if first is not None:
        raise first


def _serve(server: S) -> Iterator[S]:
    try:
        server.start()
        yield server
    finally:
        server.stop()


# ----------------------------------------------------------------- shared servers


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    yield from _serve(RedisServer())


@pytest.fixture(scope="session")
def redlock_servers() -> Iterator[RedlockServers]:
    group = RedlockServers(5)
    try:
        group.start()
        yield group
    finally:
        group.stop()


@pytest.fixture(scope="session")
def sentinel_set() -> Iterator[SentinelSet]:
    """A master, two replicas and three sentinels (service ``mymaster``); do not kill its members."""
    group = SentinelSet()
    try:
        group.start()
        yield group
    finally:
        group.stop()


@pytest.fixture(scope="session")
def zookeeper_server() -> Iterator[ZooKeeperServer]:
    yield from _serve(ZooKeeperServer())


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[EtcdServer]:
    yield from _serve(EtcdServer())


# ----------------------------------------------------------------- own instances


def _own(make: Callable[..., T]) -> Iterator[Callable[..., T]]:
    """A factory fixture's body: ``factory(*args, **kw)`` starts ``make(*args, **kw)``; all stopped at teardown."""
    started: list[Any] = []

    def factory(*args: Any, **kwargs: Any) -> T:
        obj = make(*args, **kwargs)
        started.append(obj)
        return obj.start()  # type: ignore[no-any-return, attr-defined]

    try:
        yield factory
    finally:
        _stop_all(started)


@pytest.fixture
def fresh_redis() -> Iterator[RedisFactory]:
    yield from _own(RedisServer)


@pytest.fixture
def fresh_redlock() -> Iterator[RedlockFactory]:
    """``fresh_redlock(n=5, **kw)``: independent masters."""
    yield from _own(RedlockServers)


@pytest.fixture
def fresh_zookeeper() -> Iterator[ZooKeeperFactory]:
    yield from _own(ZooKeeperServer)


@pytest.fixture
def fresh_etcd() -> Iterator[EtcdFactory]:
    yield from _own(EtcdServer)


@pytest.fixture
def fresh_etcd_cluster() -> Iterator[EtcdClusterFactory]:
    """``fresh_etcd_cluster(n=3, **kw)`` -> a started EtcdCluster (a cluster, not a server: tests kill its leader)."""
    yield from _own(EtcdCluster)


@pytest.fixture
def fresh_sentinel() -> Iterator[SentinelFactory]:
    """``fresh_sentinel(replicas=2, sentinels=3, **kw)`` -> a started SentinelSet, for tests that kill its master."""
    yield from _own(SentinelSet)


@pytest.fixture
def fault_proxy() -> Iterator[ProxyFactory]:
    """``fault_proxy(server)`` or ``fault_proxy("127.0.0.1", port)`` -> a started FaultProxy."""
    started: list[Any] = []

    def factory(target: Server | str, port: int | None = None, **kwargs: Any) -> FaultProxy:
        if isinstance(target, Server):
            if port is not None:
                raise TypeError("give a Server or a host and port, not both")
            host, target_port = target.host, target.port
        else:
            if port is None:
                raise TypeError("port is required with a host")
            host, target_port = target, port
        proxy = FaultProxy(host, target_port, **kwargs)
        started.append(proxy)
        return proxy.start()

    try:
        yield factory
    finally:
        _stop_all(started)


# ----------------------------------------------------------------- PostgreSQL (issue 19)

PostgresFactory = Callable[..., PostgresServer]


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One PostgreSQL 15 cluster for the session (superuser URL with a password); do not kill or restart it."""
    yield from _serve(PostgresServer())


@pytest.fixture
def fresh_postgres() -> Iterator[PostgresFactory]:
    """``fresh_postgres(**kw)`` -> a started PostgresServer of the test's own (``standby_of=`` for a hot standby)."""
    yield from _own(PostgresServer)

# ----------------------------------------------------------------- Redis Cluster (issue 14)

from backends.servers import RedisCluster  # noqa: E402  (appended block: keeps merges with the imports above easy)

__all__ += ["fresh_redis_cluster", "redis_cluster"]

RedisClusterFactory = Callable[..., RedisCluster]


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisCluster]:
    """Three masters, no replicas, made one cluster; do not kill its members or move its slots."""
    group = RedisCluster()
    try:
        group.start()
        yield group
    finally:
        group.stop()


@pytest.fixture
def fresh_redis_cluster() -> Iterator[RedisClusterFactory]:
    """``fresh_redis_cluster(masters=3, replicas=0, **kw)`` -> a started RedisCluster, for tests that kill its
    masters or migrate its slots."""
    yield from _own(RedisCluster)
