"""The semaphore and reader-writer lock suite over postgresql:// (one real PostgreSQL 15 server), both faces."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

import lockkit
from backends.servers import PostgresServer
from lockkit import ConfigError
from lockkit.drivers.postgres.keys import permit_key, unsigned
from lockkit.testing import AsyncSemaphoreSuite, SemaphoreSuite


class TestPostgres(SemaphoreSuite):
    killed_holder_freed_at_once = True  # the kernel closes its socket: its session, and permits, end at once

    @pytest.fixture
    def url(self, postgres_server: PostgresServer) -> str:
        return postgres_server.url


class TestPostgresAsync(AsyncSemaphoreSuite):
    killed_holder_freed_at_once = True  # the kernel closes its socket: its session, and permits, end at once

    @pytest.fixture
    def url(self, postgres_server: PostgresServer) -> str:
        return postgres_server.url


# -- postgresql:// specifics (docs/reliability.md, P-20 … P-24) --------------------------------------------------

SLACK = 2.0
ROOT = Path(__file__).resolve().parents[1]


def _name() -> str:
    return f"ps-{uuid.uuid4().hex[:10]}"


def _locks_on(server: PostgresServer, name: str, part: str, namespace: str = "lockkit") -> list[tuple[str, str]]:
    """``(mode, granted)`` of every pg_locks row on one permit key of ``name`` (``part``: presence, rw, slot:i)."""
    a, b = (unsigned(x) for x in permit_key(namespace, name, part))
    out = server.psql(
        "SELECT mode, CASE WHEN granted THEN 't' ELSE 'f' END FROM pg_locks WHERE locktype = 'advisory' "
        f"AND objsubid = 2 AND classid = {a} AND objid = {b}"
    )
    return [tuple(line.split("|")) for line in out.splitlines() if line.strip()]  # type: ignore[misc]


def _until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_p20_reader_behind_a_waiting_writer_queues_in_the_server(postgres_server: PostgresServer) -> None:
    name = _name()
    url = postgres_server.url
    with lockkit.connect(url) as locks, lockkit.connect(url) as other, lockkit.connect(url) as third:
        first = locks.rwlock(name, ttl=10).read()
        r1 = first.acquire(timeout=5)
        writer = other.rwlock(name, ttl=10).write()
        w_got: list[lockkit.Lease] = []
        w_thread = threading.Thread(target=lambda: w_got.append(writer.acquire(timeout=20)))
        w_thread.start()
        _until(lambda: ("ExclusiveLock", "f") in _locks_on(postgres_server, name, "rw"), 10, "the writer never queued")
        late = third.rwlock(name, ttl=10).read()
        r_got: list[lockkit.Lease] = []
        r_thread = threading.Thread(target=lambda: r_got.append(late.acquire(timeout=20)))
        r_thread.start()
        # The late reader blocks in the server's queue behind the writer, although only a reader holds:
        # PostgreSQL's lock manager checks a request against the waiters' modes too (writer preference).
        _until(lambda: ("ShareLock", "f") in _locks_on(postgres_server, name, "rw"), 10, "the reader never queued")
        first.release()
        w_thread.join(SLACK + 5)
        assert w_got and w_got[0].valid, "the writer is served first"
        time.sleep(0.3)
        assert not r_got, "the late reader waits for the writer it queued behind"
        writer.release()
        r_thread.join(SLACK + 5)
        assert r_got and r_got[0].valid
        assert r1.fencing_token < w_got[0].fencing_token < r_got[0].fencing_token
        late.release()


async def test_p21_terminated_holder_session_reports_loss_and_serves_the_waiter(
    postgres_server: PostgresServer,
) -> None:
    name = _name()
    url = postgres_server.url
    async with lockkit.connect_async(url) as locks, lockkit.connect_async(url) as other:
        lost = asyncio.Event()
        holder = locks.semaphore(name, limit=1, ttl=30, on_lost=lambda _: lost.set())
        held = await holder.acquire(timeout=5)
        task = asyncio.ensure_future(other.semaphore(name, limit=1, ttl=10).acquire(timeout=20))
        while ("ExclusiveLock", "f") not in _locks_on(postgres_server, name, "slot:0"):
            await asyncio.sleep(0.02)
        a, b = (unsigned(x) for x in permit_key("lockkit", name, "slot:0"))
        killed = time.monotonic()
        postgres_server.psql(
            "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 "
            f"AND classid = {a} AND objid = {b} AND granted"
        )
        await asyncio.wait_for(lost.wait(), SLACK + 3)  # the watched socket reports it, not the next renewal
        assert not held.valid and "session" in (held.lost_reason or "")
        lease = await asyncio.wait_for(task, SLACK + 5)
        assert lease.valid and lease.fencing_token > held.fencing_token
        print(f"P-21: loss reported and the waiter served {time.monotonic() - killed:.3f} s after the terminate")


HOLDER = textwrap.dedent("""
    import sys, lockkit
    url, name, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
    locks = lockkit.connect(url)
    lease = locks.semaphore(name, limit=limit, ttl=30).acquire(timeout=30)
    print("held", lease.fencing_token, flush=True)
    sys.stdin.read()
""")


def test_p22_limit_row_after_every_holder_died(postgres_server: PostgresServer) -> None:
    name = _name()
    url = postgres_server.url
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    argv = [sys.executable, "-c", HOLDER, url, name, "3"]
    procs = [
        subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env) for _ in range(2)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().startswith("held")
        with lockkit.connect(url) as locks:
            with pytest.raises(ConfigError, match="same limit"):
                locks.semaphore(name, limit=5).try_acquire()  # live holders use 3
            for proc in procs:
                proc.kill()
                proc.wait(10)
            # The row outlives its holders (their sessions ended, taking their advisory locks, not the row):
            assert postgres_server.psql(f"SELECT lim FROM lockkit_permits WHERE name = '{name}'").strip() == "3"
            _until(lambda: not _locks_on(postgres_server, name, "presence"), 10, "the dead holders are still present")
            info = locks.permit_holders(name)
            assert (info.limit, info.holders, info.waiters) == (None, 0, 0)
            permit = locks.semaphore(name, limit=5, ttl=10)
            lease = permit.try_acquire()  # nobody is present: the next one sets the limit anew
            assert lease is not None and lease.valid
            assert postgres_server.psql(f"SELECT lim FROM lockkit_permits WHERE name = '{name}'").strip() == "5"
            with pytest.raises(ConfigError, match="same limit"):
                locks.semaphore(name, limit=3).try_acquire()
            permit.release()
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()


def test_p23_another_client_computes_the_keys(postgres_server: PostgresServer) -> None:
    name = _name()
    p, r, slot = (permit_key("lockkit", name, part) for part in ("presence", "rw", "slot:0"))
    with psycopg.connect(postgres_server.url, autocommit=True) as raw, lockkit.connect(postgres_server.url) as locks:
        # Another client following docs/semaphores.md: present, then one permit of a semaphore of limit 1.
        raw.execute("INSERT INTO lockkit_permits VALUES ('lockkit', %s, 1, 0) ON CONFLICT DO NOTHING", (name,))
        raw.execute("SELECT pg_advisory_lock_shared(%s, %s), pg_advisory_lock(%s, %s)", (*p, *slot))
        assert locks.semaphore(name, limit=1).try_acquire() is None
        info = locks.permit_holders(name)
        assert (info.limit, info.holders) == (1, 1)
        with pytest.raises(ConfigError, match="same limit"):
            locks.semaphore(name, limit=2).try_acquire()
        with locks.lock(name, ttl=5) as lease:  # a lock of the same name: another key space (objsubid 1)
            assert lease.valid
        raw.execute("SELECT pg_advisory_unlock(%s, %s), pg_advisory_unlock_shared(%s, %s)", (*slot, *p))
        with locks.semaphore(name, limit=1, ttl=5) as lease:
            assert lease.valid
        # The rwlock key: a foreign reader keeps lockkit's writer out, and lets lockkit's readers in.
        other = _name()
        r = permit_key("lockkit", other, "rw")
        p = permit_key("lockkit", other, "presence")
        raw.execute("INSERT INTO lockkit_permits VALUES ('lockkit', %s, 0, 0) ON CONFLICT DO NOTHING", (other,))
        raw.execute("SELECT pg_advisory_lock_shared(%s, %s), pg_advisory_lock_shared(%s, %s)", (*p, *r))
        assert locks.rwlock(other).write().try_acquire() is None
        reader = locks.rwlock(other, ttl=5).read()
        assert reader.try_acquire() is not None
        reader.release()


async def test_p24_cancel_after_the_permit_grant_leaves_nothing(postgres_server: PostgresServer, fault_proxy) -> None:  # type: ignore[no-untyped-def]
    # As P-8 for locks: the waiter's grant is on its way back when its task is cancelled; the cancelled acquire
    # must give back the slot and its presence.
    proxy = fault_proxy(postgres_server)
    name = _name()
    via_proxy = postgres_server.url.replace(f":{postgres_server.port}/", f":{proxy.port}/")
    async with lockkit.connect_async(postgres_server.url) as locks, lockkit.connect_async(via_proxy) as other:
        holder = locks.semaphore(name, limit=1, ttl=10)
        await holder.acquire(timeout=5)
        task = asyncio.ensure_future(other.semaphore(name, limit=1, ttl=10).acquire(timeout=10))
        while ("ExclusiveLock", "f") not in _locks_on(postgres_server, name, "slot:0"):
            await asyncio.sleep(0.02)
        proxy.delay(0.5, "down")
        await holder.release()
        while _locks_on(postgres_server, name, "slot:0") != [("ExclusiveLock", "t")]:
            await asyncio.sleep(0.01)  # granted to the waiter, its reply delayed
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        proxy.heal()
        deadline = time.monotonic() + 5
        while _locks_on(postgres_server, name, "slot:0") + _locks_on(postgres_server, name, "presence"):
            assert time.monotonic() < deadline, "a cancelled wait left its permit (or its presence) held"
            await asyncio.sleep(0.05)
        third = await locks.semaphore(name, limit=1, ttl=5).try_acquire()
        assert third is not None and third.valid


def test_p25_limits_that_disagree_never_hold_at_once(postgres_server: PostgresServer) -> None:
    # Two fleets hammer one name, one with limit 2 and one with limit 3: each request either joins (its limit
    # agrees, or nobody is present and it sets it) or is refused. Holds of different limits must never overlap,
    # whether a join took the one-statement path or the full one that resets the limit.
    name = _name()
    spans: list[tuple[float, float, int]] = []
    refused = [0]
    stop = time.monotonic() + 4.0
    guard = threading.Lock()

    def fleet(limit: int) -> None:
        with lockkit.connect(postgres_server.url) as locks:
            while time.monotonic() < stop:
                permit = locks.semaphore(name, limit=limit, ttl=10)
                try:
                    lease = permit.try_acquire()
                except ConfigError:
                    with guard:
                        refused[0] += 1
                    continue
                if lease is None:
                    continue
                entered = time.monotonic()
                time.sleep(0.002)
                left = time.monotonic()
                permit.release()
                with guard:
                    spans.append((entered, left, limit))

    threads = [threading.Thread(target=fleet, args=(limit,)) for limit in (2, 2, 3, 3, 3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    by_limit = {limit: sorted(s for s in spans if s[2] == limit) for limit in (2, 3)}
    assert by_limit[2] and by_limit[3] and refused[0], "both limits must have held, and some requests refused"
    for a0, a1, _ in by_limit[2]:
        for b0, b1, _ in by_limit[3]:
            assert a1 <= b0 or b1 <= a0, "holders of limit 2 and limit 3 at once"
    print(f"P-25: {len(by_limit[2])} holds of limit 2, {len(by_limit[3])} of limit 3, {refused[0]} refused")


def test_p26_a_wait_slice_ending_on_a_busy_row_leaves_no_count_held(postgres_server: PostgresServer) -> None:
    # The waiter's slot is granted while another transaction holds the name's row (here a plain session, in
    # production the other grants of the name): the fence bump waits for the row. That wait must not be cut
    # by the wait's lock_timeout slice, else the statement fails with the slot held, a retry takes it again
    # (advisory locks are re-entrant) and one count stays held after the release.
    name = _name()
    with lockkit.connect(postgres_server.url) as locks, lockkit.connect(postgres_server.url) as other:
        holder = locks.semaphore(name, limit=1, ttl=10)
        holder.acquire(timeout=5)
        waiter = other.semaphore(name, limit=1, ttl=10)
        got: list[lockkit.Lease] = []
        thread = threading.Thread(target=lambda: got.append(waiter.acquire(timeout=1.0)))  # a slice of <= 1 s
        thread.start()
        _until(lambda: ("ExclusiveLock", "f") in _locks_on(postgres_server, name, "slot:0"), 10, "never queued")
        with psycopg.connect(postgres_server.url) as raw:  # a transaction holding the row for 1.6 s
            raw.execute("SELECT 1 FROM lockkit_permits WHERE namespace = 'lockkit' AND name = %s FOR UPDATE", (name,))
            holder.release()
            time.sleep(1.6)
        thread.join(SLACK + 10)
        assert got and got[0].valid
        waiter.release()
        _until(lambda: not _locks_on(postgres_server, name, "slot:0"), 5, "the slot is still held after the release")


def test_p27_threads_of_one_locker_share_its_permit_sessions(postgres_server: PostgresServer) -> None:
    # Blocking face, one Locker, 6 threads each with its own handle of a semaphore of limit 2 (waiting, not
    # just trying): never more than 2 inside, every thread served, and nothing of the name left held after.
    name = _name()
    inside, most, served = [0], [0], [0]
    guard = threading.Lock()
    errors: list[BaseException] = []
    stop = time.monotonic() + 3.0
    with lockkit.connect(postgres_server.url) as locks:

        def worker() -> None:
            try:
                while time.monotonic() < stop:
                    permit = locks.semaphore(name, limit=2, ttl=10)
                    with permit:
                        with guard:
                            inside[0] += 1
                            most[0] = max(most[0], inside[0])
                        time.sleep(0.003)
                        with guard:
                            inside[0] -= 1
                            served[0] += 1
            except BaseException as exc:  # reported below: a thread's failure must fail the test
                errors.append(exc)

        threads = [threading.Thread(target=worker) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not errors, errors
        assert most[0] <= 2 and served[0] > 6
        info = locks.permit_holders(name)
        assert (info.holders, info.waiters) == (0, 0)
    leftover = [part for part in ("presence", "slot:0", "slot:1") if _locks_on(postgres_server, name, part)]
    assert not leftover, leftover
    print(f"P-27: {served[0]} permits served to 6 threads of one locker, at most {most[0]} at once")


async def test_p27_tasks_of_one_async_locker_share_its_permit_sessions(postgres_server: PostgresServer) -> None:
    # The asyncio face of the same: 6 tasks of one AsyncLocker.
    name = _name()
    inside, most, served = [0], [0], [0]
    stop = time.monotonic() + 3.0
    async with lockkit.connect_async(postgres_server.url) as locks:

        async def worker() -> None:
            while time.monotonic() < stop:
                async with locks.semaphore(name, limit=2, ttl=10):
                    inside[0] += 1
                    most[0] = max(most[0], inside[0])
                    await asyncio.sleep(0.003)
                    inside[0] -= 1
                    served[0] += 1

        await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(6))), 60)
        assert most[0] <= 2 and served[0] > 6
        info = await locks.permit_holders(name)
        assert (info.holders, info.waiters) == (0, 0)
    leftover = [part for part in ("presence", "slot:0", "slot:1") if _locks_on(postgres_server, name, part)]
    assert not leftover, leftover
