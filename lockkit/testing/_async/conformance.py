"""The conformance suite: one API test suite, run over every driver against real servers, in both faces.

This file is the source of :class:`~lockkit.testing.ConformanceSuite` too: ``scripts/unasync.py`` generates
``lockkit/testing/_sync/conformance.py`` from it, so every test runs on both faces. What a face does its own
way (a concurrent holder is a task or a thread, a wait is awaited or blocks) comes from the face's
``primitives`` module; the few tests only one face can have (task cancellation) come from its
``face_tests`` module, mixed in.

Each test uses names under a fresh random prefix, so tests never see each other's locks even on a shared
server. TTLs are short but respect the backends' minimums: where a backend rounds the TTL up (etcd) or ties
locks to a session (ZooKeeper), the tests read the effective ``lease.ttl``.
"""

from __future__ import annotations

import functools
import itertools
import math
import multiprocessing
import time
from collections.abc import AsyncIterator
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

from ...lease import token_hint
from .._common import (
    BAD_NAMES,
    BAD_TIMEOUTS,
    BAD_TTLS,
    HOLD_TTL,
    MAX_HOLD,
    ODD_NAMES,
    SLACK,
    WAKE_HOLD_TTL,
    fences,
    overlaps,
    prefix,
    queued,
)
from .face_tests import FaceTests
from .primitives import Background, Flag, in_forked_child, in_process, run_blocking, run_concurrently, sleep
from .workers import increment_under_lock

__all__ = ["AsyncConformanceSuite"]


async def _wait_until_queued(locks: lockkit.AsyncLocker, name: str) -> None:
    """Return once the server shows a waiter queued on ``name``, so that the release must wake it."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        # Its own statement: scripts/unasync.py would take a call's parentheses round an awaited call for grouping.
        info = await locks.holder(name)
        waiting = queued(info)
        if waiting is None:
            await sleep(0.5)  # no server-side count to look at: give the waiter time to go to sleep
            return
        if waiting:
            return
        await sleep(0.01)
    raise AssertionError(f"no waiter queued on {name!r} within 10 s")


class AsyncConformanceSuite(FaceTests):
    """The whole suite on one face. Subclass it in a pytest module and provide a function-scoped ``url``."""

    @pytest.fixture
    async def locks(self, url: str) -> AsyncIterator[lockkit.AsyncLocker]:
        """A locker on the driver under test."""
        async with lockkit.connect_async(url) as locker:
            yield locker

    @pytest.fixture
    async def other(self, url: str) -> AsyncIterator[lockkit.AsyncLocker]:
        """A second, independent client (its own connections and session)."""
        async with lockkit.connect_async(url) as locker:
            yield locker

    @pytest.fixture
    def name(self) -> str:
        return prefix() + "lock"

    async def test_acquire_release(self, locks: lockkit.AsyncLocker, name: str) -> None:
        lock = locks.lock(name, ttl=HOLD_TTL)
        lease = await lock.acquire(timeout=5)
        assert lease.valid and lock.owned() and await lock.locked()
        if fences(locks):
            assert isinstance(lease.fencing_token, int) and lease.fenced
        else:  # no number that would pass a fencing check (issue 15)
            assert not lease.fenced and lease.fence is None
            with pytest.raises(lockkit.ConfigError, match="no fencing tokens"):
                lease.fencing_token  # noqa: B018
        assert lease.ttl >= HOLD_TTL * 0.5
        assert 0 < lease.remaining() <= lease.ttl
        assert len(lease.token) == 32 and lease.token not in repr(lease)
        assert (await locks.holder(name)).held
        await lock.release()
        assert not lock.owned() and not await lock.locked()
        assert not lease.valid

    async def test_try_acquire_excludes(
        self, locks: lockkit.AsyncLocker, other: lockkit.AsyncLocker, name: str
    ) -> None:
        async with locks.lock(name, ttl=HOLD_TTL):
            assert await other.lock(name).try_acquire() is None
            assert await locks.lock(name).try_acquire() is None
        second = await other.lock(name, ttl=HOLD_TTL).try_acquire()
        assert second is not None and second.valid

    async def test_timeout_raises_after_waiting(
        self, locks: lockkit.AsyncLocker, other: lockkit.AsyncLocker, name: str
    ) -> None:
        async with locks.lock(name, ttl=HOLD_TTL):
            started = time.monotonic()
            with pytest.raises(LockTimeout):
                await other.lock(name).acquire(timeout=0.3)
            assert time.monotonic() - started >= 0.29
        assert (await other.lock(name).acquire(timeout=5)).valid

    async def test_waiter_is_woken_by_release(
        self, locks: lockkit.AsyncLocker, other: lockkit.AsyncLocker, name: str
    ) -> None:
        # The holder's lock would last WAKE_HOLD_TTL: only the release can free the waiter within SLACK.
        holder = locks.lock(name, ttl=WAKE_HOLD_TTL)
        await holder.acquire()

        async def wait() -> float:
            await other.lock(name).acquire(timeout=20)
            return time.monotonic()  # taken by the waiter itself: collecting it later adds no delay

        waiter = Background(wait)
        await _wait_until_queued(locks, name)  # the waiter is asleep on the server's queue: the release must wake it
        assert not waiter.done()
        released = time.monotonic()
        await holder.release()
        got = await waiter.result(20)
        assert got - released < SLACK, (
            f"the waiter took {got - released:.2f} s after the release (a server-driven wake-up is expected, "
            f"the holder's own expiry was {WAKE_HOLD_TTL:g} s away)"
        )

    async def test_timed_out_acquire_leaves_nothing(  # C-8
        self, locks: lockkit.AsyncLocker, other: lockkit.AsyncLocker, name: str
    ) -> None:
        # A waiter that gives up at its deadline must take its queue entry with it: a leftover entry ahead of
        # the next waiter would hold that one up until it expired. (A cancelled task is the asyncio face's
        # other way of giving up: test_cancelled_acquire_leaves_nothing.)
        holder = locks.lock(name, ttl=HOLD_TTL)
        await holder.acquire()
        for _ in range(5):
            with pytest.raises(LockTimeout):
                await other.lock(name).acquire(timeout=0.05)
        await holder.release()
        third = locks.lock(name, ttl=HOLD_TTL)
        started = time.monotonic()
        await third.acquire(timeout=10)
        assert time.monotonic() - started < SLACK, "a timed-out waiter still stood in the queue"
        await third.release()
        info = await locks.holder(name)
        assert not info.held, "a timed-out acquire left the lock held"
        assert not queued(info), "a timed-out acquire left a waiter counted on the server"

    async def test_tasks_exclude_each_other(self, url: str, name: str) -> None:
        # On the blocking face this test is test_mutual_exclusion_threads: a rule of scripts/unasync.py renames
        # it, as docs/reliability.md cites each face's name.
        # Four concurrent holders (tasks on the asyncio face, threads on the blocking one) over two lockers; each
        # read-modify-write sleeps in the middle, so an overlap loses an update or is counted.
        counter = {"value": 0, "inside": 0, "overlaps": 0}
        lockers = [lockkit.connect_async(url) for _ in range(2)]

        async def work(locker: lockkit.AsyncLocker) -> None:
            lock = locker.lock(name, ttl=HOLD_TTL)
            for _ in range(15):
                async with lock:
                    counter["inside"] += 1
                    if counter["inside"] > 1:
                        counter["overlaps"] += 1
                    value = counter["value"]
                    await sleep(0.001)
                    counter["value"] = value + 1
                    counter["inside"] -= 1

        try:
            await run_concurrently([functools.partial(work, lockers[i % 2]) for i in range(4)], timeout=60)
        finally:
            for locker in lockers:
                await locker.aclose()
        assert counter == {"value": 60, "inside": 0, "overlaps": 0}

    async def test_mutual_exclusion_processes(
        self, locks: lockkit.AsyncLocker, url: str, name: str, tmp_path: Path
    ) -> None:
        # Three child processes, each running this face's worker (in an event loop of its own on the asyncio face).
        counter, log = tmp_path / "counter", tmp_path / "log"
        counter.write_text("0")
        log.write_text("")
        ctx = multiprocessing.get_context("spawn")
        procs = [
            ctx.Process(target=in_process, args=(increment_under_lock, url, name, str(counter), 8, str(log)))
            for _ in range(3)
        ]
        for p in procs:
            p.start()
        for p in procs:
            await run_blocking(p.join, 90)
        assert [p.exitcode for p in procs] == [0, 0, 0]
        assert counter.read_text() == "24", "lost updates: the lock did not exclude processes"
        assert overlaps(log) == []
        entries = [line.split() for line in log.read_text().splitlines()]
        tokens = [int(entry[2]) for entry in entries]
        ordered = [token for _, token in sorted((float(entry[0]), int(entry[2])) for entry in entries)]
        if fences(locks):
            assert len(set(tokens)) == 24 and ordered == sorted(ordered), "fencing tokens must strictly increase"

    async def test_renew_extends(self, locks: lockkit.AsyncLocker, name: str) -> None:
        lock = locks.lock(name, ttl=HOLD_TTL, auto_renew=False)
        lease = await lock.acquire()
        before = lease.expires_at
        await sleep(0.05)
        assert await lock.renew() is lease
        assert lease.expires_at > before and lease.valid
        await lock.release()

    async def test_fencing_tokens_strictly_increase(
        self, locks: lockkit.AsyncLocker, other: lockkit.AsyncLocker, name: str
    ) -> None:
        if not fences(locks):
            pytest.skip("this backend declares no fencing tokens")
        tokens = []
        for i in range(6):
            lock = (locks if i % 2 else other).lock(name, ttl=HOLD_TTL)
            tokens.append((await lock.acquire(timeout=5)).fencing_token)
            await lock.release()
        assert all(a < b for a, b in itertools.pairwise(tokens)), tokens

    async def test_other_holder_cannot_release_or_renew(
        self, locks: lockkit.AsyncLocker, other: lockkit.AsyncLocker, name: str
    ) -> None:
        # Two strangers that did hold the lock, each with a token of its own, are no longer the holder: their
        # release and renew reach the server, whose owner check must refuse them.
        strangers = []
        for _ in range(2):
            stale = other.lock(name, ttl=HOLD_TTL, auto_renew=False)
            await stale.acquire(timeout=5)
            assert await locks.force_release(name)
            strangers.append(stale)
        never = other.lock(name, ttl=HOLD_TTL)  # and one that never acquired: refused by the front end
        mine = locks.lock(name, ttl=HOLD_TTL)
        lease = await mine.acquire(timeout=5)
        with pytest.raises(LockNotOwned):
            await strangers[0].release()
        assert (await locks.holder(name)).held, "another holder's release deleted our lock"
        with pytest.raises(LockLost):
            await strangers[1].renew()
        with pytest.raises(LockNotOwned):
            await never.release()
        with pytest.raises(LockNotOwned):
            await never.renew()
        info = await locks.holder(name)
        assert mine.owned() and lease.valid and info.held
        assert info.token_hint in (None, token_hint(lease.token)), "the lock is no longer ours"
        await mine.release()

    async def test_stale_release_never_deletes_new_holder(  # C-9
        self, locks: lockkit.AsyncLocker, other: lockkit.AsyncLocker, name: str
    ) -> None:
        old = locks.lock(name, ttl=HOLD_TTL, auto_renew=False)
        old_lease = await old.acquire()
        assert await other.force_release(name)
        new = other.lock(name, ttl=HOLD_TTL)
        new_lease = await new.acquire(timeout=5)
        with pytest.raises(LockLost):
            await old.renew()
        assert not old_lease.valid
        with pytest.raises(LockNotOwned):
            await old.release()
        assert new.owned() and (await other.holder(name)).held, "a stale release deleted the new holder's lock"
        assert not fences(locks) or new_lease.fencing_token > old_lease.fencing_token
        await new.release()

    async def test_double_release(self, locks: lockkit.AsyncLocker, name: str) -> None:
        lock = locks.lock(name, ttl=HOLD_TTL)
        await lock.acquire()
        await lock.release()
        with pytest.raises(LockNotOwned):
            await lock.release()

    async def test_loss_is_reported(self, locks: lockkit.AsyncLocker, other: lockkit.AsyncLocker, name: str) -> None:
        lost = Flag()
        lock = locks.lock(name, ttl=HOLD_TTL, on_lost=lambda lease: lost.set())
        lease = await lock.acquire()
        await other.force_release(name)
        assert await lost.wait(lease.ttl + SLACK), "auto-renewal did not report the loss"
        assert not lease.valid
        with pytest.raises(LockLost):
            lease.ensure_valid()
        assert locks.stats()[locks.backends()[0]]["losses"] >= 1

    async def test_with_block_reports_loss(
        self, locks: lockkit.AsyncLocker, other: lockkit.AsyncLocker, name: str
    ) -> None:
        # The block is a function of its own (here and in test_with_block) because a blocking face's nested
        # ``with pytest.raises(…): with lock:`` is one ruff wants merged, which the asyncio face cannot do.
        async def critical_section() -> None:
            async with locks.lock(name, ttl=HOLD_TTL) as lease:
                await other.force_release(name)
                deadline = time.monotonic() + lease.ttl + SLACK
                while lease.valid and time.monotonic() < deadline:
                    await sleep(0.02)  # a user's critical section checking lease.valid between steps
                assert not lease.valid

        with pytest.raises(LockLost, match="lost while the with-block ran"):
            await critical_section()

    async def test_expiry_frees_the_lock(
        self, locks: lockkit.AsyncLocker, other: lockkit.AsyncLocker, name: str
    ) -> None:
        lock = locks.lock(name, ttl=1.0, auto_renew=False)
        lease = await lock.acquire()
        if locks.guarantees()[locks.backends()[0]].lifetime == "session":
            pytest.skip("session-bound locks live as long as their session, not a per-lock TTL")
        deadline = lease.expires_at  # our lease's promise: nobody else holds the lock before this instant
        second = await other.lock(name, ttl=HOLD_TTL).acquire(timeout=lease.ttl + SLACK + 1)
        got_at = time.monotonic()
        assert second.valid and not lease.valid
        assert got_at >= deadline, f"another holder got the lock {deadline - got_at:.3f} s before our deadline"
        with pytest.raises(LockLost):
            await lock.renew()

    async def test_max_hold_stops_renewal(
        self, locks: lockkit.AsyncLocker, other: lockkit.AsyncLocker, name: str
    ) -> None:
        lost = Flag()
        lock = locks.lock(name, ttl=1.0, max_hold=MAX_HOLD, on_lost=lambda lease: lost.set())
        lease = await lock.acquire(timeout=5)
        assert await lost.wait(MAX_HOLD + lease.ttl + SLACK + 1), "max_hold did not stop the renewals"
        assert "max_hold" in (lease.lost_reason or "") and not lease.valid
        assert time.monotonic() >= lease.acquired_at + MAX_HOLD, "the lock was let go before max_hold"
        # On session-bound backends too: the lock must not outlive its lease while the session lives on.
        again = await other.lock(name, ttl=HOLD_TTL).acquire(timeout=lease.ttl + SLACK)
        assert again.valid, "still held on the server"

    async def test_with_block(self, locks: lockkit.AsyncLocker, name: str) -> None:
        lock = locks.lock(name, ttl=HOLD_TTL)
        async with lock as lease:
            assert lease.valid and lock.owned()
            lease.ensure_valid()
        assert not lock.owned() and not (await locks.holder(name)).held

        async def failing_block() -> None:
            async with lock:
                raise RuntimeError("the block failed")

        with pytest.raises(RuntimeError):
            await failing_block()
        assert not (await locks.holder(name)).held, "an exception in the block must still release"

    async def test_not_reentrant(self, locks: lockkit.AsyncLocker, name: str) -> None:
        lock = locks.lock(name, ttl=HOLD_TTL)
        async with lock:
            assert lock.owned()
            with pytest.raises(LockError):  # not a wait for ourselves, nor a second lease
                await lock.acquire(timeout=0)

    async def test_odd_names_are_distinct_locks(self, locks: lockkit.AsyncLocker, name: str) -> None:
        start = name[: -len("lock")]
        held = [locks.lock(start + odd, ttl=HOLD_TTL) for odd in ODD_NAMES]
        for lock in held:
            assert (await lock.acquire(timeout=5)).valid, lock.name
        for lock in held:
            assert (await locks.holder(lock.name)).held
            await lock.release()
        # the longest legal name (512 UTF-8 bytes) works as well
        longest = locks.lock("é" * 256, ttl=HOLD_TTL)
        await longest.acquire(timeout=5)
        await longest.release()

    @pytest.mark.parametrize("bad", BAD_NAMES, ids=repr)
    async def test_bad_names_rejected(self, locks: lockkit.AsyncLocker, bad: Any) -> None:
        with pytest.raises(InvalidLockName) as info:
            locks.lock(bad)
        assert isinstance(info.value, ValueError)

    @pytest.mark.parametrize("bad", BAD_TTLS, ids=repr)
    async def test_bad_ttls_rejected(self, locks: lockkit.AsyncLocker, name: str, bad: Any) -> None:
        with pytest.raises(ConfigError):
            locks.lock(name, ttl=bad)

    @pytest.mark.parametrize("bad", BAD_TIMEOUTS)
    async def test_bad_timeouts_rejected(self, locks: lockkit.AsyncLocker, name: str, bad: Any) -> None:
        lock = locks.lock(name, ttl=HOLD_TTL)
        with pytest.raises(ConfigError):
            await lock.acquire(timeout=bad)
        assert not (await locks.holder(name)).held, "a rejected call must leave nothing behind"

    async def test_closed_locker(self, url: str, name: str) -> None:
        locker = lockkit.connect_async(url)
        lock = locker.lock(name, ttl=HOLD_TTL)
        await locker.aclose()
        with pytest.raises(LockError, match="closed"):
            await lock.acquire(timeout=0)
        with pytest.raises(LockError, match="closed"):
            locker.lock(name)

    async def test_closing_ends_a_waiting_acquire(  # C-16
        self, url: str, other: lockkit.AsyncLocker, name: str
    ) -> None:
        # An acquire still waiting when its locker closes ends with the closed locker's LockError, promptly; it
        # never hands out a lease of the closed locker later (nothing would release it) nor keeps waiting.
        holder = other.lock(name, ttl=WAKE_HOLD_TTL)
        await holder.acquire()
        locker = lockkit.connect_async(url)

        async def wait() -> BaseException | None:
            try:
                await locker.lock(name, ttl=HOLD_TTL).acquire(timeout=WAKE_HOLD_TTL)
            except LockError as exc:
                return exc
            return None

        waiter = Background(wait)
        await _wait_until_queued(other, name)
        assert not waiter.done()
        started = time.monotonic()
        await locker.aclose()
        error = await waiter.result(WAKE_HOLD_TTL)
        took = time.monotonic() - started
        assert isinstance(error, LockError) and "closed while this acquire waited" in str(error), (
            f"the waiter got {error!r}"
        )
        assert took < SLACK + 5, f"the waiter ended {took:.2f} s after the close"
        await holder.release()
        after = await other.lock(name, ttl=HOLD_TTL).acquire(timeout=5)  # nothing of the waiter's is left
        assert after.valid

    async def test_check_reports_round_trip(self, locks: lockkit.AsyncLocker) -> None:
        (result,) = (await locks.check()).values()
        assert isinstance(result, float) and math.isfinite(result)

    async def test_forked_child_cannot_release(self, locks: lockkit.AsyncLocker, name: str) -> None:  # C-9
        lock = locks.lock(name, ttl=HOLD_TTL)
        lease = await lock.acquire()

        async def child() -> int:
            # Runs in the forked child: the lease's process is the parent, so the release must refuse (and the
            # child's copy of the lease must not claim to be valid) without deleting the parent's lock.
            try:
                await lock.release()
            except LockNotOwned:
                return 0 if not lease.valid else 2
            return 1

        assert await in_forked_child(child) == 0
        assert lock.owned() and (await locks.holder(name)).held
        await lock.release()
