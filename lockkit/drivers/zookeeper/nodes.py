"""ZooKeeper paths, node names, options and error translation for :mod:`lockkit.drivers.zookeeper`.

No session state lives here: the layout (``<chroot>/lockkit/<encode_name(name)>``),
contender node names (``<uuid hex>__lock__<sequence>`` as kazoo's ``Lock`` names
them, or ``_c_<uuid>-lock-<sequence>`` as Curator's ``InterProcessMutex`` does
under ``?layout=curator``), the URL's hosts and chroot, the options dataclass,
the record of a held lock, and the one place where kazoo's exceptions become
lockkit's.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import re
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
"""Separates the uuid prefix from the server-assigned sequence in a contender's node name (kazoo's ``Lock``)."""
CURATOR_MARK = "-lock-"
"""The same in Curator's ``InterProcessMutex`` (``_c_<uuid>`` + ``-`` + its lock name ``lock-``)."""
CURATOR_PROTECTED = "_c_"
"""Curator's prefix of a *protected* node name (the uuid it finds its node by after a lost create reply)."""
LAYOUTS = ("kazoo", "curator")


@dataclass(frozen=True)
class ZooKeeperOptions:
    session_timeout: float = 10.0
    """Requested session timeout in seconds; the server clamps it to [minSessionTimeout, maxSessionTimeout]."""
    connect_timeout: float = 10.0
    """How long a call waits for a (re)connection before raising ``BackendUnavailable``."""
    randomize_hosts: bool = True
    """Connect to the listed servers in random order (spreads clients over an ensemble)."""
    layout: str = "kazoo"
    """How contender nodes are named: ``kazoo`` (``<uuid hex>__lock__<seq>``, shared with kazoo's ``Lock``) or
    ``curator`` (``_c_<uuid>-lock-<seq>``, shared with Curator's ``InterProcessMutex``). Either layout orders
    both kinds of node by their sequence, so lockkit clients with different layouts still exclude each other."""

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ConfigError(
                f"layout must be one of {', '.join(LAYOUTS)}, got {self.layout!r}; "
                "use ?layout=curator only to share locks with Curator clients, else leave it out"
            )
        for key in ("session_timeout", "connect_timeout"):
            value = getattr(self, key)
            if not (math.isfinite(value) and 0.1 <= value <= 3600):
                raise ConfigError(f"{key} must be between 0.1 and 3600 seconds, got {value!r}; set one in that range")


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
        return stem(self.child)


@dataclass(frozen=True)
class Login:
    """Who this client is to ZooKeeper and where, for the messages of a refused login (never the password)."""

    hosts: str
    """``host:port,…`` as given to kazoo."""
    url: str
    """The URL with its password masked."""
    user: str | None = None

    def refused(self, what: str, exc: BaseException) -> ConfigError:
        """The error for a refused login: ``AUTH_FAILED`` at connect, or ``NoAuth`` / ``InvalidACL`` on a node.

        ZooKeeper's digest scheme accepts any user:password at connect: a wrong password is only another
        identity, which the ACL of lockkit's nodes (``CREATOR_ALL`` for the credentials that created them)
        then refuses. So a ``NoAuth`` is how a wrong password shows, and it is a configuration error.
        """
        if isinstance(exc, AuthFailedError):
            if self.user is None:
                return ConfigError(
                    f"ZooKeeper at {self.hosts} refused the session (AUTH_FAILED): the server requires a login. "
                    "Put user:password@ in the URL (zookeeper://USER:PASSWORD@host:port/chroot)"
                )
            return ConfigError(
                f"ZooKeeper at {self.hosts} rejected the digest login of user {self.user!r} (AUTH_FAILED). "
                f"Check the user:password in the URL ({self.url}) and that the server accepts digest "
                "authentication"
            )
        code = "InvalidACL" if isinstance(exc, InvalidACLError) else "NoAuth"
        if self.user is None:
            return ConfigError(
                f"ZooKeeper at {self.hosts} refused to {what} without credentials ({code}): lockkit's nodes "
                "there carry a digest ACL. Put the user:password that created them in the URL: "
                "zookeeper://user:password@host:port/chroot"
            )
        return ConfigError(
            f"ZooKeeper at {self.hosts} refused user {self.user!r} permission to {what} ({code}): the node "
            f"belongs to other credentials (a wrong password is another identity). Fix the user:password in the "
            f"URL ({self.url}); every client of these locks must use the same credentials"
        )


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
        raise ConfigError(
            f"chroot {path!r} in {url} is not a valid ZooKeeper path (empty, '.' or '..' component); "
            "write it as /app or /app/locks"
        )
    if parts[0] == "zookeeper":
        raise ConfigError(
            f"chroot {path!r} in {url} is inside /zookeeper, which the server reserves; choose another, e.g. /app/locks"
        )
    return path


_HINT = re.compile(rb"[0-9a-f]{8}")
"""The data of lockkit's own contender nodes: the lease token's :func:`~lockkit.lease.token_hint`."""


def holder_hint(data: bytes) -> str | None:
    """What ``status`` may show of a holder node's data: lockkit's hint as it is, anything else hashed.

    A node written by another client (kazoo's ``identifier``, Curator's default of the host's IP address, or
    any bytes a program chose) is not ours to print: it is shown as the same 8-hex-digit hash prefix lockkit's
    hints are, and empty data as no hint at all ("holder not a lockkit client").
    """
    if not data:
        return None
    if _HINT.fullmatch(data):
        return data.decode("ascii")
    return hashlib.sha256(data).hexdigest()[:8]


class Layout:
    """Where a lock name lives: ``<chroot>/lockkit/<encode_name(name)>/<stem><seq>``.

    The *stem* is the part of a contender's name before the server-assigned sequence, mark included
    (``<uuid hex>__lock__`` or ``_c_<uuid>-lock-``): it is unique per acquisition, so a create whose reply was
    lost finds its node again by it.
    """

    def __init__(self, chroot: str, style: str = "kazoo") -> None:
        self.base = f"{chroot}/lockkit"
        self.style = style

    def parent(self, name: str) -> str:
        # encode_name never yields "/", "." or "..", so every name is one distinct, valid path component.
        return f"{self.base}/{encode_name(name)}"

    def new_stem(self) -> str:
        """A fresh stem for one acquisition's node (random: it never reveals the lease token)."""
        if self.style == "curator":
            # Curator's protected name: "_c_" + a dashed uuid + "-" + "lock-" (ProtectedUtils, InterProcessMutex)
            return f"{CURATOR_PROTECTED}{uuid.uuid4()}{CURATOR_MARK}"
        return uuid.uuid4().hex + MARK


def _split(child: str) -> tuple[str, str] | None:
    """``(stem, sequence digits)`` of a kazoo- or Curator-style contender name, else None."""
    for mark in (MARK, CURATOR_MARK):
        head, found, seq = child.rpartition(mark)
        if found and head:
            return head + found, seq
    return None


def stem(child: str) -> str:
    split = _split(child)
    return split[0] if split is not None else child


def sequence(child: str) -> int | None:
    """The server-assigned sequence of a contender node, whichever layout named it.

    The sequence counter belongs to the parent and counts every sequential create in it, so the sequences of
    kazoo-style and Curator-style nodes under one parent order them all by creation: lockkit clients of both
    layouts (and kazoo or Curator holders alike) are one queue to every lockkit client.
    """
    split = _split(child)
    if split is None:
        return None
    try:
        return int(split[1])
    except ValueError:
        return None


def contenders(children: Iterable[str]) -> list[str]:
    """The contender nodes among ``children``, in queue order (lowest sequence first)."""
    keyed = [(seq, child) for child in children if (seq := sequence(child)) is not None]
    return [child for _, child in sorted(keyed)]


def with_prefix(children: Iterable[str], prefix: str) -> list[str]:
    """The children created with stem ``prefix`` (at most one, unless a create was retried).

    A sequential node is the stem plus the server's digits; a permit's lease node (:mod:`.permits`) is the
    stem alone. The stem holds a random uuid, so nothing else starts with it.
    """
    return [
        child
        for child in children
        if child == prefix or (child.startswith(prefix) and child[len(prefix) :].lstrip("-").isdigit())
    ]


@contextlib.contextmanager
def translated(
    what: str, timeout: float, passthrough: tuple[type[BaseException], ...] = (), login: Login | None = None
) -> Iterator[None]:
    """Turn kazoo's failures into lockkit errors; ``passthrough`` (``NoNodeError``, …) reach the caller.

    A refused login (``AUTH_FAILED``, ``NoAuth``, ``InvalidACL``) is a :class:`ConfigError` naming ``login``'s
    user: retrying cannot help, the URL must change.
    """
    try:
        yield
    except passthrough:
        raise
    except (NoAuthError, InvalidACLError, AuthFailedError) as exc:
        raise (login or Login("the configured servers", "the zookeeper:// URL")).refused(what, exc) from exc
    except (ConnectionLoss, ConnectionClosedError, SessionExpiredError, OperationTimeoutError) as exc:
        raise Transient(f"could not {what}: the ZooKeeper connection was lost ({type(exc).__name__}); retry") from exc
    except KazooTimeoutError as exc:
        raise Transient(f"could not {what}: ZooKeeper did not answer within {timeout:.2g} s; retry") from exc
    except KazooException as exc:
        raise BackendUnavailable(
            f"ZooKeeper failed to {what}: {type(exc).__name__}; retry, and if it persists check "
            "the ensemble's health (echo srvr | nc HOST PORT) and its log"
        ) from exc


def wait(
    result: Any,
    what: str,
    timeout: float,
    passthrough: tuple[type[BaseException], ...] = (),
    login: Login | None = None,
) -> Any:
    """The value of a kazoo async result, waiting at most ``timeout`` seconds."""
    try:
        return result.get(timeout=timeout)
    except Exception:
        # translated only on failure: entering the context manager on every reply cost ~2 µs of its generator
        with translated(what, timeout, passthrough, login):
            raise
