"""Redis and Redlock drivers against the raw redis-py floor (issue 3's "Speed" section).

    .venv/bin/python benchmarks/bench_redis.py [--ops 400] [--rounds 5] [--contend 5] [--locks 10000] [--hold 10]
        [--parts uncontended,contention,scale]

Starts its own throw-away servers on loopback (backends/servers.py). Three parts:

1. Uncontended acquire+release on distinct names, alternating in blocks of 10 with the raw
   floors: median and p99 per operation, ratios of medians against the row's floor. redis://
   against redis-py ``SET NX PX`` + one ``EVALSHA`` compare-and-delete (script preloaded);
   redlock:// against the raw 5-master parallel floor: ``SET NX PX`` written to all five
   masters, then all replies read, then the same for the ``EVALSHA``, one thread
   (``--parts redlock`` runs only these two rows; ``--parts redlock-layers`` times redlock:// by layer: the
   floor, the driver alone, the whole ``Lock``, and the ``Lock`` reading every master's reply before it returns
   as it did before L-9; wall clock and client CPU).
2. 4 processes contending on one name, each holding ~1 ms (lockkit/cli/contention.py, shared
   with the etcd and ZooKeeper benchmarks): handoffs/s (an acquisition by a different
   process than the previous holder), fairness (fewest/most acquisitions per process),
   p50/p99/max wait, and whether the fencing tokens rise in acquisition order (redis://;
   Redlock has none).
3. N locks held with auto-renewal (ttl 2 s) for a while in one process: all still held at
   the end (checked from a separate connection), extra threads, renewal CPU against a raw
   pipeline of the same PEXPIREs.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis

import lockkit
from backends.servers import RedisServer, RedlockServers
from benchmarks._common import contention, interleave, latency_table

CAD = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"


class RedlockFloor:
    """The fewest a Redlock acquire+release can do: each command written to every master before any reply is
    read (all masters in parallel, one thread, as lockkit's fan-out does), on redis-py's bare connections."""

    def __init__(self, ports: list[int]) -> None:
        self.conns = [redis.Connection(port=port) for port in ports]
        for conn in self.conns:
            conn.connect()
            conn.send_command("SCRIPT", "LOAD", CAD)
        self.sha = [conn.read_response() for conn in self.conns].pop()  # the same on every master
        self.quorum = len(self.conns) // 2 + 1

    def __call__(self, name: str) -> None:
        for conn in self.conns:
            conn.send_command("SET", name, "token", "NX", "PX", 10_000)
        won = sum(conn.read_response() is not None for conn in self.conns)
        assert won >= self.quorum
        for conn in self.conns:
            conn.send_command("EVALSHA", self.sha, 1, name, "token")
        for conn in self.conns:
            conn.read_response()

    def close(self) -> None:
        for conn in self.conns:
            conn.disconnect()


def uncontended(
    redis_url: str, port: int, redlock_url: str, redlock_ports: list[int], ops: int, rounds: int, single_too: bool
) -> None:
    client = redis.Redis(port=port)
    sha = client.script_load(CAD)
    single = lockkit.connect(redis_url)
    quorum = lockkit.connect(redlock_url)
    parallel = RedlockFloor(redlock_ports)

    def floor(name: str) -> None:
        client.set(name, "token", nx=True, px=10_000)
        client.evalsha(sha, 1, name, "token")

    def via(locks: lockkit.Locker) -> Callable[[str], None]:
        def op(name: str) -> None:
            lock = locks.lock(name, ttl=10)
            lock.acquire()
            lock.release()

        return op

    runners: dict[str, Callable[[str], None]] = {}
    against: dict[str, str] = {"redlock://": "5-master floor"}
    if single_too:
        runners |= {"floor": floor, "redis://": via(single)}
        against["redis://"] = "floor"
    runners |= {"5-master floor": parallel, "redlock://": via(quorum)}
    for warm in runners.values():
        for i in range(50):
            warm(f"warm-{uuid.uuid4().hex}-{i}")
    # Alternate in blocks of 10 operations, each on a fresh name, so that this machine's load swings (which
    # last from milliseconds to seconds) hit every variant alike instead of one variant's whole round.
    prefix = uuid.uuid4().hex
    counter = iter(range(1 << 62))

    def fresh(run: Callable[[str], None]) -> Callable[[], None]:
        return lambda: run(f"bench:{prefix}:{next(counter)}")

    samples = interleave({label: fresh(run) for label, run in runners.items()}, ops * rounds, block=10)
    print()
    print(latency_table(samples, unit="µs", against=against))
    single.close()
    quorum.close()
    parallel.close()


def redlock_layers(redlock_url: str, redlock_ports: list[int], ops: int, rounds: int) -> None:
    """Where a redlock:// acquire+release spends its time: the 5-master floor, the driver alone (its acquire and
    release called directly, no front end) and the whole ``Lock``, in alternating blocks of 10 on fresh names;
    per block the wall clock and the client's CPU (``time.process_time``, which other processes' load moves
    less than the wall clock: the masters run on the same cores), medians per operation."""
    from lockkit.lock_core import new_token

    floor = RedlockFloor(redlock_ports)
    locks = lockkit.connect(redlock_url)
    driver = locks.backend_for("bench").driver
    # The same, reading every master's reply before an acquire or release returns (as before L-9): the
    # driver's "enough" tests switched off on a second client, for the A/B in one process.
    every = lockkit.connect(redlock_url)
    every_driver = every.backend_for("bench").driver
    every_driver._won = every_driver._released = None
    prefix = uuid.uuid4().hex
    counter = iter(range(1 << 62))

    def fresh() -> str:
        return f"bench:{prefix}:{next(counter)}"

    def alone() -> None:
        name, token = fresh(), new_token()
        driver.acquire(name, token, 10.0, None)
        driver.release(name, token)

    def whole() -> None:
        lock = locks.lock(fresh(), ttl=10)
        lock.acquire()
        lock.release()

    def whole_every() -> None:
        lock = every.lock(fresh(), ttl=10)
        lock.acquire()
        lock.release()

    runners: dict[str, Callable[[], None]] = {
        "5-master floor": lambda: floor(fresh()),
        "driver": alone,
        "Lock": whole,
        "Lock, all replies": whole_every,
    }
    for warm in runners.values():
        for _ in range(100):
            warm()
    wall: dict[str, list[float]] = {label: [] for label in runners}
    cpu: dict[str, list[float]] = {label: [] for label in runners}
    for _ in range(max(1, ops * rounds // 10)):
        for label, run in runners.items():
            started, used = time.perf_counter(), time.process_time()
            for _ in range(10):
                run()
            wall[label].append((time.perf_counter() - started) / 10)
            cpu[label].append((time.process_time() - used) / 10)
    w0, c0 = statistics.median(wall["5-master floor"]), statistics.median(cpu["5-master floor"])
    print(f"\n## redlock:// by layer (µs per acquire+release, blocks of 10, {len(wall['driver']) * 10} each)")
    print(f"{'':18} {'wall':>7} {'ratio':>6} {'CPU':>7} {'ratio':>6}")
    for label in runners:
        w, c = statistics.median(wall[label]), statistics.median(cpu[label])
        print(f"{label:18} {w * 1e6:7.0f} {w / w0:6.2f} {c * 1e6:7.0f} {c / c0:6.2f}")
    locks.close()
    every.close()
    floor.close()


def scale(url: str, port: int, n: int, hold: float) -> None:
    threads_before = threading.active_count()
    locks = lockkit.connect(url)
    prefix = f"bench:scale:{uuid.uuid4().hex}"
    started = time.monotonic()
    leases = [locks.lock(f"{prefix}:{i}", ttl=2).acquire() for i in range(n)]
    ramp = time.monotonic() - started
    renewed_before = locks.stats()[locks.backends()[0]]["renewals"]
    cpu0, t0 = time.process_time(), time.monotonic()
    time.sleep(hold)
    renew_cpu = time.process_time() - cpu0
    elapsed = time.monotonic() - t0
    renewed_during = locks.stats()[locks.backends()[0]]["renewals"] - renewed_before
    extra_threads = threading.active_count() - threads_before
    checker = redis.Redis(port=port)
    pipe = checker.pipeline(transaction=False)
    for i in range(n):
        pipe.get(f"lockkit:{{{prefix}:{i}}}")
    values = pipe.execute()
    held = sum(1 for lease, v in zip(leases, values, strict=False) if v == lease.token.encode() and lease.valid)
    stats = locks.stats()[locks.backends()[0]]
    renewals = stats["renewals"]
    logging.getLogger("lockkit").setLevel(logging.ERROR)  # closing a locker "loses" its 10,000 leases
    locks.close()
    rounds = max(1, round(renewed_during / n))  # renewal rounds during the hold only (not the ramp-up)
    keys = [f"lockkit:{{{prefix}:{i}}}" for i in range(n)]
    cpu1 = time.process_time()
    for _ in range(rounds):
        pipe = checker.pipeline(transaction=False)
        for key in keys:
            pipe.pexpire(key, 2000)
        pipe.execute()
    raw_cpu = time.process_time() - cpu1
    print(f"\n## {n} locks held with auto-renewal (ttl 2 s) for {elapsed:.1f} s (acquiring them took {ramp:.1f} s)")
    print(
        f"still held at the end: {held}/{n} (losses {stats['losses']}, renewals in all {renewals}); "
        f"extra threads: {extra_threads}; renewal rounds during the hold: {rounds}; "
        f"renewal CPU {renew_cpu:.2f} s vs raw PEXPIRE pipelines {raw_cpu:.2f} s ({renew_cpu / raw_cpu:.2f}x)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", type=int, default=400, help="operations per round and variant")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--contend", type=float, default=5.0, help="seconds of the contention run")
    parser.add_argument("--locks", type=int, default=10_000, help="locks held in the scale run")
    parser.add_argument("--hold", type=float, default=10.0, help="seconds the scale run holds them")
    parser.add_argument(
        "--parts",
        default="uncontended,contention,scale",
        help="comma-separated parts to run: uncontended, contention, scale; redlock: only redlock:// and its "
        "floor, uncontended; redlock-layers: redlock:// by layer (floor, driver, Lock, Lock reading all replies; "
        "wall and CPU); "
        "redlock-contention: only redlock://, contended",
    )
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    print(
        f"# lockkit Redis benchmark: Python {platform.python_version()}, redis-py {redis.__version__}, "
        f"{platform.machine()} {os.cpu_count()} CPUs, {platform.platform()}"
    )
    with RedisServer() as single, RedlockServers(5) as group:
        if parts & {"uncontended", "redlock"}:
            ports = [server.port for server in group.servers]
            uncontended(single.url, single.port, group.url, ports, args.ops, args.rounds, "uncontended" in parts)
        if "redlock-layers" in parts:
            redlock_layers(group.url, [server.port for server in group.servers], args.ops, args.rounds)
        if parts & {"contention", "redlock-contention"}:
            for url in (single.url, group.url) if "contention" in parts else (group.url,):
                print()
                print(contention(url, args.contend).report())
        if "scale" in parts:
            scale(single.url, single.port, args.locks, args.hold)


if __name__ == "__main__":
    main()
