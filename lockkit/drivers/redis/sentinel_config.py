"""``redis+sentinel://`` URLs and the sentinels' replies, with no I/O (both faces share it).

``redis+sentinel://[user:password@]h1:p1,h2:p2,h3:p3/SERVICE[/DB][?options]``; ``rediss+sentinel://`` speaks
TLS to the sentinels and the master alike. The URL's user and password are the *master's* (the lock keys live
there); the sentinels' own are the options ``sentinel_username`` and ``sentinel_password``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import ConfigError
from ...urls import BackendURL, parse_options
from .config import NodeSpec, SentinelOptions, _check_tls

__all__ = [
    "DEFAULT_SENTINEL_PORT",
    "Master",
    "SentinelTarget",
    "parse_master_reply",
    "resolve_commands",
    "sentinel_target",
]

DEFAULT_SENTINEL_PORT = 26379


def _label(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True)
class SentinelTarget:
    """What a ``redis+sentinel://`` URL names: the sentinels to ask, the service, how to reach its master."""

    service: str
    sentinels: tuple[NodeSpec, ...]
    template: NodeSpec
    """The master's spec without its address (db, credentials, TLS, options); :meth:`master` fills it in."""
    options: SentinelOptions

    def master(self, host: str, port: int) -> NodeSpec:
        return dataclasses.replace(self.template, label=_label(host, port), host=host, port=port)

    @property
    def tried(self) -> str:
        return ", ".join(s.label for s in self.sentinels)


@dataclass(frozen=True)
class Master:
    """One sentinel's answer: where the master of the service is, and the configuration epoch it is in."""

    host: str
    port: int
    epoch: int
    """The sentinels' ``config-epoch`` of the master: every failover raises it, and every sentinel agrees on it
    once the failover has spread, so tokens lifted by it (``epoch << 48 | counter``) rank above every token of an
    earlier master, whatever that master's counter had reached before it failed."""


def _path(url: BackendURL) -> tuple[str, int | None]:
    parts = [p for p in url.path.split("/") if p]
    if not parts or len(parts) > 2:
        raise ConfigError(
            f"{url.scheme}:// needs the service name as its path, e.g. "
            f"{url.scheme}://sentinel-1:26379,sentinel-2:26379,sentinel-3:26379/mymaster/0; got {url}"
        )
    if len(parts) == 2 and not parts[1].isdigit():
        raise ConfigError(f"the database in {url} must be a number, e.g. /mymaster/0; got {parts[1]!r}")
    return parts[0], int(parts[1]) if len(parts) == 2 else None


def sentinel_target(url: BackendURL) -> SentinelTarget:
    options = parse_options(SentinelOptions, url.options, url)
    if options.min_replicas < 0 or options.replica_timeout <= 0:
        raise ConfigError(f"min_replicas must be ≥ 0 and replica_timeout > 0 in {url}; fix those options")
    tls = url.scheme == "rediss+sentinel"
    _check_tls(url, options, tls)
    if not url.hosts:
        raise ConfigError(f"{url.scheme}:// needs at least one sentinel (three is usual), e.g. s1:26379,s2:26379")
    service, db = _path(url)
    if db is not None and options.db is not None and db != options.db:
        raise ConfigError(f"database given twice (path and db=) in {url}; keep one of them")
    sentinels = tuple(
        NodeSpec(_label(h, p), h, p, None, 0, options.sentinel_username, options.sentinel_password, tls, options)
        for h, p in url.host_port(DEFAULT_SENTINEL_PORT)
    )
    template = NodeSpec(
        service, None, None, None, db if db is not None else options.db or 0, url.username, url.password, tls,
        options, require_master=True,
    )  # fmt: skip
    return SentinelTarget(service, sentinels, template, options)


def resolve_commands(service: str) -> list[tuple[Any, ...]]:
    """Where the master is (the promoted replica already, while a failover reconfigures the others), and the
    master's record, for its config-epoch; one round trip, answered in one go by the sentinel."""
    return [("SENTINEL", "get-master-addr-by-name", service), ("SENTINEL", "MASTER", service)]


def parse_master_reply(replies: Sequence[Any], sentinel: str = "the sentinel") -> Master | None:
    """The master the sentinel names; None if it does not know the service (an error reply or nil).

    The master's ``config-epoch`` (from ``SENTINEL MASTER``) is required, not defaulted: taken as 0 when a
    sentinel refused that command (an ACL without ``+sentinel|master``), the tokens after a failover would rank
    below the ones handed out before it — fencing broken, without a word."""
    address, record = replies[0], replies[1]
    if not isinstance(address, list) or len(address) != 2:
        return None
    epoch = -1
    if isinstance(record, list):
        raw: Any = dict(zip(record[::2], record[1::2], strict=False)).get(b"config-epoch")
        with contextlib.suppress(TypeError, ValueError):
            epoch = int(raw)
    if epoch < 0:
        why = f"it answered {record}" if isinstance(record, Exception) else "its reply had no config-epoch"
        raise ConfigError(
            f"{sentinel} named the master but not its configuration epoch ({why}): lockkit needs SENTINEL MASTER "
            "to keep fencing tokens increasing across failovers. Give the sentinel user +sentinel|master (with "
            "+sentinel|get-master-addr-by-name), as docs/backends/redis.md's ACL rule for sentinels does"
        )
    return Master(address[0].decode(), int(address[1]), epoch)
