"""redis+sentinel://: the URL, bad input, secrets, and failovers of a real Sentinel set.

Failover tests SIGKILL the master of their own set (``fresh_sentinel``: a master, two replicas, three sentinels
with down-after-milliseconds 500) and give lockkit a generous bound to follow it: never a speed assertion.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import traceback
import uuid
from typing import Any

import pytest
import redis

import lockkit
from backends.pytest_fixtures import SentinelFactory
from backends.servers import SentinelSet, free_port
from lockkit.drivers.epoch import EPOCH_SHIFT
from lockkit.drivers.redis.config import NodeState, NotMaster, apply_hello, hello_commands
from lockkit.drivers.redis.sentinel_config import parse_master_reply, sentinel_target
from lockkit.urls import parse_url

SECRET = "s3cr3t-XYZ"
FOLLOW = 20.0  # seconds: sentinels' failover (~1-3 s here) plus a generous margin for a loaded machine


def name() -> str:
    return f"sentinel-{uuid.uuid4().hex[:8]}"


# -- the URL ------------------------------------------------------------------------------------


def test_url_names_sentinels_service_db_and_credentials() -> None:
    target = sentinel_target(
        parse_url(f"redis+sentinel://app:pw@s1:1,s2,[::1]:3/mymaster/4?sentinel_password={SECRET}&timeout=1")
    )
    assert target.service == "mymaster"
    assert [s.label for s in target.sentinels] == ["s1:1", "s2:26379", "[::1]:3"]
    assert all(s.password == SECRET and s.db == 0 for s in target.sentinels)
    master = target.master("10.0.0.1", 6380)
    assert (master.label, master.db, master.username, master.password, master.require_master) == (
        "10.0.0.1:6380", 4, "app", "pw", True,
    )  # fmt: skip
    assert SECRET not in repr(target) and SECRET not in repr(target.options)


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("redis+sentinel://s1:1", "service name"),
        ("redis+sentinel://s1:1/a/b/c", "service name"),
        ("redis+sentinel://s1:1/mymaster/x", "must be a number"),
        ("redis+sentinel:///mymaster", "at least one sentinel"),
        ("redis+sentinel://s1:1/mymaster?failover_wait=0", "failover_wait"),
        ("redis+sentinel://s1:1/mymaster?tls_ca=/x", "does not use TLS"),
        ("redis+sentinel://s1:1/mymaster?bogus=1", "unknown option 'bogus'"),
    ],
)
def test_bad_urls_say_what_to_fix(url: str, match: str) -> None:
    with pytest.raises(lockkit.ConfigError, match=match):
        lockkit.connect(url)


def test_sentinel_password_is_never_shown(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    url = f"redis+sentinel://app:{SECRET}@127.0.0.1:{free_port()}/mymaster?sentinel_password={SECRET}&failover_wait=0.5"
    with lockkit.connect(url) as locks:
        assert SECRET not in repr(locks) and SECRET not in str(locks.describe())
        with pytest.raises(lockkit.BackendUnavailable) as info:
            locks.lock("x", ttl=2).acquire(timeout=1)
        assert SECRET not in "".join(traceback.format_exception(info.value))
    assert SECRET not in caplog.text
    assert SECRET not in lockkit.urls.redact(f"redis+sentinel://h:1/m?Sentinel_Password={SECRET}&x=1")


def test_role_check_refuses_a_replica() -> None:
    state = NodeState("r:1", False, require_master=True)
    assert ("ROLE",) in hello_commands(state)
    with pytest.raises(NotMaster, match="not a master"):
        apply_hello(state, [b"run_id:x\r\n", [b"maxmemory-policy", b"noeviction"], [b"slave", b"m", 1]])
    apply_hello(state, [b"run_id:x\r\n", [b"maxmemory-policy", b"noeviction"], [b"master", 0, []]])


def test_master_reply_parsing() -> None:
    assert parse_master_reply([None, Exception("ERR No such master with that name")]) is None
    master = parse_master_reply([[b"127.0.0.1", b"7000"], [b"name", b"m", b"config-epoch", b"3"]])
    assert master is not None and (master.host, master.port, master.epoch) == ("127.0.0.1", 7000, 3)


# -- bad input against real sentinels ------------------------------------------------------


def test_unknown_service_is_a_config_error_naming_it(sentinel_set: SentinelSet) -> None:
    url = sentinel_set.url.replace("/mymaster/", "/nosuchservice/")
    with lockkit.connect(url) as locks, pytest.raises(lockkit.ConfigError, match="nosuchservice"):
        locks.lock("x", ttl=2).acquire(timeout=1)


def test_no_sentinel_reachable_lists_those_tried() -> None:
    ports = [free_port(), free_port()]
    url = f"redis+sentinel://127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}/mymaster?failover_wait=0.3"
    with lockkit.connect(url) as locks, pytest.raises(lockkit.BackendUnavailable) as info:
        locks.lock("x", ttl=2).acquire(timeout=1)
    assert all(f"127.0.0.1:{p}" in str(info.value) for p in ports)


def test_following_never_outlasts_the_acquire_timeout() -> None:
    """failover_wait bounds each call, but an acquire gives up at its own timeout (after one attempt)."""
    url = f"redis+sentinel://127.0.0.1:{free_port()}/mymaster?failover_wait=60"
    with lockkit.connect(url) as locks:
        started = time.monotonic()
        with pytest.raises(lockkit.BackendUnavailable, match="failover_wait"):
            locks.lock("x", ttl=2).acquire(timeout=0.5)
        assert time.monotonic() - started < 30  # liveness only: far below failover_wait


def test_a_dead_first_sentinel_is_skipped(sentinel_set: SentinelSet) -> None:
    url = sentinel_set.url.replace("redis+sentinel://", f"redis+sentinel://127.0.0.1:{free_port()},")
    with lockkit.connect(url) as locks, locks.lock(name(), ttl=2) as lease:
        assert lease.fencing_token > 0


def test_tokens_carry_the_config_epoch(sentinel_set: SentinelSet) -> None:
    epoch = int(sentinel_set.sentinels[0].ask("SENTINEL", "MASTER", "mymaster")["config-epoch"])
    with lockkit.connect(sentinel_set.url) as locks, locks.lock(name(), ttl=2) as lease:
        assert lease.fencing_token >> EPOCH_SHIFT == epoch


def _announcement_listeners(group: SentinelSet, user: str) -> int:
    """How many pub/sub connections of sentinel user ``user`` the sentinels have, subscribed to a channel."""
    return sum(
        f"user={user} " in line and " sub=0 " not in line and " sub=" in line
        for sentinel in group.sentinels
        for line in str(sentinel.ask("CLIENT", "LIST")).splitlines()
    )


def _until(condition: Any, within: float) -> bool:
    deadline = time.monotonic() + within
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    return bool(condition())


def test_a_forked_child_listens_to_the_sentinels_on_a_connection_of_its_own(sentinel_set: SentinelSet) -> None:
    # A child inherited the parent's "listening" flag and never subscribed the announcements itself: it followed
    # a master that moved without failing only once the old one refused a write. A user of this test's own tells
    # its connections from everyone else's on the shared sentinels.
    user = f"lkf{uuid.uuid4().hex[:6]}"
    for sentinel in sentinel_set.sentinels:
        sentinel.ask("ACL", "SETUSER", user, "reset", "on", ">pw-FORK", "+@all", "allchannels")
    try:
        url = sentinel_set.url + f"?sentinel_username={user}&sentinel_password=pw-FORK"
        with lockkit.connect(url) as locks:
            with locks.lock(name(), ttl=5):
                pass
            assert _until(lambda: _announcement_listeners(sentinel_set, user) == 1, 10), "the parent never listened"
            told, tell = os.pipe()
            heard, hear = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: lock once on the parent's locker, then stay up until the parent has looked
                code = 1
                try:
                    with locks.lock(name(), ttl=5):
                        pass
                    os.write(tell, b"x")
                    os.read(heard, 1)
                    code = 0
                finally:
                    os._exit(code)
            try:
                assert os.read(told, 1) == b"x", "the child could not lock"
                listening = _until(lambda: _announcement_listeners(sentinel_set, user) == 2, 10)
            finally:
                os.write(hear, b"x")
                _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0
            assert listening, "the child does not listen to the sentinels on a connection of its own"
            # the child's went with it; the parent's is still there
            assert _until(lambda: _announcement_listeners(sentinel_set, user) == 1, 10)
    finally:
        for sentinel in sentinel_set.sentinels:
            sentinel.ask("ACL", "DELUSER", user)


# -- failovers ---------------------------------------------------------------------------------


def _failover(group: SentinelSet) -> tuple[str, int]:
    old = group.master_address()
    group.kill_master()
    new = group.wait_for_failover(old, timeout=FOLLOW)
    _wait_for_a_replica(new)
    return new


def _wait_for_a_replica(master: tuple[str, int], timeout: float = 30.0) -> None:
    """Until the promoted master has a replica in sync again: the sentinels reattach the surviving one only
    after the promotion, and a min_replicas=1 grant before that is refused (rightly), which is not what these
    tests are about (seen once under load in CI)."""
    client = redis.Redis(host=master[0], port=master[1], socket_timeout=2)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            replicas = [v for k, v in client.info("replication").items() if k.startswith("slave")]
            if any(isinstance(v, dict) and v.get("state") == "online" for v in replicas):
                return
            time.sleep(0.1)
    finally:
        client.close()
    raise AssertionError(f"no replica in sync with the promoted master {master} after {timeout:.0f} s")


@pytest.mark.slow
def test_held_lock_follows_the_promoted_master(
    fresh_sentinel: SentinelFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """A lock held (min_replicas=1, so its grant is on a replica) across a SIGKILL of the master stays held,
    renews and releases on the promoted master; later tokens rank above those before."""
    group = fresh_sentinel()
    n = name()
    with lockkit.connect(group.url + "?min_replicas=1&replica_timeout=1") as locks:
        lock = locks.lock(n, ttl=10, auto_renew=False)
        lease = lock.acquire(timeout=5)
        before = lease.fencing_token
        new_master = _failover(group)
        started = time.monotonic()
        lock.renew()  # follows the promoted master (or fails loudly)
        assert time.monotonic() - started < FOLLOW
        assert lease.valid
        lock.release()
        with locks.lock(n, ttl=5) as after:
            assert after.fencing_token > before
            assert after.fencing_token >> EPOCH_SHIFT >= 1
    assert f"{new_master[0]}:{new_master[1]}" in caplog.text  # the switch is logged


@pytest.mark.slow
def test_waiter_is_served_across_a_failover(fresh_sentinel: SentinelFactory) -> None:
    """A waiter that waits while the master is SIGKILLed is served once the holder releases on the new
    master (or gets a clear error: never a silent hang)."""
    group = fresh_sentinel()
    n = name()
    with (
        lockkit.connect(group.url + "?min_replicas=1&replica_timeout=1") as holder_side,
        lockkit.connect(group.url) as waiter_side,
    ):
        lock = holder_side.lock(n, ttl=10, auto_renew=False)
        held = lock.acquire(timeout=5)
        got: list[lockkit.Lease | BaseException] = []

        def wait() -> None:
            try:
                got.append(waiter_side.lock(n, ttl=5, auto_renew=False).acquire(timeout=FOLLOW + 10))
            except BaseException as exc:  # reported, never swallowed
                got.append(exc)

        waiter = threading.Thread(target=wait)
        waiter.start()
        time.sleep(0.3)  # the waiter is queued and asleep
        _failover(group)
        lock.release()  # on the promoted master: hands the lock to the waiter
        waiter.join(FOLLOW + 15)
        assert not waiter.is_alive()
        (result,) = got
        if isinstance(result, BaseException):
            # Only if the failover outlasted failover_wait: the caller is told so. Never another error, or silence.
            assert isinstance(result, lockkit.BackendUnavailable), repr(result)
            assert "failover_wait" in str(result), str(result)
        else:
            assert result.fencing_token > held.fencing_token
            waiter_side.force_release(n)


@pytest.mark.slow
def test_async_holder_follows_and_tokens_stay_monotonic(fresh_sentinel: SentinelFactory) -> None:
    """The asyncio face: auto-renewal carries a held lock across the failover; tokens after it rank above."""
    group = fresh_sentinel()
    n = name()

    async def main() -> None:
        async with lockkit.connect_async(group.url + "?min_replicas=1&replica_timeout=1") as locks:
            held = locks.lock(n, ttl=6)
            lease = await held.acquire(timeout=5)
            before = lease.fencing_token
            await asyncio.to_thread(_failover, group)
            await asyncio.sleep(3)  # renewals run on the promoted master
            assert lease.valid
            # Released by its handle, not force_release: its renewals stop. (A force_release while the lease
            # renewed was undone once by a second failover to a replica that had the key but not the delete; the
            # lease, still renewing there, held the name past the next acquire's 20 s.)
            await held.release()
            other = await _acquire_once_a_replica_acknowledges(locks.lock(n, ttl=5, auto_renew=False))
            assert other.fencing_token > before
            await locks.force_release(n)

    asyncio.run(main())


async def _acquire_once_a_replica_acknowledges(lock: lockkit.AsyncLock, within: float = FOLLOW) -> lockkit.Lease:
    """A min_replicas=1 acquire, tried again while it is (rightly) refused for want of a replica's WAIT
    acknowledgement: even after a replica shows "online", the sentinels may reconfigure it once more, and for
    that moment no replica acknowledges (seen 1 run in 4 on a loaded machine). Its timeout is above the
    lock's ttl: under load the sentinels may fail over once more, to a replica that had the refused grant but
    not its release, and that key lives out its ttl (asynchronous replication, as documented)."""
    deadline = time.monotonic() + within
    while True:
        try:
            return await lock.acquire(timeout=within)
        except lockkit.BackendUnavailable as exc:
            if "min_replicas" not in str(exc) or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


@pytest.mark.slow
def test_failover_loses_an_unreplicated_grant_canary(fresh_sentinel: SentinelFactory) -> None:
    """Canary of the documented window: a grant the replicas never received is gone after the failover and a
    second client takes the lock; its fencing token still ranks above the lost one (the config epoch went up).
    With min_replicas=1 the same grant is refused instead of acknowledged."""
    group = fresh_sentinel()
    n = name()
    replicas = [r for r in group.redis if r.address != group.master_address()]
    with lockkit.connect(group.url) as first, lockkit.connect(group.url + "?failover_wait=15") as second:
        first.lock("warm-up", ttl=1, auto_renew=False).acquire(timeout=5)  # the master is found
        for replica in replicas:
            replica.pause()
        # Cut the replication links while the replicas cannot reconnect: the grant below reaches no replica
        # (a pause alone is not enough, the kernel would still take the bytes in for the paused replica).
        redis.Redis(*group.master().address).client_kill_filter(_type="replica")
        try:
            lost = first.lock(n, ttl=30, auto_renew=False).acquire(timeout=5)
            guarded_url = group.url + "?min_replicas=1&replica_timeout=0.3"
            guarded = lockkit.connect(guarded_url)  # the same grant, waited for: refused, never acknowledged
            try:
                with pytest.raises(lockkit.BackendUnavailable, match="min_replicas"):
                    guarded.lock(name(), ttl=30).acquire(timeout=2)
            finally:
                guarded.close()
            old = group.master_address()
            group.kill_master()
        finally:
            for replica in replicas:
                replica.resume()
        group.wait_for_failover(old, timeout=FOLLOW)
        taken = second.lock(n, ttl=5, auto_renew=False).acquire(timeout=FOLLOW)  # the first grant is gone
        assert taken.fencing_token > lost.fencing_token
        second.force_release(n)


@pytest.mark.slow
def test_switch_master_announcement_is_heard(fresh_sentinel: SentinelFactory, caplog: pytest.LogCaptureFixture) -> None:
    """A manual failover (SENTINEL FAILOVER: the old master is demoted, not killed) is announced on the
    sentinels' +switch-master channel; the driver hears it, and its next call goes to the new master."""
    caplog.set_level(logging.INFO, logger="lockkit")
    group = fresh_sentinel()
    n = name()
    with lockkit.connect(group.url) as locks:
        before = locks.lock(n, ttl=5, auto_renew=False).acquire(timeout=5)
        locks.force_release(n)
        old = group.master_address()
        group.sentinels[0].ask("SENTINEL", "FAILOVER", "mymaster")
        new = group.wait_for_failover(old, timeout=FOLLOW)
        deadline = time.monotonic() + FOLLOW
        while "+switch-master" not in caplog.text:
            assert time.monotonic() < deadline, "no +switch-master announcement was heard"
            time.sleep(0.05)
        with locks.lock(n, ttl=5, auto_renew=False) as after:
            assert after.fencing_token > before.fencing_token
        assert f"{new[0]}:{new[1]}" in caplog.text
