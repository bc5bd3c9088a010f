"""One connection to one Redis server, lockkit's own: :class:`AsyncConnection`.

This file is the source of the blocking ``Connection`` too (``scripts/unasync.py`` generates
``../_sync/connection.py``); the bytes move through this face's :mod:`.stream`, the replies are parsed by
:mod:`..resp`. A connection does what the drivers need and nothing else:

* :meth:`AsyncConnection.connect` opens the socket and logs in, only if the URL asks for it, in one round
  trip: ``AUTH`` (user and password, or the password alone; the password alone again for a server older
  than 6 that refuses a user name) and ``SELECT`` of a database other than 0. A refused login is
  redis-py's :class:`~redis.exceptions.AuthenticationError` (a ``ConnectionError``), whose message names no
  password;
* :meth:`AsyncConnection.ready`, before a pooled connection carries commands, reconnects one that the server
  or a middlebox closed while it sat idle (C-12), so even a non-idempotent acquire never goes out on a dead
  connection, and ``PING``\\s one idle for longer than ``health_check_interval``;
* :meth:`AsyncConnection.read` reads exactly the replies a send asked for, so that no byte of one caller's
  is left for the next.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from redis.exceptions import AuthenticationError, AuthenticationWrongNumberOfArgsError, InvalidResponse
from redis.exceptions import ConnectionError as RedisConnectionError

from ..calls import Call, pack
from ..config import NodeSpec
from ..resp import NOT_YET, Replies
from .stream import AsyncStream, open_stream, stale_all

__all__ = ["AsyncConnection", "stale_connections"]

_PING = pack([("PING",)])


def _login(spec: NodeSpec, user: bool = True) -> list[tuple[Any, ...]]:
    """The commands that log a new connection in, if any."""
    commands: list[tuple[Any, ...]] = []
    if spec.password is not None or spec.username:
        password = spec.password or ""
        commands.append(("AUTH", spec.username, password) if spec.username and user else ("AUTH", password))
    if spec.db:
        commands.append(("SELECT", spec.db))
    return commands


def _refusal(spec: NodeSpec, commands: Sequence[tuple[Any, ...]], replies: Sequence[Any]) -> Exception | None:
    """Why the login failed, or None if it worked."""
    for command, reply in zip(commands, replies, strict=True):
        if isinstance(reply, (RedisConnectionError, AuthenticationWrongNumberOfArgsError)):
            return reply
        if isinstance(reply, Exception):
            if command[0] == "AUTH":
                return AuthenticationError(str(reply))
            return RedisConnectionError(f"redis {spec.label} refused SELECT {spec.db}: {reply}")
    return None


class AsyncConnection:
    def __init__(self, spec: NodeSpec) -> None:
        self.spec = spec
        self.fresh = False
        """Connected since the node last looked: its first commands go after the node's hello."""
        self._stream: AsyncStream | None = None
        self._replies = Replies()
        self._used = 0.0
        self.errors = False
        """The last :meth:`read` got an error reply (at any depth); without one, nobody looks for ``NOSCRIPT``."""
        self.owed: tuple[Sequence[Call], int, float] | None = None
        """Calls sent on this connection whose replies nobody has read yet, how many hello replies come first,
        and when it was given back (monotonic): a Redlock fan-out that had its quorum gave it back before the
        slower masters answered (issue 17). The node reads them before anything else goes out on it
        (:meth:`..node.AsyncNode.settle`); a dropped connection owes nothing."""

    async def connect(self) -> None:
        self.drop()
        self._stream = await open_stream(self.spec)
        self._replies = Replies()
        try:
            await self._log_in(_login(self.spec))
        except BaseException:
            self.drop()
            raise
        self.fresh = True
        self._used = time.monotonic()

    async def _log_in(self, commands: list[tuple[Any, ...]]) -> None:
        if not commands:
            return
        await self.send(pack(commands))
        replies = await self._read(len(commands), time.monotonic() + self.spec.options.timeout)
        refused = _refusal(self.spec, commands, replies)
        if isinstance(refused, AuthenticationWrongNumberOfArgsError) and self.spec.username:
            await self._log_in(_login(self.spec, user=False))  # a server older than 6: no ACL users
        elif refused is not None:
            raise refused

    async def arrived(self, deadline: float) -> bool:
        """Whether replies (or the connection's end) arrived by ``deadline`` (monotonic), none of them taken."""
        stream = self._stream
        if stream is None or self._replies.pos < len(self._replies.buf):
            return True
        return await stream.arrived(deadline)

    def unusable(self) -> bool:
        """Closed, or readable while nothing is owed: closed by the server (EOF), or holding stray bytes."""
        stream = self._stream
        return stream is None or stream.stale()

    def fit(self) -> bool:
        """Fit to carry commands as it is, so that :meth:`ready` would do nothing: connected, not closed by the
        server while idle (the stream's ``stale()``), and not due a health check."""
        stream = self._stream
        if stream is None or stream.stale():
            return False
        interval = self.spec.options.health_check_interval
        return not interval or time.monotonic() - self._used <= interval

    async def ready(self, stale: bool | None = None) -> None:
        """Make this pooled connection fit to carry commands (see the module docstring); ``stale``: whether it
        is unusable, if :func:`stale_connections` just looked (a fan-out asks about all its connections at once)."""
        stream = self._stream
        if stream is not None and (stream.stale() if stale is None else stale):
            self.drop()
            stream = None
        if stream is None:
            await self.connect()
            return
        interval = self.spec.options.health_check_interval
        if interval and time.monotonic() - self._used > interval:
            try:
                await stream.send(_PING)
                await self.read(1, time.monotonic() + self.spec.options.timeout)
            except BaseException:
                self.drop()
                raise

    async def send(self, data: bytes) -> None:
        stream = self._stream
        if stream is None:
            raise RedisConnectionError(f"the connection to redis {self.spec.label} is closed")
        await stream.send(data)

    async def read(self, count: int, deadline: float | None) -> list[Any]:
        """Read ``count`` replies; the first may wait until ``deadline`` (monotonic; None: the connection's own
        ``timeout``), each later one the connection's own ``timeout``. Error replies come back as exception
        objects (the stream stays in step), except those that make the connection unusable (a refused login,
        too many clients), which are raised like a timeout or a broken connection. Anything more than ``count``
        replies is a protocol error."""
        stream = self._stream
        if stream is None:
            raise RedisConnectionError(f"the connection to redis {self.spec.label} is closed")
        parser = self._replies
        errors = parser.errors
        replies: list[Any] = []
        if parser.pos < len(parser.buf):  # bytes left by next_reply (a read leaves none): replies already here
            parser.take(count, replies)
        if len(replies) < count:
            await stream.turns_before_reply()
        while len(replies) < count:
            parser.feed(await stream.recv(None if replies else deadline))
            parser.take(count, replies)
        self.errors = parser.errors != errors
        if self.errors:
            for reply in replies:
                if isinstance(reply, RedisConnectionError):
                    raise reply
        if parser.pos < len(parser.buf):
            raise InvalidResponse(f"redis {self.spec.label} sent more than was asked for")
        self._used = time.monotonic()
        return replies

    async def _read(self, count: int, deadline: float) -> list[Any]:
        replies = [await self.next_reply(deadline)]
        for _ in range(count - 1):
            replies.append(await self.next_reply(None))
        return replies

    async def next_reply(self, deadline: float | None) -> Any:
        """The next reply (an error reply as an exception object), waiting until ``deadline`` (monotonic; None:
        the connection's own timeout; ``math.inf``: for ever, as a pub/sub subscriber does); whatever arrived
        beyond it stays for the next call."""
        stream = self._stream
        if stream is None:
            raise RedisConnectionError(f"the connection to redis {self.spec.label} is closed")
        reply = self._replies.next()
        while reply is NOT_YET:
            self._replies.feed(await stream.recv(deadline))
            reply = self._replies.next()
        return reply

    def drop(self) -> None:
        """Close at once; :meth:`ready` or :meth:`connect` makes a new connection."""
        stream, self._stream = self._stream, None
        self.owed = None
        if stream is not None:
            stream.abort()

    async def close(self) -> None:
        stream, self._stream = self._stream, None
        self.owed = None
        if stream is not None:
            await stream.close()


def stale_connections(conns: Sequence[AsyncConnection | BaseException]) -> list[bool]:
    """Per connection, whether :meth:`AsyncConnection.ready` must reconnect it: one look at all of them (an
    exception in the place of a connection, one a fan-out could not check out, is reported stale)."""
    return stale_all([None if isinstance(conn, BaseException) else conn._stream for conn in conns])
