"""One ZooKeeper session per driver: the kazoo client, started on first use, and its connection states.

kazoo calls the state listener on its connection thread, which must not block:
the listener only records the state and queues it for the session's worker
thread, which applies it to the held locks (:mod:`.leases`), deletes the
nodes we gave up on once it can, and restarts kazoo if its connection loop died.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import AuthFailedError, BadVersionError, NodeExistsError, NoNodeError, UnimplementedError
from kazoo.protocol.states import KazooState, KeeperState
from kazoo.security import CREATOR_ALL_ACL, OPEN_ACL_UNSAFE

from ...driver import LeaseEvents
from ...errors import BackendUnavailable, ConfigError
from ...timing import Clock
from .client import barrier, create_parent_async, new_client
from .leases import Leases, Orphan
from .nodes import Layout, Login, Transient, ZooKeeperOptions, wait, with_prefix

log = logging.getLogger("lockkit")

CLEANUP_TRIES = 3
CONNECT_GRACE = 1.0
"""Seconds a call with a shorter timeout (``try_acquire()``, ``acquire(timeout=0.1)``) still waits for a
connection or a reply, capped by connect_timeout: a connect and handshake take a few milliseconds to a healthy
server, and "one attempt" must be able to make it, yet an unreachable server must not hold such a call for
connect_timeout (10 s by default)."""
REFUSED_GRACE = 2.0
"""Seconds a *first* connection is retried while no server is there (every attempt refused, or the host name
does not resolve) before a waiting call raises, capped by connect_timeout: a server that is starting gets that
long, yet a wrong port or host fails in about 2 s rather than connect_timeout. Once a session has existed,
a refused reconnect waits as any outage does (a restarting server refuses for a while, and the session, with
its locks, may survive it)."""
KNOWN_PARENTS = 4096
"""How many lock names' parents a session remembers having seen (:meth:`Session.parent_known`): a hint only."""
REFUSED_POLL = 0.1
"""How often a call waiting for the first connection looks whether no server is there (kazoo's thread learns it)."""


class Session:
    """The kazoo client of one driver (one session), and the locks it holds (:attr:`leases`)."""

    def __init__(
        self,
        hosts: str,
        options: ZooKeeperOptions,
        credential: str | None,
        clock: Clock,
        events: LeaseEvents,
        layout: Layout,
        shown: str | None = None,
    ) -> None:
        self.options = options
        self.layout = layout
        self.hosts = hosts
        self.url = shown or hosts  # the URL with its password masked, for messages
        self.login = Login(hosts, self.url, credential.partition(":")[0] if credential else None)
        self.acl = CREATOR_ALL_ACL if credential else OPEN_ACL_UNSAFE
        self.containers = True
        self._credential = credential
        self._clock = clock
        self._events = events
        self.events = events
        self._start_lock = threading.Lock()
        self._base_lock = threading.Lock()
        self._mutex = threading.Lock()
        self._kz: KazooClient | None = None
        self._ready: KazooClient | None = None
        self.leases = Leases(self, events, clock)
        self._orphans: list[Orphan] = []  # nodes we gave up on: deleted once connected
        self._parents: OrderedDict[str, None] = OrderedDict()  # parents seen lately, most recent last
        self._wakers: dict[int, Callable[[], None]] = {}
        self._on_delete: dict[str, list[Callable[[], None]]] = {}  # see when_deleted
        self._ids = itertools.count()
        self._negotiated: float | None = None
        self._warned_timeout = False
        self._connected = threading.Event()
        self._ever_connected = False
        self._nothing_there: tuple[float, str] | None = None  # since when, and why (see REFUSED_GRACE)
        self._auth_failed = False  # the server refused our login at connect (AUTH_FAILED): retrying cannot help
        self._queue: queue.SimpleQueue[tuple[str, Any] | None] = queue.SimpleQueue()
        self._worker: threading.Thread | None = None
        self.closed = False

    def twin(self, events: LeaseEvents) -> Session:
        """A second session to the same servers, with the same settings, whose losses go to ``events``.

        Permits (:mod:`.permits`) live on one of their own, as etcd's do on their own leases: a lost session
        then reports exactly the permits on it to the permit handles, and none of the locks.
        """
        return Session(self.hosts, self.options, self._credential, self._clock, events, self.layout, self.url)

    # -- the client ---------------------------------------------------------------------------

    @property
    def timeout(self) -> float:
        """The negotiated session timeout in seconds (the requested one until the first connect)."""
        return self._negotiated or self.options.session_timeout

    @property
    def connect_grace(self) -> float:
        """How long a call whose own timeout is shorter still waits for a connection (see :data:`CONNECT_GRACE`)."""
        return min(self.options.connect_timeout, CONNECT_GRACE)

    @property
    def refused_grace(self) -> float:
        """How long a first connection that finds no server is retried (see :data:`REFUSED_GRACE`)."""
        return min(self.options.connect_timeout, REFUSED_GRACE)

    def end_of(self, deadline: float | None) -> float | None:
        """When a call with ``deadline`` stops waiting for a connection or a reply (``None``: connect_timeout).

        The caller's deadline, but never less than :attr:`connect_grace` from now, so that ``try_acquire()``
        (a deadline already past) can still connect; :meth:`wait_connected` caps it by connect_timeout.
        """
        return None if deadline is None else max(deadline, self._clock() + self.connect_grace)

    def client(self, end: float | None = None) -> KazooClient:
        """The kazoo client, once its first connection is up and the base node exists.

        The first call starts kazoo in the background and waits until ``end`` at most (and connect_timeout
        at most). A call that gives up leaves kazoo connecting, so a later call finds the connection up
        instead of starting again from scratch: a slow handshake still completes, however short each
        caller's timeout.
        """
        ready = self._ready
        if ready is not None:
            return ready
        with self._start_lock:
            if self.closed:
                raise BackendUnavailable("this ZooKeeper driver is closed; open a new locker with lockkit.connect()")
            if self._kz is None and self._ready is None:
                self._start()
        self._connection(end)
        with self._base_lock:  # one caller makes the base node; the others wait for it, then find _ready set
            if self._ready is None:
                kz = self._kz
                if kz is None or self.closed:
                    raise BackendUnavailable(
                        "this ZooKeeper driver is closed; open a new locker with lockkit.connect()"
                    )
                # a failure (e.g. access denied) keeps the connection: the next call tries the node again
                wait(
                    kz.ensure_path_async(self.layout.base, self.acl),
                    f"create {self.layout.base}",
                    self._wait(end),
                    login=self.login,
                )
                self._ready = kz
            return self._ready

    def _new_client(self) -> KazooClient:
        kz = new_client(
            self.hosts, self.options, self._credential, self._set_negotiated, self._on_attempt, self._deleted
        )
        kz.add_listener(functools.partial(self._listener, kz))
        self._kz = kz
        return kz

    def _set_negotiated(self, timeout: float) -> None:
        self._negotiated = timeout

    def _on_attempt(self, nothing_there: str | None) -> None:
        """On kazoo's thread: what a connect attempt met (see :data:`.client.Attempt`)."""
        if nothing_there is None:
            self._nothing_there = None
        else:
            since = self._nothing_there
            self._nothing_there = (since[0] if since else self._clock(), nothing_there)

    def _start(self) -> None:
        kz = self._new_client()
        if self._worker is None:
            self._worker = threading.Thread(target=self._run, name="lockkit-zookeeper", daemon=True)
            self._worker.start()
        kz.start_async()  # kazoo connects (and retries) on its own thread; callers wait with their own bound

    def session_id(self) -> int | None:
        """Our session id while connected, else ``None``."""
        kz = self._kz
        if kz is None or not self._connected.is_set():
            return None
        client_id = kz.client_id
        return int(client_id[0]) if client_id else None

    def wait_connected(self, end: float | None) -> int:
        """The session id once connected; raises ``BackendUnavailable`` at ``end`` or after connect_timeout.

        Not :class:`Transient`: a caller that retries connection blips must not retry this, or an outage
        would hold it beyond its bound.
        """
        self.client(end)
        return self._connection(end)

    def _connection(self, end: float | None) -> int:
        started = self._clock()
        limit = started + self.options.connect_timeout
        if end is not None:
            limit = min(limit, end)
        while True:
            kz = self._kz
            if not self._auth_failed and kz is not None and kz.client_state == KeeperState.AUTH_FAILED:
                # Refused before kazoo ever reported CONNECTED: its state stayed LOST, so no listener was told
                # (kazoo skips a change to the state it is in); seen under load as a 10 s "no connection".
                self._auth_failed = True
            if self._auth_failed:
                raise self.login.refused("log in", AuthFailedError())
            sid = self.session_id()
            if sid is not None:
                return sid
            if self.closed:
                raise BackendUnavailable("this ZooKeeper driver is closed; open a new locker with lockkit.connect()")
            now = self._clock()
            nothing_there = None if self._ever_connected else self._nothing_there
            if nothing_there is not None and now >= min(limit, nothing_there[0] + self.refused_grace):
                raise self.nobody_there(nothing_there[1])
            if now >= limit:
                raise self.unreachable(f"no connection for {max(0.0, now - started):.3g} s")
            # before the first connection, look again soon: kazoo's thread may learn that no server is there
            self._connected.wait(limit - now if self._ever_connected else min(limit - now, REFUSED_POLL))

    def nobody_there(self, why: str) -> BackendUnavailable:
        """The error for a first connection that no server accepted: where, why, and what to check."""
        return BackendUnavailable(
            f"could not connect to ZooKeeper at {self.hosts}: {why}. Is a ZooKeeper server running at "
            f"{self.hosts}, and is the URL right ({self.url})? (A first connection that finds no server fails "
            f"after {self.refused_grace:g} s; other outages wait up to connect_timeout, "
            f"{self.options.connect_timeout:g} s. The client keeps trying in the background.)"
        )

    def unreachable(self, what: str) -> BackendUnavailable:
        """The error for a call that ran out of time without ZooKeeper: what happened, and what to do."""
        return BackendUnavailable(
            f"could not reach ZooKeeper at {self.hosts} ({what}). Is a ZooKeeper server running at {self.hosts} "
            f"and reachable from this host, and is the URL right ({self.url})? A call waits for a connection or "
            f"a reply until its own timeout (try_acquire(): {self.connect_grace:g} s) and at most connect_timeout "
            f"({self.options.connect_timeout:g} s, a zookeeper:// URL option); the client keeps connecting "
            "in the background, so a later call may succeed"
        )

    def _wait(self, end: float | None) -> float:
        """How long to wait for a reply: the session timeout, or less if the caller's ``end`` comes first."""
        if end is None:
            return self.timeout
        return max(0.0, min(self.timeout, end - self._clock()))

    def call(
        self, result: Any, what: str, passthrough: tuple[type[BaseException], ...] = (), end: float | None = None
    ) -> Any:
        """The value of a kazoo async result; ``Transient`` after the session timeout, or at ``end`` if sooner."""
        return wait(result, what, self._wait(end), passthrough, self.login)

    def barrier(self) -> None:
        barrier(self.client(), self.timeout)

    def make_parent(self, parent: str, end: float | None = None) -> None:
        """Create a lock name's (or presence group's) parent: a container node the server deletes once empty."""
        kz = self.client()
        base = parent.rpartition("/")[0]  # <chroot>/lockkit, or <chroot>/lockkit-presence
        for _ in range(3):
            try:
                result = create_parent_async(kz, parent, self.acl, self.containers)
                self.call(result, f"create {parent}", (NodeExistsError, NoNodeError, UnimplementedError), end)
                return
            except NodeExistsError:
                return
            except UnimplementedError:  # ZooKeeper < 3.5: persistent parents, deleted after use instead
                self.containers = False
            except NoNodeError:
                self.call(kz.ensure_path_async(base, self.acl), f"create {base}", end=end)

    # -- which parents exist, as far as we saw: a hint that picks the request pattern, never trusted for safety --

    def parent_known(self, parent: str) -> bool:
        """Whether we lately saw ``parent`` exist (made a node under it), so an acquire expects it.

        Only chooses what an acquire sends first: a plain create (the parent is expected), or also the
        multi that makes parent and node together (:func:`.client.found_async`). Either way the server's
        answer decides; a wrong guess costs one round trip, or one multi that fails and creates nothing.
        """
        with self._mutex:
            if parent not in self._parents:
                return False
            self._parents.move_to_end(parent)
            return True

    def parent_seen(self, parent: str) -> None:
        with self._mutex:
            self._parents[parent] = None
            self._parents.move_to_end(parent)
            while len(self._parents) > KNOWN_PARENTS:
                self._parents.popitem(last=False)

    def parent_gone(self, parent: str) -> None:
        with self._mutex:
            self._parents.pop(parent, None)

    def tidy_parent(self, parent: str) -> None:
        """Without container support, try to delete a parent after use (refused while it has children)."""
        if not self.containers and self._ready is not None:
            self._ready.delete_async(parent)

    # -- contender cleanup --------------------------------------------------------------------

    def abandon(
        self,
        parent: str,
        prefix: str,
        child: str | None,
        owner: int | None,
        czxid: int | None = None,
        *,
        background: bool = False,
        within: float | None = None,
    ) -> bool:
        """Delete a node we gave up on (found by its uuid prefix if its name is unknown), with retries; whether
        that is settled here (deleted, gone, or not ours), not left to a thread or the next reconnect because
        ZooKeeper did not answer.

        Only a node whose ``ephemeralOwner`` is ``owner``, the session that created it, and whose czxid
        is ``czxid`` when known: a node that another client created at the same path (or that our session
        created anew, e.g. through a client that joined it) is not ours to delete (zk-ruby#34). The owner
        may be a session we no longer have (kazoo#732): its nodes can outlive our client's connection loop.

        If the connection is down, the node is deleted on the next reconnect; if its session ends
        first, the server removes it. ``background``: the caller ran out of time with ZooKeeper not
        answering, so the retries (each up to a session timeout) run on a thread of their own instead of
        holding it past its bound. ``within``: the caller gave up (its deadline, a cancel) and waits at most
        that many seconds for ZooKeeper's answers; if they have not come by then the retries go on on a thread of
        their own. A server paused while a waiter waits answers nothing, and kazoo notices only after about two
        thirds of the session timeout: without the bound an ``acquire(timeout=3)`` returned after about 9 s (C-15).
        """
        if owner is None or self._ready is None:
            return True
        if background:
            threading.Thread(
                target=self.abandon,
                args=(parent, prefix, child, owner, czxid),
                name="lockkit-zookeeper-cleanup",
                daemon=True,
            ).start()
            return False
        end = None if within is None else self._clock() + within
        for attempt in range(CLEANUP_TRIES):
            kz = self._ready
            if kz is None or self.session_id() is None:
                break
            try:
                names = (
                    [child]
                    if child
                    else with_prefix(
                        self.call(kz.get_children_async(parent), f"list {parent}", (NoNodeError,), end), prefix
                    )
                )
                for name in names:
                    path = f"{parent}/{name}"
                    stat = self.call(kz.exists_async(path), f"read {path}", end=end)
                    if stat is None or stat.ephemeralOwner != owner or czxid not in (None, stat.czxid):
                        continue  # gone, or another node at our path: not ours to delete
                    with contextlib.suppress(NoNodeError, BadVersionError):  # BadVersion: written to since: leave it
                        deleted = kz.delete_async(path, stat.version)
                        self.call(deleted, f"delete {path}", (NoNodeError, BadVersionError), end)
                self.tidy_parent(parent)
                return True
            except NoNodeError:
                return True
            except Transient:
                if end is not None and self._clock() >= end:
                    # no answer within the caller's bound: the retries (each up to a session timeout) go on
                    # on a thread of their own; a node deleted twice costs a NoNodeError there
                    return self.abandon(parent, prefix, child, owner, czxid, background=True)
                time.sleep(0.05 * 2**attempt)
            except (BackendUnavailable, ConfigError):  # access denied: nothing to retry; the session's end removes it
                log.warning("lockkit: could not delete our ZooKeeper node under %s", parent, exc_info=True)
                return True
        with self._mutex:
            self._orphans.append((parent, prefix, child, owner, czxid))
        return False

    # -- a watched node's deletion, told on kazoo's connection thread (see .client._tell_deletions) --

    def when_deleted(self, path: str, action: Callable[[], None]) -> Callable[[], None]:
        """Run ``action`` once, on kazoo's connection thread, when a deletion event for ``path`` is read.

        Only events for watches this session set arrive, so the caller sets one (an exists-watch) too;
        ``action`` must not block (sending a request does not). Returns a function that cancels it.
        """
        with self._mutex:
            self._on_delete.setdefault(path, []).append(action)

        def forget() -> None:
            with self._mutex:
                actions = self._on_delete.get(path)
                if actions is not None and action in actions:
                    actions.remove(action)
                    if not actions:
                        del self._on_delete[path]

        return forget

    def _deleted(self, path: str) -> None:
        with self._mutex:
            actions = self._on_delete.pop(path, None)
        for action in actions or ():
            try:
                action()
            except Exception:  # on kazoo's connection thread: log and go on (the watch callback still wakes)
                log.debug("lockkit: handling the deletion of %s failed", path, exc_info=True)

    # -- waking waiters ------------------------------------------------------------------------

    def add_waker(self, wake: Callable[[], None]) -> Callable[[], None]:
        key = next(self._ids)
        with self._mutex:
            self._wakers[key] = wake

        def remove() -> None:
            with self._mutex:
                self._wakers.pop(key, None)

        return remove

    def _wake_all(self) -> None:
        with self._mutex:
            wakers = list(self._wakers.values())
        for wake in wakers:
            wake()

    # -- session states (kazoo calls the listener on its connection thread: it must not block) --

    def _listener(self, kz: KazooClient, state: str) -> None:
        if kz is not self._kz:
            return  # a client we replaced (see _revive)
        sid = None
        if state == KazooState.CONNECTED:
            self._ever_connected = True
            self._nothing_there = None
            self._connected.set()
            client_id = self._kz.client_id if self._kz is not None else None
            sid = int(client_id[0]) if client_id else None
        else:
            self._connected.clear()
            if state == KazooState.LOST and kz is not None and kz.client_state == KeeperState.AUTH_FAILED:
                self._auth_failed = True  # kazoo stops connecting; so must _revive
        self._queue.put(("state", (state, sid)))
        self._wake_all()

    def post_lost(self, token: str, reason: str) -> None:
        """Report a lost lock from the worker thread (never from kazoo's: user callbacks run there)."""
        self._queue.put(("lost", (token, reason)))

    def _run(self) -> None:
        while True:
            deadline = self.leases.suspend_deadline
            try:
                item = self._queue.get(timeout=None if deadline is None else max(0.0, deadline - self._clock()))
            except queue.Empty:
                self.leases.expire_if_due(self.timeout)
                continue
            if item is None:
                return
            kind, args = item
            try:
                if kind == "state":
                    self._on_state(*args)
                else:
                    self._events.lost(*args)
            except Exception:  # the worker must survive anything a callback does
                log.exception("lockkit: handling a ZooKeeper session event failed")

    def _on_state(self, state: str, sid: int | None) -> None:
        if state == KazooState.SUSPENDED:
            self.leases.suspended(self.timeout)
        elif state == KazooState.LOST:
            orphans = self.leases.session_lost()
            with self._mutex:
                self._orphans.extend(orphans)
            self._revive()
        elif sid is not None and sid == self.session_id():
            if not self._warned_timeout and abs(self.timeout - self.options.session_timeout) > 1e-3:
                self._warned_timeout = True
                log.warning(
                    "lockkit: ZooKeeper granted a session timeout of %g s (requested %g s); locks live as "
                    "long as the session, so this is their effective ttl",
                    self.timeout,
                    self.options.session_timeout,
                )
            self.leases.reconnected(sid)
            with self._mutex:
                orphans, self._orphans = self._orphans, []
            for orphan in orphans:
                self.abandon(*orphan)

    def _revive(self) -> None:
        """Restart kazoo's connection loop if it died rather than lost the session.

        kazoo ends its connection thread on an unexpected reply (e.g. "xids do not
        match" after bytes were lost mid-stream) and reports CLOSED, whereas an
        expired session leaves it reconnecting with a new one. Without this, the
        driver would stay disconnected until it is closed.
        """
        old = self._kz
        if old is None or self.closed or self._auth_failed or old.client_state != KeeperState.CLOSED:
            return  # after AUTH_FAILED a new session would be refused again, and again: calls raise ConfigError
        log.warning("lockkit: kazoo's ZooKeeper connection loop stopped; starting a new session")
        with self._start_lock:
            if self.closed:
                return
            kz = self._new_client()
            self._ready = kz
        with contextlib.suppress(Exception):
            old.stop()  # its loop is dead: this only stops its callback threads
            old.close()
        kz.start_async()

    def close(self) -> None:
        with self._start_lock:
            self.closed = True
            kz, self._kz, self._ready = self._kz, None, None
        if kz is not None:
            with contextlib.suppress(Exception):
                kz.stop()
            with contextlib.suppress(Exception):
                kz.close()
        self._queue.put(None)
        self._connected.set()  # wake anyone waiting for a connection: they see closed
        self._wake_all()
