"""The conformance suite over etcd:// (a real single-node etcd from backends/), both faces."""

from __future__ import annotations

import pytest

from backends.servers import EtcdServer
from lockkit.testing import AsyncConformanceSuite, ConformanceSuite


class TestEtcdConformance(ConformanceSuite):
    @pytest.fixture
    def url(self, etcd_server: EtcdServer) -> str:
        return etcd_server.url


class TestEtcdConformanceAsync(AsyncConformanceSuite):
    @pytest.fixture
    def url(self, etcd_server: EtcdServer) -> str:
        return etcd_server.url
