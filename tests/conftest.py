"""Shared fixtures: real servers from backends/ (see CONTRIBUTING.md)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient

from backends.servers import ZooKeeperServer

pytest_plugins = ["backends.pytest_fixtures"]


@pytest.fixture
def zk_raw(zookeeper_server: ZooKeeperServer) -> Iterator[KazooClient]:
    """A plain kazoo client on the session's ZooKeeper: to look at (or tamper with) what the driver wrote."""
    client = KazooClient(hosts=zookeeper_server.hosts)
    client.start(timeout=10)
    yield client
    client.stop()
    client.close()
