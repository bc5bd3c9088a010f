"""A lease's validity counts from before its request was sent, never from the reply (issue 20).

The server applies a grant or a renewal somewhere between our send and its reply. Only the send time is
known to precede it, so ``expires_at`` must be at most ``send + ttl - drift(ttl)``. With every reply held
back by ``DELAY`` seconds in ``backends/proxy.py``'s ``FaultProxy`` (delay mode, server-to-client only), the
server applied the request at least ``DELAY`` before the call returned: so ``expires_at`` (or the driver's
``Grant.sent_at``) must lie at least ``DELAY`` before ``returned + ttl - drift``. Code that starts the clock at
the reply is ``DELAY`` late and fails; correct code passes whatever the machine's speed (no timing assumed
beyond the proxy's own delay).

Checked at the front end (``Lock.acquire``/``Lock.renew``, sync and async) and at the driver (``renew``,
where the front end's own renewal ticket would otherwise hide a driver that counts from the reply), for
redis:// and etcd://.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

import lockkit
from backends.proxy import FaultProxy
from backends.pytest_fixtures import ProxyFactory
from backends.servers import EtcdServer, RedisServer
from lockkit.timing import drift

DELAY = 0.4
TTL = 5.0


def _name() -> str:
    return f"vfs-{uuid.uuid4().hex[:10]}"


def _latest_deadline(returned: float, ttl: float) -> float:
    """The latest ``expires_at`` a lease may claim if its call returned at ``returned`` with replies DELAY late."""
    return returned - DELAY + ttl - drift(ttl)


@pytest.fixture(params=["redis", "etcd"])
def proxied(request: pytest.FixtureRequest, fault_proxy: ProxyFactory) -> Iterator[tuple[str, FaultProxy]]:
    """(url through a FaultProxy, the proxy), for each server kind."""
    if request.param == "redis":
        server: RedisServer | EtcdServer = request.getfixturevalue("redis_server")
        proxy = fault_proxy(server)
        yield f"redis://127.0.0.1:{proxy.port}/0?timeout=5", proxy
    else:
        server = request.getfixturevalue("etcd_server")
        proxy = fault_proxy(server)
        yield f"etcd://127.0.0.1:{proxy.port}?timeout=5", proxy


def test_acquire_validity_counts_from_the_send(proxied: tuple[str, FaultProxy]) -> None:
    url, proxy = proxied
    with lockkit.connect(url) as locks:
        locks.lock(_name(), ttl=TTL).acquire(timeout=10).token  # noqa: B018  (connections and session set up)
        lock = locks.lock(_name(), ttl=TTL, auto_renew=False)
        proxy.delay(DELAY, direction="down")
        lease = lock.acquire(timeout=10)
        returned = time.monotonic()
        proxy.heal()
        late = lease.expires_at - _latest_deadline(returned, lease.ttl)
        assert late <= 0, f"validity counted from the reply: expires_at is {late:+.3f} s past send + ttl - drift"
        lock.release()


def test_renew_validity_counts_from_the_send(proxied: tuple[str, FaultProxy]) -> None:
    url, proxy = proxied
    with lockkit.connect(url) as locks:
        lock = locks.lock(_name(), ttl=TTL, auto_renew=False)
        lease = lock.acquire(timeout=10)
        proxy.delay(DELAY, direction="down")
        lock.renew()
        returned = time.monotonic()
        proxy.heal()
        assert lease.expires_at <= _latest_deadline(returned, lease.ttl)
        lock.release()


def test_driver_renew_grant_counts_from_the_send(proxied: tuple[str, FaultProxy]) -> None:
    """The driver's own ``Grant.sent_at``: the front end caps a renewal by its ticket, which would hide it."""
    url, proxy = proxied
    with lockkit.connect(url) as locks:
        name = _name()
        lease = locks.lock(name, ttl=TTL, auto_renew=False).acquire(timeout=10)
        driver = locks.backend_for(name).driver
        proxy.delay(DELAY, direction="down")
        grant = driver.renew(name, lease.token, TTL)
        returned = time.monotonic()
        proxy.heal()
        assert grant is not None, "the renewal of a held lock was refused"
        assert grant.sent_at <= returned - DELAY, f"Grant.sent_at is {grant.sent_at - (returned - DELAY):+.3f} s late"
        assert driver.release(name, lease.token)


async def test_async_acquire_and_renew_count_from_the_send(proxied: tuple[str, FaultProxy]) -> None:
    url, proxy = proxied
    async with lockkit.connect_async(url) as locks:
        await locks.lock(_name(), ttl=TTL).try_acquire()  # connections and session set up
        name = _name()
        lock = locks.lock(name, ttl=TTL, auto_renew=False)
        proxy.delay(DELAY, direction="down")
        lease = await lock.acquire(timeout=10)
        assert lease.expires_at <= _latest_deadline(time.monotonic(), lease.ttl), "acquire counted from the reply"
        await lock.renew()
        assert lease.expires_at <= _latest_deadline(time.monotonic(), lease.ttl), "renew counted from the reply"
        grant = await locks.backend_for(name).driver.renew(name, lease.token, TTL)
        returned = time.monotonic()
        proxy.heal()
        assert grant is not None and grant.sent_at <= returned - DELAY, "the async driver's renewal counted late"
        await lock.release()
