"""Per-backend counters and timing quantiles, readable as ``locker.stats()``.

The figures are kept in-process (a bounded reservoir per timing, so memory
stays flat under millions of acquisitions) and, when ``prometheus_client`` is
installed (``pip install 'lockkit[metrics]'``), exported as ``lockkit_*``
metrics labelled by backend name. Lock names are not used as labels: a label
per name would grow without bound.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BackendStats"]

COUNTERS = ("acquisitions", "timeouts", "errors", "renewals", "renewal_failures", "losses", "releases")
TIMINGS = ("wait", "hold")
RESERVOIR = 2048


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


class _Prometheus:
    """Mirror of the counters into prometheus_client, created once per process."""

    _instance: _Prometheus | None = None
    _guard = threading.Lock()

    def __init__(self, client: Any) -> None:
        self.counters = {
            name: client.Counter(f"lockkit_{name}_total", f"lockkit {name.replace('_', ' ')}", ["backend"])
            for name in COUNTERS
        }
        self.timings = {
            name: client.Histogram(f"lockkit_{name}_seconds", f"lockkit {name} time", ["backend"]) for name in TIMINGS
        }

    @classmethod
    def get(cls) -> _Prometheus | None:
        with cls._guard:
            if cls._instance is None:
                try:
                    import prometheus_client
                except ImportError:
                    return None
                cls._instance = cls(prometheus_client)
            return cls._instance


class BackendStats:
    """Thread-safe counters and timings of one backend of a locker."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(COUNTERS, 0)
        self._timings = {name: _Reservoir() for name in TIMINGS}
        self._rng = random.Random()
        prom = _Prometheus.get()
        # Children bound to this backend's label once: labels() on every call costs more than the count.
        self._prom_counters = {c: prom.counters[c].labels(backend) for c in COUNTERS} if prom else None
        self._prom_timings = {t: prom.timings[t].labels(backend) for t in TIMINGS} if prom else None

    def count(self, counter: str, n: int = 1) -> None:
        with self._lock:
            self._counts[counter] += n
        if self._prom_counters is not None:
            self._prom_counters[counter].inc(n)

    def observe(self, timing: str, seconds: float) -> None:
        with self._lock:
            self._timings[timing].add(seconds, self._rng)
        if self._prom_timings is not None:
            self._prom_timings[timing].observe(seconds)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            out: dict[str, Any] = dict(self._counts)
            for name, reservoir in self._timings.items():
                out[f"{name}_seconds"] = reservoir.summary()
        return out
