"""The locks one ZooKeeper session holds, and what the session's states mean for them.

Every lock node a driver holds is *ephemeral* to its one session, so the
session's state is the locks' state (the session's worker thread calls these
methods, never kazoo's own threads):

* ``SUSPENDED`` (connection lost, session maybe alive): every held lock becomes
  *uncertain* at once, and a local timer of the negotiated session timeout
  starts; when it fires before a reconnect, every lock is reported *lost*.
* ``CONNECTED`` again, same session: each lock is verified (its node exists,
  its ``ephemeralOwner`` is our session id, its ``czxid`` the one we were
  granted) and is then *restored*; locks already reported lost have their
  nodes deleted so they do not block others.
* ``LOST`` (session expired or closed), or a new session id: every lock is lost.

From its first renewal batch on, each held node carries an exists-watch of
ours (set by reading the node once), so a node deleted by someone else
(``force_release``, an administrator) is reported lost at once, and later
batches cost one round trip for any number of locks (see
:func:`.client.barrier`). kazoo drops every watch on ``SUSPENDED``
(``KazooClient._reset_watchers``); the reconnect verification re-arms them.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any, Protocol

from kazoo.client import KazooClient
from kazoo.protocol.states import EventType, WatchedEvent

from ...driver import LeaseEvents
from ...errors import BackendUnavailable, ConfigError
from ...timing import Clock
from .nodes import HELD, LOST, UNCERTAIN, Held

Orphan = tuple[str, str, "str | None", int, "int | None"]
"""A node we gave up on: (parent, uuid prefix, child name if known, the session that created it, its czxid if
known), deleted when we can, and only if it is still that node (see :meth:`.session.Session.abandon`)."""


class SessionOps(Protocol):
    """What :class:`Leases` needs of its session (:class:`.session.Session` has it), so it need not import it."""

    def client(self, end: float | None = None) -> KazooClient: ...

    def call(
        self, result: Any, what: str, passthrough: tuple[type[BaseException], ...] = (), end: float | None = None
    ) -> Any: ...

    def abandon(
        self,
        parent: str,
        prefix: str,
        child: str | None,
        owner: int | None,
        czxid: int | None = None,
        *,
        background: bool = False,
    ) -> bool: ...

    def post_lost(self, token: str, reason: str) -> None: ...


class Leases:
    """The registry of one session's held locks."""

    def __init__(self, session: SessionOps, events: LeaseEvents, clock: Clock) -> None:
        self._session = session
        self._events = events
        self._clock = clock
        self._mutex = threading.Lock()
        self._held: dict[str, Held] = {}
        self.suspend_deadline: float | None = None

    def hold(self, token: str, parent: str, child: str, czxid: int, sid: int) -> Held:
        entry = Held(token, parent, child, czxid, sid)
        with self._mutex:
            self._held[token] = entry
        return entry  # the watch is set by the first renewal batch: short holds never pay for it

    def get(self, token: str) -> Held | None:
        with self._mutex:
            return self._held.get(token)

    def take(self, token: str) -> Held | None:
        with self._mutex:
            return self._held.pop(token, None)

    def drop(self, entry: Held) -> None:
        """Forget a lock; if it was lost only locally its node may still exist: delete it."""
        with self._mutex:
            if self._held.get(entry.token) is entry:
                del self._held[entry.token]
        if entry.state == LOST:
            self._session.abandon(entry.parent, entry.prefix, entry.child, entry.session_id, entry.czxid)

    # -- our watch on each held node -----------------------------------------------------------

    def watch(self, entry: Held) -> Any:
        """Read our node and set our exists-watch on it (an async result of its stat)."""
        return self._session.client().exists_async(entry.path, watch=self._watcher(entry))

    def _watcher(self, entry: Held) -> Callable[[WatchedEvent], None]:
        def watch(event: WatchedEvent) -> None:  # runs on kazoo's callback thread: must not block
            if event.type == EventType.DELETED:
                self._gone(entry)
            elif event.type in (EventType.CHANGED, EventType.CREATED):
                with contextlib.suppress(Exception):  # someone wrote to our node: keep watching it
                    self.watch(entry).rawlink(
                        lambda result: self._gone(entry) if result.successful() and result.value is None else None
                    )
            # EventType.NONE: the connection changed; the reconnect check re-arms the watch

        return watch

    def _gone(self, entry: Held) -> None:
        with self._mutex:
            if self._held.get(entry.token) is not entry or entry.state == LOST:
                return
            entry.state = LOST
            del self._held[entry.token]
        self._session.post_lost(entry.token, "our lock node was deleted by another client (force-release?)")

    # -- session states ------------------------------------------------------------------------

    def suspended(self, timeout: float) -> None:
        with self._mutex:
            self.suspend_deadline = self._clock() + timeout
            affected = [e for e in self._held.values() if e.state == HELD]
            for entry in affected:
                entry.state = UNCERTAIN
            for entry in self._held.values():
                entry.armed = False  # kazoo dropped every watch
        reason = (
            f"the ZooKeeper connection is suspended; the lock is uncertain until the session reconnects "
            f"(it is lost after {timeout:g} s)"
        )
        for entry in affected:
            self._events.uncertain(entry.token, reason)

    def expire_if_due(self, timeout: float) -> None:
        with self._mutex:
            if self.suspend_deadline is None or self._clock() < self.suspend_deadline:
                return
            self.suspend_deadline = None
            affected = [e for e in self._held.values() if e.state != LOST]
            for entry in affected:
                entry.state = LOST
        reason = f"ZooKeeper was unreachable for the session timeout ({timeout:g} s)"
        for entry in affected:
            self._events.lost(entry.token, reason)

    def session_lost(self) -> list[Orphan]:
        """Lose every lock; their nodes, normally gone with the session, to delete in case it outlives us."""
        with self._mutex:
            self.suspend_deadline = None
            entries = list(self._held.values())
            self._held.clear()
        for entry in entries:
            if entry.state != LOST:
                self._events.lost(entry.token, "the ZooKeeper session expired: its lock nodes are gone")
        return [(entry.parent, entry.prefix, entry.child, entry.session_id, entry.czxid) for entry in entries]

    def reconnected(self, sid: int) -> None:
        """Verify every lock after a reconnect (and re-arm its watch); restore or lose it."""
        with self._mutex:
            self.suspend_deadline = None
            entries = list(self._held.values())
        session = self._session
        checks = []
        for entry in entries:
            if entry.session_id != sid or entry.state == LOST:
                self.drop(entry)
                if entry.state != LOST:
                    self._events.lost(entry.token, "the ZooKeeper session was replaced: its lock nodes are gone")
                continue
            checks.append((entry, self.watch(entry)))
        for entry, result in checks:
            try:
                stat = session.call(result, f"check {entry.path}")
            except (BackendUnavailable, ConfigError):
                continue  # the connection dropped again: the next SUSPENDED/CONNECTED decides
            with self._mutex:
                mine = stat is not None and stat.ephemeralOwner == sid and stat.czxid == entry.czxid
                current = self._held.get(entry.token) is entry
                if current and mine:
                    entry.state, entry.armed = HELD, True
                elif current:
                    entry.state = LOST
                    del self._held[entry.token]
            if current and mine:
                self._events.restored(entry.token)
            elif current:
                self._events.lost(entry.token, "after reconnecting, our lock node was gone or not ours")
