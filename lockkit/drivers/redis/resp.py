"""Reading RESP2 replies straight from a pooled redis-py connection's socket (the blocking face).

The drivers pin their connections to RESP2 (``protocol=2``); a RESP3 reply type is a protocol error here.

redis-py's ``Connection.read_response(timeout=…)`` sets the socket's timeout before every
read and restores it after (two ``ioctl`` system calls), then parses through a buffered
reader built for every reply type and protocol version; for the one- or two-integer replies of
a lock script that was about a tenth of an uncontended acquire + release on loopback. The
replies lockkit reads are plain RESP2 (integers, bulk strings, arrays, errors), so a small
reader over the socket does, with the timeout redis-py set at connect left alone unless the
caller's deadline is nearer.

The reader belongs to one socket: a reconnect gets a fresh one. Everything a send asked for is
read before the connection goes back to the pool, so redis-py's own reads (its connect
handshake, its health-check ``PING``) never find bytes of ours waiting.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from redis._parsers.base import BaseParser
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = ["read_replies"]

_parse_error: Callable[[str], ResponseError] = BaseParser.parse_error
"""redis-py's own mapping of an error reply to its exception class (NOSCRIPT -> NoScriptError, …)."""
_CHUNK = 65536
_EARLY = 0.9
"""A deadline nearer than this part of the socket's own timeout gets a read timeout of its own."""


class _Reader:
    __slots__ = ("buf", "label", "pos", "sock")

    def __init__(self, sock: Any, label: str) -> None:
        self.sock, self.label = sock, label
        self.buf = b""
        self.pos = 0

    def _fill(self) -> None:
        try:
            data = self.sock.recv(_CHUNK)
        except TimeoutError as exc:  # socket.timeout
            raise RedisTimeoutError(f"Timeout reading from {self.label}") from exc
        except OSError as exc:
            raise RedisConnectionError(f"Error while reading from {self.label}: {exc}") from exc
        if not data:
            raise RedisConnectionError(f"Connection closed by server ({self.label})")
        self.buf = self.buf[self.pos :] + data if self.pos < len(self.buf) else data
        self.pos = 0

    def _line(self) -> bytes:
        while True:
            end = self.buf.find(b"\r\n", self.pos)
            if end >= 0:
                line = self.buf[self.pos : end]
                self.pos = end + 2
                return line
            self._fill()

    def reply(self) -> Any:
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b":":
            return int(rest)
        if kind == b"*":
            count = int(rest)
            return None if count < 0 else [self.reply() for _ in range(count)]
        if kind == b"$":
            size = int(rest)
            if size < 0:
                return None
            while len(self.buf) < self.pos + size + 2:
                self._fill()
            data = self.buf[self.pos : self.pos + size]
            self.pos += size + 2
            return data
        if kind == b"+":
            return rest
        if kind == b"-":
            error = _parse_error(rest.decode(errors="replace"))
            if isinstance(error, RedisConnectionError):  # NOAUTH, WRONGPASS, max clients: raised, as redis-py does
                raise error
            return error
        raise InvalidResponse(f"Protocol error from {self.label}: {line[:40]!r}")


def read_replies(conn: Any, count: int, deadline: float) -> list[Any]:
    """Read ``count`` replies from ``conn``; the first may wait until ``deadline`` (monotonic).

    Error replies are returned as redis-py's exception objects (the stream stays in step), except those
    redis-py counts as connection errors (authentication, too many clients), which are raised like a
    timeout, a closed or broken connection (redis-py's TimeoutError / ConnectionError).
    """
    sock = conn._sock
    if sock is None:
        raise RedisConnectionError("the connection is closed")
    reader: _Reader | None = conn.__dict__.get("lockkit_reader")
    if reader is None or reader.sock is not sock:
        where = getattr(conn, "path", None) or f"{getattr(conn, 'host', '')}:{getattr(conn, 'port', '')}"
        reader = conn.lockkit_reader = _Reader(sock, f"redis {where}")
    own = sock.gettimeout()
    left = deadline - time.monotonic()
    early = own is None or left < own * _EARLY
    if early:
        sock.settimeout(max(0.001, left))
    try:
        first = reader.reply()
    finally:
        if early:
            sock.settimeout(own)
    replies = [first]
    for _ in range(count - 1):
        replies.append(reader.reply())
    if reader.pos != len(reader.buf):
        raise InvalidResponse(f"{reader.label} sent more than was asked for")  # out of step: drop the connection
    return replies
