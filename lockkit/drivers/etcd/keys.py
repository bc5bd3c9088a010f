"""The etcd driver's key layout: pure functions, no I/O (other languages reproduce it in a few lines).

One lock name is one *key range*; every contender (holder or waiter) owns one key in it::

    <prefix><encode_name(name)>/<lease-id, 16 hex>-<slot>

* ``encode_name`` (:mod:`lockkit.names`) percent-encodes ``/`` (and ``%``), so the
  range of ``a`` (``…a/`` up to ``…a0``) never contains a key of ``a/b``
  (``…a%2Fb/…``): no name is a prefix of another name's range.
* The lease id says which session a key belongs to (``etcdctl lease revoke`` it
  to break a dead client's locks). The slot (decimal, from 0) tells apart the
  contenders one session has on one name *at the same time*, so two handles of
  one client contend like strangers; an acquisition takes the lowest slot its
  session is not using. Reusing key names matters: etcd keeps every deleted key
  in its index until compaction and a range read visits them all, so a key name
  per acquisition would make every later read of a busy lock's range slower.
  The token is the key's value: a create retried after a lost reply finds its
  own key again by it.
* The holder is the key with the lowest ``create_revision`` in the range; a
  waiter watches the key with the greatest ``create_revision`` below its own.
"""

from __future__ import annotations

import functools
import re

from ...names import encode_name

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


_KEPT = re.compile(r"[A-Za-z0-9_~:\-]*")
"""A name of only the characters encode_name keeps is its own encoding (most names): no per-byte loop."""


@functools.lru_cache(maxsize=1 << 14)  # every acquire, release-by-value and status read maps a name
def name_range(prefix: str, name: str) -> tuple[bytes, bytes]:
    """``[start, end)`` of the key range of lock ``name``."""
    start = (prefix + (name if _KEPT.fullmatch(name) else encode_name(name)) + "/").encode("utf-8")
    # the range ends just past "/": the next byte up is "0" (prefix_end's rule, without its byte loop)
    return start, start[:-1] + b"0"


def lock_key(prefix: str, name: str, lease_id: int, slot: int) -> bytes:
    """The key a contender for ``name`` creates in slot ``slot`` of session lease ``lease_id``."""
    start, _ = name_range(prefix, name)
    return start + f"{lease_id & 0xFFFFFFFFFFFFFFFF:016x}-{slot}".encode("ascii")
