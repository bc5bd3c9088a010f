"""Waiters' wake-ups: one multiplexed etcd Watch stream per driver, one watch per contended lock on it.

A waiter calls ``watch_after(pred, seen, start, end)`` and sleeps on the returned
handle's ``event``, which is set when its predecessor key ``pred`` is deleted
after revision ``seen`` (the revision of the read that named it), when the watch
fails (etcd cancelled it: compaction, permission), or when the stream breaks.
Every wake-up is followed by the waiter's own re-check transaction, so a
spurious wake costs one read and can never grant a lock.

**One watch per lock, not per wait.** The server-side watch covers the lock's
whole key range (``start``..``end``, deletes only) and is shared by every waiter
of that lock in this driver; it lives while the lock has waiters here, plus
:data:`LINGER` seconds (one timer thread, alive only while some watch is idle,
cancels it then). A watch per wait was slower in two ways. Each wait paid a
create round trip. And etcd 3.4 reads its current revision before registering a
new watcher: when a write lands in between (under contention, often), the
watcher goes to the "unsynced" group, whose events a catch-up loop delivers only
every 100 ms, which stalled about one hand-off in fifty by up to 100 ms (traced
across the contending processes). A long-lived watch is synced once and stays
synced.

**No delete is missed.** The watch reports every delete after the revision it
started at; a waiter whose read predates that start must re-check at once
(``watch_after`` returns ``check_now``). A delete that the stream delivered just
before the waiter subscribed is remembered (the last :data:`RECENT` deletes per
lock), so subscribing fires at once if ``pred`` was deleted after ``seen``;
should ``seen`` be older than what is remembered, ``check_now`` is returned
instead.

One reader thread serves the stream (the etcd Go client multiplexes the same
way). etcd answers watch-create requests on a stream in the order they were sent
(this proto predates client-chosen watch ids), so pending creates are matched
first in, first out.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from ...errors import BackendUnavailable
from .client import EtcdClient, rpc

__all__ = ["LINGER", "RECENT", "Watch", "Watcher"]

log = logging.getLogger("lockkit")

LINGER = 2.0
"""Seconds a lock's watch outlives its last waiter here: a hot lock keeps it, an idle one frees it."""
RECENT = 256
"""Deletes remembered per watched lock, for a waiter that subscribes just after its predecessor went."""


class Watch:
    """A waiter's handle: ``event`` is set on its predecessor's delete or on any watch failure."""

    def __init__(self, key: bytes, after: int, on_cancel: Callable[[Watch], None]) -> None:
        self.key = key
        self.after = after
        self.event = threading.Event()
        self.failed = False
        self.deleted = False
        """The key's delete was seen (set before ``event``): a waiter blocked by several keys counts them."""
        self.cancelled = False
        self._on_cancel = on_cancel

    def fire(self, failed: bool = False) -> None:
        self.failed = self.failed or failed
        self.event.set()

    def cancel(self) -> None:
        """Stop waiting (idempotent)."""
        self._on_cancel(self)


class _LockWatch:
    """The server-side watch on one lock's key range, shared by this driver's waiters of that lock."""

    def __init__(self, start: bytes, end: bytes) -> None:
        self.start, self.end = start, end
        self.created = threading.Event()
        self.revision = 0
        """The store revision when the watch started: every later delete in the range is reported."""
        self.watch_id: int | None = None
        self.cancelled = False
        self.users = 0
        """Waiters that hold (or are about to take) a subscription; guarded by the Watcher's mutex."""
        self.idle_since = time.monotonic()
        self._mutex = threading.Lock()
        self._failed = False
        self._waiting: dict[bytes, list[Watch]] = {}
        self._recent: collections.OrderedDict[bytes, int] = collections.OrderedDict()
        self._horizon = 0
        """Every delete at or after this revision is in ``_recent`` (or was handed to a waiter)."""

    @property
    def failed(self) -> bool:
        return self._failed

    def started(self, revision: int) -> None:
        self.revision = revision
        self._horizon = revision + 1  # the watch reports deletes after ``revision``
        self.created.set()

    def subscribe(self, key: bytes, after: int, on_cancel: Callable[[Watch], None]) -> tuple[Watch, bool]:
        """A handle fired by a delete of ``key`` after revision ``after``; also whether to re-check at once."""
        handle = Watch(key, after, on_cancel)
        with self._mutex:
            if self._failed:
                handle.fire(failed=True)
                return handle, False
            # Deletes after ``after`` but before what this watch reports or remembers would be missed:
            # the caller must re-check now (the handle still fires for any later delete).
            check_now = after + 1 < self._horizon
            if not check_now and self._recent.get(key, 0) > after:
                handle.deleted = True
                handle.fire()  # it went just before we subscribed
                return handle, False
            self._waiting.setdefault(key, []).append(handle)
        return handle, check_now

    def unsubscribe(self, handle: Watch) -> None:
        with self._mutex:
            waiters = self._waiting.get(handle.key)
            if waiters is not None and handle in waiters:
                waiters.remove(handle)
                if not waiters:
                    del self._waiting[handle.key]

    def deliver(self, events: Any) -> None:
        fired: list[Watch] = []
        with self._mutex:
            for event in events:
                key, revision = bytes(event.kv.key), int(event.kv.mod_revision)
                self._recent.pop(key, None)
                self._recent[key] = revision
                while len(self._recent) > RECENT:
                    _, oldest = self._recent.popitem(last=False)
                    self._horizon = oldest + 1
                waiters = self._waiting.get(key)
                if waiters:
                    keep = [h for h in waiters if h.after >= revision]
                    fired += [h for h in waiters if h.after < revision]
                    if keep:
                        self._waiting[key] = keep
                    else:
                        del self._waiting[key]
        for handle in fired:
            handle.deleted = True
            handle.fire()

    def fail(self) -> None:
        """The watch is gone (cancelled by etcd, or its stream broke): wake every waiter to re-check."""
        with self._mutex:
            self._failed = True
            waiting, self._waiting = self._waiting, {}
        self.created.set()
        for handles in waiting.values():
            for handle in handles:
                handle.fire(failed=True)


class _Stream:
    def __init__(self, client: EtcdClient) -> None:
        self._requests: queue.Queue[Any] = queue.Queue()
        self._mutex = threading.Lock()
        self._pending: collections.deque[_LockWatch] = collections.deque()
        self._active: dict[int, _LockWatch] = {}
        self.alive = True
        self._call = client.watch_stream(self._feed())
        self._reader = threading.Thread(target=self._read, name="lockkit-etcd-watch", daemon=True)
        self._reader.start()

    def _feed(self) -> Iterator[Any]:
        while True:
            item = self._requests.get()
            if item is None:
                return
            yield item

    def add(self, start: bytes, end: bytes) -> _LockWatch:
        watch = _LockWatch(start, end)
        create = rpc.WatchCreateRequest(key=start, range_end=end, filters=[rpc.WatchCreateRequest.NOPUT])
        with self._mutex:
            if not self.alive:
                watch.fail()
                return watch
            self._pending.append(watch)
            self._requests.put(rpc.WatchRequest(create_request=create))
        return watch

    def cancel(self, watch: _LockWatch) -> None:
        with self._mutex:
            if watch.cancelled:
                return
            watch.cancelled = True
            if watch.watch_id is not None and self._active.pop(watch.watch_id, None) is not None and self.alive:
                cancel = rpc.WatchCancelRequest(watch_id=watch.watch_id)
                self._requests.put(rpc.WatchRequest(cancel_request=cancel))
            # a still-pending create is cancelled when its "created" reply arrives

    def _read(self) -> None:
        try:
            for response in self._call:
                self._dispatch(response)
        except Exception as exc:  # the stream broke (server gone, cancelled by close): wake everyone
            if self.alive:
                log.debug("lockkit: etcd watch stream ended: %s", exc)
        finally:
            self.close()

    def _dispatch(self, response: Any) -> None:
        found: _LockWatch | None = None
        failed: _LockWatch | None = None
        with self._mutex:
            if response.created:
                watch = self._pending.popleft() if self._pending else None
                if watch is None:
                    return
                if response.canceled:
                    failed = watch  # refused (e.g. permission): its waiters re-check and back off
                else:
                    watch.watch_id = int(response.watch_id)
                    if watch.cancelled:
                        cancel = rpc.WatchCancelRequest(watch_id=watch.watch_id)
                        self._requests.put(rpc.WatchRequest(cancel_request=cancel))
                    else:
                        self._active[watch.watch_id] = watch
                        watch.started(int(response.header.revision))
                    # a created reply carries no events; they follow in later messages
            else:
                found = self._active.get(int(response.watch_id))
                if found is None:
                    return
                if response.canceled:
                    self._active.pop(int(response.watch_id), None)
                    failed, found = found, None
        # waiters are woken outside the stream's mutex (a lock watch takes its own)
        if failed is not None:
            if response.created:
                # A refused create: etcd checks the stream's auth token on every create, and a stream keeps
                # the token it was opened with, which expires (300 s idle by default) while ordinary calls
                # re-authenticate. Closing the stream (before waking the waiters, so that their next wait
                # opens a new one) lets it come back with the current token; for a real permission denial,
                # the waiters' backoff keeps this from becoming a storm.
                self.close()
            failed.fail()
        elif found is not None and len(response.events):
            found.deliver(response.events)

    def close(self) -> None:
        with self._mutex:
            if not self.alive:
                return
            self.alive = False
            watches = list(self._pending) + list(self._active.values())
            self._pending.clear()
            self._active.clear()
            self._requests.put(None)
        self._call.cancel()
        for watch in watches:
            watch.fail()


class Watcher:
    """Hands out waits on the driver's current stream; opens a new stream when the last one broke."""

    def __init__(self, client: EtcdClient) -> None:
        self._client = client
        self._mutex = threading.Lock()
        self._stream: _Stream | None = None
        self._locks: dict[tuple[bytes, bytes], _LockWatch] = {}
        self._idle: collections.OrderedDict[tuple[bytes, bytes], _LockWatch] = collections.OrderedDict()
        """Lock watches nobody waits on, oldest first: cancelled :data:`LINGER` seconds after their last wait."""
        self._reaper: threading.Timer | None = None
        self._closed = False

    def _lock_watch(self, start: bytes, end: bytes) -> tuple[_Stream, _LockWatch]:
        """The live watch of this lock range (made if needed), with one user reserved for the caller."""
        with self._mutex:
            if self._stream is None or not self._stream.alive:
                if self._closed:
                    raise BackendUnavailable("the etcd driver is closed; open a new locker with lockkit.connect()")
                self._stream = _Stream(self._client)
                self._locks, self._idle = {}, collections.OrderedDict()
            stream = self._stream
            watch = self._locks.get((start, end))
            if watch is None or watch.cancelled or watch.failed:
                watch = self._locks[(start, end)] = stream.add(start, end)
            watch.users += 1
            self._idle.pop((start, end), None)
        return stream, watch

    def _release(self, watch: _LockWatch) -> None:
        with self._mutex:
            watch.users -= 1
            if watch.users == 0 and self._locks.get((watch.start, watch.end)) is watch:
                watch.idle_since = time.monotonic()
                self._idle[(watch.start, watch.end)] = watch
                if self._reaper is None and not self._closed:
                    self._schedule_reaper(LINGER)

    def _schedule_reaper(self, delay: float) -> None:
        # one short-lived timer thread at a time, and only while some lock watch is idle
        self._reaper = threading.Timer(delay, self._reap)
        self._reaper.daemon = True
        self._reaper.name = "lockkit-etcd-watch-reaper"
        self._reaper.start()

    def _reap(self) -> None:
        """Cancel the watches of locks nobody has waited on for LINGER seconds."""
        with self._mutex:
            self._reaper = None
            stream, now = self._stream, time.monotonic()
            expired: list[_LockWatch] = []
            while self._idle:
                key, watch = next(iter(self._idle.items()))
                if now - watch.idle_since < LINGER:
                    self._schedule_reaper(LINGER - (now - watch.idle_since))
                    break
                del self._idle[key]
                self._locks.pop(key, None)
                expired.append(watch)
        if stream is not None:
            for watch in expired:
                stream.cancel(watch)

    def watch_after(self, key: bytes, seen: int, start: bytes, end: bytes) -> tuple[Watch, bool]:
        """Wait for ``key``'s delete after revision ``seen`` (``start``..``end``: the lock's key range).

        Also returns whether to re-check at once: the lock's watch started after ``seen``, so a delete
        between the two would not be reported.
        """
        _, watch = self._lock_watch(start, end)
        done = threading.Lock()

        def cancel(handle: Watch) -> None:
            with done:
                if handle.cancelled:
                    return
                handle.cancelled = True
            watch.unsubscribe(handle)
            self._release(watch)

        if not watch.created.wait(self._client.timeout):
            handle = Watch(key, seen, cancel)
            handle.fire(failed=True)
            return handle, False
        handle, check_now = watch.subscribe(key, seen, cancel)
        return handle, check_now or watch.revision > seen

    def reset(self) -> None:
        """Drop the current stream (waiters wake and re-check); the next wait opens a fresh one."""
        with self._mutex:
            stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()

    def close(self) -> None:
        with self._mutex:
            self._closed = True
            stream, self._stream = self._stream, None
            reaper, self._reaper = self._reaper, None
        if reaper is not None:
            reaper.cancel()
        if stream is not None:
            stream.close()
