"""The conformance suite over the embedded drivers, memory:// and file://, both faces."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from lockkit.testing import AsyncConformanceSuite, ConformanceSuite


class TestMemory(ConformanceSuite):
    @pytest.fixture
    def url(self) -> str:
        return f"memory://suite-{uuid.uuid4().hex[:8]}"

    @pytest.mark.skip(reason="memory:// is one process by definition")
    def test_mutual_exclusion_processes(self) -> None:  # type: ignore[override]
        pass


class TestMemoryAsync(AsyncConformanceSuite):
    @pytest.fixture
    def url(self) -> str:
        return f"memory://suite-{uuid.uuid4().hex[:8]}"

    @pytest.mark.skip(reason="memory:// is one process by definition")
    async def test_mutual_exclusion_processes(self) -> None:  # type: ignore[override]
        pass


class TestFile(ConformanceSuite):
    @pytest.fixture
    def url(self, tmp_path: Path) -> str:
        return (tmp_path / "locks").as_uri()


class TestFileAsync(AsyncConformanceSuite):
    @pytest.fixture
    def url(self, tmp_path: Path) -> str:
        return (tmp_path / "locks").as_uri()
