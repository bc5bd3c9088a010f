"""The conformance suite over redis+sentinel:// (a master, two replicas, three sentinels), blocking and asyncio."""

from __future__ import annotations

import pytest

from backends.servers import SentinelSet
from lockkit.testing import AsyncConformanceSuite, ConformanceSuite


class TestSentinel(ConformanceSuite):
    @pytest.fixture
    def url(self, sentinel_set: SentinelSet) -> str:
        return sentinel_set.url


class TestSentinelAsync(AsyncConformanceSuite):
    @pytest.fixture
    def url(self, sentinel_set: SentinelSet) -> str:
        return sentinel_set.url
