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
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import lockkit

from ..config import default_state_dir
from .preflight import check_shared_backend

DEMO_TTL = 10.0
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


def _worker(url: str, record: str, deductions: int, use_lock: bool, name: str) -> None:
    try:
        _deduct(url, Path(record), deductions, use_lock, name)
    except lockkit.LockError as exc:  # one line, not a traceback per worker
        print(f"lockkit demo: a worker failed: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


def _deduct(url: str, path: Path, deductions: int, use_lock: bool, name: str) -> None:
    if not use_lock:
        for _ in range(deductions):
            _sell(path, None)
        return
    with lockkit.connect(url) as locks:
        lock = locks.lock(name, ttl=DEMO_TTL)
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


def run_mode(url: str, workers: int, deductions: int, use_lock: bool, name: str) -> Outcome:
    per_worker, extra = divmod(deductions, workers)
    with tempfile.TemporaryDirectory(prefix="lockkit-demo-") as tmp:
        record = Path(tmp) / "inventory.json"
        record.write_text(json.dumps({"stock": deductions, "fence": 0}))
        ctx = multiprocessing.get_context("spawn")
        procs = [
            ctx.Process(target=_worker, args=(url, str(record), per_worker + (i < extra), use_lock, name))
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
            raise lockkit.LockError(f"{len(failed)} demo worker(s) failed (exit codes {failed}); see above")
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
    """Run both modes; without ``url``, on the embedded ``file://`` backend whatever the environment says.

    docs/cli.md promises the embedded backend: following ``LOCKKIT_URL`` or a ``./lockkit.toml`` instead made
    the demo "find" lost updates on memory:// (which locks one process's threads) or crash on a route mistake.
    """
    target = url if url is not None else default_state_dir().as_uri()
    name = f"demo:inventory:{os.getpid()}:{time.monotonic_ns()}"
    _, shown = check_shared_backend(target, name, DEMO_TTL, "demo")  # before any output: a mistake is one line
    where = shown if url is not None else f"the embedded default ({shown})"
    print(f"lockkit demo: {workers} processes sell {deductions} items from one inventory record on {where}\n")
    outcomes = [run_mode(target, workers, deductions, False, name), run_mode(target, workers, deductions, True, name)]
    print(format_table(outcomes))
    unlocked, locked = outcomes
    print()
    if unlocked.lost:
        print(f"Without a lock, {unlocked.lost} sales overwrote each other: that stock was sold twice.")
    else:
        print("Without a lock this run happened not to lose updates; run it again, races are timing-dependent.")
    print("With lockkit, every sale was counted." if locked.lost == 0 else "With lockkit, updates were LOST: a bug.")
    return 0 if locked.lost == 0 else 1
