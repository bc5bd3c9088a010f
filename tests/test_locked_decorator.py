"""@locker.locked(...) on both faces (issue 15): the name formatted from the call, the lease reachable inside."""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import pytest

import lockkit


@pytest.fixture
def url() -> str:
    return f"memory://deco-{uuid.uuid4().hex[:8]}"


def test_a_call_runs_holding_the_formatted_name(url: str) -> None:
    with lockkit.connect(url) as locks:
        seen: list[tuple[str, bool, int]] = []

        @locks.locked("report:{day}", ttl=10, timeout=5)
        def build(day: str, *, kind: str = "daily") -> str:
            lease = lockkit.current_lease()
            seen.append((lease.name, locks.holder(f"report:{day}").held, lease.fencing_token))
            return f"{kind}-{day}"

        assert build("2026-12-01") == "daily-2026-12-01"
        assert build(day="2026-12-02", kind="weekly") == "weekly-2026-12-02"
        assert [s[:2] for s in seen] == [("report:2026-12-01", True), ("report:2026-12-02", True)]
        assert not locks.holder("report:2026-12-01").held  # released after the call
        assert build.__name__ == "build"  # functools.wraps
        with pytest.raises(lockkit.LockError, match="only available inside"):
            lockkit.current_lease()


def test_calls_exclude_each_other(url: str) -> None:
    with lockkit.connect(url) as locks:
        inside = 0
        most = 0
        guard = threading.Lock()

        @locks.locked("job", ttl=10)
        def job() -> None:
            nonlocal inside, most
            with guard:
                inside += 1
                most = max(most, inside)
            threading.Event().wait(0.02)
            with guard:
                inside -= 1

        threads = [threading.Thread(target=job) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert most == 1


def test_timeout_and_errors_are_those_of_lock(url: str) -> None:
    with lockkit.connect(url) as locks:

        @locks.locked("busy", ttl=10, timeout=0.1)
        def work() -> None:
            raise AssertionError("must not run without the lock")

        held = locks.lock("busy", ttl=10).acquire()
        with pytest.raises(lockkit.LockTimeout):
            work()
        assert held.valid  # the holder's lock was not disturbed


def test_an_exception_in_the_call_releases_and_propagates(url: str) -> None:
    with lockkit.connect(url) as locks:

        @locks.locked("fails", ttl=10)
        def fails() -> None:
            raise KeyError("boom")

        with pytest.raises(KeyError):
            fails()
        assert not locks.holder("fails").held


def test_mistakes_are_refused_when_decorating(url: str) -> None:
    with lockkit.connect(url) as locks:
        with pytest.raises(lockkit.ConfigError, match=r"uses \{dya\}, but f\(\) has no parameter"):

            @locks.locked("report:{dya}")
            def f(day: str) -> None: ...

        with pytest.raises(lockkit.ConfigError, match="empty field"):
            locks.locked("report:{}")
        with pytest.raises(lockkit.ConfigError, match="bad lock name template"):
            locks.locked("report:{day")
        with pytest.raises(lockkit.ConfigError, match="ttl"):
            locks.locked("x", ttl=-1)
        with pytest.raises(lockkit.ConfigError, match="async"):

            @locks.locked("x")
            async def g() -> None: ...


def test_nested_calls_see_their_own_lease(url: str) -> None:
    with lockkit.connect(url) as locks:
        names: list[str] = []

        @locks.locked("inner")
        def inner() -> None:
            names.append(lockkit.current_lease().name)

        @locks.locked("outer")
        def outer() -> None:
            names.append(lockkit.current_lease().name)
            inner()
            names.append(lockkit.current_lease().name)

        outer()
        assert names == ["outer", "inner", "outer"]


async def test_the_async_face(url: str) -> None:
    async with lockkit.connect_async(url) as locks:
        order: list[Any] = []

        @locks.locked("pay:{order_id}", ttl=10, timeout=5)
        async def pay(order_id: int) -> int:
            lease = lockkit.current_lease()
            order.append(("in", order_id, lease.name))
            await asyncio.sleep(0.02)
            order.append(("out", order_id))
            return order_id * 2

        assert await asyncio.gather(pay(1), pay(1), pay(2)) == [2, 2, 4]
        one = [e for e in order if e[1] == 1]
        assert [e[0] for e in one] == ["in", "out", "in", "out"]  # the two pay(1) calls did not overlap
        assert ("in", 2, "pay:2") in order
        with pytest.raises(lockkit.ConfigError, match="async functions"):

            @locks.locked("x")
            def plain() -> None: ...
