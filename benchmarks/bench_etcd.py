"""etcd driver benchmark: uncontended latency against the raw floor, 4-way handoffs, 10,000 locks on one lease.

    .venv/bin/python benchmarks/bench_etcd.py [--url etcd://127.0.0.1:2379] [--rounds 2000] [--many 10000]

Without ``--url`` it starts a throw-away single-node etcd from backends/ on a
free loopback port (default server flags: 2 s minimum lease TTL).

* **raw floor**: what any etcd lock needs at least, measured in the same run
  over the same gRPC stubs: one put-if-absent transaction under an existing
  lease plus one delete.
* **lockkit**: ``lock.acquire()`` + ``lock.release()`` uncontended (auto-renew
  on, the session lease already granted), medians and the ratio to the floor.
* **contention**: 4 clients loop acquire → release on one name for a few
  seconds; handoffs per second, whether grants followed queue order, the
  worst wait.
* **scale**: 10,000 locks held on one session lease for 10 s; every lock must
  still be held, and renewal must cost one keepalive per period (counted),
  plus one read of the lease's attached keys (not a transaction per 128 locks).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import lockkit
from lockkit.drivers._etcd_client import EtcdClient, cmp_created, delete_op, rpc
from lockkit.drivers.etcd import EtcdDriver


def latency(url: str, host: str, port: int, rounds: int, block: int = 20) -> tuple[list[float], list[float]]:
    """Raw floor and lockkit samples, measured in alternating blocks so that load drift hits both alike."""
    client = EtcdClient([(host, port)])
    lease = client.grant(30).ID
    key = f"/bench-raw/{uuid.uuid4().hex}".encode()
    put = rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=b"t" * 32, lease=lease))
    raw: list[float] = []
    ours: list[float] = []
    try:
        with lockkit.connect(url) as locks:
            lock = locks.lock(f"bench-{uuid.uuid4().hex[:8]}", ttl=10)
            lock.acquire()
            lock.release()  # the session lease exists from here on, as in a running service
            while len(raw) < rounds:
                for _ in range(block):
                    started = time.perf_counter()
                    client.txn(rpc.TxnRequest(compare=[cmp_created(key, 0)], success=[put]))
                    client.txn(rpc.TxnRequest(success=[delete_op(key)]))
                    raw.append(time.perf_counter() - started)
                for _ in range(block):
                    started = time.perf_counter()
                    lock.acquire()
                    lock.release()
                    ours.append(time.perf_counter() - started)
    finally:
        client.revoke(lease)
        client.close()
    return raw, ours


def contention(url: str, seconds: float) -> dict[str, float]:
    name = f"bench-c-{uuid.uuid4().hex[:8]}"
    lockers = [lockkit.connect(url) for _ in range(4)]
    grants: list[tuple[int, float]] = []
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
                grants.append((i, lease.fencing_token))
            lock.release()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    for locker in lockers:
        locker.close()
    tokens = [t for _, t in grants]
    return {"handoffs_per_s": len(grants) / elapsed, "grants": len(grants),
            "fencing_increasing": float(tokens == sorted(tokens)), "worst_wait_s": max(waits),
            "median_wait_s": statistics.median(waits)}


def many(url: str, count: int, hold: float) -> dict[str, float]:
    with lockkit.connect(url) as locks:
        driver = locks._backends["default"].driver
        assert isinstance(driver, EtcdDriver)
        client: Any = driver._client
        calls = {"keepalive": 0, "txn": 0, "lease_keys": 0}
        keepalive, txn, lease_keys = client.keepalive, client.txn, client.lease_keys

        def counted_keepalive(*args: object, **kwargs: object) -> int:
            calls["keepalive"] += 1
            return keepalive(*args, **kwargs)  # type: ignore[no-any-return]

        def counted_txn(*args: object, **kwargs: object) -> object:
            calls["txn"] += 1
            return txn(*args, **kwargs)

        def counted_lease_keys(*args: object, **kwargs: object) -> object:
            calls["lease_keys"] += 1
            return lease_keys(*args, **kwargs)

        base = f"bench-m-{uuid.uuid4().hex[:8]}"
        held = [locks.lock(f"{base}-{i}", ttl=3) for i in range(count)]
        started = time.monotonic()
        leases = [lock.acquire() for lock in held]
        acquired_in = time.monotonic() - started
        client.keepalive, client.txn, client.lease_keys = counted_keepalive, counted_txn, counted_lease_keys
        time.sleep(hold)
        client.keepalive, client.txn, client.lease_keys = keepalive, txn, lease_keys
        still = sum(lease.valid for lease in leases)
        sessions = {driver._held[lease.token].session.lease_id for lease in leases}
        period = leases[0].ttl / 3
        for lock in held:
            lock.release()
    return {"locks": count, "acquire_all_s": acquired_in, "still_held": still, "session_leases": len(sessions),
            "keepalives": calls["keepalive"], "renewal_periods": hold / period,
            "check_txns": calls["txn"], "lease_key_reads": calls["lease_keys"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url")
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--many", type=int, default=10_000)
    parser.add_argument("--hold", type=float, default=10.0)
    args = parser.parse_args()
    server = None
    if args.url is None:
        from backends.servers import EtcdServer

        server = EtcdServer().start()
        url, host, port = server.url, server.host, server.port
    else:
        url = args.url
        host, _, port_text = url.split("://", 1)[1].split("/")[0].split("?")[0].partition(":")
        port = int(port_text or 2379)
    try:
        floor, ours = latency(url, host, port, args.rounds)
        floor_ms, ours_ms = statistics.median(floor) * 1e3, statistics.median(ours) * 1e3
        print(f"raw floor (put-if-absent txn + delete): median {floor_ms:.3f} ms")
        print(f"lockkit acquire+release uncontended:    median {ours_ms:.3f} ms  ratio {ours_ms / floor_ms:.2f}x")
        result = contention(url, 5.0)
        print("4-way contention: " + ", ".join(f"{k}={v:.3f}" for k, v in result.items()))
        scale = many(url, args.many, args.hold)
        print("one session lease: " + ", ".join(f"{k}={v:.2f}" for k, v in scale.items()))
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
