"""One Redis server as the drivers use it: pipelined script calls on a pooled connection.

:class:`AsyncNode` does a few things and nothing else; what to send lives in :mod:`..calls` and
:mod:`..flow`, how to read the hello's replies in :mod:`..config`:

* a call is split into :meth:`AsyncNode.send` and :meth:`AsyncNode.receive`, so that a Redlock
  fan-out sends to every master first and then reads the replies against one
  shared deadline (all masters in parallel, no thread per master);
* connections come from this face's pool (``primitives``) and are lockkit's own (:mod:`.connection`);
* a fresh connection prepends its hello (``INFO server``, ``CONFIG GET``, and
  ``SCRIPT LOAD`` the first time) to the first commands it carries; with
  ``strict=true`` the hello goes alone first, so a refused server runs nothing, and so it does with
  ``require_master`` (Sentinel), whose hello also asks ``ROLE``, so a replica is never sent a write;
* a ``NOSCRIPT`` reply reloads the script and runs the failed calls again on the
  same connection (``NOSCRIPT`` means they did not run);
* a connection error is retried once on a fresh connection only for idempotent
  calls (renew, release, holder); never for acquire. :meth:`AsyncNode.run_again_on_error`
  also says whether the error came after the calls were sent (they may have run, and
  only the reply was lost): a retried release needs to know.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..calls import Call, pack, pack_calls, reload_plan
from ..config import NodeSpec, NodeState, apply_hello, hello_commands
from .connection import AsyncConnection
from .primitives import AsyncConnectionPool

__all__ = ["IDLE_CLOSE_MIN", "SETTLE_WAIT", "AsyncNode"]

IDLE_CLOSE_MIN = 1.0
"""The shortest idle time after which a server may close a connection (Redis's ``timeout`` is whole seconds)."""

SETTLE_WAIT = 0.01
"""How long the next use of a connection waits, at most, for the replies a fan-out left unread on it to begin to
come (:meth:`AsyncNode.settle`): a loaded machine may delay a reply by milliseconds; one that has not come by then
is a paused or cut-off server's, which that command then does without."""


@dataclass(slots=True)
class Pending:
    """Calls sent on ``conn`` whose replies (after ``hello`` replies of the connection's hello) are unread."""

    conn: AsyncConnection
    calls: Sequence[Call]
    hello: int


class AsyncNode:
    def __init__(self, spec: NodeSpec) -> None:
        self.spec = spec
        self.state = NodeState(
            spec.label, spec.options.strict, require_master=spec.require_master, cluster=spec.cluster
        )
        o = spec.options
        self.pool = AsyncConnectionPool(lambda: AsyncConnection(spec), o.pool_size, o.connect_timeout + o.timeout)

    async def checkout(self) -> AsyncConnection:
        """A pooled connection for :meth:`send`, not yet made ready: a fan-out looks at all of its connections
        at once first (:func:`.connection.stale_connections`); it goes back to the pool with the send."""
        if self.state.refused is not None:
            raise self.state.refused
        return await self.pool.get(ready=False)

    def park(self, pending: Pending) -> None:
        """Give back ``pending``'s connection before its replies are read: a fan-out that has its quorum does not
        wait for the slower masters (issue 17). The replies are read before the connection carries anything else
        (:meth:`settle`), so they are never the next caller's."""
        conn = pending.conn
        conn.owed = (pending.calls, pending.hello, time.monotonic())
        self.pool.release(conn)

    async def settle(self, conn: AsyncConnection, arrived: bool) -> bool:
        """Read the replies :meth:`park` left unread on ``conn`` (``arrived``: a look at the socket just found it
        readable), applying a hello's and running a script the server had forgotten (``NOSCRIPT``) again, as
        :meth:`receive` does; whether ``conn`` is unusable now (a broken one is dropped, to be connected afresh).

        Replies that have not begun to come within :data:`SETTLE_WAIT` (a paused or partitioned server) raise a
        ``TimeoutError`` with ``conn`` back in the pool, still owing them: the server is not used this time,
        and the next command looks again, rather than every command waiting out a ``timeout`` or opening yet
        another connection to it. Interrupted, ``conn`` goes back to the pool too."""
        owed = conn.owed
        if owed is None:
            return False
        try:
            if not arrived and not await conn.arrived(time.monotonic() + SETTLE_WAIT):
                raise RedisTimeoutError(
                    f"redis {self.spec.label} has not answered an earlier command within {SETTLE_WAIT * 1000:g} ms "
                    "(paused or cut off?): not asked this time"
                )
        except BaseException:
            self.pool.release(conn)
            raise
        conn.owed = None
        calls, hello, parked_at = owed
        try:
            await self._replies(conn, calls, hello, None)
        except (RedisError, OSError):
            conn.drop()
            return True
        except BaseException:  # interrupted (a cancel, a signal): the connection goes back, dropped
            conn.drop()
            self.pool.release(conn)
            raise
        # Closed by the server after those replies? Only a connection idle for a while can have been (Redis's
        # idle ``timeout`` is whole seconds), so one parked moments ago needs no second look (a system call).
        return time.monotonic() - parked_at >= IDLE_CLOSE_MIN and conn.unusable()

    async def send(
        self,
        calls: Sequence[Call],
        payload: bytes | None = None,
        conn: AsyncConnection | None = None,
        stale: bool | None = None,
        by: float | None = None,
    ) -> Pending:
        """Send ``calls`` (``payload``: their encoding, when a fan-out encoded them once for every master), on
        ``conn`` if given (from :meth:`checkout`; ``stale``: what :func:`.connection.stale_connections` said of
        it), else on a connection from the pool. ``by``: as :meth:`run`'s, for the checked hello of a new
        connection."""
        conn, hello = await self._send(calls, payload, conn, stale, by)
        return Pending(conn, calls, hello)

    async def _send(
        self,
        calls: Sequence[Call],
        payload: bytes | None = None,
        conn: AsyncConnection | None = None,
        stale: bool | None = None,
        by: float | None = None,
    ) -> tuple[AsyncConnection, int]:
        """:meth:`send`, without the :class:`Pending` (:meth:`run` needs none): the connection, and how many
        hello replies come before the calls' own."""
        if conn is None:
            if self.state.refused is not None:
                raise self.state.refused
            conn = await self.pool.get(ready=False)
            if conn.owed is not None:
                await self.settle(conn, False)
            if not conn.fit():  # one fit as it is needs no ready() (issue 17: every command's checkout)
                try:
                    await conn.ready()  # reconnected if it died while idle, PINGed if it sat idle for long
                except BaseException:
                    self.pool.release(conn)
                    raise
        else:
            try:
                await conn.ready(stale)  # reconnected if it died while idle, PINGed if it sat idle for long
            except BaseException:
                self.pool.release(conn)
                raise
        try:
            data = payload or pack_calls(calls)
            hello = 0
            if conn.fresh:
                conn.fresh = False
                commands = hello_commands(self.state)
                # Check before anything runs: a refused server must not take locks, and a lock write must never
                # reach a replica that a Sentinel still named as the master.
                if self.state.strict or self.state.require_master:
                    await conn.send(pack(commands))
                    apply_hello(self.state, await conn.read(len(commands), self.reply_deadline(by)))
                else:
                    data, hello = pack(commands) + data, len(commands)
            await conn.send(data)
        except BaseException:
            conn.drop()
            self.pool.release(conn)
            raise
        return conn, hello

    async def receive(self, pending: Pending, deadline: float) -> list[Any]:
        """The replies of ``pending``'s calls; the first may wait until ``deadline`` (monotonic, shared by a
        fan-out). Error replies come back as exception objects."""
        return await self._receive(pending.conn, pending.calls, pending.hello, deadline)

    async def _receive(self, conn: AsyncConnection, calls: Sequence[Call], hello: int, deadline: float) -> list[Any]:
        try:
            replies = await self._replies(conn, calls, hello, deadline)
        except BaseException:
            conn.drop()
            self.pool.release(conn)
            raise
        self.pool.release(conn)
        return replies

    async def _replies(
        self, conn: AsyncConnection, calls: Sequence[Call], hello: int, deadline: float | None
    ) -> list[Any]:
        """The replies of ``calls`` sent on ``conn`` after ``hello`` hello commands; the calls a ``NOSCRIPT`` refused
        are run again once the script is loaded."""
        replies = await conn.read(hello + len(calls), deadline)
        if hello:
            apply_hello(self.state, replies[:hello])
            replies = replies[hello:]
        if conn.errors:  # NOSCRIPT is an error reply: a read that got none needs no plan (issue 17: most)
            redo, commands = reload_plan(calls, replies)
            if redo:
                await conn.send(pack(commands))
                again = await conn.read(len(commands), time.monotonic() + self.spec.options.timeout)
                for index, reply in zip(redo, again[len(commands) - len(redo) :], strict=False):
                    replies[index] = reply
        return replies

    async def run(self, calls: Sequence[Call], idempotent: bool, by: float | None = None) -> list[Any]:
        """Run ``calls``; idempotent ones once more on a fresh connection after a connection error. ``by``: a
        monotonic instant the replies must come by if that is sooner than the node's own ``timeout`` (an acquire
        attempt's deadline: an unresponsive server is reported by about then, docs/semantics.md)."""
        if idempotent:
            replies, _ = await self.run_again_on_error(calls)
            return replies
        conn, hello = await self._send(calls, by=by)
        return await self._receive(conn, calls, hello, self.reply_deadline(by))

    def reply_deadline(self, by: float | None = None) -> float:
        """When a reply sent for now must have come: the node's ``timeout`` from now, or ``by`` if that is
        sooner (monotonic instants)."""
        deadline = time.monotonic() + self.spec.options.timeout
        return deadline if by is None or by > deadline else by

    async def run_again_on_error(self, calls: Sequence[Call], by: float | None = None) -> tuple[list[Any], bool]:
        """Run idempotent calls, once more on a fresh connection after a connection error; and whether they
        may have run twice: the error came after they were sent, so the server may have run them and only the
        reply was lost (a release retried then finds its own work done and must not read that as "not ours").
        ``by``: as :meth:`run`'s, for every reply awaited."""
        try:
            conn, hello = await self._send(calls, by=by)
        except RedisConnectionError:  # nothing reached the server: a plain retry
            conn, hello = await self._send(calls, by=by)
            return await self._receive(conn, calls, hello, self.reply_deadline(by)), False
        try:
            return await self._receive(conn, calls, hello, self.reply_deadline(by)), False
        except RedisConnectionError:
            pass
        conn, hello = await self._send(calls, by=by)
        return await self._receive(conn, calls, hello, self.reply_deadline(by)), True

    def abandon(self, pending: Pending | AsyncConnection) -> None:
        """Give back a connection whose replies will not be read (a fan-out interrupted half-way): it is
        dropped, as unread replies would be the next caller's."""
        conn = pending.conn if isinstance(pending, Pending) else pending
        conn.drop()
        self.pool.release(conn)

    async def close(self) -> None:
        await self.pool.disconnect()
