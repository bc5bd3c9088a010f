"""An in-repo TCP fault proxy for tests (asyncio in one background thread).

    proxy = FaultProxy("127.0.0.1", redis.port).start()
    client = redis.Redis(port=proxy.port)
    proxy.set_mode("blackhole")                 # partition: nothing flows, sockets stay open
    proxy.set_mode("delay", seconds=0.3, direction="down")
    proxy.set_mode("drop_downstream")           # requests reach the server, replies vanish
    proxy.set_mode("reset")                     # RST every connection, now and on accept
    proxy.set_mode("pass")                      # heal
    proxy.stop()

Modes (switchable at any time from any thread; ``set_mode`` returns once the
mode is in effect inside the proxy):

``pass``
    forward both directions.
``delay``
    every chunk read in the affected direction (``up`` = client to server,
    ``down`` = server to client, ``both``) is delivered ``seconds`` later; order
    is preserved.
``blackhole``
    forward nothing and keep all sockets open. The proxy stops reading, so
    unsent bytes wait in socket buffers and are delivered when the mode changes
    back, like TCP retransmission after a partition heals. New connections are
    accepted but not connected upstream until the partition heals.
``drop_downstream``
    client-to-server bytes pass, server-to-client bytes read while in this mode
    are discarded (the stream the client sees is broken afterwards).
``reset``
    abort every existing connection with RST (``SO_LINGER(1, 0)``) on both
    sides, and reset every new connection as soon as it is accepted.
``close``
    close every existing connection with FIN on both sides, and close every
    new connection as soon as it is accepted.

``reset_all()`` / ``close_all()`` do the same to existing connections once,
without changing the mode. The proxy listens on 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import struct
import threading
from collections.abc import Coroutine
from dataclasses import dataclass
from enum import Enum
from types import TracebackType
from typing import Any, Literal, TypeVar

__all__ = ["Direction", "FaultProxy", "ProxyError", "ProxyMode"]

LOOPBACK = "127.0.0.1"
_CHUNK = 65536
_CALL_TIMEOUT = 10.0

Direction = Literal["up", "down", "both"]
_DIRECTIONS: tuple[str, ...] = ("up", "down", "both")
T = TypeVar("T")
P = TypeVar("P", bound="FaultProxy")


class ProxyError(RuntimeError):
    """The proxy is not running or was used incorrectly."""


class ProxyMode(str, Enum):
    PASS = "pass"
    DELAY = "delay"
    BLACKHOLE = "blackhole"
    DROP_DOWNSTREAM = "drop_downstream"
    RESET = "reset"
    CLOSE = "close"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class _State:
    mode: ProxyMode = ProxyMode.PASS
    seconds: float = 0.0
    direction: Direction = "both"


@dataclass(eq=False)
class _Conn:
    cid: int
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter | None = None
    task: asyncio.Task[None] | None = None
    closing: bool = False


def _rst(writer: asyncio.StreamWriter) -> None:
    """Abort with RST: SO_LINGER(on, 0) then close without flushing."""
    transport = writer.transport
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


class FaultProxy:
    """TCP proxy ``127.0.0.1:<port>`` -> ``target_host:target_port`` with switchable faults."""

    def __init__(
        self,
        target_host: str,
        target_port: int,
        *,
        listen_host: str = LOOPBACK,
        listen_port: int = 0,
        connect_timeout: float = 5.0,
        allow_remote_target: bool = False,
    ) -> None:
        if not allow_remote_target and not _is_loopback(target_host):
            raise ProxyError(f"target {target_host!r} is not a loopback address (allow_remote_target=False)")
        if not _is_loopback(listen_host):
            raise ProxyError(f"the proxy only listens on loopback, not {listen_host!r}")
        self.target_host = target_host
        self.target_port = target_port
        self.host = listen_host
        self._listen_port = listen_port
        self.connect_timeout = connect_timeout
        self._state = _State()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._flowing: asyncio.Event | None = None
        self._conns: set[_Conn] = set()
        self._handlers: set[asyncio.Task[Any]] = set()
        self._started = threading.Event()
        self._start_error: BaseException | None = None
        self._port: int | None = None
        self._next_id = 0
        self.connections_total = 0
        self.bytes_up = 0
        self.bytes_down = 0

    # ------------------------------------------------------------------ public

    @property
    def port(self) -> int:
        if self._port is None:
            raise ProxyError("proxy not started")
        return self._port

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    @property
    def target(self) -> tuple[str, int]:
        return (self.target_host, self.target_port)

    @property
    def mode(self) -> ProxyMode:
        return self._state.mode

    @property
    def delay_seconds(self) -> float:
        return self._state.seconds

    @property
    def direction(self) -> Direction:
        return self._state.direction

    @property
    def connections_active(self) -> int:
        return len(self._conns)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self: P) -> P:
        """Start the loop thread and the listener; returns self once accepting."""
        with self._lock:
            if self._thread is not None:
                raise ProxyError("proxy already started")
            self._thread = threading.Thread(
                target=self._run, name=f"FaultProxy->{self.target_host}:{self.target_port}", daemon=True
            )
            self._thread.start()
        self._started.wait(_CALL_TIMEOUT)
        if self._start_error is not None or self._port is None:
            self._thread.join(_CALL_TIMEOUT)
            raise ProxyError(f"proxy failed to start: {self._start_error!r}") from self._start_error
        return self

    def stop(self) -> None:
        """Close the listener and every connection, stop the thread. Idempotent."""
        with self._lock:
            thread, loop = self._thread, self._loop
            if thread is None or loop is None or not thread.is_alive():
                return
            if threading.current_thread() is thread:
                raise ProxyError("stop() called from the proxy thread")
            with contextlib.suppress(RuntimeError):  # loop already stopped
                asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(_CALL_TIMEOUT)
            thread.join(_CALL_TIMEOUT)

    def set_mode(
        self,
        mode: ProxyMode | str,
        *,
        seconds: float = 0.0,
        direction: Direction = "both",
    ) -> None:
        """Switch the fault mode; returns once it is in effect. ``seconds``/``direction`` are for delay."""
        mode = ProxyMode(mode)
        if direction not in _DIRECTIONS:
            raise ValueError(f"direction must be one of {_DIRECTIONS}, not {direction!r}")
        if mode is ProxyMode.DELAY:
            if seconds < 0:
                raise ValueError("delay seconds must be >= 0")
        elif seconds:
            raise ValueError(f"seconds only applies to mode 'delay', not {mode.value!r}")
        self._call(self._apply(_State(mode, float(seconds), direction)))

    def heal(self) -> None:
        """Back to ``pass``."""
        self.set_mode(ProxyMode.PASS)

    def delay(self, seconds: float, direction: Direction = "both") -> None:
        self.set_mode(ProxyMode.DELAY, seconds=seconds, direction=direction)

    def reset_all(self) -> int:
        """RST every existing connection now (mode unchanged). Returns how many."""
        return self._call(self._kill_all(rst=True))

    def close_all(self) -> int:
        """Close (FIN) every existing connection now (mode unchanged). Returns how many."""
        return self._call(self._kill_all(rst=False))

    def __enter__(self: P) -> P:
        if self._thread is None:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        port = self._port if self._port is not None else "?"
        return (
            f"<FaultProxy {self.host}:{port} -> {self.target_host}:{self.target_port}"
            f" mode={self._state.mode.value} active={self.connections_active}>"
        )

    # ------------------------------------------------------------------ thread side

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        loop = self._loop
        if loop is None or self._thread is None or not self._thread.is_alive():
            coro.close()
            raise ProxyError("proxy not running")
        if threading.current_thread() is self._thread:
            coro.close()
            raise ProxyError("FaultProxy methods must not be called from the proxy thread")
        return asyncio.run_coroutine_threadsafe(coro, loop).result(_CALL_TIMEOUT)

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            try:
                loop.run_until_complete(self._open())
            except BaseException as exc:
                self._start_error = exc
                return
            finally:
                self._started.set()
            loop.run_forever()
        finally:
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _open(self) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server = await asyncio.start_server(
            self._handle, self.host, self._listen_port, reuse_address=True, limit=_CHUNK
        )
        sock = self._server.sockets[0]
        self._port = int(sock.getsockname()[1])

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._kill_all(rst=False)
        if self._handlers:
            await asyncio.wait(set(self._handlers), timeout=2.0)
        if self._server is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
        assert self._loop is not None
        self._loop.call_soon(self._loop.stop)

    async def _apply(self, state: _State) -> None:
        self._state = state
        assert self._flowing is not None
        if state.mode is ProxyMode.BLACKHOLE:
            self._flowing.clear()
        else:
            self._flowing.set()
        if state.mode is ProxyMode.RESET:
            await self._kill_all(rst=True)
        elif state.mode is ProxyMode.CLOSE:
            await self._kill_all(rst=False)

    async def _kill_all(self, *, rst: bool) -> int:
        conns = [c for c in self._conns if not c.closing]
        for conn in conns:
            self._kill(conn, rst=rst)
        await asyncio.sleep(0)
        return len(conns)

    def _kill(self, conn: _Conn, *, rst: bool) -> None:
        if conn.closing:
            return
        conn.closing = True
        for writer in (conn.client, conn.upstream):
            if writer is None:
                continue
            if rst:
                _rst(writer)
            else:
                writer.close()
        if conn.task is not None and conn.task is not asyncio.current_task():
            conn.task.cancel()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handler = asyncio.current_task()
        if handler is not None:
            self._handlers.add(handler)
        self.connections_total += 1
        self._next_id += 1
        conn = _Conn(self._next_id, writer)
        self._conns.add(conn)
        try:
            mode = self._state.mode
            if mode is ProxyMode.RESET:
                self._kill(conn, rst=True)
                return
            if mode is ProxyMode.CLOSE:
                self._kill(conn, rst=False)
                return
            conn.task = asyncio.ensure_future(self._serve(conn, reader))
            await asyncio.wait({conn.task})
        finally:
            self._conns.discard(conn)
            for w in (conn.upstream, conn.client):
                if w is not None:
                    if not w.is_closing():
                        w.close()
                    with contextlib.suppress(Exception):
                        await w.wait_closed()
            if handler is not None:
                self._handlers.discard(handler)

    async def _wait_flowing(self) -> None:
        flowing = self._flowing
        assert flowing is not None
        if not flowing.is_set():
            await flowing.wait()

    async def _serve(self, conn: _Conn, client_reader: asyncio.StreamReader) -> None:
        await self._wait_flowing()  # a partitioned client does not reach the server
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(self.target_host, self.target_port, limit=_CHUNK),
                self.connect_timeout,
            )
        except (OSError, asyncio.TimeoutError):
            self._kill(conn, rst=True)  # like "connection refused" seen through the proxy
            return
        conn.upstream = up_writer
        if conn.closing:  # killed while connecting
            _rst(up_writer)
            return
        up_q: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()
        down_q: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()
        await asyncio.gather(
            self._pump(conn, client_reader, up_q, "up"),
            self._deliver(conn, up_q, up_writer),
            self._pump(conn, up_reader, down_q, "down"),
            self._deliver(conn, down_q, conn.client),
        )

    async def _pump(
        self,
        conn: _Conn,
        reader: asyncio.StreamReader,
        queue: asyncio.Queue[tuple[float, bytes] | None],
        direction: Literal["up", "down"],
    ) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                await self._wait_flowing()  # blackhole: stop reading, bytes wait in the socket
                data = await reader.read(_CHUNK)
                if not data:
                    break
                state = self._state
                if state.mode is ProxyMode.DROP_DOWNSTREAM and direction == "down":
                    continue
                if direction == "up":
                    self.bytes_up += len(data)
                else:
                    self.bytes_down += len(data)
                delay = 0.0
                if state.mode is ProxyMode.DELAY and state.direction in (direction, "both"):
                    delay = state.seconds
                queue.put_nowait((loop.time() + delay, data))
        except OSError:
            # the peer reset/failed: pass the reset on to the other side
            self._kill(conn, rst=True)
        finally:
            queue.put_nowait(None)

    async def _deliver(
        self,
        conn: _Conn,
        queue: asyncio.Queue[tuple[float, bytes] | None],
        writer: asyncio.StreamWriter,
    ) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                item = await queue.get()
                if item is None:
                    if not writer.is_closing() and writer.can_write_eof():
                        writer.write_eof()  # half-close, like the peer did
                    return
                due, data = item
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                await self._wait_flowing()
                if writer.is_closing():
                    return
                writer.write(data)
                await writer.drain()
        except OSError:
            self._kill(conn, rst=True)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
