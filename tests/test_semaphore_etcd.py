"""The semaphore and reader-writer lock suite over etcd:// (one real server), both faces."""

from __future__ import annotations

import pytest

from backends.servers import EtcdServer
from lockkit.testing import AsyncSemaphoreSuite, SemaphoreSuite


class TestEtcd(SemaphoreSuite):
    @pytest.fixture
    def url(self, etcd_server: EtcdServer) -> str:
        return etcd_server.url


class TestEtcdAsync(AsyncSemaphoreSuite):
    @pytest.fixture
    def url(self, etcd_server: EtcdServer) -> str:
        return etcd_server.url
