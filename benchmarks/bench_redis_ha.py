"""High-availability Redis (issue 14): redis+cluster:// and redis+sentinel:// against raw redis-py floors.

1. Cluster, uncontended acquire+release on fresh names (spread over three masters): lockkit's
   ``redis+cluster://`` against redis-py's ``redis.cluster.RedisCluster`` doing ``SET NX PX`` + ``EVALSHA``
   compare-and-delete on the same cluster (goal: ≤ 1.1× its median).
2. Sentinel, once the master is resolved: ``redis+sentinel://`` against ``redis://`` to the same master and the
   raw redis-py floor there.
3. Following a Sentinel failover: a lock held (``min_replicas=1``), the master SIGKILLed; the time from the kill
   until ``renew()`` succeeds on the promoted master, median of ``--kills`` fresh sets (``down-after-milliseconds``
   500: most of it is Sentinel's detection and vote, not lockkit's).

Every server is started here on loopback and stopped by PID.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis
from redis.cluster import ClusterNode
from redis.cluster import RedisCluster as RawCluster

import lockkit
from backends.servers import RedisCluster, SentinelSet
from benchmarks._common import interleave, latency_table

CAD = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"


def _via(locks: lockkit.Locker) -> Callable[[str], None]:
    def op(name: str) -> None:
        lock = locks.lock(name, ttl=10)
        lock.acquire()
        lock.release()

    return op


def _table(runners: dict[str, Callable[[str], None]], ops: int, rounds: int, against: dict[str, str]) -> str:
    for warm in runners.values():
        for i in range(50):
            warm(f"warm-{uuid.uuid4().hex}-{i}")
    prefix = uuid.uuid4().hex
    counter = iter(range(1 << 62))

    def fresh(run: Callable[[str], None]) -> Callable[[], None]:
        return lambda: run(f"bench:{prefix}:{next(counter)}")

    samples = interleave({label: fresh(run) for label, run in runners.items()}, ops * rounds, block=10)
    return latency_table(samples, unit="µs", against=against)


def cluster(ops: int, rounds: int) -> None:
    with RedisCluster() as group:
        raw = RawCluster(startup_nodes=[ClusterNode(n.host, n.port) for n in group.members])
        sha = raw.script_load(CAD)  # loaded on every master

        def floor(name: str) -> None:
            raw.set(name, "token", nx=True, px=10_000)
            raw.evalsha(sha, 1, name, "token")

        with lockkit.connect(group.url) as locks:
            print("## redis+cluster:// (three masters)")
            print(_table({"RedisCluster floor": floor, "redis+cluster://": _via(locks)}, ops, rounds, {}))
        raw.close()


def sentinel(ops: int, rounds: int) -> None:
    with SentinelSet(replicas=1) as group:
        host, port = group.master_address()
        client = redis.Redis(host, port)
        sha = client.script_load(CAD)

        def floor(name: str) -> None:
            client.set(name, "token", nx=True, px=10_000)
            client.evalsha(sha, 1, name, "token")

        with lockkit.connect(group.url) as via_sentinels, lockkit.connect(f"redis://{host}:{port}/0") as direct:
            print("## redis+sentinel:// once resolved (a master, a replica, three sentinels)")
            runners = {"floor": floor, "redis://": _via(direct), "redis+sentinel://": _via(via_sentinels)}
            print(_table(runners, ops, rounds, {"redis+sentinel://": "redis://"}))
        client.close()


def failover(kills: int) -> None:
    times: list[float] = []
    for _ in range(kills):
        with SentinelSet() as group, lockkit.connect(group.url + "?min_replicas=1&replica_timeout=1") as locks:
            lock = locks.lock(f"bench:{uuid.uuid4().hex}", ttl=20, auto_renew=False)
            lock.acquire(timeout=5)
            killed = time.perf_counter()
            group.kill_master()
            while True:
                try:
                    lock.renew()
                    break
                except lockkit.BackendUnavailable:
                    continue  # failover_wait ran out while Sentinel still votes: keep asking
            times.append(time.perf_counter() - killed)
    shown = ", ".join(f"{t:.2f}" for t in times)
    print("## Following a Sentinel failover (SIGKILL of the master until renew() succeeds)")
    print(f"median {statistics.median(times):.2f} s over {kills} kills ({shown} s); down-after-milliseconds 500")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", type=int, default=400, help="operations per round and variant")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--kills", type=int, default=5, help="Sentinel failovers timed (a fresh set each)")
    parser.add_argument("--only", choices=["cluster", "sentinel", "failover"])
    args = parser.parse_args()
    if args.only in (None, "cluster"):
        cluster(args.ops, args.rounds)
        print()
    if args.only in (None, "sentinel"):
        sentinel(args.ops, args.rounds)
        print()
    if args.only in (None, "failover"):
        failover(args.kills)


if __name__ == "__main__":
    main()
