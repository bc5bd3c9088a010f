"""``zookeeper://[user:password@]host[:port][,host[:port]…][/chroot][?option=value&…]``: consensus locks.

Layout. Every lock name is one *parent* node, and every acquisition one
*contender* node under it::

    <chroot>/lockkit/<encode_name(name)>/<uuid4 hex>__lock__<sequence>     (kazoo's Lock recipe)
    <chroot>/lockkit/<encode_name(name)>/_c_<uuid4>-lock-<sequence>      ?layout=curator (Curator's InterProcessMutex)

Either layout orders both kinds of node by sequence (see :func:`.nodes.sequence`); docs/interop.md is the
recipe other clients follow.
:func:`lockkit.names.encode_name` percent-encodes the name's UTF-8 bytes into
``[A-Za-z0-9_~:%-]``, so every name (``/``, ``.``, ``..``, ``zookeeper``,
unicode, 512 bytes) is one valid path component and no two names share one.
Parents are *container* nodes (ZooKeeper ≥ 3.5.3): the server deletes them
once empty, so names never leak nodes (on older servers, persistent parents
are deleted after use, which the server refuses while they have children).
Contenders are *ephemeral sequential*: they die with the session that made
them; their data is the lease token's :func:`~lockkit.lease.token_hint`.

Acquire sends ``create`` and ``get_children`` back to back (ZooKeeper answers
one session's requests in order, so this costs one round trip). On a name whose
parent the session has not seen lately (a fresh name), it first sends one
``multi`` that makes the parent and our node together: when it succeeds our node
is the parent's only child and holds the lock (one request); when the parent
exists it fails as a whole, creating nothing, and the create follows. The lowest
sequence holds the lock; every other contender sets an exists-watch on its
*predecessor* only, so a release wakes exactly one waiter, in FIFO order. The
uuid prefix lets a create whose reply was lost find its node after a
reconnect instead of leaving an orphan (the failure of kazoo#732). A waiter
that times out or is cancelled (:class:`~lockkit.driver.Cancel`, which the
thread-offload async face fires) deletes its node before returning, with
retries, or on reconnect if the connection is down.

Guarantees and deviations:

* One kazoo client, hence one session, per driver, shared by every lock it
  holds or waits for; closing the driver closes the session and frees them.
* **The lock lives as long as the session, not for a per-lock ttl.** The
  requested ttl is not honoured: the effective ttl reported in every grant
  is the *negotiated* session timeout (``session_timeout`` option, clamped by
  the server), and a lease's validity counts from the send time of the last
  request that proved the session alive. Renewal costs no per-lock traffic:
  a lock's first batch reads its node once and sets an exists-watch on it,
  after which a batch is one round trip whatever the number of locks;
  ``renew()`` of a single lock reads the node and checks its
  ``ephemeralOwner`` and ``czxid``.
* Release deletes our node with version 0; its path (our uuid plus the
  sequence the server gave our create) is the ownership check. An uncertain
  lock's node is read first (``ephemeralOwner`` and ``czxid``).
* Session states are lease states (see :mod:`.session`): ``SUSPENDED``
  makes every lock *uncertain* at once and lost after the session timeout;
  a reconnect restores only locks whose node still exists and is ours
  (``ephemeralOwner`` and ``czxid``); ``LOST`` loses them all.
* An unreachable server is a ``BackendUnavailable`` by the caller's bound:
  waits for a connection or a reply end at the acquire deadline, at
  :data:`.session.CONNECT_GRACE` (1 s) for ``try_acquire`` and shorter
  timeouts, and after ``connect_timeout`` at most. A first connection that
  finds no server (every attempt refused, or the host does not resolve) ends
  after :data:`.session.REFUSED_GRACE` (2 s), asking whether a server runs at
  host:port and whether the URL is right. kazoo's log goes to the
  ``lockkit.kazoo`` logger, below ERROR at DEBUG (:class:`.client.KazooLog`).
* Fencing token: the ``czxid`` of our node, a global transaction id, so it
  strictly increases across acquisitions, names and recreated parents.
* Credentials: ``user:password`` in the URL is sent as a ``digest`` auth and
  every node lockkit creates gets ``CREATOR_ALL`` (only the same credentials
  may read, join or delete); a wrong or missing credential (``NoAuth`` on
  lockkit's nodes) or a login the server refuses (``AUTH_FAILED``) is a
  ``ConfigError`` naming the user, never the password. TLS is not supported yet.
* kazoo has no asyncio API: the async face is :class:`lockkit.offload.ThreadOffloadDriver`.
* Presence records (``migrate``) live as long as the session, not for their ttl: see :mod:`.presence`.
* Semaphores and reader-writer locks (kazoo's recipes' layouts, on a session of their own): :mod:`.permits`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, UnimplementedError
from kazoo.protocol.states import EventType, WatchedEvent

from ...driver import Cancel, DriverContext, Grant, Guarantees, HolderInfo, LeaseEvents, Offer, RenewRequest
from ...errors import BackendUnavailable, ConfigError
from ...lease import token_hint
from ...urls import BackendURL, parse_options
from . import nodes
from .client import found_async, founded
from .nodes import HELD, LOST, UNCERTAIN, Held, Layout, Transient, ZooKeeperOptions
from .presence import ZooKeeperPresence
from .session import Session

__all__ = ["ZooKeeperDriver", "ZooKeeperOptions"]

log = logging.getLogger("lockkit")

PARENT_RETRIES = 3
DELETE_TRIES = 3


DEADLINE_SLOP = 0.005
"""A wait that returns this close to the deadline counts as having reached it."""


@dataclass
class _Contender:
    """One acquisition's node while it queues."""

    parent: str
    prefix: str
    data: bytes
    child: str | None = None
    czxid: int = 0
    session_id: int | None = None
    pending: bool = False
    """A create was sent and its reply never seen: the node may exist (found by ``prefix``)."""
    founded_at: float | None = None
    """When :meth:`ZooKeeperDriver._busy` sent the multi that made the parent with our node (its only child)."""
    relisted: tuple[int, float, Any] | None = None
    """The list our predecessor's deletion sent at once (session id, send time, kazoo async result)."""
    done: bool = False
    """The acquire returned: a watch that fires later sends nothing."""
    silent: bool = False
    """Giving up our place (a timeout) got no answer within the grace: ZooKeeper stopped answering meanwhile."""


class ZooKeeperDriver(ZooKeeperPresence):
    guarantees: ClassVar[Guarantees] = Guarantees(
        scope="consensus",
        fifo=True,
        fencing="strict",
        survives_failover=True,
        lifetime="session",
        note="A lock lives as long as the client's ZooKeeper session; its ttl is the negotiated session timeout.",
        semaphores=Offer("yes"),  # issue 18: .permits, kazoo's ReadLock/WriteLock/Semaphore layouts
    )

    def __init__(self, session: Session, ctx: DriverContext, shown: str) -> None:
        self._session = session
        self._layout = session.layout
        self._clock = ctx.clock
        self._shown = shown
        self._noted_ttl = False

    @classmethod
    def from_url(cls, url: BackendURL, ctx: DriverContext) -> ZooKeeperDriver:
        options = parse_options(ZooKeeperOptions, url.options, url)
        hosts, chroot = nodes.hosts_of(url), nodes.chroot_of(url)
        credential = None
        if url.username is not None or url.password is not None:
            if not url.username or not url.password:
                raise ConfigError(
                    f"ZooKeeper digest credentials need both a user and a password: {url}; "
                    "write zookeeper://USER:PASSWORD@host:port/chroot, or no credentials at all"
                )
            credential = f"{url.username}:{url.password}"
        session = Session(hosts, options, credential, ctx.clock, ctx.events, Layout(chroot, options.layout), str(url))
        return cls(session, ctx, str(url))

    def __repr__(self) -> str:
        return f"ZooKeeperDriver({self._shown!r})"

    # -- acquire -------------------------------------------------------------------------------

    def acquire(
        self, name: str, token: str, ttl: float, deadline: float | None, cancel: Cancel | None = None
    ) -> Grant | None:
        c = _Contender(self._layout.parent(name), self._layout.new_stem(), token_hint(token).encode())
        grant = self._acquire(c, token, ttl, deadline, cancel)
        if grant is None and c.silent and not (cancel is not None and cancel.cancelled):
            # The lock was taken until the deadline, and then ZooKeeper did not answer our giving up (C-15): a
            # silent server, not "not free in time", whose advice (retry later, a larger timeout) does not fit.
            raise self._session.unreachable("it stopped answering while this acquire waited for the lock")
        return grant

    def _acquire(
        self, c: _Contender, token: str, ttl: float, deadline: float | None, cancel: Cancel | None
    ) -> Grant | None:
        s = self._session
        # Waits for a connection or a reply stop at ``end``: the deadline, or CONNECT_GRACE from now for a
        # shorter one (try_acquire), and connect_timeout at most. Past it, an unreachable server is a
        # BackendUnavailable, not a LockTimeout: nobody was seen holding the lock.
        end = s.end_of(deadline)
        wake = threading.Event()
        unhook = s.add_waker(wake.set)
        uncancel = cancel.on_cancel(wake.set) if cancel is not None else None
        granted = unreachable = False
        forget: Callable[[], None] | None = None  # our request to be told of the predecessor's deletion
        try:
            if deadline is not None and self._clock() >= deadline and self._busy(c, end):
                return None  # one attempt and the lock is taken: no need to queue a node
            while True:
                wake.clear()  # before the check: a cancel from now on sets it again, so no wait can miss it
                if cancel is not None and cancel.cancelled:
                    return None
                checked_at = self._clock()
                try:
                    sid = s.wait_connected(end)
                    sent_at = self._clock() if c.founded_at is None else c.founded_at
                    relisted, c.relisted = c.relisted, None
                    early = None
                    if relisted is not None and relisted[0] == sid:
                        sent_at, early = min(sent_at, relisted[1]), relisted[2]
                    order = nodes.contenders(self._enqueue(c, sid, end, early))
                    if c.child not in order:
                        c.child = None  # our node was deleted (administrator, recreated parent): queue again
                        continue
                    place = order.index(c.child)
                    if place == 0:
                        s.leases.hold(token, c.parent, c.child, c.czxid, sid)
                        granted = True
                        self._note_ttl(ttl)
                        return Grant(c.czxid, s.timeout, sent_at)
                    predecessor = f"{c.parent}/{order[place - 1]}"
                    if forget is not None:
                        forget()
                    forget = s.when_deleted(predecessor, self._relist(c, sid))
                    watched = s.client().exists_async(predecessor, watch=self._on_predecessor(c, sid, wake))
                    if s.call(watched, f"watch {predecessor}", end=end) is None:
                        continue  # it left between our two reads
                except Transient as exc:
                    if s.closed:
                        raise
                    now = self._clock()
                    if deadline is not None and checked_at >= deadline - DEADLINE_SLOP and s.session_id() is not None:
                        # The re-check made once the caller's time was up had no time left for its reply: the lock
                        # was not free in time, a timeout. (A read started earlier that got no answer by the
                        # deadline is a silent server, reported below.)
                        return None
                    if end is not None and now >= end:
                        raise s.unreachable(f"{exc} by the end of this call's timeout") from exc
                    wake.wait(0.05)  # a blip: wait_connected above bounds the outage
                    continue
                left = None if deadline is None else deadline - self._clock()
                if left is not None and left <= 0:
                    return None
                wake.wait(left)
        except BackendUnavailable:
            unreachable = True
            raise
        finally:
            c.done = True
            if forget is not None:
                forget()
            unhook()
            if uncancel is not None:
                uncancel()
            if not granted and (c.child is not None or c.pending):
                # After an outage, clean up on a thread: the caller's time is up, and ZooKeeper may not answer.
                # Otherwise (a timeout, a cancel) wait for the clean-up as long as a short call would wait for a
                # reply at most: a server that went silent while we waited must not hold the caller (C-15).
                known = not c.pending and c.child is not None
                settled = s.abandon(
                    c.parent,
                    c.prefix,
                    c.child if known else None,
                    c.session_id,
                    c.czxid if known else None,
                    background=unreachable,
                    within=s.connect_grace,
                )
                c.silent = not settled and not unreachable

    def _relist(self, c: _Contender, sid: int) -> Callable[[], None]:
        """Send our next list at once: on our predecessor's deletion, on kazoo's connection thread.

        :meth:`.session.Session.when_deleted` runs it as the connection thread reads the event, so the list is
        the next request written, with no thread hand-off before it (:func:`.client._tell_deletions`); the
        acquiring thread's wake-up is off the hand-off's critical path. It matters beyond those microseconds:
        the releasing client's next create, a write that waits for its fsync, is usually not at the server
        yet, and a standalone server answers a read that arrives behind a pending write only after that
        write's fsync. The acquire uses the list only in the same session, and counts the lease from its
        send time. Sending is not blocking (a queue and a byte to kazoo's wake-up socket).
        """
        kz = self._session.client()

        def relist() -> None:
            # (once: a watch callback that fires later finds the list sent)
            if not c.done and c.relisted is None:
                c.relisted = (sid, self._clock(), kz.get_children_async(c.parent))

        return relist

    def _on_predecessor(self, c: _Contender, sid: int, wake: threading.Event) -> Callable[[WatchedEvent], None]:
        """The watch on our predecessor: on its deletion, wake the acquire (the list is on its way already).

        It runs on kazoo's callback thread (it must not block). The list was sent on the connection thread
        (:meth:`_relist`); if it was not (it failed there), it is sent from here, still ahead of the acquiring
        thread's wake-up.
        """
        kz = self._session.client()

        def watch(event: WatchedEvent) -> None:
            # (not again if a second watch on the same node fires: after a blip the loop may have set two)
            if event.type == EventType.DELETED and not c.done and c.relisted is None:
                with contextlib.suppress(Exception):  # a closed client: the acquire's own list reports it
                    c.relisted = (sid, self._clock(), kz.get_children_async(c.parent))
            wake.set()

        return watch

    def _enqueue(self, c: _Contender, sid: int, end: float | None, early: Any = None) -> list[str]:
        """Make sure our node exists in this session; return the parent's children (read after it).

        ``early``: a list of the parent already sent in this session (see :meth:`_on_predecessor`).
        """
        s = self._session
        kz = s.client()
        if c.founded_at is not None:
            c.founded_at = None
            if c.session_id == sid and c.child is not None:
                return [c.child]  # _busy's multi made the parent with our node in it: its only child
        if c.session_id == sid and c.child is not None:
            listing = early if early is not None else kz.get_children_async(c.parent)
            try:
                return list(s.call(listing, f"list {c.parent}", (NoNodeError,), end))
            except NoNodeError:
                return []  # the parent was deleted with our node in it: queue again
        if c.session_id == sid and c.pending:
            try:
                children = list(s.call(kz.get_children_async(c.parent), f"list {c.parent}", (NoNodeError,), end))
            except NoNodeError:
                children = []  # no parent, so the create did not go through
            for child in nodes.with_prefix(children, c.prefix):  # the create went through; its reply was lost
                stat = s.call(kz.exists_async(f"{c.parent}/{child}"), f"read {c.parent}/{child}", end=end)
                if stat is not None and stat.ephemeralOwner == sid:
                    c.child, c.czxid, c.pending = child, stat.czxid, False
                    return children
            c.pending = False
        if c.session_id not in (None, sid) and (c.child is not None or c.pending):
            s.abandon(c.parent, c.prefix, None, c.session_id)  # a node of a session we no longer have (kazoo#732)
        for _ in range(PARENT_RETRIES):
            c.session_id, c.pending, c.child = sid, True, None
            if s.containers and not s.parent_known(c.parent):
                # A parent we have not seen lately: most likely a fresh name (a lock per order id). One multi
                # makes the parent and our node, and when it succeeds our node is the only child: one round trip,
                # no list. If the parent exists, the multi fails as a whole and creates nothing; queue under it.
                try:
                    return self._founded(c, end)
                except NodeExistsError:
                    s.parent_seen(c.parent)
                    c.pending = True  # the create below
                except (UnimplementedError, NoNodeError) as exc:
                    # no container nodes (ZooKeeper < 3.5.3: persistent parents), or no base node above the parent
                    c.pending = False
                    s.containers = s.containers and not isinstance(exc, UnimplementedError)
                    s.make_parent(c.parent, end)
            created = kz.create_async(
                f"{c.parent}/{c.prefix}", c.data, acl=s.acl, ephemeral=True, sequence=True, include_data=True
            )
            listed = kz.get_children_async(c.parent)  # pipelined: the server answers it after the create
            try:
                path, stat = s.call(created, f"create a contender under {c.parent}", (NoNodeError,), end)
            except NoNodeError:
                c.pending = False  # nothing was created: the parent is missing (reaped since we saw it)
                s.parent_gone(c.parent)
                if not s.containers:
                    s.make_parent(c.parent, end)
                continue  # the next round sends the multi
            c.child, c.czxid, c.pending = path.rpartition("/")[2], stat.czxid, False
            s.parent_seen(c.parent)
            try:
                return list(s.call(listed, f"list {c.parent}", (NoNodeError,), end))
            except NoNodeError:
                return []  # the parent was deleted with our node in it: queue again
        raise Transient(f"the parent node {c.parent} keeps disappearing; retry, and check that nothing else deletes it")

    def _founded(self, c: _Contender, end: float | None) -> list[str]:
        """Make the parent and our node in one multi (:func:`.client.found_async`); return the parent's children.

        The multi made the parent, so our node is its only child: no list is read. Raises ``NodeExistsError``
        (the parent exists: nothing was created), ``NoNodeError`` (no base node) or ``UnimplementedError``
        (no container nodes on this server).
        """
        s = self._session
        what = f"create {c.parent} with a contender"
        results = s.call(found_async(s.client(), c.parent, c.prefix, c.data, s.acl), what, end=end)
        c.pending = False  # answered: either both nodes exist now, or neither was created
        try:
            c.child, c.czxid = founded(results)
        except Exception:  # (translated only on failure, as nodes.wait does)
            with nodes.translated(what, s.timeout, (NodeExistsError, NoNodeError, UnimplementedError), s.login):
                raise
        s.parent_seen(c.parent)
        return [c.child]

    def _busy(self, c: _Contender, end: float | None) -> bool:
        """One look, for an acquire whose time is up (``try_acquire``): is the lock taken? Queues no node.

        On a parent the session has not seen, the multi that makes parent and node is pipelined behind the
        list: if it succeeds the name was free and the lock is ours (``c.founded_at``), in one round trip;
        if the parent exists it fails, creating nothing, and the list answers.
        """
        s = self._session
        sid = s.wait_connected(end)
        kz = s.client()
        founding = None
        sent_at = self._clock()
        listed = kz.get_children_async(c.parent)
        if s.containers and not s.parent_known(c.parent):
            c.session_id, c.pending = sid, True
            founding = found_async(kz, c.parent, c.prefix, c.data, s.acl)
        try:
            try:
                busy = bool(nodes.contenders(s.call(listed, f"list {c.parent}", (NoNodeError,), end)))
            except NoNodeError:
                busy = False
            if founding is not None:
                what = f"create {c.parent} with a contender"
                results = s.call(founding, what, end=end)
                c.pending = False
                try:
                    with nodes.translated(what, s.timeout, (NodeExistsError, NoNodeError, UnimplementedError), s.login):
                        c.child, c.czxid = founded(results)
                except NodeExistsError:
                    s.parent_seen(c.parent)  # the list's answer stands
                except (NoNodeError, UnimplementedError):
                    pass  # no base node, or no containers: the queueing path below handles both
                else:
                    c.founded_at = sent_at
                    s.parent_seen(c.parent)
                    return False
            return busy
        except Transient as exc:
            if s.closed:
                raise
            raise s.unreachable(f"{exc} within this call's timeout") from exc

    def _note_ttl(self, ttl: float) -> None:
        if not self._noted_ttl and abs(ttl - self._session.timeout) > 1e-3:
            self._noted_ttl = True
            log.info(
                "lockkit: ZooKeeper locks live as long as the session: requested ttl %g s, effective ttl "
                "(the negotiated session timeout) %g s",
                ttl,
                self._session.timeout,
            )

    # -- renew ---------------------------------------------------------------------------------

    def renew(self, name: str, token: str, ttl: float) -> Grant | None:
        """Read our node: it must exist, with our session as ``ephemeralOwner`` and its original czxid."""
        s = self._session
        entry = s.leases.get(token)
        if entry is None or entry.state == LOST:
            if entry is not None:
                s.leases.drop(entry)
            return None
        sent_at = self._clock()
        sid = s.session_id()
        if sid is None or entry.state == UNCERTAIN:
            raise Transient("the ZooKeeper session is suspended; the lock is uncertain until it reconnects")
        stat = s.call(s.client().exists_async(entry.path), f"read {entry.path}")
        if stat is None or stat.ephemeralOwner != sid or stat.czxid != entry.czxid:
            s.leases.drop(entry)
            return None
        return Grant(entry.czxid, s.timeout, sent_at)

    def renew_many(self, requests: Sequence[RenewRequest]) -> list[Grant | Exception | None]:
        """One round trip for the batch: the session is alive, and no held node's watch has fired.

        A lock's first batch reads its node (owner and czxid checked) and sets our
        exists-watch on it; from then on the watch reports a deletion, so later
        batches send one request whatever the number of locks.
        """
        if not requests:
            return []
        s = self._session
        sent_at = self._clock()
        sid = s.session_id()
        if sid is None:
            raise Transient("the ZooKeeper session is suspended; renewal retries until the lease deadline")
        entries = [s.leases.get(request.token) for request in requests]
        first = [(e, s.leases.watch(e)) for e in entries if e is not None and e.state == HELD and not e.armed]
        s.call(s.client().exists_async(self._layout.base), "reach ZooKeeper")
        for fresh, result in first:
            stat = s.call(result, f"read {fresh.path}")
            if stat is not None and stat.ephemeralOwner == sid and stat.czxid == fresh.czxid:
                fresh.armed = True
            else:
                fresh.state = LOST  # gone or not ours: reported by returning None below
        s.barrier()
        if s.session_id() != sid:
            raise Transient("the ZooKeeper connection changed during renewal")
        results: list[Grant | Exception | None] = []
        for entry in entries:
            if entry is None or entry.state == LOST or entry.session_id != sid:
                if entry is not None:
                    s.leases.drop(entry)
                results.append(None)
            elif entry.state == UNCERTAIN or not entry.armed:
                results.append(Transient("the lock is uncertain until the session's reconnect is verified"))
            else:
                results.append(Grant(entry.czxid, s.timeout, sent_at))
        return results

    # -- release -------------------------------------------------------------------------------

    def release(self, name: str, token: str) -> bool:
        s = self._session
        entry = s.leases.take(token)
        if entry is None:
            return False
        if entry.state == LOST:
            s.leases.drop(entry)
            return False
        sid = s.session_id()
        if sid != entry.session_id:
            if sid is None:
                s.abandon(entry.parent, entry.prefix, entry.child, entry.session_id, entry.czxid)
                raise Transient(
                    "could not release: ZooKeeper is unreachable. The lock node is deleted when the session "
                    "reconnects, or by the server when the session expires. Treat the lock as no longer held"
                )
            return False  # a new session: the old one's nodes are gone
        # Held: the path itself is the ownership check. It is this acquisition's uuid plus a sequence the server
        # assigned to our session's create, so no client's sequential create can ever reproduce it, and
        # version 0 means nobody wrote to it. Uncertain (reconnecting): read it first, ephemeralOwner must be
        # our session and czxid the one we were granted.
        version = 0 if entry.state == HELD else None
        released = self._delete_owned(entry, sid, version)
        s.tidy_parent(entry.parent)
        return released

    def _delete_owned(self, entry: Held, sid: int, version: int | None) -> bool:
        s = self._session
        kz = s.client()
        for attempt in range(DELETE_TRIES):
            try:
                if version is None:
                    stat = s.call(kz.exists_async(entry.path), f"read {entry.path}")
                    if stat is None or stat.ephemeralOwner != sid or stat.czxid != entry.czxid:
                        return False
                    version = stat.version
                s.call(kz.delete_async(entry.path, version), f"delete {entry.path}", (NoNodeError, BadVersionError))
                return True
            except NoNodeError:
                return attempt > 0  # after a lost reply, gone means our first delete went through
            except BadVersionError:
                version = None  # someone wrote into our node: check it is still ours, then delete that version
            except Transient:
                if attempt == DELETE_TRIES - 1 or s.session_id() != sid:
                    s.abandon(entry.parent, entry.prefix, entry.child, sid, entry.czxid)
                    raise
        return False

    # -- administration ------------------------------------------------------------------------

    def _lowest(self, name: str) -> tuple[str, list[str]] | None:
        s = self._session
        parent = self._layout.parent(name)
        s.wait_connected(None)  # raises after connect_timeout
        try:
            order = nodes.contenders(s.call(s.client().get_children_async(parent), f"list {parent}", (NoNodeError,)))
        except NoNodeError:
            return None
        return (f"{parent}/{order[0]}", order) if order else None

    def holder(self, name: str) -> HolderInfo:
        s = self._session
        for _ in range(DELETE_TRIES):
            found = self._lowest(name)
            if found is None:
                return HolderInfo(False, waiters=0)
            path, order = found
            try:
                data, stat = s.call(s.client().get_async(path), f"read {path}", (NoNodeError,))
            except NoNodeError:
                continue  # released between our two reads
            return HolderInfo(True, nodes.holder_hint(bytes(data)), stat.czxid, None, len(order) - 1)
        return HolderInfo(False)

    def force_release(self, name: str) -> bool:
        s = self._session
        found = self._lowest(name)
        if found is None:
            return False
        try:
            s.call(s.client().delete_async(found[0]), f"delete {found[0]}", (NoNodeError,))
        except NoNodeError:
            return False
        return True

    def ping(self) -> None:
        s = self._session
        s.wait_connected(None)  # raises after connect_timeout
        # a read, not exists(): reading needs the base node's READ permission, so a wrong password (another
        # digest identity, refused by the CREATOR_ALL ACL) fails the check instead of passing it
        s.call(s.client().get_async(self._layout.base), f"read {self._layout.base}")

    def close(self) -> None:
        self._session.close()

    # -- semaphores and reader-writer locks (issue 18; see .permits) ---------------------------

    def permits(self, events: LeaseEvents | None = None) -> Any:
        """Permits on a session of their own, whose losses are reported to ``events`` (the permit handles')."""
        from .permits import ZooKeeperPermits

        return ZooKeeperPermits(
            self._session.twin(events or self._session.events),
            DriverContext(self._clock, events or self._session.events),
            self._shown,
        )

    @property
    def session_timeout(self) -> float:
        """The negotiated session timeout in seconds (the requested one until the first connect)."""
        return self._session.timeout
