"""A Redis release whose reply is lost, then retried (issue 12's suspicion), on redis:// and redlock://.

The drivers retry a release once on a fresh connection after a connection error, because a pooled
connection can break under a command that never ran. But when the connection breaks *after* the server ran
the release (the reply is what was lost), the retry finds the lock no longer ours: deleted by our own first
attempt, or handed by it to the next waiter. Reporting that as ``LockNotOwned`` (and marking the lease lost)
tells the user their lock expired or was taken while they held it, which did not happen.

Reproduced for real through ``FaultProxy``: ``drop_downstream`` while the release runs (the request reaches
the server, the reply vanishes), then the connection is reset, so the client sees a connection error (not a
timeout) and retries through the healed proxy.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable

import pytest

import lockkit
from backends.proxy import FaultProxy
from backends.pytest_fixtures import ProxyFactory
from backends.servers import RedisServer, RedlockServers
from lockkit import BackendUnavailable, LockNotOwned
from lockkit.lease import LeaseState, token_hint

SLACK = 0.25  # scheduling slack on liveness bounds


def _name() -> str:
    return f"rel-{uuid.uuid4().hex[:10]}"


def _until(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def _lose_replies_then_reset(proxies: list[FaultProxy], ran: Callable[[], bool]) -> None:
    """Wait until the server has run the release (``ran``), then heal and reset: the client's read breaks."""
    assert _until(ran, 5), "the release never reached the server"
    time.sleep(0.05)  # the (discarded) reply has been read by the proxy by now; nothing else is in flight
    for proxy in proxies:
        proxy.heal()
        proxy.reset_all()


def test_redis_release_retried_after_lost_reply_is_not_reported_not_owned(
    redis_server: RedisServer, fault_proxy: ProxyFactory
) -> None:
    proxy = fault_proxy(redis_server)
    name = _name()
    with (
        lockkit.connect(f"redis://127.0.0.1:{proxy.port}/0?timeout=5") as holder,
        lockkit.connect(redis_server.url) as other,
    ):
        lock = holder.lock(name, ttl=30, auto_renew=False)  # no renewal traffic through the proxy meanwhile
        lease = lock.acquire(timeout=5)
        got: list[lockkit.Lease] = []
        waiter = threading.Thread(target=lambda: got.append(other.lock(name, ttl=30).acquire(timeout=20)))
        waiter.start()
        assert _until(lambda: (other.holder(name).waiters or 0) >= 1, 5), "the waiter never queued"

        proxy.set_mode("drop_downstream")
        outcome: list[BaseException | None] = []

        def release() -> None:
            try:
                lock.release()
                outcome.append(None)
            except lockkit.LockError as exc:
                outcome.append(exc)

        releaser = threading.Thread(target=release)
        releaser.start()
        # the first attempt ran on the server: it handed the lock to the waiter
        _lose_replies_then_reset([proxy], lambda: bool(got))
        releaser.join(15)
        waiter.join(15)
        assert outcome, "the release never returned"
        error = outcome[0]
        print(f"release after a lost reply: {error!r}")
        assert not isinstance(error, LockNotOwned), f"a release that happened was reported as not owned: {error}"
        assert error is None or isinstance(error, BackendUnavailable)
        assert lease.state is not LeaseState.LOST, lease.lost_reason
        assert got and got[0].valid
        info = other.holder(name)
        assert info.held and info.token_hint == token_hint(got[0].token), "the retry touched the waiter's lock"


@pytest.mark.parametrize("contended", [False, True], ids=["free", "handed-on"])
def test_redlock_release_retried_after_lost_reply_is_not_reported_not_owned(
    redlock_servers: RedlockServers, fault_proxy: ProxyFactory, contended: bool
) -> None:
    proxies = [fault_proxy(m) for m in redlock_servers.members]
    hosts = ",".join(f"127.0.0.1:{p.port}" for p in proxies)
    name = _name()
    with (
        lockkit.connect(f"redlock://{hosts}/0?timeout=5") as holder,
        lockkit.connect(redlock_servers.url) as other,
    ):
        lock = holder.lock(name, ttl=30, auto_renew=False)
        lease = lock.acquire(timeout=5)
        got: list[lockkit.Lease] = []
        waiter = None
        if contended:
            waiter = threading.Thread(target=lambda: got.append(other.lock(name, ttl=30).acquire(timeout=20)))
            waiter.start()
            time.sleep(0.3)  # the waiter has tried once and sleeps on the lock's channel
        for proxy in proxies:
            proxy.set_mode("drop_downstream")
        outcome: list[BaseException | None] = []

        def release() -> None:
            try:
                lock.release()
                outcome.append(None)
            except lockkit.LockError as exc:
                outcome.append(exc)

        releaser = threading.Thread(target=release)
        releaser.start()
        if contended:
            ran: Callable[[], bool] = lambda: bool(got)  # noqa: E731
        else:
            ran = lambda: not other.holder(name).held  # noqa: E731
        _lose_replies_then_reset(proxies, ran)
        releaser.join(15)
        if waiter is not None:
            waiter.join(15)
        assert outcome, "the release never returned"
        error = outcome[0]
        print(f"redlock release after lost replies: {error!r}")
        assert not isinstance(error, LockNotOwned), f"a release that happened was reported as not owned: {error}"
        assert error is None or isinstance(error, BackendUnavailable)
        assert lease.state is not LeaseState.LOST, lease.lost_reason
        if contended:
            assert got and got[0].valid and other.holder(name).held, "the retry touched the next holder's lock"


async def test_redis_async_release_retried_after_lost_reply_is_not_reported_not_owned(
    redis_server: RedisServer, fault_proxy: ProxyFactory
) -> None:
    proxy = fault_proxy(redis_server)
    name = _name()
    async with (
        lockkit.connect_async(f"redis://127.0.0.1:{proxy.port}/0?timeout=5") as holder,
        lockkit.connect_async(redis_server.url) as other,
    ):
        lock = holder.lock(name, ttl=30, auto_renew=False)
        lease = await lock.acquire(timeout=5)
        waiter = asyncio.ensure_future(other.lock(name, ttl=30).acquire(timeout=20))
        for _ in range(500):
            if ((await other.holder(name)).waiters or 0) >= 1:
                break
            await asyncio.sleep(0.01)
        proxy.set_mode("drop_downstream")
        releasing = asyncio.ensure_future(lock.release())
        await asyncio.wait_for(asyncio.shield(waiter), 5)  # the first attempt ran: it handed the lock on
        await asyncio.sleep(0.05)
        await asyncio.to_thread(proxy.heal)
        await asyncio.to_thread(proxy.reset_all)
        try:
            await asyncio.wait_for(releasing, 15)
            error: BaseException | None = None
        except lockkit.LockError as exc:
            error = exc
        print(f"async release after a lost reply: {error!r}")
        assert not isinstance(error, LockNotOwned), f"a release that happened was reported as not owned: {error}"
        assert error is None or isinstance(error, BackendUnavailable)
        assert lease.state is not LeaseState.LOST, lease.lost_reason
        granted = waiter.result()
        assert granted.valid and (await other.holder(name)).held, "the retry touched the waiter's lock"
