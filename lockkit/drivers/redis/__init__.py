"""``redis://``, ``rediss://``, ``unix://`` (:mod:`.single`) and ``redlock://`` (:mod:`.redlock`) on Redis.

The package holds both Redis drivers and what they share: keys, Lua scripts, the I/O-free acquire flows,
the Redlock quorum arithmetic, the reply reader, the pools, the pub/sub hubs and their watchers. The drivers,
their nodes and connections are written once as asyncio code in ``_async/``; ``scripts/unasync.py``
generates the blocking face in ``_sync/``. What each face does its own way is written by hand in its
``primitives.py`` and ``stream.py`` (and ``pool.py``, ``watch.py`` for the blocking pool and both watchers).
"""

from .single import AsyncRedisDriver, RedisDriver

__all__ = ["AsyncRedisDriver", "RedisDriver"]
