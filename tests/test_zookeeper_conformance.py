"""The conformance suite over zookeeper://, blocking and async (the async face is the thread offload)."""

from __future__ import annotations

import uuid

import pytest

from backends.servers import ZooKeeperServer
from lockkit.testing import AsyncConformanceSuite, ConformanceSuite

SESSION_TIMEOUT = 4.0  # the suite checks lease.ttl >= 2.5 s; a lock's ttl is the session timeout


def _url(server: ZooKeeperServer) -> str:
    # a fresh chroot per test: nothing one test leaves can be seen by the next
    return f"{server.url}/suite-{uuid.uuid4().hex[:8]}?session_timeout={SESSION_TIMEOUT}"


class TestZooKeeperConformance(ConformanceSuite):
    @pytest.fixture
    def url(self, zookeeper_server: ZooKeeperServer) -> str:
        return _url(zookeeper_server)


class TestZooKeeperConformanceAsync(AsyncConformanceSuite):
    @pytest.fixture
    def url(self, zookeeper_server: ZooKeeperServer) -> str:
        return _url(zookeeper_server)
