"""Opening and closing lockers leaves no thread behind (one renewal thread per process is by design)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

import lockkit

DRIVERS = ["memory", "file", "redis", "sentinel", "cluster", "zookeeper", "etcd", "postgres"]


@pytest.fixture(params=DRIVERS)
def leak_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "memory":
        return "memory://leaks"
    if request.param == "file":
        return (tmp_path / "locks").as_uri()
    fixture = {
        "redis": "redis_server",
        "sentinel": "sentinel_set",
        "cluster": "redis_cluster",
        "zookeeper": "zookeeper_server",
        "etcd": "etcd_server",
        "postgres": "postgres_server",
    }[request.param]
    url: str = request.getfixturevalue(fixture).url
    return url


def _threads() -> set[str]:
    return {f"{t.name}#{t.ident}" for t in threading.enumerate() if not t.name.startswith("lockkit-renew")}


def test_closing_lockers_stops_their_threads(leak_url: str) -> None:
    with lockkit.connect(leak_url) as warm, warm.lock("leak-warm", ttl=5):
        pass  # first use starts the process-wide renewal thread and any lazily started pools
    before = _threads()
    for i in range(5):
        with lockkit.connect(leak_url) as locks:
            holder = locks.lock(f"leak-{i}", ttl=5)
            holder.acquire()
            assert locks.lock(f"leak-{i}").try_acquire() is None
            holder.release()
    deadline = time.monotonic() + 10
    while (_threads() - before) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not (_threads() - before), f"threads left behind: {sorted(_threads() - before)}"
