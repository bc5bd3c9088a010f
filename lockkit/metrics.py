"""Per-backend counters and histograms, readable as ``locker.stats()`` and exported to Prometheus.

The figures are kept in-process (a bounded reservoir per histogram, so memory
stays flat under millions of acquisitions) and, when ``prometheus_client`` is
installed (``pip install 'lockkit[metrics]'``), exported as ``lockkit_*``
metrics labelled by backend name and read at scrape time. The collector is
registered in ``prometheus_client.REGISTRY`` when the process opens its first
backend (docs/metrics.md). Lock names are not used as labels: a label per name
would grow without bound.

Prefork servers (gunicorn, uWSGI) run one registry per worker:
:mod:`lockkit.metrics_multiprocess` writes each process's totals to a file
and sums them at scrape time.
"""

from __future__ import annotations

import bisect
import math
import os
import random
import threading
import weakref
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError

__all__ = ["COUNTERS", "HISTOGRAMS", "BackendStats", "Histogram", "Totals", "families"]

COUNTERS: dict[str, str] = {
    "acquisitions": "Locks acquired.",
    "timeouts": "Acquisitions that gave up because the lock stayed held (a try_acquire that finds it held counts).",
    "errors": "Acquire, release and renew calls that failed with a LockError (the backend could not be used).",
    "renewals": "Successful lease renewals, automatic or by renew().",
    "renewal_failures": "Renewals that failed (an error, no answer); retried until the lease's deadline.",
    "losses": "Leases lost while held: expired, taken over, refused at renewal or release, or their locker closed.",
    "releases": "Locks released while still ours.",
}
"""Counter name -> help text; exported as ``lockkit_<name>_total``."""

SECONDS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
"""Bounds of the time histograms (prometheus_client's defaults)."""
SHARES = (0.1, 0.25, 0.5, 0.75, 0.9, 1.0, 2.0)
"""Bounds of the TTL-used histogram: a third is where renewal starts, 1 is where the lease runs out."""


@dataclass(frozen=True)
class Histogram:
    """One observed quantity: a reservoir in ``stats()``, fixed buckets in Prometheus (which sum across processes)."""

    name: str
    unit: str
    buckets: tuple[float, ...]
    help: str

    @property
    def key(self) -> str:
        """The ``stats()`` key, and the exported family after ``lockkit_``."""
        return f"{self.name}_{self.unit}"


HISTOGRAMS: dict[str, Histogram] = {
    h.name: h
    for h in (
        Histogram("wait", "seconds", SECONDS, "Time from asking for a lock to holding it (successful acquisitions)."),
        Histogram("hold", "seconds", SECONDS, "Time from acquiring a lock to releasing it (or failing to)."),
        Histogram(
            "ttl_used",
            "ratio",
            SHARES,
            "Share of the lease's TTL gone at release, counted from its grant or last renewal; 1 means it had run out.",
        ),
    )
}
_BOUNDS = {name: h.buckets for name, h in HISTOGRAMS.items()}  # one lookup less per observation
RESERVOIR = 2048
QUEUED = 256
"""Hot-path events queued before they are applied (see BackendStats); the caller that applies them holds the
process-wide export lock meanwhile, so this stays small."""

Event = tuple[str | None, str, float]
"""A queued event (other than an acquisition's or a release's): the counter it adds one to (or none), the
histogram it observes, the value."""
End = tuple[bool, float, float | None]
"""A queued release: whether it counts as one (still ours), its hold time, its share of the TTL used (or none)."""


class _Queue:
    """The hot-path events of one stats object, waiting to be applied (see :class:`BackendStats`).

    One deque per kind, so that the hot path appends one float (an acquisition: its count and its wait) or one
    tuple (a release: its count, hold time and TTL share), and applying them is a pass per histogram rather
    than a dispatch per event (issue 17). ``deque.append`` is atomic: no lock where they are queued.
    """

    __slots__ = ("ends", "other", "waits")

    def __init__(self) -> None:
        self.waits: deque[float] = deque()
        self.ends: deque[End] = deque()
        self.other: deque[Event] = deque()

    def __bool__(self) -> bool:
        return bool(self.waits or self.ends or self.other)

    def clear(self) -> None:
        self.waits.clear()
        self.ends.clear()
        self.other.clear()

    def drain(self) -> tuple[list[float], list[End], list[Event]]:
        """What was queued so far, oldest first; what is queued meanwhile waits for the next drain."""
        return _drain(self.waits), _drain(self.ends), _drain(self.other)


def _drain(queued: deque[Any]) -> list[Any]:
    take = queued.popleft
    return [take() for _ in range(len(queued))]


@dataclass
class _Reservoir:
    """Uniform sample of at most RESERVOIR observations (Li's algorithm L).

    Once full, it draws how many observations to skip before the next replacement instead of drawing for each
    one (algorithm R): a random number per observation was half the cost of applying it.
    """

    values: list[float] = field(default_factory=list)
    seen: int = 0
    total: float = 0.0
    _w: float = 1.0
    _next: int = 0  # the 1-based number of the next observation that replaces a sampled one

    def add_many(self, values: list[float], rng: random.Random) -> None:
        """:meth:`add` each of ``values`` in turn (the same sample from the same ``rng``), with no call per value."""
        self.total += sum(values)
        sample, n = self.values, len(values)
        i = min(n, RESERVOIR - len(sample))
        if i > 0:
            sample.extend(values[:i])
            self.seen += i
            if len(sample) == RESERVOIR:
                self._skip(rng)
        while i < n:
            at = i + self._next - self.seen - 1  # the index of the next value that replaces a sampled one
            if at >= n:
                self.seen += n - i
                return
            self.seen += at - i + 1
            sample[rng.randrange(RESERVOIR)] = values[at]
            self._skip(rng)
            i = at + 1

    def add(self, value: float, rng: random.Random) -> None:
        self.seen += 1
        self.total += value
        if len(self.values) < RESERVOIR:
            self.values.append(value)
            if len(self.values) == RESERVOIR:
                self._skip(rng)
        elif self.seen == self._next:
            self.values[rng.randrange(RESERVOIR)] = value
            self._skip(rng)

    def _skip(self, rng: random.Random) -> None:
        # 1 - random() is in (0, 1]: log() never sees 0.
        self._w *= math.exp(math.log(1.0 - rng.random()) / RESERVOIR)
        self._next = self.seen + int(math.log(1.0 - rng.random()) / math.log1p(-self._w)) + 1

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


_WRITER = "; read it with the lockkit version that wrote it"
"""The way out of :meth:`Totals.from_json`'s refusals: the figures' layout is one version's."""


class Totals:
    """What Prometheus sees of one backend label: counts, histogram buckets (not cumulative) and sums.

    In a process, the totals over every locker; they only grow. The multi-process files store one per backend
    and the collector sums them (:meth:`merge`).
    """

    def __init__(self) -> None:
        self.counts = dict.fromkeys(COUNTERS, 0)
        self.buckets = {name: [0] * (len(h.buckets) + 1) for name, h in HISTOGRAMS.items()}
        self.sums = dict.fromkeys(HISTOGRAMS, 0.0)

    def observe(self, name: str, value: float) -> None:
        self.buckets[name][bisect.bisect_left(_BOUNDS[name], value)] += 1
        self.sums[name] += value

    def add(self, counter: str | None, name: str, value: float) -> None:
        """One queued event."""
        if counter is not None:
            self.counts[counter] += 1
        self.observe(name, value)

    def observe_many(self, name: str, values: list[float]) -> None:
        bounds, hits, find = _BOUNDS[name], self.buckets[name], bisect.bisect_left
        for value in values:
            hits[find(bounds, value)] += 1
        self.sums[name] += sum(values)

    def merge(self, other: Totals) -> None:
        for name, n in other.counts.items():
            self.counts[name] += n
        for name, hits in other.buckets.items():
            self.buckets[name] = [a + b for a, b in zip(self.buckets[name], hits, strict=True)]
        for name, total in other.sums.items():
            self.sums[name] += total

    def copy(self) -> Totals:
        out = Totals()
        out.merge(self)
        return out

    def reset(self) -> None:
        """Back to zero, in place: every stats object of the backend holds this one."""
        for name in self.counts:
            self.counts[name] = 0
        for hits in self.buckets.values():
            hits[:] = [0] * len(hits)
        for name in self.sums:
            self.sums[name] = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"counts": self.counts, "buckets": self.buckets, "sums": self.sums}

    @classmethod
    def from_json(cls, data: Any) -> Totals:
        """The inverse of :meth:`to_json`; :class:`~lockkit.ConfigError` (a ``ValueError``) if it is not one (names
        or bucket counts differ: written by another lockkit version)."""
        out = cls()
        try:
            counts, buckets, sums = data["counts"], data["buckets"], data["sums"]
            if set(counts) != set(out.counts) or set(buckets) != set(out.buckets) or set(sums) != set(out.sums):
                raise ConfigError(f"other metrics: {sorted(counts)}, {sorted(buckets)}{_WRITER}")
            for name in out.counts:
                out.counts[name] = int(counts[name])
            for name, hits in out.buckets.items():
                if len(buckets[name]) != len(hits):
                    raise ConfigError(f"{name}: {len(buckets[name])} buckets, not {len(hits)}{_WRITER}")
                out.buckets[name] = [int(n) for n in buckets[name]]
            for name in out.sums:
                out.sums[name] = float(sums[name])
        except ConfigError:
            raise
        except (KeyError, TypeError, ValueError) as exc:  # a missing table, a list for a dict, int("x")
            raise ConfigError(f"not lockkit totals: {exc!r}{_WRITER}") from None
        return out


def families(rows: Iterable[tuple[str, Totals]]) -> Iterator[Any]:
    """The ``lockkit_*`` metric families of some totals by backend label: one counter or histogram each."""
    from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

    rows = list(rows)
    for name, help_text in COUNTERS.items():
        family = CounterMetricFamily(f"lockkit_{name}", help_text, labels=["backend"])
        for backend, totals in rows:
            family.add_metric([backend], totals.counts[name])
        yield family
    for name, h in HISTOGRAMS.items():
        histogram = HistogramMetricFamily(f"lockkit_{h.key}", h.help, labels=["backend"])
        for backend, totals in rows:
            cumulative, running = [], 0
            for bound, hits in zip((*map(str, h.buckets), "+Inf"), totals.buckets[name], strict=True):
                running += hits
                cumulative.append((bound, running))
            histogram.add_metric([backend], cumulative, totals.sums[name])
        yield histogram


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
        self.tallies: dict[str, Totals] = {}
        self.sources: weakref.WeakSet[BackendStats] = weakref.WeakSet()
        """Stats objects feeding the tallies: their queued events are applied before a scrape reads them."""

    @classmethod
    def tally(cls, backend: str, source: BackendStats) -> Totals | None:
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
                directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
                if directory:  # read here, like prometheus_client reads it when its metrics are made
                    from .metrics_multiprocess import enable

                    enable(directory)
            if cls._instance is None:
                return None
            cls._instance.sources.add(source)
            return cls._instance.tallies.setdefault(backend, Totals())

    @classmethod
    def totals(cls) -> dict[str, Totals]:
        """A copy of every tally, with all events queued so far applied."""
        instance = cls._instance
        if instance is None:
            return {}
        with cls._guard:  # tally() adds to the set under it
            sources = list(instance.sources)
            while _orphans:
                queued, tally = _orphans.popleft()
                _apply(queued, tally)
        for source in sources:
            source.apply_queued()
        with cls._guard:
            return {backend: tally.copy() for backend, tally in instance.tallies.items()}

    @classmethod
    def forget_parent(cls) -> None:
        """In a forked child: zero the tallies and drop the queued events, which are the parent's to count.

        Only for the multi-process files, which sum every process: the child's must not repeat its parent's.
        """
        instance = cls._instance
        if instance is None:
            return
        with cls._guard:
            _orphans.clear()
            for source in instance.sources:
                source._queue.clear()
            for tally in instance.tallies.values():
                tally.reset()

    def describe(self) -> list[Any]:
        return []  # the families appear at the first scrape; nothing to check for clashes before

    def collect(self) -> Iterator[Any]:
        yield from families(self.totals().items())


_orphans: deque[tuple[_Queue, Totals]] = deque()
"""Queues of collected stats objects, applied to their tallies at the next scrape."""


def _orphaned(queued: _Queue, tally: Totals) -> None:
    # A finalizer runs wherever the garbage collector does, possibly inside code that holds the export lock:
    # so it takes no lock, it only hands the queue over (deque.append is atomic).
    if queued:
        _orphans.append((queued, tally))


_held_for_fork = False


def _before_fork() -> None:
    # A fork while another thread holds the export lock would leave it held for ever in the child, whose first
    # count or scrape would then hang (a gunicorn worker forked while the master scrapes): hold it across fork.
    # With a timeout, in case the forking thread is the holder (a fork from a collector): then it is left alone.
    global _held_for_fork
    _held_for_fork = _Exporter._guard.acquire(timeout=5)


def _after_fork() -> None:
    global _held_for_fork
    if _held_for_fork:
        _held_for_fork = False
        _Exporter._guard.release()


if hasattr(os, "register_at_fork"):  # not on Windows, where there is no fork
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork, after_in_child=_after_fork)


class BackendStats:
    """Thread-safe counters and histograms of one backend of a locker.

    The hot path (an acquisition with its wait, a release with its hold time) only appends to a
    queue, which is applied when someone reads (``snapshot``, a Prometheus scrape) or when it grows
    long: updating the counters, the reservoir and the export tally under a lock on every
    acquire and release cost several microseconds of a loopback round trip's ~150.
    """

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self._counts = dict.fromkeys(COUNTERS, 0)
        self._samples = {name: _Reservoir() for name in HISTOGRAMS}
        self._rng = random.Random()
        self._queue = _Queue()
        self._waits = self._queue.waits  # the two hot-path queues, one attribute away
        self._ends = self._queue.ends
        self._tally = _Exporter.tally(backend, self)
        self._lock = _Exporter._guard if self._tally is not None else threading.Lock()
        if self._tally is not None:  # events still queued when this is dropped must reach Prometheus all the same
            weakref.finalize(self, _orphaned, self._queue, self._tally)

    def acquired(self, wait: float) -> None:
        """An acquisition and its wait, counted later (see the class)."""
        waits = self._waits
        waits.append(wait)
        if len(waits) >= QUEUED:
            self.apply_queued()

    def ended(self, released: bool, hold: float, ttl_used: float | None) -> None:
        """A lease's end, counted later (see the class): a release (``released``: it was still ours, counted in
        ``releases``) or a failed one, its hold time and the share of its TTL gone (``ttl_used``)."""
        ends = self._ends
        ends.append((released, hold, ttl_used))
        if len(ends) >= QUEUED:
            self.apply_queued()

    def count(self, counter: str, n: int = 1) -> None:
        with self._lock:
            self._counts[counter] += n
            if self._tally is not None:
                self._tally.counts[counter] += n

    def observe(self, name: str, value: float) -> None:
        with self._lock:
            self._samples[name].add(value, self._rng)
            if self._tally is not None:
                self._tally.observe(name, value)

    def count_loss(self, lease: object) -> None:
        """An on-lost callback: the backend registers it on every lease it tracks (one count per lease)."""
        self.count("losses")

    def apply_queued(self) -> None:
        """Apply the events queued so far (ones queued meanwhile wait for the next call); a locker calls this
        when it closes."""
        with self._lock:
            _apply(self._queue, self._tally, self._counts, self._samples, self._rng)

    def snapshot(self) -> dict[str, Any]:
        self.apply_queued()
        with self._lock:
            out: dict[str, Any] = dict(self._counts)
            for name, reservoir in self._samples.items():
                out[HISTOGRAMS[name].key] = reservoir.summary()
        return out


def _apply(
    queue: _Queue,
    tally: Totals | None,
    counts: dict[str, int] | None = None,
    samples: dict[str, _Reservoir] | None = None,
    rng: random.Random | None = None,
) -> None:
    """Apply what ``queue`` holds to the export ``tally`` and (when given) a stats object's own counts and
    reservoirs; under the stats object's lock (an orphaned queue: the export lock)."""
    waits, ends, other = queue.drain()
    observed: list[tuple[str, list[float]]] = []
    counted: list[tuple[str, int]] = []
    if waits:
        counted.append(("acquisitions", len(waits)))
        observed.append(("wait", waits))
    if ends:
        counted.append(("releases", sum(1 for released, _, _ in ends if released)))
        observed.append(("hold", [hold for _, hold, _ in ends]))
        observed.append(("ttl_used", [used for _, _, used in ends if used is not None]))
    for counter, n in counted:
        if counts is not None:
            counts[counter] += n
        if tally is not None:
            tally.counts[counter] += n
    for name, values in observed:
        if samples is not None and rng is not None:
            samples[name].add_many(values, rng)
        if tally is not None:
            tally.observe_many(name, values)
    for event, histogram, value in other:
        if event is not None and counts is not None:
            counts[event] += 1
        if samples is not None and rng is not None:
            samples[histogram].add(value, rng)
        if tally is not None:
            tally.add(event, histogram, value)
