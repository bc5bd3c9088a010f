"""R-9: redis+sentinel:// during a manual failover (``SENTINEL FAILOVER``): no two valid leases on one name.

The sentinel that runs a failover names the promoted replica (``get-master-addr-by-name``) from
``+promoted-slave`` on, about a second before it publishes ``+switch-master`` (at ``+failover-end``), and the
old master stays a writable master for seconds more. A client that already follows the old master must not
keep granting there while a client that asks the sentinels afresh grants on the new one (docs audit F6).

Each test runs its own Sentinel set (``fresh_sentinel``) and never asserts speed: the only waits are for
the sentinels' own steps, with generous bounds, and a short pause for a pub/sub message to arrive.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
import redis

import lockkit
from backends.pytest_fixtures import SentinelFactory
from backends.servers import SentinelSet

FOLLOW = 20.0  # seconds: the sentinels' manual failover (~1-2 s here) plus a generous margin for a loaded machine
HEARD = 0.3
"""Seconds between the sentinels naming the new master and the stale client's next acquire: room for one
pub/sub message on loopback, well inside the ~1 s before ``+switch-master`` (the window this is about)."""


def _key(name: str) -> str:
    return f"lockkit:{{{name}}}"


def _start_manual_failover(group: SentinelSet, leader: int = 0) -> tuple[tuple[str, int], tuple[str, int]]:
    """``SENTINEL FAILOVER`` on sentinel ``leader``; returns (old, new) once the first sentinel (the one lockkit
    asks first, so the one it listens to) names the new master: if it is the leader, at ``+promoted-slave``,
    about a second before its ``+switch-master``; if not, when the leader's hello reached it."""
    first = group.sentinels[0]
    old_host, old_port = first.ask("SENTINEL", "get-master-addr-by-name", group.service)
    old = (old_host, int(old_port))
    group.sentinels[leader].ask("SENTINEL", "FAILOVER", group.service)
    deadline = time.monotonic() + FOLLOW
    while True:
        host, port = first.ask("SENTINEL", "get-master-addr-by-name", group.service)
        if (host, int(port)) != old:
            return old, (host, int(port))
        assert time.monotonic() < deadline, "the sentinels did not name a new master"
        time.sleep(0.02)


def _where(address: tuple[str, int], key: str) -> int:
    client = redis.Redis(*address, socket_timeout=2)
    try:
        return int(client.pttl(key))
    finally:
        client.close()


@pytest.mark.slow
@pytest.mark.parametrize("leader", [0, 1], ids=["heard-from-the-leader", "heard-from-another-sentinel"])
def test_R9_manual_failover_stale_client_grants_on_the_new_master(fresh_sentinel: SentinelFactory, leader: int) -> None:
    """The audit's scenario (blocking face): a client following the old master acquires just after the sentinels
    named the new one; a fresh client then must not get the same name. Run by the sentinel lockkit listens to
    (the audit's case: it publishes +promoted-slave at once, +switch-master a second later), or by another one
    (the listened-to sentinel announces +switch-master when it learns)."""
    group = fresh_sentinel()
    n = f"r9-{uuid.uuid4().hex[:8]}"
    with lockkit.connect(group.url) as stale:
        stale.lock(n + "-warm", ttl=30, auto_renew=False).acquire(timeout=5)  # the old master is followed
        old, new = _start_manual_failover(group, leader)
        time.sleep(HEARD)
        lease = stale.lock(n, ttl=30, auto_renew=False).acquire(timeout=FOLLOW)
        on_old, on_new = _where(old, _key(n)), _where(new, _key(n))
        with lockkit.connect(group.url) as fresh:
            other = fresh.lock(n, ttl=30, auto_renew=False).try_acquire()
            both = other is not None and lease.valid and other.valid
            assert not both, (
                f"two valid leases on {n!r}: {lease.fencing_token:#x} (key pttl on the old master {old}: "
                f"{on_old}, on the new {new}: {on_new}) and {other.fencing_token:#x}"  # type: ignore[union-attr]
            )
        assert on_new > 0, f"the stale client's grant is not on the new master {new} (pttl {on_new}, old {on_old})"


@pytest.mark.slow
def test_R9_async_face_follows_at_promoted_slave(fresh_sentinel: SentinelFactory) -> None:
    """The same on the asyncio face (its announcements are heard on the caller's loop, not a thread)."""
    group = fresh_sentinel()
    n = f"r9a-{uuid.uuid4().hex[:8]}"

    async def main() -> None:
        async with lockkit.connect_async(group.url) as stale:
            await stale.lock(n + "-warm", ttl=30, auto_renew=False).acquire(timeout=5)
            old, new = await asyncio.to_thread(_start_manual_failover, group)
            await asyncio.sleep(HEARD)
            lease = await stale.lock(n, ttl=30, auto_renew=False).acquire(timeout=FOLLOW)
            on_old, on_new = _where(old, _key(n)), _where(new, _key(n))
            async with lockkit.connect_async(group.url) as fresh:
                other = await fresh.lock(n, ttl=30, auto_renew=False).try_acquire()
                assert other is None or not lease.valid, (
                    f"two valid leases on {n!r}: {lease.fencing_token:#x} (pttl old {on_old}, new {on_new}) and "
                    f"{other.fencing_token:#x}"
                )
            assert on_new > 0, f"the grant is not on the new master {new} (pttl {on_new}, old {on_old})"

    asyncio.run(main())


OLD_SENTINEL_RULE = (
    "-@all +sentinel|get-master-addr-by-name +sentinel|master +ping +subscribe resetchannels &+switch-master"
)
"""The sentinel user's ACL rule docs/backends/redis.md gave before R-9: ``+switch-master`` as its only channel."""


def _subscriptions(group: SentinelSet, user: str) -> int:
    return sum(
        int(line.split(" sub=")[1].split()[0])
        for sentinel in group.sentinels
        for line in str(sentinel.ask("CLIENT", "LIST")).splitlines()
        if f" user={user} " in line and " sub=" in line
    )


def test_R9_an_older_sentinel_acl_keeps_switch_master_and_says_what_is_missing(
    sentinel_set: SentinelSet, caplog: pytest.LogCaptureFixture
) -> None:
    """SUBSCRIBE of several channels is refused whole when one is not allowed: a user whose rule allows
    ``+switch-master`` only must still get that one (as before R-9), and be told the failover window the missing
    channels leave open, once, naming them."""
    user = f"lks{uuid.uuid4().hex[:6]}"
    for sentinel in sentinel_set.sentinels:
        sentinel.ask("ACL", "SETUSER", user, "reset", "on", ">pw-SEN", *OLD_SENTINEL_RULE.split())
    try:
        url = sentinel_set.url + f"?sentinel_username={user}&sentinel_password=pw-SEN"
        with lockkit.connect(url) as locks:
            locks.lock(f"r9acl-{uuid.uuid4().hex[:8]}", ttl=5).acquire(timeout=5)
            deadline = time.monotonic() + FOLLOW  # the subscription is made in the background
            while _subscriptions(sentinel_set, user) < 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert _subscriptions(sentinel_set, user) == 1, "+switch-master is not subscribed"
        warnings = [r.getMessage() for r in caplog.records if "refused this client's subscription" in r.getMessage()]
        assert len(warnings) == 1, warnings
        assert "&+promoted-slave" in warnings[0] and "&+failover-state-reconf-slaves" in warnings[0], warnings[0]
    finally:
        for sentinel in sentinel_set.sentinels:
            sentinel.ask("ACL", "DELUSER", user)
