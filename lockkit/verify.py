"""``lockkit verify``: a self-test of a real deployment, with real processes and optional faults.

N worker processes contend on one lock name. Each, while holding the lock, does a fenced read of a
counter from a fencing-checked store (:mod:`lockkit.fencing_store`), thinks for a moment, and writes the
counter + 1 with its fencing token, logging when it entered and left. With ``--faults``, the controller
SIGKILLs (then replaces) or SIGSTOPs (for 1.5 × TTL) a random worker now and then.

Checks, each of which fails the run (exit 1):

* **overlap** — two leases' validity intervals (entry until the earlier of release and ``expires_at``)
  intersect;
* **lost updates** — the counter differs from the number of writes the store accepted;
* **fencing** — accepted writes went backwards in token, or two leases had writes accepted under one token.

Also reported: acquisitions, handoffs, stale writes the store rejected, handoff latency and the takeover
time after a holder was killed.
"""

from __future__ import annotations

import itertools
import json
import multiprocessing
import os
import random
import signal
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import lockkit

from .fencing_store import FencedStore
from .urls import redact


def _worker(url: str | None, name: str, store_path: str, log_path: str, until: float, ttl: float) -> None:
    store = FencedStore(store_path)
    with lockkit.connect(url) as locks:
        lock = locks.lock(name, ttl=ttl)
        while time.monotonic() < until:
            try:
                lease = lock.acquire(timeout=max(0.0, until - time.monotonic()))
            except lockkit.LockTimeout:
                break
            entered = time.monotonic()
            written = "skip"
            value = store.read(lease.fencing_token, lease.token)
            time.sleep(random.uniform(0, 0.003))
            if value is None:
                written = "stale"
            elif lease.valid:
                written = "ok" if store.write(value + 1, lease.fencing_token, lease.token) else "stale"
            left = min(time.monotonic(), lease.expires_at)
            try:
                lock.release()
                ended = "released"
            except lockkit.LockError:
                ended = "lost"
            with open(log_path, "a", encoding="utf-8") as handle:
                handle.write(f"{entered} {left} {os.getpid()} {lease.fencing_token} {written} {ended}\n")


@dataclass
class VerifyReport:
    url: str
    processes: int
    duration: float
    faults: list[str]
    acquisitions: int = 0
    handoffs: int = 0
    overlaps: int = 0
    lost_updates: int = 0
    stale_writes_rejected: int = 0
    fencing_backwards: int = 0
    shared_fencing_tokens: int = 0
    kills: int = 0
    pauses: int = 0
    handoff_ms_p50: float | None = None
    handoff_ms_p99: float | None = None
    takeover_ms: list[float] = field(default_factory=list)
    expired_on_entry: int = 0
    """Holders whose lease had already expired when they entered (paused right after the grant): not overlaps."""
    first_overlap: list[list[float | int | str]] | None = None
    """The first two overlapping entries (entered, left, pid, fencing token, write outcome), for diagnosis."""

    @property
    def ok(self) -> bool:
        return not (self.overlaps or self.lost_updates or self.fencing_backwards or self.shared_fencing_tokens)

    def as_json(self) -> str:
        return json.dumps({**asdict(self), "ok": self.ok})

    def table(self) -> str:
        rows = [
            ("acquisitions", self.acquisitions),
            ("handoffs", self.handoffs),
            ("overlaps", self.overlaps),
            ("lost updates", self.lost_updates),
            ("stale writes rejected by fencing", self.stale_writes_rejected),
            ("fencing tokens backwards / shared", f"{self.fencing_backwards} / {self.shared_fencing_tokens}"),
            ("holders killed / paused", f"{self.kills} / {self.pauses}"),
            ("handoff latency p50 / p99", f"{_ms(self.handoff_ms_p50)} / {_ms(self.handoff_ms_p99)}"),
            ("takeover after kill (median)", _ms(statistics.median(self.takeover_ms) if self.takeover_ms else None)),
        ]
        width = max(len(k) for k, _ in rows)
        lines = [f"{k:<{width}}  {v}" for k, v in rows]
        lines.append("RESULT: " + ("ok" if self.ok else "VIOLATIONS FOUND"))
        return "\n".join(lines)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} ms"


def _analyse(report: VerifyReport, log: Path, store: FencedStore, kill_times: list[float]) -> None:
    entries = []
    for line in log.read_text().splitlines():
        entered, left, pid, token, written, _ended = line.split()
        entries.append((float(entered), float(left), int(pid), int(token), written))
    entries.sort()
    report.acquisitions = len(entries)
    # A lease's validity interval in the critical section is [entered, left]. It is empty when the holder was
    # paused between the grant and ``entered`` until its lease had expired (left < entered): such a holder
    # never held a valid lease there (and did not write), so it cannot overlap anyone. Every non-empty
    # interval is checked against the latest end seen so far, not only against its neighbour.
    latest: tuple[float, float, int, int, str] | None = None
    for entry in entries:
        if entry[1] <= entry[0]:
            report.expired_on_entry += 1
            continue
        if latest is not None and entry[0] < latest[1]:
            report.overlaps += 1
            if report.first_overlap is None:
                report.first_overlap = [list(latest), list(entry)]
        if latest is None or entry[1] > latest[1]:
            latest = entry
    gaps = []
    for prev, nxt in itertools.pairwise(entries):
        if nxt[2] != prev[2]:
            report.handoffs += 1
            gaps.append((nxt[0] - prev[1]) * 1000)
    if gaps:
        gaps.sort()
        report.handoff_ms_p50 = statistics.median(gaps)
        report.handoff_ms_p99 = gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))]
    for killed_at in kill_times:
        later = [e[0] for e in entries if e[0] > killed_at]
        if later:
            report.takeover_ms.append((min(later) - killed_at) * 1000)
    result = store.report()
    report.lost_updates = abs(result.value - result.accepted)
    report.stale_writes_rejected = result.rejected
    report.fencing_backwards = result.backwards
    report.shared_fencing_tokens = result.shared_tokens


def run(url: str | None, processes: int, duration: float, faults: list[str], ttl: float = 2.0) -> VerifyReport:
    unknown = set(faults) - {"kill", "pause"}
    if unknown:
        raise lockkit.ConfigError(f"unknown fault {sorted(unknown)[0]!r}; use kill, pause or both")
    report = VerifyReport(redact(url) if url else "the configured default", processes, duration, faults)
    ctx = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="lockkit-verify-") as tmp:
        store_path, log_path = Path(tmp) / "store.db", Path(tmp) / "log"
        log_path.write_text("")
        store = FencedStore(store_path)
        name = f"lockkit-verify:{os.getpid()}:{time.monotonic_ns()}"
        until = time.monotonic() + duration

        def spawn() -> Any:
            proc = ctx.Process(target=_worker, args=(url, name, str(store_path), str(log_path), until, ttl))
            proc.start()
            return proc

        workers = [spawn() for _ in range(processes)]
        kill_times: list[float] = []
        rng = random.Random()
        while faults and time.monotonic() < until - ttl * 2:
            time.sleep(rng.uniform(0.5, 1.5) * ttl)
            victim = rng.randrange(len(workers))
            if rng.choice(faults) == "kill":
                kill_times.append(time.monotonic())
                os.kill(workers[victim].pid, signal.SIGKILL)
                workers[victim].join()
                workers[victim] = spawn()
                report.kills += 1
            else:
                os.kill(workers[victim].pid, signal.SIGSTOP)
                time.sleep(ttl * 1.5)
                os.kill(workers[victim].pid, signal.SIGCONT)
                report.pauses += 1
        for proc in workers:
            proc.join(max(1.0, until - time.monotonic()) + ttl * 4)
            if proc.is_alive():
                proc.kill()
                proc.join()
        _analyse(report, log_path, store, kill_times)
        store.close()
    return report
