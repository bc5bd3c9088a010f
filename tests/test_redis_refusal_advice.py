"""A script the server refuses is explained by what refused it: a full server (OOM) is told to free memory or
raise maxmemory, not to check an ACL (which is what every refusal said before)."""

from __future__ import annotations

import uuid

import pytest
import redis

import lockkit
from backends.pytest_fixtures import RedisFactory


def test_a_full_server_is_told_about_maxmemory_not_the_acl(fresh_redis: RedisFactory) -> None:
    server = fresh_redis(extra_args=("--maxmemory", "64mb", "--maxmemory-policy", "noeviction"))
    admin = redis.Redis(port=server.port)
    with lockkit.connect(server.url) as locks:
        assert locks.lock(f"warm-{uuid.uuid4().hex[:6]}", ttl=5).try_acquire() is not None  # scripts loaded
        for i in range(32):  # 2 MiB of data, then a maxmemory below it: every write is refused
            admin.set(f"filler:{i}", b"x" * 65536)
        admin.config_set("maxmemory", "1mb")
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            admin.set("one-more", "x")
        with pytest.raises(lockkit.BackendUnavailable, match="maxmemory") as info:
            locks.lock(f"full-{uuid.uuid4().hex[:6]}", ttl=5).acquire(timeout=1)
        assert "ACL" not in str(info.value)
        admin.flushall()
        admin.config_set("maxmemory", "4mb")
