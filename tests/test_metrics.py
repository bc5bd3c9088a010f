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


def test_prometheus_counts_every_event_of_short_lived_lockers() -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    import gc

    labels = {"backend": "short"}

    def total() -> float:
        return prometheus_client.REGISTRY.get_sample_value("lockkit_acquisitions_total", labels) or 0.0

    before = total()
    for i in range(5):  # fewer events each than are queued before they are applied
        with lockkit.from_config({"backends": {"short": {"url": f"memory://short-{i}"}}}) as locks:
            for _ in range(100):
                with locks.lock("s", ttl=5):
                    pass
    dropped = lockkit.from_config({"backends": {"short": {"url": "memory://short-dropped"}}})
    with dropped.lock("s", ttl=5):
        pass
    del dropped  # never closed: its queued events are applied when it is collected
    gc.collect()
    assert total() - before == 501


def test_a_scrape_while_lockers_are_made_does_not_fail() -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    import gc
    import threading

    stop = threading.Event()
    errors: list[BaseException] = []

    def scrape() -> None:
        while not stop.is_set():
            try:
                prometheus_client.generate_latest(prometheus_client.REGISTRY)
            except BaseException as exc:  # the test reports whatever escapes a scrape
                errors.append(exc)
                return

    scraper = threading.Thread(target=scrape)
    scraper.start()
    try:
        for i in range(300):
            with lockkit.connect(f"memory://scrape-{i}") as locks, locks.lock("x", ttl=5):
                pass
            if i % 50 == 0:
                gc.collect()
    finally:
        stop.set()
        scraper.join(10)
    assert not errors, errors[0]


def test_stats_collected_while_the_export_lock_is_held_do_not_deadlock() -> None:
    """The garbage collector can finalize a dropped locker's statistics inside code holding the export lock."""
    pytest.importorskip("prometheus_client")
    import gc
    import threading

    from lockkit import metrics

    class Cycle:  # keeps the stats alive past their last reference, until a collection finds the cycle
        def __init__(self) -> None:
            self.me = self
            self.stats = metrics.BackendStats("gc-cycle")
            self.stats.count_and_observe("acquisitions", "wait", 0.001)

    def collect_under_the_lock() -> None:
        with metrics._Exporter._guard:
            gc.collect()

    Cycle()
    worker = threading.Thread(target=collect_under_the_lock, daemon=True)
    worker.start()
    worker.join(5)
    assert not worker.is_alive(), "finalizing statistics under the export lock deadlocked"
