"""Fault scenarios for redlock:// (docs/reliability.md), each named after its scenario."""

from __future__ import annotations

import asyncio
import logging
import os
import random
import signal
import threading
import time
import uuid

import pytest
import redis

import lockkit
from backends.pytest_fixtures import ProxyFactory, RedlockFactory
from backends.servers import RedisServer, RedlockServers
from lockkit import BackendUnavailable, ConfigError, LockLost
from lockkit.driver import DriverContext
from lockkit.drivers.redlock import RedlockDriver
from lockkit.urls import parse_url

SLACK = 0.25


def name() -> str:
    return f"redlock-{uuid.uuid4().hex[:8]}"


def raw(server: RedisServer) -> redis.Redis:
    return redis.Redis(host=server.host, port=server.port, socket_timeout=2)


def lock_key(n: str) -> bytes:
    return f"lockkit:{{{n}}}".encode()


def hosts_url(ports: list[int], query: str = "") -> str:
    return "redlock://" + ",".join(f"127.0.0.1:{p}" for p in ports) + "/0" + (f"?{query}" if query else "")


def test_L1_two_masters_down_still_grants(fresh_redlock: RedlockFactory) -> None:
    group = fresh_redlock()
    group[0].kill()
    group[1].kill()
    with lockkit.connect(group.url) as locks:
        lease = locks.lock(name(), ttl=2).acquire(timeout=2)
        assert lease.valid and lease.remaining() > 1


def test_L1_two_masters_blackholed_cost_about_one_timeout(
    redlock_servers: RedlockServers, fault_proxy: ProxyFactory
) -> None:
    proxies = [fault_proxy(redlock_servers[i]) for i in range(2)]
    ports = [p.port for p in proxies] + [redlock_servers[i].port for i in range(2, 5)]
    timeout = 0.3
    with lockkit.connect(hosts_url(ports, f"timeout={timeout}&connect_timeout={timeout}")) as locks:
        locks.lock(name(), ttl=2).acquire(timeout=2).token  # noqa: B018 - warm the pools
        for proxy in proxies:
            proxy.set_mode("blackhole")
        for attempt in range(2):  # pooled connections first, then fresh ones
            started = time.monotonic()
            lease = locks.lock(name(), ttl=2).acquire(timeout=2)
            took = time.monotonic() - started
            print(f"L-1 round {attempt}: {took:.3f} s with 2 of 5 masters blackholed (timeout {timeout})")
            assert took <= 2 * timeout + 0.05 + SLACK
            assert lease.valid and lease.remaining() > 1


def test_L2_majority_down_is_unavailable_and_partial_locks_removed(fresh_redlock: RedlockFactory) -> None:
    group = fresh_redlock()
    for i in range(3):
        group[i].kill()
    n = name()
    with lockkit.connect(group.url) as locks:
        with pytest.raises(BackendUnavailable, match="reached 2 of 5 masters but needs 3") as info:
            locks.lock(n, ttl=5).acquire(timeout=1)
        assert "@" not in str(info.value)
        for survivor in (group[3], group[4]):
            assert raw(survivor).exists(lock_key(n)) == 0, "a partial lock was left on a survivor"


def test_L3_simultaneous_contenders_never_both_win(redlock_servers: RedlockServers) -> None:
    n = name()
    with lockkit.connect(redlock_servers.url) as a, lockkit.connect(redlock_servers.url) as b:
        lockers = [a, b]
        for _ in range(100):
            barrier = threading.Barrier(2)
            won: list[lockkit.Lock] = []

            def contend(
                locker: lockkit.Locker, barrier: threading.Barrier = barrier, won: list[lockkit.Lock] = won
            ) -> None:
                lock = locker.lock(n, ttl=2)
                barrier.wait()
                if lock.try_acquire() is not None:
                    won.append(lock)

            threads = [threading.Thread(target=contend, args=(lk,)) for lk in lockers]
            for t in threads:
                t.start()
            for t in threads:
                t.join(5)
            assert len(won) <= 1, "two contenders both won"
            # Five masters split between two contenders: one of them always has a majority.
            assert len(won) == 1, "nobody won: a lock that never grants would pass the check above"
            for lock in won:
                lock.release()


def test_L4_renew_ignores_masters_that_restarted(fresh_redlock: RedlockFactory) -> None:
    group = fresh_redlock()
    n = name()
    with lockkit.connect(group.url) as locks:
        lock = locks.lock(n, ttl=10, auto_renew=False)
        lease = lock.acquire()
        for i in range(3):
            group[i].kill()
            group[i].restart()
            # as if the master had persisted our key: its "yes" must still not count
            raw(group[i]).set(lock_key(n), lease.token, px=10_000)
        with pytest.raises(LockLost):
            lock.renew()


def test_L6_bad_configs_rejected(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(ConfigError, match="twice"):
        lockkit.connect("redlock://127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7001")
    for hosts in (["127.0.0.1:7001"], ["127.0.0.1:7001", "127.0.0.1:7002"]):
        with pytest.raises(ConfigError, match="at least 3"):
            lockkit.connect("redlock://" + ",".join(hosts))
    with pytest.raises(ConfigError, match="unknown option 'quorum'"):
        lockkit.connect(hosts_url([7001, 7002, 7003], "quorum=1"))
    with pytest.raises(ConfigError, match="twice") as info:
        lockkit.connect("redlock://u:s3cr3t-XYZ@127.0.0.1:7001,127.0.0.1:7001,127.0.0.1:7002")
    assert "s3cr3t" not in str(info.value)
    with caplog.at_level(logging.WARNING, logger="lockkit"):
        lockkit.connect(hosts_url([7001, 7002, 7003, 7004])).close()
    assert any("even number" in r.getMessage() for r in caplog.records)


class _Spy:
    """MONITOR on one master: the top-level commands that clients (not our scripts) sent it."""

    def __init__(self, server: RedisServer) -> None:
        self.server = server
        self.seen: list[str] = []
        self._conn = raw(server)
        self._monitor = self._conn.monitor()
        self._monitor.__enter__()
        self._marker = f"spy-end-{uuid.uuid4().hex[:8]}"
        self._reader = threading.Thread(target=self._watch, daemon=True)
        self._reader.start()

    def _watch(self) -> None:
        for command in self._monitor.listen():
            if self._marker in command["command"]:
                return
            if command.get("client_type") != "lua":  # the commands our scripts run are atomic: fine
                self.seen.append(command["command"].split()[0].upper())

    def stop(self) -> list[str]:
        raw(self.server).echo(self._marker)
        self._reader.join(5)
        self._monitor.__exit__(None, None, None)
        self._conn.close()
        return self.seen


def test_R2_script_flush_on_every_master(redlock_servers: RedlockServers) -> None:
    with lockkit.connect(redlock_servers.url) as locks:
        n = name()
        lock = locks.lock(n, ttl=5, auto_renew=False)
        lock.acquire()
        for server in redlock_servers:
            raw(server).script_flush()
        spies = [_Spy(server) for server in redlock_servers]
        time.sleep(0.1)  # MONITOR is live once the server has answered it; give the readers a moment
        try:
            lock.renew()
            lock.release()
            # A release returns once a quorum of masters released (issue 17); the later masters' replies, here
            # NOSCRIPT, are read by the next command on their connections, which runs the release there too.
            gone = sum(raw(server).exists(lock_key(n)) == 0 for server in redlock_servers)
            assert gone >= 3, f"released on {gone} of 5 masters"
            assert not locks.holder(n).held
        finally:
            seen = [spy.stop() for spy in spies]
        for server, commands in zip(redlock_servers, seen, strict=True):
            print(f"R-2 commands seen on {server.port}:", commands)
            assert "SCRIPT" in commands and "EVALSHA" in commands, f"master {server.port}: the script was not reloaded"
            fallback = {"GET", "DEL", "PEXPIRE", "SET", "EVAL"} & set(commands)
            assert not fallback, f"master {server.port}: a non-atomic fallback ran ({sorted(fallback)})"
            assert raw(server).exists(lock_key(n)) == 0


async def test_L2_async_majority_down(fresh_redlock: RedlockFactory) -> None:
    group = fresh_redlock()
    for i in range(3):
        group[i].kill()
    async with lockkit.connect_async(group.url) as locks:
        with pytest.raises(BackendUnavailable, match="reached 2 of 5"):
            await locks.lock(name(), ttl=5).acquire(timeout=1)


def test_L5_early_expiry_on_one_of_three_holding_masters(redlock_servers: RedlockServers) -> None:
    n = name()
    key = lock_key(n)
    masters = list(redlock_servers)
    for m in masters[3:]:  # D and E are busy (a foreign key), so the holder wins exactly A, B, C
        raw(m).set(key, "someone-else", px=10_000)
    with lockkit.connect(redlock_servers.url) as a, lockkit.connect(redlock_servers.url) as b:
        lock = a.lock(n, ttl=10, auto_renew=False)
        lock.acquire(timeout=2)
        assert [raw(m).exists(key) for m in masters] == [1] * 5
        raw(masters[2]).pexpire(key, 1)  # C's clock jumps forward: the holder's key there expires early
        for m in masters[3:]:
            raw(m).delete(key)  # ... and D, E free up
        time.sleep(0.01)
        intruder = b.lock(n, ttl=10, auto_renew=False)
        assert intruder.try_acquire() is not None, "canary: a second client should win C, D, E (the hazard)"
        with pytest.raises(LockLost):
            lock.renew()  # the holder now renews on A and B only: fewer than a quorum
        intruder.release()


def _calls(master: RedisServer) -> tuple[int, int]:
    """How many SET and EVALSHA commands ``master`` ran so far."""
    stats = raw(master).info("commandstats")
    return stats.get("cmdstat_set", {}).get("calls", 0), stats.get("cmdstat_evalsha", {}).get("calls", 0)


def test_L7_non_positive_validity_fails_and_unlocks_every_master(
    redlock_servers: RedlockServers, fault_proxy: ProxyFactory
) -> None:
    proxies = [fault_proxy(m) for m in redlock_servers]
    n = name()
    with lockkit.connect(hosts_url([p.port for p in proxies], "timeout=1&connect_timeout=1")) as locks:
        warm = locks.lock(name(), ttl=1)
        warm.acquire(timeout=2)
        warm.release()  # warm the pools
        before = [_calls(m) for m in redlock_servers]
        for proxy in proxies:
            proxy.delay(0.05, "down")  # every reply arrives after the whole TTL has passed
        assert locks.lock(n, ttl=0.04).try_acquire() is None
        for proxy in proxies:
            proxy.heal()
        after = [_calls(m) for m in redlock_servers]
    # every master got the acquire (SET) and then the undo (EVALSHA), not just the ones that answered in time
    assert [(a[0] - b[0], a[1] - b[1]) for a, b in zip(after, before, strict=True)] == [(1, 1)] * 5
    for m in redlock_servers:
        assert raw(m).exists(lock_key(n)) == 0


async def test_c8_cancellation_storm_async(redlock_servers: RedlockServers) -> None:
    """Cancel waiting acquires at random points (mid fan-out included): nothing leaks, nothing hangs."""
    name = f"c8-storm-{uuid.uuid4().hex[:8]}"
    async with (
        lockkit.connect_async(redlock_servers.url) as holder_locks,
        lockkit.connect_async(redlock_servers.url) as other,
    ):
        holder = holder_locks.lock(name, ttl=5)
        await holder.acquire()
        for _ in range(40):
            task = asyncio.ensure_future(other.lock(name, ttl=5).acquire())
            await asyncio.sleep(random.uniform(0, 0.02))
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        await holder.release()
        third = other.lock(name, ttl=5)
        await asyncio.wait_for(third.acquire(timeout=5), 10)
        await third.release()
        await asyncio.sleep(0.3)  # undo tasks of grants that raced a cancel
        assert not (await other.holder(name)).held


def test_c12_a_fan_out_replaces_a_connection_one_master_closed_while_idle(redlock_servers: RedlockServers) -> None:
    """C-12: a fan-out looks at all its pooled connections at once (one poll) before it sends anything; the one
    that a master closed while it sat idle is replaced first, so that master takes part in the acquire (a plain,
    non-idempotent SET) instead of counting as unreachable."""
    driver = RedlockDriver.from_url(parse_url(redlock_servers.url + "?timeout=2"), DriverContext())
    try:
        n = name()
        assert driver.acquire(n + "-warm", "t0", 5, None) is not None  # one pooled connection per master
        assert driver.release(n + "-warm", "t0")
        killed = raw(redlock_servers[2])
        clients = killed.client_list()
        for client in clients:  # every connection but this admin one: the driver's idle pooled one
            if client["cmd"] != "client|list":
                killed.client_kill_filter(_id=client["id"])
        time.sleep(0.05)
        assert driver.acquire(n, "t1", 5, None) is not None
        assert [raw(server).get(lock_key(n)) for server in redlock_servers.servers] == [b"t1"] * 5
        assert driver.release(n, "t1")
        killed.close()
    finally:
        driver.close()


def test_c10_a_fan_out_interrupted_while_a_master_is_paused_gives_back_every_connection(
    fresh_redlock: RedlockFactory,
) -> None:
    """C-10: an exception (here a signal handler's) that interrupts a fan-out while it waits for a paused
    master leaves no connection checked out: the later masters' unread replies are dropped with their
    connections, which go back to their pools, so later calls neither run short of connections nor read
    another call's replies."""
    group = fresh_redlock()
    driver = RedlockDriver.from_url(parse_url(group.url + "?timeout=3&pool_size=1"), DriverContext())

    class Interrupted(Exception):
        pass

    def interrupt(*_: object) -> None:
        raise Interrupted

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        n = name()
        assert driver.acquire(n + "-warm", "t0", 5, None) is not None
        assert driver.release(n + "-warm", "t0")
        group[0].pause()  # the first master read: the fan-out waits there, the other four replies unread
        try:
            signal.setitimer(signal.ITIMER_REAL, 0.3)
            with pytest.raises(Interrupted):
                driver.acquire(n, "t1", 5, None)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            group[0].resume()
        for node in driver._nodes:  # pool_size=1: a connection still checked out would make this wait, then fail
            pool = node.pool
            assert len(pool._idle) == len(pool._all) == 1
        assert driver.release(n, "t1")  # the partial grant undone on every master
        assert [raw(server).get(lock_key(n)) for server in group.servers] == [None] * 5
        assert driver.acquire(n, "t2", 5, None) is not None
        assert driver.release(n, "t2")
    finally:
        signal.signal(signal.SIGALRM, previous)
        driver.close()


def test_a_forked_child_waits_on_redlock_as_a_client_of_its_own(redlock_servers: RedlockServers) -> None:
    """A child made by os.fork while the parent's hubs still listen on a lock's channel (a wait just ended:
    the subscription lingers) must not pass for its parent: it has no hub thread, so a wait trusting the
    parent's subscription would sleep until the holder's expiry. It starts with hubs and pools of its own (an
    at-fork hook tells the driver, with no getpid per acquire) and is woken by the release."""
    n = name()
    with lockkit.connect(redlock_servers.url) as locks, lockkit.connect(redlock_servers.url) as other:
        holder = other.lock(n, ttl=10)
        holder.acquire()
        releaser = threading.Timer(0.2, holder.release)
        releaser.start()
        waited = locks.lock(n, ttl=10)
        waited.acquire(timeout=5)  # a wait: this client's hubs listen on n's channel (for a while after, too)
        waited.release()
        # The waiter can be granted, and release, before the timer's release() has returned: a handle is one
        # holder's, so this thread uses it again only once that call is over (it failed once in CI without)
        releaser.join(10)
        holder.acquire()
        pid = os.fork()
        if pid == 0:  # the child: wait on the parent's locker; exit code 2 if the release did not wake it
            code = 1
            try:
                started = time.monotonic()
                mine = locks.lock(n, ttl=10)
                mine.acquire(timeout=8)
                code = 0 if time.monotonic() - started < 3 else 2
                mine.release()
            finally:
                os._exit(code)
        try:
            time.sleep(0.5)  # the child subscribes and waits
            holder.release()
        finally:
            _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, "the child was not woken by the release"
        again = locks.lock(n, ttl=5)
        again.acquire(timeout=5)  # the parent's connections and hubs still work
        again.release()


def test_L6_one_server_listed_under_two_names_is_refused(redlock_servers: RedlockServers) -> None:
    """L-6: 127.0.0.1:P and localhost:P pass the URL's duplicate check, but are one server: with a third master,
    a quorum of 2 of 3 would be granted by two real servers' votes, one counted twice. The masters' run_ids
    give it away at the first fan-out (docs audit, 2026-12-02)."""
    first, second = redlock_servers.servers[0].port, redlock_servers.servers[1].port
    url = f"redlock://127.0.0.1:{first},localhost:{first},127.0.0.1:{second}"
    with lockkit.connect(url) as locks:
        with pytest.raises(ConfigError, match="one Redis server"):
            locks.lock(name(), ttl=5).acquire(timeout=1)
        with pytest.raises(ConfigError, match="one Redis server"):
            locks.lock(name(), ttl=5).acquire(timeout=1)  # and at every later call
    with lockkit.connect(hosts_url([s.port for s in redlock_servers.servers[:3]])) as locks:
        lock = locks.lock(name(), ttl=5)
        lock.acquire(timeout=1)  # distinct servers: granted as ever
        lock.release()


@pytest.mark.parametrize("call", ["try_acquire", "acquire"])
def test_L2_refused_logins_on_a_majority_leave_no_partial_lock(redlock_servers: RedlockServers, call: str) -> None:
    """A user that exists on only 2 of 5 masters: the acquire is refused with a ConfigError (too few masters
    accept the login for a quorum), and the SETs the 2 applied are undone before it is raised; before, the name
    stayed half-taken there for the whole ttl, and a correctly configured client could not get it."""
    user = f"u{uuid.uuid4().hex[:8]}"
    for server in redlock_servers[:2]:
        raw(server).execute_command("ACL", "SETUSER", user, "on", ">pw-not-shown", "~*", "&*", "+@all")
    try:
        ports = [server.port for server in redlock_servers]
        url = f"redlock://{user}:pw-not-shown@" + ",".join(f"127.0.0.1:{p}" for p in ports) + "/0"
        n = name()
        with lockkit.connect(url) as locks:
            lock = locks.lock(n, ttl=30, auto_renew=False)
            with pytest.raises(ConfigError) as refused:
                lock.try_acquire() if call == "try_acquire" else lock.acquire(timeout=2)
            assert "pw-not-shown" not in str(refused.value)
        for server in redlock_servers:
            assert raw(server).exists(lock_key(n)) == 0, f"master {server.port} kept the refused acquire's SET"
        with lockkit.connect(redlock_servers.url) as locks:
            assert locks.lock(n, ttl=5).try_acquire() is not None
    finally:
        for server in redlock_servers[:2]:
            raw(server).execute_command("ACL", "DELUSER", user)
