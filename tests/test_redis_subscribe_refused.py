"""A server that refuses a client's pub/sub subscription (an ACL without ``+subscribe`` or the channels) is
told to the user once, as a warning, not only at DEBUG on every retry: until it is granted, waiters are not
woken by releases (they look again on timers, and a release may skip their queue entries), and a
sentinel's ``+switch-master`` is not heard. The lock stays correct meanwhile: the waiter still gets the lock
once it is free."""

from __future__ import annotations

import logging
import threading
import uuid

import pytest
import redis

import lockkit
from backends.pytest_fixtures import RedisFactory
from tests.test_redis_acl import RULE


def test_a_refused_subscription_is_warned_about_once(
    fresh_redis: RedisFactory, caplog: pytest.LogCaptureFixture
) -> None:
    server = fresh_redis()
    admin = redis.Redis(port=server.port)
    admin.execute_command("ACL", "SETUSER", "nosub", *RULE.replace(" +subscribe +unsubscribe", "").split())
    url = f"redis://nosub:pw-XYZ@127.0.0.1:{server.port}/0"
    name = f"nosub-{uuid.uuid4().hex[:8]}"
    with caplog.at_level(logging.DEBUG, logger="lockkit"), lockkit.connect(url) as a, lockkit.connect(url) as b:
        holder = a.lock(name, ttl=5)
        holder.acquire()
        timer = threading.Timer(1.0, holder.release)
        timer.start()
        try:
            waiter = b.lock(name, ttl=5)
            lease = waiter.acquire(timeout=10)  # still granted: on its timers, since no release can wake it
            assert lease.valid
            waiter.release()
        finally:
            timer.join()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "pub/sub" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "+subscribe" in warnings[0] and "pw-XYZ" not in warnings[0]
