"""Fault scenarios for redis:// (docs/reliability.md), each named after its scenario."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

import lockkit
from backends.proxy import FaultProxy
from backends.pytest_fixtures import ProxyFactory, RedisFactory
from backends.servers import RedisServer
from lockkit import ConfigError, LockLost, LockNotOwned

SLACK = 0.25  # CI scheduling slack on "within X" bounds (docs/reliability.md, test infrastructure)

HOLDER = """
import sys, time, lockkit
locks = lockkit.connect(sys.argv[1])
lease = locks.lock(sys.argv[2], ttl=float(sys.argv[3])).acquire(timeout=10)
print("held", flush=True)
time.sleep(60)
"""


def name() -> str:
    return f"fault-{uuid.uuid4().hex[:8]}"


def raw(server: RedisServer) -> redis.Redis:
    return redis.Redis(host=server.host, port=server.port, socket_timeout=2)


def lock_key(n: str) -> bytes:
    return f"lockkit:{{{n}}}".encode()


@pytest.fixture
def server(fresh_redis: RedisFactory) -> RedisServer:
    return fresh_redis()


@pytest.fixture
def locks(server: RedisServer) -> Iterator[lockkit.Locker]:
    locker = lockkit.connect(server.url)
    yield locker
    locker.close()


def spawn_holder(url: str, n: str, ttl: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, url, n, str(ttl)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def wait_lost(lease: lockkit.Lease, timeout: float) -> float | None:
    lost = threading.Event()
    lease.add_lost_callback(lambda _: lost.set())
    return time.monotonic() if lost.wait(timeout) else None


@pytest.mark.parametrize("scheme", ["redis", "redlock"])
def test_C2_holder_sigkill_next_waiter_within_ttl(
    scheme: str, redis_server: RedisServer, redlock_servers: object
) -> None:
    url = redis_server.url if scheme == "redis" else redlock_servers.url  # type: ignore[attr-defined]
    n, ttl = name(), 1.0
    proc = spawn_holder(url, n, ttl)
    with lockkit.connect(url) as locks:
        proc.kill()
        killed = time.monotonic()
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
        lease = locks.lock(n, ttl=ttl).acquire(timeout=5)
        took = time.monotonic() - killed
        print(f"C-2 {scheme}: waiter acquired {took:.3f} s after SIGKILL")
        assert took <= ttl + SLACK
        assert lease.valid


def test_C5_blackholed_holder_reports_loss_by_deadline(server: RedisServer, fault_proxy: ProxyFactory) -> None:
    proxy: FaultProxy = fault_proxy(server)
    with lockkit.connect(f"redis://127.0.0.1:{proxy.port}/0?timeout=0.3&connect_timeout=0.3") as locks:
        lease = locks.lock(name(), ttl=1.0).acquire(timeout=2)
        proxy.set_mode("blackhole")
        lost_at = wait_lost(lease, 3)
        assert lost_at is not None, "loss was never reported"
        print(f"C-5: loss reported {lost_at - lease.expires_at:+.3f} s from the deadline")
        assert lost_at <= lease.expires_at + SLACK
        with pytest.raises(LockLost):
            lease.ensure_valid()
        proxy.heal()
        time.sleep(0.3)
        assert not lease.valid, "a ghost renewal revived the lease after healing"


def test_C10_server_sigstop_loss_by_deadline_then_one_winner(server: RedisServer) -> None:
    n = name()
    with lockkit.connect(server.url + "?timeout=0.3&connect_timeout=0.3") as locks:
        lease = locks.lock(n, ttl=1.0).acquire()
        server.pause()
        try:
            lost_at = wait_lost(lease, 3)
        finally:
            time.sleep(max(0.0, 2.0 - (time.monotonic() - lease.acquired_at)))
            server.resume()
        assert lost_at is not None and lost_at <= lease.expires_at + SLACK
        assert raw(server).exists(lock_key(n)) == 0, "the key outlived the pause"
        winner = locks.lock(n, ttl=1.0).acquire(timeout=2)
        assert locks.lock(n, ttl=1.0).try_acquire() is None
        assert winner.valid


def test_C11_restart_loses_key_and_fencing_regresses_with_warning(
    server: RedisServer, locks: lockkit.Locker, caplog: pytest.LogCaptureFixture
) -> None:
    n = name()
    for _ in range(3):
        locks.lock(n, ttl=5).acquire().fencing_token  # noqa: B018 - advance the counter
        locks.force_release(n)
    lock = locks.lock(n, ttl=5, auto_renew=False)
    old = lock.acquire()
    server.kill()
    server.restart()
    with caplog.at_level(logging.WARNING, logger="lockkit"), pytest.raises(LockLost):
        lock.renew()
    assert any("restarted" in r.getMessage() and "fencing" in r.getMessage() for r in caplog.records)
    new = locks.lock(n, ttl=5).acquire(timeout=2)
    assert new.fencing_token < old.fencing_token  # documented: INCR restarts without persistence


def test_C12_idle_connection_killed_by_server_renewal_still_succeeds(fresh_redis: RedisFactory) -> None:
    server = fresh_redis(extra_args=["--timeout", "1"])
    with lockkit.connect(server.url) as locks:
        lock = locks.lock(name(), ttl=3.0)
        lease = lock.acquire()
        time.sleep(3.5)  # renewals at ~1 s intervals; the server drops connections idle for 1 s
        assert lease.valid, lease.lost_reason
        lock.release()


def test_R1_flushall_detected_within_one_renewal_period(server: RedisServer, locks: lockkit.Locker) -> None:
    n, ttl = name(), 1.5
    lock = locks.lock(n, ttl=ttl)
    lease = lock.acquire()
    raw(server).flushall()
    flushed = time.monotonic()
    lost_at = wait_lost(lease, 3)
    assert lost_at is not None and lost_at - flushed <= ttl / 3 + SLACK
    other = locks.lock(n, ttl=5)
    other.acquire(timeout=1)
    with pytest.raises(LockNotOwned):
        lock.release()
    assert raw(server).exists(lock_key(n)) == 1, "a stale release deleted the new owner's key"
    other.release()


def test_R2_script_flush_reloads_and_never_falls_back(server: RedisServer, locks: lockkit.Locker) -> None:
    n = name()
    lock = locks.lock(n, ttl=5, auto_renew=False)
    lock.acquire()
    spy = raw(server)
    spy.script_flush()
    seen: list[str] = []
    with spy.monitor() as monitor:
        done = threading.Event()

        def watch() -> None:
            for command in monitor.listen():
                if command.get("client_type") != "lua":  # commands run inside our scripts are fine
                    seen.append(command["command"])
                if done.is_set() and "PING" in command["command"]:
                    return

        reader = threading.Thread(target=watch, daemon=True)
        reader.start()
        time.sleep(0.1)
        lock.renew()
        lock.release()
        done.set()
        raw(server).ping()
        reader.join(5)
    top_level = [c.split()[0].upper() for c in seen]
    print("R-2 commands seen:", top_level)
    assert "SCRIPT" in top_level and "EVALSHA" in top_level
    assert not {"GET", "DEL", "PEXPIRE", "SET", "EVAL"} & set(top_level), "a non-atomic fallback ran"
    assert raw(server).exists(lock_key(n)) == 0


def test_R3_eviction_policy_warns_and_strict_refuses(server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    raw(server).config_set("maxmemory-policy", "volatile-lru")
    with caplog.at_level(logging.WARNING, logger="lockkit"), lockkit.connect(server.url) as locks:
        locks.lock(name(), ttl=1).acquire().token  # noqa: B018
    assert any("volatile-lru" in r.getMessage() and "noeviction" in r.getMessage() for r in caplog.records)
    refused = name()
    with lockkit.connect(server.url + "?strict=true") as strict:
        with pytest.raises(ConfigError, match="strict"):
            strict.lock(refused, ttl=1).try_acquire()
        with pytest.raises(ConfigError, match="strict"):
            strict.lock(refused, ttl=1).try_acquire()
    assert raw(server).exists(lock_key(refused)) == 0, "a refused server took a lock"


def test_R4_early_expiry_detected_within_one_renewal_period(server: RedisServer, locks: lockkit.Locker) -> None:
    n, ttl = name(), 1.5
    lease = locks.lock(n, ttl=ttl).acquire()
    raw(server).pexpire(lock_key(n), 1)
    expired = time.monotonic()
    lost_at = wait_lost(lease, 3)
    assert lost_at is not None and lost_at - expired <= ttl / 3 + SLACK


PAUSED_HOLDER = """
import json, sys, threading, time, lockkit
from lockkit.cli.fencing_store import FencedStore
url, name, path, fenced = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
locks = lockkit.connect(url)
lease = locks.lock(name, ttl=1.0).acquire(timeout=5)
lost = threading.Event()
lease.add_lost_callback(lambda _: lost.set())
store = FencedStore(path) if fenced else None
if store is not None:
    value = store.read(lease.fencing_token, lease.token)
else:
    value = int(open(path).read())
entered = time.monotonic()
print("held", flush=True)
sys.stdin.readline()  # SIGSTOPped here; the test sends a line after SIGCONT
resumed = time.monotonic()
valid = lease.valid
started = time.perf_counter()
try:
    lease.ensure_valid()
    ensure = "passed"
except lockkit.LockLost:
    ensure = "raised"
ensure_took = time.perf_counter() - started
if store is not None:
    wrote = store.write(value + 1, lease.fencing_token, lease.token)
else:  # an unfenced client writes what it computed before the pause: the lost-update hazard
    open(path, "w").write(str(value + 1))
    wrote = True
exited = time.monotonic()
fired = lost.wait(1.0)
print(json.dumps({"valid": valid, "ensure": ensure, "ensure_took": ensure_took, "wrote": wrote,
                  "entered": entered, "exited": exited, "lost_after": time.monotonic() - resumed if fired else None}),
      flush=True)
"""


def run_paused_holder(
    url: str, n: str, path: str, fenced: bool, intruder: lockkit.Locker
) -> tuple[dict[str, object], float, float]:
    """Holder pauses (SIGSTOP) past 2×TTL while an intruder takes the lock and writes; then it resumes."""
    import json
    import os
    import signal

    proc = subprocess.Popen(
        [sys.executable, "-c", PAUSED_HOLDER, url, n, path, "1" if fenced else "0"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        assert proc.stdout.readline().strip() == "held"
        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(2.0)  # 2 × TTL: the holder's key expires on the server
        with intruder.lock(n, ttl=5) as lease:
            entered = time.monotonic()
            if fenced:
                from lockkit.cli.fencing_store import FencedStore

                store = FencedStore(path)
                value = store.read(lease.fencing_token, lease.token)
                assert value is not None and store.write(value + 1, lease.fencing_token, lease.token)
                store.close()
            else:
                with open(path) as f:
                    value = int(f.read())
                with open(path, "w") as f:
                    f.write(str(value + 1))
            os.kill(proc.pid, signal.SIGCONT)  # the old holder wakes up while we still hold the lock
            proc.stdin.write("go\n")
            proc.stdin.flush()
            report = json.loads(proc.stdout.readline())
            exited = time.monotonic()
        return report, entered, exited
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stdin.close()


def test_C4a_paused_holder_is_fenced_off_and_knows_it_lost(
    server: RedisServer, locks: lockkit.Locker, tmp_path: Path
) -> None:
    from lockkit.cli.fencing_store import FencedStore

    path = str(tmp_path / "fenced.sqlite")
    FencedStore(path).close()
    report, _, _ = run_paused_holder(server.url, name(), path, True, locks)
    print("C-4a:", report)
    assert report["wrote"] is False, "the fencing store accepted the paused holder's stale write"
    assert report["valid"] is False and report["ensure"] == "raised"
    assert float(report["ensure_took"]) < 0.05  # type: ignore[arg-type]  # in-memory check (generous bound for CI)
    assert report["lost_after"] is not None and float(report["lost_after"]) <= 1.0 / 3 + SLACK  # type: ignore[arg-type]
    store = FencedStore(path)
    summary = store.report()
    store.close()
    assert summary.backwards == 0 and summary.shared_tokens == 0 and summary.value == 1


@pytest.mark.parametrize("scheme", ["redis", "redlock"])
def test_C4b_canary_without_fencing_the_overlap_is_real(
    scheme: str, server: RedisServer, redlock_servers: object, tmp_path: Path
) -> None:
    url = server.url if scheme == "redis" else redlock_servers.url  # type: ignore[attr-defined]
    path = tmp_path / "counter"
    path.write_text("0")
    with lockkit.connect(url) as intruder:
        report, entered, exited = run_paused_holder(url, name(), str(path), False, intruder)
    print(f"C-4b {scheme}:", report)
    # the overlap checker: the old holder's critical section [entered, exited] contains the intruder's
    old_enter, old_exit = float(report["entered"]), float(report["exited"])  # type: ignore[arg-type]
    assert old_enter < entered and exited > old_exit > entered, "the harness failed to see the overlap"
    assert path.read_text() == "1", "two acknowledged increments should have lost one (the documented hazard)"


def test_r5_failover_to_a_replica_that_missed_the_lock(fresh_redis: RedisFactory, fault_proxy: ProxyFactory) -> None:
    """R-5: asynchronous replication can lose a lock on failover (canary); min_replicas refuses such a grant."""
    master = fresh_redis()
    link = fault_proxy(master)  # the replication link runs through a proxy the test controls
    replica = fresh_redis(extra_args=("--replicaof", "127.0.0.1", str(link.port)))
    to_replica = redis.Redis(host=replica.host, port=replica.port)
    deadline = time.monotonic() + 15
    while to_replica.info("replication").get("master_link_status") != "up":
        assert time.monotonic() < deadline, "the replica never synchronised"
        time.sleep(0.05)
    name = f"r5-{uuid.uuid4().hex[:8]}"
    link.set_mode("blackhole")  # replication (and its acknowledgements) stop flowing
    with lockkit.connect(master.url + "?min_replicas=1&replica_timeout=0.2") as guarded:
        with pytest.raises(lockkit.BackendUnavailable, match="min_replicas"):
            guarded.lock(name, ttl=10).acquire(timeout=1)
        assert not guarded.holder(name).held, "a grant no replica acknowledged was left on the master"
    with lockkit.connect(master.url) as plain, lockkit.connect(replica.url) as promoted:
        first = plain.lock(name, ttl=10, auto_renew=False).acquire(timeout=1)  # acknowledged by the master alone
        master.kill()  # the master dies before the replica saw the write
        link.stop()
        to_replica.execute_command("REPLICAOF", "NO", "ONE")  # the failover promotes the replica
        second = promoted.lock(name, ttl=10).try_acquire()
        # The documented hazard: both leases are "valid" at once. Only fencing at the resource can catch it,
        # and here even the fencing counter went back with the lost write.
        assert second is not None and first.valid and second.valid
        assert second.fencing_token <= first.fencing_token
    to_replica.close()
