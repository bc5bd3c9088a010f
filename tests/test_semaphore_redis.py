"""The semaphore and reader-writer lock suite over redis:// (one real server), both faces."""

from __future__ import annotations

import pytest

from backends.servers import RedisServer
from lockkit.testing import AsyncSemaphoreSuite, SemaphoreSuite


class TestRedis(SemaphoreSuite):
    @pytest.fixture
    def url(self, redis_server: RedisServer) -> str:
        return redis_server.url


class TestRedisAsync(AsyncSemaphoreSuite):
    @pytest.fixture
    def url(self, redis_server: RedisServer) -> str:
        return redis_server.url
