"""``postgresql://`` / ``postgres://``: locks held as session-level advisory locks on one PostgreSQL server.

The drivers are written once, as asyncio code (``_async/driver.py``, on psycopg 3's native asyncio API); the
blocking face is generated from it (``_sync/driver.py``, by ``scripts/unasync.py``). This module is where the
registry finds both. docs/backends/postgres.md is the user's page: URL and options, the key mapping, what ttl
means, what a failover or a pooler does, and the rights the role needs.
"""

from __future__ import annotations

from ...driver import DriverContext
from ...urls import BackendURL
from ._async.driver import AsyncPostgresDriver
from ._sync.driver import PostgresDriver as BlockingPostgresDriver
from .facts import GUARANTEES

__all__ = ["GUARANTEES", "AsyncPostgresDriver", "PostgresDriver"]


class PostgresDriver(BlockingPostgresDriver):
    """The blocking driver as the registry finds it, which also asks it for the asyncio face."""

    @staticmethod
    def from_url_async(url: BackendURL, ctx: DriverContext) -> AsyncPostgresDriver:
        return AsyncPostgresDriver.from_url(url, ctx)
