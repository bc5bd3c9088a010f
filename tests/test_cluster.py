"""redis+cluster:// beyond the conformance suite: URLs and wrong schemes, a held lock's slot migrated under it
(R-7), a master SIGKILLed inside the cluster (R-8). Real clusters only (``redis-cli --cluster create``)."""

from __future__ import annotations

import secrets
import threading
import time
from typing import Any

import pytest
from redis.exceptions import ResponseError

import lockkit
from backends.pytest_fixtures import RedisClusterFactory
from backends.servers import RedisCluster, RedisServer, free_port
from lockkit.drivers.epoch import EPOCH_SHIFT
from lockkit.drivers.redis.cluster_config import cluster_target, key_slot, parse_nodes, redirect
from lockkit.drivers.redis.keys import cluster_lock_keys
from lockkit.urls import parse_url

SLACK = 2.0
"""A generous liveness bound for a server-driven wake-up (the machine is shared and noisy)."""


def name() -> str:
    return f"cl-{secrets.token_hex(5)}"


# -- URLs and wrong schemes -----------------------------------------------------------------------------------


def test_url_names_seeds_credentials_and_tls() -> None:
    target = cluster_target(parse_url("rediss+cluster://u:s3cret@h1:7000,h2?timeout=1&tls_insecure=true"))
    assert [(s.host, s.port) for s in target.seeds] == [("h1", 7000), ("h2", 6379)]
    assert all(s.tls and s.cluster and s.username == "u" for s in target.seeds)
    assert "s3cret" not in repr(target)


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("redis+cluster://h1:7000/3", "only database 0"),
        ("redis+cluster://h1:7000?db=2", "only database 0"),
        ("redis+cluster://h1:7000?failover_wait=0", "failover_wait"),
        ("redis+cluster://h1:7000?tls_ca=/x", "does not use TLS"),
        ("redis+cluster://h1:7000?bogus=1", "bogus"),
    ],
)
def test_bad_urls_say_what_to_fix(url: str, match: str) -> None:
    with pytest.raises(lockkit.ConfigError, match=match):
        cluster_target(parse_url(url))


def test_cluster_url_at_a_plain_server_says_use_redis(redis_server: RedisServer) -> None:
    url = f"redis+cluster://{redis_server.host}:{redis_server.port}"
    with lockkit.connect(url) as locks, pytest.raises(lockkit.ConfigError, match=r"not in cluster mode.*redis://"):
        locks.lock(name()).acquire(timeout=1)


def test_redis_url_at_a_cluster_node_says_use_redis_cluster(redis_cluster: RedisCluster) -> None:
    node = redis_cluster[0]
    with lockkit.connect(f"redis://{node.host}:{node.port}/0") as locks, pytest.raises(lockkit.ConfigError, match=r"redis\+cluster://"):
        locks.lock(name()).acquire(timeout=1)


def test_sentinel_url_at_a_cluster_node_is_a_config_error(redis_cluster: RedisCluster) -> None:
    node = redis_cluster[0]
    url = f"redis+sentinel://{node.host}:{node.port}/mymaster/0"
    with lockkit.connect(url) as locks, pytest.raises(lockkit.ConfigError, match=r"redis\+cluster://"):
        locks.lock(name()).acquire(timeout=1)


def test_no_node_reachable_lists_those_tried() -> None:
    ports = [free_port(), free_port()]
    url = "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in ports) + "?connect_timeout=0.5"
    with lockkit.connect(url) as locks, pytest.raises(lockkit.BackendUnavailable) as raised:
        locks.lock(name()).acquire(timeout=1)
    assert all(f"127.0.0.1:{p}" in str(raised.value) for p in ports)


def test_a_dead_seed_is_skipped(redis_cluster: RedisCluster) -> None:
    url = redis_cluster.url.replace("redis+cluster://", f"redis+cluster://127.0.0.1:{free_port()},")
    with lockkit.connect(url + "?connect_timeout=0.5") as locks, locks.lock(name()) as lease:
        assert lease.fencing_token > 0


def test_replies_parsed() -> None:
    text = (
        "a 127.0.0.1:7000@17000 myself,master - 0 0 3 connected 0-5460 [5461->-b]\n"
        "b :7001@17001 master - 0 0 5 connected 5461-10922\n"
        "c 127.0.0.1:7002@17002 slave b 0 0 5 connected\n"
        "d 127.0.0.1:7003@17003 master,fail - 0 0 2 connected 10923-16383\n"
    )
    shards = parse_nodes(text, ("10.0.0.1", 7001))
    assert [(s.host, s.port, s.epoch, r) for s, r in shards] == [
        ("127.0.0.1", 7000, 3, [(0, 5460)]),
        ("10.0.0.1", 7001, 5, [(5461, 10922)]),
    ]
    moved = redirect(ResponseError("MOVED 42 127.0.0.1:7005"))
    assert moved is not None and (moved.kind, moved.slot, moved.port) == ("MOVED", 42, 7005)
    assert redirect(ResponseError("ERR something")) is None


def test_tokens_carry_the_masters_config_epoch(redis_cluster: RedisCluster) -> None:
    n = name()
    keys = cluster_lock_keys("lockkit:", n)
    node = redis_cluster.node_for_slot(key_slot(keys.lock))
    epoch = int(node.ask("CLUSTER", "INFO").split("cluster_my_epoch:")[1].split()[0])
    with lockkit.connect(redis_cluster.url) as locks:
        with locks.lock(n) as first:
            assert first.fencing_token >> EPOCH_SHIFT == epoch
        with locks.lock(n) as second:
            assert second.fencing_token == first.fencing_token + 1


def test_async_face_routes_and_wakes(redis_cluster: RedisCluster) -> None:
    import asyncio

    async def main() -> None:
        async with lockkit.connect_async(redis_cluster.url) as a, lockkit.connect_async(redis_cluster.url) as b:
            n = name()
            holder = a.lock(n, ttl=30)
            held = await holder.acquire()
            waiter = asyncio.ensure_future(b.lock(n).acquire(timeout=20))
            await asyncio.sleep(0.3)
            released = time.monotonic()
            await holder.release()
            lease = await waiter
            assert time.monotonic() - released < SLACK
            assert lease.fencing_token > held.fencing_token
            await b.force_release(n)

    asyncio.run(main())


# -- a held lock's slot migrated to another master -----------------------------------------------------


@pytest.mark.slow
def test_R7_slot_migration_keeps_a_held_lock_exclusive_and_renewable_and_wakes_the_waiter(
    fresh_redis_cluster: RedisClusterFactory,
) -> None:
    cluster = fresh_redis_cluster()
    n = name()
    keys = cluster_lock_keys("lockkit:", n)
    slot = key_slot(keys.lock)
    source = cluster.node_for_slot(slot)
    target = next(m for m in cluster.members if m is not source)
    with (
        lockkit.connect(cluster.url) as holder_side,
        lockkit.connect(cluster.url) as waiter_side,
        lockkit.connect(cluster.url) as third,
    ):
        lock = holder_side.lock(n, ttl=30, auto_renew=False)
        held = lock.acquire(timeout=5)
        got: list[Any] = []

        def wait() -> None:
            try:
                got.append((waiter_side.lock(n, ttl=10).acquire(timeout=30), time.monotonic()))
            except BaseException as exc:  # reported, never swallowed
                got.append(exc)

        waiter = threading.Thread(target=wait)
        waiter.start()
        deadline = time.monotonic() + 10
        while not holder_side.holder(n).waiters and time.monotonic() < deadline:
            time.sleep(0.02)
        assert holder_side.holder(n).waiters == 1

        cluster.start_migration(slot, source, target)
        lock.renew()  # MIGRATING, keys still on the source: served there
        moved = cluster.move_slot_keys(slot, source, target)
        assert moved, "the slot's keys were on the source"
        assert source.ask("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
        assert target.ask("CLUSTER", "COUNTKEYSINSLOT", slot) >= 3  # lock, fence and the waiter's queue
        lock.renew()  # the source answers ASK: renewed on the target after ASKING
        # A third client's attempt in the middle of the move waits for it to end (an ASK is not followed by an
        # acquire: the target's epoch may still be below the source's), then finds the lock taken.
        tried: list[Any] = []
        attempt = threading.Thread(target=lambda: tried.append(third.lock(n).try_acquire()))
        attempt.start()
        time.sleep(0.3)
        assert not tried
        cluster.finish_migration(slot, target)
        attempt.join(10)
        assert tried == [None]
        lock.renew()  # MOVED: the map is refreshed, renewed on the new master
        assert third.lock(n).try_acquire() is None
        assert held.valid and not got
        time.sleep(0.5)  # the waiter's subscriptions move to the new master (sunsubscribe, MOVED)
        released = time.monotonic()
        lock.release()
        waiter.join(30)
        (result,) = got
        assert not isinstance(result, BaseException), repr(result)
        lease, woken = result
        assert woken - released < SLACK, f"the waiter took {woken - released:.2f} s after the release"
        # the counter moved with the keys, and the new master's epoch is at least the old one's
        assert lease.fencing_token > held.fencing_token
        waiter_side.force_release(n)


# -- a master SIGKILLed inside the cluster -------------------------------------------------------------


@pytest.mark.slow
def test_R8_master_killed_replica_promoted_lock_followed_or_loss_reported(
    fresh_redis_cluster: RedisClusterFactory,
) -> None:
    cluster = fresh_redis_cluster(replicas=1)
    n = name()
    keys = cluster_lock_keys("lockkit:", n)
    slot = key_slot(keys.lock)
    with lockkit.connect(cluster.url + "?min_replicas=1&replica_timeout=1&failover_wait=15") as locks:
        lock = locks.lock(n, ttl=20, auto_renew=False)
        held = lock.acquire(timeout=5)  # min_replicas=1: its replica has the grant
        master = cluster.node_for_slot(slot)
        master.kill()
        started = time.monotonic()
        try:
            lock.renew()  # follows the promoted replica, or reports the loss: never a silent success
        except lockkit.LockLost:
            pytest.fail("the replica had acknowledged the grant (WAIT 1): the lock must survive the failover")
        assert time.monotonic() - started < 15
        assert held.valid
        promoted = cluster.node_for_slot(slot)
        assert promoted is not master and promoted.running
        lock.release()
    with lockkit.connect(cluster.url) as locks, locks.lock(n, ttl=5) as after:  # no replica left: no min_replicas
        assert after.fencing_token > held.fencing_token  # the promoted master's epoch is higher
        assert after.fencing_token >> EPOCH_SHIFT > held.fencing_token >> EPOCH_SHIFT


@pytest.mark.slow
def test_R8_grant_the_replica_never_received_is_reported_lost(fresh_redis_cluster: RedisClusterFactory) -> None:
    """The replica is SIGSTOPped and its replication link cut on the master's side (what the kernel had already
    buffered for a stopped process would still arrive), the master grants and is SIGKILLed, the replica resumes
    and is promoted without the grant: the holder's next renewal reports the loss, never a silent success."""
    cluster = fresh_redis_cluster(replicas=1)
    n = name()
    slot = key_slot(cluster_lock_keys("lockkit:", n).lock)
    master = cluster.node_for_slot(slot)
    replica = cluster.replica_of(master)
    with lockkit.connect(cluster.url + "?failover_wait=20") as locks:
        lock = locks.lock(n, ttl=30, auto_renew=False)
        replica.pause()
        try:
            master.ask("CLIENT", "KILL", "TYPE", "replica")  # it cannot reconnect while stopped
            held = lock.acquire(timeout=5)
            master.kill()
        finally:
            replica.resume()
        with pytest.raises(lockkit.LockLost):
            lock.renew()  # on the promoted replica, which never had the key
        assert not held.valid
        assert cluster.node_for_slot(slot) is replica
        with locks.lock(n, ttl=5) as after:  # another grant there: its token outranks the lost one
            assert after.fencing_token > held.fencing_token


CLUSTER_RULE = (
    "on >pw-CL resetkeys ~lockkit:* resetchannels &lockkit:* -@all +evalsha +script|load +set +get +del +incr "
    "+pexpire +pttl +spublish +time +lindex +lpop +lrem +rpush +llen +zscore +zadd +zrem +zcount +ssubscribe "
    "+sunsubscribe +ping +info +config|get +cluster|nodes +cluster|info +asking"
)
"""docs/backends/redis.md's cluster ACL, as written there."""


def test_documented_cluster_acl_rule_is_enough(redis_cluster: RedisCluster) -> None:
    user = f"lk{secrets.token_hex(3)}"
    for node in redis_cluster.members:  # ACL users are per node: a cluster does not share them
        node.ask("ACL", "SETUSER", user, *CLUSTER_RULE.split())
    try:
        url = redis_cluster.url.replace("redis+cluster://", f"redis+cluster://{user}:pw-CL@")
        with lockkit.connect(url) as a, lockkit.connect(url) as b:
            for _ in range(6):  # names on every master
                n = name()
                lock = a.lock(n, ttl=5)
                lock.acquire(timeout=2)
                threading.Timer(0.2, lock.release).start()
                waiter = b.lock(n, ttl=5)
                waiter.acquire(timeout=3)  # woken on the shard channel
                waiter.renew()
                assert b.holder(n).held
                assert a.force_release(n)
            for node in redis_cluster.members:  # every wake-up came by a granted subscription, not a retry
                assert "ssubscribe" not in str(node.ask("ACL", "LOG"))
    finally:
        for node in redis_cluster.members:
            node.ask("ACL", "DELUSER", user)


@pytest.mark.slow
def test_R7_async_face_follows_a_slot_migration(fresh_redis_cluster: RedisClusterFactory) -> None:
    """The asyncio face through the same move: auto-renewal carries the lock, the waiter is woken after it."""
    import asyncio

    cluster = fresh_redis_cluster()
    n = name()
    keys = cluster_lock_keys("lockkit:", n)
    slot = key_slot(keys.lock)
    source = cluster.node_for_slot(slot)
    target = next(m for m in cluster.members if m is not source)

    def move() -> None:
        cluster.start_migration(slot, source, target)
        moved = cluster.move_slot_keys(slot, source, target)
        assert moved, "the slot's keys were on the source"
        time.sleep(0.5)  # renewals run in the ASK phase (ttl 1.5 s: one every 0.5 s)
        cluster.finish_migration(slot, target)

    async def main() -> None:
        async with lockkit.connect_async(cluster.url) as a, lockkit.connect_async(cluster.url) as b:
            holder = a.lock(n, ttl=1.5)
            held = await holder.acquire(timeout=5)
            waiter = asyncio.ensure_future(b.lock(n, ttl=5).acquire(timeout=30))
            while not (await a.holder(n)).waiters:
                await asyncio.sleep(0.02)
            await asyncio.to_thread(move)
            await asyncio.sleep(1.5)  # a whole TTL on the new master: renewed there, or lost
            assert held.valid
            assert not waiter.done()
            released = time.monotonic()
            await holder.release()
            lease = await waiter
            assert time.monotonic() - released < SLACK
            assert lease.fencing_token > held.fencing_token
            await b.force_release(n)

    asyncio.run(main())


@pytest.mark.slow
def test_R8_waiter_is_served_across_a_failover(fresh_redis_cluster: RedisClusterFactory) -> None:
    """A waiter queued on a master that is SIGKILLed is served once the holder releases on the promoted replica
    (the promotion takes about 2 s here, well within failover_wait: being told BackendUnavailable would fail)."""
    cluster = fresh_redis_cluster(replicas=1)
    n = name()
    slot = key_slot(cluster_lock_keys("lockkit:", n).lock)
    url = cluster.url + "?failover_wait=15"
    with lockkit.connect(url + "&min_replicas=1&replica_timeout=1") as holder_side, lockkit.connect(url) as waiter_side:
        lock = holder_side.lock(n, ttl=20, auto_renew=False)
        held = lock.acquire(timeout=5)
        got: list[Any] = []

        def wait() -> None:
            try:
                got.append(waiter_side.lock(n, ttl=5, auto_renew=False).acquire(timeout=40))
            except BaseException as exc:  # reported, never swallowed
                got.append(exc)

        waiter = threading.Thread(target=wait)
        waiter.start()
        deadline = time.monotonic() + 10
        while not holder_side.holder(n).waiters and time.monotonic() < deadline:
            time.sleep(0.02)
        cluster.node_for_slot(slot).kill()
        lock.renew()  # follows the promoted replica (the grant was acknowledged by it)
        time.sleep(0.5)  # the waiter's channels move to the promoted replica
        lock.release()
        waiter.join(45)
        assert not waiter.is_alive()
        (result,) = got
        assert isinstance(result, lockkit.Lease), repr(result)
        assert result.fencing_token > held.fencing_token
        waiter_side.force_release(n)


def test_C10_paused_master_is_backend_unavailable_and_others_carry_on(
    fresh_redis_cluster: RedisClusterFactory,
) -> None:
    """A SIGSTOPped master times calls to its slots out as BackendUnavailable (a lockkit error, not redis-py's),
    within about the timeout; locks on the other masters are not held up."""
    cluster = fresh_redis_cluster()
    names = [name() for _ in range(40)]
    paused = cluster.node_for_slot(key_slot(cluster_lock_keys("lockkit:", names[0]).lock))
    elsewhere = next(
        n for n in names if cluster.node_for_slot(key_slot(cluster_lock_keys("lockkit:", n).lock)) is not paused
    )
    with lockkit.connect(cluster.url + "?timeout=0.5") as locks:
        with locks.lock(names[0], ttl=5):
            pass  # connected and mapped
        paused.pause()
        try:
            started = time.monotonic()
            with pytest.raises(lockkit.BackendUnavailable, match="unreachable"):
                locks.lock(names[0], ttl=5).acquire(timeout=1)
            assert time.monotonic() - started < 5
            with locks.lock(elsewhere, ttl=5) as lease:
                assert lease.fencing_token > 0
        finally:
            paused.resume()


def test_a_master_that_refuses_the_login_is_the_one_the_error_names(fresh_redis_cluster: RedisClusterFactory) -> None:
    """A docs audit found a login refused by one master reported as refused by the URL's first seed: the user
    was sent to fix a node that accepted it. Here the seed takes the password and another master does not."""
    cluster = fresh_redis_cluster()
    seed, *others = cluster.masters()
    for node in cluster.masters():
        node.ask("CONFIG", "SET", "requirepass", "pw-A")
        node.password = "pw-A"
    refusing = next(node for node in others if (node.host, node.port) != (seed.host, seed.port))
    refusing.ask("CONFIG", "SET", "requirepass", "pw-B")
    refusing.password = "pw-B"
    name = next(
        n
        for n in (f"auth-{i}" for i in range(10_000))
        if cluster.node_for_slot(key_slot(cluster_lock_keys("lockkit:", n).lock)).port == refusing.port
    )
    url = f"redis+cluster://:pw-A@{seed.host}:{seed.port}"
    with lockkit.connect(url) as locks, pytest.raises(lockkit.ConfigError) as refused:
        locks.lock(name, ttl=5).acquire(timeout=2)
    message = str(refused.value)
    assert f"{refusing.host}:{refusing.port}" in message, message
    assert f":{seed.port}" not in message, message
    assert "pw-A" not in message and "pw-B" not in message, message


def test_check_reaches_every_master_not_only_the_first(fresh_redis_cluster: RedisClusterFactory) -> None:
    """A docs audit found ``lockkit check`` ("reaches every configured backend") pinging one master of a cluster:
    with another master SIGKILLed it said ok while the names hashing to that master's slots could not be taken."""
    cluster = fresh_redis_cluster()
    with lockkit.connect(cluster.url) as locks:
        assert isinstance(locks.check()["default"], float)  # all up
        dead = cluster.node_for_slot(16383)  # the last slot's master: not the one a keyless call picks first
        dead.kill()
        for _ in range(2):  # at once (the map still names it) and once the others marked it failed
            result = locks.check()["default"]
            assert isinstance(result, lockkit.BackendUnavailable), result
            assert f"{dead.port}" in str(result) or "no reachable master" in str(result), result
            time.sleep(2.5)  # node timeout 1 s: the survivors flag it "fail"
