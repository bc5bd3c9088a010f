"""RESP2 replies, read from a byte buffer with no I/O (both faces' connections feed it what they receive).

The drivers speak RESP2 only (they never send ``HELLO 3``); a RESP3 reply type is a protocol error here.
The replies lockkit reads are plain RESP2: integers, bulk and simple strings, arrays, errors. An error
reply becomes an object of redis-py's public exception classes (:mod:`redis.exceptions`), which the drivers
already catch: ``NOSCRIPT`` → :class:`~redis.exceptions.NoScriptError`, ``NOPERM`` →
:class:`~redis.exceptions.NoPermissionError`, a refused login → :class:`~redis.exceptions.AuthenticationError`
(a ``ConnectionError``), anything else → :class:`~redis.exceptions.ResponseError`. As in redis-py, the
error code is taken off the message of a mapped error.
"""

from __future__ import annotations

from typing import Any, Final

from redis.exceptions import (
    AuthenticationError,
    AuthenticationWrongNumberOfArgsError,
    BusyLoadingError,
    ExecAbortError,
    InvalidResponse,
    NoPermissionError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError

__all__ = ["NOT_YET", "Replies", "error_reply"]

NOT_YET: Final = object()
"""What :meth:`Replies.next` returns while the next reply has not arrived in full."""

_CODES: dict[str, type[RedisError]] = {
    "NOSCRIPT": NoScriptError,
    "NOPERM": NoPermissionError,
    "WRONGPASS": AuthenticationError,
    "NOAUTH": AuthenticationError,
    "LOADING": BusyLoadingError,
    "READONLY": ReadOnlyError,
    "OOM": OutOfMemoryError,
    "EXECABORT": ExecAbortError,
}
_ERR_MESSAGES: dict[str, type[RedisError]] = {
    "max number of clients reached": RedisConnectionError,
    "invalid password": AuthenticationError,
    "wrong number of arguments for 'auth' command": AuthenticationWrongNumberOfArgsError,
    "wrong number of arguments for 'AUTH' command": AuthenticationWrongNumberOfArgsError,
    # an AUTH sent to a server without a password: Redis >= 6, then older ones
    "AUTH <password> called without any password configured for the default user. Are you sure your "
    "configuration is correct?": AuthenticationError,
    "Client sent AUTH, but no password is set": AuthenticationError,
}


def error_reply(text: str) -> RedisError:
    """The exception an error reply (``-CODE message``, without the ``-``) stands for."""
    code, _, message = text.partition(" ")
    if code == "ERR":
        return _ERR_MESSAGES.get(message, ResponseError)(message)
    kind = _CODES.get(code)
    return ResponseError(text) if kind is None else kind(message)


class _Short(Exception):
    """The reply being parsed has not arrived in full."""


class Replies:
    """The bytes received on one connection, parsed one complete reply at a time."""

    __slots__ = ("buf", "errors", "pos")

    def __init__(self) -> None:
        self.buf = b""
        self.pos = 0
        self.errors = 0
        """Error replies parsed so far (at any depth): a reader that saw none skips looking for them."""

    def feed(self, data: bytes) -> None:
        pos = self.pos
        self.buf = self.buf[pos:] + data if pos < len(self.buf) else data
        self.pos = 0

    def pending(self) -> bool:
        """Bytes are left that no reply asked for yet."""
        return self.pos < len(self.buf)

    def next(self) -> Any:
        """The next reply, or :data:`NOT_YET` (nothing is consumed then); error replies as exception objects."""
        start = self.pos
        if start >= len(self.buf):  # the common case on a request's first look: nothing yet, no exception
            return NOT_YET
        try:
            return self._reply()
        except _Short:
            self.pos = start
            return NOT_YET

    def take(self, count: int, into: list[Any]) -> None:
        """Move complete replies to ``into`` until it holds ``count`` or the next has not arrived in full (a
        reader's loop in one call: issue 17, every master's every reply comes through here)."""
        buf, left = self.buf, count - len(into)
        while left > 0:
            start = self.pos
            if start >= len(buf):
                return
            try:
                into.append(self._reply())
            except _Short:
                self.pos = start
                return
            left -= 1

    def _reply(self) -> Any:
        buf, pos = self.buf, self.pos
        end = buf.find(b"\r\n", pos)
        if end < 0:
            raise _Short
        kind = buf[pos]  # the type byte, as an int; the line's rest is buf[pos + 1 : end]
        self.pos = end + 2
        if kind == 58:  # ":" integer
            return int(buf[pos + 1 : end])
        if kind == 36:  # "$" bulk string
            size = int(buf[pos + 1 : end])
            if size < 0:
                return None
            stop = end + 2 + size
            if len(buf) < stop + 2:
                raise _Short
            self.pos = stop + 2
            return buf[end + 2 : stop]
        if kind == 43:  # "+" simple string
            return buf[pos + 1 : end]
        if kind == 42:  # "*" array
            count = int(buf[pos + 1 : end])
            return None if count < 0 else [self._reply() for _ in range(count)]
        if kind == 45:  # "-" error
            self.errors += 1
            return error_reply(buf[pos + 1 : end].decode(errors="replace"))
        raise InvalidResponse(f"protocol error: {buf[pos:end][:40]!r}")
