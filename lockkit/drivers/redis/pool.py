"""A lean blocking pool of lockkit's own connections (:mod:`._sync.connection`) for the lock hot path.

redis-py's pools cost ~40 µs per checkout and ~20 µs per return on this project's machines (metrics
bookkeeping on every call, a ``queue.Queue`` with its condition variable, and a ``can_read()`` probe that
raises and catches a timeout exception), which is as much as a whole loopback round trip: a lock's acquire
plus release paid it twice. This pool keeps what matters from them and nothing else:

* last-in first-out reuse (the warmest connection, and idle ones age out on
  the server side rather than all of them staying half-used);
* at most ``size`` connections; a caller waits up to ``wait`` seconds for one;
* before reuse, the connection's :meth:`~._sync.connection.Connection.ready`: a zero-timeout ``select`` on
  the socket finds a connection that the server or a middlebox closed while it sat idle (C-12, it is
  readable: EOF), which is reconnected *before* a command is sent on it, so even a non-idempotent acquire
  never goes out on a dead connection; one idle for longer than ``health_check_interval`` is PINGed;
* fork safety: a child never uses its parent's connections (it closes its copies of their sockets, never
  shutting them down), and starts with an empty pool. An ``os.register_at_fork`` hook empties every pool in
  the child (made by ``os.fork``, which ``multiprocessing``'s fork start method uses too) before any of its
  code runs, so a checkout asks no ``getpid`` (issue 17: two system calls per master per command were that);
  the hook makes the child a new mutex too, as one held by another of the parent's threads at the fork would
  never be released in the child.

A fan-out (Redlock) checks its connections out with ``ready=False`` and makes them ready itself, after one
look at all of them (:func:`._sync.connection.stale_connections`); so does the node for each command, which
calls ``ready()`` only for a connection that is not fit as it is (``Connection.fit``: the same look).

``lockkit/drivers/redis/_async/primitives.py`` holds the asyncio twin (one event loop: no lock, no fork).
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

from redis.exceptions import ConnectionError as RedisConnectionError

if TYPE_CHECKING:
    from ._sync.connection import Connection

__all__ = ["ConnectionPool"]

_pools: weakref.WeakSet[ConnectionPool] = weakref.WeakSet()
"""Every live pool of this process, for the fork hook below."""


def _forget_the_parents_connections() -> None:
    for pool in list(_pools):
        pool._after_fork()


if hasattr(os, "register_at_fork"):  # not on Windows, where there is no fork
    os.register_at_fork(after_in_child=_forget_the_parents_connections)


class ConnectionPool:
    def __init__(self, make: Callable[[], Connection], size: int, wait: float) -> None:
        self._make = make
        self._size = size
        self._wait = wait
        self._mutex = threading.Lock()
        self._freed = threading.Condition(self._mutex)
        self._idle: list[Connection] = []
        self._all: set[Connection] = set()
        self._waiting = 0  # callers blocked for a connection: a return notifies only if there are any
        _pools.add(self)

    def _after_fork(self) -> None:
        """In a forked child, before any of its code runs (only the forking thread exists): forget the parent's
        connections. The parent's connections stay the parent's: the child closes its copies of their sockets
        without a shutdown (which would cut the parent's too) and starts afresh."""
        conns = self._all
        self._mutex = threading.Lock()  # never acquired here: another parent thread may have held it
        self._freed = threading.Condition(self._mutex)
        self._idle, self._all, self._waiting = [], set(), 0
        for conn in conns:
            conn.drop()

    def get(self, ready: bool = True) -> Connection:
        """A connection, made fit to carry commands unless ``ready`` is false (the caller then calls its
        :meth:`~._sync.connection.Connection.ready` itself, or returns it)."""
        with self._mutex:
            if not self._idle and len(self._all) >= self._size:
                deadline = time.monotonic() + self._wait
                while not self._idle and len(self._all) >= self._size:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise RedisConnectionError(
                            f"no connection free within {self._wait:g} s (all {self._size} in use; "
                            "raise the pool_size option)"
                        )
                    self._waiting += 1
                    try:
                        self._freed.wait(left)
                    finally:
                        self._waiting -= 1
            if self._idle:
                conn = self._idle.pop()
            else:
                conn = self._make()
                self._all.add(conn)
        if ready:
            try:
                conn.ready()  # reconnected if it died while idle, PINGed if it sat idle for long
            except BaseException:
                self.release(conn)
                raise
        return conn

    def release(self, conn: Connection) -> None:
        with self._mutex:
            if conn in self._all:
                self._idle.append(conn)
                if self._waiting:
                    self._freed.notify()

    def disconnect(self) -> None:
        """Close every connection (the pool stays usable: later gets connect afresh)."""
        with self._mutex:
            conns = list(self._all)
        for conn in conns:
            conn.close()
