"""Presence records of the ZooKeeper driver (:class:`lockkit.driver.Presence`, the ``migrate`` fleet guard).

Layout, beside the lock tree but never inside it::

    <chroot>/lockkit-presence/<encode_name(group)>                      container node, one per group
    <chroot>/lockkit-presence/<encode_name(group)>/<encode_name(member)>  one node per record, data = value

``encode_name`` never yields ``/``, ``.`` or ``..``, so every group and member is
one valid, distinct path component (groups ``a`` and ``a/b`` never share a node).

* **announce** with a ttl makes the record an *ephemeral* node of the driver's
  session: **it lives as long as the session, not for the ttl** (the ttl only
  says "not permanent"). A client that crashes or is paused past the session
  timeout disappears when the server expires its session; a live client keeps
  its record for as long as its session lives, announced again or not. The
  first request is ``setData``: when the node exists and is already what we
  want (ephemeral to our session, or persistent for ``ttl=None``) that is the
  whole announce. A missing node (first announce, or the session was lost
  and its ephemerals with it) is created; a node of another kind or of
  another session is deleted (at the version we read) and created again as
  ours. Every step is idempotent, so a step whose reply was lost is retried.
* **announce** with ``ttl=None`` makes a *persistent* node: it stays until withdrawn.
* **withdraw** deletes the node, whoever made it (with credentials: whoever
  has them); a missing record is no error.
* **members** sends ``sync`` on the group, then ``getChildren`` and one
  ``getData`` per child, pipelined: ZooKeeper answers a session's requests in
  order and a read after ``sync`` sees every write committed before it, so
  the reads are linearizable with announces even when our server is a
  follower. Nodes that vanish between the list and the read are left out.

Group nodes are container nodes (the server reaps them once empty), with the
lock nodes' ACL (``CREATOR_ALL`` when the URL has credentials).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from ...errors import ConfigError
from ...names import decode_name, encode_name
from .nodes import Transient

if TYPE_CHECKING:
    from .session import Session

__all__ = ["PRESENCE_SUFFIX", "ZooKeeperPresence"]

PRESENCE_SUFFIX = "-presence"
"""The presence tree is ``<chroot>/lockkit-presence``, a sibling of the lock tree ``<chroot>/lockkit``."""
TRIES = 4

T = TypeVar("T")


class ZooKeeperPresence:
    """``announce`` / ``withdraw`` / ``members`` over the driver's one session (mixed into the driver)."""

    _session: Session

    # -- paths -------------------------------------------------------------------------------------

    def _presence_group(self, group: str) -> str:
        if not group:
            raise ConfigError("a presence group must not be empty; pass a group name such as 'orders'")
        return f"{self._session.layout.base}{PRESENCE_SUFFIX}/{encode_name(group)}"

    def _presence_node(self, group: str, member: str) -> str:
        if not member:
            raise ConfigError("a presence member must not be empty; pass a member id such as 'host-1:4242'")
        return f"{self._presence_group(group)}/{encode_name(member)}"

    def _retried(self, step: Callable[[], T]) -> T:
        """Run an idempotent ``step``, again after a connection blip (a reconnect is waited for each time)."""
        s = self._session
        for attempt in range(TRIES):
            s.wait_connected(None)  # raises after connect_timeout without a connection
            try:
                return step()
            except Transient:
                if attempt == TRIES - 1 or s.closed:
                    raise
        raise AssertionError("unreachable")

    # -- the Presence capability -------------------------------------------------------------------

    def announce(self, group: str, member: str, value: str, ttl: float | None) -> None:
        """Write the record: ephemeral to our session if ``ttl`` is set (it lives with the session), else persistent."""
        path = self._presence_node(group, member)
        if ttl is not None and not (isinstance(ttl, (int, float)) and math.isfinite(ttl) and ttl > 0):
            raise ConfigError(f"a presence ttl must be a positive number of seconds or None, got {ttl!r}; pass e.g. 30")
        data = value.encode("utf-8")
        ephemeral = ttl is not None
        for _ in range(TRIES):
            if self._retried(lambda: self._put(path, data, ephemeral)):
                return
        raise Transient(f"the presence record {path} keeps changing under concurrent announces; retry")

    def _put(self, path: str, data: bytes, ephemeral: bool) -> bool:
        """One round of announce; ``False`` if a concurrent writer made us start over."""
        s = self._session
        kz = s.client()
        sid = s.session_id()
        if sid is None:
            raise Transient("the ZooKeeper connection dropped")
        wanted = sid if ephemeral else 0
        try:
            stat = s.call(kz.set_async(path, data), f"announce {path}", (NoNodeError,))
        except NoNodeError:
            stat = None
        if stat is not None:
            if stat.ephemeralOwner == wanted:
                return True
            try:  # a record of the other kind, or of another session (which would keep it alive): make it ours
                s.call(kz.delete_async(path, stat.version), f"replace {path}", (NoNodeError, BadVersionError))
            except BadVersionError:
                return False  # written again meanwhile: look again
            except NoNodeError:
                pass
        for _ in range(TRIES):
            try:
                s.call(
                    kz.create_async(path, data, acl=s.acl, ephemeral=ephemeral),
                    f"announce {path}",
                    (NoNodeError, NodeExistsError),
                )
                return True
            except NodeExistsError:
                return False  # a racing announce (or our own create whose reply was lost): set it instead
            except NoNodeError:
                s.make_parent(path.rpartition("/")[0])  # the group node: a container, reaped once empty
        raise Transient(f"the presence group node above {path} keeps disappearing; retry")

    def withdraw(self, group: str, member: str) -> None:
        path = self._presence_node(group, member)
        s = self._session

        def delete() -> None:
            with contextlib.suppress(NoNodeError):  # never announced, already withdrawn, or gone with its session
                s.call(s.client().delete_async(path), f"withdraw {path}", (NoNodeError,))

        self._retried(delete)
        s.tidy_parent(path.rpartition("/")[0])

    def members(self, group: str) -> dict[str, str]:
        parent = self._presence_group(group)
        return self._retried(lambda: self._read_group(parent))

    def _read_group(self, parent: str) -> dict[str, str]:
        s = self._session
        kz = s.client()
        synced = kz.sync_async(parent)  # pipelined: the server answers the list only after the sync
        listed = kz.get_children_async(parent)
        s.call(synced, f"sync {parent}")
        try:
            children = list(s.call(listed, f"list {parent}", (NoNodeError,)))
        except NoNodeError:
            return {}
        reads: list[tuple[str, Any]] = [(child, kz.get_async(f"{parent}/{child}")) for child in children]
        out: dict[str, str] = {}
        for child, result in reads:
            try:
                data, _stat = s.call(result, f"read {parent}/{child}", (NoNodeError,))
            except NoNodeError:
                continue  # withdrawn or expired between the list and the read
            try:
                member = decode_name(child)
            except ValueError:
                continue  # not a node lockkit wrote
            out[member] = bytes(data).decode("utf-8", "replace")
        return out
