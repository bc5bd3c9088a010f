"""Start throw-away Redis, ZooKeeper and etcd servers on loopback for tests.

Every server:

* binds 127.0.0.1 only, on a free port picked at start (a start that loses the
  port race to another process is retried on a new port);
* keeps its data and its log in a fresh temporary directory (``.workdir``,
  ``.data_dir``, ``.log_path``), deleted by :meth:`Server.stop`;
* is started in its own session (``start_new_session=True``) and is only ever
  signalled by its own PID (its process group is swept once the leader has
  exited, while the leader is still an unreaped zombie, so the group id cannot
  have been reused);
* is ready when a protocol probe answers (polled every 50 ms, 15 s deadline).

This module is test infrastructure; it is not part of the ``lockkit`` wheel.
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any, ClassVar, Generic, TypeVar
from urllib.parse import quote

__all__ = [
    "JAVA_DIR",
    "LOOPBACK",
    "POLL_INTERVAL",
    "READY_TIMEOUT",
    "STOP_TIMEOUT",
    "EtcdCluster",
    "EtcdServer",
    "PostgresServer",
    "RedisServer",
    "RedlockServers",
    "SentinelServer",
    "SentinelSet",
    "Server",
    "ServerError",
    "ServerNotReady",
    "ZooKeeperServer",
    "free_port",
    "redlock_url",
    "start_redis_masters",
    "zookeeper_classpath",
]

LOOPBACK = "127.0.0.1"
READY_TIMEOUT = 15.0
POLL_INTERVAL = 0.05
STOP_TIMEOUT = 5.0
JAVA_DIR = Path("/usr/share/java")

#: How many times a start is retried on fresh ports after "address already in use".
PORT_RETRIES = 5
LOG_TAIL_LINES = 40

_ADDR_IN_USE = re.compile(r"address already in use|BindException", re.IGNORECASE)

S = TypeVar("S", bound="Server")
R = TypeVar("R", bound="RedlockServers")
M = TypeVar("M", bound="Server")
G = TypeVar("G", bound="ServerGroup[Any]")
C = TypeVar("C", bound="EtcdCluster")
SS = TypeVar("SS", bound="SentinelSet")
RC = TypeVar("RC", bound="RedisCluster")


class ServerError(RuntimeError):
    """A test server could not be started or controlled."""


class ServerNotReady(ServerError):
    """A server did not answer its readiness probe in time (message has the log tail)."""


# --------------------------------------------------------------------------- ports

_issued_lock = threading.Lock()
_issued_ports: set[int] = set()


def free_port(host: str = LOOPBACK) -> int:
    """Return a TCP port that is free on ``host`` right now.

    Binds ``host:0`` and closes the socket, so another process may still grab
    the port before the caller binds it: servers retry on "address in use".
    Ports already handed out by this process are not handed out again.
    """
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port: int = sock.getsockname()[1]
        with _issued_lock:
            if port not in _issued_ports:
                _issued_ports.add(port)
                return port
    raise ServerError("could not find a free port that was not already handed out")


# --------------------------------------------------------------------------- helpers


def _log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        data = path.read_bytes()
    except OSError as exc:
        return f"<log unavailable: {exc}>"
    text = data[-16384:].decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def _require_binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise ServerError(f"{name!r} not found on PATH; install it with `python -m backends install`")
    return path


def _clean_env(drop_prefixes: Sequence[str] = ()) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not any(k.startswith(p) for p in drop_prefixes)}
    env.setdefault("LC_ALL", "C.UTF-8")
    return env


# --------------------------------------------------------------------------- base

# Servers with a live process or temp dir; stopped at interpreter exit as a safety net
# (fixtures and context managers normally stop them first; SIGKILL of the test run
# itself still leaves them behind).
_live: set[Server] = set()
_live_lock = threading.Lock()


@atexit.register
def _stop_leftovers() -> None:
    with _live_lock:
        leftovers = list(_live)
    for server in leftovers:
        with contextlib.suppress(Exception):
            server.stop()


class Server(ABC):
    """One server process on 127.0.0.1 with its own temporary directory."""

    #: short name used in logs, temp dir names and ``python -m backends up``
    name: ClassVar[str] = "server"

    def __init__(
        self,
        *,
        extra_args: Sequence[str] = (),
        port: int | None = None,
        ready_timeout: float = READY_TIMEOUT,
        env: Mapping[str, str] | None = None,
        tmp_parent: str | os.PathLike[str] | None = None,
    ) -> None:
        self.host: str = LOOPBACK
        self.extra_args: list[str] = list(extra_args)
        self.ready_timeout = ready_timeout
        #: seconds the last start() took until the probe answered
        self.ready_seconds: float | None = None
        self._fixed_port = port is not None
        self._port: int | None = port
        self._extra_env: dict[str, str] = dict(env or {})
        self._tmp_parent = None if tmp_parent is None else os.fspath(tmp_parent)
        self._workdir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None
        self._paused = False

    # ----------------------------------------------------------- abstract hooks

    @abstractmethod
    def _command(self) -> list[str]:
        """argv for the server process (called after ports and dirs are set up)."""

    @abstractmethod
    def probe(self, timeout: float = 0.5) -> bool:
        """True if the server answers its protocol health check right now."""

    @property
    @abstractmethod
    def url(self) -> str:
        """lockkit-style backend URL of this server."""

    def _allocate_extra_ports(self) -> None:
        """Pick any additional ports (e.g. etcd's peer port)."""
        return None

    def _prepare(self) -> None:
        """Write config files into the work dir before the process is started."""
        return None

    def _env(self) -> dict[str, str]:
        env = _clean_env()
        env.update(self._extra_env)
        return env

    # ----------------------------------------------------------- properties

    @property
    def port(self) -> int:
        if self._port is None:
            raise ServerError(f"{self.name}: not started")
        return self._port

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise ServerError(f"{self.name}: not started")
        return self._proc.pid

    @property
    def workdir(self) -> Path:
        if self._workdir is None:
            raise ServerError(f"{self.name}: not started")
        return self._workdir

    @property
    def data_dir(self) -> Path:
        return self.workdir / "data"

    @property
    def log_path(self) -> Path:
        return self.workdir / "server.log"

    @property
    def running(self) -> bool:
        """True while the process exists (also while paused)."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def paused(self) -> bool:
        return self._paused

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return _log_tail(self.log_path, lines)

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        port = self._port if self._port is not None else "?"
        pid = self._proc.pid if self._proc is not None else "?"
        return f"<{type(self).__name__} {self.host}:{port} pid={pid} {state}>"

    # ----------------------------------------------------------- lifecycle

    def start(self: S) -> S:
        """Start the server and block until it answers its probe. Returns self."""
        if self.running:
            raise ServerError(f"{self.name}: already running (pid {self.pid})")
        if self._workdir is None:
            self._workdir = Path(tempfile.mkdtemp(prefix=f"lockkit-{self.name}-", dir=self._tmp_parent))
            self.data_dir.mkdir(mode=0o700)
        with _live_lock:
            _live.add(self)
        try:
            self._start_with_port_retries()
        except BaseException:
            self._cleanup_dir()
            raise
        return self

    def _start_with_port_retries(self) -> None:
        attempts = 1 if self._fixed_port else PORT_RETRIES
        for attempt in range(1, attempts + 1):
            if not self._fixed_port:
                self._port = free_port(self.host)
                self._allocate_extra_ports()
            try:
                self._spawn_and_wait()
                return
            except ServerNotReady as exc:
                in_use = bool(_ADDR_IN_USE.search(str(exc)))
                if not in_use or attempt == attempts:
                    raise
                self._reset_data_dir()

    def _spawn_and_wait(self) -> None:
        self._prepare()
        log = open(self.log_path, "ab")  # noqa: SIM115 - kept open for the child's lifetime
        log.write(f"=== lockkit: starting {self.name} on {self.host}:{self._port} ===\n".encode())
        log.flush()
        started = time.monotonic()
        try:
            proc = subprocess.Popen(
                self._command(),
                cwd=self.workdir,
                env=self._env(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        except BaseException:
            log.close()
            raise
        self._proc = proc
        self._log_file = log
        self._paused = False
        try:
            self._wait_ready(started)
        except BaseException:
            self._terminate()
            raise
        self.ready_seconds = time.monotonic() - started

    def _wait_ready(self, started: float) -> None:
        assert self._proc is not None
        deadline = started + self.ready_timeout
        while True:
            rc = self._proc.poll()
            if rc is not None:
                raise ServerNotReady(
                    f"{self.name} on {self.host}:{self._port} exited with status {rc} before it was ready;"
                    f" log {self.log_path}:\n{self.log_tail()}"
                )
            remaining = deadline - time.monotonic()
            if self.probe(timeout=max(0.05, min(0.5, remaining))):
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ServerNotReady(
                    f"{self.name} on {self.host}:{self._port} (pid {self._proc.pid}) not ready after"
                    f" {self.ready_timeout:.1f} s; log {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(min(POLL_INTERVAL, remaining))

    def wait_ready(self, timeout: float | None = None) -> float:
        """Poll the probe until it answers; returns the seconds waited. For use after resume()."""
        started = time.monotonic()
        deadline = started + (self.ready_timeout if timeout is None else timeout)
        while not self.probe(timeout=0.5):
            if not self.running:
                raise ServerNotReady(f"{self.name}: process exited; log:\n{self.log_tail()}")
            if time.monotonic() >= deadline:
                raise ServerNotReady(f"{self.name}: probe failed until deadline; log:\n{self.log_tail()}")
            time.sleep(POLL_INTERVAL)
        return time.monotonic() - started

    def stop(self) -> None:
        """SIGTERM, SIGKILL after 5 s, reap, then delete the temporary directory. Idempotent."""
        try:
            self._terminate()
        finally:
            self._cleanup_dir()

    def kill(self) -> None:
        """SIGKILL the server (like a crash) and reap it. Keeps the data dir for restart()."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            self._finish_process()
            return
        self._signal(signal.SIGKILL)
        self._reap(None)

    def pause(self) -> None:
        """SIGSTOP: the process keeps its sockets but answers nothing."""
        self._signal(signal.SIGSTOP)
        self._paused = True

    def resume(self) -> None:
        """SIGCONT after pause()."""
        self._signal(signal.SIGCONT)
        self._paused = False

    def restart(self: S, keep_data: bool = True) -> S:
        """Stop (gracefully) if running, then start again on the same port(s).

        With ``keep_data=False`` the data directory is emptied first. Redis runs
        with ``--save '' --appendonly no`` so it keeps nothing anyway unless
        extra args enable persistence.
        """
        if self.running:
            self._terminate()
        else:
            self._finish_process()
        if self._workdir is None:
            raise ServerError(f"{self.name}: restart() after stop(); use start()")
        if not keep_data:
            self._reset_data_dir()
        fixed = self._fixed_port
        self._fixed_port = True  # same port(s): no re-allocation
        try:
            self._restart_same_port()
        finally:
            self._fixed_port = fixed
        return self

    def _restart_same_port(self) -> None:
        # A port held by a just-killed process is normally free at once (all three
        # servers use SO_REUSEADDR); retry briefly in case it is still being released.
        deadline = time.monotonic() + 2.0
        while True:
            try:
                self._spawn_and_wait()
                return
            except ServerNotReady as exc:
                if not _ADDR_IN_USE.search(str(exc)) or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    # ----------------------------------------------------------- context manager

    def __enter__(self: S) -> S:
        if not self.running:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ----------------------------------------------------------- internals

    def _signal(self, sig: signal.Signals) -> None:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            raise ServerError(f"{self.name}: not running")
        os.kill(proc.pid, sig)

    def _terminate(self) -> None:
        proc = self._proc
        if proc is None:
            self._finish_process()
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
                os.kill(proc.pid, signal.SIGCONT)  # a paused server must run to handle SIGTERM
            if not self._wait_exit_noreap(STOP_TIMEOUT):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
        self._reap(None)

    def _wait_exit_noreap(self, timeout: float | None) -> bool:
        """Wait until the child has exited but leave it a zombie (its PID stays reserved)."""
        proc = self._proc
        assert proc is not None
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if proc.returncode is not None:
                return True
            try:
                info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return True
            if info is not None:
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.01)

    def _reap(self, timeout: float | None) -> None:
        proc = self._proc
        assert proc is not None
        self._wait_exit_noreap(timeout)
        if proc.returncode is None:
            # The leader is a zombie: its PID (= our process group id) cannot have been
            # reused, so the group contains only processes it forked (e.g. a Redis
            # BGSAVE child). Kill those, then reap the leader.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        self._finish_process()

    def _finish_process(self) -> None:
        self._paused = False
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def _reset_data_dir(self) -> None:
        shutil.rmtree(self.data_dir, ignore_errors=True)
        self.data_dir.mkdir(mode=0o700)

    def _cleanup_dir(self) -> None:
        self._finish_process()
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None
        with _live_lock:
            _live.discard(self)


# --------------------------------------------------------------------------- Redis


class RedisServer(Server):
    """``redis-server`` without persistence, DEBUG allowed from loopback."""

    name = "redis"

    def __init__(
        self,
        *,
        password: str | None = None,
        db: int = 0,
        extra_args: Sequence[str] = (),
        port: int | None = None,
        ready_timeout: float = READY_TIMEOUT,
        env: Mapping[str, str] | None = None,
        tmp_parent: str | os.PathLike[str] | None = None,
    ) -> None:
        super().__init__(extra_args=extra_args, port=port, ready_timeout=ready_timeout, env=env, tmp_parent=tmp_parent)
        self.password = password
        self.db = db

    def _command(self) -> list[str]:
        argv = [
            _require_binary("redis-server"),
            "--port", str(self.port),
            "--bind", self.host,
            "--protected-mode", "yes",
            "--save", "",
            "--appendonly", "no",
            "--enable-debug-command", "local",
            "--daemonize", "no",
            "--dir", str(self.data_dir),
            "--logfile", "",
        ]  # fmt: skip
        if self.password is not None:
            argv += ["--requirepass", self.password]
        return argv + self.extra_args

    @property
    def url(self) -> str:
        auth = "" if self.password is None else f":{quote(self.password, safe='')}@"
        return f"redis://{auth}{self.host}:{self.port}/{self.db}"

    def probe(self, timeout: float = 0.5) -> bool:
        """Raw-socket PING; ``-NOAUTH`` also counts as up when a password is set."""
        try:
            with socket.create_connection(self.address, timeout=timeout) as sock:
                if self.password is not None:
                    pw = self.password.encode()
                    sock.sendall(b"*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n" % (len(pw), pw))
                    if not _read_line(sock).startswith(b"+OK"):
                        return False
                sock.sendall(b"*1\r\n$4\r\nPING\r\n")
                return _read_line(sock).startswith(b"+PONG")
        except OSError:
            return False


def _read_line(sock: socket.socket) -> bytes:
    buf = b""
    while not buf.endswith(b"\r\n") and len(buf) < 4096:
        chunk = sock.recv(4096)
        if not chunk:
            break
        buf += chunk
    return buf


class ServerGroup(Generic[M]):
    """What a group of servers shares: its members as a sequence, stopping them all, ``with`` support."""

    members: list[M]

    def start(self: G) -> G:
        raise NotImplementedError

    def _stop_members(self, kill_first: bool = False) -> None:
        """Stop every member this group started (by PID), keep going past errors, then raise the first."""
        errors: list[BaseException] = []
        for member in self.members:
            try:
                if kill_first:
                    member.kill()
                member.stop()
            except Exception as exc:  # keep stopping the others
                errors.append(exc)
        self.members = []
        if errors:
            raise errors[0]

    def stop(self) -> None:
        self._stop_members()

    def __iter__(self) -> Iterator[M]:
        return iter(self.members)

    def __len__(self) -> int:
        return len(self.members)

    def __getitem__(self, index: int) -> M:
        return self.members[index]

    def __enter__(self: G) -> G:
        if not self.members:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class RedlockServers(ServerGroup[RedisServer]):
    """N independent Redis masters (default 5) for Redlock."""

    def __init__(self, n: int = 5, **redis_kwargs: object) -> None:
        if n < 1:
            raise ValueError("n must be >= 1")
        self.n = n
        self._kwargs = redis_kwargs
        self.members = []

    @property
    def servers(self) -> list[RedisServer]:
        return self.members

    def start(self: R) -> R:
        try:
            for _ in range(self.n):
                server = RedisServer(**self._kwargs)  # type: ignore[arg-type]
                self.members.append(server)
                server.start()
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def url(self) -> str:
        return redlock_url(self.members)

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.members]


def redlock_url(servers: Sequence[RedisServer], db: int = 0) -> str:
    """``redlock://h1:p1,h2:p2,.../db`` for a list of Redis servers."""
    if not servers:
        raise ValueError("no servers")
    hosts = ",".join(f"{s.host}:{s.port}" for s in servers)
    return f"redlock://{hosts}/{db}"


def start_redis_masters(n: int = 5, **redis_kwargs: object) -> list[RedisServer]:
    """Start ``n`` independent Redis masters; on failure, stops the ones already started."""
    group = RedlockServers(n, **redis_kwargs).start()
    return list(group.servers)


# --------------------------------------------------------------------------- Redis Sentinel


class SentinelServer(Server):
    """``redis-sentinel`` watching one master as ``service``; it rewrites its config file, so it gets its own."""

    name = "sentinel"

    def __init__(
        self,
        master: tuple[str, int],
        *,
        service: str = "mymaster",
        quorum: int = 2,
        down_after_ms: int = 500,
        failover_timeout_ms: int = 3000,
        password: str | None = None,
        extra_config: Sequence[str] = (),
        ready_timeout: float = READY_TIMEOUT,
    ) -> None:
        super().__init__(ready_timeout=ready_timeout)
        self.master = master
        self.service = service
        self.quorum = quorum
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.password = password
        self.extra_config = list(extra_config)
        """More lines of sentinel.conf (the TLS ones of a :class:`SentinelSet` with ``tls_dir``)."""

    @property
    def config_path(self) -> Path:
        return self.workdir / "sentinel.conf"

    def _prepare(self) -> None:
        host, port = self.master
        lines = [
            f"port {self.port}",
            f"bind {self.host}",
            "daemonize no",
            'logfile ""',
            f"dir {self.data_dir}",
            "protected-mode no",
            f"sentinel monitor {self.service} {host} {port} {self.quorum}",
            f"sentinel down-after-milliseconds {self.service} {self.down_after_ms}",
            f"sentinel failover-timeout {self.service} {self.failover_timeout_ms}",
            f"sentinel parallel-syncs {self.service} 2",
        ]
        if self.password is not None:
            lines.append(f"requirepass {self.password}")
        lines += self.extra_config
        self.config_path.write_text("\n".join(lines) + "\n")

    def _command(self) -> list[str]:
        return [_require_binary("redis-sentinel"), str(self.config_path)]

    @property
    def url(self) -> str:
        return f"redis+sentinel://{self.host}:{self.port}/{self.service}/0"

    def probe(self, timeout: float = 0.5) -> bool:
        return RedisServer.probe(self, timeout)  # type: ignore[arg-type]  # same PING (and AUTH) on a socket

    def ask(self, *command: str) -> Any:
        """One command to this sentinel (redis-py, decoded replies)."""
        import redis

        client = redis.Redis(self.host, self.port, password=self.password, socket_timeout=2, decode_responses=True)
        try:
            return client.execute_command(*command)
        finally:
            client.close()


def _redis_ask(server: RedisServer, *command: str) -> Any:
    import redis

    client = redis.Redis(server.host, server.port, socket_timeout=2, decode_responses=True)
    try:
        return client.execute_command(*command)
    finally:
        client.close()


class SentinelSet(ServerGroup[Server]):
    """One master, ``replicas`` replicas of it and ``sentinels`` sentinels watching them, all on loopback.

    ``start`` returns once every sentinel knows every replica and every other sentinel (so that a failover
    can be voted) and every replica is in sync. Members are stopped by PID like every server here;
    ``kill_master`` SIGKILLs the current master, ``wait_for_failover`` waits until the sentinels name another.

    With ``tls_dir`` (a directory holding ``ca.pem`` and a ``server.pem``/``server.key`` valid for 127.0.0.1,
    see :mod:`backends.tls`) every member also listens for TLS on a port of its own, replication and the
    sentinels' links run over TLS (``tls-replication yes``), so the sentinels announce the TLS ports, and
    :attr:`url` is a ``rediss+sentinel://`` URL trusting that CA. The plain ports stay open for the harness's
    own probes and questions.
    """

    def __init__(
        self,
        replicas: int = 2,
        sentinels: int = 3,
        *,
        service: str = "mymaster",
        down_after_ms: int = 500,
        failover_timeout_ms: int = 3000,
        tls_dir: Path | None = None,
    ) -> None:
        self.n_replicas, self.n_sentinels = replicas, sentinels
        self.service = service
        self.down_after_ms, self.failover_timeout_ms = down_after_ms, failover_timeout_ms
        self.tls_dir = tls_dir
        self.tls_ports: dict[Server, int] = {}
        """Each member's TLS port (only with ``tls_dir``)."""
        self.members = []
        self.redis: list[RedisServer] = []
        self.sentinels: list[SentinelServer] = []

    def _tls_lines(self, member: Server) -> list[str]:
        """The TLS settings of one member (``name value`` pairs), with a TLS port allocated for it."""
        if self.tls_dir is None:
            return []
        d = self.tls_dir
        self.tls_ports[member] = port = free_port()
        return [
            f"tls-port {port}", f"tls-cert-file {d / 'server.pem'}", f"tls-key-file {d / 'server.key'}",
            f"tls-ca-cert-file {d / 'ca.pem'}", "tls-auth-clients no", "tls-replication yes",
        ]  # fmt: skip

    def _announced(self, server: Server) -> tuple[str, int]:
        """The address the sentinels name ``server`` by: its TLS port with ``tls_dir``."""
        return (server.host, self.tls_ports[server]) if self.tls_dir is not None else server.address

    def _redis(self, args: list[str]) -> RedisServer:
        server = RedisServer(extra_args=args)
        for line in self._tls_lines(server):  # the same settings as redis-server arguments
            setting, value = line.split(" ", 1)
            server.extra_args += [f"--{setting}", value]
        self.members.append(server)
        self.redis.append(server.start())
        return server

    def start(self: SS) -> SS:
        try:
            # No delay before a diskless full sync (5 s by default): the replicas are in sync at once.
            sync = ["--repl-diskless-sync-delay", "0"]
            master = self._redis(sync)
            host, port = self._announced(master)
            for _ in range(self.n_replicas):
                self._redis([*sync, "--replicaof", host, str(port)])
            for _ in range(self.n_sentinels):
                sentinel = SentinelServer(
                    (host, port),
                    service=self.service,
                    quorum=self.n_sentinels // 2 + 1,
                    down_after_ms=self.down_after_ms,
                    failover_timeout_ms=self.failover_timeout_ms,
                )
                sentinel.extra_config = self._tls_lines(sentinel)
                self.members.append(sentinel)
                self.sentinels.append(sentinel.start())
            self.wait_settled()
        except BaseException:
            self.stop()
            raise
        return self

    def wait_settled(self, timeout: float = 20.0) -> None:
        """Until every running sentinel sees the expected replicas and sentinels, and the replicas are synced."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self._settled():
                    return
            except Exception:  # a server still starting: ask again
                pass
            if time.monotonic() >= deadline:
                raise ServerNotReady(f"sentinel set {self.service!r}: not settled after {timeout:.0f} s")
            time.sleep(0.1)

    def _settled(self) -> bool:
        live = [s for s in self.sentinels if s.running]
        replicas = [r for r in self.redis[1:] if r.running]
        for replica in replicas:  # synced, as its own INFO says (a sentinel refreshes its view only every 10 s)
            if _redis_ask(replica, "INFO", "replication").get("master_link_status") != "up":
                return False
        for sentinel in live:
            record = sentinel.ask("SENTINEL", "MASTER", self.service)
            if int(record["num-other-sentinels"]) < len(live) - 1 or "s_down" in record["flags"]:
                return False
            if int(record["num-slaves"]) < len(replicas):
                return False
        return True

    @property
    def url(self) -> str:
        """``redis+sentinel://s1,s2,s3/SERVICE/0`` (``rediss+sentinel://…?tls_ca=CA`` with ``tls_dir``)."""
        hosts = ",".join("{}:{}".format(*self._announced(s)) for s in self.sentinels)
        if self.tls_dir is not None:
            return f"rediss+sentinel://{hosts}/{self.service}/0?tls_ca={quote(str(self.tls_dir / 'ca.pem'))}"
        return f"redis+sentinel://{hosts}/{self.service}/0"

    def master_address(self) -> tuple[str, int]:
        """Where the first answering sentinel says the master is."""
        for sentinel in self.sentinels:
            if sentinel.running:
                with contextlib.suppress(Exception):
                    host, port = sentinel.ask("SENTINEL", "get-master-addr-by-name", self.service)
                    return host, int(port)
        raise ServerError(f"sentinel set {self.service!r}: no sentinel answered")

    def master(self) -> RedisServer:
        address = self.master_address()
        for server in self.redis:
            if server.running and self._announced(server) == address:
                return server
        raise ServerError(f"sentinel set {self.service!r}: the named master {address} is not running")

    def kill_master(self) -> RedisServer:
        """SIGKILL the current master (by PID); returns it."""
        master = self.master()
        master.kill()
        return master

    def wait_for_failover(self, old: tuple[str, int], timeout: float = 20.0) -> tuple[str, int]:
        """Until every running sentinel names a master other than ``old``; the new master's address."""
        deadline = time.monotonic() + timeout
        while True:
            named = set()
            for sentinel in self.sentinels:
                if sentinel.running:
                    with contextlib.suppress(Exception):
                        host, port = sentinel.ask("SENTINEL", "get-master-addr-by-name", self.service)
                        named.add((host, int(port)))
            if len(named) == 1 and old not in named:
                return named.pop()
            if time.monotonic() >= deadline:
                raise ServerError(f"sentinel set {self.service!r}: no failover from {old} after {timeout:.0f} s")
            time.sleep(0.05)

    def stop(self) -> None:
        """SIGKILL every member (by PID) and delete its directory: the data is thrown away anyway, and a
        master stopped gracefully first could hand the sentinels a failover in the middle of the teardown."""
        self._stop_members(kill_first=True)
        self.redis, self.sentinels = [], []


# --------------------------------------------------------------------------- ZooKeeper

# The jars ZooKeeperServerMain (NIO connection factory, no admin server) loads with
# the Debian packages (checked with -verbose:class): zookeeper, jute, slf4j-api and
# metrics-core are needed to start; slf4j-log4j12 + log4j-1.2 route the logs to our
# log file (without a binding slf4j drops them); snappy-java is used for snapshots
# when present. zookeeper.jar's manifest Class-Path still adds netty/jetty/jackson
# etc. for optional features (Netty factory, TLS, admin server), all not used here.
_ZK_REQUIRED_JARS = (
    "zookeeper.jar",
    "zookeeper-jute.jar",
    "slf4j-api.jar",
    "metrics-core.jar",
    "slf4j-log4j12.jar",
    "log4j-1.2.jar",
)
_ZK_OPTIONAL_JARS = ("snappy-java.jar",)

_ZK_LOG4J = """\
log4j.rootLogger=INFO, CONSOLE
log4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender
log4j.appender.CONSOLE.Target=System.out
log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout
log4j.appender.CONSOLE.layout.ConversionPattern=%d{ISO8601} %-5p [%t:%C{1}@%L] - %m%n
"""


def zookeeper_classpath(java_dir: str | os.PathLike[str] = JAVA_DIR) -> list[str]:
    """The jars used to run ZooKeeper from the Debian packages.

    ``LOCKKIT_ZOOKEEPER_CLASSPATH`` (os.pathsep separated) overrides the lookup.
    """
    override = os.environ.get("LOCKKIT_ZOOKEEPER_CLASSPATH")
    if override:
        return [p for p in override.split(os.pathsep) if p]
    base = Path(java_dir)
    missing = [j for j in _ZK_REQUIRED_JARS if not (base / j).is_file()]
    if missing:
        raise ServerError(
            f"ZooKeeper jars missing in {base}: {', '.join(missing)}; install them with `python -m backends install`"
        )
    jars = [base / j for j in _ZK_REQUIRED_JARS]
    jars += [base / j for j in _ZK_OPTIONAL_JARS if (base / j).is_file()]
    return [str(j) for j in jars]


class ZooKeeperServer(Server):
    """Standalone ZooKeeper (``ZooKeeperServerMain``) with a 200 ms tick.

    ``extra_config`` adds/overrides zoo.cfg keys; ``extra_args`` are extra JVM options.
    """

    name = "zookeeper"

    def __init__(
        self,
        *,
        tick_time_ms: int = 200,
        min_session_timeout_ms: int = 400,
        max_session_timeout_ms: int = 20000,
        extra_config: Mapping[str, str] | None = None,
        extra_args: Sequence[str] = (),
        port: int | None = None,
        ready_timeout: float = READY_TIMEOUT,
        env: Mapping[str, str] | None = None,
        tmp_parent: str | os.PathLike[str] | None = None,
    ) -> None:
        super().__init__(extra_args=extra_args, port=port, ready_timeout=ready_timeout, env=env, tmp_parent=tmp_parent)
        self.tick_time_ms = tick_time_ms
        self.min_session_timeout_ms = min_session_timeout_ms
        self.max_session_timeout_ms = max_session_timeout_ms
        self.extra_config: dict[str, str] = dict(extra_config or {})

    @property
    def config_path(self) -> Path:
        return self.workdir / "zoo.cfg"

    @property
    def hosts(self) -> str:
        """``host:port`` string for kazoo's ``hosts=``."""
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"zookeeper://{self.host}:{self.port}"

    def _prepare(self) -> None:
        config = {
            "tickTime": str(self.tick_time_ms),
            "initLimit": "10",
            "syncLimit": "5",
            "dataDir": str(self.data_dir),
            "clientPort": str(self.port),
            "clientPortAddress": self.host,
            "admin.enableServer": "false",
            "minSessionTimeout": str(self.min_session_timeout_ms),
            "maxSessionTimeout": str(self.max_session_timeout_ms),
            "4lw.commands.whitelist": "*",
            "maxClientCnxns": "0",
        }
        config.update(self.extra_config)
        self.config_path.write_text("".join(f"{k}={v}\n" for k, v in config.items()))
        (self.workdir / "log4j.properties").write_text(_ZK_LOG4J)

    def _command(self) -> list[str]:
        java = _require_binary("java")
        return [
            java,
            "-Xmx256m",
            "-Xss512k",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-XX:-UsePerfData",  # no /tmp/hsperfdata_* files
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
            "-Djava.net.preferIPv4Stack=true",
            f"-Djava.io.tmpdir={self.workdir}",
            f"-Dlog4j.configuration=file:{self.workdir / 'log4j.properties'}",
            "-Dzookeeper.jmx.log4j.disable=true",
            f"-Dzookeeper.log.dir={self.workdir}",
            *self.extra_args,
            "-cp",
            os.pathsep.join(zookeeper_classpath()),
            "org.apache.zookeeper.server.ZooKeeperServerMain",
            str(self.config_path),
        ]

    def _env(self) -> dict[str, str]:
        # JVM option env vars from the caller's shell would change heap/agents silently.
        env = _clean_env(("JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS", "CLASSPATH"))
        env.update(self._extra_env)
        return env

    def four_letter_word(self, word: str, timeout: float = 1.0) -> str:
        """Send a ZooKeeper four-letter command (``ruok``, ``srvr``, ``mntr``...) and return the reply."""
        if len(word) != 4:
            raise ValueError("four-letter words have four letters")
        with socket.create_connection(self.address, timeout=timeout) as sock:
            sock.sendall(word.encode("ascii"))
            chunks: list[bytes] = []
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
        return b"".join(chunks).decode("utf-8", errors="replace")

    def probe(self, timeout: float = 0.5) -> bool:
        try:
            return self.four_letter_word("ruok", timeout=timeout).strip() == "imok"
        except OSError:
            return False


# --------------------------------------------------------------------------- etcd

_GOARCH = {
    "x86_64": "amd64",
    "amd64": "amd64",
    "aarch64": "arm64",
    "arm64": "arm64",
    "ppc64le": "ppc64le",
    "s390x": "s390x",
    "i386": "386",
    "i686": "386",
    "armv7l": "arm",
    "riscv64": "riscv64",
}
# etcd 3.4 refuses to start on other architectures unless ETCD_UNSUPPORTED_ARCH=<goarch>.
_ETCD_SUPPORTED_ARCH = {"amd64", "arm64", "ppc64le"}


class EtcdServer(Server):
    """etcd (v3 API) with client and peer URLs on 127.0.0.1: a single node, or one member of an EtcdCluster."""

    name = "etcd"

    def __init__(
        self,
        *,
        heartbeat_interval_ms: int | None = None,
        election_timeout_ms: int | None = None,
        member_name: str = "n1",
        initial_cluster: str | None = None,
        initial_cluster_token: str | None = None,
        extra_args: Sequence[str] = (),
        port: int | None = None,
        peer_port: int | None = None,
        ready_timeout: float = READY_TIMEOUT,
        env: Mapping[str, str] | None = None,
        tmp_parent: str | os.PathLike[str] | None = None,
    ) -> None:
        """``heartbeat_interval_ms=10, election_timeout_ms=100`` gives a fast single node.

        ``initial_cluster`` (``name=peer_url,...`` of every member) and ``initial_cluster_token`` are for
        the members of an :class:`EtcdCluster`, which picks every member's ports before any starts (each
        member's flags name all peers); by default the node forms a cluster of its own.
        """
        if (port is None) != (peer_port is None):
            raise ValueError("give both port and peer_port, or neither")
        super().__init__(extra_args=extra_args, port=port, ready_timeout=ready_timeout, env=env, tmp_parent=tmp_parent)
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.election_timeout_ms = election_timeout_ms
        self.member_name = member_name
        self.initial_cluster = initial_cluster
        self.initial_cluster_token = initial_cluster_token
        self._peer_port: int | None = peer_port

    def _allocate_extra_ports(self) -> None:
        self._peer_port = free_port(self.host)

    @property
    def peer_port(self) -> int:
        if self._peer_port is None:
            raise ServerError("etcd: not started")
        return self._peer_port

    @property
    def client_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def peer_url(self) -> str:
        return f"http://{self.host}:{self.peer_port}"

    @property
    def endpoint(self) -> str:
        """``host:port`` for ``etcdctl --endpoints`` and gRPC clients."""
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"etcd://{self.host}:{self.port}"

    def _command(self) -> list[str]:
        argv = [
            _require_binary("etcd"),
            "--name", self.member_name,
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", self.client_url,
            "--advertise-client-urls", self.client_url,
            "--listen-peer-urls", self.peer_url,
            "--initial-advertise-peer-urls", self.peer_url,
            "--initial-cluster", self.initial_cluster or f"{self.member_name}={self.peer_url}",
            "--initial-cluster-state", "new",
            "--initial-cluster-token", self.initial_cluster_token or f"lockkit-{self.port}",
            "--logger", "zap",
            "--log-outputs", "stderr",
        ]  # fmt: skip
        # No --listen-metrics-urls: metrics stay on the loopback client URL only.
        if self.heartbeat_interval_ms is not None:
            argv += ["--heartbeat-interval", str(self.heartbeat_interval_ms)]
        if self.election_timeout_ms is not None:
            argv += ["--election-timeout", str(self.election_timeout_ms)]
        return argv + self.extra_args

    def _env(self) -> dict[str, str]:
        # ETCD_* variables are read as flags by etcd; never inherit them from the caller.
        env = _clean_env(("ETCD_", "ETCDCTL_"))
        goarch = _GOARCH.get(platform.machine().lower())
        if goarch is not None and goarch not in _ETCD_SUPPORTED_ARCH:
            env["ETCD_UNSUPPORTED_ARCH"] = goarch
        env.update(self._extra_env)
        return env

    def http_get(self, path: str, timeout: float = 1.0) -> tuple[int, bytes]:
        """GET on the client URL (no proxy env is consulted)."""
        return self._http("GET", path, None, timeout)

    def _http(self, method: str, path: str, body: bytes | None, timeout: float) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            conn.request(method, path, body=body)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def status(self, timeout: float = 1.0) -> dict[str, Any]:
        """``Maintenance.Status`` through etcd's JSON gateway (no etcdctl process per poll).

        The reply has ``header.member_id`` (this member) and ``leader`` (the member it follows), both
        decimal strings, and ``raftTerm``. Raises ``OSError``/``ServerError`` if the member does not answer.
        """
        status, body = self._http("POST", "/v3/maintenance/status", b"{}", timeout)
        if status != 200:
            raise ServerError(f"etcd {self.endpoint}: status returned HTTP {status}: {body[:200]!r}")
        reply: dict[str, Any] = json.loads(body)
        return reply

    def probe(self, timeout: float = 0.5) -> bool:
        """``GET /health`` answers ``{"health":"true"}`` once a leader is elected."""
        try:
            status, body = self.http_get("/health", timeout=timeout)
        except (OSError, http.client.HTTPException):
            return False
        return status == 200 and b'"true"' in body

    def version(self) -> str:
        """Server version from ``GET /version``."""
        _, body = self.http_get("/version")
        match = re.search(rb'"etcdserver"\s*:\s*"([^"]+)"', body)
        return match.group(1).decode() if match else body.decode(errors="replace")

    def etcdctl_env(self) -> dict[str, str]:
        """Environment for running ``etcdctl`` against this server (v3 API, no proxies)."""
        env = _clean_env(("ETCD_", "ETCDCTL_", "http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"))
        env.pop("all_proxy", None)
        env.pop("ALL_PROXY", None)
        env["ETCDCTL_API"] = "3"
        env["ETCDCTL_ENDPOINTS"] = self.endpoint
        return env


class EtcdCluster(ServerGroup[EtcdServer]):
    """N etcd members (default 3) forming one Raft cluster, every port on 127.0.0.1.

    Leader changes are what a cluster adds to the single node (etcd restarts every lease's countdown on a
    new leader, #9395), so :meth:`leader` finds the current one for a test to kill; a member is an
    ordinary :class:`EtcdServer` (``kill``, ``pause``, ``restart`` with its data, by its own PID). Heartbeat
    100 ms and election timeout 1 s (etcd's defaults, set explicitly): a lost leader is usually replaced
    within one to two election timeouts (one more round after a split vote), and the minimum lease TTL
    stays 2 s.
    """

    def __init__(
        self,
        n: int = 3,
        *,
        heartbeat_interval_ms: int = 100,
        election_timeout_ms: int = 1000,
        extra_args: Sequence[str] = (),
        ready_timeout: float = READY_TIMEOUT,
        tmp_parent: str | os.PathLike[str] | None = None,
    ) -> None:
        if n < 1:
            raise ValueError("n must be >= 1")
        self.n = n
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.election_timeout_ms = election_timeout_ms
        self.extra_args = list(extra_args)
        self.ready_timeout = ready_timeout
        self._tmp_parent = tmp_parent
        self.members: list[EtcdServer] = []
        #: the ``--initial-cluster-token`` of the running cluster
        self.token: str | None = None

    @property
    def election_timeout(self) -> float:
        """The election timeout in seconds (also how far a new leader extends every lease)."""
        return self.election_timeout_ms / 1000

    def start(self: C) -> C:
        """Start every member at once (none is ready before a quorum runs); returns self.

        Every member's flags name all peer URLs, so the ports are picked up front; if one was taken
        meanwhile ("address already in use") the whole cluster starts again on fresh ports.
        """
        if self.members:
            raise ServerError("etcd cluster: already started")
        for attempt in range(1, PORT_RETRIES + 1):
            self.members = self._new_members()
            try:
                self._start_members()
                return self
            except ServerNotReady as exc:
                self.stop()
                if not _ADDR_IN_USE.search(str(exc)) or attempt == PORT_RETRIES:
                    raise
            except BaseException:
                self.stop()
                raise
        raise AssertionError("unreachable")

    def _new_members(self) -> list[EtcdServer]:
        ports = [(free_port(LOOPBACK), free_port(LOOPBACK)) for _ in range(self.n)]
        names = [f"n{i + 1}" for i in range(self.n)]
        initial = ",".join(f"{name}=http://{LOOPBACK}:{peer}" for name, (_, peer) in zip(names, ports, strict=True))
        self.token = f"lockkit-cluster-{uuid.uuid4().hex[:12]}"  # members of other clusters never join ours
        return [
            EtcdServer(
                heartbeat_interval_ms=self.heartbeat_interval_ms,
                election_timeout_ms=self.election_timeout_ms,
                member_name=name,
                initial_cluster=initial,
                initial_cluster_token=self.token,
                extra_args=self.extra_args,
                port=port,
                peer_port=peer,
                ready_timeout=self.ready_timeout,
                tmp_parent=self._tmp_parent,
            )
            for name, (port, peer) in zip(names, ports, strict=True)
        ]

    def _start_members(self) -> None:
        errors: list[BaseException] = []

        def start(member: EtcdServer) -> None:
            try:
                member.start()
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=start, args=(m,), name=f"start-{m.member_name}") for m in self.members]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]

    def stop(self) -> None:
        """SIGKILL every member this cluster started (by PID), reap it and delete its directory. Idempotent.

        Not SIGTERM: a leader's graceful stop hands its office to a peer and then waits up to 7 s for the
        handover, which never completes while that peer is stopping too. The data is thrown away anyway.
        """
        self._stop_members(kill_first=True)

    @property
    def url(self) -> str:
        """``etcd://h1:p1,h2:p2,h3:p3``: every member, in start order."""
        return self.url_starting_at(None)

    def url_starting_at(self, first: EtcdServer | None) -> str:
        """The cluster URL with ``first`` listed first: lockkit's client uses that member until it fails."""
        if not self.members:
            raise ServerError("etcd cluster: not started")
        if first is not None and first not in self.members:
            raise ValueError(f"{first!r} is not a member of this cluster")
        ordered = ([] if first is None else [first]) + [m for m in self.members if m is not first]
        return "etcd://" + ",".join(m.endpoint for m in ordered)

    @property
    def endpoints(self) -> list[str]:
        """``host:port`` of every member, for ``etcdctl --endpoints``."""
        return [m.endpoint for m in self.members]

    def running_members(self) -> list[EtcdServer]:
        return [m for m in self.members if m.running and not m.paused]

    def leader(self, timeout: float = READY_TIMEOUT) -> EtcdServer:
        """The member that reports itself leader (its ``leader`` equals its own ``member_id``).

        Polls the running members until one does (after a kill, until a new one is elected); if two claim
        it (a deposed leader that has not noticed yet), the higher Raft term wins.
        """
        deadline = time.monotonic() + timeout
        while True:
            claims: list[tuple[int, EtcdServer]] = []
            for member in self.running_members():
                try:
                    status = member.status(timeout=0.5)
                except (OSError, http.client.HTTPException, ServerError, ValueError):
                    continue
                if status.get("leader") and status["leader"] == status.get("header", {}).get("member_id"):
                    claims.append((int(status.get("raftTerm", 0)), member))
            if claims:
                return max(claims, key=lambda claim: claim[0])[1]
            if time.monotonic() >= deadline:
                raise ServerError(f"etcd cluster: no leader among {self.endpoints} after {timeout:.1f} s")
            time.sleep(POLL_INTERVAL)

    def followers(self, timeout: float = READY_TIMEOUT) -> list[EtcdServer]:
        """The running members other than the current leader."""
        leader = self.leader(timeout)
        return [m for m in self.running_members() if m is not leader]


# --------------------------------------------------------------------------- PostgreSQL (issue 19)

PG_BIN = Path("/usr/lib/postgresql/15/bin")
PG_SUPERUSER = "postgres"


def _pg_binary(name: str) -> str:
    """A PostgreSQL program: Debian keeps them in /usr/lib/postgresql/<major>/bin, off PATH."""
    for candidate in (PG_BIN / name, *sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"), reverse=True)):
        if candidate.exists():
            return str(candidate)
    return _require_binary(name)


def _pg_account() -> tuple[int, int] | None:
    """The (uid, gid) the server runs as: PostgreSQL refuses to run as root, so root hands it to an unprivileged
    account (Debian's ``postgres``, else ``nobody``); any other user runs it as itself (``None``)."""
    if os.geteuid() != 0:
        return None
    import pwd

    for user in ("postgres", "nobody"):
        try:
            entry = pwd.getpwnam(user)
        except KeyError:
            continue
        return entry.pw_uid, entry.pw_gid
    raise ServerError("running as root, but neither a 'postgres' nor a 'nobody' account exists to run PostgreSQL")


class PostgresServer(Server):
    """PostgreSQL 15 in a fresh ``initdb`` cluster on 127.0.0.1, run as an unprivileged account.

    The superuser ``postgres`` has a random password (scram-sha-256 over TCP), so that :attr:`url` carries
    one, as a production URL would. With ``standby_of``, the cluster is a ``pg_basebackup -R`` copy of that
    server and runs as a hot standby (read-only, ``pg_is_in_recovery()`` true).
    """

    name = "postgres"

    def __init__(
        self,
        *,
        standby_of: PostgresServer | None = None,
        extra_args: Sequence[str] = (),
        port: int | None = None,
        ready_timeout: float = 30.0,
        env: Mapping[str, str] | None = None,
        tmp_parent: str | os.PathLike[str] | None = None,
    ) -> None:
        super().__init__(extra_args=extra_args, port=port, ready_timeout=ready_timeout, env=env, tmp_parent=tmp_parent)
        self.standby_of = standby_of
        self.password = standby_of.password if standby_of is not None else uuid.uuid4().hex
        self.database = "postgres"
        self._account = _pg_account()

    def _as_account(self, argv: list[str]) -> list[str]:
        if self._account is None:
            return argv
        uid, gid = self._account
        return ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--", *argv]

    def _give_away(self, path: Path) -> None:
        if self._account is not None:
            os.chown(path, *self._account)

    def _prepare(self) -> None:
        # The account must reach its directories: mkdtemp's 0700 belongs to root.
        self._give_away(self.workdir)
        self._give_away(self.data_dir)
        if (self.data_dir / "PG_VERSION").exists():
            return  # a restart keeps the cluster
        if self.standby_of is None:
            pwfile = self.workdir / "pwfile"
            pwfile.write_text(self.password + "\n")
            self._give_away(pwfile)
            argv = [
                _pg_binary("initdb"), "-D", str(self.data_dir), "-U", PG_SUPERUSER, "--pwfile", str(pwfile),
                "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8", "--no-sync",
            ]  # fmt: skip
        else:
            primary = self.standby_of
            argv = [
                _pg_binary("pg_basebackup"), "-D", str(self.data_dir), "-h", primary.host, "-p", str(primary.port),
                "-U", PG_SUPERUSER, "-R", "-X", "stream", "--no-sync",
            ]  # fmt: skip
        env = self._env()
        env["PGPASSWORD"] = self.password
        done = subprocess.run(self._as_account(argv), cwd=self.workdir, env=env, capture_output=True, timeout=120)
        if done.returncode != 0:
            output = (done.stdout + done.stderr).decode("utf-8", errors="replace")
            raise ServerError(f"postgres: {argv[0]} failed with status {done.returncode}:\n{output[-4000:]}")
        os.chmod(self.data_dir, 0o700)

    def _command(self) -> list[str]:
        argv = [
            _pg_binary("postgres"),
            "-D", str(self.data_dir),
            "-c", f"listen_addresses={self.host}",
            "-c", f"port={self.port}",
            "-c", f"unix_socket_directories={self.workdir}",
            "-c", "fsync=off",
            "-c", "synchronous_commit=off",
            "-c", "full_page_writes=off",
            "-c", "max_connections=300",
            "-c", "shared_buffers=32MB",
            "-c", "max_wal_senders=4",
            "-c", "wal_level=replica",
            "-c", "hot_standby=on",
        ]  # fmt: skip
        return self._as_account(argv + self.extra_args)

    @property
    def url(self) -> str:
        return f"postgresql://{PG_SUPERUSER}:{quote(self.password, safe='')}@{self.host}:{self.port}/{self.database}"

    def url_for(self, user: str, password: str, **options: str) -> str:
        """The URL of another role on this server (``tests/test_postgres_faults.py``'s ACL test)."""
        query = "&".join(f"{k}={v}" for k, v in options.items())
        auth = f"{quote(user, safe='')}:{quote(password, safe='')}"
        return f"postgresql://{auth}@{self.host}:{self.port}/{self.database}" + (f"?{query}" if query else "")

    def probe(self, timeout: float = 0.5) -> bool:
        wait = str(max(1, round(timeout)))
        argv = [_pg_binary("pg_isready"), "-q", "-h", self.host, "-p", str(self.port), "-t", wait]
        try:
            return subprocess.run(argv, capture_output=True, timeout=timeout + 2).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False

    def psql(self, sql: str, database: str | None = None) -> str:
        """Run ``sql`` as the superuser over the server's Unix socket; the output, unaligned, tuples only."""
        argv = [
            _pg_binary("psql"), "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h", str(self.workdir),
            "-p", str(self.port), "-U", PG_SUPERUSER, "-d", database or self.database, "-c", sql,
        ]  # fmt: skip
        done = subprocess.run(self._as_account(argv), capture_output=True, timeout=60, env=self._env())
        if done.returncode != 0:
            raise ServerError(f"psql failed: {done.stderr.decode('utf-8', errors='replace')}")
        return done.stdout.decode("utf-8", errors="replace").strip()

    def _terminate(self) -> None:
        # SIGTERM is PostgreSQL's *smart* shutdown, which waits for every client to leave: ask for a fast one
        # (SIGINT: sessions are ended, their advisory locks dropped) and let the base class escalate.
        proc = self._proc
        if proc is not None and proc.poll() is None and not self._paused:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGINT)
            self._wait_exit_noreap(STOP_TIMEOUT)
        super()._terminate()


# --------------------------------------------------------------------------- Redis Cluster


class RedisClusterNode(RedisServer):
    """One ``redis-server --cluster-enabled yes`` on loopback, its cluster bus on a free port of its own."""

    name = "redis-cluster"

    def __init__(self, *, node_timeout_ms: int = 1000, extra_args: Sequence[str] = (), **kwargs: Any) -> None:
        super().__init__(extra_args=extra_args, **kwargs)
        self.node_timeout_ms = node_timeout_ms
        self.bus_port: int | None = None

    def _allocate_extra_ports(self) -> None:
        self.bus_port = free_port(self.host)

    def _command(self) -> list[str]:
        if self.bus_port is None:
            self._allocate_extra_ports()
        assert self.bus_port is not None
        return [
            *super()._command(),
            "--cluster-enabled", "yes",
            "--cluster-config-file", str(self.data_dir / "nodes.conf"),
            "--cluster-node-timeout", str(self.node_timeout_ms),
            "--cluster-port", str(self.bus_port),
            # a replica of a dead master may take over at once, however long its link was down
            "--cluster-replica-validity-factor", "0",
        ]  # fmt: skip

    def ask(self, *command: str | int) -> Any:
        import redis

        client = redis.Redis(self.host, self.port, password=self.password, socket_timeout=5, decode_responses=True)
        try:
            return client.execute_command(*command)
        finally:
            client.close()

    def node_id(self) -> str:
        return str(self.ask("CLUSTER", "MYID"))


class RedisCluster(ServerGroup[RedisClusterNode]):
    """``masters`` masters (default 3) with ``replicas`` replicas each, made one cluster by
    ``redis-cli --cluster create … --cluster-yes``; ``start`` returns once every node reports ``cluster_state:ok``
    and agrees on the slot map, and every replica is in sync. Members are stopped by PID like every server here."""

    def __init__(self, masters: int = 3, replicas: int = 0, *, node_timeout_ms: int = 1000) -> None:
        if masters < 3:
            raise ValueError("redis-cli --cluster create needs at least 3 masters")
        self.n_masters, self.n_replicas, self.node_timeout_ms = masters, replicas, node_timeout_ms
        self.members = []

    def start(self: RC) -> RC:
        try:
            for _ in range(self.n_masters * (1 + self.n_replicas)):
                # no delay before a diskless full sync (5 s by default): the replicas are in sync at once
                sync = ["--repl-diskless-sync-delay", "0"]
                node = RedisClusterNode(node_timeout_ms=self.node_timeout_ms, extra_args=sync)
                self.members.append(node)
                node.start()
            argv = [_require_binary("redis-cli"), "--cluster", "create"]
            argv += [f"{n.host}:{n.port}" for n in self.members]
            argv += ["--cluster-replicas", str(self.n_replicas), "--cluster-yes"]
            done = subprocess.run(argv, capture_output=True, timeout=60, env=_clean_env(), check=False)
            if done.returncode != 0:
                raise ServerError(f"redis-cli --cluster create failed: {done.stdout[-2000:]!r} {done.stderr[-2000:]!r}")
            self.wait_settled()
            self._wait_replicas_known()
        except BaseException:
            self.stop()
            raise
        return self

    def wait_settled(self, timeout: float = 30.0) -> None:
        """Until every running node says ``cluster_state:ok`` and they all report the same slot map."""
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(Exception):
                if self._settled():
                    return
            if time.monotonic() >= deadline:
                raise ServerNotReady(f"redis cluster: not settled after {timeout:.0f} s")
            time.sleep(0.1)

    def _settled(self) -> bool:
        maps = set()
        for node in self.running_members():
            if "cluster_state:ok" not in str(node.ask("CLUSTER", "INFO")):
                return False
            maps.add(repr(sorted((s[0], s[1], s[2][1]) for s in node.ask("CLUSTER", "SLOTS"))))
            if node.ask("ROLE")[0] == "slave" and node.ask("INFO", "replication").get("master_link_status") != "up":
                return False  # a replica still syncing: a WAIT 1 would not count it
        return len(maps) == 1

    def _wait_replicas_known(self, timeout: float = 30.0) -> None:
        """Until every master lists all its replicas in ``CLUSTER REPLICAS``: a replica's link can be up
        before gossip has told its master (or the other nodes) whose replica it is, and a test that asks
        for "the replica of this master" right after start must find it."""
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(Exception):
                if all(
                    len(node.ask("CLUSTER", "REPLICAS", node.node_id())) >= self.n_replicas for node in self.masters()
                ):
                    return
            if time.monotonic() >= deadline:
                raise ServerNotReady(
                    f"redis cluster: masters do not list their {self.n_replicas} replicas after {timeout:.0f} s"
                )
            time.sleep(0.05)

    def running_members(self) -> list[RedisClusterNode]:
        return [m for m in self.members if m.running and not m.paused]

    def masters(self) -> list[RedisClusterNode]:
        """The running nodes that are masters serving slots, as they say themselves."""
        out = []
        for node in self.running_members():
            role = node.ask("ROLE")
            if role[0] == "master" and any(int(s[1]) >= 0 for s in node.ask("CLUSTER", "SLOTS")):
                out.append(node)
        return out

    def node_for_slot(self, slot: int) -> RedisClusterNode:
        """The running master serving ``slot`` (as the first running node says)."""
        for slot_range in self.running_members()[0].ask("CLUSTER", "SLOTS"):
            if int(slot_range[0]) <= slot <= int(slot_range[1]):
                port = int(slot_range[2][1])
                for node in self.members:
                    if node.port == port:
                        return node
        raise ServerError(f"redis cluster: no node serves slot {slot}")

    # -- a slot migration by hand, step by step (tests check a lock or semaphore in every phase) --

    def start_migration(self, slot: int, source: RedisClusterNode, target: RedisClusterNode) -> None:
        """``SETSLOT … IMPORTING`` on ``target``, then ``MIGRATING`` on ``source``."""
        ids = {node.port: node.node_id() for node in self.members}
        target.ask("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[source.port])
        source.ask("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[target.port])

    @staticmethod
    def move_slot_keys(slot: int, source: RedisClusterNode, target: RedisClusterNode) -> list[bytes]:
        """``MIGRATE`` every key of ``slot`` (up to 1000) from ``source`` to ``target``; the keys moved. (Listed by
        ``GETKEYSINSLOT``: an ``EXISTS`` of a missing key of a migrating slot would answer ASK.)"""
        keys: list[bytes] = source.ask("CLUSTER", "GETKEYSINSLOT", slot, 1000)
        if keys:
            source.ask("MIGRATE", target.host, target.port, "", 0, 5000, "KEYS", *keys)
        return keys

    def finish_migration(self, slot: int, target: RedisClusterNode) -> None:
        """``SETSLOT … NODE target`` on the target first, then on every other node."""
        target_id = target.node_id()
        target.ask("CLUSTER", "SETSLOT", slot, "NODE", target_id)
        for node in self.members:
            if node is not target:
                node.ask("CLUSTER", "SETSLOT", slot, "NODE", target_id)

    def replica_of(self, master: RedisClusterNode) -> RedisClusterNode:
        """The (one) replica of ``master``."""
        (line,) = master.ask("CLUSTER", "REPLICAS", master.node_id())
        port = int(line.split()[1].split("@")[0].rpartition(":")[2])
        return next(m for m in self.members if m.port == port)

    @property
    def url(self) -> str:
        """``redis+cluster://h1:p1,h2:p2,h3:p3``: the masters as started (any node would do as a seed)."""
        return "redis+cluster://" + ",".join(f"{n.host}:{n.port}" for n in self.members[: self.n_masters])

    def stop(self) -> None:
        """SIGKILL every member (by PID) and delete its directory: the data is thrown away anyway."""
        self._stop_members(kill_first=True)
