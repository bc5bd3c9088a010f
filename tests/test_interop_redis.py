"""A raw Redis client written from docs/interop.md alone shares ``redis://`` locks with lockkit (issue 16).

The client is the Python block of docs/interop.md that starts with ``CLIENT_MARK``, executed as it stands (so the
page cannot drift from what is tested); it imports redis-py and nothing of lockkit. Against a real server:
exclusion both ways, the raw waiter woken (granted) by lockkit's release, one FIFO queue mixing raw and lockkit
waiters, and the release's handling of waiter ids (the documented grammar is granted; an id outside it is left
queued, never dropped).
"""

from __future__ import annotations

import re
import secrets
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

import lockkit
from backends.servers import RedisServer
from lockkit import LockTimeout
from lockkit.drivers.redis.flow import WAITER_ID, waiter_id
from lockkit.drivers.redis.keys import lock_keys

DOC = Path(__file__).resolve().parent.parent / "docs" / "interop.md"
CLIENT_MARK = "# A lockkit-compatible redis:// lock written from docs/interop.md alone"
SKETCH_MARK = "# -- the client ends here"
QUIET = 1.0
"""How long a blocked contender must stay blocked to count as excluded (seconds)."""


def _client_source() -> str:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    (source,) = [b for b in blocks if b.startswith(CLIENT_MARK)]
    return source.split(SKETCH_MARK)[0]


@pytest.fixture(scope="module")
def doc_client() -> dict[str, Any]:
    source = _client_source()
    assert not re.search(r"^\s*(import|from)\s+lockkit", source, re.M)  # the client knows only the page
    namespace: dict[str, Any] = {"__name__": "raw_redis_client"}
    exec(compile(source, str(DOC), "exec"), namespace)  # the page's own client, as documented
    return namespace


@pytest.fixture
def rclient(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis(host=redis_server.host, port=redis_server.port, socket_timeout=5)
    yield client
    client.close()


@pytest.fixture
def locks(redis_server: RedisServer) -> Iterator[lockkit.Locker]:
    locker = lockkit.connect(redis_server.url)
    yield locker
    locker.close()


def name() -> str:
    return f"interop/{uuid.uuid4().hex[:8]} {{v1.2}}%"  # a slash, a dot, a space, braces and a percent


def raw_lock(doc_client: dict[str, Any], client: redis.Redis, lock_name: str, **kw: Any) -> Any:
    return doc_client["FairLock"](client, lock_name, **kw)


def test_the_page_escapes_names_as_lockkit_does(doc_client: dict[str, Any], rclient: redis.Redis) -> None:
    n = name()
    raw = raw_lock(doc_client, rclient, n)
    assert [k.encode() for k in raw.keys] == list(lock_keys("lockkit:", n).script_keys())
    assert raw.wake.encode() == lock_keys("lockkit:", n).channel


def test_raw_holder_excludes_lockkit(doc_client: dict[str, Any], rclient: redis.Redis, locks: lockkit.Locker) -> None:
    n = name()
    raw = raw_lock(doc_client, rclient, n)
    fence = raw.acquire(timeout=1)
    assert fence is not None
    with pytest.raises(LockTimeout):
        locks.lock(n).acquire(timeout=QUIET)
    assert locks.holder(n).fencing_token == fence  # type: ignore[union-attr]
    assert raw.renew() == fence
    assert raw.release()
    with locks.lock(n) as lease:
        assert lease.fencing_token == fence + 1


def test_lockkit_holder_excludes_raw(doc_client: dict[str, Any], rclient: redis.Redis, locks: lockkit.Locker) -> None:
    n = name()
    raw = raw_lock(doc_client, rclient, n)
    with locks.lock(n) as lease:
        assert raw.acquire(timeout=0) is None
        started = time.monotonic()
        assert raw.acquire(timeout=QUIET) is None  # queued, then left at its deadline
        assert time.monotonic() - started >= QUIET - 0.05
        assert rclient.llen(raw.keys[2]) == 0  # LEAVE took its entry out
    fence = raw.acquire(timeout=1)
    assert fence == lease.fencing_token + 1
    assert raw.release()


def test_raw_waiter_is_woken_by_lockkit_release(
    doc_client: dict[str, Any], rclient: redis.Redis, locks: lockkit.Locker
) -> None:
    n = name()
    raw = raw_lock(doc_client, rclient, n)
    got: list[int | None] = []
    held = locks.lock(n, ttl=30)
    lease = held.acquire()
    waiter = threading.Thread(target=lambda: got.append(raw.acquire(timeout=10)))
    waiter.start()
    deadline = time.monotonic() + 5
    while rclient.llen(raw.keys[2]) == 0 and time.monotonic() < deadline:  # the raw waiter is queued
        time.sleep(0.01)
    assert rclient.llen(raw.keys[2]) == 1
    released = time.monotonic()
    held.release()  # lockkit's release grants the queued raw waiter on its client channel
    waiter.join(10)
    assert time.monotonic() - released < 1.0  # woken, not its re-check at the 30 s TTL
    assert got == [lease.fencing_token + 1]
    assert rclient.get(raw.keys[0]) == raw.token.encode()
    assert raw.release()


def test_one_fifo_queue_mixing_raw_and_lockkit_waiters(
    doc_client: dict[str, Any], rclient: redis.Redis, redis_server: RedisServer
) -> None:
    n = name()
    order: list[str] = []
    lock = threading.Lock()
    lockers = [lockkit.connect(redis_server.url) for _ in range(2)]
    try:
        first = lockers[0].lock(n, ttl=30)
        first.acquire()

        def raw_worker(label: str) -> None:
            raw = raw_lock(doc_client, redis.Redis(host=redis_server.host, port=redis_server.port), n)
            assert raw.acquire(timeout=20) is not None
            with lock:
                order.append(label)
            time.sleep(0.05)
            assert raw.release()

        def lk_worker(label: str, locker: lockkit.Locker) -> None:
            mine = locker.lock(n, ttl=30)
            mine.acquire(timeout=20)
            with lock:
                order.append(label)
            time.sleep(0.05)
            mine.release()

        plan: list[tuple[str, Any]] = []
        for i in range(6):
            label = f"{'raw' if i % 2 == 0 else 'lk'}{i}"
            if i % 2 == 0:
                plan.append((label, threading.Thread(target=raw_worker, args=(label,))))
            else:
                plan.append((label, threading.Thread(target=lk_worker, args=(label, lockers[i % 4 // 2]))))
        for i, (_, thread) in enumerate(plan):
            thread.start()
            deadline = time.monotonic() + 5  # each one queued before the next arrives: arrival order is known
            while rclient.llen(lock_keys("lockkit:", n).queue) < i + 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert rclient.llen(lock_keys("lockkit:", n).queue) == i + 1
        first.release()
        for _, thread in plan:
            thread.join(30)
        assert order == [label for label, _ in plan]
    finally:
        for locker in lockers:
            locker.close()


# -- the waiter-id grammar that lockkit's release parses ------------------------------------------------------


def test_lockkit_waiter_ids_follow_the_documented_grammar() -> None:
    assert WAITER_ID.fullmatch(waiter_id(secrets.token_hex(6), 10.0, lockkit.lock_core.new_token()))
    assert WAITER_ID.fullmatch(waiter_id("x", 0.0001, "t"))
    for bad in ("g.10.", ".10.t", "a.b.10.t", "a.010.t", "a.0.t", "a.1234567890123456.t", "a.10.t t", "a-.10"):
        assert not WAITER_ID.fullmatch(bad), bad


def _queue_foreign(client: redis.Redis, lock_name: str, wid: str) -> None:
    """A foreign waiter's entry, queued as docs/interop.md's ACQUIRE does it (alive for 10 s)."""
    keys = lock_keys("lockkit:", lock_name)
    seconds, micros = client.time()
    client.rpush(keys.queue, wid)
    client.zadd(keys.alive, {wid: seconds * 1000 + micros // 1000 + 10_000})
    client.pexpire(keys.queue, 20_000)
    client.pexpire(keys.alive, 20_000)


def test_release_grants_a_waiter_whose_client_id_is_not_hex(rclient: redis.Redis, locks: lockkit.Locker) -> None:
    # The grammar allows "go-worker_7"; the release's old pattern (%x+) took only hex and dropped such a waiter.
    n = name()
    wid = "go-worker_7.5000.tok-1"
    sub = rclient.pubsub()
    sub.subscribe("lockkit:client:go-worker_7")
    assert sub.get_message(timeout=2)["type"] == "subscribe"  # type: ignore[index]
    held = locks.lock(n)
    lease = held.acquire()
    _queue_foreign(rclient, n, wid)
    held.release()
    message = sub.get_message(timeout=2)
    sub.close()
    assert message is not None and message["data"] == f"{wid} {lease.fencing_token + 1}".encode()
    keys = lock_keys("lockkit:", n)
    assert rclient.get(keys.lock) == b"tok-1"
    assert 0 < rclient.pttl(keys.lock) <= 5000


def test_release_leaves_an_unparseable_waiter_queued_and_wakes_everyone(
    rclient: redis.Redis, locks: lockkit.Locker
) -> None:
    # An id outside the grammar cannot be granted; the old release dropped it silently and granted the next.
    n = name()
    keys = lock_keys("lockkit:", n)
    wid = "not a waiter id"
    sub = rclient.pubsub()
    sub.subscribe(keys.channel)
    assert sub.get_message(timeout=2)["type"] == "subscribe"  # type: ignore[index]
    held = locks.lock(n)
    held.acquire()
    _queue_foreign(rclient, n, wid)
    held.release()
    message = sub.get_message(timeout=2)
    sub.close()
    assert message is not None and message["data"] == b""  # everyone woken to look again
    assert rclient.get(keys.lock) is None  # freed, for the head to take
    assert rclient.lrange(keys.queue, 0, -1) == [wid.encode()]  # still queued, at the head
    assert locks.lock(n).try_acquire() is None  # a newcomer waits behind it
