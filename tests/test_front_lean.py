"""The lean front end of issue 17 keeps every rule of the one it replaced.

Each shortcut taken on the acquire+release path is checked against the slow, obvious form it stands for: the
lease deadline computed inline, the process id kept instead of asked for (C-9: a forked child neither holds
nor releases its parent's lease, nor draws its tokens), the name validated once per handle, the waiter id
made from a remembered head, the renewal scheduler remembered per loop, and the statistics applied a
histogram at a time.
"""

from __future__ import annotations

import asyncio
import gc
import os
import random
import re
import signal
import threading
import uuid
import weakref

import pytest

import lockkit
from lockkit import metrics
from lockkit.drivers.redis.flow import WAITER_ID, waiter_id
from lockkit.lease import Lease, process_id
from lockkit.lock_core import new_token
from lockkit.renewal import async_scheduler
from lockkit.testing import FakeClock
from lockkit.timing import lease_deadline


@pytest.mark.parametrize("ttl", [0.01, 0.5, 1.0, 2.0, 10.0, 30.0, 3600.0, 365 * 24 * 3600.0])
@pytest.mark.parametrize("sent_at", [0.0, 1000.0, 123456.789])
def test_the_inline_lease_deadline_is_lease_deadline(ttl: float, sent_at: float) -> None:
    lease = Lease(name="n", token="t" * 32, fencing_token=1, ttl=ttl, sent_at=sent_at, clock=FakeClock(sent_at))
    assert lease.expires_at == lease_deadline(sent_at, ttl)  # exactly: the same float operations


def test_c9_a_forked_child_has_its_own_pid_its_own_tokens_and_not_its_parents_lease() -> None:
    lease = Lease(name="n", token="t" * 32, fencing_token=1, ttl=60, sent_at=FakeClock().now, clock=FakeClock())
    assert process_id() == os.getpid() and lease.ours() and lease.valid
    new_token()  # the parent's pool is drawn and part-used at the fork: the child must not go on with it
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's coverage is not collected
        code = 1
        try:
            fine = process_id() == os.getpid() != lease.owner_pid and not lease.ours() and not lease.valid
            os.write(write, new_token().encode())
            code = 0 if fine else 2
        finally:
            os._exit(code)
    os.close(write)
    child_token = os.read(read, 64).decode()
    os.close(read)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert lease.ours() and lease.valid  # the parent's view is unchanged
    # The child drew from a pool of its own: the parent's next tokens are not the child's
    mine = {new_token() for _ in range(300)}
    assert len(child_token) == 32 and child_token not in mine


def test_c9_a_child_forked_while_another_thread_draws_a_token_can_draw_one() -> None:
    """The token pool's mutex held by another parent thread at the fork: the child's first token must not wait
    on it for ever (that thread does not exist in the child)."""
    from lockkit import lock_core

    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock_core._tokens._mutex:
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(10)
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child's coverage is not collected
            code = 1
            try:
                signal.alarm(10)  # a hang ends the child with SIGALRM instead of the test
                code = 0 if re.fullmatch(r"[0-9a-f]{32}", new_token()) else 2
            finally:
                os._exit(code)
    finally:
        release.set()
        holder.join(10)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the forked child hung on the token pool's mutex"


def test_tokens_are_distinct_hex_across_pool_refills() -> None:
    tokens = [new_token() for _ in range(1000)]  # 256 tokens per 4 KiB draw: several refills
    assert len(set(tokens)) == len(tokens)
    assert all(re.fullmatch(r"[0-9a-f]{32}", token) for token in tokens)


def test_a_lock_handle_validates_its_name_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from lockkit import names
    from lockkit._async import locker as async_locker
    from lockkit._sync import locker as sync_locker

    calls: list[object] = []

    def counting(name: object) -> str:
        calls.append(name)
        return names.validate_name(name)

    for module in (async_locker, sync_locker):
        monkeypatch.setattr(module, "validate_name", counting)
    monkeypatch.setattr("lockkit.lock_core.validate_name", counting)
    with lockkit.connect(f"memory://lean-{uuid.uuid4().hex[:8]}") as locks:
        locks.lock("a-name", ttl=5)
        assert calls == ["a-name"]
        with pytest.raises(lockkit.InvalidLockName):
            locks.lock("", ttl=5)
        with pytest.raises(lockkit.InvalidLockName):
            locks.lock(b"bytes", ttl=5)  # type: ignore[arg-type]


def test_the_remembered_waiter_id_is_the_grammars(redis_url: str) -> None:
    from lockkit.driver import DriverContext
    from lockkit.drivers.redis._async.single import AsyncRedisDriver
    from lockkit.urls import parse_url

    driver = AsyncRedisDriver.from_url(parse_url(redis_url), DriverContext(clock=FakeClock()))
    for client_id in ("abc", "0f1e2d3c4b5a", "a_b-c"):
        for ttl in (0.0001, 0.01, 1.0, 1.5, 30.0, 29.9999):
            for token in ("t" * 32, new_token(), "!~x"):
                wid = driver._waiter_id(client_id, ttl, token)
                assert wid == waiter_id(client_id, ttl, token) and WAITER_ID.fullmatch(wid)
    if __debug__:  # the grammar's token part is still checked (as waiter_id's assert does)
        for bad in ("", "with space", "tab\t", "é" * 3):
            with pytest.raises(AssertionError):
                driver._waiter_id("abc", 1.0, bad)


@pytest.fixture
def redis_url() -> str:
    return "redis://127.0.0.1:1"  # never connected: the waiter id needs no server


def test_the_scheduler_memo_follows_the_loop_and_keeps_no_loop_alive() -> None:
    clock = FakeClock()

    async def scheduler_of_this_loop() -> tuple[object, object]:
        first = async_scheduler(clock)
        assert async_scheduler(clock) is first  # remembered
        assert async_scheduler(FakeClock()) is not first  # another clock, another scheduler
        return first, weakref.ref(asyncio.get_running_loop())

    one, loop_one = asyncio.run(scheduler_of_this_loop())
    two, loop_two = asyncio.run(scheduler_of_this_loop())
    assert one is not two  # each loop its own
    del one, two
    gc.collect()
    assert loop_one() is None and loop_two() is None  # type: ignore[operator]


def test_reservoir_add_many_is_add_in_turn() -> None:
    for n in (0, 1, 100, metrics.RESERVOIR - 1, metrics.RESERVOIR, metrics.RESERVOIR + 1, 20_000):
        values = [random.random() for _ in range(n)]
        one, many = metrics._Reservoir(), metrics._Reservoir()
        rng_one, rng_many = random.Random(n), random.Random(n)
        for value in values[:5]:  # a reservoir that has seen some already
            one.add(value, rng_one)
            many.add(value, rng_many)
        for value in values[5:]:
            one.add(value, rng_one)
        for chunk in range(5, len(values), 777):  # in batches, as apply_queued gives them
            many.add_many(values[chunk : chunk + 777], rng_many)
        assert (many.values, many.seen, many._next) == (one.values, one.seen, one._next)
        assert many.total == pytest.approx(one.total)


def test_statistics_of_acquires_and_releases_queued_and_applied() -> None:
    clock = FakeClock()
    config = {"backends": {"lean-stats": {"url": f"memory://lean-{uuid.uuid4().hex[:8]}"}}}
    with lockkit.from_config(config, clock=clock) as locks:
        for i in range(2 * metrics.QUEUED + 3):  # past the queue's bound twice: applied on the way and at read
            lock = locks.lock(f"s{i}", ttl=10, auto_renew=False)
            lock.acquire()
            clock.advance(2.5)
            lock.release()
        held = locks.lock("held", ttl=10, auto_renew=False)
        held.acquire()
        stats = locks.stats()["lean-stats"]
        n = 2 * metrics.QUEUED + 3
        assert stats["acquisitions"] == n + 1 and stats["releases"] == n  # the held one counts as acquired
        assert stats["hold_seconds"]["count"] == n and stats["hold_seconds"]["p50"] == pytest.approx(2.5)
        assert stats["ttl_used_ratio"]["count"] == n and stats["ttl_used_ratio"]["p50"] == pytest.approx(
            1 - (10 - 0.102 - 2.5) / 10
        )
        assert stats["wait_seconds"]["count"] == n + 1
        clock.advance(11)  # the held lease runs out: its release finds it gone, counted as an end, not a release
        with pytest.raises(lockkit.LockNotOwned):
            held.release()
        stats = locks.stats()["lean-stats"]
        assert stats["releases"] == n and stats["hold_seconds"]["count"] == n + 1 and stats["losses"] == 1


@pytest.mark.parametrize("name", ["plain", "a/b.c", "{tag}", "100%", "}{", "naïve ☃", "%7B"])
def test_lock_keys_built_lean_are_the_documented_keys(name: str) -> None:
    from lockkit.drivers.redis.keys import LockKeys, lock_keys

    escaped = name.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")
    base = f"pre:{{{escaped}}}".encode()
    expected = LockKeys(base, base + b":fence", base + b":wake", base + b":queue", base + b":alive", b"pre:client:")
    keys = lock_keys("pre:", name)
    assert keys == expected and type(keys) is LockKeys and keys.sharded is False
    assert keys.script_keys() == (expected.lock, expected.fence, expected.queue, expected.alive)
