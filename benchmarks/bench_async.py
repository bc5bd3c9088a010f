"""The asyncio faces against asyncio floors (issue 17's "async faces" goal: each ≤ 1.1×).

    .venv/bin/python benchmarks/bench_async.py [--ops 400] [--rounds 5] [--parts redis,redlock,etcd,zookeeper]

Starts its own throw-away servers on loopback (backends/servers.py). Uncontended acquire+release on fresh
names, one event loop, alternating in blocks of 10 with each face's floor, which does the same raw commands
the way an asyncio program would without lockkit:

* redis:// (lockkit's own asyncio driver) against redis.asyncio on one bare connection: ``SET NX PX``, read,
  then ``EVALSHA`` compare-and-delete (script preloaded), read;
* redlock:// (5 masters) against redis.asyncio on five bare connections: ``SET NX PX`` written to all five,
  then all replies read, then the same for the ``EVALSHA`` (the 5-master parallel floor, on the loop);
* etcd://, whose asyncio face is the thread-offload adapter (lockkit.offload.ThreadOffloadDriver), against
  the raw calls offloaded the same way: the put-if-absent txn under a lease, then the delete txn, each
  submitted to a thread pool and awaited through ``asyncio.wrap_future``;
* zookeeper://, also the thread-offload adapter, against kazoo's raw calls offloaded the same way: the
  ``multi`` that makes a fresh name's parent (container) and ephemeral sequential node together, then the
  ``delete``, each submitted to a thread pool and awaited (the requests lockkit sends for a fresh name).

Medians, p99 and ratios of medians against the row's floor.

``--parts redis-layers`` (``etcd-layers``, ``zookeeper-layers``) profiles a face layer by layer instead
(issue 17: where the time over the floor goes): the CPU of this process (``time.process_time``, which other
processes' load does not inflate) and the wall time per acquire+release of the floor, of lockkit's own
connection sending the floor's commands, and the driver's own calls' bytes (made by the acquire flow, no node:
what the server's scripts cost over the floor's commands), of its node running the driver's own calls, of the
driver, of
the whole ``AsyncLock`` (offloaded faces: the blocking driver offloaded the floor's way, the offload adapter,
the ``AsyncLock``) and, for redis://, of the ``AsyncLock`` with its reads blocking right after each send (no
loop turns before a reply: ``stream.REPLY_TURNS = 0``, which shows what those turns save), each with its ratio
to the floor, interleaved in blocks and the median of 5 rounds; and the turns of the event loop and the tasks
each layer makes per acquire+release (counted over 100 more).

``--parts redis-turns`` times the redis:// ``AsyncLock`` with the reader's loop turns before a reply set three
ways (none; 3 within 30 µs; 6 within 60 µs, the default: ``lockkit/drivers/redis/_async/stream.py``) against
the floor, interleaved in one process, per-operation medians, and each one's CPU against the floor's.

``--parts front`` measures the front end alone (issue 17): ``AsyncLock`` over a driver stub that answers each call
after one turn of the loop (``asyncio.sleep(0)``), against the stub's own calls, layer by layer as above (no
server; 10 times ``--ops``), and the front end's own CPU per acquire+release, the difference of the two.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import functools
import os
import platform
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis
import redis.asyncio

import lockkit
from backends.servers import EtcdServer, RedisServer, RedlockServers, ZooKeeperServer
from benchmarks._common import latency_table

CAD = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"
Op = Callable[[str], Awaitable[None]]


async def ainterleave(ops: dict[str, Op], rounds: int, block: int = 10) -> dict[str, list[float]]:
    """Time each op ``rounds`` times on fresh names, in alternating blocks of ``block`` (load drift hits all)."""
    samples: dict[str, list[float]] = {label: [] for label in ops}
    prefix, counter = uuid.uuid4().hex, 0
    for op in ops.values():  # warm-up: connections, scripts, the first lease
        for _ in range(50):
            counter += 1
            await op(f"warm:{prefix}:{counter}")
    while min(len(s) for s in samples.values()) < rounds:
        for label, op in ops.items():
            for _ in range(block):
                counter += 1
                name = f"bench:{prefix}:{counter}"
                started = time.perf_counter()
                await op(name)
                samples[label].append(time.perf_counter() - started)
    return samples


def via(locks: lockkit.AsyncLocker) -> Op:
    async def op(name: str) -> None:
        lock = locks.lock(name, ttl=10)
        await lock.acquire()
        await lock.release()

    return op


async def _connections(ports: list[int]) -> tuple[list[redis.asyncio.Connection], str]:
    """Bare redis.asyncio connections, the compare-and-delete script loaded on each."""
    conns = [redis.asyncio.Connection(port=port) for port in ports]
    for conn in conns:
        await conn.connect()
        await conn.send_command("SCRIPT", "LOAD", CAD)
    shas = [await conn.read_response() for conn in conns]
    return conns, shas[0].decode() if isinstance(shas[0], bytes) else str(shas[0])


async def redis_part(port: int, url: str, ops: int) -> str:
    (conn,), sha = await _connections([port])

    async def floor(name: str) -> None:
        await conn.send_command("SET", name, "token", "NX", "PX", 10_000)
        assert await conn.read_response() is not None
        await conn.send_command("EVALSHA", sha, 1, name, "token")
        await conn.read_response()

    async with lockkit.connect_async(url) as locks:
        samples = await ainterleave({"redis.asyncio floor": floor, "redis:// async": via(locks)}, ops)
    await conn.disconnect()
    return latency_table(samples, unit="µs")


async def turns_and_tasks(op: Op, prefix: str, count: int = 100) -> tuple[float, float]:
    """Turns of the event loop (its selector's ``select`` calls) and tasks created per op: each costs a pass
    through the loop, whatever the load (issue 17: the shielded release was three turns and a task)."""
    loop = asyncio.get_running_loop()
    selector: Any = loop._selector  # type: ignore[attr-defined]  # a benchmark may look inside the loop
    select, factory = selector.select, loop.get_task_factory()
    turns = tasks = 0

    def counting_select(timeout: float | None = None) -> Any:
        nonlocal turns
        turns += 1
        return select(timeout)

    def counting_factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Future[Any]:
        nonlocal tasks
        tasks += 1
        return asyncio.Task(coro, loop=loop, **kwargs)

    selector.select = counting_select
    loop.set_task_factory(counting_factory)
    try:
        for i in range(count):
            await op(f"count:{prefix}:{i}")
    finally:
        selector.select = select
        loop.set_task_factory(factory)
    return turns / count, tasks / count


async def alayers(ops_by_layer: dict[str, Op], ops: int, block: int = 20) -> str:
    """Process CPU (``time.process_time``) and wall time per op of each layer, interleaved in blocks of ``block``,
    medians of 5 rounds, ratios to the first (the floor); and the loop turns and tasks per op of each."""
    prefix = uuid.uuid4().hex
    tags = {label: f"layer{n:04d}" for n, label in enumerate(ops_by_layer)}  # names of one length in every layer
    counted: dict[str, tuple[float, float]] = {}
    for label, op in ops_by_layer.items():
        for i in range(50):
            await op(f"warm:{prefix}:{tags[label]}:{i}")
        counted[label] = await turns_and_tasks(op, f"{prefix}:{tags[label]}")
    blocks = max(1, ops // 5 // block)
    cpu: dict[str, list[float]] = {label: [] for label in ops_by_layer}
    wall: dict[str, list[float]] = {label: [] for label in ops_by_layer}
    for round_ in range(5):
        spent = {label: [0.0, 0.0] for label in ops_by_layer}
        for b in range(blocks):
            for label, op in ops_by_layer.items():
                started_cpu, started = time.process_time(), time.perf_counter()
                for i in range(block):
                    await op(f"bench:{prefix}:{tags[label]}:{round_}:{b}:{i}")
                spent[label][0] += time.process_time() - started_cpu
                spent[label][1] += time.perf_counter() - started
        for label in ops_by_layer:
            cpu[label].append(spent[label][0] / (blocks * block))
            wall[label].append(spent[label][1] / (blocks * block))
    width = max(map(len, ops_by_layer))
    floor = next(iter(ops_by_layer))
    cpu_floor, wall_floor = statistics.median(cpu[floor]), statistics.median(wall[floor])
    lines = [
        f"## Layer by layer, µs per acquire+release (median of 5 rounds of {blocks * block}, interleaved in blocks "
        f"of {block})",
        f"{'':{width}} {'CPU':>7} {'ratio':>6} {'wall':>7} {'ratio':>6} {'turns':>6} {'tasks':>6}",
    ]
    for label in ops_by_layer:
        c, w = statistics.median(cpu[label]), statistics.median(wall[label])
        turns, tasks = counted[label]
        lines.append(
            f"{label:{width}} {c * 1e6:7.1f} {c / cpu_floor:6.2f} {w * 1e6:7.1f} {w / wall_floor:6.2f} "
            f"{turns:6.2f} {tasks:6.2f}"
        )
    return "\n".join(lines)


def offloaded_layers(locks: lockkit.AsyncLocker, floor: Op, pool: concurrent.futures.Executor) -> dict[str, Op]:
    """The layers of a thread-offloaded face: the floor, the blocking driver offloaded the floor's way (no
    shield, no Cancel), lockkit's offload adapter over it, and the whole ``AsyncLock``."""
    adapter: Any = locks.backend_for("layers").driver
    blocking, token = adapter.sync, "t" * 32

    async def bare(name: str) -> None:
        assert await asyncio.wrap_future(pool.submit(blocking.acquire, name, token, 10, time.monotonic() + 10))
        await asyncio.wrap_future(pool.submit(blocking.release, name, token))

    async def offloaded(name: str) -> None:
        assert await adapter.acquire(name, token, 10, time.monotonic() + 10) is not None
        await adapter.release(name, token)

    return {
        "offloaded raw calls (floor)": floor, "blocking driver, offloaded bare": bare,
        "lockkit.offload adapter": offloaded, "AsyncLock": via(locks),
    }  # fmt: skip


class _StubDriver:
    """A driver that answers every acquire with a grant and every release with success after one turn of the loop:
    what is left of an ``AsyncLock`` over it is the front end's own Python."""

    finish_inline = True

    def __init__(self, clock: Callable[[], float], guarantees: Any) -> None:
        self.clock, self.guarantees, self.fence = clock, guarantees, 0

    async def acquire(self, name: str, token: str, ttl: float, deadline: float | None, cancel: Any = None) -> Any:
        from lockkit.driver import Grant

        sent_at = self.clock()
        await asyncio.sleep(0)
        self.fence += 1
        return Grant(self.fence, ttl, sent_at)

    async def release(self, name: str, token: str) -> bool:
        await asyncio.sleep(0)
        return True

    async def close(self) -> None:
        pass


async def front_part(ops: int) -> str:
    from lockkit.drivers.redis.single import GUARANTEES

    async with lockkit.connect_async("memory://bench-front") as locks:
        backend: Any = locks.backend_for("front")
        real, stub = backend._driver, _StubDriver(locks.clock, GUARANTEES)
        backend._driver = stub  # a benchmark may swap the driver: the front end is what it measures
        token = "t" * 32

        async def bare(name: str) -> None:
            await stub.acquire(name, token, 10.0, None)
            await stub.release(name, token)

        try:
            table = await alayers({"driver stub alone": bare, "AsyncLock over the stub": via(locks)}, ops * 10)
        finally:
            backend._driver = real
    rows = [line.split() for line in table.splitlines()[2:]]
    own = float(rows[1][-6]) - float(rows[0][-6])
    return f"{table}\nthe front end's own CPU per acquire+release: {own:.1f} µs"


async def redis_layers_part(port: int, url: str, ops: int) -> str:
    from lockkit.drivers.redis._async import stream
    from lockkit.drivers.redis._async.connection import AsyncConnection
    from lockkit.drivers.redis.calls import pack, pack_calls
    from lockkit.drivers.redis.flow import acquire_flow, release_call, waiter_id

    (conn,), sha = await _connections([port])

    async def floor(name: str) -> None:
        await conn.send_command("SET", name, "token", "NX", "PX", 10_000)
        assert await conn.read_response() is not None
        await conn.send_command("EVALSHA", sha, 1, name, "token")
        await conn.read_response()

    async with lockkit.connect_async(url) as locks:
        driver: Any = locks.backend_for("layers").driver
        node, token = driver._node, "t" * 32
        own = AsyncConnection(driver.spec)
        await own.connect()
        wid = waiter_id(driver._hub.client_id, 10, token)

        async def transport(name: str) -> None:  # lockkit's own connection, the floor's commands
            await own.send(pack([("SET", name, "token", "NX", "PX", 10_000)]))
            assert (await own.read(1, time.monotonic() + 5))[0] is not None
            await own.send(pack([("EVALSHA", sha, 1, name, "token")]))
            await own.read(1, time.monotonic() + 5)

        async def driver_bytes(name: str) -> None:  # lockkit's own connection, the driver's calls' own bytes
            keys = driver._keys(name)
            flow = acquire_flow(keys, token, 10, time.monotonic() + 10, driver.clock, "layers", wid, False)
            await own.send(pack_calls(flow.send(None).calls))
            assert (await own.read(1, time.monotonic() + 5))[0][0] == 1
            await own.send(pack_calls([release_call(keys, token)]))
            await own.read(1, time.monotonic() + 5)
            flow.close()

        async def node_calls(name: str) -> None:  # the node (pool, hello, NOSCRIPT plan), the driver's calls
            keys = driver._keys(name)
            flow = acquire_flow(keys, token, 10, time.monotonic() + 10, driver.clock, "layers", wid, False)
            await node.run(flow.send(None).calls, False)
            await node.run([release_call(keys, token)], True)
            flow.close()

        async def driver_calls(name: str) -> None:
            assert await driver.acquire(name, token, 10, time.monotonic() + 10) is not None
            assert await driver.release(name, token)

        whole = via(locks)

        async def no_turns(name: str) -> None:  # the AsyncLock, its reads blocking right after each send
            turns, stream.REPLY_TURNS = stream.REPLY_TURNS, 0
            try:
                await whole(name)
            finally:
                stream.REPLY_TURNS = turns

        ops_by_layer: dict[str, Op] = {
            "redis.asyncio floor": floor, "lockkit connection, floor's commands": transport,
            "lockkit connection, driver's bytes": driver_bytes, "lockkit node, the driver's calls": node_calls,
            "lockkit driver": driver_calls, "AsyncLock": whole, "AsyncLock, no loop turns before a reply": no_turns,
        }  # fmt: skip
        await driver_calls(f"scripts:{uuid.uuid4().hex}")  # the node's hello loads the scripts the bytes call
        table = await alayers(ops_by_layer, ops)
        await own.close()
    await conn.disconnect()
    return table


async def redis_turns_part(port: int, url: str, ops: int) -> str:
    """The ``AsyncLock`` with the reader's loop turns before a reply set three ways (none; 3 within 30 µs; 6 within
    60 µs, the default), against the floor: per-operation medians, the variants interleaved in blocks of 10
    in one process (what the turns save is the wake-up of a vCPU put to sleep right after a send; issue 17)."""
    from lockkit.drivers.redis._async import stream

    (conn,), sha = await _connections([port])

    async def floor(name: str) -> None:
        await conn.send_command("SET", name, "token", "NX", "PX", 10_000)
        assert await conn.read_response() is not None
        await conn.send_command("EVALSHA", sha, 1, name, "token")
        await conn.read_response()

    settings = {"none": (0, 0.0), "3 within 30 µs": (3, 30e-6), "6 within 60 µs": (6, 60e-6)}
    kept = stream.REPLY_TURNS, stream.REPLY_WINDOW
    async with lockkit.connect_async(url) as locks:
        whole = via(locks)

        def with_turns(turns: int, window: float) -> Op:
            async def op(name: str) -> None:
                stream.REPLY_TURNS, stream.REPLY_WINDOW = turns, window
                try:
                    await whole(name)
                finally:
                    stream.REPLY_TURNS, stream.REPLY_WINDOW = kept

            return op

        ops_by_label: dict[str, Op] = {"redis.asyncio floor": floor}
        ops_by_label |= {f"AsyncLock, turns: {label}": with_turns(*value) for label, value in settings.items()}
        prefix = uuid.uuid4().hex
        for label, op in ops_by_label.items():  # warm-up: connections, scripts
            for i in range(50):
                await op(f"warm:{prefix}:{label}:{i}")
        samples: dict[str, list[float]] = {label: [] for label in ops_by_label}
        cpu: dict[str, float] = dict.fromkeys(ops_by_label, 0.0)
        for block in range(max(1, ops // 10)):  # blocks of 10 per variant, in turn: load drift hits all alike
            for label, op in ops_by_label.items():
                used = time.process_time()
                for i in range(10):
                    started = time.perf_counter()
                    await op(f"bench:{prefix}:{label}:{block}:{i}")
                    samples[label].append(time.perf_counter() - started)
                cpu[label] += time.process_time() - used
    await conn.disconnect()
    table = latency_table(samples, unit="µs")
    floor_cpu = cpu["redis.asyncio floor"]
    return table + "\nCPU over the same blocks, × the floor's: " + ", ".join(
        f"{label.removeprefix('AsyncLock, turns: ')} {value / floor_cpu:.2f}" for label, value in cpu.items()
    )


async def redlock_part(ports: list[int], url: str, ops: int) -> str:
    conns, sha = await _connections(ports)
    need = len(conns) // 2 + 1

    async def floor(name: str) -> None:
        for conn in conns:
            await conn.send_command("SET", name, "token", "NX", "PX", 10_000)
        won = 0
        for conn in conns:
            won += await conn.read_response() is not None
        assert won >= need
        for conn in conns:
            await conn.send_command("EVALSHA", sha, 1, name, "token")
        for conn in conns:
            await conn.read_response()

    async with lockkit.connect_async(url) as locks:
        samples = await ainterleave({"5-master asyncio floor": floor, "redlock:// async": via(locks)}, ops)
    for conn in conns:
        await conn.disconnect()
    return latency_table(samples, unit="µs")


async def etcd_part(url: str, ops: int, layers: bool = False) -> str:
    from lockkit.drivers.etcd.client import EtcdClient, cmp_created, delete_op, rpc

    host, _, port = url.split("://", 1)[1].split("/")[0].split(",")[0].partition(":")
    client = EtcdClient([(host, int(port or 2379))])
    lease = client.grant(3600).ID  # not kept alive: it must outlast a slow run (it is revoked at the end)
    # the same kind of pool, awaited the same way, as lockkit.offload.ThreadOffloadDriver
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=256, thread_name_prefix="bench-offload")

    async def floor(name: str) -> None:
        key = f"/bench-raw/{name}".encode()
        put = rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=b"t" * 32, lease=lease))
        create = rpc.TxnRequest(compare=[cmp_created(key, 0)], success=[put])
        assert (await asyncio.wrap_future(pool.submit(client.txn, create))).succeeded
        await asyncio.wrap_future(pool.submit(client.txn, rpc.TxnRequest(success=[delete_op(key)])))

    try:
        async with lockkit.connect_async(url) as locks:
            if layers:
                return await alayers(offloaded_layers(locks, floor, pool), ops, block=10)
            samples = await ainterleave({"offloaded raw etcd calls": floor, "etcd:// async": via(locks)}, ops)
    finally:
        client.revoke(lease)
        client.close()
        pool.shutdown()
    return latency_table(samples, unit="µs")


async def zookeeper_part(url: str, ops: int, layers: bool = False) -> str:
    from kazoo.client import KazooClient
    from kazoo.security import OPEN_ACL_UNSAFE

    from lockkit.drivers.zookeeper.client import found_async, founded

    client = KazooClient(hosts=url.split("://", 1)[1])
    client.start(timeout=15)
    client.ensure_path("/bench-raw")
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=256, thread_name_prefix="bench-offload")

    def create(parent: str) -> str:  # the multi lockkit sends for a name it has not seen: parent + node
        child, _czxid = founded(found_async(client, parent, "n__lock__", b"t" * 8, OPEN_ACL_UNSAFE).get())
        return f"{parent}/{child}"

    async def floor(name: str) -> None:
        node = await asyncio.wrap_future(pool.submit(create, f"/bench-raw/{name.replace(':', '-')}"))
        await asyncio.wrap_future(pool.submit(client.delete, node, 0))

    try:
        async with lockkit.connect_async(url) as locks:
            if layers:
                return await alayers(offloaded_layers(locks, floor, pool), ops, block=10)
            samples = await ainterleave({"offloaded raw kazoo calls": floor, "zookeeper:// async": via(locks)}, ops)
    finally:
        client.delete("/bench-raw", recursive=True)
        client.stop()
        client.close()
        pool.shutdown()
    return latency_table(samples, unit="µs")


@contextlib.contextmanager
def _zookeeper() -> Iterator[str]:
    server = ZooKeeperServer().start()
    try:
        yield server.url
    finally:
        server.stop()


@contextlib.contextmanager
def _etcd() -> Iterator[str]:
    server = EtcdServer().start()
    try:
        yield server.url
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", type=int, default=400, help="operations per round and variant")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument(
        "--parts",
        default="redis,redlock,etcd,zookeeper",
        help="comma-separated: redis, redlock, etcd, zookeeper; redis-layers, etcd-layers, zookeeper-layers, "
        "redis-turns (the reader's loop turns before a reply, three ways) "
        "(a face layer by layer); front (the front end over a driver stub)",
    )
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    ops = args.ops * args.rounds
    print(
        f"# lockkit asyncio faces: Python {platform.python_version()}, redis-py {redis.__version__}, "
        f"{platform.machine()} {os.cpu_count()} CPUs, {platform.platform()}"
    )
    sections: list[tuple[str, Callable[[], Any]]] = []
    with contextlib.ExitStack() as stack:
        if "front" in parts:
            sections.append(("the front end", lambda: front_part(ops)))
        if parts & {"redis", "redis-layers", "redis-turns"}:
            single = stack.enter_context(RedisServer())
        if "redis-turns" in parts:
            sections.append(("redis://", lambda: redis_turns_part(single.port, single.url, ops)))
        if "redis" in parts:
            sections.append(("redis://", lambda: redis_part(single.port, single.url, ops)))
        if "redis-layers" in parts:
            sections.append(("redis://", lambda: redis_layers_part(single.port, single.url, ops)))
        if "redlock" in parts:
            group = stack.enter_context(RedlockServers(5))
            ports = [server.port for server in group.servers]
            sections.append(("redlock://", lambda: redlock_part(ports, group.url, ops)))
        if parts & {"etcd", "etcd-layers"}:
            etcd_url = stack.enter_context(_etcd())
        for layers in {"etcd", "etcd-layers"} & parts:
            sections.append(("etcd://", functools.partial(etcd_part, etcd_url, ops, layers == "etcd-layers")))
        if parts & {"zookeeper", "zookeeper-layers"}:
            zookeeper_url = stack.enter_context(_zookeeper())
        for layers in {"zookeeper", "zookeeper-layers"} & parts:
            sections.append(
                ("zookeeper://", functools.partial(zookeeper_part, zookeeper_url, ops, layers != "zookeeper"))
            )
        for label, part in sections:
            table = asyncio.run(part())
            table = table.replace("## Uncontended", f"## {label} asyncio face, uncontended", 1)
            print(f"\n{table.replace('## Layer', f'## {label} asyncio face, layer', 1)}", flush=True)


if __name__ == "__main__":
    main()
