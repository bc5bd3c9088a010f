"""ZooKeeper driver benchmark: uncontended latency against the raw floor, 4-process handoffs, 10,000 locks per session.

    .venv/bin/python benchmarks/bench_zookeeper.py [--url zookeeper://127.0.0.1:2181] [--rounds 2000] [--many 10000]
        [--hold 10] [--contend 5] [--procs 4]

Without ``--url`` it starts a throw-away standalone ZooKeeper from backends/ on
a free loopback port (tickTime 200 ms).

* **requests**: how many ZooKeeper requests of each type one uncontended
  acquire+release sends, on one name and on a fresh name (deterministic).
* **raw floor**: what any ZooKeeper lock needs at least, measured in the same
  run on an open session: kazoo ``create(ephemeral=True)`` under an existing
  parent plus ``delete``. kazoo's own ``Lock`` recipe is measured beside it.
* **lockkit**: ``lock.acquire()`` + ``lock.release()`` uncontended (auto-renew
  on, session open), medians, p99 and the ratios to the floor, both on one
  name used again and again and on a fresh name each time (a lock per order
  id: the parent node does not exist yet), kazoo's ``Lock`` beside each.
* **contention** (lockkit/cli/contention.py, the Redis issue's rules): 4 processes
  (4 sessions) loop acquire → ~1 ms busy hold → release on one name, lockkit
  and kazoo's ``Lock`` in turn, twice, each process with its own client (then
  the handoff ratios pair by pair); handoffs/s,
  fairness, p50/p99/max wait, and whether grants followed queue order: for
  lockkit the fencing tokens are the nodes' czxid (creation order), for kazoo
  the lock nodes' sequence numbers, so FIFO means they rise.
* **scale**: 10,000 locks held on one session for 10 s; every lock must still
  be held, and renewal must cost no per-lock requests (counted once every lock
  has had its first renewal, which reads its node once to set a watch on it).
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import statistics
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kazoo.client import KazooClient

import lockkit
from backends.servers import ZooKeeperServer
from benchmarks._common import Contention, contention, hosts, interleave, latency_table, run_driver, show

KAZOO_PARENT = "/bench-kazoo-contend"


def latency(url: str, rounds: int) -> dict[str, list[float]]:
    """Raw floor, lockkit and kazoo's Lock on one name and on a fresh name per operation, interleaved."""
    raw_client = KazooClient(hosts=hosts(url))
    raw_client.start()
    parent = f"/bench-raw-{uuid.uuid4().hex[:8]}"
    raw_client.ensure_path(parent)
    recipe = raw_client.Lock(f"/bench-kazoo-{uuid.uuid4().hex[:8]}")
    fresh_base = f"/bench-kazoo-fresh-{uuid.uuid4().hex[:8]}"

    def floor() -> None:
        raw_client.delete(raw_client.create(f"{parent}/n", b"t", ephemeral=True))

    def kazoo_lock() -> None:
        recipe.acquire()
        recipe.release()

    def kazoo_fresh() -> None:  # a Lock per name, as an order service locking order ids would make
        lock = raw_client.Lock(f"{fresh_base}/{uuid.uuid4().hex}")
        lock.acquire()
        lock.release()  # kazoo's parents are persistent: deleted after the run (recursive delete of fresh_base)

    try:
        with lockkit.connect(url) as locks:
            lock = locks.lock(f"bench-{uuid.uuid4().hex[:8]}", ttl=10)
            lock.acquire()
            lock.release()  # the session and the parent exist from here on, as in a running service
            recipe.acquire()
            recipe.release()

            def ours() -> None:
                lock.acquire()
                lock.release()

            def ours_fresh() -> None:
                fresh = locks.lock(f"bench-f-{uuid.uuid4().hex}", ttl=10)
                fresh.acquire()
                fresh.release()

            raw = "raw floor: create ephemeral + delete"
            ops = {
                raw: floor,
                "lockkit zookeeper://, one name": ours,
                "kazoo Lock recipe, one name": kazoo_lock,
                "lockkit zookeeper://, fresh name each time": ours_fresh,
                "kazoo Lock recipe, fresh name each time": kazoo_fresh,
            }
            return interleave(ops, rounds)
    finally:
        raw_client.delete(parent, recursive=True)
        raw_client.delete(fresh_base, recursive=True)
        raw_client.stop()
        raw_client.close()


def requests(url: str, rounds: int = 50) -> str:
    """ZooKeeper requests per uncontended acquire+release, by type (counted at kazoo's one request queue)."""
    with lockkit.connect(url) as locks:
        warm = locks.lock(f"bench-r-{uuid.uuid4().hex[:8]}", ttl=10)
        warm.acquire()
        warm.release()
        kazoo = locks.backend_for(warm.name).driver._session.client()  # type: ignore[attr-defined]
        counted: collections.Counter[str] = collections.Counter()
        original = kazoo._call

        def call(request: Any, result: Any) -> Any:
            counted[type(request).__name__] += 1
            return original(request, result)

        def fresh() -> None:
            lock = locks.lock(f"bench-r-{uuid.uuid4().hex}", ttl=10)
            lock.acquire()
            lock.release()

        def one_name() -> None:
            warm.acquire()
            warm.release()

        lines = ["## ZooKeeper requests per uncontended acquire+release (lockkit, counted at kazoo's request queue)"]
        kazoo._call = call
        try:
            for label, op in (("one name", one_name), ("fresh name", fresh)):
                counted.clear()
                for _ in range(rounds):
                    op()
                shown = ", ".join(f"{kind} {n / rounds:g}" for kind, n in sorted(counted.items()))
                lines.append(f"{label}: {sum(counted.values()) / rounds:g} ({shown})")
        finally:
            kazoo._call = original
    return "\n".join(lines)


class KazooContender:
    """kazoo's ``Lock`` recipe as a contention opener; its token is the lock node's sequence number."""

    def __init__(self, url: str, name: str) -> None:
        self.client = KazooClient(hosts=hosts(url))
        self.client.start(timeout=15)
        self.lock = self.client.Lock(f"{KAZOO_PARENT}/{name}")

    def acquire(self, timeout: float) -> int | None:
        self.lock.acquire(timeout=timeout)
        return int(self.lock.node[-10:])

    def release(self) -> None:
        self.lock.release()

    def close(self) -> None:
        self.client.stop()
        self.client.close()


def kazoo_contention(url: str, seconds: float, procs: int) -> Contention:
    try:
        return contention(
            url,
            seconds,
            procs=procs,
            opener=KazooContender,
            label="kazoo Lock recipe (one client per process)",
            tokens="lock node sequence numbers",
        )
    finally:
        cleaner = KazooClient(hosts=hosts(url))
        cleaner.start(timeout=15)
        cleaner.delete(KAZOO_PARENT, recursive=True)
        cleaner.stop()
        cleaner.close()


def contentions(url: str, seconds: float, procs: int, pairs: int = 2) -> Iterator[str]:
    """lockkit and kazoo's Lock in turn, ``pairs`` times (load drift hits both), then the handoff ratios."""
    ours: list[float] = []
    theirs: list[float] = []
    for _ in range(pairs):
        mine = contention(url, seconds, procs=procs)
        ours.append(mine.handoffs_per_s)
        yield mine.report()
        recipe = kazoo_contention(url, seconds, procs)
        theirs.append(recipe.handoffs_per_s)
        yield recipe.report()
    ratios = ", ".join(f"{a / b:.2f}" for a, b in zip(ours, theirs, strict=True))
    yield (
        f"## handoffs/s, lockkit / kazoo Lock, pair by pair: {ratios} "
        f"(medians {statistics.median(ours):.0f} / {statistics.median(theirs):.0f})"
    )


def many(url: str, count: int, hold: float) -> dict[str, Any]:
    with lockkit.connect(url) as locks:
        base = f"bench-m-{uuid.uuid4().hex[:8]}"
        driver = locks.backend_for(base).driver
        held = [locks.lock(f"{base}-{i}", ttl=10) for i in range(count)]
        started = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(8) as pool:  # creates are fsync'd writes: overlap them
            leases = list(pool.map(lambda lock: lock.acquire(), held))
        acquired_in = time.monotonic() - started
        # each lock's first renewal batch reads its node once and sets lockkit's watch on it; count after that
        time.sleep(leases[0].ttl / 3 + 1)
        kazoo = driver._session.client()  # type: ignore[attr-defined]
        calls = {"requests": 0}
        wrapped = {}
        for method in ("exists_async", "get_async", "get_children_async", "create_async", "delete_async", "sync_async"):
            original = getattr(kazoo, method)
            wrapped[method] = original

            def counted(*args: object, _original: object = original, **kwargs: object) -> object:
                calls["requests"] += 1
                return _original(*args, **kwargs)  # type: ignore[operator]

            setattr(kazoo, method, counted)
        time.sleep(hold)
        for method, original in wrapped.items():
            setattr(kazoo, method, original)
        still = sum(lease.valid for lease in leases)
        period = leases[0].ttl / 3
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda lock: lock.release(), held))
    return {
        "locks": count,
        "acquire_all_s": acquired_in,
        "still_held": still,
        "renewal_periods": hold / period,
        "requests_while_held": calls["requests"],
    }


def sections(args: argparse.Namespace, url: str) -> Iterator[str]:
    yield requests(url)
    yield latency_table(latency(url, args.rounds))
    yield from contentions(url, args.contend, args.procs)
    scale = many(url, args.many, args.hold)
    yield f"## {args.many} locks held on one session for {args.hold:g} s\n" + show("one session", scale)


def main() -> None:
    run_driver(__doc__, ZooKeeperServer, sections)


if __name__ == "__main__":
    main()
