"""The semaphore and reader-writer lock suite over postgresql:// (one real PostgreSQL 15 server), both faces."""

from __future__ import annotations

import pytest

from backends.servers import PostgresServer
from lockkit.testing import AsyncSemaphoreSuite, SemaphoreSuite


class TestPostgres(SemaphoreSuite):
    @pytest.fixture
    def url(self, postgres_server: PostgresServer) -> str:
        return postgres_server.url


class TestPostgresAsync(AsyncSemaphoreSuite):
    @pytest.fixture
    def url(self, postgres_server: PostgresServer) -> str:
        return postgres_server.url
