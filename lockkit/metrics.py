"""Per-backend counters and timing quantiles, readable as ``locker.stats()``.

The figures are kept in-process (a bounded reservoir per timing, so memory
stays flat under millions of acquisitions) and, when ``prometheus_client`` is
installed (``pip install 'lockkit[metrics]'``), exported as ``lockkit_*``
metrics labelled by backend name and read at scrape time. Lock names are not
used as labels: a label per name would grow without bound.
"""

from __future__ import annotations

import bisect
import random
import threading
import weakref
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BackendStats"]

COUNTERS = ("acquisitions", "timeouts", "errors", "renewals", "renewal_failures", "losses", "releases")
TIMINGS = ("wait", "hold")
RESERVOIR = 2048
QUEUED = 256
"""Hot-path events queued before they are applied (see BackendStats); the caller that applies them holds the
process-wide export lock meanwhile, so this stays small."""


@dataclass
class _Reservoir:
    """Uniform sample of at most RESERVOIR observations (Vitter's algorithm R)."""

    values: list[float] = field(default_factory=list)
    seen: int = 0
    total: float = 0.0

    def add(self, value: float, rng: random.Random) -> None:
        self.seen += 1
        self.total += value
        if len(self.values) < RESERVOIR:
            self.values.append(value)
        else:
            slot = rng.randrange(self.seen)
            if slot < RESERVOIR:
                self.values[slot] = value

    def summary(self) -> dict[str, float]:
        if not self.values:
            return {"count": 0}
        ordered = sorted(self.values)

        def q(p: float) -> float:
            return ordered[min(len(ordered) - 1, int(p * len(ordered)))]

        return {
            "count": self.seen,
            "mean": self.total / self.seen,
            "p50": q(0.5),
            "p90": q(0.9),
            "p99": q(0.99),
            "max": ordered[-1],
        }


BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
"""Histogram bounds of the Prometheus export (prometheus_client's defaults)."""


class _Tally:
    """What Prometheus sees of one backend label: totals over every locker of the process; they only grow."""

    def __init__(self) -> None:
        self.counts = dict.fromkeys(COUNTERS, 0)
        self.buckets = {name: [0] * (len(BUCKETS) + 1) for name in TIMINGS}
        self.sums = dict.fromkeys(TIMINGS, 0.0)

    def observe(self, timing: str, seconds: float) -> None:
        self.buckets[timing][bisect.bisect_left(BUCKETS, seconds)] += 1
        self.sums[timing] += seconds

    def add(self, counter: str, timing: str, seconds: float) -> None:
        """One queued hot-path event: a count with its timing."""
        self.counts[counter] += 1
        self.observe(timing, seconds)


class _Exporter:
    """A pull-based collector registered once in prometheus_client's registry.

    It reads the tallies at scrape time. Pushing every event into prometheus_client's own
    counters and histograms instead cost ~20 µs per acquire+release (a lock, label lookups and
    value objects per metric), a tenth of a loopback Redis round trip.
    """

    _instance: _Exporter | None = None
    _installed = False
    _guard = threading.Lock()  # guards the tallies too: updates are a few dict operations under it

    def __init__(self) -> None:
        self.tallies: dict[str, _Tally] = {}
        self.sources: weakref.WeakSet[BackendStats] = weakref.WeakSet()
        """Stats objects feeding the tallies: their queued events are applied before a scrape reads them."""

    @classmethod
    def tally(cls, backend: str, source: BackendStats) -> _Tally | None:
        """The shared tally for ``backend``; ``None`` when prometheus_client is not installed."""
        with cls._guard:
            if not cls._installed:
                cls._installed = True
                try:
                    from prometheus_client import REGISTRY
                except ImportError:
                    return None
                cls._instance = cls()
                REGISTRY.register(cls._instance)
            if cls._instance is None:
                return None
            cls._instance.sources.add(source)
            return cls._instance.tallies.setdefault(backend, _Tally())

    def describe(self) -> list[Any]:
        return []  # the families appear at the first scrape; nothing to check for clashes before

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

        with self._guard:  # tally() adds to the set under it
            sources = list(self.sources)
            while _orphans:
                queued, tally = _orphans.popleft()
                while queued:
                    tally.add(*queued.popleft())
        for source in sources:
            source.apply_queued()
        with self._guard:
            rows = [(b, dict(t.counts), {k: list(v) for k, v in t.buckets.items()}, dict(t.sums))
                    for b, t in self.tallies.items()]  # fmt: skip
        for name in COUNTERS:
            family = CounterMetricFamily(f"lockkit_{name}", f"lockkit {name.replace('_', ' ')}", labels=["backend"])
            for backend, counts, _, _ in rows:
                family.add_metric([backend], counts[name])
            yield family
        for name in TIMINGS:
            histogram = HistogramMetricFamily(f"lockkit_{name}_seconds", f"lockkit {name} time", labels=["backend"])
            for backend, _, buckets, sums in rows:
                cumulative, running = [], 0
                for bound, hits in zip((*map(str, BUCKETS), "+Inf"), buckets[name], strict=True):
                    running += hits
                    cumulative.append((bound, running))
                histogram.add_metric([backend], cumulative, sums[name])
            yield histogram


_orphans: deque[tuple[deque[tuple[str, str, float]], _Tally]] = deque()
"""Queues of collected stats objects, applied to their tallies at the next scrape."""


def _orphaned(queued: deque[tuple[str, str, float]], tally: _Tally) -> None:
    # A finalizer runs wherever the garbage collector does, possibly inside code that holds the export lock:
    # so it takes no lock, it only hands the queue over (deque.append is atomic).
    if queued:
        _orphans.append((queued, tally))


class BackendStats:
    """Thread-safe counters and timings of one backend of a locker.

    The hot path (an acquisition with its wait, a release with its hold time) only appends to a
    queue, which is applied when someone reads (``snapshot``, a Prometheus scrape) or when it grows
    long: updating the counters, the reservoir and the export tally under a lock on every
    acquire and release cost several microseconds of a loopback round trip's ~150.
    """

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self._counts = dict.fromkeys(COUNTERS, 0)
        self._timings = {name: _Reservoir() for name in TIMINGS}
        self._rng = random.Random()
        self._queued: deque[tuple[str, str, float]] = deque()
        self._tally = _Exporter.tally(backend, self)
        self._lock = _Exporter._guard if self._tally is not None else threading.Lock()
        if self._tally is not None:  # events still queued when this is dropped must reach Prometheus all the same
            weakref.finalize(self, _orphaned, self._queued, self._tally)

    def count(self, counter: str, n: int = 1) -> None:
        with self._lock:
            self._counts[counter] += n
            if self._tally is not None:
                self._tally.counts[counter] += n

    def observe(self, timing: str, seconds: float) -> None:
        with self._lock:
            self._timings[timing].add(seconds, self._rng)
            if self._tally is not None:
                self._tally.observe(timing, seconds)

    def count_and_observe(self, counter: str, timing: str, seconds: float) -> None:
        """Count one event with its timing, later (see the class): an acquisition with its wait, a release
        with its hold time."""
        queued = self._queued
        queued.append((counter, timing, seconds))  # deque.append is atomic: no lock on the hot path
        if len(queued) >= QUEUED:
            self.apply_queued()

    def apply_queued(self) -> None:
        """Apply the events queued so far (ones queued meanwhile wait for the next call); a locker calls this
        when it closes."""
        queued = self._queued
        with self._lock:
            for _ in range(len(queued)):
                counter, timing, seconds = queued.popleft()
                self._counts[counter] += 1
                self._timings[timing].add(seconds, self._rng)
                if self._tally is not None:
                    self._tally.add(counter, timing, seconds)

    def snapshot(self) -> dict[str, Any]:
        self.apply_queued()
        with self._lock:
            out: dict[str, Any] = dict(self._counts)
            for name, reservoir in self._timings.items():
                out[f"{name}_seconds"] = reservoir.summary()
        return out
