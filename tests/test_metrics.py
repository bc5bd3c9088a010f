"""locker.stats() and the Prometheus export."""

from __future__ import annotations

import pytest

import lockkit


def test_stats_count_and_time_what_happened() -> None:
    with lockkit.connect("memory://stats") as locks:
        lock = locks.lock("s", ttl=5)
        for _ in range(3):
            with lock:
                pass
        other = locks.lock("s")
        with lock:
            assert other.try_acquire() is None
        stats = locks.stats()["default"]
    assert stats["acquisitions"] == 4 and stats["releases"] == 4 and stats["timeouts"] == 1
    assert stats["wait_seconds"]["count"] == 4 and stats["hold_seconds"]["p99"] >= 0


def test_prometheus_export() -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    with lockkit.connect("memory://prom") as locks, locks.lock("p", ttl=5):
        pass
    value = prometheus_client.REGISTRY.get_sample_value("lockkit_acquisitions_total", {"backend": "default"})
    assert value is not None and value >= 1
    assert prometheus_client.REGISTRY.get_sample_value("lockkit_hold_seconds_count", {"backend": "default"})
