"""Redis and Redlock driver behaviour beyond the conformance suite: presence records and fair waiting."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

import lockkit
from backends.pytest_fixtures import RedlockFactory
from backends.servers import RedisServer, RedlockServers
from lockkit import BackendUnavailable, LockTimeout
from lockkit.driver import DriverContext, Presence
from lockkit.drivers import _redis_scripts as scripts
from lockkit.drivers._redis_flow import CLAIM_MS
from lockkit.drivers._redis_keys import lock_keys, presence_keys
from lockkit.drivers.redis import RedisDriver
from lockkit.drivers.redlock import RedlockDriver
from lockkit.urls import parse_url

SLACK = 0.25
ODD_NAME = "q'\"]]\n{x}%7B*?"  # quotes, brackets, a newline, a hash-tag brace and a percent escape


def unique(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def raw(server: RedisServer) -> redis.Redis:
    return redis.Redis(host=server.host, port=server.port, socket_timeout=2)


def wait_for(predicate: Any, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "condition not reached in time"
        time.sleep(0.01)


@pytest.fixture(params=["redis", "redlock"])
def presence(
    request: pytest.FixtureRequest, redis_server: RedisServer, redlock_servers: RedlockServers
) -> Iterator[Any]:
    if request.param == "redis":
        driver: Any = RedisDriver.from_url(parse_url(redis_server.url), DriverContext())
    else:
        driver = RedlockDriver.from_url(parse_url(redlock_servers.url), DriverContext())
    yield driver
    driver.close()


# -- presence (lockkit.driver.Presence, used by migrate://) ---------------------------------------------------


def test_presence_announce_members_withdraw(presence: Any) -> None:
    assert isinstance(presence, Presence)
    group = unique("group") + ODD_NAME
    presence.announce(group, "a", '{"phase": "old"}', 30)
    presence.announce(group, "b" + ODD_NAME, "v\nb", None)
    assert presence.members(group) == {"a": '{"phase": "old"}', "b" + ODD_NAME: "v\nb"}
    presence.announce(group, "a", "again", 30)  # a re-announce replaces the value
    assert presence.members(group)["a"] == "again"
    presence.withdraw(group, "a")
    presence.withdraw(group, "never-announced")
    assert presence.members(group) == {"b" + ODD_NAME: "v\nb"}
    assert presence.members(unique("empty")) == {}


def test_presence_records_expire_on_server_time(presence: Any) -> None:
    group = unique("expiry")
    presence.announce(group, "short", "s", 0.3)
    presence.announce(group, "long", "l", 30)
    presence.announce(group, "forever", "f", None)
    assert set(presence.members(group)) == {"short", "long", "forever"}
    time.sleep(0.45)
    assert presence.members(group) == {"long": "l", "forever": "f"}
    presence.announce(group, "short", "s2", 0.3)  # an announce revives a lapsed member
    assert presence.members(group)["short"] == "s2"


def test_presence_bad_ttl_rejected(presence: Any) -> None:
    for ttl in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="presence ttl"):
            presence.announce(unique(), "m", "v", ttl)


def test_presence_key_layout_and_cleanup(redis_server: RedisServer) -> None:
    group = unique("layout") + "{}"
    records, expiry = presence_keys("app:", group)
    assert records == f"app:presence:{{{group.replace('{', '%7B').replace('}', '%7D')}}}".encode()
    assert expiry == records + b":expiry"
    driver = RedisDriver.from_url(parse_url(redis_server.url + "?prefix=app:"), DriverContext())
    try:
        client = raw(redis_server)
        driver.announce(group, "m", "v", 5)
        assert client.hget(records, "m") == b"v"
        assert 4000 < client.pttl(records) <= 5000 and 4000 < client.pttl(expiry) <= 5000  # an abandoned group goes
        driver.announce(group, "epoch", "1", None)
        assert client.pttl(records) == -1 and client.pttl(expiry) == -1  # a permanent record keeps the group
        driver.withdraw(group, "epoch")
        driver.withdraw(group, "m")
        assert client.exists(records, expiry) == 0
    finally:
        driver.close()


def test_presence_redlock_reads_the_union_of_a_majority(redlock_servers: RedlockServers) -> None:
    group = unique("union")
    driver = RedlockDriver.from_url(parse_url(redlock_servers.url), DriverContext())
    try:
        driver.announce(group, "m", "v", 30)
        records, expiry = presence_keys("lockkit:", group)
        for server in list(redlock_servers)[:2]:  # as if the announce had reached only 3 of 5 masters
            raw(server).delete(records, expiry)
        assert driver.members(group) == {"m": "v"}
    finally:
        driver.close()


def test_presence_redlock_needs_a_majority(fresh_redlock: RedlockFactory) -> None:
    group_servers = fresh_redlock()
    url = group_servers.url + "?timeout=0.3&connect_timeout=0.3"
    driver = RedlockDriver.from_url(parse_url(url), DriverContext())
    try:
        driver.announce("g", "m", "v", 30)
        for i in range(3):
            group_servers[i].kill()
        with pytest.raises(BackendUnavailable, match="reached 2 of 5 masters, needs 3"):
            driver.announce("g", "m", "v", 30)
        with pytest.raises(BackendUnavailable, match="needs 3"):
            driver.members("g")
    finally:
        driver.close()


# -- fair (FIFO) waiting on redis:// ---------------------------------------------------------------------------


def queue_keys(name: str) -> tuple[bytes, bytes]:
    keys = lock_keys("lockkit:", name)
    return keys.queue, keys.alive


def test_waiters_are_served_in_arrival_order(redis_server: RedisServer) -> None:
    name = unique("fifo") + ODD_NAME
    order: list[int] = []
    with lockkit.connect(redis_server.url) as locks:
        holder = locks.lock(name, ttl=5)
        holder.acquire()

        def wait_turn(i: int) -> None:
            lock = locks.lock(name, ttl=5)
            lock.acquire(timeout=10)
            order.append(i)
            time.sleep(0.02)
            lock.release()

        threads = []
        for i in range(4):
            threads.append(threading.Thread(target=wait_turn, args=(i,)))
            threads[-1].start()
            wait_for(lambda i=i: locks.holder(name).waiters == i + 1)
        holder.release()
        for thread in threads:
            thread.join(10)
    assert order == [0, 1, 2, 3]


def test_releaser_cannot_take_the_lock_back_from_a_queued_waiter(redis_server: RedisServer) -> None:
    name = unique("barge")
    with lockkit.connect(redis_server.url) as a, lockkit.connect(redis_server.url) as b:
        first = a.lock(name, ttl=5)
        first.acquire()
        got = threading.Event()

        def waiter() -> None:
            b.lock(name, ttl=5).acquire(timeout=10)
            got.set()

        thread = threading.Thread(target=waiter)
        thread.start()
        wait_for(lambda: a.holder(name).waiters == 1)
        first.release()
        assert a.lock(name, ttl=5).try_acquire() is None, "the releaser barged in ahead of a queued waiter"
        assert got.wait(5)
        thread.join(5)
        info = a.holder(name)
        assert info.held and info.waiters == 0


WAITER = """
import sys, lockkit
locks = lockkit.connect(sys.argv[1])
locks.lock(sys.argv[2], ttl=5).acquire(timeout=60)
print("acquired", flush=True)
"""


def test_dead_waiter_delays_the_next_by_at_most_the_claim_window(redis_server: RedisServer) -> None:
    name = unique("deadwaiter")
    with lockkit.connect(redis_server.url) as locks:
        holder = locks.lock(name, ttl=5)
        holder.acquire()
        child = subprocess.Popen([sys.executable, "-c", WAITER, redis_server.url, name], stdout=subprocess.PIPE)
        try:
            wait_for(lambda: locks.holder(name).waiters == 1, 15)
            took: list[float] = []

            def second() -> None:
                locks.lock(name, ttl=5).acquire(timeout=10)
                took.append(time.monotonic())

            thread = threading.Thread(target=second)
            thread.start()
            wait_for(lambda: locks.holder(name).waiters == 2)
            child.kill()  # dies queued first, while its entry is still alive
            child.wait()
            released = time.monotonic()
            holder.release()
            thread.join(10)
        finally:
            child.kill()
            child.wait()
            assert child.stdout is not None
            child.stdout.close()
        delay = took[0] - released
        print(f"dead head waiter delayed the next one by {delay * 1000:.0f} ms (claim window {CLAIM_MS} ms)")
        assert delay <= CLAIM_MS / 1000 + 0.03 + SLACK


def test_timed_out_waiter_leaves_the_queue_and_one_shot_attempts_never_queue(redis_server: RedisServer) -> None:
    name = unique("leave")
    queue, alive = queue_keys(name)
    client = raw(redis_server)
    with lockkit.connect(redis_server.url) as locks:
        holder = locks.lock(name, ttl=5)
        holder.acquire()
        assert locks.lock(name, ttl=5).try_acquire() is None
        assert client.llen(queue) == 0 and client.zcard(alive) == 0
        with pytest.raises(LockTimeout):
            locks.lock(name, ttl=5).acquire(timeout=0.2)
        assert client.llen(queue) == 0 and client.zcard(alive) == 0
        holder.release()
        assert client.exists(lock_keys("lockkit:", name).lock) == 0


async def test_cancelled_async_waiter_leaves_the_queue(redis_server: RedisServer) -> None:
    name = unique("acancel")
    queue, alive = queue_keys(name)
    client = raw(redis_server)
    async with lockkit.connect_async(redis_server.url) as locks:
        holder = locks.lock(name, ttl=5)
        await holder.acquire()
        task = asyncio.ensure_future(locks.lock(name, ttl=5).acquire(timeout=10))
        for _ in range(200):
            if (await locks.holder(name)).waiters == 1:
                break
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(200):
            if client.llen(queue) == 0:
                break
            await asyncio.sleep(0.01)
        assert client.llen(queue) == 0 and client.zcard(alive) == 0
        await holder.release()


def run(client: redis.Redis, script: scripts.Script, keys: list[bytes], *args: object) -> Any:
    return client.eval(script.source, len(keys), *keys, *args)


def test_scripts_leave_passes_a_reservation_on_and_dead_heads_are_skipped(redis_server: RedisServer) -> None:
    name = unique("scripts")
    k = lock_keys("lockkit:", name)
    client = raw(redis_server)
    now_ms = int(client.time()[0]) * 1000 + 10_000
    client.rpush(k.queue, "w1", "w2", "w3")
    client.zadd(k.alive, {"w1": now_ms, "w2": now_ms, "w3": now_ms})
    client.set(k.lock, "~w1", px=CLAIM_MS)  # a release reserved the lock for w1
    with client.pubsub() as sub:
        sub.subscribe(k.channel)
        sub.get_message(timeout=1)
        assert run(client, scripts.LEAVE, [k.lock, k.queue, k.alive], "w1", k.channel, CLAIM_MS) == 1
        message = sub.get_message(timeout=1)
    assert client.get(k.lock) == b"~w2"
    assert message is not None and message["data"] == b"w2 w3"
    assert client.lrange(k.queue, 0, -1) == [b"w2", b"w3"]
    # w2 claims its reservation: the fence increments and it leaves the queue
    taken = run(client, scripts.FAIR_ACQUIRE, [k.lock, k.fence, k.queue, k.alive], "tok2", 5000, "w2", 250, 1000)
    assert taken[0] == 1 and client.get(k.lock) == b"tok2" and client.lrange(k.queue, 0, -1) == [b"w3"]
    # w3 dies (its entry lapses); after the release a newcomer finds the lock free and takes it
    client.zadd(k.alive, {"w3": 1})
    assert run(client, scripts.FAIR_RELEASE, [k.lock, k.queue, k.alive], "tok2", k.channel, CLAIM_MS) == 1
    assert client.get(k.lock) is None and client.llen(k.queue) == 0
    newcomer = run(client, scripts.FAIR_ACQUIRE, [k.lock, k.fence, k.queue, k.alive], "tok4", 5000, "", 250, 1000)
    assert newcomer == [1, taken[1] + 1]


def test_reservation_is_not_a_holder(redis_server: RedisServer) -> None:
    name = unique("reserved")
    k = lock_keys("lockkit:", name)
    client = raw(redis_server)
    client.set(k.lock, "~w9", px=5000)
    with lockkit.connect(redis_server.url) as locks:
        info = locks.holder(name)
        assert not info.held
        assert locks.lock(name, ttl=1).try_acquire() is None  # nobody but w9 may claim it
        assert not locks.force_release(name)  # nothing was *held*, but the reservation is passed on (dropped)
        assert locks.lock(name, ttl=1).try_acquire() is not None


# -- the pub/sub connection's health check ---------------------------------------------------------------------


async def test_C12_silent_pubsub_connection_is_replaced_and_waiters_recheck(
    redis_server: RedisServer, fault_proxy: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from lockkit.drivers._redis_config import redis_nodes
    from lockkit.drivers._redis_hub import Hub

    proxy = fault_proxy(redis_server)
    interval = timeout = 0.3
    spec, _ = redis_nodes(parse_url(
        f"redis://127.0.0.1:{proxy.port}/0?health_check_interval={interval}&timeout={timeout}&connect_timeout=0.3"))
    hub = Hub(spec)
    channel = b"lockkit:{health}:wake"
    heard: list[bytes] = []
    woke = asyncio.Event()

    def wake(data: bytes) -> None:
        heard.append(data)
        woke.set()

    publisher = raw(redis_server)
    caplog.set_level(logging.WARNING, logger="lockkit")
    try:
        assert await hub.watch(channel, wake) is True
        publisher.publish(channel, b"one")
        await asyncio.wait_for(woke.wait(), 2)
        assert heard == [b"one"]
        woke.clear()
        proxy.set_mode("blackhole")  # the subscriber's path goes silent; its socket stays open
        silenced = time.monotonic()
        publisher.publish(channel, b"lost")
        await asyncio.wait_for(woke.wait(), 3)  # noticed by the health check: everyone is woken to re-check
        noticed = time.monotonic() - silenced
        print(f"silent pub/sub connection noticed after {noticed:.3f} s")
        assert heard[-1] == b"" and noticed <= interval + timeout + SLACK
        assert any("did not answer a PING" in r.getMessage() for r in caplog.records)
        proxy.heal()
        for _ in range(300):  # a fresh connection subscribes again
            if hub.snapshot(channel) is not None:
                break
            await asyncio.sleep(0.01)
        woke.clear()
        publisher.publish(channel, b"two")
        await asyncio.wait_for(woke.wait(), 2)
        assert heard[-1] in (b"two", b"lost")  # the old path's bytes may arrive late; "two" must follow
        if heard[-1] != b"two":
            woke.clear()
            await asyncio.wait_for(woke.wait(), 2)
        assert heard[-1] == b"two"
    finally:
        await hub.close()
