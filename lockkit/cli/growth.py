"""How cost grows: ``lockkit bench --growth`` and the repository's ``benchmarks/bench_growth.py``.

Two curves per backend, each point measured the same way whatever the backend:

* **contention** — 1, 2, 4, 8, 16 processes on one name (the harness of :mod:`lockkit.cli.contention`, each
  holding ~1 ms): handoffs per second, acquisitions per second, p50 / p99 wait. With one process there is
  nobody to hand off to, so its wait is the uncontended acquire. Each point is the median of ``runs`` runs.
  Skipped for a backend the processes cannot share (``memory://``).
* **renewal** — 10, 100, 1,000, 10,000, 100,000 locks held with auto-renewal, each count in a fresh process
  (from 1,000 on, a network backend's locks are acquired from 8 threads): CPU time per renewal
  (``time.process_time`` over a hold of a few renewal rounds, divided by the renewals counted in it, which is
  robust to other processes' load), Python memory per held lock (``tracemalloc``, traced over the
  acquisitions and the first renewal round only, so it does not slow the CPU figure), and whether every lock
  was still held at the end. A size is skipped when acquiring it would take longer than ``max_acquire_s`` at
  the rate the previous size was acquired (the report says so).

Per-lock cost should stay flat: a curve that bends names a per-lock cost that grows with the number held.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import gc
import json
import statistics
import subprocess
import sys
import time
import tracemalloc
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import lockkit

from ..errors import ConfigError, LockError
from .contention import ConfigContender
from .contention import contention as run_contention

__all__ = [
    "PROCESSES", "SIZES", "ContentionPoint", "Growth", "RenewalPoint", "growth_table", "measure", "plot_growth",
    "to_json",
]  # fmt: skip

PROCESSES = (1, 2, 4, 8, 16)
SIZES = (10, 100, 1_000, 10_000, 100_000)
RENEW_TTL = 4.5
"""The TTL of the renewal run up to 10,000 locks: renewed every 1.5 s, so a hold of a few seconds spans a few
rounds. Above that the TTL grows with the count (:func:`renew_ttl`)."""


ACQUIRE_THREADS = 8


def renew_ttl(n: int) -> float:
    """The TTL for ``n`` locks: 100,000 locks renewed every 1.5 s would need more CPU than one Python
    process has while it is still acquiring them (one GIL), and they would be lost; what the curve shows is the
    cost *per renewal*, which does not depend on the pace."""
    return max(RENEW_TTL, n * 3e-4)


@dataclass
class ContentionPoint:
    procs: int
    handoffs_per_s: float
    acquisitions_per_s: float
    wait_p50_ms: float
    wait_p99_ms: float
    fairness: float
    runs: int


@dataclass
class RenewalPoint:
    locks: int
    ttl: float
    acquire_s: float
    """Wall time acquiring them (one after another, tracemalloc on)."""
    renewals: int
    """Renewals counted during the hold."""
    cpu_us_per_renewal: float
    bytes_per_lock: float
    """Python memory (tracemalloc) held per lock: the lease, the handle, the renewal book's entry, the driver's."""
    all_held: bool


@dataclass
class Growth:
    backend: str
    url: str
    uncontended_ms_p50: float
    contention: list[ContentionPoint] = field(default_factory=list)
    renewal: list[RenewalPoint] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """Where a curve stops early, and why."""


def _say(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def uncontended_p50(locks: lockkit.Locker, backend: str, rounds: int) -> float:
    prefix = f"growth:u:{uuid.uuid4().hex[:8]}:"
    samples = []
    for i in range(rounds):
        lock = locks.lock(f"{prefix}{i}", ttl=10, backend=backend, auto_renew=False)
        started = time.perf_counter()
        lock.acquire()
        lock.release()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def contention_curve(
    config: dict[str, Any], backend: str, procs: Sequence[int], seconds: float, runs: int
) -> list[ContentionPoint]:
    points = []
    for n in procs:
        done = []
        for _ in range(runs):
            name = f"growth:{uuid.uuid4()}"
            done.append(
                run_contention((config, backend), seconds, procs=n, opener=ConfigContender, label=backend, name=name)
            )
        points.append(
            ContentionPoint(
                n,
                statistics.median(r.handoffs_per_s for r in done),
                statistics.median(r.acquisitions / r.seconds for r in done),
                statistics.median(r.wait_p50_ms for r in done),
                statistics.median(r.wait_p99_ms for r in done),
                statistics.median(r.fairness for r in done),
                runs,
            )
        )
        _say(f"{backend}: {n} process(es): {points[-1].handoffs_per_s:.0f} handoffs/s")
    return points


def _renewals(locks: lockkit.Locker, backend: str) -> int:
    return int(locks.stats()[backend]["renewals"])


def _wait_for(check: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()


def renewal_point(locks: lockkit.Locker, backend: str, n: int, hold: float) -> RenewalPoint:
    """``n`` locks held with auto-renewal for ``hold`` seconds (after their first renewal round)."""
    prefix = f"growth:r:{uuid.uuid4().hex[:8]}:"
    ttl = renew_ttl(n)
    hold = max(hold, ttl / 3 * 1.5)  # at least one renewal round of every lock
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    started = time.monotonic()
    base = _renewals(locks, backend)

    def take(i: int) -> lockkit.Lock:
        lock = locks.lock(f"{prefix}{i}", ttl=ttl, backend=backend)
        lock.acquire()
        return lock

    # Several threads where an acquire waits on a network round trip (ZooKeeper, etcd, five Redlock masters),
    # which would otherwise take most of the run; what is measured is the hold. Not on this host's backends:
    # there eight acquiring threads starved the renewal thread of the GIL, and 10,000 file:// locks were lost.
    local = locks.guarantees()[backend].scope in ("process", "host")
    with concurrent.futures.ThreadPoolExecutor(ACQUIRE_THREADS if n >= 1000 and not local else 1) as pool:
        held = list(pool.map(take, range(n)))
    acquire_s = time.monotonic() - started
    # The book makes its entries at its first look, by the first renewal: count them in
    _wait_for(lambda: _renewals(locks, backend) - base >= n, ttl)
    per_lock = (tracemalloc.get_traced_memory()[0] - before) / n
    tracemalloc.stop()
    renewed0 = _renewals(locks, backend)
    cpu0 = time.process_time()
    time.sleep(hold)
    cpu = time.process_time() - cpu0
    renewals = _renewals(locks, backend) - renewed0
    all_held = all(lock.owned() for lock in held) and all(
        locks.holder(lock.name, backend=backend).held for lock in held[:: max(1, n // 50)]
    )
    for lock in held:
        with contextlib.suppress(lockkit.LockError):  # a lost one is reported by all_held
            lock.release()
    return RenewalPoint(n, ttl, acquire_s, renewals, cpu / max(1, renewals) * 1e6, per_lock, all_held)


def point_in_child(config: dict[str, Any], backend: str, n: int, *, hold: float) -> RenewalPoint:
    """:func:`renewal_point` in a fresh process: what an earlier, smaller point left behind (its garbage, the
    collector's generations, caches) must not be counted against a larger one."""
    args = json.dumps({"config": config, "backend": backend, "locks": n, "hold": hold})
    done = subprocess.run(
        [sys.executable, "-m", "lockkit.cli.growth", args], capture_output=True, text=True, timeout=600, check=False
    )
    if done.returncode:
        # The child's last lines: lockkit's own error (with its advice) or the tail of a traceback.
        raise LockError(
            f"the {n}-lock renewal point on {backend} failed (its process exited {done.returncode}): "
            f"{done.stderr.strip()[-1000:]}\nCheck the backend (lockkit check), or measure fewer locks "
            "(--growth-locks), then run again"
        )
    return RenewalPoint(**json.loads(done.stdout.strip().splitlines()[-1]))


def renewal_curve(
    point: Callable[[int], RenewalPoint], sizes: Sequence[int], max_acquire_s: float
) -> tuple[list[RenewalPoint], list[str]]:
    points: list[RenewalPoint] = []
    notes: list[str] = []
    for n in sizes:
        if points:
            last = points[-1]
            projected = last.acquire_s / last.locks * n
            if projected > max_acquire_s:
                notes.append(
                    f"renewal curve stops at {last.locks:,} locks: acquiring {n:,} would take "
                    f"~{projected:.0f} s at the rate measured ({last.acquire_s / last.locks * 1e3:.2f} ms each)"
                )
                break
        points.append(point(n))
        p = points[-1]
        _say(f"{n} locks: {p.cpu_us_per_renewal:.1f} µs CPU/renewal, {p.bytes_per_lock:.0f} B/lock")
    return points, notes


def measure(
    config: dict[str, Any],
    *,
    procs: Sequence[int] = PROCESSES,
    sizes: Sequence[int] = SIZES,
    seconds: float = 1.5,
    runs: int = 3,
    hold: float = 4.0,
    max_acquire_s: float = 30.0,
    rounds: int = 200,
) -> list[Growth]:
    """Both curves for every backend of ``config`` (as :func:`lockkit.from_config` takes it)."""
    results = []
    with lockkit.from_config(config) as locks:
        for backend, shown in locks.describe().items():
            growth = Growth(backend, shown, uncontended_p50(locks, backend, rounds))
            if locks.guarantees()[backend].scope == "process":
                growth.notes.append("contention curve not measured: processes do not share a process-local backend")
            else:
                growth.contention = contention_curve(config, backend, procs, seconds, runs)
            growth.renewal, notes = renewal_curve(
                functools.partial(point_in_child, config, backend, hold=hold), sizes, max_acquire_s
            )
            growth.notes += notes
            results.append(growth)
    return results


def to_json(results: list[Growth]) -> str:
    return json.dumps([asdict(r) for r in results], indent=2)


def _known(cls: type, item: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {key: value for key, value in item.items() if key in names}


def from_json(text: str) -> list[Growth]:
    """Read back what :func:`to_json` wrote (to plot a saved run again); keys it does not know are ignored."""
    results = []
    for item in json.loads(text):
        contention = [ContentionPoint(**_known(ContentionPoint, p)) for p in item["contention"]]
        renewal = [RenewalPoint(**_known(RenewalPoint, p)) for p in item["renewal"]]
        rest = _known(Growth, item) | {"contention": contention, "renewal": renewal}
        results.append(Growth(**rest))
    return results


def growth_table(results: list[Growth]) -> str:
    lines = []
    for r in results:
        lines.append(f"## {r.backend} ({r.url}): uncontended acquire+release p50 {r.uncontended_ms_p50:.2f} ms")
        if r.contention:
            lines.append(f"{'processes':>10}{'handoffs/s':>12}{'acq/s':>9}{'wait p50':>10}{'wait p99':>10}{'fair':>6}")
            for c in r.contention:
                lines.append(
                    f"{c.procs:>10}{c.handoffs_per_s:>12.0f}{c.acquisitions_per_s:>9.0f}{c.wait_p50_ms:>8.2f}ms"
                    f"{c.wait_p99_ms:>8.2f}ms{c.fairness:>6.2f}"
                )
        if r.renewal:
            lines.append(
                f"{'locks':>10}{'acquire':>10}{'renewals':>10}{'CPU/renewal':>13}{'memory/lock':>13}{'held':>6}"
            )
            for p in r.renewal:
                lines.append(
                    f"{p.locks:>10,}{p.acquire_s:>9.1f}s{p.renewals:>10}{p.cpu_us_per_renewal:>11.1f}µs"
                    f"{p.bytes_per_lock:>12.0f}B{'yes' if p.all_held else 'NO':>6}"
                )
        lines += [f"note: {note}" for note in r.notes]
        lines.append("")
    return "\n".join(lines).rstrip()


def plot_paths(path: str) -> tuple[str, str]:
    """The two pictures ``--plot PATH`` writes: PATH's stem + ``-contention`` and + ``-renewal``."""
    stem, dot, ext = path.rpartition(".")
    if not dot or "/" in ext:
        stem, ext = path, "png"
    return f"{stem}-contention.{ext}", f"{stem}-renewal.{ext}"


def plot_growth(
    results: list[Growth], path: str, floors: dict[str, list[tuple[int, float]]] | None = None
) -> tuple[str, str]:
    """Draw both curves (log-scaled x); returns the two files written (see :func:`plot_paths`). ``floors``: per
    backend, (locks, µs) points of a raw floor to draw dashed next to its renewal CPU."""
    try:
        import matplotlib  # type: ignore[import-not-found,unused-ignore]

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install 'lockkit[plot]'") from None
    from .bench import save_figure

    contention_path, renewal_path = plot_paths(path)
    colour = {r.backend: f"C{i}" for i, r in enumerate(results)}  # one colour per backend in both pictures
    fig, (rate, wait) = plt.subplots(1, 2, figsize=(11, 4.2))
    for r in results:
        if not r.contention:
            continue
        handed = [c for c in r.contention if c.procs > 1]  # one process has nobody to hand off to
        rate.plot(
            [c.procs for c in handed], [c.handoffs_per_s for c in handed], marker="o", label=r.backend,
            color=colour[r.backend],
        )  # fmt: skip
        wait.plot(
            [c.procs for c in r.contention], [c.wait_p50_ms for c in r.contention], marker="o", label=r.backend,
            color=colour[r.backend],
        )  # fmt: skip
    for ax, title, unit in (
        (rate, "handoffs per second", "handoffs / s"),
        (wait, "median wait to acquire (1 process: uncontended)", "ms (log)"),
    ):
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(PROCESSES), [str(p) for p in PROCESSES])
        ax.set_xlabel("contending processes (one name, ~1 ms hold)")
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.grid(alpha=0.3)
    wait.set_yscale("log")
    rate.legend()
    fig.tight_layout()
    save_figure(fig, contention_path, 110)
    plt.close(fig)
    fig, (cpu, mem) = plt.subplots(1, 2, figsize=(11, 4.2))
    for r in results:
        xs = [p.locks for p in r.renewal]
        shade = colour[r.backend]
        cpu.plot(xs, [p.cpu_us_per_renewal for p in r.renewal], marker="o", label=r.backend, color=shade)
        floor = (floors or {}).get(r.backend)
        if floor:
            cpu.plot(
                [x for x, _ in floor], [y for _, y in floor], linestyle="--", color=shade,
                label=f"{r.backend}: raw PEXPIRE pipeline",
            )  # fmt: skip
        mem.plot(xs, [p.bytes_per_lock / 1024 for p in r.renewal], marker="o", label=r.backend, color=shade)
    for ax, title, unit in (
        (cpu, "renewal CPU per lock per renewal", "µs of process CPU (log)"),
        (mem, "Python memory per held lock", "KiB (tracemalloc)"),
    ):
        ax.set_xscale("log")
        ax.set_xlabel("locks held with auto-renewal in one process")
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.grid(alpha=0.3)
    cpu.set_yscale("log")
    cpu.legend()
    fig.tight_layout()
    save_figure(fig, renewal_path, 110)
    plt.close(fig)
    return contention_path, renewal_path


def _child(argv: list[str]) -> int:
    """``python -m lockkit.cli.growth '{"config": …, "backend": …, "locks": N, "hold": S}'``: one renewal point,
    printed as JSON (see :func:`point_in_child`)."""
    job = json.loads(argv[0])
    with lockkit.from_config(job["config"]) as locks:
        result = renewal_point(locks, job["backend"], job["locks"], job["hold"])
    print(json.dumps(asdict(result)))
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1:]))
