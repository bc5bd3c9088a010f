"""The ACL rules docs/backends/redis.md gives for redis+sentinel://, tested as written there.

On the master: the least-privilege rule of ``redis://`` plus ``+role`` (and ``+wait`` for ``min_replicas``). On
the sentinels: the page's ``ACL SETUSER lockkit-sentinel …`` line, read from the page itself. "Enough" means
that nothing lockkit sends is refused: locking, waking and ``min_replicas`` work, the sentinels grant the
``+switch-master`` subscription (a refused one is warned about once and retried, each refusal making the next
call ask the sentinels), and neither the master nor a sentinel logs a denied command.
"""

from __future__ import annotations

import secrets
import threading
import time
import uuid

import pytest
import redis

import lockkit
from backends.servers import SentinelSet
from tests.docs_plugin import doc_acl_rule
from tests.test_redis_acl import RULE

MASTER_RULE = RULE + " +role +wait"
"""The ``redis://`` rule (password ``pw-XYZ``) with what the page adds on a Sentinel-managed master."""


def _ask(server: object, *command: str) -> object:
    with redis.Redis(server.host, server.port, socket_timeout=2, decode_responses=True) as client:  # type: ignore[attr-defined]
        return client.execute_command(*command)


def _subscribed(sentinel_set: SentinelSet, user: str) -> bool:
    """Whether a sentinel has a pub/sub client of ``user`` subscribed to a channel."""
    return any(
        f"user={user} " in line and " sub=0 " not in line and " sub=" in line
        for sentinel in sentinel_set.sentinels
        for line in str(sentinel.ask("CLIENT", "LIST")).splitlines()
    )


def test_documented_sentinel_acl_rules_are_enough(sentinel_set: SentinelSet) -> None:
    user, sentinel_user = f"lk{secrets.token_hex(3)}", f"lks{secrets.token_hex(3)}"
    for server in sentinel_set.redis:  # ACL users are not replicated: a promoted replica needs the user too
        _ask(server, "ACL", "SETUSER", user, *MASTER_RULE.split())
    for sentinel in sentinel_set.sentinels:
        sentinel.ask("ACL", "SETUSER", sentinel_user, "reset", ">pw-SEN", *doc_acl_rule("lockkit-sentinel"))
    try:
        url = sentinel_set.url.replace("redis+sentinel://", f"redis+sentinel://{user}:pw-XYZ@")
        url += f"?sentinel_username={sentinel_user}&sentinel_password=pw-SEN&min_replicas=1"
        name = f"sacl-{uuid.uuid4().hex[:8]}"
        with lockkit.connect(url) as a, lockkit.connect(url) as b:
            lock = a.lock(name, ttl=5)
            lock.acquire(timeout=5)  # min_replicas=1: WAIT 1 on the master
            threading.Timer(0.2, lock.release).start()
            waiter = b.lock(name, ttl=5)
            waiter.acquire(timeout=5)  # woken through the master's pub/sub channel
            waiter.renew()
            assert a.force_release(name)
            deadline = time.monotonic() + 10  # generous: the subscription is made in the background
            while not _subscribed(sentinel_set, sentinel_user) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert _subscribed(sentinel_set, sentinel_user), "no sentinel granted the +switch-master subscription"
        denied = [str(e) for s in sentinel_set.sentinels for e in s.ask("ACL", "LOG") if sentinel_user in str(e)]
        denied += [str(e) for s in sentinel_set.redis for e in _ask(s, "ACL", "LOG") if user in str(e)]  # type: ignore[attr-defined]
        assert not denied, f"commands the documented rules refuse: {denied}"
    finally:
        for server in sentinel_set.redis:
            _ask(server, "ACL", "DELUSER", user)
        for sentinel in sentinel_set.sentinels:
            sentinel.ask("ACL", "DELUSER", sentinel_user)


def test_a_sentinel_user_without_sentinel_master_is_refused(sentinel_set: SentinelSet) -> None:
    sentinel_user = f"lks{secrets.token_hex(3)}"
    rule = [word for word in doc_acl_rule("lockkit-sentinel") if word != "+sentinel|master"]
    for sentinel in sentinel_set.sentinels:
        sentinel.ask("ACL", "SETUSER", sentinel_user, "reset", ">pw-SEN", *rule)
    try:
        url = sentinel_set.url + f"?sentinel_username={sentinel_user}&sentinel_password=pw-SEN"
        with lockkit.connect(url) as locks, pytest.raises(lockkit.ConfigError, match=r"sentinel\|master"):
            locks.lock(f"sacl-{uuid.uuid4().hex[:8]}", ttl=5).acquire(timeout=5)
    finally:
        for sentinel in sentinel_set.sentinels:
            sentinel.ask("ACL", "DELUSER", sentinel_user)


def test_a_sentinel_user_without_get_master_addr_is_told_the_permission_not_a_wrong_service(
    sentinel_set: SentinelSet,
) -> None:
    """A docs audit found the NOPERM reply to ``SENTINEL get-master-addr-by-name`` read as "knows no master named
    …": the user was sent to check a service name that was right."""
    sentinel_user = f"lks{secrets.token_hex(3)}"
    rule = [word for word in doc_acl_rule("lockkit-sentinel") if word != "+sentinel|get-master-addr-by-name"]
    for sentinel in sentinel_set.sentinels:
        sentinel.ask("ACL", "SETUSER", sentinel_user, "reset", ">pw-SEN", *rule)
    try:
        url = sentinel_set.url + f"?sentinel_username={sentinel_user}&sentinel_password=pw-SEN"
        with lockkit.connect(url) as locks, pytest.raises(lockkit.ConfigError) as refused:
            locks.lock(f"sacl-{uuid.uuid4().hex[:8]}", ttl=5).acquire(timeout=5)
        message = str(refused.value)
        assert "+sentinel|get-master-addr-by-name" in message, message
        assert sentinel_user in message, message  # which user to fix
        assert "no master named" not in message, message
        assert "pw-SEN" not in message, message
    finally:
        for sentinel in sentinel_set.sentinels:
            sentinel.ask("ACL", "DELUSER", sentinel_user)
