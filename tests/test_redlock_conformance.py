"""The conformance suite over redlock:// (5 masters), blocking and asyncio.

Redlock declares ``fencing="none"`` (see lockkit.drivers.redlock); the suite skips its fencing
assertions for such drivers and runs everything else unchanged.
"""

from __future__ import annotations

import pytest

import lockkit
from backends.servers import RedlockServers
from lockkit.testing import AsyncConformanceSuite, ConformanceSuite


class TestRedlock(ConformanceSuite):
    @pytest.fixture
    def url(self, redlock_servers: RedlockServers) -> str:
        return redlock_servers.url

    def test_guarantees_declare_no_fencing(self, locks: lockkit.Locker) -> None:
        assert locks.guarantees()[locks.backends()[0]].fencing == "none"


class TestRedlockAsync(AsyncConformanceSuite):
    @pytest.fixture
    def url(self, redlock_servers: RedlockServers) -> str:
        return redlock_servers.url

    async def test_guarantees_declare_no_fencing(self, locks: lockkit.AsyncLocker) -> None:
        assert locks.guarantees()[locks.backends()[0]].fencing == "none"
