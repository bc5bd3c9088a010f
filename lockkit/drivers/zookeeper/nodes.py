"""ZooKeeper paths, node names, options and error translation for :mod:`lockkit.drivers.zookeeper`.

No session state lives here: the layout (``<chroot>/lockkit/<encode_name(name)>``),
contender node names (``<uuid hex>__lock__<sequence>``), the URL's hosts and
chroot, the options dataclass, the record of a held lock, and the one place
where kazoo's exceptions become lockkit's.
"""

from __future__ import annotations

import contextlib
import math
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from kazoo.exceptions import (
    AuthFailedError,
    ConnectionClosedError,
    ConnectionLoss,
    InvalidACLError,
    KazooException,
    NoAuthError,
    OperationTimeoutError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError

from ...errors import BackendUnavailable, ConfigError
from ...names import encode_name
from ...urls import BackendURL

DEFAULT_PORT = 2181
MARK = "__lock__"
"""Separates the uuid prefix from the server-assigned sequence in a contender's node name."""


@dataclass(frozen=True)
class ZooKeeperOptions:
    session_timeout: float = 10.0
    """Requested session timeout in seconds; the server clamps it to [minSessionTimeout, maxSessionTimeout]."""
    connect_timeout: float = 10.0
    """How long a call waits for a (re)connection before raising ``BackendUnavailable``."""
    randomize_hosts: bool = True
    """Connect to the listed servers in random order (spreads clients over an ensemble)."""

    def __post_init__(self) -> None:
        for key in ("session_timeout", "connect_timeout"):
            value = getattr(self, key)
            if not (math.isfinite(value) and 0.1 <= value <= 3600):
                raise ConfigError(f"{key} must be between 0.1 and 3600 seconds, got {value!r}")


HELD, UNCERTAIN, LOST = "held", "uncertain", "lost"


@dataclass(eq=False)
class Held:
    """A lock this session holds: its node, its fencing token, and its state as far as we know."""

    token: str
    parent: str
    child: str
    czxid: int
    session_id: int
    state: str = HELD
    armed: bool = False
    """Our exists-watch is set on the node (from the first renewal batch on; kazoo drops it on SUSPENDED)."""

    @property
    def path(self) -> str:
        return f"{self.parent}/{self.child}"

    @property
    def prefix(self) -> str:
        return self.child.rpartition(MARK)[0]


class Transient(BackendUnavailable):
    """A connection-level failure (lost connection, no reply, session moved): retried by waiting callers."""


def hosts_of(url: BackendURL) -> str:
    if not url.hosts:
        raise ConfigError(f"zookeeper:// needs at least one host, e.g. zookeeper://zk1:2181,zk2:2181/app; got {url}")
    pairs = url.host_port(DEFAULT_PORT)
    return ",".join(f"[{host}]:{port}" if ":" in host else f"{host}:{port}" for host, port in pairs)


def chroot_of(url: BackendURL) -> str:
    """The URL path as a chroot: ``""`` for none, else ``/a/b`` (validated as a ZooKeeper path)."""
    path = url.path.rstrip("/")
    if not path:
        return ""
    parts = path.split("/")[1:]
    if any(part in ("", ".", "..") for part in parts) or any(ord(ch) < 0x20 for ch in path):
        raise ConfigError(f"chroot {path!r} in {url} is not a valid ZooKeeper path (empty, '.' or '..' component)")
    if parts[0] == "zookeeper":
        raise ConfigError(f"chroot {path!r} in {url} is inside /zookeeper, which the server reserves")
    return path


class Layout:
    """Where a lock name lives: ``<chroot>/lockkit/<encode_name(name)>/<uuid>__lock__<seq>``."""

    def __init__(self, chroot: str) -> None:
        self.base = f"{chroot}/lockkit"

    def parent(self, name: str) -> str:
        # encode_name never yields "/", "." or "..", so every name is one distinct, valid path component.
        return f"{self.base}/{encode_name(name)}"


def new_prefix() -> str:
    """A fresh uuid for one acquisition's node (random: it never reveals the lease token)."""
    return uuid.uuid4().hex


def sequence(child: str) -> int | None:
    head, mark, seq = child.rpartition(MARK)
    if not mark or not head:
        return None
    try:
        return int(seq)
    except ValueError:
        return None


def contenders(children: Iterable[str]) -> list[str]:
    """Our contender nodes among ``children``, in queue order (lowest sequence first)."""
    keyed = [(seq, child) for child in children if (seq := sequence(child)) is not None]
    return [child for _, child in sorted(keyed)]


def with_prefix(children: Iterable[str], prefix: str) -> list[str]:
    return [child for child in children if child.startswith(prefix + MARK)]


@contextlib.contextmanager
def translated(what: str, timeout: float, passthrough: tuple[type[BaseException], ...] = ()) -> Iterator[None]:
    """Turn kazoo's failures into lockkit errors; ``passthrough`` (``NoNodeError``, …) reach the caller."""
    try:
        yield
    except passthrough:
        raise
    except (NoAuthError, InvalidACLError, AuthFailedError) as exc:
        raise BackendUnavailable(
            f"ZooKeeper refused to {what}: access denied ({type(exc).__name__}). lockkit's nodes carry a "
            "digest ACL: give the right user:password in the zookeeper:// URL"
        ) from exc
    except (ConnectionLoss, ConnectionClosedError, SessionExpiredError, OperationTimeoutError) as exc:
        raise Transient(f"could not {what}: the ZooKeeper connection was lost ({type(exc).__name__})") from exc
    except KazooTimeoutError as exc:
        raise Transient(f"could not {what}: ZooKeeper did not answer within {timeout:.2g} s") from exc
    except KazooException as exc:
        raise BackendUnavailable(f"ZooKeeper failed to {what}: {type(exc).__name__}") from exc


def wait(result: Any, what: str, timeout: float, passthrough: tuple[type[BaseException], ...] = ()) -> Any:
    """The value of a kazoo async result, waiting at most ``timeout`` seconds."""
    with translated(what, timeout, passthrough):
        return result.get(timeout=timeout)
