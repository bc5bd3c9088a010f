"""Redis and Redlock URLs, options, TLS settings, and the first-connect checks.

Everything here is shared by the blocking and the asyncio faces: the options
dataclasses (parsed strictly from the URL query), the :class:`NodeSpec` of each
server, its TLS context, and the "hello" a fresh connection sends before its first command
(``INFO server`` for the server's ``run_id``, ``CONFIG GET maxmemory-policy``, and ``SCRIPT LOAD``
the first time).
"""

from __future__ import annotations

import functools
import logging
import ssl
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoPermissionError, ResponseError

from ...errors import ConfigError
from ...urls import BackendURL, parse_options
from .keys import DEFAULT_PREFIX, check_prefix
from .scripts import ALL

__all__ = [
    "NodeSpec",
    "NodeState",
    "NotMaster",
    "RedisOptions",
    "RedlockOptions",
    "SentinelOptions",
    "apply_hello",
    "hello_commands",
]

log = logging.getLogger("lockkit")
DEFAULT_PORT = 6379


@dataclass(frozen=True)
class _Common:
    prefix: str = DEFAULT_PREFIX
    """Key prefix (no ``{`` or ``}``)."""
    timeout: float = 2.0
    """Socket timeout of one operation, seconds."""
    connect_timeout: float = 2.0
    pool_size: int = 64
    """Connections per server, shared by every lock of the client."""
    health_check_interval: float = 15.0
    """PING a pooled connection idle for longer than this before using it (0: off)."""
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_check_hostname: bool = True
    tls_insecure: bool = False
    """Skip certificate verification (never the default; for testing only)."""
    strict: bool = False
    """Refuse to work with a server whose maxmemory-policy can evict lock keys."""

    def __post_init__(self) -> None:
        check_prefix(self.prefix)
        for what in ("timeout", "connect_timeout"):
            if not getattr(self, what) > 0:
                raise ConfigError(f"option {what} must be > 0 seconds; give a positive number, e.g. {what}=1")
        if self.pool_size < 1:
            raise ConfigError("option pool_size must be ≥ 1; e.g. pool_size=64 (the default)")
        if self.health_check_interval < 0:
            raise ConfigError("option health_check_interval must be ≥ 0; e.g. health_check_interval=15 (the default)")


@dataclass(frozen=True)
class RedisOptions(_Common):
    db: int | None = None
    """Database number for unix:// (redis:// takes it from the path)."""
    min_replicas: int = 0
    """After a grant, WAIT for this many replicas; fewer → the grant is undone and BackendUnavailable."""
    replica_timeout: float = 0.1


@dataclass(frozen=True)
class SentinelOptions(RedisOptions):
    sentinel_username: str | None = None
    """The sentinels' ACL user (the URL's user and password are the master's)."""
    sentinel_password: str | None = field(default=None, repr=False)
    failover_wait: float = 5.0
    """How long one call waits for the sentinels to name a reachable master before BackendUnavailable."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.failover_wait > 0:
            raise ConfigError("option failover_wait must be > 0 seconds; e.g. failover_wait=5 (the default)")


@dataclass(frozen=True)
class RedlockOptions(_Common):
    timeout: float = 0.25
    connect_timeout: float = 0.25
    tls: bool = False
    """Connect to every master with TLS (as rediss://)."""
    retry_delay: float = 0.05
    """Upper bound of the random delay before retrying after a split vote."""


@dataclass(frozen=True)
class NodeSpec:
    """Where and how to connect to one Redis server."""

    label: str
    """host:port or the socket path: what messages show (never a password)."""
    host: str | None
    port: int | None
    path: str | None
    db: int
    username: str | None
    password: str | None = field(repr=False)
    tls: bool
    options: _Common
    require_master: bool = False
    """Check ROLE in the hello, alone before anything else is sent (Sentinel: never write to a replica)."""
    cluster: bool = False
    """A node of a Redis Cluster (redis+cluster://); other schemes refuse a server in cluster mode."""

    def tls_context(self) -> ssl.SSLContext | None:
        """The TLS settings of this server's connections, or None without TLS."""
        return tls_context(self.options) if self.tls else None


@functools.lru_cache(maxsize=64)  # one per set of options: loading the CA file costs milliseconds
def tls_context(options: _Common) -> ssl.SSLContext:
    """A client context: the system's CAs or ``tls_ca``, the host name checked unless ``tls_check_hostname``
    is false, no verification at all with ``tls_insecure``, and ``tls_cert``/``tls_key`` if given."""
    context = ssl.create_default_context(cafile=options.tls_ca)
    if options.tls_insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        context.check_hostname = options.tls_check_hostname
    if options.tls_cert:
        context.load_cert_chain(options.tls_cert, options.tls_key)
    return context


def _db_from_path(url: BackendURL) -> int | None:
    path = url.path.strip("/")
    if not path:
        return None
    if not path.isdigit():
        raise ConfigError(f"the database in {url} must be a number, e.g. /0; got {path!r}")
    return int(path)


def _check_tls(url: BackendURL, options: _Common, tls: bool) -> None:
    given = [n for n in ("tls_ca", "tls_cert", "tls_key") if getattr(options, n) is not None]
    # The verification switches too, whatever their value: on a URL without TLS they mean the user believes it
    # has TLS (`redis://…?tls_insecure=true` meant "TLS, unverified" and got plaintext without a word: audit F7).
    given += [n for n in ("tls_check_hostname", "tls_insecure") if n in url.options]
    if given and not tls:
        # The way to turn TLS on for this scheme: redlock:// has an option (its masters share one scheme),
        # the others a scheme of their own with the extra "s"
        if url.scheme == "redlock":
            fix = "add tls=true"
        elif url.scheme == "unix":
            fix = "a unix socket carries no TLS: drop the tls_ options, or connect by TCP with rediss://"
        else:
            fix = f"use {url.scheme.replace('redis', 'rediss', 1)}://"
        raise ConfigError(f"{', '.join(given)} given but {url} does not use TLS ({fix})")
    if bool(options.tls_cert) != bool(options.tls_key):
        raise ConfigError(f"tls_cert and tls_key go together in {url}; give both or neither")
    if tls and options.tls_insecure:
        log.warning("lockkit: TLS certificate verification is OFF for %s (tls_insecure=true)", url)


def redis_nodes(url: BackendURL) -> tuple[NodeSpec, RedisOptions]:
    options = parse_options(RedisOptions, url.options, url)
    if options.min_replicas < 0 or options.replica_timeout <= 0:
        raise ConfigError(f"min_replicas must be ≥ 0 and replica_timeout > 0 in {url}; fix those options")
    tls = url.scheme == "rediss"
    _check_tls(url, options, tls)
    if url.scheme == "unix":
        if url.hosts or not url.path:
            raise ConfigError(f"unix:// takes a socket path, e.g. unix:///run/redis.sock?db=0; got {url}")
        spec = NodeSpec(url.path, None, None, url.path, options.db or 0, url.username, url.password, False, options)
        return spec, options
    if len(url.hosts) != 1:
        raise ConfigError(f"{url.scheme}:// takes exactly one host (use redlock:// for several); got {url}")
    db = _db_from_path(url)
    if db is not None and options.db is not None and db != options.db:
        raise ConfigError(f"database given twice (path and db=) in {url}; keep one of them")
    ((host, port),) = url.host_port(DEFAULT_PORT)
    label = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    spec = NodeSpec(
        label, host, port, None, db if db is not None else options.db or 0, url.username, url.password, tls, options
    )
    return spec, options


def redlock_nodes(url: BackendURL) -> tuple[list[NodeSpec], RedlockOptions]:
    options = parse_options(RedlockOptions, url.options, url)
    if options.retry_delay < 0:
        raise ConfigError(f"retry_delay must be ≥ 0 in {url}; e.g. retry_delay=0.05 (the default)")
    _check_tls(url, options, options.tls)
    endpoints = url.host_port(DEFAULT_PORT)
    if len(endpoints) < 3:
        raise ConfigError(
            f"redlock:// needs at least 3 independent masters (5 is usual), got {len(endpoints)} in {url}"
        )
    seen: set[tuple[str, int]] = set()
    for host, port in endpoints:
        key = (host.lower(), port)
        if key in seen:
            raise ConfigError(
                f"redlock:// lists {host}:{port} twice in {url}: a node counted twice fakes a quorum; "
                "list each master once"
            )
        seen.add(key)
    if len(endpoints) % 2 == 0:
        log.warning(
            "lockkit: redlock with an even number of masters (%d) tolerates no more failures than %d; "
            "use an odd number",
            len(endpoints),
            len(endpoints) - 1,
        )
    db = _db_from_path(url) or 0
    specs = [
        NodeSpec(
            f"[{h}]:{p}" if ":" in h else f"{h}:{p}", h, p, None, db, url.username, url.password, options.tls, options
        )
        for h, p in endpoints
    ]
    return specs, options


# -- the hello of a fresh connection -------------------------------------------------------


@dataclass
class NodeState:
    """What a driver knows about one server, updated by every fresh connection's hello."""

    label: str
    strict: bool
    run_id: str | None = None
    epoch: int = 0
    """Bumped whenever the server's run_id changes (it restarted): Redlock's renew guard compares it."""
    warned: set[str] = field(default_factory=set)
    refused: ConfigError | None = None
    """Set once ``strict`` refused the server: every later operation fails without I/O."""
    require_master: bool = False
    cluster: bool = False
    """Expect a server in cluster mode (redis+cluster://); without it, one is refused with a ConfigError."""


class NotMaster(RedisConnectionError):
    """The server a Sentinel named is not (or no longer) a master: nothing was sent; ask the sentinels again."""


_INFO = ("INFO", "server")
_POLICY = ("CONFIG", "GET", "maxmemory-policy")
_ROLE = ("ROLE",)


def hello_commands(state: NodeState) -> list[tuple[Any, ...]]:
    """What a fresh connection sends before its first command (pipelined with it)."""
    commands: list[tuple[Any, ...]] = [_INFO, _POLICY]
    if state.require_master:
        commands.append(_ROLE)
    if state.run_id is None:
        commands += [("SCRIPT", "LOAD", script.source) for script in ALL]
    return commands


def _warn_once(state: NodeState, key: str, message: str, *args: object) -> None:
    if key not in state.warned:
        state.warned.add(key)
        log.warning(message, *args)


def apply_hello(state: NodeState, replies: Sequence[Any]) -> None:
    """Learn the run_id and check the eviction policy; raise ConfigError if ``strict`` refuses, and
    :class:`NotMaster` if ``require_master`` and the server is a replica."""
    info, policy = replies[0], replies[1]
    if state.require_master:
        role = replies[2]
        if not (isinstance(role, list) and role and role[0] == b"master"):
            shown = role[0].decode() if isinstance(role, list) and role and isinstance(role[0], bytes) else role
            raise NotMaster(f"redis {state.label} is not a master (ROLE says {shown}); asking the sentinels again")
    if isinstance(info, bytes):
        for line in info.split(b"\r\n"):
            if line.startswith(b"redis_mode:cluster") and not state.cluster:
                state.refused = ConfigError(
                    f"redis {state.label} is a node of a Redis Cluster (redis_mode:cluster): use "
                    "redis+cluster://host:port,… (lock keys live on the master of their slot)"
                )
                raise state.refused
            if line.startswith(b"run_id:"):
                run_id = line[7:].decode()
                if state.run_id is not None and run_id != state.run_id:
                    state.epoch += 1
                    log.warning(
                        "lockkit: redis %s restarted (its run_id changed): locks held there were lost unless it "
                        "persists data, and its fencing counters may have gone back",
                        state.label,
                    )
                state.run_id = run_id
    elif isinstance(info, ResponseError):
        _warn_once(state, "info", "lockkit: redis %s denies INFO (%s): restarts cannot be detected", state.label, info)
    if isinstance(policy, NoPermissionError):
        _warn_once(
            state,
            "config",
            "lockkit: redis %s denies CONFIG GET, so lockkit cannot check that "
            "maxmemory-policy is noeviction; make sure it is, or lock keys may be evicted",
            state.label,
        )
    elif isinstance(policy, list) and len(policy) == 2:
        value = policy[1].decode() if isinstance(policy[1], bytes) else str(policy[1])
        if value != "noeviction":
            message = (
                f"redis {state.label} has maxmemory-policy {value}: under memory pressure it can evict "
                "lock keys and two clients could hold one lock; set it to noeviction"
            )
            if state.strict:
                state.refused = ConfigError(message + " (strict=true refuses this server)")
                raise state.refused
            _warn_once(state, "policy:" + value, "lockkit: %s", message)
