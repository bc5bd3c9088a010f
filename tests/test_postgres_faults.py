"""PostgreSQL fault scenarios from docs/reliability.md (P-*), against real PostgreSQL 15 servers from backends/.

Timing bounds carry CI slack and print what was measured.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import lockkit
from backends.servers import PostgresServer
from lockkit import ConfigError, LockLost
from lockkit.drivers.postgres.keys import advisory_key, lock_parts
from lockkit.testing.conformance import ODD_NAMES

SLACK = 2.0
ROOT = Path(__file__).resolve().parents[1]


def _name() -> str:
    return f"pf-{uuid.uuid4().hex[:10]}"


def advisory_locks(server: PostgresServer, name: str, namespace: str = "lockkit") -> list[str]:
    """``granted`` of every pg_locks row of ``name``'s advisory key, as psql prints it (``t``/``f``)."""
    hi, lo = lock_parts(advisory_key(namespace, name))
    out = server.psql(
        f"SELECT granted FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 AND classid = {hi} "
        f"AND objid = {lo}"
    )
    return out.split()


HOLDER = textwrap.dedent("""
    import sys, lockkit
    url, name, ttl = sys.argv[1], sys.argv[2], float(sys.argv[3])
    locks = lockkit.connect(url)
    lease = locks.lock(name, ttl=ttl).acquire(timeout=30)
    print("held", lease.fencing_token, lease.ttl, flush=True)
    for line in sys.stdin:
        print("valid" if lease.valid else "invalid", flush=True)
""")


@pytest.fixture
def holder_process() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
        proc.wait(10)
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()


def start_holder(procs: list[subprocess.Popen[str]], url: str, name: str, ttl: float) -> int:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, url, name, str(ttl)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)  # fmt: skip
    procs.append(proc)
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    assert line and line[0] == "held", line
    return int(line[1])


def test_p1_holder_sigkill_waiter_served_promptly(
    postgres_server: PostgresServer, holder_process: list[subprocess.Popen[str]]
) -> None:
    # The holder's ttl is long: only the end of its session (the kernel closes its socket) can free the lock.
    name = _name()
    token = start_holder(holder_process, postgres_server.url, name, 60.0)
    with lockkit.connect(postgres_server.url) as locks:
        lock = locks.lock(name, ttl=5)
        assert lock.try_acquire() is None
        got: list[tuple[int, float]] = []

        def wait() -> None:
            lease = lock.acquire(timeout=30)
            got.append((lease.fencing_token, time.monotonic()))

        waiter = threading.Thread(target=wait)
        waiter.start()
        while advisory_locks(postgres_server, name).count("f") < 1:  # the waiter is in the server's queue
            time.sleep(0.02)
        killed = time.monotonic()
        holder_process[0].kill()
        waiter.join(30)
        assert got, "the waiter never acquired"
        waited = got[0][1] - killed
        print(f"P-1: waiter acquired {waited:.3f} s after the holder's SIGKILL (holder ttl 60 s)")
        assert waited < SLACK
        assert got[0][0] > token
        lock.release()


def test_p2_server_restart_loss_reported(fresh_postgres) -> None:  # type: ignore[no-untyped-def]
    server = fresh_postgres()
    name = _name()
    lost_at: list[float] = []
    with lockkit.connect(server.url) as locks, lockkit.connect(server.url) as other:
        lock = locks.lock(name, ttl=2, on_lost=lambda _: lost_at.append(time.monotonic()))
        lease = lock.acquire(timeout=5)
        restarted = time.monotonic()
        server.restart()  # a fast shutdown ends every session: the server keeps no advisory lock over a restart
        # The restarted server grants the lock to anyone at once: our loss must have been reported before that
        # (the server says it ends the session before it closes it, and the driver watches idle sessions).
        second = other.lock(name, ttl=2).acquire(timeout=10)
        granted_at = time.monotonic()
        assert lost_at, "the restarted server granted the lock while our lease was still valid"
        print(f"P-2: loss reported {lost_at[0] - restarted:.3f} s after the restart began, "
              f"{granted_at - lost_at[0]:.3f} s before another client was granted the lock (ttl {lease.ttl:g} s)")
        assert lost_at[0] < granted_at and not lease.valid
        with pytest.raises(LockLost):
            lock.renew()
        assert second.fencing_token > lease.fencing_token, "the fencing counter must survive the restart"
        other.force_release(name)


async def test_p2_server_restart_loss_reported_async(fresh_postgres) -> None:  # type: ignore[no-untyped-def]
    server = fresh_postgres()
    name = _name()
    lost_at: list[float] = []
    async with lockkit.connect_async(server.url) as locks, lockkit.connect_async(server.url) as other:
        lease = await locks.lock(name, ttl=2, on_lost=lambda _: lost_at.append(time.monotonic())).acquire(timeout=5)
        await asyncio.get_running_loop().run_in_executor(None, server.restart)
        second = await other.lock(name, ttl=2).acquire(timeout=10)
        assert lost_at and lost_at[0] < time.monotonic(), "the restarted server granted the lock to a second holder"
        assert not lease.valid and second.fencing_token > lease.fencing_token
        await other.force_release(name)


def test_p3_connection_cut_loss_reported_by_deadline(postgres_server: PostgresServer, fault_proxy) -> None:  # type: ignore[no-untyped-def]
    proxy = fault_proxy(postgres_server)
    name = _name()
    url = postgres_server.url.replace(f":{postgres_server.port}/", f":{proxy.port}/") + "?timeout=1"
    lost = threading.Event()
    with lockkit.connect(url) as locks, lockkit.connect(postgres_server.url) as other:
        lease = locks.lock(name, ttl=2, on_lost=lambda _: lost.set()).acquire(timeout=5)
        deadline = lease.expires_at
        proxy.set_mode("blackhole")  # a partition: nothing flows, both sockets stay open
        cut = time.monotonic()
        assert lost.wait(lease.ttl + SLACK), "the cut was not reported as a loss"
        print(f"P-3: loss reported {time.monotonic() - cut:.3f} s after the cut (ttl {lease.ttl:g} s)")
        assert not lease.valid
        # The server still has the session (its socket is open), so nobody else can take the lock yet: safe.
        assert other.lock(name).try_acquire() is None
        # The renewal was cut for want of an answer (P-9), which reports the loss early; the driver keeps the
        # socket open until the lease's deadline, so up to it the server still holds the lock. (A reset that
        # ends the partition frees it server-side at once, whatever any client does: so it comes after.)
        while time.monotonic() < deadline - 0.2:
            assert other.lock(name).try_acquire() is None, "the lock was freed before the holder's deadline"
            time.sleep(0.1)
        time.sleep(max(0.0, deadline - time.monotonic()))
        proxy.reset_all()  # the partition ends in resets: the server ends the session and drops its lock
        second = other.lock(name, ttl=2).acquire(timeout=10)
        assert time.monotonic() >= deadline, "another client got the lock within our lease"
        assert second.fencing_token > lease.fencing_token
        other.force_release(name)


def test_p4_odd_names_are_distinct_advisory_keys(postgres_server: PostgresServer) -> None:
    base = _name()
    names = [base + odd for odd in ODD_NAMES] + ["é" * 256]
    assert len({advisory_key("lockkit", n) for n in names}) == len(names)
    with lockkit.connect(postgres_server.url) as locks:
        held = [locks.lock(n, ttl=5) for n in names]
        for lock in held:
            lock.acquire(timeout=5)
        for n in names:
            assert advisory_locks(postgres_server, n) == ["t"], n
        for lock in held:
            lock.release()
        assert all(advisory_locks(postgres_server, n) == [] for n in names)


def test_p4_hash_collision_is_refused(postgres_server: PostgresServer) -> None:
    # No two real names with one 64-bit key are known, so another name is planted under this name's key, as
    # a second name that happened to collide would have been registered by its first acquisition.
    name, planted = _name(), _name()
    key = advisory_key("lockkit", name)
    with lockkit.connect(postgres_server.url) as locks:
        locks.lock(planted, ttl=5).acquire(timeout=5)  # creates the table, if this is the first test
        locks.force_release(planted)
        postgres_server.psql(f"UPDATE lockkit_locks SET key = {key} WHERE name = '{planted}'")
        with pytest.raises(ConfigError, match="hash collision"):
            locks.lock(name, ttl=5).acquire(timeout=5)
        assert advisory_locks(postgres_server, name) == [], "the refused grant left its advisory lock held"
        assert not locks.lock(name).locked()


def _role(server: PostgresServer, grants: str) -> str:
    role, password = f"r{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    server.psql(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'; {grants.format(role=role)}")
    return server.url_for(role, password)


def test_p5_role_with_the_documented_rights(postgres_server: PostgresServer) -> None:
    # docs/backends/postgres.md: CONNECT, USAGE on the schema, SELECT/INSERT/UPDATE on an existing table.
    table = f"locks_{uuid.uuid4().hex[:8]}"
    postgres_server.psql(
        f"CREATE TABLE {table} (namespace text NOT NULL, name text NOT NULL, key bigint NOT NULL UNIQUE, "
        "fence bigint NOT NULL, holder text, PRIMARY KEY (namespace, name))"
    )
    url = _role(postgres_server, f"GRANT SELECT, INSERT, UPDATE ON {table} TO {{role}}") + f"?table={table}"
    name = _name()
    with lockkit.connect(url) as locks, lockkit.connect(url) as other:
        first = locks.lock(name, ttl=5).acquire(timeout=5)
        assert locks.lock(name).locked() and other.lock(name).try_acquire() is None
        assert other.force_release(name)  # the same role may end its own sessions
        second = other.lock(name, ttl=5).acquire(timeout=5)
        assert second.fencing_token > first.fencing_token
        other.force_release(name)
    bare = _role(postgres_server, "SELECT 1") + f"?table={table}"
    with lockkit.connect(bare) as locks, pytest.raises(ConfigError, match="permission denied") as refused:
        locks.lock(name, ttl=5).acquire(timeout=5)
    assert "SELECT, INSERT, UPDATE" in str(refused.value)
    missing = _role(postgres_server, "SELECT 1") + f"?table=absent_{uuid.uuid4().hex[:8]}"
    with lockkit.connect(missing) as locks, pytest.raises(ConfigError, match="may not create it"):
        locks.lock(name, ttl=5).acquire(timeout=5)


def test_p5_permit_table_right_missing_is_named(postgres_server: PostgresServer) -> None:
    """A role with the lock table's rights only: a semaphore is refused with a ConfigError that names the permit
    table's rights too (it named the lock table's alone, which the role had)."""
    permits = f"permits_{uuid.uuid4().hex[:8]}"
    postgres_server.psql(
        f"CREATE TABLE {permits} (namespace text NOT NULL, name text NOT NULL, lim integer NOT NULL, "
        "fence bigint NOT NULL, PRIMARY KEY (namespace, name))"
    )
    url = _role(postgres_server, "SELECT 1") + f"?permit_table={permits}"
    with lockkit.connect(url) as locks, pytest.raises(ConfigError, match="permission denied") as refused:
        locks.semaphore(_name(), limit=2, ttl=5).acquire(timeout=5)
    assert "permit table" in str(refused.value) and "SELECT, INSERT, UPDATE" in str(refused.value)


def test_p6_standby_and_read_only_refused(fresh_postgres) -> None:  # type: ignore[no-untyped-def]
    primary = fresh_postgres()
    standby = fresh_postgres(standby_of=primary)
    with lockkit.connect(standby.url) as locks, pytest.raises(ConfigError, match="hot standby"):
        locks.lock(_name(), ttl=5).acquire(timeout=5)
    read_only = _role(primary, "ALTER ROLE {role} SET default_transaction_read_only = on")
    with lockkit.connect(read_only) as locks, pytest.raises(ConfigError, match="read-only"):
        locks.lock(_name(), ttl=5).acquire(timeout=5)


def test_p7_one_process_many_locks_few_sessions(postgres_server: PostgresServer) -> None:
    # Held locks share sessions; two leases of one name never do (advisory locks are re-entrant per session).
    app = f"pf{uuid.uuid4().hex[:8]}"
    url = postgres_server.url + f"?application_name={app}"
    names = [_name() for _ in range(200)]
    with lockkit.connect(url) as locks:
        held = [locks.lock(n, ttl=30) for n in names]
        for lock in held:
            lock.acquire(timeout=5)
        sessions = int(postgres_server.psql(f"SELECT count(*) FROM pg_stat_activity WHERE application_name = '{app}'"))
        print(f"P-7: 200 locks held over {sessions} session(s)")
        assert sessions <= 2
        again = locks.lock(names[0], ttl=5)
        assert again.try_acquire() is None, "a second lease of a held name in one process"
        got: list[float] = []
        waiter = threading.Thread(target=lambda: got.append((again.acquire(timeout=20), time.monotonic())[1]))
        waiter.start()
        while advisory_locks(postgres_server, names[0]).count("f") < 1:
            time.sleep(0.02)
        released = time.monotonic()
        held[0].release()
        waiter.join(20)
        assert got and got[0] - released < SLACK
        again.release()
        for lock in held[1:]:
            lock.release()


async def test_p8_cancel_after_the_grant_leaves_nothing(postgres_server: PostgresServer, fault_proxy) -> None:  # type: ignore[no-untyped-def]
    # The waiter's grant is on its way back (replies delayed by the proxy) when its task is cancelled: the
    # server did grant it, the cancel comes too late to stop the statement, and the session now holds a lock
    # nobody will ever see as a lease. The cancelled acquire must unlock it.
    proxy = fault_proxy(postgres_server)
    name = _name()
    via_proxy = postgres_server.url.replace(f":{postgres_server.port}/", f":{proxy.port}/")
    async with lockkit.connect_async(postgres_server.url) as locks, lockkit.connect_async(via_proxy) as other:
        holder = locks.lock(name, ttl=5)
        await holder.acquire(timeout=5)
        task = asyncio.ensure_future(other.lock(name, ttl=5).acquire(timeout=10))
        while advisory_locks(postgres_server, name).count("f") < 1:  # the waiter is in the server's queue
            await asyncio.sleep(0.02)
        proxy.delay(0.5, "down")
        await holder.release()
        while advisory_locks(postgres_server, name) != ["t"]:  # granted to the waiter, its reply delayed
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        proxy.heal()
        deadline = time.monotonic() + 5
        while advisory_locks(postgres_server, name) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert advisory_locks(postgres_server, name) == [], "a cancelled wait left its lock held"
        third = await locks.lock(name, ttl=5).acquire(timeout=2)
        assert third.valid
