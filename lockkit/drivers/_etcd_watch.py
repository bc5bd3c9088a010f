"""One multiplexed etcd Watch stream per driver, used by waiters to sleep until their predecessor goes.

A waiter registers ``watch(key)`` and sleeps on the returned handle's ``event``.
The event is set when the key is deleted (the stream filters out puts), when
etcd cancels the watch (compaction, permission), or when the stream breaks.
Watches start "now" (revision 0) rather than from a past revision: etcd serves
a watch that starts in the past from its unsynced group, which it catches up
only every 100 ms, and that would add up to 100 ms to every hand-off under
contention. Instead ``created`` is set with the revision the watch started at,
and the waiter re-checks if anything was written since it read its
predecessor. Every wake-up is followed
by the waiter's own re-check transaction, so a spurious wake costs one read and
can never grant a lock. One reader thread serves every waiter of the driver:
twenty waiters cost one stream, not twenty (the etcd Go client does the same).

etcd answers watch-create requests on a stream in the order they were sent
(this proto predates client-chosen watch ids), so pending creates are matched
first in, first out.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
from collections.abc import Iterator
from typing import Any

from ..errors import BackendUnavailable
from ._etcd_client import EtcdClient, rpc

__all__ = ["Watch", "Watcher"]

log = logging.getLogger("lockkit")


class Watch:
    """A waiter's handle: ``event`` is set on the predecessor's delete or on any watch failure."""

    def __init__(self, stream: _Stream) -> None:
        self.event = threading.Event()
        self.created = threading.Event()
        self.revision = 0
        """The store revision when the watch started: every later delete is reported."""
        self.failed = False
        self.watch_id: int | None = None
        self.cancelled = False
        self._stream = stream

    def fire(self, failed: bool = False) -> None:
        self.failed = self.failed or failed
        self.event.set()
        self.created.set()

    def cancel(self) -> None:
        """Stop watching (idempotent); the server-side watcher is cancelled too."""
        self._stream.cancel(self)


class _Stream:
    def __init__(self, client: EtcdClient) -> None:
        self._requests: queue.Queue[Any] = queue.Queue()
        self._mutex = threading.Lock()
        self._pending: collections.deque[Watch] = collections.deque()
        self._active: dict[int, Watch] = {}
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

    def add(self, key: bytes) -> Watch:
        handle = Watch(self)
        create = rpc.WatchCreateRequest(key=key, filters=[rpc.WatchCreateRequest.NOPUT])
        with self._mutex:
            if not self.alive:
                handle.fire(failed=True)
                return handle
            self._pending.append(handle)
            self._requests.put(rpc.WatchRequest(create_request=create))
        return handle

    def cancel(self, handle: Watch) -> None:
        with self._mutex:
            if handle.cancelled:
                return
            handle.cancelled = True
            if handle.watch_id is not None and self._active.pop(handle.watch_id, None) is not None and self.alive:
                cancel = rpc.WatchCancelRequest(watch_id=handle.watch_id)
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
        with self._mutex:
            if response.created:
                handle = self._pending.popleft() if self._pending else None
                if handle is None:
                    return
                if response.canceled:
                    handle.fire(failed=True)  # refused (e.g. permission): the waiter re-checks and backs off
                    return
                handle.watch_id = int(response.watch_id)
                handle.revision = int(response.header.revision)
                handle.created.set()
                if handle.cancelled:
                    cancel = rpc.WatchCancelRequest(watch_id=handle.watch_id)
                    self._requests.put(rpc.WatchRequest(cancel_request=cancel))
                    return
                self._active[handle.watch_id] = handle
                # a created reply carries no events; they follow in later messages
                return
            found = self._active.get(int(response.watch_id))
            if found is None:
                return
            if response.canceled:
                self._active.pop(int(response.watch_id), None)
                found.fire(failed=True)
            elif len(response.events):
                found.fire()

    def close(self) -> None:
        with self._mutex:
            if not self.alive:
                return
            self.alive = False
            handles = list(self._pending) + list(self._active.values())
            self._pending.clear()
            self._active.clear()
            self._requests.put(None)
        self._call.cancel()
        for handle in handles:
            handle.fire(failed=True)


class Watcher:
    """Hands out watches on the driver's current stream; opens a new stream when the last one broke."""

    def __init__(self, client: EtcdClient) -> None:
        self._client = client
        self._mutex = threading.Lock()
        self._stream: _Stream | None = None
        self._closed = False

    def watch(self, key: bytes) -> Watch:
        with self._mutex:
            if self._stream is None or not self._stream.alive:
                if self._closed:
                    raise BackendUnavailable("the etcd driver is closed")
                self._stream = _Stream(self._client)
            stream = self._stream
        return stream.add(key)

    def watch_after(self, key: bytes, seen: int) -> tuple[Watch, bool]:
        """Watch ``key`` from now; also say whether to re-check (anything written since we read it at ``seen``)."""
        handle = self.watch(key)
        if not handle.created.wait(self._client.timeout):
            handle.fire(failed=True)
            return handle, False
        return handle, handle.revision > seen  # the delete may have come before the watch started

    def reset(self) -> None:
        """Drop the current stream (waiters wake and re-check); the next watch opens a fresh one."""
        with self._mutex:
            stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()

    def close(self) -> None:
        with self._mutex:
            self._closed = True
            stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()
