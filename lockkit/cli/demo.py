"""``lockkit demo``: the failure lockkit exists to prevent, shown on real processes.

N worker processes sell stock from one shared inventory record (a JSON file):
read the count, think for a moment, write count − 1. Run once with no lock,
the workers overwrite each other's writes (lost updates: stock is sold twice);
run again with a lockkit lock around each read-modify-write, and the count
comes out exact. The locked run also passes each lease's fencing token to the
record, which refuses a write carrying an older token than it has seen.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import lockkit

from ..urls import redact

THINK_SECONDS = 0.0005  # the pause between read and write that lets unlocked workers race


def _sell(record: Path, fencing_token: int | None) -> bool:
    data = json.loads(record.read_text())
    time.sleep(THINK_SECONDS)
    if fencing_token is not None:
        if fencing_token < data["fence"]:
            return False  # a stale holder: the store refuses it
        data["fence"] = fencing_token
    data["stock"] -= 1
    tmp = record.with_suffix(f".{os.getpid()}")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, record)
    return True


WORKER_FAILED = 3
"""The exit code of a worker that met a lockkit error (its message is in the run's error file)."""


def _worker(url: str | None, record: str, deductions: int, use_lock: bool, name: str, errors: str) -> None:
    try:
        _sell_all(url, record, deductions, use_lock, name)
    except lockkit.LockError as exc:
        # One line for the parent's error instead of a traceback per worker.
        with open(errors, "a", encoding="utf-8") as handle:
            handle.write(f"{type(exc).__name__}: {exc}".replace("\n", " ") + "\n")
        raise SystemExit(WORKER_FAILED) from None


def _sell_all(url: str | None, record: str, deductions: int, use_lock: bool, name: str) -> None:
    path = Path(record)
    if not use_lock:
        for _ in range(deductions):
            _sell(path, None)
        return
    with lockkit.connect(url) as locks:
        lock = locks.lock(name, ttl=10)
        for _ in range(deductions):
            with lock as lease:
                _sell(path, lease.fence)


@dataclass
class Outcome:
    mode: str
    final: int
    expected: int
    seconds: float
    acquisitions: int

    @property
    def lost(self) -> int:
        return self.final - self.expected


def run_mode(url: str | None, workers: int, deductions: int, use_lock: bool) -> Outcome:
    per_worker, extra = divmod(deductions, workers)
    with tempfile.TemporaryDirectory(prefix="lockkit-demo-") as tmp:
        record, errors = Path(tmp) / "inventory.json", Path(tmp) / "errors"
        record.write_text(json.dumps({"stock": deductions, "fence": 0}))
        name = f"demo:inventory:{os.getpid()}:{time.monotonic_ns()}"
        ctx = multiprocessing.get_context("spawn")
        procs = [
            ctx.Process(target=_worker, args=(url, str(record), per_worker + (i < extra), use_lock, name, str(errors)))
            for i in range(workers)
        ]
        started = time.monotonic()
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join()
        seconds = time.monotonic() - started
        failed = [p.exitcode for p in procs if p.exitcode != 0]
        if failed:
            reasons = sorted(set(errors.read_text(encoding="utf-8").splitlines())) if errors.exists() else []
            raise lockkit.LockError(
                f"{len(failed)} demo worker(s) failed (exit codes {failed}): "
                + ("; ".join(reasons) or "see above")
                + "; check the backend (lockkit check --url URL), then run the demo again"
            )
        final = json.loads(record.read_text())["stock"]
    return Outcome("lockkit lock" if use_lock else "no lock", final, 0, seconds, deductions if use_lock else 0)


def format_table(outcomes: list[Outcome]) -> str:
    header = f"{'mode':<14}{'final stock':>12}{'expected':>10}{'lost updates':>14}{'wall time':>11}{'acq/s':>9}"
    lines = [header, "-" * len(header)]
    for o in outcomes:
        rate = f"{o.acquisitions / o.seconds:,.0f}" if o.acquisitions else "-"
        lines.append(f"{o.mode:<14}{o.final:>12}{o.expected:>10}{o.lost:>14}{o.seconds:>10.2f}s{rate:>9}")
    return "\n".join(lines)


def main(url: str | None, workers: int, deductions: int) -> int:
    with lockkit.connect(url) as locks:
        backend = locks.backend_for("demo:inventory")
        scope, backend_shown = backend.guarantees.scope, backend.shown_url
    if scope == "process":
        # Its workers are processes: the locked run lost updates too, and the demo called that a bug of lockkit.
        raise lockkit.ConfigError(
            f"{backend_shown} locks only the threads of one process, and the demo's workers are separate "
            "processes; run it on a backend that processes share (leave --url out for file://, or a server)"
        )
    shown = redact(url) if url else "the embedded default (file:// in your state directory)"
    print(f"lockkit demo: {workers} processes sell {deductions} items from one inventory record on {shown}\n")
    outcomes = [run_mode(url, workers, deductions, False), run_mode(url, workers, deductions, True)]
    print(format_table(outcomes))
    unlocked, locked = outcomes
    print()
    if unlocked.lost:
        print(f"Without a lock, {unlocked.lost} sales overwrote each other: that stock was sold twice.")
    else:
        print("Without a lock this run happened not to lose updates; run it again, races are timing-dependent.")
    print("With lockkit, every sale was counted." if locked.lost == 0 else "With lockkit, updates were LOST: a bug.")
    return 0 if locked.lost == 0 else 1
