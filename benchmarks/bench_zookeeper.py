"""ZooKeeper driver benchmark: uncontended latency against the raw floor, 4-way handoffs, 10,000 locks per session.

    .venv/bin/python benchmarks/bench_zookeeper.py [--url zookeeper://127.0.0.1:2181] [--rounds 2000] [--many 10000]

Without ``--url`` it starts a throw-away standalone ZooKeeper from backends/ on
a free loopback port (tickTime 200 ms).

* **raw floor**: what any ZooKeeper lock needs at least, measured in the same
  run on an open session: kazoo ``create(ephemeral=True)`` under an existing
  parent plus ``delete``. kazoo's own ``Lock`` recipe is measured beside it.
* **lockkit**: ``lock.acquire()`` + ``lock.release()`` uncontended (auto-renew
  on, session open), medians and the ratios to the floor.
* **contention**: 4 clients (4 sessions) loop acquire → release on one name
  for a few seconds, lockkit and kazoo's ``Lock``; handoffs per second and,
  for lockkit, whether grants followed queue order (fencing tokens are the
  nodes' czxid, i.e. creation order, so FIFO means they increase).
* **scale**: 10,000 locks held on one session for 10 s; every lock must still
  be held, and renewal must cost no per-lock requests (counted once every lock
  has had its first renewal, which reads its node once to set a watch on it).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kazoo.client import KazooClient

import lockkit


def latency(url: str, hosts: str, rounds: int, block: int = 20) -> dict[str, list[float]]:
    """Raw floor, lockkit and kazoo's Lock, measured in alternating blocks so that load drift hits all alike."""
    raw_client = KazooClient(hosts=hosts)
    raw_client.start()
    parent = f"/bench-raw-{uuid.uuid4().hex[:8]}"
    raw_client.ensure_path(parent)
    recipe = raw_client.Lock(f"/bench-kazoo-{uuid.uuid4().hex[:8]}")
    samples: dict[str, list[float]] = {"raw": [], "lockkit": [], "kazoo_lock": []}
    try:
        with lockkit.connect(url) as locks:
            lock = locks.lock(f"bench-{uuid.uuid4().hex[:8]}", ttl=10)
            lock.acquire()
            lock.release()  # the session and the parent exist from here on, as in a running service
            recipe.acquire()
            recipe.release()
            while len(samples["raw"]) < rounds:
                for _ in range(block):
                    started = time.perf_counter()
                    path = raw_client.create(f"{parent}/n", b"t", ephemeral=True)
                    raw_client.delete(path)
                    samples["raw"].append(time.perf_counter() - started)
                for _ in range(block):
                    started = time.perf_counter()
                    lock.acquire()
                    lock.release()
                    samples["lockkit"].append(time.perf_counter() - started)
                for _ in range(block):
                    started = time.perf_counter()
                    recipe.acquire()
                    recipe.release()
                    samples["kazoo_lock"].append(time.perf_counter() - started)
    finally:
        raw_client.delete(parent, recursive=True)
        raw_client.stop()
        raw_client.close()
    return samples


def contention(url: str, hosts: str, seconds: float) -> dict[str, float]:
    name = f"bench-c-{uuid.uuid4().hex[:8]}"
    lockers = [lockkit.connect(url) for _ in range(4)]
    grants: list[int] = []
    waits: list[float] = []
    mutex = threading.Lock()
    stop = time.monotonic() + seconds

    def work(i: int) -> None:
        lock = lockers[i].lock(name, ttl=10)
        while time.monotonic() < stop:
            asked = time.monotonic()
            lease = lock.acquire(timeout=30)
            with mutex:
                waits.append(time.monotonic() - asked)
                grants.append(lease.fencing_token)
            lock.release()

    elapsed = _run_threads(work, 4)
    for locker in lockers:
        locker.close()
    kazoo_rate = _kazoo_contention(hosts, seconds)
    return {"handoffs_per_s": len(grants) / elapsed, "kazoo_lock_handoffs_per_s": kazoo_rate,
            "fifo_kept": float(grants == sorted(grants)), "worst_wait_s": max(waits),
            "median_wait_s": statistics.median(waits)}


def _kazoo_contention(hosts: str, seconds: float) -> float:
    path = f"/bench-kc-{uuid.uuid4().hex[:8]}"
    clients = [KazooClient(hosts=hosts) for _ in range(4)]
    for client in clients:
        client.start()
    count = [0]
    mutex = threading.Lock()
    stop = time.monotonic() + seconds

    def work(i: int) -> None:
        recipe = clients[i].Lock(path)
        while time.monotonic() < stop:
            recipe.acquire(timeout=30)
            with mutex:
                count[0] += 1
            recipe.release()

    elapsed = _run_threads(work, 4)
    clients[0].delete(path, recursive=True)
    for client in clients:
        client.stop()
        client.close()
    return count[0] / elapsed


def _run_threads(work: object, n: int) -> float:
    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]  # type: ignore[arg-type]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.monotonic() - started


def many(url: str, count: int, hold: float) -> dict[str, float]:
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
    return {"locks": count, "acquire_all_s": acquired_in, "still_held": still, "renewal_periods": hold / period,
            "requests_while_held": calls["requests"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url")
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--many", type=int, default=10_000)
    parser.add_argument("--hold", type=float, default=10.0)
    args = parser.parse_args()
    server = None
    if args.url is None:
        from backends.servers import ZooKeeperServer

        server = ZooKeeperServer().start()
        url, hosts = server.url, server.hosts
    else:
        url = args.url
        hosts = url.split("://", 1)[1].split("/")[0].split("?")[0].rpartition("@")[2]
    try:
        samples = latency(url, hosts, args.rounds)
        floor = statistics.median(samples["raw"]) * 1e3
        print(f"raw floor (create ephemeral + delete):  median {floor:.3f} ms")
        labels = {"lockkit": "lockkit acquire+release uncontended:", "kazoo_lock": "kazoo Lock acquire+release:"}
        for key, label in labels.items():
            ms = statistics.median(samples[key]) * 1e3
            print(f"{label:<40}median {ms:.3f} ms  ratio {ms / floor:.2f}x")
        result = contention(url, hosts, 5.0)
        print("4-way contention: " + ", ".join(f"{k}={v:.3f}" for k, v in result.items()))
        scale = many(url, args.many, args.hold)
        print("one session: " + ", ".join(f"{k}={v:.2f}" for k, v in scale.items()))
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
