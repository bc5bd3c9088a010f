"""One Redis server as the drivers use it: pipelined script calls on a pooled connection.

Both faces (blocking :class:`SyncNode`, asyncio :class:`AsyncNode`) do the same
few things and nothing else; what to send and how to read the replies lives in
:mod:`.config` and :mod:`.flow`, so the twins stay thin:

* a call is split into :meth:`send` and :meth:`receive`, so that a Redlock
  fan-out sends to every master first and then reads the replies against one
  shared deadline (all masters in parallel, no thread per master);
* a fresh connection prepends its hello (``INFO server``, ``CONFIG GET``, and
  ``SCRIPT LOAD`` the first time) to the first commands it carries; with
  ``strict=true`` the hello goes alone first, so a refused server runs nothing;
* a ``NOSCRIPT`` reply reloads the script and runs the failed calls again on the
  same connection (``NOSCRIPT`` means they did not run);
* a connection error is retried once on a fresh connection only for idempotent
  calls (renew, release, holder); never for acquire. :meth:`SyncNode.run_again_on_error`
  also says whether the error came after the calls were sent (they may have run, and
  only the reply was lost): a retried release needs to know.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError

from .config import NodeSpec, NodeState, apply_hello, hello_commands
from .pool import ConnectionPool
from .resp import read_replies
from .scripts import Script

__all__ = ["AsyncNode", "Call", "SyncNode", "pack_calls"]


@dataclass(frozen=True)
class Call:
    """One command: a script by SHA with its KEYS and ARGV, or a plain command (``script=None``)."""

    script: Script | None
    keys: tuple[bytes, ...] = ()
    args: tuple[Any, ...] = ()

    def command(self) -> tuple[Any, ...]:
        if self.script is None:
            return self.args
        return ("EVALSHA", self.script.sha, len(self.keys), *self.keys, *self.args)


@dataclass
class Pending:
    conn: Any
    calls: Sequence[Call]
    hello: int


def _reload_plan(calls: Sequence[Call], replies: list[Any]) -> tuple[list[int], list[tuple[Any, ...]]]:
    """Indexes of calls that got NOSCRIPT, and the commands that load their scripts and rerun them."""
    redo = [i for i, r in enumerate(replies) if isinstance(r, NoScriptError)]
    scripts: dict[str, Script] = {}
    for i in redo:
        script = calls[i].script
        if script is not None:
            scripts[script.sha] = script
    loads: list[tuple[Any, ...]] = [("SCRIPT", "LOAD", s.source) for s in scripts.values()]
    return redo, loads + [calls[i].command() for i in redo]


def _bulk(arg: Any) -> bytes:
    data = arg if type(arg) is bytes else str(arg).encode()
    return b"$%d\r\n%b\r\n" % (len(data), data)


def pack(commands: Sequence[tuple[Any, ...]]) -> bytes:
    """RESP-encode commands of bytes/str/int arguments."""
    return b"".join(b"*%d\r\n" % len(args) + b"".join(map(_bulk, args)) for args in commands)


_heads: dict[tuple[str, int, int], bytes] = {}


def pack_calls(calls: Sequence[Call]) -> bytes:
    """RESP-encode calls; the constant ``EVALSHA sha numkeys`` head of each shape is encoded once (several
    times faster than redis-py's general packer, which matters for a renewal round of thousands of calls)."""
    out: list[bytes] = []
    for call in calls:
        script = call.script
        if script is None:
            out.append(pack([call.args]))
            continue
        shape = (script.sha, len(call.keys), len(call.args))
        head = _heads.get(shape)
        if head is None:
            size = b"*%d\r\n" % (3 + shape[1] + shape[2])
            head = _heads[shape] = size + pack([("EVALSHA", script.sha, shape[1])])[4:]
        out.append(head)
        out.extend(map(_bulk, call.keys))
        out.extend(map(_bulk, call.args))
    return b"".join(out)


def _remaining(deadline: float) -> float:
    return max(0.001, deadline - time.monotonic())


class SyncNode:
    def __init__(self, spec: NodeSpec) -> None:
        self.spec = spec
        self.state = NodeState(spec.label, spec.options.strict)
        kwargs = spec.pool_kwargs(_mark_fresh)
        size, wait = kwargs.pop("max_connections"), kwargs.pop("timeout")
        cls: Any = redis.Connection
        if spec.path is not None:
            cls = redis.UnixDomainSocketConnection
        elif spec.tls:
            cls = redis.SSLConnection
        self.pool = ConnectionPool(lambda: cls(**kwargs), size, wait)

    def send(self, calls: Sequence[Call], payload: bytes | None = None) -> Pending:
        """Send ``calls`` (``payload``: their encoding, when a fan-out encoded them once for every master)."""
        if self.state.refused is not None:
            raise self.state.refused
        conn = self.pool.get()
        try:
            hello: list[tuple[Any, ...]] = []
            if conn.__dict__.pop("lockkit_fresh", False):
                hello = hello_commands(self.state)
                if self.state.strict:  # check before anything runs: a refused server must not take locks
                    conn.send_packed_command([pack(hello)])
                    apply_hello(self.state, self._read(conn, len(hello), time.monotonic() + self.spec.options.timeout))
                    hello = []
            conn.send_packed_command([pack(hello) + (payload or pack_calls(calls))])
        except BaseException:
            conn.disconnect()
            self.pool.release(conn)
            raise
        return Pending(conn, calls, len(hello))

    def _read(self, conn: Any, count: int, deadline: float) -> list[Any]:
        # the first reply waits until the (shared) deadline; error replies come back as exception objects
        return read_replies(conn, count, deadline)

    def receive(self, pending: Pending, deadline: float) -> list[Any]:
        conn = pending.conn
        ok = False
        try:
            replies = self._read(conn, pending.hello + len(pending.calls), deadline)
            if pending.hello:
                apply_hello(self.state, replies[: pending.hello])
            replies = replies[pending.hello :]
            redo, commands = _reload_plan(pending.calls, replies)
            if redo:
                conn.send_packed_command([pack(commands)])
                again = self._read(conn, len(commands), time.monotonic() + self.spec.options.timeout)
                for index, reply in zip(redo, again[len(commands) - len(redo) :], strict=False):
                    replies[index] = reply
            ok = True
            return replies
        finally:
            if not ok:
                conn.disconnect()
            self.pool.release(conn)

    def run(self, calls: Sequence[Call], idempotent: bool) -> list[Any]:
        if idempotent:
            return self.run_again_on_error(calls)[0]
        return self.receive(self.send(calls), time.monotonic() + self.spec.options.timeout)

    def run_again_on_error(self, calls: Sequence[Call]) -> tuple[list[Any], bool]:
        """Run idempotent calls, once more on a fresh connection after a connection error; and whether they
        may have run twice: the error came after they were sent, so the server may have run them and only the
        reply was lost (a release retried then finds its own work done and must not read that as "not ours")."""
        try:
            pending = self.send(calls)
        except RedisConnectionError:  # nothing reached the server: a plain retry
            return self.receive(self.send(calls), time.monotonic() + self.spec.options.timeout), False
        try:
            return self.receive(pending, time.monotonic() + self.spec.options.timeout), False
        except RedisConnectionError:
            pass
        return self.receive(self.send(calls), time.monotonic() + self.spec.options.timeout), True

    def close(self) -> None:
        self.pool.disconnect()


def _mark_fresh(conn: Any) -> None:
    conn.on_connect()
    conn.lockkit_fresh = True


async def _amark_fresh(conn: Any) -> None:
    await conn.on_connect()
    conn.lockkit_fresh = True


class AsyncNode:
    """The awaitable twin of :class:`SyncNode` (same steps, redis.asyncio connections)."""

    def __init__(self, spec: NodeSpec) -> None:
        self.spec = spec
        self.state = NodeState(spec.label, spec.options.strict)
        kwargs = spec.pool_kwargs(_amark_fresh)
        if spec.path is not None:
            kwargs["connection_class"] = redis.asyncio.UnixDomainSocketConnection
        elif spec.tls:
            kwargs["connection_class"] = redis.asyncio.SSLConnection
        self.pool: Any = redis.asyncio.BlockingConnectionPool(**kwargs)

    async def send(self, calls: Sequence[Call], payload: bytes | None = None) -> Pending:
        """Send ``calls`` (``payload``: their encoding, when a fan-out encoded them once for every master)."""
        if self.state.refused is not None:
            raise self.state.refused
        conn = await self.pool.get_connection()
        try:
            hello: list[tuple[Any, ...]] = []
            if conn.__dict__.pop("lockkit_fresh", False):
                hello = hello_commands(self.state)
                if self.state.strict:
                    await conn.send_packed_command([pack(hello)])
                    deadline = time.monotonic() + self.spec.options.timeout
                    apply_hello(self.state, await self._read(conn, len(hello), deadline))
                    hello = []
            await conn.send_packed_command([pack(hello) + (payload or pack_calls(calls))])
        except BaseException:
            await conn.disconnect()
            await self.pool.release(conn)
            raise
        return Pending(conn, calls, len(hello))

    async def _read(self, conn: Any, count: int, deadline: float) -> list[Any]:
        replies: list[Any] = []
        for i in range(count):
            try:
                replies.append(
                    await (conn.read_response(timeout=_remaining(deadline)) if i == 0 else conn.read_response())
                )
            except ResponseError as exc:
                replies.append(exc)
        return replies

    async def receive(self, pending: Pending, deadline: float) -> list[Any]:
        conn = pending.conn
        ok = False
        try:
            replies = await self._read(conn, pending.hello + len(pending.calls), deadline)
            if pending.hello:
                apply_hello(self.state, replies[: pending.hello])
            replies = replies[pending.hello :]
            redo, commands = _reload_plan(pending.calls, replies)
            if redo:
                await conn.send_packed_command([pack(commands)])
                again = await self._read(conn, len(commands), time.monotonic() + self.spec.options.timeout)
                for index, reply in zip(redo, again[len(commands) - len(redo) :], strict=False):
                    replies[index] = reply
            ok = True
            return replies
        finally:
            if not ok:
                await conn.disconnect()
            await self.pool.release(conn)

    async def run(self, calls: Sequence[Call], idempotent: bool) -> list[Any]:
        if idempotent:
            return (await self.run_again_on_error(calls))[0]
        return await self.receive(await self.send(calls), time.monotonic() + self.spec.options.timeout)

    async def run_again_on_error(self, calls: Sequence[Call]) -> tuple[list[Any], bool]:
        """As :meth:`SyncNode.run_again_on_error`."""
        try:
            pending = await self.send(calls)
        except RedisConnectionError:
            return await self.receive(await self.send(calls), time.monotonic() + self.spec.options.timeout), False
        try:
            return await self.receive(pending, time.monotonic() + self.spec.options.timeout), False
        except RedisConnectionError:
            pass
        return await self.receive(await self.send(calls), time.monotonic() + self.spec.options.timeout), True

    async def close(self) -> None:
        await self.pool.disconnect()
