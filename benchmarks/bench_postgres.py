"""PostgreSQL driver benchmark: uncontended latency against the raw floor, 4-process handoffs against raw floors.

    .venv/bin/python benchmarks/bench_postgres.py [--url postgresql://…] [--rounds 2000] [--many 10000]
        [--hold 10] [--contend 5] [--procs 4]

Without ``--url`` it starts a throw-away PostgreSQL 15 from backends/ on a free loopback port.

* **raw floor**: what any advisory lock with a fencing token needs at least, on the driver's own session
  (same connection, same server process: two connections differ by up to 2x on a 2-core machine, with the
  cores their processes land on): the grant statement (``pg_try_advisory_lock`` and the bump of the name's
  counter, one statement, one round trip), then ``pg_advisory_unlock``. The driver sends exactly these; the
  ratio is its own overhead ("driver alone") and the front end's ("lockkit").
* **contention** (lockkit/cli/contention.py): 4 processes loop acquire → ~1 ms hold → release on one name,
  for lockkit and two raw floors: *blocking* (each waiter blocks in ``pg_advisory_lock``, the server grants
  the lock to the first in its queue on release: what the driver does) and *try + LISTEN/NOTIFY* (waiters
  try, then sleep until the releaser's ``NOTIFY``, and try again: the alternative design).
* **scale**: ``--many`` locks held by one process: how many server sessions they take, and one renewal
  round's cost (one heartbeat per session).
"""

from __future__ import annotations

import argparse
import select
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg

import lockkit
from backends.servers import PostgresServer
from benchmarks._common import contention, interleave, latency_table, run_driver, show
from lockkit.driver import RenewRequest
from lockkit.drivers.postgres.keys import advisory_key
from lockkit.drivers.postgres.sql import Statements

SQL = Statements("lockkit_locks")


def _params(name: str) -> dict[str, Any]:
    return {"ns": "lockkit", "name": name, "key": advisory_key("lockkit", name), "hint": "bench"}


def latency(url: str, rounds: int) -> dict[str, list[float]]:
    """The floor runs on the driver's own session: two loopback connections differ by up to 2x here (which core
    each backend process lands on), so only the same connection compares like with like."""
    with lockkit.connect(url) as locks:
        lock = locks.lock(f"bench-{uuid.uuid4().hex[:8]}", ttl=10)
        lock.acquire()
        lock.release()  # the table and the driver's session exist from here on, as in a running service
        driver = locks._backends["default"].driver
        (session,) = driver._sessions
        conn, watch = session.conn, session.watch
        raw = _params(f"bench-raw-{uuid.uuid4().hex[:8]}")

        def floor() -> None:
            watch.pause()  # out of the driver's socket watcher, whose thread would otherwise wake on the replies
            row = conn.execute(SQL.try_grant, raw).fetchone()
            assert row is not None
            conn.execute(SQL.unlock, (raw["key"],))
            watch.resume()

        def ours() -> None:
            lock.acquire()
            lock.release()

        name, token = f"bench-d-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex

        def driver_only() -> None:  # the driver's share of the overhead, without the front end's lease bookkeeping
            driver.acquire(name, token, 10.0, None)
            driver.release(name, token)

        ops = {"raw floor: grant+bump, unlock": floor, "driver alone": driver_only, "lockkit postgresql://": ours}
        return interleave(ops, rounds)


class RawBlocking:
    """A waiter blocks in ``pg_advisory_lock`` (with the fence bump in the same statement), as the driver does."""

    def __init__(self, url: str, name: str) -> None:
        self._conn = psycopg.connect(url, autocommit=True)
        self._params = _params(name)

    def acquire(self, timeout: float) -> int | None:
        self._conn.execute("SELECT set_config('lock_timeout', %s, false)", (f"{int(timeout * 1000)}ms",))
        row = self._conn.execute(SQL.wait_grant, self._params).fetchone()
        return None if row is None else int(row[0])

    def release(self) -> None:
        self._conn.execute(SQL.unlock, (self._params["key"],))

    def close(self) -> None:
        self._conn.close()


class RawNotify:
    """A waiter tries, then sleeps until a release's NOTIFY (or 50 ms) and tries again: no server queue."""

    def __init__(self, url: str, name: str) -> None:
        self._conn = psycopg.connect(url, autocommit=True)
        self._params = _params(name)
        self._channel = f"lk_{self._params['key'] & 0xFFFFFFFF:x}"
        self._conn.execute(f"LISTEN {self._channel}")

    def acquire(self, timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        while True:
            row = self._conn.execute(SQL.try_grant, self._params).fetchone()
            if row is not None:
                return int(row[0])
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            select.select([self._conn.fileno()], [], [], min(left, 0.05))
            for _ in self._conn.notifies(timeout=0, stop_after=0):  # drain what arrived
                pass

    def release(self) -> None:
        unlock = f"SELECT pg_advisory_unlock(%s), pg_notify('{self._channel}', '')"
        self._conn.execute(unlock, (self._params["key"],))

    def close(self) -> None:
        self._conn.close()


def many(url: str, count: int, hold: float) -> dict[str, Any]:
    app = f"bench{uuid.uuid4().hex[:8]}"
    admin = psycopg.connect(url, autocommit=True)
    with lockkit.connect(url + f"?application_name={app}") as locks, admin:
        base = f"bench-m-{uuid.uuid4().hex[:8]}"
        held = [locks.lock(f"{base}-{i}", ttl=3) for i in range(count)]
        started = time.monotonic()
        leases = [lock.acquire() for lock in held]
        acquired_in = time.monotonic() - started
        time.sleep(hold)
        still = sum(lease.valid for lease in leases)
        row = admin.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (app,)).fetchone()
        driver = locks._backends["default"].driver
        requests = [RenewRequest(lease.name, lease.token, 3) for lease in leases]
        renew_started = time.perf_counter()
        driver.renew_many(requests)
        renew_ms = (time.perf_counter() - renew_started) * 1e3
        for lock in held:
            lock.release()
    return {
        "locks": count,
        "acquire_all_s": acquired_in,
        "still_held": still,
        "sessions": int(row[0]) if row else -1,
        "renew_many_ms": renew_ms,
    }


def sections(args: argparse.Namespace, url: str) -> Iterator[str]:
    yield latency_table(latency(url, args.rounds))
    yield contention(url, args.contend, procs=args.procs).report()
    blocking = "raw floor: blocking pg_advisory_lock"
    yield contention(url, args.contend, procs=args.procs, opener=RawBlocking, label=blocking).report()
    notify = "raw: try + LISTEN/NOTIFY"
    yield contention(url, args.contend, procs=args.procs, opener=RawNotify, label=notify).report()
    scale = many(url, args.many, args.hold)
    yield f"## {args.many} locks held by one process for {args.hold:g} s\n" + show("sessions", scale)


def main() -> None:
    run_driver(__doc__, PostgresServer, sections)


if __name__ == "__main__":
    main()
