"""``redis+cluster://`` URLs, the cluster's slot map and the replies that change it, with no I/O (both faces).

``redis+cluster://[user:password@]h1:p1,h2:p2,...[?options]``; ``rediss+cluster://`` speaks TLS to every node.
The hosts are seeds: any reachable node tells the whole map (``CLUSTER NODES``), so one live seed is enough. A
cluster has one database, so the URL has no path.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.crc import key_slot
from redis.exceptions import ResponseError

from ...errors import ConfigError
from ...urls import BackendURL, parse_options
from .config import DEFAULT_PORT, NodeSpec, RedisOptions, _check_tls

__all__ = [
    "SLOTS",
    "ClusterOptions",
    "ClusterTarget",
    "Redirect",
    "Shard",
    "SlotMap",
    "cluster_target",
    "key_slot",
    "my_epoch",
    "parse_nodes",
    "redirect",
]

SLOTS = 16384


def _label(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True)
class ClusterOptions(RedisOptions):
    failover_wait: float = 5.0
    """How long one call keeps looking for the master of its slot (a failover, a migration) before
    BackendUnavailable."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.failover_wait > 0:
            raise ConfigError("option failover_wait must be > 0 seconds; e.g. failover_wait=5 (the default)")
        if self.db:
            raise ConfigError("a Redis Cluster has only database 0: drop the db option")


@dataclass(frozen=True)
class ClusterTarget:
    seeds: tuple[NodeSpec, ...]
    template: NodeSpec
    options: ClusterOptions

    def node(self, host: str, port: int) -> NodeSpec:
        return dataclasses.replace(self.template, label=_label(host, port), host=host, port=port)

    @property
    def tried(self) -> str:
        return ", ".join(s.label for s in self.seeds)


def cluster_target(url: BackendURL) -> ClusterTarget:
    options = parse_options(ClusterOptions, url.options, url)
    if options.min_replicas < 0 or options.replica_timeout <= 0:
        raise ConfigError(f"min_replicas must be ≥ 0 and replica_timeout > 0 in {url}; fix those options")
    tls = url.scheme == "rediss+cluster"
    _check_tls(url, options, tls)
    if not url.hosts:
        raise ConfigError(f"{url.scheme}:// needs at least one node of the cluster, e.g. {url.scheme}://h1:7000,h2:7001")
    if url.path.strip("/") not in ("", "0"):
        raise ConfigError(f"a Redis Cluster has only database 0: drop the path of {url}")
    template = NodeSpec("cluster", None, None, None, 0, url.username, url.password, tls, options, cluster=True)
    seeds = tuple(
        dataclasses.replace(template, label=_label(h, p), host=h, port=p) for h, p in url.host_port(DEFAULT_PORT)
    )
    return ClusterTarget(seeds, template, options)


@dataclass(frozen=True)
class Shard:
    """One master of the cluster as a ``CLUSTER NODES`` reply shows it."""

    host: str
    port: int
    epoch: int
    """Its config epoch: a replica promoted in its place, and a master that imports a slot, take one above
    every other, so per slot the owner's epoch never goes down."""


@dataclass
class SlotMap:
    """Which master serves each slot. Replaced whole by each ``CLUSTER NODES`` reply (``version`` counts them)."""

    owners: list[Shard | None] = field(default_factory=lambda: [None] * SLOTS)
    version: int = 0

    def replace(self, shards: Sequence[tuple[Shard, Sequence[tuple[int, int]]]]) -> None:
        owners: list[Shard | None] = [None] * SLOTS
        for shard, ranges in shards:
            for first, last in ranges:
                owners[first : last + 1] = [shard] * (last - first + 1)
        self.owners = owners
        self.version += 1

    @property
    def known(self) -> bool:
        return self.version > 0

    def masters(self) -> list[Shard]:
        seen: dict[tuple[str, int], Shard] = {}
        for shard in self.owners:
            if shard is not None:
                seen.setdefault((shard.host, shard.port), shard)
        return list(seen.values())


def parse_nodes(text: str, asked: tuple[str, int]) -> list[tuple[Shard, list[tuple[int, int]]]]:
    """The masters serving slots in a ``CLUSTER NODES`` reply, with their slot ranges (``asked``: the node that
    answered, whose own line may show an empty address before it met the others). Slots being migrated show as
    ``[slot->-id]`` or ``[slot-<-id]``: still the owner's until ``SETSLOT NODE``, so they are skipped here."""
    out: list[tuple[Shard, list[tuple[int, int]]]] = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 8:
            continue
        flags = fields[2].split(",")
        if "master" not in flags or "fail" in flags or "noaddr" in flags or "handshake" in flags:
            continue
        address = fields[1].split("@")[0]
        host, _, port = address.rpartition(":")
        host = host.strip("[]") or asked[0]
        ranges: list[tuple[int, int]] = []
        for part in fields[8:]:
            if part.startswith("["):
                continue
            first, _, last = part.partition("-")
            ranges.append((int(first), int(last or first)))
        if ranges:
            out.append((Shard(host, int(port), int(fields[6])), ranges))
    return out


def my_epoch(reply: Any) -> int | None:
    """``cluster_my_epoch`` of a ``CLUSTER INFO`` reply: the config epoch of the answering master (None if the
    reply is not one)."""
    if not isinstance(reply, bytes):
        return None
    start = reply.find(b"cluster_my_epoch:")  # one search, not a split: this runs once per acquire
    if start < 0:
        return None
    end = reply.find(b"\r\n", start)
    return int(reply[start + 17 : end if end >= 0 else len(reply)])


@dataclass(frozen=True)
class Redirect:
    kind: str
    """``MOVED`` (the slot lives elsewhere now: refresh the map), ``ASK`` (this one command, there, after
    ``ASKING``), ``TRYAGAIN`` (a multi-key command while a slot's keys are split: soon again) or ``CLUSTERDOWN``."""
    slot: int | None = None
    host: str | None = None
    port: int | None = None


def redirect(reply: Any) -> Redirect | None:
    """The redirection an error reply means, or None if it is not one."""
    if not isinstance(reply, ResponseError):
        return None
    words = str(reply).split()
    if not words:
        return None
    if words[0] in ("MOVED", "ASK") and len(words) == 3 and words[1].isdigit():
        host, _, port = words[2].rpartition(":")
        return Redirect(words[0], int(words[1]), host.strip("[]"), int(port))
    if words[0] in ("TRYAGAIN", "CLUSTERDOWN"):
        return Redirect(words[0])
    return None
