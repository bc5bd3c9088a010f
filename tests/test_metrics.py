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
            self.stats.acquired(0.001)  # queued: its finalizer hands the queue over

    def collect_under_the_lock() -> None:
        with metrics._Exporter._guard:
            gc.collect()

    Cycle()
    worker = threading.Thread(target=collect_under_the_lock, daemon=True)
    worker.start()
    worker.join(5)
    assert not worker.is_alive(), "finalizing statistics under the export lock deadlocked"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_ttl_used_is_the_share_of_the_ttl_gone_at_release() -> None:
    clock = FakeClock()
    with lockkit.connect("memory://ttl-used", clock=clock) as locks:
        lock = locks.lock("t", ttl=10, auto_renew=False)
        with lock:
            clock.now += 6
        stats = locks.stats()["default"]
    # 1 - (deadline - now) / ttl, the deadline being 10 s minus the drift margin (1 % + 2 ms) after the grant
    assert stats["ttl_used_ratio"]["count"] == 1
    assert stats["ttl_used_ratio"]["max"] == pytest.approx(1 - (10 - 0.102 - 6) / 10)


def test_prometheus_exports_ttl_used_buckets() -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    clock = FakeClock()
    labels = {"backend": "ttl-used-prom"}

    def bucket(le: str) -> float:
        return prometheus_client.REGISTRY.get_sample_value("lockkit_ttl_used_ratio_bucket", {**labels, "le": le}) or 0

    before = {le: bucket(le) for le in ("0.75", "0.9", "+Inf")}
    config = {"backends": {"ttl-used-prom": {"url": "memory://ttl-used-prom"}}}
    with lockkit.from_config(config, clock=clock) as locks, locks.lock("t", ttl=10, auto_renew=False):
        clock.now += 8  # 81 % of the TTL gone: past 0.75, within 0.9
    assert bucket("0.75") == before["0.75"]
    assert bucket("0.9") == before["0.9"] + 1
    assert bucket("+Inf") == before["+Inf"] + 1


def test_the_reservoir_stays_a_bounded_uniform_sample() -> None:
    import random

    from lockkit import metrics

    rng = random.Random(7)
    deciles = [0] * 10
    n = 50_000
    for _ in range(10):
        reservoir = metrics._Reservoir()
        for i in range(n):
            reservoir.add(float(i), rng)
        assert len(reservoir.values) == metrics.RESERVOIR and reservoir.seen == n
        for value in reservoir.values:
            deciles[int(value * 10 // n)] += 1
    expected = 10 * metrics.RESERVOIR / 10
    assert all(abs(count - expected) < 0.1 * expected for count in deciles), deciles  # ~7 σ: no false alarms


def test_a_fork_while_another_thread_counts_does_not_hang_the_child() -> None:
    """The export lock is held across fork: a child never starts with it held by a thread it does not have."""
    import os
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    script = textwrap.dedent(
        """
        import os
        import threading
        import time

        from lockkit import metrics

        held = threading.Event()

        def hold() -> None:
            with metrics._Exporter._guard:
                held.set()
                time.sleep(0.5)

        threading.Thread(target=hold).start()
        held.wait()
        pid = os.fork()
        if pid == 0:  # what the child's first count would wait for, for ever if it came held
            os._exit(0 if metrics._Exporter._guard.acquire(timeout=5) else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        """
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    done = subprocess.run([sys.executable, "-c", script], env=env, timeout=60, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
