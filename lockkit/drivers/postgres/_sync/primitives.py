"""What the blocking face of the PostgreSQL driver does its own way, written by hand (``../_async/primitives.py``
is its asyncio twin, with the same names).

* :class:`StateLock`: a real lock, as the blocking driver is called from many threads;
* :class:`Background`: the clean-up of an acquire that ended early runs inline, in the caller's thread; a
  :class:`~lockkit.driver.Cancel` cancels the session's running query from the thread that fires it;
* :class:`Watch`: a session's socket watched between statements by one thread per driver (started with the
  first session), so that a session the server ends is noticed at once; it watches a duplicate of the
  socket's descriptor and never reads from it. The same thread bounds each statement (:meth:`Watch.before`):
  one not answered in time has its socket shut down, which the caller's blocking wait in psycopg sees at once
  as the end of the connection (closing the connection from another thread would free it under the caller;
  a cancel request would need the server that is not answering).
"""

from __future__ import annotations

import contextlib
import os
import select
import selectors
import socket
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, ParamSpec

from psycopg import Connection

from ....driver import Cancel

__all__ = ["Background", "StateLock", "Watch"]

BUSY_PAUSE = 0.001
"""Seconds the watcher rests after a wake-up, so that a socket readable again at once cannot make it spin."""

IDLE_POLL = 1.0
"""Seconds the watcher waits at most between looks at the statements' bounds (an earlier bound wakes it)."""

P = ParamSpec("P")


class StateLock:
    def __init__(self) -> None:
        self._lock = threading.Lock()

    def __enter__(self) -> None:
        self._lock.acquire()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._lock.release()


class Background:
    def __init__(self) -> None:
        self._watcher: _Watcher | None = None
        self._lock = threading.Lock()

    def clean_up(self, step: Callable[P, None], *args: P.args, **kwargs: P.kwargs) -> None:
        """Run ``step`` now, in the caller's thread (the asyncio twin runs it in a task)."""
        step(*args, **kwargs)

    def on_cancel(self, cancel: Cancel | None, conn: Connection[Any]) -> Callable[[], None]:
        """Cancel ``conn``'s running query when ``cancel`` fires; returns the unhook."""
        if cancel is None:
            return lambda: None

        def fire() -> None:
            with contextlib.suppress(Exception):  # a connection already gone has no query left to cancel
                conn.cancel_safe(timeout=5.0)

        return cancel.on_cancel(fire)

    def watch(self, conn: Connection[Any], readable: Callable[[], None]) -> Watch:
        """Call ``readable()`` (on the watcher thread) whenever ``conn``'s socket has something to read."""
        with self._lock:
            if self._watcher is None:
                self._watcher = _Watcher()
            watcher = self._watcher
        return Watch(watcher, conn.fileno(), readable)

    def drain(self) -> None:
        return None  # clean-ups ran inline

    def stop(self) -> None:
        """Stop the watcher thread (after every watch was closed)."""
        with self._lock:
            watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.stop()


class Watch:
    """One session's socket in the watcher: out of it while a statement or a check runs (:meth:`before` /
    :meth:`pause`), and for good after :meth:`close`. Taking it out and back costs two ``epoll_ctl`` calls
    per statement (about 1 µs); leaving it in would wake the watcher thread with every reply, and that thread
    would then compete for the GIL with the caller just as its reply arrives (measured: lower and less fair
    handoffs under contention)."""

    def __init__(self, watcher: _Watcher, fd: int, readable: Callable[[], None]) -> None:
        self._watcher, self.readable = watcher, readable
        self._sock = socket.socket(fileno=os.dup(fd))
        self.fd = self._sock.fileno()
        self._lock = threading.Lock()
        self._holds = 0
        self._closed = False
        self._bounds: list[float] = []
        """When each statement in flight must have ended (``time.monotonic()``), else the socket is cut."""
        self.expired = False
        """A statement outlived its bound and the socket was shut down: the session is unusable from then on."""
        self._watcher.add(self)

    def pause(self) -> None:
        with self._lock:
            self._holds += 1
            if self._holds == 1 and not self._closed:
                self._watcher.arm(self, False)

    def resume(self) -> None:
        with self._lock:
            self._holds -= 1
            if self._holds == 0 and not self._closed:
                self._watcher.arm(self, True)

    def before(self, limit: float | None) -> float | None:
        """A statement starts: out of the watcher (see the class), and its socket is shut down (:meth:`cut`)
        unless it ends within ``limit`` seconds (``None``: no bound). Returns the ticket for :meth:`after`."""
        self.pause()
        if limit is None:
            return None
        until = time.monotonic() + max(0.0, limit)
        with self._lock:
            self._bounds.append(until)
        self._watcher.bound(until)
        return until

    def after(self, ticket: float | None) -> None:
        """The statement ended (see :meth:`before`)."""
        if ticket is not None:
            with self._lock, contextlib.suppress(ValueError):
                self._bounds.remove(ticket)
        self.resume()

    def due(self, now: float) -> float | None:
        """The earliest bound of the statements in flight (``None``: none), after cutting the socket if one
        has passed by ``now``."""
        with self._lock:
            if not self._bounds:
                return None
            first = min(self._bounds)
        if first <= now and not self.expired:
            self.cut()
        return first

    def cut(self) -> None:
        """Shut the session's socket for reading: the caller's wait in psycopg ends at once with the end of the
        stream (a broken connection, never used again). Nothing is sent to the server, which keeps the
        session and its locks until the socket closes (:meth:`close`)."""
        self.expired = True
        with contextlib.suppress(OSError):  # already closed: nothing left to cut
            self._sock.shutdown(socket.SHUT_RD)

    def pending(self) -> bool:
        """Whether the socket has bytes (or its end) waiting unread, right now; never reads them."""
        return _pending(self._sock)

    def close(self, linger: float = 0.0) -> None:
        """Stop watching; the duplicate (and with it the socket, once psycopg closed its own descriptor) closes
        after ``linger`` seconds, which is when the server learns that the session ended."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._watcher.forget(self)
        if linger > 0:
            timer = threading.Timer(linger, self._sock.close)
            timer.daemon = True
            timer.start()
        else:
            self._sock.close()


class _Watcher:
    """The thread that watches the idle session sockets of one blocking driver. Sockets are armed and disarmed
    from any thread (epoll allows it; elsewhere a selector, registered and unregistered); the thread only
    waits and calls back."""

    def __init__(self) -> None:
        self._epoll = select.epoll() if hasattr(select, "epoll") else None
        self._selector = None if self._epoll is not None else selectors.DefaultSelector()
        self._watches: dict[int, Watch] = {}
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        if self._epoll is not None:
            self._epoll.register(self._wake_r, select.EPOLLIN)
        else:
            assert self._selector is not None
            self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._stopping = False
        self._wake_at = float("inf")
        """When the thread looks at the bounds next (``inf`` while it is computing that): an earlier bound wakes it."""
        self._thread = threading.Thread(target=self._run, name="lockkit-postgres-watch", daemon=True)
        self._thread.start()

    def add(self, watch: Watch) -> None:
        self._watches[watch.fd] = watch
        if self._epoll is not None:
            self._epoll.register(watch.fd, select.EPOLLIN)
        else:
            self.arm(watch, True)

    def arm(self, watch: Watch, on: bool) -> None:
        with contextlib.suppress(KeyError, ValueError, OSError):
            if self._epoll is not None:
                self._epoll.modify(watch.fd, select.EPOLLIN if on else 0)
            elif on:
                assert self._selector is not None
                self._selector.register(watch.fd, selectors.EVENT_READ)
            else:
                assert self._selector is not None
                self._selector.unregister(watch.fd)

    def forget(self, watch: Watch) -> None:
        self._watches.pop(watch.fd, None)
        with contextlib.suppress(KeyError, ValueError, OSError):
            if self._epoll is not None:
                self._epoll.unregister(watch.fd)
            else:
                assert self._selector is not None
                self._selector.unregister(watch.fd)

    def bound(self, until: float) -> None:
        """A statement must end by ``until``: wake the thread if it would look later than that (rarely: a
        bound is usually the driver's timeout from now, later than the thread's next look)."""
        if until < self._wake_at:
            with contextlib.suppress(BlockingIOError, OSError):
                os.write(self._wake_w, b"b")

    def _timeout(self) -> float:
        """Cut every socket whose statement outlived its bound; the seconds until the next bound is due."""
        self._wake_at = float("inf")  # a bound added while we look wakes the poll below at once
        now = time.monotonic()
        nearest = now + IDLE_POLL
        for watch in list(self._watches.values()):
            due = watch.due(now)
            if due is not None and now < due < nearest:
                nearest = due
        self._wake_at = nearest
        return nearest - now

    def stop(self) -> None:
        self._stopping = True
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"x")
        if threading.current_thread() is not self._thread:
            self._thread.join(5)

    def _ready(self) -> list[int]:
        timeout = self._timeout()
        if self._epoll is not None:
            return [fd for fd, _ in self._epoll.poll(timeout)]
        assert self._selector is not None
        return [key.fd for key, _ in self._selector.select(timeout)]

    def _run(self) -> None:
        try:
            while not self._stopping:
                for fd in self._ready():
                    if fd == self._wake_r:
                        with contextlib.suppress(BlockingIOError, OSError):
                            os.read(self._wake_r, 4096)
                        continue
                    watch = self._watches.get(fd)
                    if watch is not None:
                        watch.readable()  # the driver pauses the watch while it checks the session
                time.sleep(BUSY_PAUSE)  # a socket readable again at once (a check not yet started): not a spin
        finally:
            if self._epoll is not None:
                self._epoll.close()
            if self._selector is not None:
                self._selector.close()
            os.close(self._wake_r)
            os.close(self._wake_w)


def _pending(sock: socket.socket) -> bool:
    try:
        sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True  # a socket in error: the session is gone, which the check will find
    return True  # a byte, or b"" at the end of the stream
