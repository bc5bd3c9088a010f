"""The conformance suite of semaphores and reader-writer locks, for every driver that offers them, both faces.

This file is the source of :class:`~lockkit.testing.SemaphoreSuite` too: ``scripts/unasync.py`` generates
``lockkit/testing/_sync/semaphore_conformance.py`` from it. Subclass it in a pytest module with a
function-scoped ``url`` fixture, as for :class:`~lockkit.testing.AsyncConformanceSuite`. The fault tests
(holders SIGKILLed or SIGSTOPped past their TTL) cite scenario IDs of docs/reliability.md (family ``S``).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import lockkit
from lockkit import ConfigError, LockLost, LockNotOwned

from .._common import HOLD_TTL, SLACK, fences, prefix
from .primitives import Background, Flag, in_process, run_blocking, sleep
from .semaphore_workers import hold_and_wait, permits_under_load

__all__ = ["AsyncSemaphoreSuite"]

SHORT_TTL = 2.0
"""The TTL of holders that die or freeze: long enough for the slowest backend's minimum (etcd rounds up)."""


def _most_at_once(log: Path) -> int:
    """The most intervals of a ``entered left …`` log that overlap at one instant."""
    events: list[tuple[float, int]] = []
    for line in log.read_text().splitlines():
        entered, left = (float(x) for x in line.split()[:2])
        events += [(entered, 1), (left, -1)]
    inside = most = 0
    for _, delta in sorted(events, key=lambda e: (e[0], e[1])):  # an exit before an entry at the same instant
        inside += delta
        most = max(most, inside)
    return most


async def _wait_for_file(path: Path, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return path.read_text()
        await sleep(0.02)
    raise AssertionError(f"the child did not write {path} within {timeout:g} s")


class AsyncSemaphoreSuite:
    """Semaphores and reader-writer locks on one face. Provide a function-scoped ``url``."""

    killed_holder_freed_at_once = False
    """Set it on a backend whose permits live exactly as long as the holder's connection (postgresql://): the
    server frees them as soon as the kernel closes a killed holder's socket, so there is no moment left in
    which the dead holder can be seen holding."""

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
        return prefix() + "sem"

    # -- semaphores ------------------------------------------------------------------------------

    async def test_limit_holders_at_once(
        self, locks: lockkit.AsyncLocker, other: lockkit.AsyncLocker, name: str
    ) -> None:
        held = [
            await (locks if i % 2 else other).semaphore(name, limit=3, ttl=HOLD_TTL).acquire(timeout=5)
            for i in range(3)
        ]
        assert all(lease.valid for lease in held)
        assert await other.semaphore(name, limit=3).try_acquire() is None
        info = await locks.permit_holders(name)
        assert (info.limit, info.holders, info.writer) == (3, 3, False)
        assert len({lease.token for lease in held}) == 3

    async def test_release_frees_one_permit(
        self, locks: lockkit.AsyncLocker, other: lockkit.AsyncLocker, name: str
    ) -> None:
        first, second = locks.semaphore(name, limit=2, ttl=HOLD_TTL), locks.semaphore(name, limit=2, ttl=HOLD_TTL)
        await first.acquire(timeout=5)
        await second.acquire(timeout=5)
        third = other.semaphore(name, limit=2, ttl=HOLD_TTL)
        assert await third.try_acquire() is None
        await first.release()
        lease = await third.acquire(timeout=5)
        assert lease.valid and await other.semaphore(name, limit=2).try_acquire() is None
        with pytest.raises(LockNotOwned):
            await first.release()

    async def test_permit_lease_is_a_lease(self, locks: lockkit.AsyncLocker, name: str) -> None:
        permit = locks.semaphore(name, limit=2, ttl=HOLD_TTL)
        async with permit as lease:
            assert isinstance(lease, lockkit.Lease) and lease.valid and permit.owned()
            assert 0 < lease.remaining() <= lease.ttl and lease.name == name
            lease.ensure_valid()
            assert lease.token not in repr(lease) and lease.token not in repr(permit)
            if fences(locks):
                assert lease.fenced and lease.fencing_token >= 1
            renewed = await permit.renew(ttl=HOLD_TTL)
            assert renewed is lease and lease.valid
        assert not lease.valid and not permit.owned()
        with pytest.raises(LockLost):
            lease.ensure_valid()

    async def test_fencing_strictly_increases(
        self, locks: lockkit.AsyncLocker, other: lockkit.AsyncLocker, name: str
    ) -> None:
        if not fences(locks):
            pytest.skip("this backend hands out no fencing tokens")
        seen: list[int] = []
        held = []
        for i in range(6):
            permit = (locks if i % 2 else other).semaphore(name, limit=2, ttl=HOLD_TTL)
            lease = await permit.acquire(timeout=5)
            seen.append(lease.fencing_token)
            held.append(permit)
            if len(held) == 2:
                await held.pop(0).release()
        assert seen == sorted(seen) and len(set(seen)) == len(seen)

    async def test_mismatched_limit_refused(
        self, locks: lockkit.AsyncLocker, other: lockkit.AsyncLocker, name: str
    ) -> None:
        async with locks.semaphore(name, limit=2, ttl=HOLD_TTL):
            before = await locks.permit_holders(name)
            with pytest.raises(ConfigError, match="same limit") as refused:
                await other.semaphore(name, limit=5).try_acquire()
            assert "limit 2" in str(refused.value) and "limit 5" in str(refused.value), refused.value
            with pytest.raises(ConfigError, match="reader-writer"):
                await other.rwlock(name).read().try_acquire()
            with pytest.raises(ConfigError, match="same limit"):  # a waiting acquire is refused, not queued
                await other.semaphore(name, limit=5).acquire(timeout=1)
            after = await locks.permit_holders(name)
            assert (after.limit, after.holders, after.waiters) == (before.limit, before.holders, before.waiters)
        # once every holder is gone, the name may be used with another limit
        async with other.semaphore(name, limit=5, ttl=HOLD_TTL) as lease:
            assert lease.valid

    async def test_bad_limits_rejected(self, locks: lockkit.AsyncLocker, name: str) -> None:
        for bad in (0, -1, 1.5, "2", True, None):
            with pytest.raises(ConfigError, match="limit"):
                locks.semaphore(name, limit=bad)  # type: ignore[arg-type]

    async def test_waiter_woken_by_release(
        self, locks: lockkit.AsyncLocker, other: lockkit.AsyncLocker, name: str
    ) -> None:
        holder = locks.semaphore(name, limit=1, ttl=30)
        await holder.acquire(timeout=5)
        waiter = other.semaphore(name, limit=1, ttl=HOLD_TTL)
        pending = Background(lambda: waiter.acquire(timeout=20))
        await sleep(0.3)
        assert not pending.done()
        released = time.monotonic()
        await holder.release()
        lease = await pending.result(SLACK + 5)
        assert lease.valid and time.monotonic() - released < SLACK  # woken, not a timer at the holder's 30 s

    async def test_expiry_frees_a_permit(
        self, locks: lockkit.AsyncLocker, other: lockkit.AsyncLocker, name: str
    ) -> None:
        lost = Flag()
        stale = locks.semaphore(name, limit=1, ttl=SHORT_TTL, auto_renew=False, on_lost=lambda _: lost.set())
        lease = await stale.acquire(timeout=5)
        started = time.monotonic()
        taken = await other.semaphore(name, limit=1, ttl=HOLD_TTL).acquire(timeout=lease.ttl + 10)
        assert taken.valid and time.monotonic() - started >= lease.ttl * 0.5
        assert not lease.valid
        with pytest.raises((LockNotOwned, LockLost)):
            await stale.release()

    async def test_auto_renewal_keeps_a_permit(
        self, locks: lockkit.AsyncLocker, other: lockkit.AsyncLocker, name: str
    ) -> None:
        permit = locks.semaphore(name, limit=1, ttl=SHORT_TTL)
        lease = await permit.acquire(timeout=5)
        await sleep(lease.ttl * 1.6)
        assert lease.valid
        assert await other.semaphore(name, limit=1).try_acquire() is None
        await permit.release()

    async def test_force_release_drops_holders(
        self, locks: lockkit.AsyncLocker, other: lockkit.AsyncLocker, name: str
    ) -> None:
        lost = Flag()
        permit = locks.semaphore(name, limit=1, ttl=SHORT_TTL, on_lost=lambda _: lost.set())
        await permit.acquire(timeout=5)
        assert await other.force_release_permits(name) == 1
        assert await lost.wait(SHORT_TTL + SLACK), "the renewal must report the permit lost"

    async def test_permits_are_not_locks(self, locks: lockkit.AsyncLocker, name: str) -> None:
        async with locks.lock(name, ttl=HOLD_TTL), locks.semaphore(name, limit=1, ttl=HOLD_TTL) as lease:
            assert lease.valid  # separate key spaces: a lock and a semaphore of one name are unrelated

    async def test_limit_never_exceeded_processes(self, name: str, url: str, tmp_path: Path) -> None:
        await self._under_load(url, name, tmp_path, 3, ["permit"] * 8, rounds=12)

    async def _under_load(self, url: str, name: str, tmp_path: Path, limit: int, modes: list[str], rounds: int) -> Path:
        counter, log = tmp_path / "counter", tmp_path / "log"
        counter.write_text("0 0")
        log.write_text("")
        ctx = multiprocessing.get_context("spawn")
        procs = [
            ctx.Process(
                target=in_process, args=(permits_under_load, url, name, limit, mode, rounds, str(counter), str(log))
            )
            for mode in modes
        ]
        for p in procs:
            p.start()
        for p in procs:
            await run_blocking(p.join, 180)
        assert [p.exitcode for p in procs] == [0] * len(procs)
        inside, worst = (int(x) for x in counter.read_text().split())
        assert inside == 0
        lines = log.read_text().splitlines()
        assert len(lines) == rounds * len(modes)
        if limit:
            assert worst <= limit, f"{worst} holders at once with limit {limit}"
            assert _most_at_once(log) <= limit
        return log

    # -- reader-writer locks -------------------------------------------------------------------------

    async def test_readers_overlap(self, locks: lockkit.AsyncLocker, other: lockkit.AsyncLocker, name: str) -> None:
        rw, rw2 = locks.rwlock(name, ttl=HOLD_TTL), other.rwlock(name, ttl=HOLD_TTL)
        readers = [
            await rw.read().acquire(timeout=5),
            await rw2.read().acquire(timeout=5),
            await rw.read().acquire(timeout=5),
        ]
        assert all(lease.valid for lease in readers)
        assert await rw2.write().try_acquire() is None
        info = await rw.holders()
        assert (info.limit, info.holders, info.writer) == (0, 3, False)

    async def test_writer_excludes_everyone(
        self, locks: lockkit.AsyncLocker, other: lockkit.AsyncLocker, name: str
    ) -> None:
        rw, rw2 = locks.rwlock(name, ttl=HOLD_TTL), other.rwlock(name, ttl=HOLD_TTL)
        writer = rw.write()
        async with writer as lease:
            assert lease.valid
            assert await rw2.read().try_acquire() is None
            assert await rw2.write().try_acquire() is None
            assert (await rw2.holders()).writer
        assert (await rw2.read().try_acquire()) is not None

    async def test_writer_waits_for_readers_then_goes_first(
        self, locks: lockkit.AsyncLocker, other: lockkit.AsyncLocker, name: str
    ) -> None:
        rw, rw2 = locks.rwlock(name, ttl=HOLD_TTL), other.rwlock(name, ttl=HOLD_TTL)
        reader = rw.read()
        first = await reader.acquire(timeout=5)
        writer = rw2.write()
        pending = Background(lambda: writer.acquire(timeout=20))
        deadline = time.monotonic() + 10
        while (await rw.holders()).waiting_writers < 1:
            assert time.monotonic() < deadline, "the writer never queued"
            await sleep(0.02)
        assert await rw.read().try_acquire() is None, "a reader after a waiting writer must wait (writer preference)"
        await reader.release()
        lease = await pending.result(SLACK + 5)
        if fences(locks):
            assert lease.fencing_token > first.fencing_token
        await writer.release()

    async def test_writer_not_starved_by_reader_stream(
        self, locks: lockkit.AsyncLocker, other: lockkit.AsyncLocker, name: str
    ) -> None:
        stopped = [False]
        reader_fences: list[int] = []

        async def reader_stream(locker: lockkit.AsyncLocker) -> None:
            # Hand over hand: the next read is asked for while the current one is held, so that some reader
            # always holds; only a refusal (a writer waits) makes it let go first and then wait in line.
            rw = locker.rwlock(name, ttl=HOLD_TTL)
            current = rw.read()
            reader_fences.append((await current.acquire(timeout=30)).fence or 0)
            while not stopped[0]:
                await sleep(0.02)
                following = rw.read()
                lease = await following.try_acquire()
                await current.release()
                if lease is None:
                    lease = await following.acquire(timeout=30)
                reader_fences.append(lease.fence or 0)
                current = following
            await current.release()

        streams = [Background(lambda: reader_stream(locks)), Background(lambda: reader_stream(other))]
        await sleep(0.3)  # readers overlap continuously from here on
        started = time.monotonic()
        writer = other.rwlock(name, ttl=HOLD_TTL).write()
        lease = await writer.acquire(timeout=SLACK + 8)
        waited = time.monotonic() - started
        before = list(reader_fences)
        await writer.release()
        stopped[0] = True
        for stream in streams:
            await stream.result(30)
        assert waited < SLACK + 3, f"the writer waited {waited:.2f} s under a stream of readers"
        if fences(locks):
            assert lease.fencing_token > max(before)

    async def test_rwlock_processes(self, name: str, url: str, tmp_path: Path) -> None:
        log = await self._under_load(url, name, tmp_path, 0, ["read"] * 5 + ["write"] * 3, rounds=10)
        spans = [line.split() for line in log.read_text().splitlines()]
        writes = [(float(s[0]), float(s[1])) for s in spans if s[3] == "write"]
        for w0, w1 in writes:
            for s in spans:
                start, end = float(s[0]), float(s[1])
                if (start, end) != (w0, w1):
                    assert end <= w0 or start >= w1, "a writer overlapped another holder"

    # -- holders that die or freeze (docs/reliability.md, family S) ------------------------------------

    async def _dead_holder(self, url: str, name: str, tmp_path: Path, mode: str, sig: int) -> None:
        ready = tmp_path / "ready"
        ctx = multiprocessing.get_context("spawn")
        child = ctx.Process(target=in_process, args=(hold_and_wait, url, name, 1, mode, SHORT_TTL, str(ready)))
        child.start()
        try:
            pid, fence = (int(x) for x in (await _wait_for_file(ready, 60)).split())
            os.kill(pid, sig)
            killed = time.monotonic()
            async with lockkit.connect_async(url) as locks:
                if mode == "permit":
                    handle: lockkit.AsyncPermit = locks.semaphore(name, limit=1, ttl=HOLD_TTL)
                else:
                    handle = locks.rwlock(name, ttl=HOLD_TTL).write()
                if not (sig == signal.SIGKILL and self.killed_holder_freed_at_once):
                    assert await handle.try_acquire() is None, "the frozen or dead holder still holds"
                lease = await handle.acquire(timeout=SHORT_TTL * 3 + SLACK + 10)
                assert time.monotonic() - killed <= SHORT_TTL * 3 + SLACK + 10
                if fences(locks):
                    assert lease.fencing_token > fence
                if sig == signal.SIGSTOP:  # woken, the frozen holder's own clock says its lease is over
                    os.kill(pid, signal.SIGCONT)
                    lost = Path(str(ready) + ".lost")
                    deadline = time.monotonic() + SLACK + 10
                    while not lost.exists() and time.monotonic() < deadline:
                        await sleep(0.05)
                    assert lost.exists(), "the resumed holder still believes its lease valid"
                await handle.release()
        finally:
            if child.is_alive():
                os.kill(child.pid or 0, signal.SIGKILL)
            await run_blocking(child.join, 30)

    async def test_killed_holder_permit_lapses(self, url: str, name: str, tmp_path: Path) -> None:  # S-1
        await self._dead_holder(url, name, tmp_path, "permit", signal.SIGKILL)

    async def test_paused_holder_permit_lapses(self, url: str, name: str, tmp_path: Path) -> None:  # S-2
        await self._dead_holder(url, name, tmp_path, "permit", signal.SIGSTOP)

    async def test_killed_writer_lapses(self, url: str, name: str, tmp_path: Path) -> None:  # S-3
        await self._dead_holder(url, name, tmp_path, "write", signal.SIGKILL)
