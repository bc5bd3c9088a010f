"""The least-privilege ACL rule documented in docs/backends/redis.md, tested as written."""

from __future__ import annotations

import logging
import threading
import uuid

import pytest
import redis

import lockkit
from backends.pytest_fixtures import RedisFactory
from lockkit import BackendUnavailable

RULE = ("on >pw-XYZ resetkeys ~lockkit:* resetchannels &lockkit:* -@all +evalsha +script|load +set +get +del "
        "+incr +pexpire +pttl +publish +time +lindex +lpop +lrem +rpush +llen +zscore +zadd +zrem +zcount "
        "+subscribe +unsubscribe +ping +info +config|get")
PRESENCE_RULE = " +hset +hget +hdel +zrange +zrangebyscore +zremrangebyscore +persist"
PERMIT_RULE = " +hset +hget +hdel +hgetall +hmget +hincrby +zcard +zrange +zrangebyscore"


def test_documented_acl_rule_is_enough(fresh_redis: RedisFactory, caplog: pytest.LogCaptureFixture) -> None:
    server = fresh_redis()
    admin = redis.Redis(port=server.port)
    admin.execute_command("ACL", "SETUSER", "lockkit", *RULE.split())
    admin.execute_command("ACL", "SETUSER", "noconfig", *RULE.replace(" +info +config|get", "").split())
    admin.execute_command("ACL", "SETUSER", "noeval", *RULE.replace(" +evalsha", "").split())
    name = f"acl-{uuid.uuid4().hex[:8]}"
    url = f"redis://lockkit:pw-XYZ@127.0.0.1:{server.port}/0"
    with lockkit.connect(url) as a, lockkit.connect(url) as b:
        lock = a.lock(name, ttl=2)
        lock.acquire()
        assert b.holder(name).held
        threading.Timer(0.2, lock.release).start()
        waiter = b.lock(name, ttl=2)
        waiter.acquire(timeout=3)  # woken through the pub/sub channel
        waiter.renew()
        assert a.force_release(name)
    with caplog.at_level(logging.WARNING, logger="lockkit"), \
            lockkit.connect(url.replace("lockkit:", "noconfig:")) as c:
        c.lock(name, ttl=2).acquire().token  # noqa: B018
    assert any("denies CONFIG" in r.getMessage() for r in caplog.records)
    with lockkit.connect(url.replace("lockkit:", "noeval:")) as d, \
            pytest.raises(BackendUnavailable, match="ACL") as info:
        d.lock(name + "x", ttl=2).acquire(timeout=1)
    assert "pw-XYZ" not in str(info.value)


def test_presence_acl_rule_is_enough(fresh_redis: RedisFactory) -> None:
    """The extra commands that presence records (the migrate backend) need, as documented."""
    server = fresh_redis()
    admin = redis.Redis(port=server.port)
    admin.execute_command("ACL", "SETUSER", "lockkit", *(RULE + PRESENCE_RULE).split())
    with lockkit.connect(f"redis://lockkit:pw-XYZ@127.0.0.1:{server.port}/0") as locks:
        driver = locks._backends[locks.backends()[0]].driver  # type: ignore[attr-defined]
        driver.announce("acl-group", "m1", "v1", 5.0)
        driver.announce("acl-group", "epoch", "1", None)
        assert driver.members("acl-group") == {"m1": "v1", "epoch": "1"}
        driver.withdraw("acl-group", "m1")
        assert driver.members("acl-group") == {"epoch": "1"}


def test_permit_acl_rule_is_enough(fresh_redis: RedisFactory) -> None:
    """Semaphores and reader-writer locks need the documented extra commands, and are refused clearly without."""
    server = fresh_redis()
    admin = redis.Redis(port=server.port)
    admin.execute_command("ACL", "SETUSER", "lockkit", *(RULE + PERMIT_RULE).split())
    admin.execute_command("ACL", "SETUSER", "lockonly", *RULE.split())
    name = f"acl-sem-{uuid.uuid4().hex[:8]}"
    url = f"redis://lockkit:pw-XYZ@127.0.0.1:{server.port}/0"
    with lockkit.connect(url) as a, lockkit.connect(url) as b:
        permit = a.semaphore(name, limit=1, ttl=2)
        permit.acquire()
        threading.Timer(0.2, permit.release).start()
        waiter = b.semaphore(name, limit=1, ttl=2)
        waiter.acquire(timeout=3)  # handed over by the release
        waiter.renew()
        assert b.permit_holders(name).holders == 1
        rw = a.rwlock(name + "-rw", ttl=2)
        with rw.read(), rw.read():
            pass
        with rw.write() as lease:
            assert lease.valid
        assert a.force_release_permits(name) == 1
    with lockkit.connect(url.replace("lockkit:", "lockonly:")) as c, \
            pytest.raises(BackendUnavailable, match="ACL") as info:
        c.semaphore(name + "x", limit=2, ttl=2).acquire(timeout=1)
    assert "pw-XYZ" not in str(info.value)
