"""The bytes of one blocking connection: a socket (TCP, TLS or unix), written by hand (``../_async/stream.py``
is its asyncio twin, with the same names).

On Linux a plain (not TLS) socket is a *blocking* socket whose timeouts the kernel keeps (``SO_RCVTIMEO``,
``SO_SNDTIMEO``): a socket with a Python-level timeout polls before every ``send`` and ``recv`` (CPython's
``sock_call``), which was 2 of the 5 system calls per master per command of a Redlock fan-out (issue 17,
docs/benchmarks.md). A read that times out in the kernel fails with ``EAGAIN``, raised here as the same
``TimeoutError`` as before. TLS sockets, sockets of a class that is not the standard library's (a
monkey-patched one), and other systems (whose ``struct timeval`` layouts differ) keep Python's timeout.

A socket keeps the operation ``timeout`` it was given at connect; a read whose caller's deadline is nearer
(a Redlock fan-out reads every master against one deadline) sets a timeout of its own and puts the socket's
back after, which costs two system calls, so only then. Failures are redis-py's public exception classes
(``TimeoutError``, ``ConnectionError``), which the drivers catch.

:func:`stale_all` looks at every connection of a fan-out with one ``poll`` (not one ``select`` per
connection, which also fails for a descriptor above 1023).
"""

from __future__ import annotations

import _socket
import contextlib
import math
import os
import select
import socket
import ssl
import struct
import sys
import time
from collections.abc import Sequence

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..config import NodeSpec

__all__ = ["Stream", "open_stream", "stale_all"]

_CHUNK = 65536
_EARLY = 0.9
"""A deadline nearer than this part of the socket's own timeout gets a read timeout of its own."""
_KERNEL_TIMEOUTS = sys.platform.startswith("linux")
"""Linux's ``struct timeval`` is two ``long`` values; elsewhere Python's own timeouts are used."""


def _timeval(seconds: float) -> bytes:
    """``seconds`` as the kernel's socket timeout (at least 1 µs: 0 would mean "never"; ``math.inf``: never)."""
    if seconds == math.inf:
        return struct.pack("@ll", 0, 0)
    micros = max(1, math.ceil(seconds * 1_000_000))
    return struct.pack("@ll", micros // 1_000_000, micros % 1_000_000)


class Stream:
    __slots__ = ("_kernel", "_label", "_pid", "_sock", "_timeout", "_timeval")

    def __init__(self, sock: socket.socket, timeout: float, label: str) -> None:
        self._sock, self._timeout, self._label = sock, timeout, label
        self._pid = os.getpid()
        # Only the standard library's own plain socket: a TLS socket's reads are the ssl module's, and a socket
        # class that wraps another (gevent's and eventlet's monkey-patched ones) times calls out itself and
        # would wait for ever on a blocking one.
        self._kernel = _KERNEL_TIMEOUTS and isinstance(sock, _socket.socket) and not isinstance(sock, ssl.SSLSocket)
        self._timeval = _timeval(timeout)
        if self._kernel:
            sock.settimeout(None)  # blocking: no poll before each call; the kernel times the call out instead
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, self._timeval)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, self._timeval)
        else:
            sock.settimeout(timeout)

    def send(self, data: bytes) -> None:
        try:
            self._sock.sendall(data)
        except (TimeoutError, BlockingIOError) as exc:  # Python's timeout; the kernel's (EAGAIN)
            raise RedisTimeoutError(f"Timeout writing to redis {self._label}") from exc
        except OSError as exc:
            raise RedisConnectionError(f"Error while writing to redis {self._label}: {exc}") from exc

    def turns_before_reply(self) -> None:
        """Nothing on this face. The asyncio twin lets its event loop turn a few times before it blocks on a reply
        (the wake-up it saves, see there); here that would be a busy wait, spending the CPU that the server and
        the other threads of the machine need, and a blocked thread lets the others run anyway."""

    def recv(self, deadline: float | None) -> bytes:
        """What has arrived, waiting until ``deadline`` (monotonic; None: the socket's own timeout from now,
        ``math.inf``: for ever)."""
        sock = self._sock
        timeout: float | None = None
        if deadline == math.inf:
            timeout = math.inf
        elif deadline is not None:
            left = deadline - time.monotonic()
            if left < self._timeout * _EARLY:
                timeout = max(0.001, left)
        try:
            if timeout is None:
                data = sock.recv(_CHUNK)
            elif self._kernel:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(timeout))
                try:
                    data = sock.recv(_CHUNK)
                finally:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, self._timeval)
            else:
                sock.settimeout(None if timeout == math.inf else timeout)
                try:
                    data = sock.recv(_CHUNK)
                finally:
                    sock.settimeout(self._timeout)
        except (TimeoutError, BlockingIOError) as exc:  # Python's timeout; the kernel's (EAGAIN)
            raise RedisTimeoutError(f"Timeout reading from redis {self._label}") from exc
        except OSError as exc:
            raise RedisConnectionError(f"Error while reading from redis {self._label}: {exc}") from exc
        if not data:
            raise RedisConnectionError(f"Connection closed by redis {self._label}")
        return data

    def arrived(self, deadline: float) -> bool:
        """Whether bytes arrived, or the connection closed, by ``deadline`` (monotonic), without taking them."""
        sock = self._sock
        if isinstance(sock, ssl.SSLSocket) and sock.pending() > 0:
            return True
        poll = select.poll()
        poll.register(sock.fileno(), select.POLLIN)
        return bool(poll.poll(max(0.0, (deadline - time.monotonic()) * 1000)))

    def stale(self) -> bool:
        """Readable while idle: the server (or a middlebox) closed it (EOF), or it holds stray bytes; unusable."""
        return stale_all([self])[0]

    def abort(self) -> None:
        """Close at once. A forked child only lets go of its copy: shutting the socket down would cut the
        parent's connection too."""
        if self._pid == os.getpid():
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()

    def close(self) -> None:
        self.abort()


def stale_all(streams: Sequence[Stream | None]) -> list[bool]:
    """Per stream, whether it is unusable (see :meth:`Stream.stale`; None, no stream, is): one ``poll`` for all.
    ``poll``, not ``select``, which refuses a descriptor above 1023 (a busy service has that many)."""
    poll = select.poll()
    fds = [-1 if stream is None else stream._sock.fileno() for stream in streams]
    for fd in fds:
        if fd >= 0:
            poll.register(fd, select.POLLIN)
    ready = {fd for fd, _ in poll.poll(0)}  # any event: readable (EOF, stray bytes), hung up, or in error
    out: list[bool] = []
    for stream, fd in zip(streams, fds, strict=True):
        sock = None if stream is None else stream._sock
        out.append(fd < 0 or fd in ready or (isinstance(sock, ssl.SSLSocket) and sock.pending() > 0))
    return out


def open_stream(spec: NodeSpec) -> Stream:
    """Connect to ``spec``'s server within its ``connect_timeout``; TCP connections are kept alive and never
    delay small writes (``TCP_NODELAY``), TLS ones are verified as the options say."""
    options = spec.options
    sock: socket.socket | None = None
    try:
        if spec.path is not None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(options.connect_timeout)
            sock.connect(spec.path)
        else:
            assert spec.port is not None  # a spec has a path or a host and port
            sock = socket.create_connection((spec.host, spec.port), timeout=options.connect_timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            context = spec.tls_context()
            if context is not None:
                sock = context.wrap_socket(sock, server_hostname=spec.host)
    except BaseException as exc:
        if sock is not None:
            sock.close()
        if isinstance(exc, TimeoutError):
            raise RedisTimeoutError(f"Timeout connecting to redis {spec.label}") from exc
        if isinstance(exc, OSError):  # ssl.SSLError (a refused certificate) too
            raise RedisConnectionError(f"Error connecting to redis {spec.label}: {exc}") from exc
        raise
    return Stream(sock, options.timeout, spec.label)
