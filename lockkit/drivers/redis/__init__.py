"""``redis://``, ``rediss://``, ``unix://`` (:mod:`.single`) and ``redlock://`` (:mod:`.redlock`) on Redis.

The package holds both Redis drivers and what they share: keys, Lua scripts, the I/O-free acquire flows,
the Redlock quorum arithmetic, the nodes and their connection pool, the pub/sub hubs and their watchers.
"""

from .single import AsyncRedisDriver, RedisDriver

__all__ = ["AsyncRedisDriver", "RedisDriver"]
