"""What bench_redis.py, bench_etcd.py and bench_zookeeper.py share: interleaved timing and the CLI scaffolding.

The contention harness (4 processes, start barrier, ~1 ms busy hold, handoffs / fairness / waits / token
order) is :mod:`lockkit.cli.contention`, the same one ``lockkit bench`` runs; it is re-exported here. Each
benchmark puts the repository root on ``sys.path`` before importing this module, and ``spawn`` hands the
parent's ``sys.path`` to the contending children, so an opener defined in a benchmark module (kazoo's
``Lock`` in bench_zookeeper.py) is importable there.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

from lockkit.cli.contention import Contender, Contention, LockkitContender, contention, pct

__all__ = [
    "Contender", "Contention", "LockkitContender", "contention", "driver_args", "hosts", "interleave",
    "latency_table", "pct", "run_driver", "served", "show",
]  # fmt: skip

# --- uncontended latency ----------------------------------------------------------------------------------


def interleave(ops: dict[str, Callable[[], object]], rounds: int, block: int = 20) -> dict[str, list[float]]:
    """Time each op ``rounds`` times, in alternating blocks of ``block`` so that load drift hits all alike."""
    samples: dict[str, list[float]] = {label: [] for label in ops}
    while min(len(s) for s in samples.values()) < rounds:
        for label, op in ops.items():
            for _ in range(block):
                started = time.perf_counter()
                op()
                samples[label].append(time.perf_counter() - started)
    return samples


def latency_table(samples: dict[str, list[float]], unit: str = "ms", against: dict[str, str] | None = None) -> str:
    """A ``##`` heading, then median, p99 and ratio of medians per label: to the row ``against`` names for the
    label (its own floor), else to the first row (the raw floor)."""
    scale, digits = {"ms": (1e3, 3), "µs": (1e6, 0)}[unit]
    width = max(len(label) for label in samples)
    first = next(iter(samples))
    medians = {label: statistics.median(values) for label, values in samples.items()}
    against = against or {}
    count = len(next(iter(samples.values())))
    lines = [
        f"## Uncontended acquire+release ({unit} per operation, {count} each, interleaved)",
        f"{'':{width}} {'median':>8} {'p99':>8} {'ratio':>6}",
    ]
    for label, values in samples.items():
        med, base = medians[label], against.get(label, first)
        line = f"{label:{width}} {med * scale:8.{digits}f} {pct(values, 0.99) * scale:8.{digits}f} "
        line += f"{med / medians[base]:6.2f}" + (f" (of {base})" if base != first else "")
        lines.append(line)
    return "\n".join(lines)


# --- CLI scaffolding of the etcd and ZooKeeper benchmarks ---------------------------------------------------


def driver_args(doc: str, argv: list[str] | None = None) -> argparse.Namespace:
    """``--url --rounds --many --hold --contend --procs``, as bench_etcd.py and bench_zookeeper.py take them."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="an existing server; without it a throw-away one is started on loopback")
    parser.add_argument("--rounds", type=int, default=2000, help="uncontended acquire+release per variant")
    parser.add_argument("--many", type=int, default=10_000, help="locks held in the scale run")
    parser.add_argument("--hold", type=float, default=10.0, help="seconds the scale run holds them")
    parser.add_argument("--contend", type=float, default=5.0, help="seconds of the contention run")
    parser.add_argument("--procs", type=int, default=4, help="contending processes")
    return parser.parse_args(argv)


def run_driver(
    doc: str,
    server: Callable[[], Any],
    sections: Callable[[argparse.Namespace, str], Iterator[str]],
    argv: list[str] | None = None,
) -> None:
    """Parse :func:`driver_args`, serve (:func:`served`), print each section ``sections(args, url)`` yields."""
    args = driver_args(doc, argv)
    with served(args.url, server) as url:
        for i, section in enumerate(sections(args, url)):
            print(("\n" if i else "") + section, flush=True)


@contextlib.contextmanager
def served(url: str | None, server: Callable[[], Any]) -> Iterator[str]:
    """``url`` as given, or the URL of a throw-away ``server()`` started for the duration."""
    if url is not None:
        yield url
        return
    started = server().start()
    try:
        yield started.url
    finally:
        started.stop()


def hosts(url: str) -> str:
    """The ``host:port[,host:port]`` part of a backend URL (credentials, path and query dropped)."""
    return url.split("://", 1)[1].split("/")[0].split("?")[0].rpartition("@")[2]


def show(label: str, result: dict[str, Any]) -> str:
    """``label: key=value, ...`` with ints as ints, floats to 2 places, bools as yes/no."""

    def fmt(value: Any) -> str:
        if isinstance(value, bool):
            return "yes" if value else "no"
        if isinstance(value, float):
            return f"{value:.2f}"
        return str(value)

    return f"{label}: " + ", ".join(f"{key}={fmt(value)}" for key, value in result.items())
