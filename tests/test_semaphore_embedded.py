"""The semaphore and reader-writer lock suite over the embedded drivers, memory:// and file://, both faces."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from lockkit.testing import AsyncSemaphoreSuite, SemaphoreSuite

ONE_PROCESS = "memory:// is one process by definition"


class _MemoryOnly:
    @pytest.mark.skip(reason=ONE_PROCESS)
    def test_limit_never_exceeded_processes(self) -> None:
        pass

    @pytest.mark.skip(reason=ONE_PROCESS)
    def test_rwlock_processes(self) -> None:
        pass

    @pytest.mark.skip(reason=ONE_PROCESS)
    def test_killed_holder_permit_lapses(self) -> None:
        pass

    @pytest.mark.skip(reason=ONE_PROCESS)
    def test_paused_holder_permit_lapses(self) -> None:
        pass

    @pytest.mark.skip(reason=ONE_PROCESS)
    def test_killed_writer_lapses(self) -> None:
        pass


class TestMemory(_MemoryOnly, SemaphoreSuite):  # type: ignore[misc]
    @pytest.fixture
    def url(self) -> str:
        return f"memory://sem-{uuid.uuid4().hex[:8]}"


class TestMemoryAsync(_MemoryOnly, AsyncSemaphoreSuite):  # type: ignore[misc]
    @pytest.fixture
    def url(self) -> str:
        return f"memory://sem-{uuid.uuid4().hex[:8]}"


class TestFile(SemaphoreSuite):
    @pytest.fixture
    def url(self, tmp_path: Path) -> str:
        return (tmp_path / "locks").as_uri()


class TestFileAsync(AsyncSemaphoreSuite):
    @pytest.fixture
    def url(self, tmp_path: Path) -> str:
        return (tmp_path / "locks").as_uri()
