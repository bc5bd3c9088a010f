"""The bytes of one asyncio connection: a transport (TCP, TLS or unix), written by hand (``../_sync/stream.py``
is its blocking twin, with the same names).

A small :class:`asyncio.Protocol` of our own keeps what arrives until it is read, and knows when the
connection was closed; that is all a connection needs, without a ``StreamReader``'s buffering and locks.
Waits are bounded with a timer on a future rather than ``asyncio.wait_for``, which before Python 3.12
can swallow a cancellation of the caller (bpo-37658). A read's timer is the connection's own and lazy: it is
armed once and, when it fires before the current read's deadline, armed again for what is left, so the usual
read (a reply well within the timeout) schedules and cancels no timer and builds no exception (issue 17:
see docs/benchmarks.md). Failures are redis-py's public exception classes (``TimeoutError``,
``ConnectionError``), which the drivers catch.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import socket
import time
from collections.abc import Sequence
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..config import NodeSpec

__all__ = ["REPLY_TURNS", "REPLY_TURNS_UP_TO", "REPLY_WINDOW", "AsyncStream", "open_stream", "stale_all"]


REPLY_TURNS = 6
"""How many turns a reader lets the event loop take, at most, after a command is sent and before it blocks on
the reply (:meth:`AsyncStream.turns_before_reply`, issue 17)."""
REPLY_WINDOW = 60e-6
"""...and for how long at most (seconds, ``time.perf_counter``): in a loop busy with other tasks one turn may
take longer than the reply, which must not wait behind more of them."""
REPLY_TURNS_UP_TO = 4 * REPLY_WINDOW
"""No turns on a connection whose replies take longer than this (a moving average of its round trips, from the
send to the reply's arrival): turns could not catch a remote server's reply, they would only spend CPU."""

_BUFFER = 16 * 1024
"""What one read of the socket takes at most: small, as a pool may hold 64 connections (a 10,000-lease renewal
round's ~40 KB of replies then takes three reads)."""


class _Protocol(asyncio.BufferedProtocol):
    """A buffered protocol: the transport reads into one buffer of ours, kept for the connection's life.

    A plain :class:`asyncio.Protocol` is handed a new ``bytes`` per read, for which asyncio's socket transport
    calls ``recv(256 KiB)``. glibc serves an allocation that large with ``mmap`` unless earlier frees raised its
    threshold, and a buffer shrunk to the reply's size by ``mremap`` before it is freed never raises it: in such
    a process every read cost three more system calls and the page faults (issue 17: 34 against 15 µs of CPU
    per ``PING`` round trip here; see docs/benchmarks.md)."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.loop = asyncio.get_running_loop()
        self.data: list[bytes] = []
        self._buffer = memoryview(bytearray(_BUFFER))
        self.closed: str | None = None
        """Why the connection is unusable, once it is."""
        self.waiter: asyncio.Future[None] | None = None
        self.deadline = math.inf
        """When the current read (``waiter``) times out (monotonic)."""
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = math.inf
        """When ``timer`` fires (monotonic): never later than the current read's deadline."""
        self.writable: asyncio.Future[None] | None = None
        """Set while the transport's write buffer is full (``pause_writing``)."""
        self.lost: asyncio.Future[None] = self.loop.create_future()

    def wait(self, deadline: float) -> asyncio.Future[None]:
        """A future of this read's own (cancelling it harms nobody), failed with a timeout at ``deadline``."""
        waiter = self.waiter = self.loop.create_future()
        self.deadline = deadline
        if deadline < self.timer_at:  # a timer that fires too late (or none): one that fires in time
            self._arm(deadline)
        return waiter

    def _arm(self, at: float) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer, self.timer_at = None, at
        if at != math.inf:
            # on the loop's clock (which need not be time.monotonic), at least 1 ms on: a read never
            # times out before it waited a little, as a read whose deadline already passed would
            self.timer = self.loop.call_later(max(0.001, at - time.monotonic()), self._due)

    def _due(self) -> None:
        self.timer, self.timer_at = None, math.inf
        waiter = self.waiter
        if waiter is None or waiter.done():
            return  # nobody reading: the next read arms a timer of its own
        if time.monotonic() < self.deadline:
            self._arm(self.deadline)  # armed for an earlier read: this one has time left
            return
        waiter.set_exception(RedisTimeoutError(f"Timeout reading from redis {self.label}"))

    def disarm(self) -> None:
        self._arm(math.inf)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.data.append(self._buffer[:nbytes].tobytes())  # copied out at once: the next read reuses the buffer
        _wake(self.waiter)

    def eof_received(self) -> bool:
        self.closed = self.closed or f"Connection closed by redis {self.label}"
        _wake(self.waiter)
        return False  # let the transport close itself

    def connection_lost(self, exc: Exception | None) -> None:
        why = f"Error while reading from redis {self.label}: {exc}" if exc else f"Connection to redis {self.label} lost"
        self.closed = self.closed or why
        self.disarm()
        _wake(self.waiter)
        _wake(self.writable)
        _wake(self.lost)

    def pause_writing(self) -> None:
        self.writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        writable, self.writable = self.writable, None
        _wake(writable)


def _wake(future: asyncio.Future[None] | None) -> None:
    if future is not None and not future.done():
        future.set_result(None)


def _expire(future: asyncio.Future[None], error: Exception) -> None:
    if not future.done():
        future.set_exception(error)


async def _bounded(event: asyncio.Future[None], timeout: float, error: Exception) -> None:
    """Wait until ``event`` is done; raise ``error`` after ``timeout`` seconds (``math.inf``: wait for ever).

    The wait is on a future of its own, so a cancelled caller never cancels ``event``, which the protocol
    shares with later callers."""
    if event.done():
        return
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()

    def done(_: asyncio.Future[None]) -> None:
        _wake(waiter)

    event.add_done_callback(done)
    handle = None if timeout == math.inf else loop.call_later(max(0.001, timeout), _expire, waiter, error)
    try:
        await waiter
    finally:
        event.remove_done_callback(done)
        if handle is not None:
            handle.cancel()


class AsyncStream:
    __slots__ = ("_label", "_protocol", "_round_trip", "_sent_at", "_timeout", "_transport")

    def __init__(self, transport: asyncio.Transport, protocol: _Protocol, timeout: float, label: str) -> None:
        self._transport, self._protocol, self._timeout, self._label = transport, protocol, timeout, label
        self._sent_at = 0.0  # time.perf_counter() of the last send
        self._round_trip = 0.0  # a moving average of send-to-reply times (0: none yet, so turns at first)

    async def send(self, data: bytes) -> None:
        protocol = self._protocol
        if protocol.closed is not None:
            raise RedisConnectionError(protocol.closed)
        self._transport.write(data)
        self._sent_at = time.perf_counter()
        if protocol.writable is not None:  # the buffer is full: wait until the kernel took some of it
            error = RedisTimeoutError(f"Timeout writing to redis {self._label}")
            await _bounded(protocol.writable, self._timeout, error)
            if protocol.closed is not None:
                raise RedisConnectionError(protocol.closed)

    async def turns_before_reply(self) -> None:
        """Let the event loop turn a few times (:data:`REPLY_TURNS`, within :data:`REPLY_WINDOW`) before a reader
        blocks on the reply to a command it just sent, unless the reply is here already.

        Other tasks run meanwhile, as they would while this one waits; what it saves is the wake-up. A task that
        blocks right after its send puts an idle loop to sleep in ``epoll_wait``, and on the virtual machines
        this project measures on, waking a sleeping vCPU when the reply comes costs 20-50 µs per round trip:
        more than the whole client's Python. A few turns (a zero-timeout ``select`` each) keep it awake for
        the ~20-40 µs a loopback Redis takes to answer, for about the CPU the sleep and wake-up cost
        themselves. On a connection whose replies take longer (:data:`REPLY_TURNS_UP_TO`, a remote server)
        none are taken (measured in docs/benchmarks.md, "loop turns before a reply"; ``bench_async.py
        --parts redis-layers`` has a row without them). redis.asyncio gets the same from the turns its own
        reader takes."""
        if self._round_trip > REPLY_TURNS_UP_TO:
            return
        protocol = self._protocol
        until = time.perf_counter() + REPLY_WINDOW
        for _ in range(REPLY_TURNS):
            if protocol.data or protocol.closed is not None or time.perf_counter() >= until:
                return
            await asyncio.sleep(0)

    async def recv(self, deadline: float | None) -> bytes:
        """What has arrived, waiting until ``deadline`` (monotonic; None: the connection's own timeout from now,
        ``math.inf``: for ever)."""
        protocol = self._protocol
        if not protocol.data and protocol.closed is None:
            if deadline is None:
                deadline = time.monotonic() + self._timeout
            waiter = protocol.wait(deadline)
            try:
                await waiter
            finally:
                protocol.waiter = None
        if protocol.data:
            chunks = protocol.data
            data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
            chunks.clear()
            # An upper bound of this reply's round trip (it may have arrived earlier), for turns_before_reply
            self._round_trip += (time.perf_counter() - self._sent_at - self._round_trip) * 0.125
            return data
        raise RedisConnectionError(protocol.closed or f"Connection to redis {self._label} lost")

    async def arrived(self, deadline: float) -> bool:
        """Whether bytes arrived, or the connection closed, by ``deadline`` (monotonic), without taking them."""
        protocol = self._protocol
        if protocol.data or protocol.closed is not None:
            return True
        waiter = protocol.wait(deadline)
        try:
            await waiter
        except RedisTimeoutError:
            return False
        finally:
            protocol.waiter = None
        return True

    def stale(self) -> bool:
        """Readable while idle: the server (or a middlebox) closed it, or it holds stray bytes; unusable."""
        return bool(self._protocol.data) or self._protocol.closed is not None

    def abort(self) -> None:
        """Close at once (the loop finishes it soon after)."""
        self._protocol.closed = self._protocol.closed or f"Connection to redis {self._label} closed"
        self._transport.abort()

    async def close(self) -> None:
        """Close and wait until the loop let go of the socket (a loop stopped before that would leak it)."""
        self.abort()
        with contextlib.suppress(TimeoutError):
            await _bounded(self._protocol.lost, self._timeout, TimeoutError())


def stale_all(streams: Sequence[AsyncStream | None]) -> list[bool]:
    """Per stream, whether it is unusable (see :meth:`AsyncStream.stale`; None, no stream, is). The blocking twin
    asks the kernel about all of them in one call; here the protocol already knows, with no system call."""
    return [stream is None or stream.stale() for stream in streams]


async def open_stream(spec: NodeSpec) -> AsyncStream:
    """Connect to ``spec``'s server within its ``connect_timeout``; TCP connections are kept alive (asyncio
    sets ``TCP_NODELAY`` itself), TLS ones are verified as the options say."""
    options = spec.options
    loop = asyncio.get_running_loop()
    protocol = _Protocol(spec.label)
    connect: Any
    if spec.path is not None:
        connect = loop.create_unix_connection(lambda: protocol, spec.path)
    else:
        context = spec.tls_context()
        tls: dict[str, Any] = {}
        if context is not None:
            tls = {"ssl": context, "server_hostname": spec.host, "ssl_handshake_timeout": options.connect_timeout}
        assert spec.host is not None and spec.port is not None  # a spec has a path or a host and port
        connect = loop.create_connection(lambda: protocol, spec.host, spec.port, **tls)
    task = asyncio.ensure_future(connect)
    try:
        # asyncio.wait, not wait_for: it never swallows the caller's cancellation (see the module docstring)
        done, _ = await asyncio.wait({task}, timeout=options.connect_timeout)
    except BaseException:
        task.cancel()
        if task.done() and not task.cancelled() and task.exception() is None:
            task.result()[0].abort()  # connected just as the caller was cancelled
        raise
    if not done:
        task.cancel()
        raise RedisTimeoutError(f"Timeout connecting to redis {spec.label}")
    try:
        transport, _ = task.result()
    except TimeoutError as exc:  # the TLS handshake's own timeout
        raise RedisTimeoutError(f"Timeout connecting to redis {spec.label}") from exc
    except OSError as exc:  # ssl.SSLError (a refused certificate) too
        raise RedisConnectionError(f"Error connecting to redis {spec.label}: {exc}") from exc
    if spec.path is None:
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    return AsyncStream(transport, protocol, options.timeout, spec.label)
