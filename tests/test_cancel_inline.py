"""A-2 at the mechanism: ``finish_even_if_cancelled(inline=True)``, the release/renew that runs in its caller's
task and moves to a task of its own only when the caller is cancelled (issue 17: no task, no shield, no extra
turn of the loop on the usual path).

The steps here wait on futures the test controls, so each cancellation lands exactly where it is meant to; the
last tests check the same on a real redis:// server and on the thread-offloaded face (the file driver).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import lockkit
from backends.servers import RedisServer
from lockkit._async.cancel_safe import finish_even_if_cancelled


class Step:
    """A release-like step: waits for ``gate`` (a future of the test's), then records what it saw."""

    def __init__(self) -> None:
        self.gate: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.saw: list[str] = []
        self.finished = asyncio.Event()

    async def run(self, then_sleep: bool = False) -> str:
        try:
            value = await self.gate
            self.saw.append(f"gate:{value}")
            if then_sleep:
                await asyncio.sleep(0)
                self.saw.append("after-yield")
                await asyncio.sleep(0.001)
                self.saw.append("after-sleep")
            return value
        except BaseException as exc:
            self.saw.append(f"raised:{type(exc).__name__}")
            raise
        finally:
            self.finished.set()


@contextlib.contextmanager
def counting_tasks() -> Iterator[list[int]]:
    loop = asyncio.get_running_loop()
    made = [0]
    before = loop.get_task_factory()

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kw: Any) -> asyncio.Task[Any]:
        made[0] += 1
        return asyncio.Task(coro, loop=loop, **kw)

    loop.set_task_factory(factory)
    try:
        yield made
    finally:
        loop.set_task_factory(before)


async def test_A2_inline_step_runs_in_the_callers_task_on_the_usual_path() -> None:
    step = Step()
    with counting_tasks() as made:
        caller = asyncio.ensure_future(finish_even_if_cancelled(step.run(then_sleep=True), "step", inline=True))
        await asyncio.sleep(0)
        step.gate.set_result("ok")
        assert await caller == "ok"
    assert step.saw == ["gate:ok", "after-yield", "after-sleep"]
    assert made[0] == 1, "only the test's own caller task: the step made none"


async def test_A2_inline_cancel_reaches_the_caller_at_once_and_the_step_finishes_alone() -> None:
    step = Step()
    caller = asyncio.ensure_future(finish_even_if_cancelled(step.run(then_sleep=True), "step", inline=True))
    await asyncio.sleep(0)  # the step waits on its gate now
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller  # before the gate opens: the caller is not held up by the step
    assert caller.cancelled()
    assert not step.gate.cancelled(), "the step's own future must not be cancelled"
    assert step.saw == []
    step.gate.set_result("late")
    await asyncio.wait_for(step.finished.wait(), 5)
    assert step.saw == ["gate:late", "after-yield", "after-sleep"]


async def test_A2_inline_cancel_after_the_future_completed_still_hands_its_result_to_the_step() -> None:
    step = Step()
    caller = asyncio.ensure_future(finish_even_if_cancelled(step.run(), "step", inline=True))
    await asyncio.sleep(0)
    step.gate.set_result("ready")  # the caller's wake-up is scheduled, not run yet
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    await asyncio.wait_for(step.finished.wait(), 5)
    assert step.saw == ["gate:ready"], "the reply that arrived must reach the step, not a cancellation"


async def test_A2_inline_cancel_at_a_bare_yield_hands_the_step_over_where_it_stands() -> None:
    step = Step()
    step.gate.set_result("now")
    caller = asyncio.ensure_future(finish_even_if_cancelled(step.run(then_sleep=True), "step", inline=True))
    await asyncio.sleep(0)  # the step ran to its sleep(0)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    await asyncio.wait_for(step.finished.wait(), 5)
    assert step.saw == ["gate:now", "after-yield", "after-sleep"]


async def test_A2_inline_cancelled_twice_still_finishes_the_step_once() -> None:
    step = Step()
    caller = asyncio.ensure_future(finish_even_if_cancelled(step.run(then_sleep=True), "step", inline=True))
    await asyncio.sleep(0)
    caller.cancel()
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    step.gate.set_result("x")
    await asyncio.wait_for(step.finished.wait(), 5)
    assert step.saw == ["gate:x", "after-yield", "after-sleep"]


async def test_A2_inline_callers_own_timeout_ends_the_wait_not_the_step() -> None:
    """The caller's ``asyncio.wait_for`` / ``asyncio.timeout`` around a release cancels the caller's task: the
    caller gets its TimeoutError, the step finishes on its own."""
    for how in ("wait_for", "timeout"):
        if how == "timeout" and not hasattr(asyncio, "timeout"):
            continue
        step = Step()
        with pytest.raises(asyncio.TimeoutError):  # the builtin one only from Python 3.11
            if how == "wait_for":
                await asyncio.wait_for(finish_even_if_cancelled(step.run(then_sleep=True), "step", inline=True), 0.01)
            else:
                async with asyncio.timeout(0.01):  # type: ignore[attr-defined]  # Python 3.11+
                    await finish_even_if_cancelled(step.run(then_sleep=True), "step", inline=True)
        step.gate.set_result(how)
        await asyncio.wait_for(step.finished.wait(), 5)
        assert step.saw == [f"gate:{how}", "after-yield", "after-sleep"]


async def test_A2_inline_failure_of_the_awaited_future_reaches_the_step_and_the_caller() -> None:
    step = Step()
    caller = asyncio.ensure_future(finish_even_if_cancelled(step.run(), "step", inline=True))
    await asyncio.sleep(0)
    step.gate.set_exception(ConnectionError("gone"))
    with pytest.raises(ConnectionError, match="gone"):
        await caller
    assert step.saw == ["raised:ConnectionError"]


async def test_A2_inline_step_failing_after_its_caller_left_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    step = Step()
    caller = asyncio.ensure_future(finish_even_if_cancelled(step.run(), "releasing 'x'", inline=True))
    await asyncio.sleep(0)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    with caplog.at_level(logging.WARNING, logger="lockkit"):
        step.gate.set_exception(ConnectionError("gone"))
        await asyncio.wait_for(step.finished.wait(), 5)
        await asyncio.sleep(0.01)
    assert "releasing 'x', finished after its caller was cancelled, raised" in caplog.text


def test_A2_inline_step_left_running_when_the_loop_closes_sees_the_cancellation() -> None:
    """``asyncio.run`` cancels what is left: the step's own handlers run (a release records its outcome)."""
    saw: list[str] = []

    async def scenario() -> None:
        gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def step() -> None:
            try:
                await gate
            except asyncio.CancelledError:
                saw.append("cancelled in the step")
                raise

        caller = asyncio.ensure_future(finish_even_if_cancelled(step(), "step", inline=True))
        await asyncio.sleep(0)
        caller.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await caller

    asyncio.run(scenario())
    assert saw == ["cancelled in the step"]


async def test_A2_a_step_that_cancels_itself_keeps_its_own_timeout_when_not_inline() -> None:
    """Why ``inline`` is the driver's promise: a step with its own ``asyncio.timeout`` cancels the task it runs
    in, which a guard in the caller's task would take for its caller's cancellation. Not inline, the step runs
    in a task of its own and its timeout is its own."""
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def step() -> str:
        try:
            async with asyncio.timeout(0.01):  # type: ignore[attr-defined]  # Python 3.11+
                await gate
        except TimeoutError:
            return "timed out"
        return "gate"

    if not hasattr(asyncio, "timeout"):
        pytest.skip("asyncio.timeout is Python 3.11+")
    assert await finish_even_if_cancelled(step(), "step") == "timed out"


# -- the same through AsyncLock.release on real servers -------------------------------------------------------


@pytest.fixture(scope="module")
def own_redis() -> Iterator[RedisServer]:
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize("backend", ["redis", "file"])
async def test_A2_a_cancelled_release_completes_and_is_counted_as_a_release(
    backend: str, own_redis: RedisServer, tmp_path: Path
) -> None:
    """Cancelled after it was sent, the release still runs to its reply: counted as a release (not an error),
    the lease released, the server free. Cancelling the step itself instead (a plain ``await``) would record a
    release whose outcome is unknown, drop the Redis connection, and on the offloaded face leave the lock held
    until its TTL with a lease that says released."""
    url = own_redis.url if backend == "redis" else f"file://{tmp_path}"
    async with lockkit.connect_async(url) as locks:
        for point in range(1, 5):  # loop turns before the cancel (0: before release() even started)
            name = f"inline-{uuid.uuid4().hex}"
            lock = locks.lock(name, ttl=30)
            lease = await lock.acquire(timeout=5)
            before = next(iter(locks.stats().values()))["releases"]
            task = asyncio.ensure_future(lock.release())
            for _ in range(point):
                await asyncio.sleep(0)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            for _ in range(200):  # the step finishes on its own
                if not lease.valid and next(iter(locks.stats().values()))["releases"] > before:
                    break
                await asyncio.sleep(0.01)
            assert not lease.valid
            assert next(iter(locks.stats().values()))["releases"] == before + 1, f"cancel after {point}"
            assert not await locks.lock(name).locked(), f"cancel after {point}: the server still holds it"
