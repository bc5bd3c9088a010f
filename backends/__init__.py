"""Test infrastructure for lockkit: throw-away servers and a TCP fault proxy.

Not part of the ``lockkit`` wheel. See ``python -m backends --help``.
"""

from backends.proxy import FaultProxy, ProxyMode
from backends.servers import (
    EtcdServer,
    RedisServer,
    RedlockServers,
    Server,
    ServerError,
    ServerNotReady,
    ZooKeeperServer,
    free_port,
    redlock_url,
    start_redis_masters,
)

__all__ = [
    "EtcdServer",
    "FaultProxy",
    "ProxyMode",
    "RedisServer",
    "RedlockServers",
    "Server",
    "ServerError",
    "ServerNotReady",
    "ZooKeeperServer",
    "free_port",
    "redlock_url",
    "start_redis_masters",
]
