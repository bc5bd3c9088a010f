"""The etcd driver's key layout: pure functions, no I/O (other languages reproduce it in a few lines).

One lock name is one *key range*; every contender (holder or waiter) owns one key in it::

    <prefix><encode_name(name)>/<lease-id, 16 hex>-<sha256(token)[:16]>

* ``encode_name`` (:mod:`lockkit.names`) percent-encodes ``/`` (and ``%``), so the
  range of ``a`` (``…a/`` up to ``…a0``) never contains a key of ``a/b``
  (``…a%2Fb/…``): no name is a prefix of another name's range.
* The lease id says which session a key belongs to (``etcdctl lease revoke`` it
  to break a dead client's locks); the token hash makes the key unique per
  acquisition, so two handles of one client contend like strangers, and a
  retried create whose first reply was lost finds its own key again (like
  kazoo's GUID prefix). The token itself is the key's value.
* The holder is the key with the lowest ``create_revision`` in the range; a
  waiter watches the key with the greatest ``create_revision`` below its own.
"""

from __future__ import annotations

import hashlib

from ..names import encode_name

__all__ = ["DEFAULT_PREFIX", "lock_key", "name_range", "prefix_end"]

DEFAULT_PREFIX = "/lockkit/"


def prefix_end(start: bytes) -> bytes:
    """The exclusive end of the key range that holds every key starting with ``start`` (etcd's rule)."""
    end = bytearray(start)
    for i in range(len(end) - 1, -1, -1):
        if end[i] < 0xFF:
            end[i] += 1
            return bytes(end[: i + 1])
    return b"\0"  # every byte was 0xff: the range runs to the end of the keyspace


def name_range(prefix: str, name: str) -> tuple[bytes, bytes]:
    """``[start, end)`` of the key range of lock ``name``."""
    start = (prefix + encode_name(name) + "/").encode("utf-8")
    return start, prefix_end(start)


def lock_key(prefix: str, name: str, lease_id: int, token: str) -> bytes:
    """The key one acquisition of ``name`` creates under session lease ``lease_id``."""
    start, _ = name_range(prefix, name)
    digest = hashlib.sha256(token.encode("utf-8")).hexdigest()[:16]
    return start + f"{lease_id & 0xFFFFFFFFFFFFFFFF:016x}-{digest}".encode("ascii")
