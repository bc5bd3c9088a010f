"""How a lock name becomes Redis keys (the same on every client, in every language).

With the default prefix ``lockkit:`` the lock named ``N`` uses::

    lockkit:{E}         the lock: a string holding the holder's token, with a PX expiry
    lockkit:{E}:fence   the fencing counter (INCR on every grant; never expires)
    lockkit:{E}:wake    the pub/sub channel a release publishes to
    lockkit:{E}:queue   redis:// only: waiter ids in arrival order (a list)
    lockkit:{E}:alive   redis:// only: waiter id → alive-until in server ms (a sorted set)
    lockkit:client:C    redis:// only: the pub/sub channel of client C, on which a release tells one of
                        C's waiters that it was granted the lock (waiter ids are "C.<ttl ms>.<token>")
    lockkit:{E}:client:C  redis+cluster:// instead: C's channel for this lock, in its slot (a script may
                        SPUBLISH only there); see :func:`cluster_lock_keys`

and the presence group ``G`` (see :mod:`.presence`) uses::

    lockkit:presence:{E}         hash: member → value
    lockkit:presence:{E}:expiry  sorted set: member → expiry in server milliseconds (+inf: permanent)

where ``E`` is the name's (or group's) UTF-8 text with exactly three characters escaped:
``%`` → ``%25``, ``{`` → ``%7B``, ``}`` → ``%7D``. The escaping keeps the map
injective and makes ``{E}`` the Redis Cluster hash tag of every key of one lock
(a ``}`` inside the name would otherwise end the tag early, and an empty tag
would hash each key on its own), so all keys of a lock live in one slot. The
prefix must not contain ``{`` or ``}``.

Every script of a lock (:mod:`.scripts`) takes its ``KEYS`` in one order, built by
:meth:`LockKeys.script_keys`: lock, fence, queue, alive. A script that needs fewer takes the first
ones: Redlock's scripts the lock alone, the single-node renewal the lock and its fence.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from ...errors import ConfigError

__all__ = [
    "DEFAULT_PREFIX", "LockKeys", "check_prefix", "client_channel", "cluster_lock_keys", "lock_keys", "presence_keys",
]  # fmt: skip

DEFAULT_PREFIX = "lockkit:"
_ESCAPES = str.maketrans({"%": "%25", "{": "%7B", "}": "%7D"})


class LockKeys(NamedTuple):
    """The keys and channels of one lock (immutable: :func:`lock_keys` caches them). A named tuple rather than a
    frozen dataclass, whose ``__init__`` sets each field through ``object.__setattr__``: they are built for
    every fresh name an acquire sees (issue 17: 1.0 of the 3.7 µs a fresh name cost)."""

    lock: bytes
    fence: bytes
    channel: bytes
    queue: bytes
    alive: bytes
    clients: bytes
    """The prefix of the clients' own wake-up channels (``<prefix>client:<client id>``; a channel, not a key)."""
    sharded: bool = False
    """redis+cluster://: the channels are shard channels (SPUBLISH) in the lock's slot, the clients' channels
    per lock (``<prefix>{E}:client:<client id>``); see :func:`cluster_lock_keys`."""

    def script_keys(self, count: int = 4) -> tuple[bytes, ...]:
        """The ``KEYS`` of this lock's scripts, in the order every one of them takes: lock, fence, queue, alive;
        the first ``count`` of them for a script that needs fewer (1: Redlock's, 2: lock and fence)."""
        return (self.lock, self.fence, self.queue, self.alive)[:count]


def check_prefix(prefix: str) -> str:
    if "{" in prefix or "}" in prefix:
        raise ConfigError(
            f"key prefix {prefix!r} must not contain '{{' or '}}' (they delimit the hash tag); choose a prefix "
            "without braces"
        )
    return prefix


_clients: dict[str, bytes] = {}
"""``<prefix>client:`` by prefix: the same for every name."""
_new_keys = tuple.__new__  # a named tuple's own __new__ is a Python function: one frame less per fresh name


@functools.lru_cache(maxsize=1 << 16)  # a renewal round maps thousands of the same names every ttl/3
def lock_keys(prefix: str, name: str) -> LockKeys:
    # translate() through a mapping costs more than the rest together; most names need no escape at all
    escaped = name.translate(_ESCAPES) if "%" in name or "{" in name or "}" in name else name
    base = f"{prefix}{{{escaped}}}".encode()
    clients = _clients.get(prefix)
    if clients is None:
        clients = _clients[prefix] = f"{prefix}client:".encode()
    fields = (base, base + b":fence", base + b":wake", base + b":queue", base + b":alive", clients, False)
    keys: LockKeys = _new_keys(LockKeys, fields)
    return keys


@functools.lru_cache(maxsize=1 << 16)
def cluster_lock_keys(prefix: str, name: str) -> LockKeys:
    """The keys of ``name`` on a Redis Cluster: those of :func:`lock_keys`, with the clients' channels moved into
    the lock's slot (``<prefix>{E}:client:<client id>``), since a script may SPUBLISH only there."""
    keys = lock_keys(prefix, name)
    return LockKeys(keys.lock, keys.fence, keys.channel, keys.queue, keys.alive, keys.lock + b":client:", True)


def client_channel(prefix: str, client_id: str) -> bytes:
    """The channel a fair release's grant to one of this client's waiters is published on."""
    return f"{prefix}client:{client_id}".encode()


def presence_keys(prefix: str, group: str) -> tuple[bytes, bytes]:
    """The record hash and expiry set of a presence group (never equal to a lock's key: no ``{`` after the
    prefix)."""
    base = f"{prefix}presence:{{{group.translate(_ESCAPES)}}}".encode()
    return base, base + b":expiry"
