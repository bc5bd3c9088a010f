"""Semaphores and reader-writer locks against the mutex on the same backend (issue 18's "Performance").

    .venv/bin/python benchmarks/bench_semaphores.py [--url URL] [--rounds 2000] [--contend 5] [--procs 4]
        [--limits 1,2,4]

Without ``--url`` a throw-away Redis is started on loopback (backends/servers.py). Three parts:

1. Uncontended acquire+release on fresh names, interleaved in blocks of 20: ``lock()`` (the row the ratios
   are of), ``semaphore(limit=1)``, ``semaphore(limit=8)``, ``rwlock().read()``, ``rwlock().write()``; then
   the same with one name reused per row (a name's first use costs more on postgresql://).
2. ``--procs`` processes contending on one name, ~1 ms busy hold (lockkit/cli/contention.py): the mutex, then
   a semaphore of limit 1; handoffs/s of each.
3. The same with a semaphore of each ``--limits`` value: acquisitions per second, which should grow with the
   limit until the processes or the server are the bottleneck.
"""

from __future__ import annotations

import argparse
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import lockkit
from backends.servers import RedisServer
from benchmarks._common import contention, interleave, latency_table, served


class PermitContender:
    """One process's permit of a semaphore: ``target`` is ``(url, limit)`` (picklable for ``spawn``)."""

    def __init__(self, target: tuple[str, int], name: str) -> None:
        url, limit = target
        self.locks = lockkit.connect(url)
        self.permit = self.locks.semaphore(name, limit=limit, ttl=10)

    def acquire(self, timeout: float) -> int | None:
        lease = self.permit.acquire(timeout=timeout)
        return lease.fence

    def release(self) -> None:
        self.permit.release()

    def close(self) -> None:
        self.locks.close()


def uncontended(url: str, rounds: int) -> str:
    locks = lockkit.connect(url)
    prefix = uuid.uuid4().hex
    counter = iter(range(1 << 62))

    def fresh(make: Callable[[str], Any]) -> Callable[[], None]:
        def op() -> None:
            handle = make(f"bench:{prefix}:{next(counter)}")
            handle.acquire()
            handle.release()

        return op

    ops = {
        "lock()": fresh(lambda n: locks.lock(n, ttl=10)),
        "semaphore(limit=1)": fresh(lambda n: locks.semaphore(n, limit=1, ttl=10)),
        "semaphore(limit=8)": fresh(lambda n: locks.semaphore(n, limit=8, ttl=10)),
        "rwlock().read()": fresh(lambda n: locks.rwlock(n, ttl=10).read()),
        "rwlock().write()": fresh(lambda n: locks.rwlock(n, ttl=10).write()),
    }
    for op in ops.values():
        for _ in range(50):
            op()
    samples = interleave(ops, rounds)
    locks.close()
    return latency_table(samples, unit="µs")


def uncontended_same_name(url: str, rounds: int) -> str:
    """As :func:`uncontended`, but each handle reuses one name: the common case of a named resource. On
    postgresql:// the first use of a name runs the full join (insert the name's row, set its limit), every
    later one the one-statement path."""
    locks = lockkit.connect(url)
    prefix = f"bench:{uuid.uuid4().hex}"

    def reused(handle: Any) -> Callable[[], None]:
        def op() -> None:
            handle.acquire()
            handle.release()

        return op

    ops = {
        "lock()": reused(locks.lock(f"{prefix}:lock", ttl=10)),
        "semaphore(limit=1)": reused(locks.semaphore(f"{prefix}:s1", limit=1, ttl=10)),
        "semaphore(limit=8)": reused(locks.semaphore(f"{prefix}:s8", limit=8, ttl=10)),
        "rwlock().read()": reused(locks.rwlock(f"{prefix}:rw", ttl=10).read()),
        "rwlock().write()": reused(locks.rwlock(f"{prefix}:rw", ttl=10).write()),
    }
    for op in ops.values():
        for _ in range(50):
            op()
    samples = interleave(ops, rounds)
    locks.close()
    return latency_table(samples, unit="µs").replace("## Uncontended", "## Uncontended, one name reused", 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="an existing backend; without it a throw-away Redis is started")
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--contend", type=float, default=5.0, help="seconds of each contention run")
    parser.add_argument("--procs", type=int, default=4)
    parser.add_argument("--limits", default="1,2,4")
    args = parser.parse_args()
    with served(args.url, RedisServer) as url:
        print(uncontended(url, args.rounds), flush=True)
        print("\n" + uncontended_same_name(url, args.rounds), flush=True)
        mutex = contention(url, args.contend, procs=args.procs, label="lock()")
        print("\n" + mutex.report(), flush=True)
        for limit in (int(x) for x in args.limits.split(",")):
            run = contention(
                (url, limit), args.contend, procs=args.procs, opener=PermitContender, label=f"semaphore(limit={limit})"
            )
            print(
                f"\n## {args.procs} processes, semaphore(limit={limit}), ~1 ms hold, {args.contend:g} s\n"
                f"acquisitions/s {run.acquisitions / run.seconds:.0f}, handoffs/s {run.handoffs_per_s:.0f} "
                f"({run.handoffs_per_s / mutex.handoffs_per_s:.2f} of the mutex's), fairness {run.fairness:.2f}, "
                f"p50 wait {run.wait_p50_ms:.1f} ms, p99 wait {run.wait_p99_ms:.1f} ms",
                flush=True,
            )


if __name__ == "__main__":
    main()
