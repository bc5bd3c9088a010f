"""redis:// permit waiters queue first come, first served, and a release grants the oldest one directly.

A crashed waiter must not hold a freed permit back: a release skips a waiter whose client no longer listens,
and a permit that lapses (no release) goes to the next live waiter soon after, not after the dead one's ttl.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import lockkit
from backends.servers import RedisServer

WAITER = """
import sys, lockkit
url, name, ready = sys.argv[1:4]
locks = lockkit.connect(url)
permit = locks.semaphore(name, limit=1, ttl=30)
open(ready, "w").write("queued")
permit.acquire(timeout=120)
"""


def _queued_waiter(url: str, name: str, tmp_path: Path) -> subprocess.Popen[bytes]:
    ready = tmp_path / "ready"
    child = subprocess.Popen([sys.executable, "-c", WAITER, url, name, str(ready)])
    deadline = time.monotonic() + 30
    with lockkit.connect(url) as locks:
        while time.monotonic() < deadline:
            if ready.exists() and (locks.permit_holders(name).waiters or 0) >= 1:
                return child
            time.sleep(0.02)
    child.kill()
    raise AssertionError("the child never queued")


def test_release_skips_a_crashed_waiter(redis_server: RedisServer, tmp_path: Path) -> None:
    name = f"queue-{uuid.uuid4().hex[:8]}"
    with lockkit.connect(redis_server.url) as locks:
        holder = locks.semaphore(name, limit=1, ttl=30)
        holder.acquire(timeout=5)
        child = _queued_waiter(redis_server.url, name, tmp_path)
        os.kill(child.pid, signal.SIGKILL)
        child.wait(30)
        time.sleep(0.2)  # the server notices the closed connection
        holder.release()
        started = time.monotonic()
        lease = locks.semaphore(name, limit=1, ttl=30).acquire(timeout=10)
        assert lease.valid and time.monotonic() - started < 2, "the dead waiter's place held the permit back"


def test_a_lapsed_permit_is_not_held_back_by_a_crashed_waiter(redis_server: RedisServer, tmp_path: Path) -> None:
    name = f"queue-{uuid.uuid4().hex[:8]}"
    with lockkit.connect(redis_server.url) as locks:
        stale = locks.semaphore(name, limit=1, ttl=2, auto_renew=False)
        first = stale.acquire(timeout=5)
        child = _queued_waiter(redis_server.url, name, tmp_path)  # queued with a ttl of 30 s
        os.kill(child.pid, signal.SIGKILL)
        child.wait(30)
        started = time.monotonic()
        lease = locks.semaphore(name, limit=1, ttl=30).acquire(timeout=25)
        waited = time.monotonic() - started
        assert lease.fencing_token > first.fencing_token
        assert waited < first.ttl + 3, f"waited {waited:.1f} s: the dead waiter's place outlived the lapsed permit"


def test_waiters_are_served_in_arrival_order(redis_server: RedisServer) -> None:
    name = f"queue-{uuid.uuid4().hex[:8]}"
    with lockkit.connect(redis_server.url) as locks, lockkit.connect(redis_server.url) as other:
        holder = locks.semaphore(name, limit=1, ttl=30)
        holder.acquire(timeout=5)
        waiter = other.semaphore(name, limit=1, ttl=30)
        import threading

        got: list[lockkit.Lease] = []
        thread = threading.Thread(target=lambda: got.append(waiter.acquire(timeout=20)))
        thread.start()
        deadline = time.monotonic() + 10
        while (locks.permit_holders(name).waiters or 0) < 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        holder.release()
        # the releasing client cannot take the permit straight back: it went to the queued waiter
        assert locks.semaphore(name, limit=1, ttl=30).try_acquire() is None
        thread.join(20)
        assert got and got[0].valid
