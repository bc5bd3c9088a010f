"""etcd driver benchmark: uncontended latency against the raw floor, 4-process handoffs, 10,000 locks on one lease.

    .venv/bin/python benchmarks/bench_etcd.py [--url etcd://127.0.0.1:2379] [--rounds 2000] [--many 10000]
        [--hold 10] [--contend 5] [--procs 4]

Without ``--url`` it starts a throw-away single-node etcd from backends/ on a
free loopback port (default server flags: 2 s minimum lease TTL).

* **raw floor**: what any etcd lock needs at least, measured in the same run
  over the same gRPC stubs: one put-if-absent transaction under an existing
  lease plus one delete.
* **lockkit**: ``lock.acquire()`` + ``lock.release()`` uncontended (auto-renew
  on, the session lease already granted), medians, p99 and the ratio to the floor.
* **contention** (lockkit/cli/contention.py, the Redis issue's rules): 4 processes
  loop acquire → ~1 ms busy hold → release on one name; handoffs/s (an
  acquisition by a different process than the previous holder), fairness,
  p50/p99/max wait, and whether the fencing tokens (the waiters' creation
  revisions) rise in acquisition order, i.e. FIFO. Target: ≥ 200 handoffs/s, FIFO.
* **scale**: 10,000 locks held on one session lease for 10 s; every lock must
  still be held, and renewal must cost one keepalive per period (counted),
  plus one read of the lease's attached keys (not a transaction per 128 locks).
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import lockkit
from backends.servers import EtcdServer
from benchmarks._common import contention, hosts, interleave, latency_table, run_driver, show
from lockkit.drivers.etcd import EtcdDriver
from lockkit.drivers.etcd.client import EtcdClient, cmp_created, delete_op, rpc


def latency(url: str, rounds: int) -> dict[str, list[float]]:
    """Raw floor and lockkit samples, interleaved."""
    host, _, port = hosts(url).split(",")[0].partition(":")
    client = EtcdClient([(host, int(port or 2379))])
    lease = client.grant(3600).ID  # not kept alive: it must outlast a slow run (it is revoked at the end)
    key = f"/bench-raw/{uuid.uuid4().hex}".encode()
    put = rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=b"t" * 32, lease=lease))
    create = rpc.TxnRequest(compare=[cmp_created(key, 0)], success=[put])
    delete = rpc.TxnRequest(success=[delete_op(key)])

    def floor() -> None:
        client.txn(create)
        client.txn(delete)

    try:
        with lockkit.connect(url) as locks:
            lock = locks.lock(f"bench-{uuid.uuid4().hex[:8]}", ttl=10)
            lock.acquire()
            lock.release()  # the session lease exists from here on, as in a running service

            def ours() -> None:
                lock.acquire()
                lock.release()

            return interleave({"raw floor: put-if-absent txn + delete": floor, "lockkit etcd://": ours}, rounds)
    finally:
        client.revoke(lease)
        client.close()


def many(url: str, count: int, hold: float) -> dict[str, Any]:
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
    return {
        "locks": count,
        "acquire_all_s": acquired_in,
        "still_held": still,
        "session_leases": len(sessions),
        "keepalives": calls["keepalive"],
        "renewal_periods": hold / period,
        "check_txns": calls["txn"],
        "lease_key_reads": calls["lease_keys"],
    }


def sections(args: argparse.Namespace, url: str) -> Iterator[str]:
    yield latency_table(latency(url, args.rounds))
    yield contention(url, args.contend, procs=args.procs).report()
    scale = many(url, args.many, args.hold)
    yield f"## {args.many} locks held on one session lease for {args.hold:g} s\n" + show("one session lease", scale)


def main() -> None:
    run_driver(__doc__, EtcdServer, sections)


if __name__ == "__main__":
    main()
