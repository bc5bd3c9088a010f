"""The ``@locker.locked`` decorator with ``limit=`` / ``side=``, and config routes, for semaphores and rwlocks."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from pathlib import Path

import pytest

import lockkit


@pytest.fixture
def url() -> str:
    return f"memory://sem-deco-{uuid.uuid4().hex[:8]}"


def test_locked_with_limit_admits_n_calls_at_once(url: str) -> None:
    inside = {"now": 0, "most": 0}
    guard = threading.Lock()
    with lockkit.connect(url) as locks:

        @locks.locked("export:{tenant}", ttl=5, limit=2)
        def export(tenant: str) -> int:
            lease = lockkit.current_lease()
            assert lease is not None and lease.valid and lease.name == f"export:{tenant}"
            with guard:
                inside["now"] += 1
                inside["most"] = max(inside["most"], inside["now"])
            time.sleep(0.05)
            with guard:
                inside["now"] -= 1
            return lease.fencing_token

        threads = [threading.Thread(target=export, args=("acme",)) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert inside == {"now": 0, "most": 2}
        assert locks.permit_holders("export:acme").holders == 0


async def test_async_locked_side_write_excludes_readers(url: str) -> None:
    async with lockkit.connect_async(url) as locks:

        @locks.locked("table", ttl=5, side="write")
        async def write() -> bool:
            reader = locks.rwlock("table").read()
            return await reader.try_acquire() is None

        @locks.locked("table", ttl=5, side="read")
        async def read() -> bool:
            await asyncio.sleep(0.05)
            return (await locks.permit_holders("table")).holders >= 1

        assert await write()
        assert all(await asyncio.gather(read(), read(), read()))


def test_locked_refuses_bad_permit_options_at_decoration(url: str) -> None:
    with lockkit.connect(url) as locks:
        with pytest.raises(lockkit.ConfigError, match="not both"):
            locks.locked("x", limit=2, side="read")
        with pytest.raises(lockkit.ConfigError, match="side must be"):
            locks.locked("x", side="permit")  # type: ignore[arg-type]
        with pytest.raises(lockkit.ConfigError, match="limit"):
            locks.locked("x", limit=0)


def test_locked_refuses_a_backend_without_semaphores_at_decoration() -> None:
    with (
        lockkit.connect("redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3") as locks,
        pytest.raises(lockkit.ConfigError, match=r"\(never: "),
    ):
        locks.locked("x", limit=2)


def test_routes_send_semaphores_to_their_backend(tmp_path: Path) -> None:
    directory = tmp_path / "locks"
    config = {
        "default": "fast",
        "backends": {
            "fast": {"url": f"memory://sem-routes-{uuid.uuid4().hex[:8]}"},
            "host": {"url": directory.as_uri()},
        },
        "routes": {"exports:*": "host"},
    }
    with lockkit.from_config(config) as locks:
        with locks.semaphore("exports:daily", limit=2, ttl=5) as lease:
            assert lease.backend == "host" and list(directory.glob("*.sem"))
            assert locks.permit_holders("exports:daily").holders == 1
        with locks.rwlock("other", ttl=5).read() as lease:
            assert lease.backend == "fast"
