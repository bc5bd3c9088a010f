"""The wrong face's context manager: ``with`` on an asyncio handle, ``async with`` on a blocking one.

Before, both raised Python's bare ``TypeError`` ("does not support the context manager protocol"), outside the
LockError tree and with no word of what to do. Now a :class:`lockkit.UsageError` (a LockError and a TypeError,
so code that caught the TypeError still does) names the statement to use and the other face's ``connect``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

import lockkit


def _name() -> str:
    return f"face-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def blocking() -> Iterator[lockkit.Locker]:
    with lockkit.connect("memory://") as locks:
        yield locks


def _check(error: pytest.ExceptionInfo[BaseException], *needles: str) -> None:
    assert isinstance(error.value, lockkit.LockError)
    assert isinstance(error.value, TypeError)
    for needle in needles:
        assert needle in str(error.value), str(error.value)


async def test_plain_with_on_an_async_lock_says_async_with_or_connect() -> None:
    async with lockkit.connect_async("memory://") as locks:
        lock = locks.lock(_name(), ttl=5)
        with pytest.raises(lockkit.UsageError) as error, lock:  # type: ignore[attr-defined]
            pass
        _check(error, "AsyncLock", "async with", "lockkit.connect()")
        assert not lock.owned()  # nothing was acquired
        async with lock as lease:  # the right statement still works
            assert lease.valid


async def test_plain_with_on_async_permits_says_async_with_or_connect() -> None:
    async with lockkit.connect_async("memory://") as locks:
        for handle in (locks.semaphore(_name(), 2, ttl=5), locks.rwlock(_name(), ttl=5).write()):
            with pytest.raises(lockkit.UsageError) as error, handle:  # type: ignore[attr-defined]
                pass
            _check(error, type(handle).__name__, "async with", "lockkit.connect()")
            async with handle as lease:
                assert lease.valid


async def test_async_with_on_a_blocking_lock_says_with_or_connect_async(blocking: lockkit.Locker) -> None:
    for handle in (
        blocking.lock(_name(), ttl=5),
        blocking.semaphore(_name(), 2, ttl=5),
        blocking.rwlock(_name(), ttl=5).read(),
    ):
        with pytest.raises(lockkit.UsageError) as error:
            async with handle:  # type: ignore[attr-defined]
                pass
        _check(error, type(handle).__name__, "`with", "lockkit.connect_async()")
        assert not handle.owned()
        with handle as lease:
            assert lease.valid


async def test_plain_with_on_an_async_locker_says_async_with() -> None:
    locks = lockkit.connect_async("memory://")
    try:
        with pytest.raises(lockkit.UsageError) as error, locks:  # type: ignore[attr-defined]
            pass
        _check(error, "AsyncLocker", "async with", "lockkit.connect()")
    finally:
        await locks.aclose()


async def test_async_with_on_a_blocking_locker_says_with() -> None:
    locks = lockkit.connect("memory://")
    try:
        with pytest.raises(lockkit.UsageError) as error:
            async with locks:  # type: ignore[attr-defined]
                pass
        _check(error, "Locker", "plain `with`", "lockkit.connect_async()")
    finally:
        locks.close()
