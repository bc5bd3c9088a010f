"""``zookeeper://`` semaphores and reader-writer locks, in the layouts of kazoo's recipes.

Layout (``P`` = :func:`permit_path`: ``<chroot>/lockkit-permits/`` + :func:`lockkit.names.encode_name` of the
name with ``-`` also percent-encoded as ``%2D``, so that no name's ``P`` ends in ``-__lock__`` and no
semaphore's lock path is another name's ``P``)::

    P                                     container; data: the semaphore's limit ("3"), "0" or empty for rwlocks
    P/<uuid hex>__rlock__<seq>            a reader  (kazoo's ReadLock), ephemeral sequential
    P/<uuid hex>__lock__<seq>             a writer  (kazoo's WriteLock), ephemeral sequential
    P/<uuid hex>                          a semaphore permit (kazoo's Semaphore lease), ephemeral
    P-__lock__/<uuid hex>__lock__<seq>    the semaphore's acquisition lock (kazoo's Lock), ephemeral sequential

Reader-writer locks are kazoo's ``ReadLock``/``WriteLock``: the contenders of ``P`` in sequence order are the
queue; a reader holds when no writer is before it (it watches the last writer before it), a writer when it
is the first (it watches its predecessor). A reader that comes after a waiting writer waits for it: writer
preference, as lockkit's rules ask.

Semaphores are kazoo's ``Semaphore``: a permit is a child of ``P`` created only while holding ``P-__lock__``
(so creators are serialised and count the holders one at a time), the limit is ``P``'s data, and the lock
holder alone watches ``P``'s children for a free permit (no herd: the other waiters queue on the lock, each
watching its predecessor). Where kazoo's recipe is weak, lockkit does more (docs/backends/zookeeper.md):

* **The limit is checked under the lock, at every acquire**, against ``P``'s data read in the same round trip
  as the holders, and the permit is created in one ``multi`` with a ``check`` of that data's version, so a
  limit rewritten in between fails the create instead of mixing limits (kazoo checks once per object).
* **The limit resets once every holder is gone**: the lock holder that finds no permit held rewrites the
  data (version-checked, in the same ``multi`` as its permit), instead of a limit fixed until someone deletes
  the node. ``P`` is created with its data in one request, never empty first (kazoo's ``ensure_path`` +
  ``set`` leaves a moment where another client reads no limit and skips the check).
* **No zombie lock nodes** (kazoo#429): the lock contender's uuid prefix finds a node whose create reply was
  lost, and every node we give up on is deleted by owner and czxid (:meth:`.session.Session.abandon`),
  then or at the next reconnect; it never blocks the queue for the rest of the session.
* A semaphore and a reader-writer lock of one name are refused with ``ConfigError`` (a contender that finds
  the other kind's nodes after its own create deletes its node and raises), as a mismatched limit is.
* **One write when nobody queues** (:meth:`ZooKeeperPermits._fast_permit`): a ``multi`` that deletes and
  remakes the empty lock node (ZooKeeper refuses the delete while it has a child) and creates the permit,
  kept only if the holders read right after it are within the limit; sound beside kazoo's rule, see there.

Fencing tokens are the ``czxid`` of the holder's node (a permit's lease node, a reader's or writer's node):
a global transaction id, so tokens strictly increase per name. A writer holds only once every node created
before it is gone, so its token is above every earlier reader's and writer's; a reader's is above every
writer's before it.

Permits live on a session of their own (:meth:`.session.Session.twin`), so a lost session reports exactly
its permits, to the permit handles; renewal is that session, as for locks (:meth:`ZooKeeperDriver.renew_many`).
"""

from __future__ import annotations

import contextlib
import re
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kazoo.exceptions import (
    BadVersionError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    RolledBackError,
    RuntimeInconsistency,
)
from kazoo.protocol.serialization import CheckVersion, Create2, Delete, SetData
from kazoo.protocol.states import WatchedEvent

from ...driver import Cancel, DriverContext, Grant, PermitInfo, PermitMode, RenewRequest
from ...errors import BackendUnavailable, ConfigError
from ...lease import token_hint
from ...names import encode_name
from ..embedded.permits import limit_mismatch
from .client import (
    CHECK,
    CONTAINER_FLAG,
    CREATE2,
    CREATE_CONTAINER,
    DELETE,
    EPHEMERAL_SEQUENTIAL_FLAG,
    SET_DATA,
    Multi,
    founded,
)
from .nodes import MARK, Transient, contenders, translated
from .session import Session
from .zookeeper_driver import DEADLINE_SLOP, ZooKeeperDriver

__all__ = ["SPACE", "ZooKeeperPermits", "permit_path"]

SPACE = "lockkit-permits"
READ_MARK = "__rlock__"
LOCK_SUFFIX = "-__lock__"
"""kazoo's ``Semaphore`` serialises lease creation with a ``Lock`` at ``path + "-__lock__"``."""
_RW = re.compile(r"(?:__lock__|__rlock__)(-?\d{10})$")
"""A reader's or writer's node (kazoo's contender pattern for ``ReadLock``/``WriteLock``)."""
EPHEMERAL_FLAG = 1


def permit_path(chroot: str, name: str) -> str:
    """``P`` of a semaphore or reader-writer lock (see the module docstring); ``chroot`` is ``""`` or ``/a/b``."""
    return f"{chroot}/{SPACE}/{encode_name(name).replace('-', '%2D')}"


def _rw_order(children: Sequence[str]) -> list[tuple[int, str]]:
    keyed = [(int(m.group(1)), child) for child in children if (m := _RW.search(child))]
    return sorted(keyed)


def _is_writer(child: str) -> bool:
    return READ_MARK not in child


def _rw_blocker(order: Sequence[tuple[int, str]], child: str, mode: str) -> str | None:
    """The node ``child`` waits for (a writer: its predecessor; a reader: the last writer before it)."""
    names = [c for _, c in order]
    before = names[: names.index(child)]
    if mode == "read":
        before = [c for c in before if _is_writer(c)]
    return before[-1] if before else None


def _held_limit(data: bytes) -> int | None:
    """The limit in ``P``'s data (kazoo's ``str(max_leases)``), or ``None`` when it holds none."""
    try:
        value = int(bytes(data).decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return None
    return value if value > 0 else None


@dataclass
class _Node:
    """One of our sequential contender nodes (a reader, a writer, a semaphore's lock contender) while it queues."""

    parent: str
    stem: str
    child: str | None = None
    czxid: int = 0
    session_id: int | None = None
    pending: bool = False
    """A create was sent and its reply never seen: the node may exist (found by its stem)."""
    head: bool = False
    """A semaphore's lock contender that waited once: it is (or is next to be) the lock's head."""


class ZooKeeperPermits:
    """The :class:`~lockkit.driver.PermitDriver` of one :class:`~.zookeeper_driver.ZooKeeperDriver`."""

    def __init__(self, session: Session, ctx: DriverContext, shown: str) -> None:
        self._s = session
        self._clock = ctx.clock
        # renewal, release and the session's states are exactly a lock's: the lock driver's, on our session
        self._nodes = ZooKeeperDriver(session, ctx, shown)
        self._chroot = session.layout.base.rpartition("/")[0]

    def _path(self, name: str) -> str:
        return permit_path(self._chroot, name)

    # -- acquire -----------------------------------------------------------------------------------

    def acquire_permit(
        self,
        name: str,
        token: str,
        ttl: float,
        deadline: float | None,
        limit: int,
        mode: PermitMode,
        cancel: Cancel | None = None,
    ) -> Grant | None:
        silent: list[bool] = []
        grant = self._acquire_permit(name, token, ttl, deadline, limit, mode, cancel, silent)
        if grant is None and silent and not (cancel is not None and cancel.cancelled):
            # taken until the deadline, and then ZooKeeper did not answer our giving up (C-15): a silent server
            raise self._s.unreachable("it stopped answering while this acquire waited for a permit")
        return grant

    def _acquire_permit(
        self,
        name: str,
        token: str,
        ttl: float,
        deadline: float | None,
        limit: int,
        mode: PermitMode,
        cancel: Cancel | None,
        silent: list[bool],
    ) -> Grant | None:
        """:meth:`acquire_permit`; ``silent`` gets an entry if giving up its place got no answer in time."""
        s = self._s
        end = s.end_of(deadline)
        parent = self._path(name)
        data = token_hint(token).encode()
        if mode == "permit":
            node = _Node(parent + LOCK_SUFFIX, uuid.uuid4().hex + MARK)
        else:
            node = _Node(parent, uuid.uuid4().hex + (READ_MARK if mode == "read" else MARK))
        lease = f"{parent}/{uuid.uuid4().hex}"
        wake = threading.Event()
        unhook = s.add_waker(wake.set)
        uncancel = cancel.on_cancel(wake.set) if cancel is not None else None
        granted = unreachable = False
        sent: list[int] = []  # sessions in which our permit's create was sent
        fast = mode == "permit"  # the first look tries the one-request path (see _fast_permit)
        try:
            while True:
                wake.clear()  # before the check: a cancel from now on sets it again, so no wait can miss it
                if cancel is not None and cancel.cancelled:
                    return None
                checked_at = self._clock()
                try:
                    sid = s.wait_connected(end)
                    sent_at = self._clock()
                    outcome: tuple[str, int] | str | None
                    if fast:
                        fast = False
                        outcome = self._fast_permit(lease, data, limit, sid, end, sent) or "again"
                    elif mode == "permit":
                        outcome = self._try_permit(name, node, lease, data, limit, sid, end, wake, sent)
                    else:
                        outcome = self._try_side(name, node, data, mode, sid, end, wake)
                    if isinstance(outcome, tuple):
                        child, czxid = outcome
                        s.leases.hold(token, parent, child, czxid, sid)
                        granted = True
                        return Grant(czxid, s.timeout, sent_at)
                    if outcome == "again":
                        continue
                except Transient as exc:
                    if s.closed:
                        raise
                    now = self._clock()
                    if deadline is not None and checked_at >= deadline - DEADLINE_SLOP and s.session_id() is not None:
                        return None  # the last look, with no time left for its reply: not free in time
                    if end is not None and now >= end:
                        raise s.unreachable(f"{exc} by the end of this call's timeout") from exc
                    wake.wait(0.05)
                    continue
                left = None if deadline is None else deadline - self._clock()
                if left is not None and left <= 0:
                    return None
                wake.wait(left)
        except BackendUnavailable:
            unreachable = True
            raise
        finally:
            unhook()
            if uncancel is not None:
                uncancel()
            # a semaphore's lock contender goes in every case (the permit is its own node); a side's node only
            # when it was not granted
            if (node.child is not None or node.pending) and (mode == "permit" or not granted):
                known = not node.pending and node.child is not None
                settled = s.abandon(
                    node.parent,
                    node.stem,
                    node.child if known else None,
                    node.session_id,
                    node.czxid if known else None,
                    background=unreachable,
                    within=s.connect_grace,  # a server silent since we began waiting must not hold us (C-15)
                )
                if not settled and not granted and not unreachable:
                    silent.append(True)
            if not granted:
                child = lease.rpartition("/")[2]
                for owner in set(sent):  # a permit whose create may have gone through: not ours to keep
                    s.abandon(parent, child, child, owner, background=unreachable, within=s.connect_grace)

    def _try_side(
        self, name: str, node: _Node, data: bytes, mode: str, sid: int, end: float | None, wake: threading.Event
    ) -> tuple[str, int] | str | None:
        """One look for a reader or writer: ``(child, czxid)`` when it holds, ``"again"``, or ``None`` (wait)."""
        s = self._s
        children, extra = self._enqueue(node, sid, end, data, b"0", lambda kz: [kz.get_async(node.parent)])
        if children is None:
            return "again"
        try:
            held = _held_limit(s.call(extra[0], f"read {node.parent}", (NoNodeError,), end)[0])
        except NoNodeError:
            return "again"  # the parent went with our node in it
        leases = [c for c in children if not _RW.search(c)]
        if leases:  # a semaphore's permits: this name is in use as a semaphore
            self._drop(node)
            raise limit_mismatch(name, held or 1, 0)
        order = _rw_order(children)
        if node.child not in [c for _, c in order]:
            node.child = None  # deleted (force release, a recreated parent): queue again
            return "again"
        assert node.child is not None
        blocker = _rw_blocker(order, node.child, mode)
        if blocker is None:
            return node.child, node.czxid
        path = f"{node.parent}/{blocker}"
        if s.call(s.client().exists_async(path, watch=_waker(wake)), f"watch {path}", end=end) is None:
            return "again"  # it left between our two reads
        return None

    def _try_permit(
        self,
        name: str,
        node: _Node,
        lease: str,
        data: bytes,
        limit: int,
        sid: int,
        end: float | None,
        wake: threading.Event,
        sent: list[int],
    ) -> tuple[str, int] | str | None:
        """One look for a semaphore permit (kazoo's ``Semaphore``): queue on its lock, then count the holders.

        ``sent`` records the sessions in which our permit's create was sent (its node is then deleted unless
        granted: a create whose reply was lost may have made it).
        """
        s = self._s
        parent, child = lease.rpartition("/")[::2]

        # A contender that is probably the lock's head now (its predecessor just left, or it was the head
        # already) sets its watch on the holders with this read: one round trip less per handoff. A wrong
        # guess costs one spurious wake-up of this one contender, never a herd.
        watched = node.head

        def reads(kz: Any) -> list[Any]:  # pipelined behind our lock contender's create and list
            return [kz.get_async(parent), kz.get_children_async(parent, watch=_waker(wake) if watched else None)]

        lockers, extra = self._enqueue(node, sid, end, b"", b"", reads)
        if lockers is None:
            return "again"
        try:
            raw, stat = s.call(extra[0], f"read {parent}", (NoNodeError,), end)
            children = list(s.call(extra[1], f"list {parent}", (NoNodeError,), end))
        except NoNodeError:
            self._make(parent, str(limit).encode(), end)  # P carries the limit from its first byte
            return "again"
        kz = s.client()
        if child in children:  # a create of ours went through, its reply lost
            found = s.call(kz.exists_async(lease), f"read {lease}", end=end)
            if found is not None and found.ephemeralOwner == sid and sid in sent:
                self._drop(node)  # made in this session, under our lock: the permit is ours
                return child, int(found.czxid)
            if found is not None and found.ephemeralOwner in sent:
                # made by a session of ours that we no longer have (kazoo#732): it must not count against us
                s.abandon(parent, child, child, found.ephemeralOwner, found.czxid)
            return "again"
        held = _held_limit(raw)
        self._refuse_mixed(name, node, children, held, limit)
        order = contenders(lockers)
        if node.child not in order:
            node.child = None
            return "again"
        place = order.index(node.child)
        node.head = True  # from now on it is, or will be once woken: see ``watched``
        if place > 0:  # another contender takes its permit first: watch the one before us
            path = f"{node.parent}/{order[place - 1]}"
            if s.call(kz.exists_async(path, watch=_waker(wake)), f"watch {path}", end=end) is None:
                return "again"
            return None
        # We hold the semaphore's lock: nobody else creates a permit until we delete our contender.
        if len(children) >= limit:
            if watched:
                return None  # the list above set our watch on the holders: a release wakes us
            # Full. The lock holder alone watches the holders (the other waiters watch their predecessor on
            # the lock): one more list, with the watch, so a release between the two reads is not missed.
            watched_list = kz.get_children_async(parent, watch=_waker(wake))
            try:
                if len(s.call(watched_list, f"list {parent}", (NoNodeError,), end)) >= limit:
                    return None
            except NoNodeError:
                pass
            return "again"
        # The permit, in one multi with a check of the limit's version (or, nobody holding, the new limit).
        if held == limit:
            guard: tuple[int, Any] = (CHECK, CheckVersion(parent, stat.version))
        else:
            guard = (SET_DATA, SetData(parent, str(limit).encode(), stat.version))
        result = kz.handler.async_result()
        sent.append(sid)
        kz._call(Multi([guard, (CREATE2, Create2(lease, data, s.acl, EPHEMERAL_FLAG))]), result)
        made = kz.exists_async(lease)  # the czxid (a create inside a multi may be answered without its stat)
        listed = kz.get_children_async(parent)  # after it: are there readers or writers beside our permit?
        # and our lock contender goes in the same round trip: the multi either made our permit or failed
        contender = f"{node.parent}/{node.child}"
        dropped = kz.delete_async(contender, 0)

        def settle() -> None:
            try:
                s.call(dropped, f"delete {contender}", (NoNodeError, BadVersionError), end)
            except (NoNodeError, BadVersionError):
                pass
            except Transient:
                return  # the acquire's finally hands it to Session.abandon
            node.child = None

        what = f"create a permit under {parent}"
        try:
            with translated(what, s.timeout, (BadVersionError, NoNodeError, NodeExistsError), s.login):
                _raise_failure(s.call(result, what, end=end))
        except (BadVersionError, NoNodeError):
            settle()
            return "again"  # the limit was rewritten, or P reaped, since we read it: queue again
        except NodeExistsError:
            pass  # our earlier multi, its reply lost: the read below says whether it is ours
        found = s.call(made, f"read {lease}", end=end)
        settle()
        if found is None or found.ephemeralOwner != sid:
            return "again"
        czxid = int(found.czxid)
        try:
            after = list(s.call(listed, f"list {parent}", (NoNodeError,), end))
        except NoNodeError:
            after = []
        if any(_RW.search(c) for c in after):
            s.abandon(parent, child, child, sid, czxid)
            sent.remove(sid)
            raise limit_mismatch(name, 0, limit)
        s.parent_seen(parent)  # the next acquire of this name tries the one-write path that expects its nodes
        return child, czxid

    def _fast_permit(
        self, lease: str, data: bytes, limit: int, sid: int, end: float | None, sent: list[int]
    ) -> tuple[str, int] | None:
        """The permit in one write when nobody queues: ``(child, czxid)``, or ``None`` for the careful path.

        One ``multi`` deletes the semaphore's lock node ``L`` (which fails unless ``L`` has no child: nobody
        holds or waits for the lock at that transaction), makes it again, and creates our permit; the holders
        and the limit are read right after it, in the same round trip. The permit is kept only if they show
        our limit, no reader or writer, and at most ``limit`` permits with ours. That is sound with kazoo's
        rule (permits are made only under the lock, after counting): a lock holder's count either comes after
        our multi, so it sees our permit, or its permit came before the multi, so our read sees it; and of
        two permits made this way, the later one's read sees the earlier. A permit that fails the check is
        deleted before anyone is told of it (at worst a lock holder counts it for a moment, and waits).
        """
        s = self._s
        kz = s.client()
        parent, child = lease.rpartition("/")[::2]
        lock = parent + LOCK_SUFFIX
        permit = (CREATE2, Create2(lease, data, s.acl, EPHEMERAL_FLAG))
        remake = (CREATE_CONTAINER, Create2(lock, b"", s.acl, CONTAINER_FLAG))
        variants: dict[str, list[tuple[int, Any]]] = {
            "queue empty": [(DELETE, Delete(lock, -1)), remake, permit],  # fails unless L has no child
            "no queue": [remake, permit],  # L reaped (fails if it exists)
            "fresh name": [
                (CREATE_CONTAINER, Create2(parent, str(limit).encode(), s.acl, CONTAINER_FLAG)),
                remake,
                permit,
            ],
        }
        # the likeliest first: a name this session used lately still has its nodes; another is probably fresh
        order = (
            ["queue empty", "no queue", "fresh name"]
            if s.parent_known(parent)
            else ["fresh name", "queue empty", "no queue"]
        )
        what = f"create a permit under {parent}"
        for variant in order:
            result = kz.handler.async_result()
            sent.append(sid)
            kz._call(Multi(variants[variant]), result)
            made, got, listed = kz.exists_async(lease), kz.get_async(parent), kz.get_children_async(parent)
            try:
                with translated(what, s.timeout, (NotEmptyError, NoNodeError, NodeExistsError), s.login):
                    _raise_failure(s.call(result, what, end=end))
                break
            except NotEmptyError:
                sent.remove(sid)  # the multi failed as a whole: nothing was created
                return None  # someone holds or waits for the lock: the careful path
            except (NoNodeError, NodeExistsError):
                sent.remove(sid)  # a node that variant expected (or not): try the next
        else:
            return None
        s.parent_seen(parent)
        found = s.call(made, f"read {lease}", end=end)
        try:
            raw = bytes(s.call(got, f"read {parent}", (NoNodeError,), end)[0])
            children = list(s.call(listed, f"list {parent}", (NoNodeError,), end))
        except NoNodeError:
            raw, children = b"", []
        if found is None or found.ephemeralOwner != sid:
            return None
        if _held_limit(raw) == limit and len(children) <= limit and not any(_RW.search(c) for c in children):
            return child, int(found.czxid)
        with contextlib.suppress(NoNodeError, BadVersionError):  # over the limit, another limit, or an rwlock
            s.call(kz.delete_async(lease, 0), f"delete {lease}", (NoNodeError, BadVersionError), end)
        sent.remove(sid)  # (if the delete failed, the exception skips this: the acquire's finally retries)
        return None

    def _refuse_mixed(self, name: str, node: _Node, children: list[str], held: int | None, limit: int) -> None:
        """Raise (after deleting our lock contender) if ``P`` is a reader-writer lock or holders use another limit."""
        if any(_RW.search(c) for c in children):
            self._drop(node)
            raise limit_mismatch(name, 0, limit)
        if children and held != limit:
            self._drop(node)
            if held is None:
                raise ConfigError(
                    f"{name!r} has {len(children)} semaphore holder(s) but its node holds no limit (another "
                    "client's data?); lockkit will not guess it. Release them, or use another name"
                )
            raise limit_mismatch(name, held, limit)

    # -- nodes -----------------------------------------------------------------------------------------

    def _enqueue(
        self,
        node: _Node,
        sid: int,
        end: float | None,
        data: bytes,
        parent_data: bytes,
        then: Callable[[Any], list[Any]],
    ) -> tuple[list[str] | None, list[Any]]:
        """Make sure ``node`` exists in this session; return its parent's children and ``then``'s results.

        ``then`` sends more reads, pipelined behind the create and the list (one round trip in all).
        ``None`` for the children: the parent vanished (or was just made): look again.
        """
        s = self._s
        kz = s.client()
        if node.session_id == sid and node.pending:
            try:
                children = list(s.call(kz.get_children_async(node.parent), f"list {node.parent}", (NoNodeError,), end))
            except NoNodeError:
                children = []
            for child in children:
                if child.startswith(node.stem):  # the create went through; its reply was lost
                    stat = s.call(kz.exists_async(f"{node.parent}/{child}"), f"read {node.parent}/{child}", end=end)
                    if stat is not None and stat.ephemeralOwner == sid:
                        node.child, node.czxid = child, stat.czxid
            node.pending = False
        if node.session_id not in (None, sid) and (node.child is not None or node.pending):
            s.abandon(node.parent, node.stem, None, node.session_id)  # a node of a session we no longer have
            node.child, node.pending = None, False
        if node.session_id == sid and node.child is not None:
            listed = kz.get_children_async(node.parent)
            extra = then(kz)
            try:
                return list(s.call(listed, f"list {node.parent}", (NoNodeError,), end)), extra
            except NoNodeError:
                node.child = None
                return None, extra
        node.session_id, node.pending, node.child = sid, True, None
        if not s.parent_known(node.parent) and self._found(node, sid, data, parent_data, end):
            s.parent_seen(node.parent)  # a parent not seen lately is likely fresh: made with our node, one request
            return [node.child] if node.child else [], then(kz)
        node.session_id, node.pending, node.child = sid, True, None
        created = kz.create_async(
            f"{node.parent}/{node.stem}", data, acl=s.acl, ephemeral=True, sequence=True, include_data=True
        )
        listed = kz.get_children_async(node.parent)  # answered after the create: ZooKeeper keeps a session's order
        extra = then(kz)
        try:
            path, stat = s.call(created, f"create a contender under {node.parent}", (NoNodeError,), end)
        except NoNodeError:
            node.pending = False  # nothing was created: the parent is missing; make it with our node in it
            if not self._found(node, sid, data, parent_data, end):
                return None, extra
            return [node.child] if node.child else [], then(kz)  # we made the parent: ours is its only child
        node.child, node.czxid, node.pending = path.rpartition("/")[2], stat.czxid, False
        s.parent_seen(node.parent)
        try:
            return list(s.call(listed, f"list {node.parent}", (NoNodeError,), end)), extra
        except NoNodeError:
            return None, extra

    def _found(self, node: _Node, sid: int, data: bytes, parent_data: bytes, end: float | None) -> bool:
        """Make the parent (a container with ``parent_data``) and ``node`` in one multi; whether it did."""
        s = self._s
        kz = s.client()
        result = kz.handler.async_result()
        operations = [
            (CREATE_CONTAINER, Create2(node.parent, parent_data, s.acl, CONTAINER_FLAG)),
            (CREATE2, Create2(f"{node.parent}/{node.stem}", data, s.acl, EPHEMERAL_SEQUENTIAL_FLAG)),
        ]
        node.session_id, node.pending = sid, True
        kz._call(Multi(operations), result)
        what = f"create {node.parent} with a contender"
        try:
            results = s.call(result, what, end=end)
            node.pending = False  # answered: both nodes exist now, or neither was created
            with translated(what, s.timeout, (NodeExistsError, NoNodeError), s.login):
                node.child, node.czxid = founded(results)
        except NodeExistsError:
            return False  # made by someone else meanwhile: queue under it
        except NoNodeError:
            self._make(node.parent, parent_data, end)  # no base node above it: made there
            return False
        return True

    def _make(self, parent: str, data: bytes, end: float | None) -> None:
        """Create ``parent`` as a container with its ``data`` in one request (and the base above it if missing)."""
        s = self._s
        kz = s.client()
        for _ in range(3):
            result = kz.handler.async_result()
            kz._call(Multi([(CREATE_CONTAINER, Create2(parent, data, s.acl, CONTAINER_FLAG))]), result)
            try:
                results = s.call(result, f"create {parent}", end=end)
                with translated(f"create {parent}", s.timeout, (NodeExistsError, NoNodeError), s.login):
                    _raise_failure(results)
                return
            except NodeExistsError:
                return
            except NoNodeError:
                base = parent.rpartition("/")[0]
                s.call(kz.ensure_path_async(base, s.acl), f"create {base}", end=end)

    def _drop(self, node: _Node) -> None:
        """Delete our contender node now (version 0: it is ours, nobody writes to it); else the finally retries."""
        if node.child is None or node.session_id is None:
            return
        s = self._s
        path = f"{node.parent}/{node.child}"
        try:
            s.call(s.client().delete_async(path, 0), f"delete {path}", (NoNodeError, BadVersionError))
        except (NoNodeError, BadVersionError):
            pass
        except Transient:
            return  # the acquire's finally hands it to Session.abandon
        node.child = None

    # -- renew, release ------------------------------------------------------------------------------

    def renew_permits(self, requests: Sequence[RenewRequest]) -> list[Grant | Exception | None]:
        return self._nodes.renew_many(requests)

    def release_permit(self, name: str, token: str) -> bool:
        return self._nodes.release(name, token)

    # -- administration ------------------------------------------------------------------------------

    def _look(self, name: str) -> tuple[str, bytes, list[str], list[str]]:
        s = self._s
        s.wait_connected(None)
        kz = s.client()
        parent = self._path(name)
        got, listed = kz.get_async(parent), kz.get_children_async(parent)
        lockers = kz.get_children_async(parent + LOCK_SUFFIX)
        try:
            raw = bytes(s.call(got, f"read {parent}", (NoNodeError,))[0])
            children = list(s.call(listed, f"list {parent}", (NoNodeError,)))
        except NoNodeError:
            raw, children = b"", []
        try:
            waiting = contenders(s.call(lockers, f"list {parent}{LOCK_SUFFIX}", (NoNodeError,)))
        except NoNodeError:
            waiting = []
        return parent, raw, children, waiting

    def _holding(self, children: list[str]) -> tuple[list[str], list[str]]:
        """The children that hold, and the rest (queued readers and writers)."""
        order = _rw_order(children)
        if not order:
            return list(children), []
        holding = [c for _, c in order if _rw_blocker(order, c, "write" if _is_writer(c) else "read") is None]
        return holding, [c for _, c in order if c not in holding]

    def permit_holders(self, name: str) -> PermitInfo:
        s = self._s
        parent, raw, children, waiting = self._look(name)
        if not children and not waiting:
            return PermitInfo(None, 0, False, 0, None, 0)
        rw = bool(_rw_order(children))
        holding, queued = self._holding(children)
        kz = s.client()
        stats = [kz.exists_async(f"{parent}/{c}") for c in holding]
        czxids = [stat.czxid for result in stats if (stat := s.call(result, f"read {parent}")) is not None]
        return PermitInfo(
            0 if rw else _held_limit(raw),
            len(holding),
            rw and any(_is_writer(c) for c in holding),
            sum(1 for c in queued if _is_writer(c)),
            max(czxids) if czxids else None,
            len(queued) + len(waiting),
        )

    def force_release_permits(self, name: str) -> int:
        s = self._s
        parent, _, children, waiting = self._look(name)
        holding, _ = self._holding(children)
        kz = s.client()
        paths = [f"{parent}/{c}" for c in children] + [f"{parent}{LOCK_SUFFIX}/{c}" for c in waiting]
        for result, path in [(kz.delete_async(p), p) for p in paths]:
            with contextlib.suppress(NoNodeError, NotEmptyError):
                s.call(result, f"delete {path}", (NoNodeError, NotEmptyError))
        return len(holding)

    def close(self) -> None:
        self._s.close()


def _waker(wake: threading.Event) -> Callable[[WatchedEvent], None]:
    def watch(event: WatchedEvent) -> None:  # on kazoo's callback thread: only sets the event
        wake.set()

    return watch


def _raise_failure(results: list[Any]) -> None:
    """Raise the failure of a failed :class:`~.client.Multi` (the failing operation's own, not a roll-back)."""
    failures = [r for r in results if isinstance(r, Exception)]
    if failures:
        real = [r for r in failures if not isinstance(r, (RolledBackError, RuntimeInconsistency))]
        raise (real or failures)[0]
