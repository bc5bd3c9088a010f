"""Presence records (:class:`lockkit.driver.Presence`) on Redis: call builders and reply merging, no I/O.

A group is a hash of member → value plus a sorted set of member → expiry in milliseconds on the
*server's* clock (``TIME`` inside the script), pruned by every announce and read, so a client that
crashed disappears ``ttl`` after its last announce whatever the clients' clocks say. Keys:
:func:`.keys.presence_keys`. Redlock writes to every master (success needs a majority) and
reads the union of the live records of at least a majority: any two majorities share a master, so a
read sees every announce that completed before it. A record's value, when masters disagree, is the
one with the longest time left (the latest announce).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from ...errors import BackendUnavailable, ConfigError
from .calls import Call
from .keys import presence_keys
from .scripts import ANNOUNCE, MEMBERS, WITHDRAW

__all__ = ["announce_call", "members_call", "merge_members", "parse_members", "withdraw_call"]


def announce_call(prefix: str, group: str, member: str, value: str, ttl: float | None) -> Call:
    if ttl is not None and not (isinstance(ttl, (int, float)) and math.isfinite(ttl) and ttl > 0):
        # ConfigError (a ValueError too), as etcd's and ZooKeeper's presence records raise: one error tree.
        raise ConfigError(f"presence ttl must be a positive number of seconds or None, got {ttl!r}; pass e.g. 30")
    ttl_ms = "" if ttl is None else str(max(1, math.ceil(ttl * 1000)))
    return Call(ANNOUNCE, presence_keys(prefix, group), (member, value, ttl_ms))


def withdraw_call(prefix: str, group: str, member: str) -> Call:
    return Call(WITHDRAW, presence_keys(prefix, group), (member,))


def members_call(prefix: str, group: str) -> Call:
    return Call(MEMBERS, presence_keys(prefix, group))


def parse_members(reply: Any, label: str) -> dict[str, tuple[str, float]]:
    """``{member: (value, ms left)}`` from one server's MEMBERS reply (permanent records: ``inf``)."""
    if not isinstance(reply, list):
        raise BackendUnavailable(f"redis {label} refused the members script: {reply}; check the user's ACL")
    out: dict[str, tuple[str, float]] = {}
    for i in range(0, len(reply) - 2, 3):
        left = int(reply[i + 2])
        out[reply[i].decode()] = (reply[i + 1].decode(), math.inf if left < 0 else float(left))
    return out


def merge_members(views: Iterable[dict[str, tuple[str, float]]]) -> dict[str, str]:
    """The union of several servers' live records; the value with the most time left wins."""
    best: dict[str, tuple[str, float]] = {}
    for view in views:
        for member, (value, left) in view.items():
            if member not in best or left > best[member][1]:
                best[member] = (value, left)
    return {member: value for member, (value, _) in best.items()}
