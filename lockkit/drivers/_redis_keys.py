"""How a lock name becomes Redis keys (the same on every client, in every language).

With the default prefix ``lockkit:`` the lock named ``N`` uses::

    lockkit:{E}         the lock: a string holding the holder's token, with a PX expiry
    lockkit:{E}:fence   the fencing counter (INCR on every grant; never expires)
    lockkit:{E}:wake    the pub/sub channel a release publishes to

where ``E`` is the name's UTF-8 text with exactly three characters escaped:
``%`` → ``%25``, ``{`` → ``%7B``, ``}`` → ``%7D``. The escaping keeps the map
injective and makes ``{E}`` the Redis Cluster hash tag of every key of one lock
(a ``}`` inside the name would otherwise end the tag early, and an empty tag
would hash each key on its own), so all keys of a lock live in one slot. The
prefix must not contain ``{`` or ``}``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError

__all__ = ["DEFAULT_PREFIX", "LockKeys", "check_prefix", "lock_keys"]

DEFAULT_PREFIX = "lockkit:"
_ESCAPES = str.maketrans({"%": "%25", "{": "%7B", "}": "%7D"})


@dataclass(frozen=True)
class LockKeys:
    lock: bytes
    fence: bytes
    channel: bytes


def check_prefix(prefix: str) -> str:
    if "{" in prefix or "}" in prefix:
        raise ConfigError(f"key prefix {prefix!r} must not contain '{{' or '}}' (they delimit the hash tag)")
    return prefix


def lock_keys(prefix: str, name: str) -> LockKeys:
    base = f"{prefix}{{{name.translate(_ESCAPES)}}}".encode()
    return LockKeys(base, base + b":fence", base + b":wake")
