"""lockkit against the lock libraries users would otherwise pick, on the same servers in the same run.

    .venv/bin/python benchmarks/compare_libraries.py                 # default sizes, about 2 minutes
    .venv/bin/python benchmarks/compare_libraries.py --quick         # smoke run, about 30 s
    .venv/bin/python benchmarks/compare_libraries.py --backends redis,etcd --contend 10

Starts its own throw-away servers on loopback (backends/servers.py): one Redis, five Redis masters,
a standalone ZooKeeper and a single-node etcd. For each backend, next to each other:

* the **raw floor**: the fewest requests any lock needs, on an open connection
  (Redis: ``SET NX PX`` + ``EVALSHA`` compare-and-delete; Redlock: the same two commands
  written to all five masters before any reply is read; ZooKeeper: kazoo ``create``
  ephemeral under an existing parent + ``delete``; etcd: a put-if-absent ``Txn`` under
  an existing lease + a delete ``Txn``);
* **lockkit**'s driver for that backend;
* the library a user would otherwise pick: redis-py ``redis.lock.Lock``,
  python-redis-lock (``redis_lock.Lock``), pottery ``Redlock`` (five masters), kazoo
  ``kazoo.recipe.lock.Lock``, and etcd-sdk-python's ``pyetcd`` ``client.lock(name, ttl)``
  (the python-etcd3 API). Each is used as its documentation shows, with a 10 s ttl and
  no renewal options; what a library does not offer (fencing, renewal) is not measured.

Two measurements, each interleaved in rounds (every round runs every implementation once,
in a rotated order, so that load drift hits all alike):

1. **Uncontended** acquire + release of a free lock, repeated on one name per round
   (after one untimed warm-up): median, p99, ratio of medians to the floor, and the
   server requests per operation (counted by the servers: Redis ``INFO`` commands
   processed, ZooKeeper ``mntr`` packets received, etcd gRPC messages received).
2. **Contention**: N processes (default 4) loop acquire → hold ~1 ms (busy) → release on
   one name: acquisitions/s, handoffs/s (an acquisition by a different process than the
   previous holder), fairness (fewest / most acquisitions per process), p99 and worst
   wait, server requests per acquisition (a high number means the waiters poll). An
   acquire still waiting at the end of a window gives up 1 s later; its wait counts
   toward the worst wait, marked ``≥``.

Every library runs in worker processes, so one that hangs or crashes is reported and
skipped (its column says why), never the end of the run. A library that is not installed
is skipped with a printed reason; install them with ``pip install python-redis-lock pottery``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import itertools
import math
import multiprocessing
import multiprocessing.connection
import os
import platform
import re
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TTL = 10  # seconds, for every implementation
GRACE = 1.0  # seconds an acquire may still wait after the end of a contention window
BACKENDS = ("redis", "redlock", "zookeeper", "etcd")
# Redis compare-and-delete, as in benchmarks/bench_redis.py (kept in sync by hand: importing
# that module here would pull redis-py into the coordinator, which only talks to workers).
CAD = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"


# ---------------------------------------------------------------------------- implementations
#
# Everything below up to the coordinator runs inside worker processes. An Impl owns the client
# connections of one implementation (created once per process, as a service would); handle(name)
# returns a lock object for one name with acquire(timeout) -> bool and release().


class Handle(Protocol):
    def acquire(self, timeout: float) -> bool: ...

    def release(self) -> None: ...


class Impl:
    def handle(self, name: str) -> Handle:
        raise NotImplementedError

    def close(self) -> None:
        pass


class _Calls:
    """A Handle made of two callables."""

    def __init__(self, acquire: Callable[[float], bool], release: Callable[[], object]) -> None:
        self._acquire, self._release = acquire, release

    def acquire(self, timeout: float) -> bool:
        return self._acquire(timeout)

    def release(self) -> None:
        self._release()


class LockkitImpl(Impl):
    def __init__(self, ep: dict[str, Any], backend: str) -> None:
        import lockkit

        self._timeout_error = lockkit.LockTimeout
        self.locks = lockkit.connect(ep["urls"][backend])

    def handle(self, name: str) -> Handle:
        lock = self.locks.lock(name, ttl=TTL)

        def acquire(timeout: float) -> bool:
            try:
                lock.acquire(timeout=timeout)
            except self._timeout_error:
                return False
            return True

        return _Calls(acquire, lock.release)

    def close(self) -> None:
        self.locks.close()


class RedisFloor(Impl):
    def __init__(self, ep: dict[str, Any]) -> None:
        import redis

        host, port = ep["redis"]
        self.client = redis.Redis(host=host, port=port)
        self.sha = self.client.script_load(CAD)

    def handle(self, name: str) -> Handle:
        token = uuid.uuid4().hex
        return _Calls(
            lambda _timeout: bool(self.client.set(name, token, nx=True, px=TTL * 1000)),
            lambda: self.client.evalsha(self.sha, 1, name, token),
        )

    def close(self) -> None:
        self.client.close()


class RedlockFloor(Impl):
    """SET NX PX written to every master, then every reply read; the same for EVALSHA."""

    def __init__(self, ep: dict[str, Any]) -> None:
        import redis

        self.conns = []
        for host, port in ep["redlock"]:
            conn = redis.Connection(host=host, port=port)
            conn.connect()
            self.conns.append(conn)
        for conn in self.conns:
            conn.send_command("SCRIPT", "LOAD", CAD)
        self.sha = [conn.read_response() for conn in self.conns].pop()
        self.quorum = len(self.conns) // 2 + 1

    def handle(self, name: str) -> Handle:
        token = uuid.uuid4().hex

        def acquire(_timeout: float) -> bool:
            for conn in self.conns:
                conn.send_command("SET", name, token, "NX", "PX", TTL * 1000)
            return sum(conn.read_response() is not None for conn in self.conns) >= self.quorum

        def release() -> None:
            for conn in self.conns:
                conn.send_command("EVALSHA", self.sha, 1, name, token)
            for conn in self.conns:
                conn.read_response()

        return _Calls(acquire, release)

    def close(self) -> None:
        for conn in self.conns:
            conn.disconnect()


class RedisPyLock(Impl):
    def __init__(self, ep: dict[str, Any]) -> None:
        import redis
        import redis.lock

        host, port = ep["redis"]
        self.client = redis.Redis(host=host, port=port)
        self.cls = redis.lock.Lock

    def handle(self, name: str) -> Handle:
        lock = self.cls(self.client, name, timeout=TTL)  # default sleep=0.1 between attempts
        return _Calls(lambda timeout: bool(lock.acquire(blocking=True, blocking_timeout=timeout)), lock.release)

    def close(self) -> None:
        self.client.close()


class PythonRedisLock(Impl):
    def __init__(self, ep: dict[str, Any]) -> None:
        import redis
        import redis_lock

        host, port = ep["redis"]
        self.client = redis.Redis(host=host, port=port)
        self.cls = redis_lock.Lock

    def handle(self, name: str) -> Handle:
        lock = self.cls(self.client, name, expire=TTL)
        # its timeout is whole seconds and may not exceed expire without auto_renewal
        return _Calls(lambda timeout: bool(lock.acquire(timeout=max(1, min(TTL, math.ceil(timeout))))), lock.release)

    def close(self) -> None:
        self.client.close()


class PotteryRedlock(Impl):
    def __init__(self, ep: dict[str, Any]) -> None:
        import pottery
        import redis

        self.masters = [redis.Redis(host=host, port=port) for host, port in ep["redlock"]]
        self.cls = pottery.Redlock

    def handle(self, name: str) -> Handle:
        lock = self.cls(key=name, masters=self.masters, auto_release_time=TTL)
        return _Calls(lambda timeout: bool(lock.acquire(timeout=timeout)), lock.release)

    def close(self) -> None:
        for master in self.masters:
            master.close()


class _KazooImpl(Impl):
    def __init__(self, ep: dict[str, Any]) -> None:
        from kazoo.client import KazooClient

        self.client = KazooClient(hosts=ep["zookeeper"])
        self.client.start(timeout=15)

    def close(self) -> None:
        self.client.stop()
        self.client.close()


class ZooKeeperFloor(_KazooImpl):
    def handle(self, name: str) -> Handle:
        parent = f"/bench-floor/{name}"
        self.client.ensure_path(parent)
        path = [""]

        def acquire(_timeout: float) -> bool:
            path[0] = self.client.create(f"{parent}/n", b"t", ephemeral=True)
            return True

        return _Calls(acquire, lambda: self.client.delete(path[0]))


class KazooLock(_KazooImpl):
    def handle(self, name: str) -> Handle:
        from kazoo.exceptions import LockTimeout

        lock = self.client.Lock(f"/bench-kazoo/{name}")

        def acquire(timeout: float) -> bool:
            try:
                return bool(lock.acquire(timeout=timeout))
            except LockTimeout:
                return False

        return _Calls(acquire, lock.release)


class EtcdFloor(Impl):
    def __init__(self, ep: dict[str, Any]) -> None:
        from lockkit.drivers.etcd.client import EtcdClient, cmp_created, delete_op, rpc

        self.rpc, self.cmp_created, self.delete_op = rpc, cmp_created, delete_op
        self.client = EtcdClient([tuple(ep["etcd"])])
        self.lease = self.client.grant(3600).ID  # revoked in close()

    def handle(self, name: str) -> Handle:
        rpc, key = self.rpc, f"/bench-floor/{name}".encode()
        put = rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=b"t" * 32, lease=self.lease))
        create = rpc.TxnRequest(compare=[self.cmp_created(key, 0)], success=[put])
        delete = rpc.TxnRequest(success=[self.delete_op(key)])
        return _Calls(lambda _timeout: bool(self.client.txn(create).succeeded), lambda: self.client.txn(delete))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.revoke(self.lease)
        self.client.close()


class PyEtcdLock(Impl):
    def __init__(self, ep: dict[str, Any]) -> None:
        import pyetcd

        host, port = ep["etcd"]
        self.client = pyetcd.client(host=host, port=port)

    def handle(self, name: str) -> Handle:
        lock = self.client.lock(name, ttl=TTL)
        return _Calls(lambda timeout: bool(lock.acquire(timeout=timeout)), lock.release)

    def close(self) -> None:
        self.client.close()


@dataclass(frozen=True)
class Spec:
    key: str  # "backend/short"
    label: str
    dist: str  # PyPI distribution whose version is shown
    factory: Callable[[dict[str, Any]], Impl]
    floor: bool = False

    @property
    def backend(self) -> str:
        return self.key.split("/", 1)[0]


SPECS = [
    Spec("redis/floor", "raw floor: SET NX PX + EVALSHA", "redis", RedisFloor, floor=True),
    Spec("redis/lockkit", "lockkit redis://", "lockkit", lambda ep: LockkitImpl(ep, "redis")),
    Spec("redis/redis-py", "redis-py redis.lock.Lock", "redis", RedisPyLock),
    Spec("redis/python-redis-lock", "python-redis-lock", "python-redis-lock", PythonRedisLock),
    Spec("redlock/floor", "raw floor: SET NX PX + EVALSHA, 5 masters", "redis", RedlockFloor, floor=True),
    Spec("redlock/lockkit", "lockkit redlock://", "lockkit", lambda ep: LockkitImpl(ep, "redlock")),
    Spec("redlock/pottery", "pottery Redlock", "pottery", PotteryRedlock),
    Spec("zookeeper/floor", "raw floor: create ephemeral + delete", "kazoo", ZooKeeperFloor, floor=True),
    Spec("zookeeper/lockkit", "lockkit zookeeper://", "lockkit", lambda ep: LockkitImpl(ep, "zookeeper")),
    Spec("zookeeper/kazoo", "kazoo Lock recipe", "kazoo", KazooLock),
    Spec("etcd/floor", "raw floor: put-if-absent txn + delete", "etcd-sdk-python", EtcdFloor, floor=True),
    Spec("etcd/lockkit", "lockkit etcd://", "lockkit", lambda ep: LockkitImpl(ep, "etcd")),
    Spec("etcd/pyetcd", "pyetcd client.lock (etcd-sdk-python)", "etcd-sdk-python", PyEtcdLock),
]
SPEC = {spec.key: spec for spec in SPECS}


# ---------------------------------------------------------------------------- worker process


def _uncontended(impl: Impl, name: str, ops: int) -> list[float]:
    handle = impl.handle(name)
    samples: list[float] = []
    for i in range(ops + 1):  # the first one is the untimed warm-up
        started = time.perf_counter()
        ok = handle.acquire(TTL)
        if ok:
            handle.release()
        elapsed = time.perf_counter() - started
        if not ok:
            raise RuntimeError(f"acquire of a free lock failed (operation {i})")
        if i:
            samples.append(elapsed)
    return samples


Grants = list[tuple[float, float]]


def _contend(handle: Handle, start: float, seconds: float, hold: float) -> tuple[Grants, list[float]]:
    """Loop acquire → busy hold → release until start + seconds; (got, waited) per grant, waits of give-ups."""
    while time.monotonic() < start:
        time.sleep(0.0005)
    end = start + seconds
    grants: list[tuple[float, float]] = []
    gave_up: list[float] = []
    while (asked := time.monotonic()) < end:
        ok = handle.acquire(end - asked + GRACE)
        got = time.monotonic()
        if not ok:
            gave_up.append(got - asked)
            continue
        spin = got + hold
        while time.monotonic() < spin:
            pass
        handle.release()
        grants.append((got, got - asked))
    return grants, gave_up


def worker_main(conn: multiprocessing.connection.Connection, ep: dict[str, Any]) -> None:
    impls: dict[str, Impl] = {}
    handle: Handle | None = None
    try:
        while True:
            msg = conn.recv()
            if msg[0] == "stop":
                break
            try:
                key = msg[1]
                if key not in impls:
                    impls[key] = SPEC[key].factory(ep)
                if msg[0] == "uncontended":
                    conn.send(("ok", _uncontended(impls[key], msg[2], msg[3])))
                elif msg[0] == "prepare":
                    handle = impls[key].handle(msg[2])
                    conn.send(("ok", None))
                elif msg[0] == "run":
                    assert handle is not None
                    conn.send(("ok", _contend(handle, *msg[2:])))
                    handle = None
            except Exception as exc:
                conn.send(("error", f"{type(exc).__name__}: {exc}"[:300]))
    finally:
        for impl in impls.values():
            with contextlib.suppress(Exception):
                impl.close()


# ---------------------------------------------------------------------------- coordinator


class Hung(Exception):
    pass


class Pool:
    """N worker processes (spawned), one pipe each; restartable after a hang."""

    def __init__(self, n: int, ep: dict[str, Any]) -> None:
        self.n, self.ep = n, ep
        self.ctx = multiprocessing.get_context("spawn")
        self.procs: list[Any] = []
        self.conns: list[multiprocessing.connection.Connection] = []
        self.start()

    def start(self) -> None:
        for _ in range(self.n):
            here, there = self.ctx.Pipe()
            proc = self.ctx.Process(target=worker_main, args=(there, self.ep), daemon=True)
            proc.start()
            there.close()
            self.procs.append(proc)
            self.conns.append(here)

    def ask(self, indices: list[int], msgs: list[tuple[Any, ...]], timeout: float) -> list[tuple[str, Any]]:
        for i, msg in zip(indices, msgs, strict=True):
            self.conns[i].send(msg)
        deadline = time.monotonic() + timeout
        replies = []
        for i in indices:
            if not self.conns[i].poll(max(0.0, deadline - time.monotonic())):
                raise Hung(f"no reply from worker {i} in {timeout:.0f} s")
            replies.append(self.conns[i].recv())
        return replies

    def stop(self, kill: bool = False) -> None:
        for conn in self.conns:
            with contextlib.suppress(OSError, ValueError):
                if not kill:
                    conn.send(("stop",))
        for proc in self.procs:
            proc.join(0 if kill else 15)
            if proc.is_alive():  # only our own children, by their handle
                proc.kill()
                proc.join(5)
        for conn in self.conns:
            conn.close()
        self.procs, self.conns = [], []

    def restart(self) -> None:
        self.stop(kill=True)
        self.start()


@dataclass
class Row:
    spec: Spec
    version: str = ""
    skipped: str = ""  # reason, when not measured at all
    failed: str = ""  # reason, when a measurement broke off
    samples: list[float] = field(default_factory=list)
    requests_uncontended: int = 0
    grants: list[tuple[float, float, int]] = field(default_factory=list)  # (got, waited, worker)
    gave_up: list[float] = field(default_factory=list)
    per_worker: list[int] = field(default_factory=list)
    requests_contended: int = 0
    leases_uncontended: int = 0
    leases_contended: int = 0
    contended_seconds: float = 0.0
    handoffs: int = 0


class Counter:
    """Requests a backend's servers received, as the servers count them (and etcd leases granted).

    Redis: ``total_reads_processed`` (socket reads: one per request or pipelined batch; commands
    run inside scripts are not counted, unlike ``total_commands_processed``); ZooKeeper:
    ``zk_packets_received``; etcd: gRPC messages received by the etcd services.
    """

    def __init__(self, backend: str, servers: list[Any]) -> None:
        self.backend, self.servers = backend, servers
        # what one reading adds to the next one's count: Redis counts the read of our INFO
        self.overhead = len(servers) if backend in ("redis", "redlock") else 0

    def delta(self, before: tuple[int, int] | None, after: tuple[int, int] | None) -> tuple[int, int]:
        if before is None or after is None:
            return 0, 0
        return after[0] - before[0] - self.overhead, after[1] - before[1]

    def __call__(self) -> tuple[int, int] | None:
        try:
            if self.backend in ("redis", "redlock"):
                total = 0
                for server in self.servers:
                    with contextlib.closing(_socket_to(server.address)) as sock:
                        sock.sendall(b"*2\r\n$4\r\nINFO\r\n$5\r\nstats\r\n")
                        text = _read_bulk(sock)
                    total += _metric(text, r"total_reads_processed:(\d+)")
                return total, 0
            if self.backend == "zookeeper":
                return _metric(self.servers[0].four_letter_word("mntr"), r"zk_packets_received\s+(\d+)"), 0
            _status, body = self.servers[0].http_get("/metrics", timeout=5)
            text = body.decode()
            requests = sum(
                int(float(line.rsplit(" ", 1)[1]))
                for line in text.splitlines()
                if line.startswith("grpc_server_msg_received_total{") and "etcdserverpb" in line
            )
            return requests, _metric(text, r"(?m)^etcd_debugging_lease_granted_total (\d+)")
        except Exception:
            return None


def _metric(text: str, pattern: str) -> int:
    found = re.search(pattern, text)
    if found is None:
        raise ValueError(pattern)
    return int(found.group(1))


def _socket_to(address: tuple[str, int]) -> Any:
    import socket

    return socket.create_connection(address, timeout=5)


def _read_bulk(sock: Any) -> str:
    data = b""
    while b"\r\n" not in data:
        data += sock.recv(65536)
    header, _, rest = data.partition(b"\r\n")
    size = int(header[1:])
    while len(rest) < size:
        rest += sock.recv(65536)
    return rest[:size].decode()


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _rotated(items: list[Row], by: int) -> list[Row]:
    k = by % len(items) if items else 0
    return items[k:] + items[:k]


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _call(pool: Pool, row: Row, indices: list[int], msgs: list[tuple[Any, ...]], timeout: float) -> list[Any] | None:
    """Ask workers; on an error or a hang mark the row failed (restarting the pool after a hang)."""
    try:
        replies = pool.ask(indices, msgs, timeout)
    except Hung as exc:
        row.failed = f"hung: {exc}; workers restarted"
        pool.restart()
        return None
    errors = [payload for status, payload in replies if status != "ok"]
    if errors:
        row.failed = errors[0]
        return None
    return [payload for _, payload in replies]


def measure_uncontended(pool: Pool, rows: dict[str, list[Row]], counters: dict[str, Counter], args: Any) -> None:
    for rnd in range(args.rounds):
        _progress(f"uncontended round {rnd + 1}/{args.rounds}")
        for backend, backend_rows in rows.items():
            for row in _rotated([r for r in backend_rows if not (r.skipped or r.failed)], rnd):
                before = counters[backend]()
                name = f"cmp-u-{uuid.uuid4().hex[:12]}"
                got = _call(pool, row, [0], [("uncontended", row.spec.key, name, args.ops)], 60 + args.ops * TTL)
                after = counters[backend]()
                if got is None:
                    continue
                row.samples.extend(got[0])
                requests, leases = counters[backend].delta(before, after)
                row.requests_uncontended += requests
                row.leases_uncontended += leases


def measure_contention(pool: Pool, rows: dict[str, list[Row]], counters: dict[str, Counter], args: Any) -> None:
    window = args.contend / args.contend_rounds
    workers = list(range(args.procs))
    for rnd in range(args.contend_rounds):
        _progress(f"contention round {rnd + 1}/{args.contend_rounds} ({window:g} s per implementation)")
        for backend, backend_rows in rows.items():
            live = [r for r in backend_rows if not (r.skipped or r.failed or r.spec.floor)]
            for row in _rotated(live, rnd):
                if not row.per_worker:
                    row.per_worker = [0] * args.procs
                name = f"cmp-c-{uuid.uuid4().hex[:12]}"
                if _call(pool, row, workers, [("prepare", row.spec.key, name)] * args.procs, 60) is None:
                    continue
                before = counters[backend]()
                start = time.monotonic() + 0.2
                msg = ("run", row.spec.key, start, window, args.hold / 1000)
                got = _call(pool, row, workers, [msg] * args.procs, window + GRACE + 60)
                after = counters[backend]()
                if got is None:
                    continue
                end = start + window
                grants = sorted(
                    (at, waited, w) for w, (worker_grants, _) in enumerate(got) for at, waited in worker_grants
                )
                inside = [g for g in grants if g[0] <= end]
                row.handoffs += sum(1 for a, b in itertools.pairwise(inside) if a[2] != b[2])
                for _, _, w in inside:
                    row.per_worker[w] += 1
                row.grants.extend(grants)
                row.gave_up.extend(waited for _, gave in got for waited in gave)
                row.contended_seconds += window
                requests, leases = counters[backend].delta(before, after)
                row.requests_contended += requests
                row.leases_contended += leases


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}" if seconds < 0.1 else f"{seconds * 1e3:.1f}"


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def render(backend: str, title: str, rows: list[Row], procs: int, hold_ms: float) -> str:
    floor = next((r for r in rows if r.spec.floor and r.samples), None)
    base = statistics.median(floor.samples) if floor else None
    out = [
        f"### {title}",
        "",
        "| implementation | version | median ms | p99 ms | × floor | req/op "
        f"| acq/s | handoffs/s | fairness (min/max of {procs}) | p99 wait ms | worst wait ms | req/acq |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    notes = []
    for row in rows:
        cells = [row.spec.label, row.version or "—"]
        if row.skipped:
            out.append("| " + " | ".join([*cells, *["—"] * 10]) + " |")
            notes.append(f"- {row.spec.label}: skipped: {row.skipped}")
            continue
        if row.samples:
            med = statistics.median(row.samples)
            per_op = row.requests_uncontended / len(row.samples) if row.requests_uncontended else None
            cells += [
                _ms(med),
                _ms(_pct(row.samples, 0.99)),
                f"{med / base:.2f}" if base else "—",
                f"{per_op:.1f}" if per_op is not None else "—",
            ]
        else:
            cells += ["—"] * 4
        counted = sum(row.per_worker)
        if row.spec.floor:
            cells += ["(no waiting)", "", "", "", "", ""]
        elif row.contended_seconds and counted:
            waits = [w for _, w, _ in row.grants]
            worst = max(waits)
            worst_cell = _ms(worst)
            if row.gave_up and max(row.gave_up) > worst:
                worst_cell = "≥" + _ms(max(row.gave_up))
            counts = row.per_worker
            cells += [
                f"{counted / row.contended_seconds:.0f}",
                f"{row.handoffs / row.contended_seconds:.0f}",
                f"{min(counts) / max(counts):.2f} ({min(counts)}/{max(counts)})",
                _ms(_pct(waits, 0.99)),
                worst_cell,
                f"{row.requests_contended / counted:.1f}" if row.requests_contended else "—",
            ]
        elif row.contended_seconds:
            cells += ["0", "0", "0", "—", "≥" + _ms(max(row.gave_up, default=row.contended_seconds)), "—"]
        else:
            cells += ["—"] * 6
        out.append("| " + " | ".join(cells) + " |")
        if row.samples and row.leases_uncontended / len(row.samples) >= 0.1:
            notes.append(
                f"- {row.spec.label}: etcd leases granted per acquire+release: "
                f"{row.leases_uncontended / len(row.samples):.2f} uncontended"
                + (f", {row.leases_contended / counted:.2f} under contention" if counted else "")
            )
        if row.failed:
            notes.append(f"- {row.spec.label}: measurement stopped: {row.failed}")
        if row.gave_up:
            notes.append(
                f"- {row.spec.label}: {len(row.gave_up)} acquire(s) still waiting {GRACE:g} s after a "
                f"window ended (gave up after {_ms(max(row.gave_up))} ms)"
            )
    if notes:
        out += ["", *notes]
    return "\n".join(out)


TITLES = {
    "redis": "Redis (one server)",
    "redlock": "Redlock (5 independent Redis masters)",
    "zookeeper": "ZooKeeper (standalone)",
    "etcd": "etcd (single node)",
}


@contextlib.contextmanager
def started_servers(wanted: list[str]) -> Iterator[tuple[dict[str, Any], dict[str, list[Any]], dict[str, str]]]:
    """Start the wanted backends' servers; yields (endpoints for workers, servers, reasons for failures)."""
    from backends.servers import EtcdServer, RedisServer, RedlockServers, ZooKeeperServer

    ep: dict[str, Any] = {"urls": {}}
    servers: dict[str, list[Any]] = {}
    failed: dict[str, str] = {}
    with contextlib.ExitStack() as stack:
        for backend in wanted:
            try:
                if backend == "redis":
                    single = stack.enter_context(RedisServer())
                    ep["redis"], servers["redis"], url = list(single.address), [single], single.url
                elif backend == "redlock":
                    group = stack.enter_context(RedlockServers(5))
                    ep["redlock"], servers["redlock"] = [list(s.address) for s in group], list(group)
                    url = group.url
                elif backend == "zookeeper":
                    zk = stack.enter_context(ZooKeeperServer())
                    ep["zookeeper"], servers["zookeeper"], url = zk.hosts, [zk], zk.url
                else:
                    etcd = stack.enter_context(EtcdServer())
                    ep["etcd"], servers["etcd"], url = list(etcd.address), [etcd], etcd.url
                ep["urls"][backend] = url
            except Exception as exc:
                failed[backend] = f"server did not start: {type(exc).__name__}: {str(exc)[:200]}"
        yield ep, servers, failed


def server_versions(servers: dict[str, list[Any]]) -> str:
    found = []
    for backend in ("redis", "zookeeper", "etcd"):
        group = servers.get(backend) or (servers.get("redlock") if backend == "redis" else None)
        if not group:
            continue
        with contextlib.suppress(Exception):
            if backend == "redis":
                with contextlib.closing(_socket_to(group[0].address)) as sock:
                    sock.sendall(b"*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n")
                    text = _read_bulk(sock)
                found.append("Redis " + re.search(r"redis_version:(\S+)", text).group(1))  # type: ignore[union-attr]
            elif backend == "zookeeper":
                text = group[0].four_letter_word("srvr")
                found.append("ZooKeeper " + re.search(r"version: ([0-9.]+)", text).group(1))  # type: ignore[union-attr]
            else:
                found.append("etcd " + group[0].version())
    return ", ".join(found)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes for a smoke run (about 40 s)")
    parser.add_argument("--ops", type=int, help="uncontended operations per round and implementation (200)")
    parser.add_argument("--rounds", type=int, help="uncontended rounds (5)")
    parser.add_argument("--contend", type=float, help="contention seconds per implementation, all rounds (8)")
    parser.add_argument("--contend-rounds", type=int, help="contention rounds the seconds are split into (2)")
    parser.add_argument("--procs", type=int, default=4, help="contending processes (4)")
    parser.add_argument("--hold", type=float, default=1.0, help="milliseconds each holder keeps the lock (1)")
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated subset of the default")
    parser.add_argument("--skip", default="", help="comma-separated implementations to leave out, e.g. redis/redis-py")
    parser.add_argument(
        "--url-option",
        action="append",
        default=[],
        metavar="BACKEND:KEY=VALUE",
        help="add an option to lockkit's URL for one backend (repeatable), e.g. redis:timeout=1",
    )
    args = parser.parse_args(argv)
    sizes = {"ops": (200, 40), "rounds": (5, 2), "contend": (8.0, 1.5), "contend_rounds": (2, 1)}
    for key, (full, quick) in sizes.items():
        if getattr(args, key) is None:
            setattr(args, key, quick if args.quick else full)
    wanted = [b for b in args.backends.split(",") if b]
    unknown = sorted(set(wanted) - set(BACKENDS))
    if unknown or args.procs < 2 or args.ops < 1 or args.rounds < 1 or args.contend <= 0 or args.contend_rounds < 1:
        parser.error(f"bad sizes or unknown backends {unknown}")
    skip = {s for s in args.skip.split(",") if s}
    url_options: dict[str, list[str]] = {}
    for option in args.url_option:
        backend, _, pair = option.partition(":")
        if backend not in BACKENDS or "=" not in pair:
            parser.error(f"--url-option {option!r}: expected BACKEND:KEY=VALUE")
        url_options.setdefault(backend, []).append(pair)

    began = time.monotonic()
    print(
        f"# lockkit against other lock libraries: Python {platform.python_version()}, {platform.machine()}, "
        f"{os.cpu_count()} CPUs, {platform.platform()}, load average {os.getloadavg()[0]:.1f}"
    )
    with started_servers(wanted) as (ep, servers, server_failed):
        for backend, pairs in url_options.items():
            if backend in ep["urls"]:
                base = ep["urls"][backend]
                ep["urls"][backend] = base + ("&" if "?" in base else "?") + "&".join(pairs)
        print(f"servers on 127.0.0.1: {server_versions(servers) or 'none'}")
        print(
            f"uncontended: {args.rounds} rounds × {args.ops} acquire+release per implementation; contention: "
            f"{args.procs} processes, hold {args.hold:g} ms, {args.contend:g} s per implementation in "
            f"{args.contend_rounds} round(s); ttl {TTL} s everywhere"
        )
        for backend, pairs in url_options.items():
            print(f"lockkit {backend}:// URL options: {'&'.join(pairs)}")
        rows: dict[str, list[Row]] = {}
        for backend in wanted:
            rows[backend] = []
            for spec in (s for s in SPECS if s.backend == backend):
                row = Row(spec, version=_version(spec.dist) or "")
                if backend in server_failed:
                    row.skipped = server_failed[backend]
                elif spec.key in skip:
                    row.skipped = "left out with --skip"
                elif not row.version:
                    row.skipped = f"{spec.dist} is not installed (pip install {spec.dist})"
                rows[backend].append(row)
        counters = {b: Counter(b, servers.get(b, [])) for b in wanted}
        pool = Pool(args.procs, ep)
        try:
            measure_uncontended(pool, rows, counters, args)
            measure_contention(pool, rows, counters, args)
        finally:
            pool.stop()
        print()
        for backend in wanted:
            print(render(backend, TITLES[backend], rows[backend], args.procs, args.hold))
            print()
        if servers.get("etcd"):
            print(f"etcd leases alive at the end: {_etcd_leases(servers['etcd'][0])}")
    print(f"total time {time.monotonic() - began:.0f} s")
    return 0


def _etcd_leases(server: Any) -> str:
    try:
        _status, body = server.http_get("/metrics", timeout=5)
        text = body.decode()
        granted, revoked, expired = (
            _metric(text, rf"(?m)^etcd_{name}_total (\d+)")
            for name in ("debugging_lease_granted", "debugging_lease_revoked", "debugging_server_lease_expired")
        )
        return f"{granted - revoked} (granted {granted}, revoked or expired {revoked}, of which expired {expired})"
    except Exception as exc:
        return f"unknown ({type(exc).__name__})"


if __name__ == "__main__":
    sys.exit(main())
