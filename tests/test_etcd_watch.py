"""The etcd driver's wake-ups (lockkit/drivers/etcd/watch.py) against a real etcd: one watch per lock range,
shared by the lock's waiters, never missing a predecessor's delete."""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from backends.servers import EtcdServer
from lockkit.drivers.etcd import watch as etcd_watch
from lockkit.drivers.etcd.client import EtcdClient, rpc
from lockkit.drivers.etcd.keys import name_range


@pytest.fixture
def client(etcd_server: EtcdServer) -> Iterator[EtcdClient]:
    c = EtcdClient([(etcd_server.host, etcd_server.port)])
    yield c
    c.close()


@pytest.fixture
def watcher(client: EtcdClient) -> Iterator[etcd_watch.Watcher]:
    w = etcd_watch.Watcher(client)
    yield w
    w.close()


def lock_range() -> tuple[bytes, bytes]:
    return name_range("/watch-test/", f"w-{uuid.uuid4().hex[:8]}")


def put(client: EtcdClient, key: bytes) -> int:
    return int(client.call("KV", "Put", rpc.PutRequest(key=key, value=b"v")).header.revision)


def delete(client: EtcdClient, key: bytes) -> int:
    return int(client.call("KV", "DeleteRange", rpc.DeleteRangeRequest(key=key)).header.revision)


def server_watchers(server: EtcdServer) -> int:
    """etcd's own count of registered watchers (its debugging gauge)."""
    _, body = server.http_get("/metrics")
    found = re.search(rb"^etcd_debugging_mvcc_watcher_total (\S+)$", body, re.M)
    assert found is not None
    return int(float(found.group(1)))


def test_a_delete_wakes_only_the_waiter_behind_that_key(client: EtcdClient, watcher: etcd_watch.Watcher) -> None:
    start, end = lock_range()
    first, second = start + b"a", start + b"b"
    seen = max(put(client, first), put(client, second))
    put(client, b"/watch-test-elsewhere")  # a write after the read: the lock's watch starts later than ``seen``
    behind_first, check_now = watcher.watch_after(first, seen, start, end)
    behind_second, check_second = watcher.watch_after(second, seen, start, end)
    assert check_now and check_second  # a delete in between would not be reported: look once before sleeping
    delete(client, first)
    assert behind_first.event.wait(5) and not behind_first.failed
    assert not behind_second.event.wait(0.2)
    delete(client, second)
    assert behind_second.event.wait(5)
    behind_first.cancel()
    behind_second.cancel()


def test_a_delete_delivered_before_the_waiter_subscribed_wakes_it_at_once(
    client: EtcdClient, watcher: etcd_watch.Watcher
) -> None:
    start, end = lock_range()
    key = start + b"pred"
    written = put(client, key)
    sentinel, _ = watcher.watch_after(key, written, start, end)  # opens the lock's watch
    gone = delete(client, key)
    assert sentinel.event.wait(5)  # the delete has reached this driver
    late, check_now = watcher.watch_after(key, gone - 1, start, end)  # read before the delete, subscribed after
    assert late.event.is_set() and not check_now
    fresh, check_now = watcher.watch_after(key, gone, start, end)  # read after the delete: a later one only
    assert not fresh.event.is_set() and not check_now
    put(client, key)
    delete(client, key)
    assert fresh.event.wait(5)
    for handle in (sentinel, late, fresh):
        handle.cancel()


def test_one_server_watch_per_lock_shared_by_its_waiters_and_freed_when_idle(
    fresh_etcd,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    # an etcd of its own: the watcher count below must not move with other tests' clients
    etcd_server = fresh_etcd()
    monkeypatch.setattr(etcd_watch, "LINGER", 0.2)
    client = EtcdClient([(etcd_server.host, etcd_server.port)])
    watcher = etcd_watch.Watcher(client)
    try:
        _watch_sharing_and_reaping(etcd_server, client, watcher)
    finally:
        watcher.close()
        client.close()


def _watch_sharing_and_reaping(etcd_server: EtcdServer, client: EtcdClient, watcher: etcd_watch.Watcher) -> None:
    start, end = lock_range()
    seen = put(client, start + b"x")
    before = server_watchers(etcd_server)
    handles = [watcher.watch_after(start + b"x", seen, start, end)[0] for _ in range(5)]
    assert server_watchers(etcd_server) == before + 1  # five waits, one server-side watcher
    for handle in handles:
        handle.cancel()
    deadline = time.monotonic() + 5
    while server_watchers(etcd_server) != before:  # freed LINGER after its last wait, with no other wait
        assert time.monotonic() < deadline, "the idle lock's watch was not cancelled on the server"
        time.sleep(0.05)
    again, _ = watcher.watch_after(start + b"x", seen, start, end)  # a later wait opens a new one
    assert server_watchers(etcd_server) == before + 1
    again.cancel()


def test_a_watch_refused_for_an_expired_stream_token_opens_a_fresh_stream(fresh_etcd) -> None:  # type: ignore[no-untyped-def]
    """etcd checks a stream's auth token at every watch create, and a stream keeps the token it opened with;
    with the token expired, the refused create must lead to a fresh stream, not to waiters polling."""
    import subprocess

    import lockkit

    server = fresh_etcd(extra_args=["--auth-token-ttl", "1"])

    def ctl(*args: str) -> None:
        subprocess.run(["etcdctl", *args], env=server.etcdctl_env(), capture_output=True, check=True, timeout=15)

    ctl("user", "add", "root:rootpw", "--interactive=false")
    ctl("role", "add", "root")
    ctl("user", "grant-role", "root", "root")
    ctl("role", "add", "lockkit")
    ctl("role", "grant-permission", "--prefix=true", "lockkit", "readwrite", "/lockkit/")
    ctl("user", "add", "lk:s3cr3t-XYZ", "--interactive=false")
    ctl("user", "grant-role", "lk", "lockkit")
    ctl("auth", "enable")
    url = f"etcd://lk:s3cr3t-XYZ@127.0.0.1:{server.port}"
    with lockkit.connect(url) as holder, lockkit.connect(url) as waiter:
        driver = waiter._backends["default"].driver  # type: ignore[attr-defined]

        def hand_over(name: str) -> lockkit.Lease:
            held = holder.lock(name, ttl=5)
            held.acquire(timeout=5)
            got: list[lockkit.Lease] = []
            thread = threading.Thread(target=lambda: got.append(waiter.lock(name, ttl=5).acquire(timeout=10)))
            thread.start()
            deadline = time.monotonic() + 10
            while holder.holder(name).waiters < 1:  # the waiter's key is queued (it watches right after)
                assert time.monotonic() < deadline, "the waiter never queued"
                time.sleep(0.01)
            held.release()
            thread.join(10)
            assert got and got[0].valid
            return got[0]

        hand_over("first")
        stream = driver._watcher._stream
        # Ordinary calls move to a new token now; the stream keeps the one it opened with, which nobody uses
        # from here on, so it expires (a simple token lives while it is used; the session's keepalives would
        # otherwise keep a shared one alive).
        driver._client._authenticate(driver._client._current)
        time.sleep(2.5)
        hand_over("second")
        assert not stream.alive  # the refused create closed the stale stream...
        hand_over("third")
        assert driver._watcher._stream is not stream and driver._watcher._stream.alive  # ...and waits go on
