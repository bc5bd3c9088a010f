"""The conformance suite over redis+cluster:// (three masters made one cluster), blocking and asyncio.

The suite's lock names are random, so they spread over the slots of all three masters;
``test_names_spread_over_every_master`` checks that a handful of such names does reach each of them.
"""

from __future__ import annotations

import secrets

import pytest

from backends.servers import RedisCluster
from lockkit.drivers.redis.cluster_config import key_slot
from lockkit.drivers.redis.keys import cluster_lock_keys
from lockkit.testing import AsyncConformanceSuite, ConformanceSuite


class TestCluster(ConformanceSuite):
    @pytest.fixture
    def url(self, redis_cluster: RedisCluster) -> str:
        return redis_cluster.url


class TestClusterAsync(AsyncConformanceSuite):
    @pytest.fixture
    def url(self, redis_cluster: RedisCluster) -> str:
        return redis_cluster.url


def test_names_spread_over_every_master(redis_cluster: RedisCluster) -> None:
    owners = set()
    for _ in range(64):
        keys = cluster_lock_keys("lockkit:", f"suite-{secrets.token_hex(8)}")
        owners.add(redis_cluster.node_for_slot(key_slot(keys.lock)).port)
    assert len(owners) == 3
