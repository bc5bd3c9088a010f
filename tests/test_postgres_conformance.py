"""The conformance suite over postgresql:// (one PostgreSQL 15 server, superuser URL with a password), both faces."""

from __future__ import annotations

import pytest

from backends.servers import PostgresServer
from lockkit.testing import AsyncConformanceSuite, ConformanceSuite


class TestPostgres(ConformanceSuite):
    @pytest.fixture
    def url(self, postgres_server: PostgresServer) -> str:
        return postgres_server.url


class TestPostgresAsync(AsyncConformanceSuite):
    @pytest.fixture
    def url(self, postgres_server: PostgresServer) -> str:
        return postgres_server.url
