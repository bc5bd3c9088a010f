"""The conformance suite over redis:// (one server), blocking and asyncio."""

from __future__ import annotations

import pytest

from backends.servers import RedisServer
from lockkit.testing import AsyncConformanceSuite, ConformanceSuite


class TestRedis(ConformanceSuite):
    @pytest.fixture
    def url(self, redis_server: RedisServer) -> str:
        return redis_server.url


class TestRedisAsync(AsyncConformanceSuite):
    @pytest.fixture
    def url(self, redis_server: RedisServer) -> str:
        return redis_server.url
