"""Two edges of the front end a docs audit found, each a "fake lock".

1. A grant that arrives after its own validity ran out (the reply slower than the ttl, or this process paused
   between the send and the reply) was handed out as the acquire's lease: ``with`` ran its body on a lease that
   said ``valid=False`` from the start, and only the block's end said so. Now such a grant is given back
   (owner-checked) and the acquire tries again with a fresh token, up to ``LATE_GRANTS`` times or its deadline,
   then raises ``BackendUnavailable`` — as Redlock already did (L-7).
2. A lock lost while a ``with`` block ran, found only by the exit's release (no renewal in between to notice),
   made the block raise ``LockNotOwned``; docs/semantics.md promises ``LockLost`` there, which is what an
   ``except LockLost`` handler of overlapping work catches.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest

import lockkit
from backends.proxy import FaultProxy
from backends.servers import RedisServer
from lockkit.lock_core import LATE_GRANTS


def _through(proxy: FaultProxy, server: RedisServer) -> str:
    return server.url.replace(f":{server.port}", f":{proxy.port}")


def test_grants_slower_than_their_ttl_are_never_handed_out(redis_server: RedisServer) -> None:
    name = f"late-{uuid.uuid4().hex[:8]}"
    with FaultProxy("127.0.0.1", redis_server.port) as proxy, lockkit.connect(_through(proxy, redis_server)) as locks:
        locks.lock(f"{name}-warm", ttl=5).try_acquire()  # connected and the scripts loaded, before the delay
        proxy.delay(0.4, "down")  # every reply 0.4 s late: more than the 0.3 s ttl
        ran = False
        started = time.monotonic()
        late = pytest.raises(lockkit.BackendUnavailable, match="arrived after its ttl")
        with late as info, locks.lock(name, ttl=0.3):
            ran = True
        assert not ran, "the block ran on a lease that was never valid"
        assert f"{LATE_GRANTS} times in a row" in str(info.value)
        assert time.monotonic() - started < 30
        proxy.heal()
        # what the late grants took on the server was given back (or lapsed): the name is free now
        assert locks.lock(name, ttl=5).try_acquire() is not None


def test_try_acquire_with_a_late_grant_raises_at_once(redis_server: RedisServer) -> None:
    name = f"late-try-{uuid.uuid4().hex[:8]}"
    with FaultProxy("127.0.0.1", redis_server.port) as proxy, lockkit.connect(_through(proxy, redis_server)) as locks:
        locks.lock(f"{name}-warm", ttl=5).try_acquire()
        proxy.delay(0.4, "down")
        with pytest.raises(lockkit.BackendUnavailable, match="1 time in a row"):
            locks.lock(name, ttl=0.3).try_acquire()


def _pause_after_first_grant(locks: Any, seconds: float) -> list[str]:
    """This process "pauses" once between a grant's reply and its use (as a GC pause or SIGSTOP would): the
    driver's first acquire returns ``seconds`` late. Returns the tokens the driver was asked to acquire with."""
    driver = locks.backend_for("x").driver
    real = driver.acquire
    tokens: list[str] = []

    def acquire(name: str, token: str, *args: Any, **kwargs: Any) -> Any:
        tokens.append(token)
        grant = real(name, token, *args, **kwargs)
        if len(tokens) == 1:
            time.sleep(seconds)
        return grant

    driver.acquire = acquire
    return tokens


def test_a_pause_between_grant_and_use_gives_the_grant_back_and_tries_again(tmp_path: Any) -> None:
    url = f"file://{tmp_path}/locks"
    name = f"paused-{uuid.uuid4().hex[:8]}"
    with lockkit.connect(url) as locks, lockkit.connect(url) as other:
        tokens = _pause_after_first_grant(locks, 0.4)
        with locks.lock(name, ttl=0.3) as lease:
            assert lease.valid
            assert len(tokens) == 2 and tokens[0] != tokens[1]  # a fresh token for the second try
            assert lease.token == tokens[1]
            held = other.holder(name)
            assert held.held and held.token_hint == lockkit.lease.token_hint(tokens[1])


def test_a_loss_found_by_the_exits_release_is_lock_lost(redis_server: RedisServer) -> None:
    name = f"exit-loss-{uuid.uuid4().hex[:8]}"
    with lockkit.connect(redis_server.url) as locks, lockkit.connect(redis_server.url) as admin:
        with pytest.raises(lockkit.LockLost, match="while the with-block ran") as info, locks.lock(name, ttl=30):
            assert admin.force_release(name)  # taken from under the block; no renewal runs before its end
        assert isinstance(info.value.__cause__, lockkit.LockNotOwned)

        # a handle released by hand inside the block is a misuse, not a loss: still LockNotOwned at the exit
        lock = locks.lock(name, ttl=30)
        with pytest.raises(lockkit.LockNotOwned, match="does not hold it"), lock:
            lock.release()


def test_async_a_loss_found_by_the_exits_release_is_lock_lost(redis_server: RedisServer) -> None:
    name = f"exit-loss-async-{uuid.uuid4().hex[:8]}"

    async def main() -> None:
        async with lockkit.connect_async(redis_server.url) as locks, lockkit.connect_async(redis_server.url) as admin:
            with pytest.raises(lockkit.LockLost, match="while the with-block ran"):
                async with locks.lock(name, ttl=30):
                    assert await admin.force_release(name)

    asyncio.run(main())
