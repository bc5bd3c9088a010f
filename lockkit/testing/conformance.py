"""One API test suite, run over every driver against real servers, in both faces.

Each test uses names under a fresh random prefix, so tests never see each
other's locks even on a shared server. TTLs are short but respect the
backends' minimums: where a backend rounds the TTL up (etcd) or ties locks to
a session (ZooKeeper), the tests read the effective ``lease.ttl``.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import multiprocessing
import os
import threading
import time
import uuid
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

import lockkit
from lockkit import (
    ConfigError,
    InvalidLockName,
    LockError,
    LockLost,
    LockNotOwned,
    LockTimeout,
)

from ..lease import token_hint
from ._workers import increment_under_lock

HOLD_TTL = 5.0
SLACK = 2.0  # liveness slack for a loaded 2-core CI machine
WAKE_HOLD_TTL = 30.0
"""The holder's TTL in the wake-up tests: a waiter's only timer (its re-check at the holder's expiry) is this far
away, so a waiter that acquires within SLACK of the release was woken by the release, not by a timer."""
MAX_HOLD = 2.5

ODD_NAMES = [
    "a",
    "a/b",
    "a b",
    "/",
    "..",
    ".",
    "zookeeper",
    "ü日本語",
    "e\u0301",  # NFD spelling of é: a different lock from the NFC one
    "\u00e9",
    "'\"]]\n{}*?[",
    "%41",
    "A",
    "tab\there",
    "x" * 480,
]

BAD_NAMES: list[Any] = ["", None, b"bytes", 42, "x" * 513, "é" * 257, "\ud800"]
BAD_TTLS: list[Any] = [0, -1, float("nan"), float("inf"), True, False, "5", None, 0.002]


def _prefix() -> str:
    return f"ct-{uuid.uuid4().hex[:10]}:"


def _fences(locker: lockkit.Locker | lockkit.AsyncLocker) -> bool:
    """Whether the locker's (single) backend promises fencing tokens at all (Redlock does not)."""
    (guarantees,) = locker.guarantees().values()
    return bool(guarantees.fencing != "none")


def _queued(info: lockkit.HolderInfo) -> bool | None:
    """Whether the server counts a waiter on the lock; None if the driver does not report waiters (Redlock)."""
    return None if info.waiters is None else info.waiters >= 1


def _wait_until_queued(locks: lockkit.Locker, name: str) -> None:
    """Return once the server shows a waiter queued on ``name``, so that the release must wake it."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        queued = _queued(locks.holder(name))
        if queued is None:
            time.sleep(0.5)  # no server-side count to look at: give the waiter time to go to sleep
            return
        if queued:
            return
        time.sleep(0.01)
    raise AssertionError(f"no waiter queued on {name!r} within 10 s")


async def _await_until_queued(locks: lockkit.AsyncLocker, name: str) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        queued = _queued(await locks.holder(name))
        if queued is None:
            await asyncio.sleep(0.5)
            return
        if queued:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"no waiter queued on {name!r} within 10 s")


def _overlaps(log: Path) -> list[tuple[float, float]]:
    spans = sorted(tuple(map(float, line.split()[:2])) for line in log.read_text().splitlines())
    return [(a[1], b[0]) for a, b in itertools.pairwise(spans) if b[0] < a[1]]


class ConformanceSuite:
    """The blocking face. Provide a ``url`` fixture in the subclass."""

    @pytest.fixture
    def locks(self, url: str) -> Iterator[lockkit.Locker]:
        locker = lockkit.connect(url)
        yield locker
        locker.close()

    @pytest.fixture
    def other(self, url: str) -> Iterator[lockkit.Locker]:
        """A second, independent client (its own connections and session)."""
        locker = lockkit.connect(url)
        yield locker
        locker.close()

    @pytest.fixture
    def name(self) -> str:
        return _prefix() + "lock"

    def test_acquire_release(self, locks: lockkit.Locker, name: str) -> None:
        lock = locks.lock(name, ttl=HOLD_TTL)
        lease = lock.acquire(timeout=5)
        assert lease.valid and lock.owned() and lock.locked()
        assert isinstance(lease.fencing_token, int)
        assert lease.ttl >= HOLD_TTL * 0.5
        assert 0 < lease.remaining() <= lease.ttl
        assert len(lease.token) == 32 and lease.token not in repr(lease)
        assert locks.holder(name).held
        lock.release()
        assert not lock.owned() and not lock.locked()
        assert not lease.valid

    def test_try_acquire_excludes(self, locks: lockkit.Locker, other: lockkit.Locker, name: str) -> None:
        with locks.lock(name, ttl=HOLD_TTL):
            assert other.lock(name).try_acquire() is None
            assert locks.lock(name).try_acquire() is None
        second = other.lock(name, ttl=HOLD_TTL).try_acquire()
        assert second is not None and second.valid

    def test_timeout_raises_after_waiting(self, locks: lockkit.Locker, other: lockkit.Locker, name: str) -> None:
        with locks.lock(name, ttl=HOLD_TTL):
            started = time.monotonic()
            with pytest.raises(LockTimeout):
                other.lock(name).acquire(timeout=0.3)
            assert time.monotonic() - started >= 0.29
        assert other.lock(name).acquire(timeout=5).valid

    def test_waiter_is_woken_by_release(self, locks: lockkit.Locker, other: lockkit.Locker, name: str) -> None:
        # The holder's lock would last WAKE_HOLD_TTL: only the release can free the waiter within SLACK.
        holder = locks.lock(name, ttl=WAKE_HOLD_TTL)
        holder.acquire()
        got: list[float] = []
        waiter = threading.Thread(
            target=lambda: got.append((other.lock(name).acquire(timeout=20), time.monotonic())[1])
        )
        waiter.start()
        _wait_until_queued(locks, name)  # the waiter is asleep on the server's queue: the release must wake it
        assert not got
        released = time.monotonic()
        holder.release()
        waiter.join(20)
        assert got, "the waiter was not woken by the release"
        assert got[0] - released < SLACK, (
            f"the waiter took {got[0] - released:.2f} s after the release (a server-driven wake-up is expected, "
            f"the holder's own expiry was {WAKE_HOLD_TTL:g} s away)"
        )

    def test_mutual_exclusion_threads(self, url: str, name: str) -> None:
        counter = {"value": 0, "inside": 0, "overlaps": 0}
        lockers = [lockkit.connect(url) for _ in range(2)]

        def work(locker: lockkit.Locker) -> None:
            lock = locker.lock(name, ttl=HOLD_TTL)
            for _ in range(15):
                with lock:
                    counter["inside"] += 1
                    if counter["inside"] > 1:
                        counter["overlaps"] += 1
                    value = counter["value"]
                    time.sleep(0.001)
                    counter["value"] = value + 1
                    counter["inside"] -= 1

        threads = [threading.Thread(target=work, args=(lockers[i % 2],)) for i in range(4)]
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
        finally:
            for locker in lockers:
                locker.close()
        assert counter == {"value": 60, "inside": 0, "overlaps": 0}

    def test_mutual_exclusion_processes(self, url: str, name: str, tmp_path: Path) -> None:
        counter, log = tmp_path / "counter", tmp_path / "log"
        counter.write_text("0")
        log.write_text("")
        ctx = multiprocessing.get_context("spawn")
        procs = [
            ctx.Process(target=increment_under_lock, args=(url, name, str(counter), 8, str(log))) for _ in range(3)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join(90)
        assert [p.exitcode for p in procs] == [0, 0, 0]
        assert counter.read_text() == "24", "lost updates: the lock did not exclude processes"
        assert _overlaps(log) == []
        tokens = [int(line.split()[2]) for line in log.read_text().splitlines()]
        ordered = [
            t
            for _, t in sorted((float(line.split()[0]), int(line.split()[2])) for line in log.read_text().splitlines())
        ]
        with lockkit.connect(url) as locker:
            if _fences(locker):
                assert len(set(tokens)) == 24 and ordered == sorted(ordered), "fencing tokens must strictly increase"

    def test_renew_extends(self, locks: lockkit.Locker, name: str) -> None:
        lock = locks.lock(name, ttl=HOLD_TTL, auto_renew=False)
        lease = lock.acquire()
        before = lease.expires_at
        time.sleep(0.05)
        assert lock.renew() is lease
        assert lease.expires_at > before and lease.valid
        lock.release()

    def test_fencing_tokens_strictly_increase(self, locks: lockkit.Locker, other: lockkit.Locker, name: str) -> None:
        if not _fences(locks):
            pytest.skip("this backend declares no fencing tokens")
        tokens = []
        for i in range(6):
            lock = (locks if i % 2 else other).lock(name, ttl=HOLD_TTL)
            tokens.append(lock.acquire(timeout=5).fencing_token)
            lock.release()
        assert all(a < b for a, b in itertools.pairwise(tokens)), tokens

    def test_other_holder_cannot_release_or_renew(
        self, locks: lockkit.Locker, other: lockkit.Locker, name: str
    ) -> None:
        # Two strangers that did hold the lock, each with a token of its own, are no longer the holder: their
        # release and renew reach the server, whose owner check must refuse them.
        strangers = []
        for _ in range(2):
            stale = other.lock(name, ttl=HOLD_TTL, auto_renew=False)
            stale.acquire(timeout=5)
            assert locks.force_release(name)
            strangers.append(stale)
        never = other.lock(name, ttl=HOLD_TTL)  # and one that never acquired: refused by the front end
        mine = locks.lock(name, ttl=HOLD_TTL)
        lease = mine.acquire(timeout=5)
        with pytest.raises(LockNotOwned):
            strangers[0].release()
        assert locks.holder(name).held, "another holder's release deleted our lock"
        with pytest.raises(LockLost):
            strangers[1].renew()
        with pytest.raises(LockNotOwned):
            never.release()
        with pytest.raises(LockNotOwned):
            never.renew()
        info = locks.holder(name)
        assert mine.owned() and lease.valid and info.held
        assert info.token_hint in (None, token_hint(lease.token)), "the lock is no longer ours"
        mine.release()

    def test_stale_release_never_deletes_new_holder(  # C-9
        self, locks: lockkit.Locker, other: lockkit.Locker, name: str
    ) -> None:
        old = locks.lock(name, ttl=HOLD_TTL, auto_renew=False)
        old_lease = old.acquire()
        assert other.force_release(name)
        new = other.lock(name, ttl=HOLD_TTL)
        new_lease = new.acquire(timeout=5)
        with pytest.raises(LockLost):
            old.renew()
        assert not old_lease.valid
        with pytest.raises(LockNotOwned):
            old.release()
        assert new.owned() and other.holder(name).held, "a stale release deleted the new holder's lock"
        assert new_lease.fencing_token > old_lease.fencing_token or not _fences(locks)
        new.release()

    def test_double_release(self, locks: lockkit.Locker, name: str) -> None:
        lock = locks.lock(name, ttl=HOLD_TTL)
        lock.acquire()
        lock.release()
        with pytest.raises(LockNotOwned):
            lock.release()

    def test_loss_is_reported(self, locks: lockkit.Locker, other: lockkit.Locker, name: str) -> None:
        lost = threading.Event()
        lock = locks.lock(name, ttl=HOLD_TTL, on_lost=lambda lease: lost.set())
        lease = lock.acquire()
        other.force_release(name)
        assert lost.wait(lease.ttl + SLACK), "auto-renewal did not report the loss"
        assert not lease.valid
        with pytest.raises(LockLost):
            lease.ensure_valid()
        assert locks.stats()[locks.backends()[0]]["losses"] >= 1

    def test_with_block_reports_loss(self, locks: lockkit.Locker, other: lockkit.Locker, name: str) -> None:
        with pytest.raises(LockLost, match="lost while the with-block ran"), locks.lock(name, ttl=HOLD_TTL) as lease:
            other.force_release(name)
            deadline = time.monotonic() + lease.ttl + SLACK
            while lease.valid and time.monotonic() < deadline:
                time.sleep(0.02)  # a user's critical section checking lease.valid between steps
            assert not lease.valid

    def test_expiry_frees_the_lock(self, locks: lockkit.Locker, other: lockkit.Locker, name: str) -> None:
        lock = locks.lock(name, ttl=1.0, auto_renew=False)
        lease = lock.acquire()
        if locks.guarantees()[locks.backends()[0]].lifetime == "session":
            pytest.skip("session-bound locks live as long as their session, not a per-lock TTL")
        deadline = lease.expires_at  # our lease's promise: nobody else holds the lock before this instant
        second = other.lock(name, ttl=HOLD_TTL).acquire(timeout=lease.ttl + SLACK + 1)
        got_at = time.monotonic()
        assert second.valid and not lease.valid
        assert got_at >= deadline, f"another holder got the lock {deadline - got_at:.3f} s before our deadline"
        with pytest.raises(LockLost):
            lock.renew()

    def test_max_hold_stops_renewal(self, locks: lockkit.Locker, other: lockkit.Locker, name: str) -> None:
        lost = threading.Event()
        lock = locks.lock(name, ttl=1.0, max_hold=MAX_HOLD, on_lost=lambda lease: lost.set())
        lease = lock.acquire(timeout=5)
        assert lost.wait(MAX_HOLD + lease.ttl + SLACK + 1), "max_hold did not stop the renewals"
        assert "max_hold" in (lease.lost_reason or "") and not lease.valid
        assert time.monotonic() >= lease.acquired_at + MAX_HOLD, "the lock was let go before max_hold"
        # On session-bound backends too: the lock must not outlive its lease while the session lives on.
        assert other.lock(name, ttl=HOLD_TTL).acquire(timeout=lease.ttl + SLACK).valid, "still held on the server"

    def test_with_block(self, locks: lockkit.Locker, name: str) -> None:
        lock = locks.lock(name, ttl=HOLD_TTL)
        with lock as lease:
            assert lease.valid and lock.owned()
            lease.ensure_valid()
        assert not lock.owned() and not locks.holder(name).held
        with pytest.raises(RuntimeError), lock:
            raise RuntimeError("the block failed")
        assert not locks.holder(name).held, "an exception in the block must still release"

    def test_not_reentrant(self, locks: lockkit.Locker, name: str) -> None:
        lock = locks.lock(name, ttl=HOLD_TTL)
        with lock, pytest.raises(LockError):
            lock.acquire(timeout=0)

    def test_odd_names_are_distinct_locks(self, locks: lockkit.Locker, name: str) -> None:
        prefix = name[:-4]
        held = [locks.lock(prefix + odd, ttl=HOLD_TTL) for odd in ODD_NAMES]
        for lock in held:
            assert lock.acquire(timeout=5).valid, lock.name
        for lock in held:
            assert locks.holder(lock.name).held
            lock.release()
        # the longest legal name (512 UTF-8 bytes) works as well
        longest = locks.lock("é" * 256, ttl=HOLD_TTL)
        longest.acquire(timeout=5)
        longest.release()

    @pytest.mark.parametrize("bad", BAD_NAMES, ids=repr)
    def test_bad_names_rejected(self, locks: lockkit.Locker, bad: Any) -> None:
        with pytest.raises(InvalidLockName) as info:
            locks.lock(bad)
        assert isinstance(info.value, ValueError)

    @pytest.mark.parametrize("bad", BAD_TTLS, ids=repr)
    def test_bad_ttls_rejected(self, locks: lockkit.Locker, name: str, bad: Any) -> None:
        with pytest.raises(ConfigError):
            locks.lock(name, ttl=bad)

    @pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), "1", True])
    def test_bad_timeouts_rejected(self, locks: lockkit.Locker, name: str, bad: Any) -> None:
        lock = locks.lock(name, ttl=HOLD_TTL)
        with pytest.raises(ConfigError):
            lock.acquire(timeout=bad)
        assert not locks.holder(name).held, "a rejected call must leave nothing behind"

    def test_closed_locker(self, url: str, name: str) -> None:
        locker = lockkit.connect(url)
        lock = locker.lock(name, ttl=HOLD_TTL)
        locker.close()
        with pytest.raises(LockError, match="closed"):
            lock.acquire(timeout=0)
        with pytest.raises(LockError, match="closed"):
            locker.lock(name)

    def test_check_reports_round_trip(self, locks: lockkit.Locker) -> None:
        (result,) = locks.check().values()
        assert isinstance(result, float) and math.isfinite(result)

    def test_forked_child_cannot_release(self, locks: lockkit.Locker, name: str) -> None:  # C-9
        lock = locks.lock(name, ttl=HOLD_TTL)
        lock.acquire()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads: the child only checks pids
            pid = os.fork()
        if pid == 0:
            code = 1
            try:
                lock.release()
            except LockNotOwned:
                code = 0 if not lock.lease.valid else 2  # type: ignore[union-attr]
            except BaseException:
                code = 3
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert lock.owned() and locks.holder(name).held
        lock.release()


class AsyncConformanceSuite:
    """The asyncio face. Provide a ``url`` fixture in the subclass."""

    @pytest.fixture
    async def locks(self, url: str) -> AsyncIterator[lockkit.AsyncLocker]:
        async with lockkit.connect_async(url) as locker:
            yield locker

    @pytest.fixture
    async def other(self, url: str) -> AsyncIterator[lockkit.AsyncLocker]:
        async with lockkit.connect_async(url) as locker:
            yield locker

    @pytest.fixture
    def name(self) -> str:
        return _prefix() + "alock"

    async def test_acquire_release(self, locks: lockkit.AsyncLocker, name: str) -> None:
        lock = locks.lock(name, ttl=HOLD_TTL)
        lease = await lock.acquire(timeout=5)
        assert lease.valid and lock.owned() and await lock.locked()
        await lock.release()
        assert not lock.owned() and not await lock.locked()

    async def test_try_acquire_and_timeout(
        self, locks: lockkit.AsyncLocker, other: lockkit.AsyncLocker, name: str
    ) -> None:
        async with locks.lock(name, ttl=HOLD_TTL):
            assert await other.lock(name).try_acquire() is None
            with pytest.raises(LockTimeout):
                await other.lock(name).acquire(timeout=0.3)
        assert (await other.lock(name).acquire(timeout=5)).valid

    async def test_tasks_exclude_each_other(
        self, locks: lockkit.AsyncLocker, other: lockkit.AsyncLocker, name: str
    ) -> None:
        state = {"inside": 0, "overlaps": 0, "count": 0}

        async def work(locker: lockkit.AsyncLocker) -> None:
            lock = locker.lock(name, ttl=HOLD_TTL)
            for _ in range(10):
                async with lock:
                    state["inside"] += 1
                    state["overlaps"] += state["inside"] > 1
                    await asyncio.sleep(0.001)
                    state["count"] += 1
                    state["inside"] -= 1

        await asyncio.wait_for(asyncio.gather(*(work(locks if i % 2 else other) for i in range(4))), 60)
        assert state == {"inside": 0, "overlaps": 0, "count": 40}

    async def test_waiter_is_woken_by_release(
        self, locks: lockkit.AsyncLocker, other: lockkit.AsyncLocker, name: str
    ) -> None:
        holder = locks.lock(name, ttl=WAKE_HOLD_TTL)  # only the release can free the waiter within SLACK
        await holder.acquire()
        waiter = asyncio.ensure_future(other.lock(name).acquire(timeout=20))
        await _await_until_queued(locks, name)
        assert not waiter.done()
        released = time.monotonic()
        await holder.release()
        lease = await asyncio.wait_for(waiter, 20)
        woken = time.monotonic() - released
        assert lease.valid and woken < SLACK, f"the waiter took {woken:.2f} s after the release"

    async def test_cancelled_acquire_leaves_nothing(  # C-8
        self, locks: lockkit.AsyncLocker, other: lockkit.AsyncLocker, name: str
    ) -> None:
        holder = locks.lock(name, ttl=HOLD_TTL)
        await holder.acquire()
        for _ in range(5):
            task = asyncio.ensure_future(other.lock(name).acquire())
            await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        await holder.release()
        third = locks.lock(name, ttl=HOLD_TTL)
        started = time.monotonic()
        await third.acquire(timeout=10)
        assert time.monotonic() - started < SLACK, "a cancelled waiter still stood in the queue"
        await third.release()
        await asyncio.sleep(0.2)  # a grant racing a cancel is released in the background
        assert not (await locks.holder(name)).held, "a cancelled acquire left the lock held"

    async def test_renew_and_stale_release(
        self, locks: lockkit.AsyncLocker, other: lockkit.AsyncLocker, name: str
    ) -> None:
        old = locks.lock(name, ttl=HOLD_TTL, auto_renew=False)
        lease = await old.acquire()
        before = lease.expires_at
        await asyncio.sleep(0.05)
        await old.renew()
        assert lease.expires_at > before
        assert await other.force_release(name)
        new = other.lock(name, ttl=HOLD_TTL)
        new_lease = await new.acquire(timeout=5)
        with pytest.raises(LockLost):
            await old.renew()
        with pytest.raises(LockNotOwned):
            await old.release()
        assert (await other.holder(name)).held
        assert new_lease.fencing_token > lease.fencing_token or not _fences(locks)
        await new.release()

    async def test_loss_is_reported(self, locks: lockkit.AsyncLocker, other: lockkit.AsyncLocker, name: str) -> None:
        lost = asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_lost(lease: lockkit.Lease) -> None:
            loop.call_soon_threadsafe(lost.set)

        lock = locks.lock(name, ttl=HOLD_TTL, on_lost=on_lost)
        lease = await lock.acquire()
        await other.force_release(name)
        await asyncio.wait_for(lost.wait(), lease.ttl + SLACK)
        assert not lease.valid

    async def test_max_hold_stops_renewal(
        self, locks: lockkit.AsyncLocker, other: lockkit.AsyncLocker, name: str
    ) -> None:
        lost = asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_lost(lease: lockkit.Lease) -> None:
            loop.call_soon_threadsafe(lost.set)

        lock = locks.lock(name, ttl=1.0, max_hold=MAX_HOLD, on_lost=on_lost)
        lease = await lock.acquire(timeout=5)
        await asyncio.wait_for(lost.wait(), MAX_HOLD + lease.ttl + SLACK + 1)
        assert "max_hold" in (lease.lost_reason or "") and not lease.valid
        assert time.monotonic() >= lease.acquired_at + MAX_HOLD, "the lock was let go before max_hold"
        assert (await other.lock(name, ttl=HOLD_TTL).acquire(timeout=lease.ttl + SLACK)).valid, "still held"

    async def test_bad_input(self, locks: lockkit.AsyncLocker, name: str) -> None:
        with pytest.raises(InvalidLockName):
            locks.lock("")
        with pytest.raises(ConfigError):
            locks.lock(name, ttl=0)
        with pytest.raises(ConfigError):
            await locks.lock(name).acquire(timeout=-1)
