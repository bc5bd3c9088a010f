"""``lockkit bench``: the numbers a team needs to choose a backend, measured on its own servers.

For each backend (a ``--url``, or every configured backend):

* **uncontended** — acquire + release of fresh names, one after another: median and p99 latency;
* **contention** — N processes on one name, each holding about 1 ms (:mod:`lockkit.cli.contention`, the harness
  the repository's benchmarks use too): handoffs per second (an acquisition by a different process than the
  previous holder), fairness (fewest / most acquisitions per process) and the p99 wait;
* **renewal** — K locks held with auto-renewal for a few seconds in one process: whether every lock is still
  held at the end, the CPU time the renewals cost, and the threads lockkit used.

``--growth`` measures how these costs grow instead (:mod:`lockkit.cli.growth`): handoffs and waits against the
number of contending processes, renewal CPU and memory per lock against the number held; ``--plot`` then
draws the two curves.

Benchmarks against the raw server commands and other libraries live in the repository's ``benchmarks/``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any

import lockkit

from ..errors import ConfigError, LockError
from .contention import ConfigContender, Contention
from .contention import contention as run_contention


@dataclass
class BenchResult:
    backend: str
    url: str
    uncontended_ms_p50: float
    uncontended_ms_p99: float
    handoffs_per_s: float | None
    """``None`` where processes cannot share the backend (``memory://``)."""
    fairness: float | None
    wait_ms_p99: float | None
    tokens_in_order: bool | None
    """Fencing tokens rose in acquisition order under contention; ``None``: not measured, or no fencing."""
    contention_error: str | None
    """Why the contention run failed (the other measures stand), or ``None``."""
    renewal_locks: int
    renewal_all_held: bool
    renewal_cpu_s: float
    renewal_threads: int


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _progress(label: str, done: int, total: int) -> None:
    if sys.stderr.isatty():
        width = 30
        filled = int(width * done / max(1, total))
        sys.stderr.write(f"\r{label:<28} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
        if done >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def uncontended(locks: lockkit.Locker, backend: str, rounds: int) -> list[float]:
    prefix = f"bench:{uuid.uuid4().hex[:8]}:"
    samples = []
    for i in range(rounds):
        lock = locks.lock(f"{prefix}{i}", ttl=10, backend=backend, auto_renew=False)
        start = time.perf_counter()
        lock.acquire()
        lock.release()
        samples.append((time.perf_counter() - start) * 1000)
        _progress(f"{backend}: uncontended", i + 1, rounds)
    return samples


def contention(config: dict[str, Any], backend: str, processes: int, seconds: float) -> Contention:
    """The shared harness (:mod:`lockkit.cli.contention`), on one configured backend."""
    _progress(f"{backend}: contention", 0, 1)
    result = run_contention(
        (config, backend), seconds, procs=processes, opener=ConfigContender, label=backend, name=f"bench:{uuid.uuid4()}"
    )
    _progress(f"{backend}: contention", 1, 1)
    return result


def renewal(locks: lockkit.Locker, backend: str, count: int, seconds: float) -> tuple[bool, float, int]:
    prefix = f"bench:renew:{uuid.uuid4().hex[:8]}:"
    held = []
    for i in range(count):
        lock = locks.lock(f"{prefix}{i}", ttl=2, backend=backend)
        lock.acquire()
        held.append(lock)
        if i % 100 == 0:
            _progress(f"{backend}: taking locks", i, count)
    _progress(f"{backend}: taking locks", count, count)
    cpu0 = time.process_time()
    time.sleep(seconds)
    cpu = time.process_time() - cpu0
    all_held = all(lock.owned() for lock in held) and all(
        locks.holder(lock.name, backend=backend).held for lock in held[:: max(1, count // 100)]
    )
    threads = sum(1 for t in threading.enumerate() if t.name.startswith("lockkit"))
    for lock in held:
        lock.release()
    return all_held, cpu, threads


def run(
    config: dict[str, Any], *, rounds: int, processes: int, seconds: float, renew_locks: int, renew_seconds: float
) -> list[BenchResult]:
    results = []
    with lockkit.from_config(config) as locks:
        for backend, shown in locks.describe().items():
            lat = uncontended(locks, backend, rounds)
            rate: float | None = None
            fairness: float | None = None
            wait_p99: float | None = None
            in_order: bool | None = None
            failure: str | None = None
            if locks.guarantees()[backend].scope != "process":  # processes would not even share memory://
                try:
                    contended = contention(config, backend, processes, seconds)
                except LockError as exc:  # one backend's broken run must not lose the others' results
                    failure = str(exc)
                    sys.stderr.write(f"lockkit bench: {failure}\n")
                else:
                    rate, fairness, wait_p99 = contended.handoffs_per_s, contended.fairness, contended.wait_p99_ms
                    in_order = contended.tokens_in_order
            all_held, cpu, threads = renewal(locks, backend, renew_locks, renew_seconds)
            results.append(
                BenchResult(
                    backend,
                    shown,
                    statistics.median(lat),
                    _quantile(lat, 0.99),
                    rate,
                    fairness,
                    wait_p99,
                    in_order,
                    failure,
                    renew_locks,
                    all_held,
                    cpu,
                    threads,
                )
            )
    return results


def table(results: list[BenchResult]) -> str:
    header = (
        f"{'backend':<12}{'acq+rel p50':>12}{'p99':>9}{'handoffs/s':>12}{'fairness':>10}{'wait p99':>10}"
        f"{'tokens':>8}{'renewal':>22}"
    )
    lines = [header, "-" * len(header)]
    for r in results:
        renew = f"{r.renewal_locks} {'held' if r.renewal_all_held else 'LOST'} {r.renewal_cpu_s:.2f}cpu-s"
        rate = "-" if r.handoffs_per_s is None else f"{r.handoffs_per_s:.0f}"
        fair = "-" if r.fairness is None else f"{r.fairness:.2f}"
        wait = "-" if r.wait_ms_p99 is None else f"{r.wait_ms_p99:.1f}ms"
        tokens = "-" if r.tokens_in_order is None else "rising" if r.tokens_in_order else "DISORDER"
        if r.contention_error is not None:
            rate = fair = wait = tokens = "failed"
        lines.append(
            f"{r.backend:<12}{r.uncontended_ms_p50:>10.2f}ms{r.uncontended_ms_p99:>7.2f}ms"
            f"{rate:>12}{fair:>10}{wait:>10}{tokens:>8}{renew:>22}"
        )
    failures = [f"{r.backend}: contention failed: {r.contention_error}" for r in results if r.contention_error]
    notes = ["tokens: fencing tokens in acquisition order under contention (- : not measured, or no fencing)"]
    return "\n".join(lines + notes + failures)


def to_json(results: list[BenchResult]) -> str:
    return json.dumps([asdict(r) for r in results], indent=2)


def check_plot_path(path: str) -> None:
    """Refuse a ``--plot`` path whose directory cannot take the picture, before a run of minutes, not after."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory) or not os.access(directory, os.W_OK | os.X_OK):
        raise ConfigError(
            f"cannot write --plot {path!r}: {directory} is not a writable directory; create it, or give another path"
        )


def save_figure(fig: Any, path: str, dpi: int) -> None:
    """``fig.savefig``, with a file-system failure told as what to fix."""
    try:
        fig.savefig(path, dpi=dpi)
    except OSError as exc:
        raise ConfigError(
            f"cannot write --plot {path!r}: {exc.strerror or exc}; give a path in a writable directory"
        ) from exc


def plot(results: list[BenchResult], path: str) -> None:
    try:
        import matplotlib  # type: ignore[import-not-found,unused-ignore]

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install 'lockkit[plot]'") from None
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    names = [r.backend for r in results]
    left.bar(names, [r.uncontended_ms_p50 for r in results], label="median")
    left.scatter(names, [r.uncontended_ms_p99 for r in results], color="black", label="p99", zorder=3)
    left.set_ylabel("acquire + release (ms)")
    left.set_title("uncontended latency")
    left.legend()
    right.bar(names, [r.handoffs_per_s or 0.0 for r in results], color="tab:green")
    right.set_ylabel("handoffs / s")
    right.set_title("contention (processes on one name)")
    fig.tight_layout()
    save_figure(fig, path, 120)


# --- lockkit bench --growth -----------------------------------------------------------------------------------


def int_list(text: str) -> tuple[int, ...]:
    """``"1,2,4"`` → ``(1, 2, 4)``: positive integers, comma-separated (an argparse type)."""
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated whole numbers such as 1,2,4, got {text!r}"
        ) from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"every number must be at least 1, got {text!r}")
    return values


def positive_int(text: str) -> int:
    values = int_list(text)
    if len(values) != 1:
        raise argparse.ArgumentTypeError(f"expected one whole number, got {text!r}")
    return values[0]


def seconds_arg(text: str, *, zero: bool = True) -> float:
    """A finite number of seconds, ≥ 0 (an argparse type): NaN or a negative length failed deep in a run."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds such as 1.5, got {text!r}") from None
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        raise argparse.ArgumentTypeError(
            f"must be a finite number of seconds {'at least' if zero else 'above'} 0, got {text!r}"
        )
    return value


def positive_seconds_arg(text: str) -> float:
    """A finite number of seconds, > 0 (an argparse type): a run of no time has no rate."""
    return seconds_arg(text, zero=False)


def add_growth_arguments(parser: argparse.ArgumentParser) -> None:
    from .growth import PROCESSES, SIZES

    group = parser.add_argument_group("growth curves (--growth)")
    group.add_argument(
        "--growth", action="store_true", help="measure how cost grows with processes and with locks held instead"
    )
    group.add_argument(
        "--growth-processes", type=int_list, default=PROCESSES, metavar="N,N,…", help="default 1,2,4,8,16"
    )
    group.add_argument(
        "--growth-locks", type=int_list, default=SIZES, metavar="N,N,…", help="default 10,100,1000,10000,100000"
    )
    group.add_argument("--growth-runs", type=positive_int, default=3, help="runs per contention point, median (3)")
    group.add_argument(
        "--growth-hold",
        type=seconds_arg,
        default=4.0,
        metavar="SECONDS",
        help="how long each renewal point is held (4)",
    )
    group.add_argument(
        "--growth-max-acquire",
        type=seconds_arg,
        metavar="SECONDS",
        default=30.0,
        help="skip a lock count whose acquisition would take longer than this (30)",
    )


def growth_command(config: dict[str, Any], args: argparse.Namespace) -> int:
    """``lockkit bench --growth``: both curves for each backend; exit 1 if a lock was lost while renewed."""
    from . import growth

    results = growth.measure(
        config,
        procs=args.growth_processes,
        sizes=args.growth_locks,
        seconds=args.seconds,
        runs=args.growth_runs,
        hold=args.growth_hold,
        max_acquire_s=args.growth_max_acquire,
        rounds=args.rounds,
    )
    print(growth.to_json(results) if args.json else growth.growth_table(results))
    if args.plot:
        for path in growth.plot_growth(results, args.plot):
            print(f"plot written to {path}", file=sys.stderr)
    return 1 if any(not p.all_held for r in results for p in r.renewal) else 0
