"""The thread-offload adapter (:mod:`lockkit.offload`), the asyncio face of the blocking drivers."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
import uuid

import pytest

import lockkit
import lockkit.driver
from lockkit.offload import ThreadOffloadDriver


async def test_c8_offloaded_acquire_cancelled_at_any_point_never_leaves_the_lock_held() -> None:
    """C-8 on the offload adapter, whose acquire is not shielded (issue 17): a cancel that comes before a
    worker thread started the call stops it, one that comes while it runs or after it granted the lock has
    the grant released; either way the lock ends up free."""
    name = f"offload-{uuid.uuid4().hex[:8]}"
    async with lockkit.connect_async(f"memory://offload-{uuid.uuid4().hex[:8]}") as locks:
        assert isinstance(locks.backend_for(name).driver, ThreadOffloadDriver)
        won = 0
        for attempt in range(300):
            lock = locks.lock(name, ttl=60, auto_renew=False)
            task = asyncio.ensure_future(lock.acquire(timeout=5))
            for _ in range(attempt % 5):  # cancel at a different point of the call each time
                await asyncio.sleep(0)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                continue
            won += 1  # finished before the cancel reached it: ours to release
            await lock.release()
        deadline = time.monotonic() + 5
        while (await locks.holder(name)).held and time.monotonic() < deadline:
            await asyncio.sleep(0.02)  # a grant that raced a cancel is released from its worker thread
        assert not (await locks.holder(name)).held, f"a cancelled acquire left the lock held ({won} won)"


def _memory_driver() -> lockkit.driver.Driver:
    """A blocking memory:// driver of a store of its own (what the adapter wraps)."""
    driver: lockkit.driver.Driver = lockkit.connect(f"memory://offload-{uuid.uuid4().hex[:8]}").backend_for("x").driver
    return driver


async def test_a_release_never_waits_behind_blocked_acquires() -> None:
    """More acquires waiting than the adapter has threads for them: the holder's release still runs at once
    (releases have threads of their own), and the first waiter gets the lock. With one pool for every call,
    the waiting acquires took every thread and the release queued behind them until one timed out."""
    adapter = ThreadOffloadDriver(_memory_driver(), max_threads=8)
    name, holder = f"busy-{uuid.uuid4().hex[:8]}", "h" * 32
    try:
        assert await adapter.acquire(name, holder, 60, None) is not None
        waiters = [
            asyncio.ensure_future(adapter.acquire(name, f"{i:032d}", 60, time.monotonic() + 30)) for i in range(12)
        ]
        await asyncio.sleep(0.2)  # every thread of the acquire lane blocked in a wait, 4 acquires queued
        started = time.monotonic()
        assert await asyncio.wait_for(adapter.release(name, holder), 10)
        assert time.monotonic() - started < 5
        done, _ = await asyncio.wait(waiters, timeout=10, return_when=asyncio.FIRST_COMPLETED)
        assert len(done) == 1 and next(iter(done)).result() is not None
        for task in waiters:
            task.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
    finally:
        await adapter.close()


async def test_a_cancelled_acquire_no_thread_started_is_never_sent() -> None:
    """An acquire queued behind busy threads and cancelled there is withdrawn: it never runs, so it never
    takes the (free) lock it asked for, not even for a moment."""
    driver = _memory_driver()
    calls: list[str] = []
    acquire = driver.acquire

    def counting(name: str, *args: object) -> object:
        calls.append(name)
        return acquire(name, *args)  # type: ignore[arg-type]

    driver.acquire = counting  # type: ignore[method-assign]
    adapter = ThreadOffloadDriver(driver, max_threads=1)
    try:
        assert await adapter.acquire("held", "h" * 32, 60, None) is not None
        blocked = asyncio.ensure_future(adapter.acquire("held", "w" * 32, 60, time.monotonic() + 30))
        await asyncio.sleep(0.1)  # the lane's one thread waits in it
        queued = asyncio.ensure_future(adapter.acquire("free", "q" * 32, 60, None))
        await asyncio.sleep(0.05)
        queued.cancel()
        blocked.cancel()
        await asyncio.gather(queued, blocked, return_exceptions=True)
        await asyncio.sleep(0.2)
        assert "free" not in calls
        assert not (await adapter.holder("free")).held
    finally:
        await adapter.close()


async def test_idle_threads_end_and_new_calls_start_fresh_ones() -> None:
    adapter = ThreadOffloadDriver(_memory_driver())
    adapter._offload._calls.idle_seconds = adapter._offload._waits.idle_seconds = 0.05
    try:
        for round_ in range(3):
            grants = await asyncio.gather(*(adapter.acquire(f"n{round_}-{i}", "t" * 32, 60, None) for i in range(5)))
            assert all(grants)
            assert all(await asyncio.gather(*(adapter.release(f"n{round_}-{i}", "t" * 32) for i in range(5))))
            deadline = time.monotonic() + 5
            while (adapter._offload._calls.threads or adapter._offload._waits.threads) and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            assert (adapter._offload._calls.threads, adapter._offload._waits.threads) == (0, 0)
            assert (adapter._offload._calls.idle, adapter._offload._waits.idle) == (0, 0)
    finally:
        await adapter.close()


async def test_close_ends_the_threads_and_later_calls_fail_clearly() -> None:
    before = set(threading.enumerate())
    adapter = ThreadOffloadDriver(_memory_driver())
    assert await adapter.acquire("a", "t" * 32, 60, None) is not None
    assert await adapter.holder("a")

    def ours() -> list[threading.Thread]:  # other adapters' threads may be alive too
        return [t for t in threading.enumerate() if t not in before and t.name.startswith("lockkit-offload")]

    assert ours()
    await adapter.close()
    deadline = time.monotonic() + 5
    while ours() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert not ours()
    with pytest.raises(lockkit.BackendUnavailable, match="closed"):
        await adapter.release("a", "t" * 32)


def test_a_forked_child_runs_offloaded_calls_on_threads_of_its_own() -> None:
    """The child of a fork has none of its parent's worker threads: its first call starts its own (a pool
    that still counted the parent's idle threads queued the call for nobody, and the child hung)."""
    adapter = ThreadOffloadDriver(_memory_driver())

    async def use(name: str) -> bool:
        grant = await asyncio.wait_for(adapter.acquire(name, "t" * 32, 60, None), 10)
        return grant is not None and await asyncio.wait_for(adapter.release(name, "t" * 32), 10)

    assert asyncio.run(use("parent"))
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            signal.alarm(20)  # a hang ends the child, not the suite
            code = 0 if asyncio.run(use("child")) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert asyncio.run(use("parent-again"))
    asyncio.run(adapter.close())


async def test_a_lane_runs_calls_after_a_backlog_and_its_threads_idled_out() -> None:
    """More calls at once than a lane has threads, then quiet until every thread ended: the next call must
    start a thread. The lane counted a backlog's calls as taken by idle threads, so afterwards it believed
    threads were waiting that had ended, and every later call (a release, a renewal) waited for ever."""
    from lockkit.offload import Offload

    offload = Offload("backlog", max_threads=2)
    lanes = (offload._calls, offload._waits)
    for lane in lanes:
        lane.idle_seconds = 0.2
    try:
        for _ in range(2):  # twice: the second backlog comes after the first one's threads ended
            await asyncio.gather(*(offload.run(time.sleep, 0.01) for _ in range(150)))  # 64 threads at most
            await asyncio.sleep(1.0)  # every thread idles out
            assert (offload._calls.threads, offload._calls.idle) == (0, 0)
            assert await asyncio.wait_for(offload.run(lambda: 42), 5) == 42
            stop = lockkit.driver.Cancel()
            waits = [offload.wait(time.sleep, (0.01,), stop, lambda: None) for _ in range(5)]  # 2 threads
            await asyncio.wait_for(asyncio.gather(*waits), 10)
            await asyncio.sleep(1.0)
            assert (offload._waits.threads, offload._waits.idle) == (0, 0)
            assert await asyncio.wait_for(offload.wait(lambda: 7, (), stop, lambda: None), 5) == 7
    finally:
        offload.close()


async def test_a_thread_that_cannot_start_fails_its_call_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    """Out of threads: the call is answered with BackendUnavailable and never run later (a queued acquire run
    by another thread afterwards would hold a lock nobody awaits), and the lane's count stays right."""
    from lockkit.offload import Offload

    offload = Offload("no-threads", max_threads=2)
    ran: list[int] = []

    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    try:
        with monkeypatch.context() as patched:
            patched.setattr(threading.Thread, "start", refuse)
            with pytest.raises(lockkit.BackendUnavailable, match="could not start a worker thread"):
                await offload.run(ran.append, 1)
        assert (offload._calls.threads, offload._calls.idle) == (0, -1)  # its queued, withdrawn call
        assert await asyncio.wait_for(offload.run(lambda: 5), 5) == 5  # takes (and skips) the withdrawn one
        await asyncio.sleep(0.2)
        assert ran == []
    finally:
        offload.close()
