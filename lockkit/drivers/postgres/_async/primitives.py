"""What the asyncio face of the PostgreSQL driver does its own way, written by hand (``../_sync/primitives.py``
is its blocking twin, with the same names).

* :class:`StateLock`: the driver's bookkeeping is changed between awaits only, on one event loop, so this
  face needs no lock (the blocking face, called from many threads, does);
* :class:`Background`: the clean-up of an acquire that ended early (unlock what a cancelled wait may have been
  granted) runs in a task of its own here, so a cancelled caller is not held up by a round trip; and a
  :class:`~lockkit.driver.Cancel` fired from another thread cancels the session's running query;
* :class:`Watch`: a session's socket watched between statements, so that a session the server ends (a
  restart, ``pg_terminate_backend``) is noticed at once rather than at the next heartbeat. It watches a
  duplicate of the socket's descriptor, so that psycopg's own reader on the original is left alone. It also
  bounds each statement (:meth:`Watch.before`): one not answered in time has its socket shut down, which
  psycopg's wait sees at once as the end of the connection (a timer on the event loop; no thread, and no
  round trip: a cancel request would need the server that is not answering).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any, ParamSpec

from psycopg import AsyncConnection

from ....driver import Cancel

__all__ = ["Background", "StateLock", "Watch"]

P = ParamSpec("P")


class StateLock:
    def __enter__(self) -> None:
        return None

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None


class Background:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def clean_up(self, step: Callable[P, Coroutine[Any, Any, None]], *args: P.args, **kwargs: P.kwargs) -> None:
        """Run ``step`` in a task of its own (a cancelled caller must not wait for it); :meth:`drain` waits."""
        task = asyncio.get_running_loop().create_task(step(*args, **kwargs))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def on_cancel(self, cancel: Cancel | None, conn: AsyncConnection[Any]) -> Callable[[], None]:
        """Cancel ``conn``'s running query when ``cancel`` fires (from any thread); returns the unhook."""
        if cancel is None:
            return lambda: None
        loop = asyncio.get_running_loop()

        def fire() -> None:
            loop.call_soon_threadsafe(self.clean_up, _cancel_query, conn)

        return cancel.on_cancel(fire)

    def watch(self, conn: AsyncConnection[Any], readable: Callable[[], None]) -> Watch:
        """Call ``readable()`` (on the event loop) whenever ``conn``'s socket has something to read."""
        return Watch(asyncio.get_running_loop(), conn.fileno(), readable)

    async def drain(self) -> None:
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def stop(self) -> None:
        """Nothing to stop: the watches ran on the event loop."""


async def _cancel_query(conn: AsyncConnection[Any]) -> None:
    with contextlib.suppress(Exception):  # a connection already gone has no query left to cancel
        await conn.cancel_safe(timeout=5.0)


class Watch:
    """A reader on a duplicate of a session's socket: :meth:`pause` while a check runs, :meth:`close` at the
    end (the duplicate would otherwise report the closed socket as readable for ever)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int, readable: Callable[[], None]) -> None:
        self._loop, self._readable = loop, readable
        self._sock = socket.socket(fileno=os.dup(fd))
        self._fd = self._sock.fileno()
        self._closed = False
        self.expired = False
        """A statement outlived its bound and the socket was shut down: the session is unusable from then on."""
        loop.add_reader(self._fd, readable)

    def pause(self) -> None:
        if not self._closed:
            self._loop.remove_reader(self._fd)

    def resume(self) -> None:
        if not self._closed:
            self._loop.add_reader(self._fd, self._readable)

    def before(self, limit: float | None) -> asyncio.TimerHandle | None:
        """A statement starts: its reply will make the socket readable, which the driver ignores while the
        session is busy (cheaper than taking the reader out and back for every statement). Unless it ends
        within ``limit`` seconds (``None``: no bound) the socket is shut down (:meth:`cut`). Returns the ticket
        for :meth:`after`."""
        if limit is None:
            return None
        return self._loop.call_later(max(0.0, limit), self.cut)

    def after(self, ticket: asyncio.TimerHandle | None) -> None:
        """The statement ended (see :meth:`before`)."""
        if ticket is not None:
            ticket.cancel()

    def cut(self) -> None:
        """Shut the session's socket for reading: psycopg's wait for the reply ends at once with the end of the
        stream (a broken connection, never used again). Nothing is sent to the server, which keeps the
        session and its locks until the socket closes (:meth:`close`)."""
        self.expired = True
        with contextlib.suppress(OSError):  # already closed: nothing left to cut
            self._sock.shutdown(socket.SHUT_RD)

    def pending(self) -> bool:
        """Whether the socket has bytes (or its end) waiting unread, right now; never reads them."""
        try:
            self._sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True  # a socket in error: the session is gone, which the check will find
        return True  # a byte, or b"" at the end of the stream

    def close(self, linger: float = 0.0) -> None:
        """Stop watching; the duplicate (and with it the socket, once psycopg closed its own descriptor) closes
        after ``linger`` seconds, which is when the server learns that the session ended."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):  # a loop already closed has no reader left
            self._loop.remove_reader(self._fd)
        if linger > 0:
            self._loop.call_later(linger, self._sock.close)
        else:
            self._sock.close()
