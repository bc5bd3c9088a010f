"""The semaphore and reader-writer lock suite over zookeeper:// (one real server), both faces."""

from __future__ import annotations

import pytest

from backends.servers import ZooKeeperServer
from lockkit.testing import AsyncSemaphoreSuite, SemaphoreSuite


class TestZooKeeper(SemaphoreSuite):
    @pytest.fixture
    def url(self, zookeeper_server: ZooKeeperServer) -> str:
        return zookeeper_server.url


class TestZooKeeperAsync(AsyncSemaphoreSuite):
    @pytest.fixture
    def url(self, zookeeper_server: ZooKeeperServer) -> str:
        return zookeeper_server.url
