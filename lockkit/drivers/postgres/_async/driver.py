"""``postgresql://`` on one PostgreSQL server: session-level advisory locks held by sessions the driver owns.

This file is the source of both faces: ``scripts/unasync.py`` generates ``../_sync/driver.py`` from it. See
:mod:`lockkit.drivers.postgres.driver` and docs/backends/postgres.md for the design; in short:

* The driver keeps a small pool of *sessions* (connections it opened itself, in autocommit mode). A held lock
  is ``pg_advisory_lock(key)`` of one session, and lasts until that session unlocks it or ends. A session
  holds any number of locks, but never two of one name: advisory locks are re-entrant per session, so a second
  acquisition of a name in this process always goes to another session (a name is *claimed* on a session
  before its statement is sent).
* A grant is one statement: the lock call and the bump of the name's fencing counter (:mod:`..sql`).
* An uncontended acquire tries (``pg_try_advisory_lock``) on any session that does not hold the name; a
  contended one waits in the server's lock queue (``pg_advisory_lock``, bounded by ``lock_timeout``) on a
  session that holds nothing (a blocked session cannot send heartbeats for others), which then holds it.
* Renewal is a heartbeat per session (its backend pid must still answer), whatever the number of its locks.
  A session found dead ends its leases, reported through ``ctx.events.lost``.
* Between statements every session's socket is watched (:class:`.primitives.Watch`): the server writes to an
  idle session only to end it, so a readable idle socket triggers a heartbeat at once, and a restart or
  ``pg_terminate_backend`` is reported before the server can grant the locks again.
* Every statement is bounded (:meth:`AsyncPostgresDriver._exec`): by the ``timeout`` option, and an acquire's
  by what is left of its deadline (at least :data:`MIN_ACQUIRE_BOUND`). A server that accepts TCP but does
  not answer (paused, stalled, a blackholed path: the kernel still acknowledges, so neither keepalives nor
  ``tcp_user_timeout`` fire) then gets its session cut, never waited on: the socket is shut for reading, so
  the session is never used again and no late reply is read as another statement's. The socket itself stays
  open until the session's leases' deadlines: lockkit never ends a session whose locks a holder may still
  trust (the server would hand them to someone else if it ran again meanwhile).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, NoReturn

import psycopg
from psycopg import AsyncConnection
from psycopg import errors as pg_errors

from ....driver import Cancel, DriverContext, Grant, Guarantees, HolderInfo, LeaseEvents, RenewRequest, one_renewal
from ....errors import BackendUnavailable, ConfigError, LockError
from ....lease import token_hint
from ....urls import BackendURL
from ..config import PostgresOptions, connect_params
from ..facts import ACL_HINT, GUARANTEES
from ..keys import advisory_key, lock_parts
from ..sql import Statements
from .primitives import Background, StateLock, Watch

__all__ = ["AsyncPostgresDriver"]

GRANT_TRIES = 3
"""Sessions an acquire tries before giving up when each one it picks turns out to be dead."""

SPARE_SESSIONS = 2
"""Sessions holding nothing that are kept open for the next acquire; more (left by a burst of waiters) close."""

MIN_ACQUIRE_BOUND = 1.0
"""Seconds an acquire gives an unanswering server at least, however short its timeout (``try_acquire`` too):
below that a healthy server under load would be taken for a dead one (docs/semantics.md)."""

UNBOUNDED = math.inf
"""A statement's limit when it may wait for ever (a wait with no deadline, which the caller asked for)."""


@dataclass(eq=False)
class _Session:
    conn: AsyncConnection[Any]
    pid: int
    keys: set[int] = field(default_factory=set)
    """Keys this session holds or is trying for: never handed to a second acquisition of the same name."""
    waiting: bool = False
    """Blocked in the server's lock queue: no other statement (heartbeat, try) may wait behind it."""
    queries: int = 0
    """Administrative queries (holder, force_release, ping) running on it: it is not closed under them."""
    busy: int = 0
    """Statements in flight: the socket is readable with their replies, which is not news."""
    checking: bool = False
    watch: Watch | None = None
    """The session's socket watched between statements (see :meth:`AsyncPostgresDriver._on_readable`)."""
    dead: bool = False
    deadlines: dict[str, float] = field(default_factory=dict)
    """Token -> the instant (driver clock) its lease on this session was last granted or renewed until: lockkit
    never ends the session itself before the latest of its leases' (a session cut for want of an answer keeps
    its socket open until then)."""

    @property
    def idle(self) -> bool:
        return not (self.keys or self.waiting or self.queries or self.busy or self.checking or self.dead)


@dataclass(eq=False)
class _Held:
    name: str
    key: int
    fence: int
    session: _Session


class _Retry(Exception):
    """The session picked turned out dead before the lock was taken: pick another."""


class _NoAnswer(psycopg.OperationalError):
    """A statement outlived its bound: its session was cut, and counts as broken (so the handlers of a broken
    connection, which look at ``conn.broken``, bury it)."""


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


class AsyncPostgresDriver:
    guarantees: ClassVar[Guarantees] = GUARANTEES

    def __init__(self, params: dict[str, Any], options: PostgresOptions, ctx: DriverContext, shown: str) -> None:
        self._params = params
        self._options = options
        self._ns = options.namespace
        self._clock = ctx.clock
        self._events = ctx.events
        self._shown = shown
        self._sql = Statements(options.table)
        self._state = StateLock()
        self._background = Background()
        self._sessions: list[_Session] = []
        self._opening = 0
        self._leases: dict[str, _Held] = {}
        self._table_ready = False
        self._closed = False

    @classmethod
    def from_url(cls, url: BackendURL, ctx: DriverContext) -> AsyncPostgresDriver:
        params, options = connect_params(url)
        return cls(params, options, ctx, str(url))

    def __repr__(self) -> str:
        return f"AsyncPostgresDriver({self._shown!r})"

    # -- sessions ------------------------------------------------------------------------------

    def _redacted(self, text: str) -> str:
        password = self._params.get("password")
        return text.replace(password, "***") if password else text

    def _connect_error(self, exc: psycopg.Error) -> LockError:
        text = self._redacted(_first_line(exc))
        lowered = str(exc).lower()
        if "authentication failed" in lowered or "pg_hba.conf" in lowered or "does not exist" in lowered:
            return ConfigError(
                f"PostgreSQL refused the login for {self._shown}: {text}; check the user, password and database in "
                "the URL, and that the server's pg_hba.conf admits this client"
            )
        if "unsupported startup parameter" in lowered:
            return ConfigError(
                f"{self._shown} refused the session settings lockkit sends at connect ({text}): this looks like "
                "PgBouncer. Session advisory locks need a direct connection to PostgreSQL, never a transaction "
                "or statement pool: point the URL at the server itself"
            )
        return BackendUnavailable(
            f"cannot connect to PostgreSQL at {self._shown}: {text}. Is the server running and the URL right?"
        )

    async def _open(self, limit: float | None = None) -> _Session:
        """A new session, its connect and checks bounded by ``limit`` s (``None``: the timeout option); libpq
        counts a connect_timeout in whole seconds, at least 2."""
        bound = self._options.timeout if limit is None else limit
        started = self._clock()
        try:
            conn = await AsyncConnection.connect(**{**self._params, "connect_timeout": max(2, math.ceil(bound))})
        except psycopg.Error as exc:
            raise self._connect_error(exc) from None
        s = _Session(conn, 0)
        s.watch = watch = self._background.watch(conn, lambda: self._on_readable(s))
        s.busy += 1  # the checks' replies are not news
        ticket = watch.before(bound - (self._clock() - started))
        try:
            cur = await conn.execute(self._sql.session_info)
            row = await cur.fetchone()
            assert row is not None
            pid, in_recovery, default_ro, ro = row
            if pid != conn.info.backend_pid:
                raise ConfigError(
                    f"{self._shown}: the server's backend pid ({pid}) is not the one this connection was given at "
                    f"connect ({conn.info.backend_pid}): a connection pooler (PgBouncer?) stands between. Session "
                    "advisory locks need a direct connection to PostgreSQL: point the URL at the server itself"
                )
            if in_recovery:
                raise ConfigError(
                    f"{self._shown} is a hot standby (pg_is_in_recovery() is true): a lock taken there is not seen "
                    "by the primary's clients. Point the URL at the primary"
                )
            if default_ro == "on" or ro == "on":
                raise ConfigError(
                    f"{self._shown} is read-only for this role (default_transaction_read_only is on): lockkit "
                    "writes the fencing counter. Point the URL at the primary, or turn the setting off"
                )
            if not self._table_ready:
                await self._ensure_table(conn)
        except psycopg.Error as exc:
            watch.close()
            await conn.close()
            if watch.expired:
                raise self._unanswered("open a session", bound) from None
            raise self._translate(exc, "open a session") from None
        except BaseException:
            watch.close()
            await conn.close()
            raise
        finally:
            watch.after(ticket)
            s.busy -= 1
        s.pid = pid
        return s

    def _unanswered(self, what: str, limit: float | None) -> BackendUnavailable:
        within = "in time" if limit is None else f"within {limit:.3g} s"
        return BackendUnavailable(
            f"PostgreSQL at {self._shown} did not answer {within} to {what}: lockkit gave up that session (it "
            "ends, with any lock the server grants it, once no lease on it can still be trusted). Check that the "
            "server is running and not stalled (paused, overloaded, out of disk) and that the network path to it "
            "is up, then retry"
        )

    async def _exec(self, s: _Session, sql: str, params: Any = None, limit: float | None = None) -> Any:
        """Run one statement on ``s`` under :meth:`_bounded`; its cursor."""
        return await self._bounded(s, lambda: s.conn.execute(sql, params), limit)

    async def _bounded(self, s: _Session, run: Callable[[], Any], limit: float | None = None) -> Any:
        """Await ``run()`` (one round trip on ``s``: its reply is not taken for the server ending the session)
        and return its result. Unanswered after ``limit`` s (``None``: the timeout option; :data:`UNBOUNDED`: no
        bound), the session is cut (never used again) and :class:`_NoAnswer` raised; a reply that came in the
        same instant is not trusted either. The cost on the hot path is a timer (asyncio) or a list append read
        by the watcher thread (blocking). ``run`` is typed ``Callable[[], Any]``, not ``Awaitable``, because the
        blocking face is generated from this text and there ``run()`` returns the cursor itself."""
        bound = self._options.timeout if limit is None else limit
        with self._state:
            s.busy += 1
        watch = s.watch
        ticket = None if watch is None else watch.before(None if bound == UNBOUNDED else bound)
        try:
            try:
                cur = await run()
            finally:
                with self._state:
                    s.busy -= 1
                if watch is not None:
                    watch.after(ticket)
        except psycopg.Error:
            if watch is None or not watch.expired:
                raise
        else:
            if watch is None or not watch.expired:
                return cur
        await self._cut_off(s, bound)

    async def _cut_off(self, s: _Session, bound: float) -> NoReturn:
        """The statement on ``s`` outlived ``bound`` and its socket was shut for reading: raise. If the reply beat
        the cut, libpq is made to read the end of the stream too, so that the connection counts as broken
        (libpq then drops its descriptor without a word to the server: the session lives on, with its locks,
        until the watch's duplicate closes, see :meth:`_bury`)."""
        if not s.conn.broken:
            with contextlib.suppress(Exception):  # the expected outcome: "server closed the connection"
                s.conn.pgconn.consume_input()
        raise _NoAnswer(f"PostgreSQL did not answer within {bound:.3g} s, so lockkit gave up the session") from None

    def _on_readable(self, s: _Session) -> None:
        """The socket of ``s`` has something to read with no statement of ours in flight: the server is almost
        certainly ending the session (a restart, ``pg_terminate_backend``), which it says before it closes. A
        heartbeat finds out at once, so that the session's leases are reported lost now, not at the next
        renewal: by then a restarted server may have granted the locks to someone else."""
        with self._state:
            if s.dead or s.checking or s.busy or s.waiting:
                return  # a reply to our own statement (or the wait's grant)
            if s.watch is None or not s.watch.pending():
                return  # a reply that its statement has read meanwhile
            s.checking = True
        if s.watch is not None:
            s.watch.pause()
        self._background.clean_up(self._check, s)

    async def _check(self, s: _Session) -> None:
        try:
            cur = await self._exec(s, self._sql.heartbeat)
            row = await cur.fetchone()
            if row is None or row[0] != s.pid:
                await self._bury(s, "the PostgreSQL session answering is not the one that holds the locks")
        except psycopg.Error as exc:
            if s.conn.broken or s.conn.closed:
                await self._bury(s, f"the PostgreSQL session ended: {self._redacted(_first_line(exc))}")
        finally:
            with self._state:
                s.checking = False
            if not s.dead and s.watch is not None:
                s.watch.resume()

    async def _ensure_table(self, conn: AsyncConnection[Any]) -> None:
        cur = await conn.execute(self._sql.exists, (self._options.table,))
        row = await cur.fetchone()
        if row is None or not row[0]:
            try:
                await conn.execute(self._sql.create)
            except pg_errors.UniqueViolation:
                pass  # another client created it at the same moment
            except pg_errors.InsufficientPrivilege:
                raise ConfigError(
                    f"{self._shown}: the lock table {self._options.table} does not exist and this role may not "
                    f"create it: create it once as its owner, or grant CREATE on the schema ({ACL_HINT})"
                ) from None
        self._table_ready = True

    def _translate(self, exc: psycopg.Error, what: str) -> LockError:
        text = self._redacted(_first_line(exc))
        if isinstance(exc, pg_errors.InsufficientPrivilege):
            return ConfigError(f"{self._shown}: permission denied to {what} ({text}): {ACL_HINT}")
        if isinstance(exc, pg_errors.ReadOnlySqlTransaction):
            return ConfigError(f"{self._shown} is read-only ({text}): point the URL at the primary")
        if isinstance(exc, psycopg.OperationalError):
            return BackendUnavailable(
                f"PostgreSQL at {self._shown} failed to {what}: {text}; retry, and if it persists check "
                "that the server is up and reachable"
            )
        return BackendUnavailable(
            f"PostgreSQL at {self._shown} failed to {what}: {text}; if it persists, check the server's log"
        )

    def _claim(self, key: int | None, waiting: bool) -> _Session | None:
        """A live session that may run a statement for ``key`` now (under the state lock), claimed for it."""
        for s in self._sessions:
            if s.dead or s.waiting or (waiting and (s.keys or s.queries)) or (key is not None and key in s.keys):
                continue
            self._mark(s, key, waiting)
            return s
        return None

    @staticmethod
    def _mark(s: _Session, key: int | None, waiting: bool) -> None:
        if key is None:
            s.queries += 1  # an administrative query: released by _query
        else:
            s.keys.add(key)
        s.waiting = waiting

    async def _session_for(self, key: int | None, waiting: bool = False, limit: float | None = None) -> _Session:
        """A session claimed for ``key`` (``None``: any session, for a query), opened (within ``limit`` s) if none
        is free."""
        self._check_open()
        with self._state:
            s = self._claim(key, waiting)
            if s is None:
                if len(self._sessions) + self._opening >= self._options.max_sessions:
                    raise BackendUnavailable(
                        f"all {self._options.max_sessions} PostgreSQL sessions of this driver are busy (each blocked "
                        "waiter needs one): raise the max_sessions option"
                    )
                self._opening += 1
        if s is not None:
            return s
        try:
            s = await self._open(limit)
        finally:
            with self._state:
                self._opening -= 1
        with self._state:
            self._mark(s, key, waiting)
            self._sessions.append(s)
        if self._closed:
            await self._bury(s, "the driver was closed")
            self._check_open()
        return s

    def _unclaim(self, s: _Session, key: int) -> None:
        with self._state:
            s.keys.discard(key)
            s.waiting = False

    async def _trim(self, s: _Session) -> None:
        """Close ``s`` if it holds nothing and enough other sessions holding nothing stay open."""
        with self._state:
            spare = sum(1 for other in self._sessions if other.idle)
            if not s.idle or spare <= SPARE_SESSIONS:
                return
            s.dead = True
            self._sessions.remove(s)
        if s.watch is not None:
            s.watch.close()
        with contextlib.suppress(Exception):  # the server drops the session either way
            await s.conn.close()

    async def _bury(self, s: _Session, reason: str) -> None:
        """Give up a session: close it (the server then drops its locks) and report its leases lost."""
        with self._state:
            s.dead = True
            if s in self._sessions:
                self._sessions.remove(s)
            lost = [token for token, held in self._leases.items() if held.session is s]
            for token in lost:
                del self._leases[token]
        for token in lost:
            self._events.lost(token, reason)
        if s.watch is not None:
            # A session we cut (no answer in time) ends only when its socket closes: not before its leases'
            # deadlines, so a server that answers again meanwhile cannot grant their locks to another client
            # while a holder may still be trusting them.
            # (All its leases' deadlines, not only those reported here: two burials may race, and the first
            # reports them all.)
            until = max(s.deadlines.values(), default=0.0)
            s.watch.close(max(0.0, until - self._clock()) if s.watch.expired else 0.0)
        with contextlib.suppress(Exception):  # closing a broken connection has nothing left to report
            await s.conn.close()

    def _check_open(self) -> None:
        if self._closed:
            raise LockError("the PostgreSQL driver is closed; open a new locker with lockkit.connect()")

    # -- acquire -------------------------------------------------------------------------------

    async def acquire(
        self, name: str, token: str, ttl: float, deadline: float | None, cancel: Cancel | None = None
    ) -> Grant | None:
        key = advisory_key(self._ns, name)
        params = {"ns": self._ns, "name": name, "key": key, "hint": token_hint(token)}
        # The acquire's own budget: the connect and the try share it, so an unanswering server is reported by
        # about the deadline (at least MIN_ACQUIRE_BOUND from now), not by a timeout per step.
        until = None if deadline is None else max(deadline, self._clock() + MIN_ACQUIRE_BOUND)
        for _ in range(GRANT_TRIES):
            s = await self._session_for(key, limit=self._left(until))
            sent_at = self._clock()
            try:
                row = await self._grant(s, self._sql.try_grant, params, key, None, self._left(until))
            except _Retry:
                continue
            if row is not None:
                return self._hold(token, name, key, row[0], s, ttl, sent_at)
            break
        else:
            raise BackendUnavailable(
                f"PostgreSQL at {self._shown}: every session tried was dead; retry once the server is "
                "up (did it restart?)"
            )
        while True:
            now = self._clock()
            if (deadline is not None and now >= deadline) or (cancel is not None and cancel.cancelled):
                return None
            # lock_timeout is the deadline, counted by the server from the moment it queues us; 0 waits forever.
            limit = "0" if deadline is None else f"{max(1, int((deadline - now) * 1000))}ms"
            s = await self._session_for(key, waiting=True, limit=self._left(until))
            unhook = self._background.on_cancel(cancel, s.conn)
            sent_at = self._clock()
            # The server ends the wait at the deadline itself (lock_timeout); the statement is cut only if it
            # is still unanswered a whole timeout later (its fence bump may wait for the name's row, which
            # other grants hold for a moment, and lock_timeout does not cover that wait).
            wait_for = UNBOUNDED if deadline is None else max(0.0, deadline - self._clock()) + self._options.timeout
            try:
                row = await self._grant(s, self._sql.wait_grant, params, key, limit, wait_for)
            except _Retry:
                continue
            finally:
                unhook()
            if row is None:
                await self._trim(s)
                return None
            with self._state:
                s.waiting = False
            return self._hold(token, name, key, row[0], s, ttl, sent_at)

    def _left(self, until: float | None, what: str = "take a lock") -> float:
        """Seconds a step of an acquire may take: the timeout option, or less if the acquire's budget (``until``)
        ends sooner; a budget spent (by sessions found dead) is a BackendUnavailable."""
        if until is None:
            return self._options.timeout
        left = until - self._clock()
        if left <= 0:
            raise self._unanswered(what, None)
        return min(self._options.timeout, left)

    def _hold(self, token: str, name: str, key: int, fence: int, s: _Session, ttl: float, sent_at: float) -> Grant:
        with self._state:
            self._leases[token] = _Held(name, key, fence, s)
            s.deadlines[token] = sent_at + ttl
        return Grant(fence, ttl, sent_at)

    async def _grant(
        self, s: _Session, sql: str, params: dict[str, Any], key: int, lock_timeout: str | None, limit: float
    ) -> tuple[int, int] | None:
        """Run a grant statement on ``s`` (claimed for ``key``), bounded by ``limit`` s: its row if the lock was
        taken, else ``None``.

        Whatever fails after the lock call may have left the lock held by ``s`` (session locks survive the
        failed transaction), so every failure but a dead connection or a lock timeout unlocks it again; a
        statement cut for want of an answer is raised as BackendUnavailable, and its session (with whatever
        the server may yet grant it) is closed.
        """
        try:
            if lock_timeout is not None:
                await self._exec(s, self._sql.set_lock_timeout, (lock_timeout,), min(self._options.timeout, limit))
            cur = await self._exec(s, sql, params, limit)
            row = await cur.fetchone()
        except _NoAnswer:
            await self._bury(s, "PostgreSQL did not answer in time: lockkit gave up the session")
            raise self._unanswered("take a lock", limit) from None
        except pg_errors.LockNotAvailable:
            self._unclaim(s, key)  # lock_timeout: the server took us off its queue, nothing was granted
            return None
        except pg_errors.QueryCanceled:
            self._background.clean_up(self._undo, s, key)  # our cancel: the lock may have come just before it
            return None
        except pg_errors.UniqueViolation:
            await self._undo(s, key)
            raise ConfigError(
                f"lock name {params['name']!r} has the advisory key {key} of another name already in the table "
                f"{self._options.table} (a 64-bit hash collision): the two would share one lock. Use another "
                "namespace option or rename one of them"
            ) from None
        except psycopg.Error as exc:
            if s.conn.broken or s.conn.closed:
                await self._bury(s, f"the PostgreSQL session ended: {self._redacted(_first_line(exc))}")
                raise _Retry from None
            await self._undo(s, key)
            raise self._translate(exc, "take a lock") from None
        except BaseException:
            self._background.clean_up(self._undo, s, key)  # cancelled: the lock may have been granted already
            raise
        if row is None:
            self._unclaim(s, key)
            return None
        return row[0], row[1]

    async def _undo(self, s: _Session, key: int) -> None:
        """Unlock ``key`` on ``s`` if it holds it (a grant that failed or was abandoned), then free the claim."""
        hi, lo = lock_parts(key)
        try:
            await self._exec(s, self._sql.unlock_if_held, {"key": key, "hi": hi, "lo": lo})
        except psycopg.Error as exc:
            await self._bury(s, f"the PostgreSQL session failed while undoing a grant: {_first_line(exc)}")
        finally:
            self._unclaim(s, key)

    # -- renew ---------------------------------------------------------------------------------

    async def renew(self, name: str, token: str, ttl: float) -> Grant | None:
        return one_renewal(await self.renew_many([RenewRequest(name, token, ttl)]))

    async def renew_many(self, requests: Sequence[RenewRequest]) -> list[Grant | Exception | None]:
        """One heartbeat per session, whatever the number of its locks: a live session still holds them all."""
        batches: dict[_Session, list[int]] = {}
        with self._state:
            for i, request in enumerate(requests):
                held = self._leases.get(request.token)
                if held is not None and held.name == request.name and not held.session.dead:
                    batches.setdefault(held.session, []).append(i)
        return await self._beat(requests, batches, lambda s: (self._sql.heartbeat, None), "locks")

    async def _beat(
        self,
        requests: Sequence[RenewRequest],
        batches: dict[_Session, list[int]],
        statement: Callable[[_Session], tuple[str, Any]],
        what: str,
    ) -> list[Grant | Exception | None]:
        """One heartbeat ``statement(s)`` per session of ``batches`` (session -> indexes into ``requests``), for
        locks and permits alike. A request's result: a Grant counted from the heartbeat's send if its session
        answered as itself; the error if the statement failed on a live session; None (lost) if the session
        ended, answered as another backend, or was not in ``batches``."""
        results: list[Grant | Exception | None] = [None] * len(requests)
        for s, indexes in batches.items():
            sent_at = self._clock()
            try:
                sql, params = statement(s)
                cur = await self._exec(s, sql, params)
                row = await cur.fetchone()
            except psycopg.Error as exc:
                if s.conn.broken or s.conn.closed:
                    await self._bury(s, f"the PostgreSQL session ended: {self._redacted(_first_line(exc))}")
                    continue  # its leases stay None: lost
                error = self._translate(exc, "renew")
                for i in indexes:
                    results[i] = error
                continue
            if row is None or row[0] != s.pid:
                await self._bury(s, f"the PostgreSQL session answering is not the one that holds the {what}")
                continue
            with self._state:
                for i in indexes:
                    held = self._leases.get(requests[i].token)
                    results[i] = None if held is None else Grant(held.fence, requests[i].ttl, sent_at)
                    if held is not None:
                        s.deadlines[requests[i].token] = sent_at + requests[i].ttl
        return results

    # -- release -------------------------------------------------------------------------------

    async def release(self, name: str, token: str) -> bool:
        with self._state:
            held = self._leases.get(token)
            if held is None or held.name != name:
                return False
            s = held.session
        try:
            cur = await self._exec(s, self._sql.unlock, (held.key,))
            row = await cur.fetchone()
        except psycopg.Error as exc:
            ended = isinstance(exc, pg_errors.AdminShutdown) or "terminating connection" in str(exc)
            if s.conn.broken or s.conn.closed:
                await self._bury(s, f"the PostgreSQL session ended: {self._redacted(_first_line(exc))}")
                if ended:
                    return False  # the server ended the session: its locks went with it
                raise BackendUnavailable(
                    f"could not release: the connection to PostgreSQL at {self._shown} broke "
                    f"({self._redacted(_first_line(exc))}); the server drops the lock when it notices. "
                    "Treat the lock as no longer held: there is nothing to retry"
                ) from None
            raise self._translate(exc, "release a lock") from None
        with self._state:
            self._leases.pop(token, None)
            s.deadlines.pop(token, None)
            s.keys.discard(held.key)
        await self._trim(s)
        return bool(row is not None and row[0])

    # -- administration ------------------------------------------------------------------------

    async def _query(self, sql: str, params: dict[str, Any] | tuple[Any, ...]) -> list[tuple[Any, ...]]:
        s = await self._session_for(None)  # counted in s.queries: not trimmed under this query
        try:
            cur = await self._exec(s, sql, params)
            return list(await cur.fetchall())
        except psycopg.Error as exc:
            if s.conn.broken or s.conn.closed:
                await self._bury(s, f"the PostgreSQL session ended: {self._redacted(_first_line(exc))}")
            raise self._translate(exc, "read the lock table") from None
        finally:
            with self._state:
                s.queries -= 1

    def _where(self, name: str) -> dict[str, Any]:
        key = advisory_key(self._ns, name)
        hi, lo = lock_parts(key)
        return {"ns": self._ns, "name": name, "key": key, "hi": hi, "lo": lo}

    async def holder(self, name: str) -> HolderInfo:
        ((granted, waiting, fence, hint),) = await self._query(self._sql.holder, self._where(name))
        if not granted:
            return HolderInfo(held=False, waiters=int(waiting))
        return HolderInfo(held=True, token_hint=hint, fencing_token=fence, waiters=int(waiting))

    async def force_release(self, name: str) -> bool:
        """Unlock ``name`` whoever holds it: our own session unlocks it; another's is terminated, which frees
        every lock that session held (its owners find them lost)."""
        where = self._where(name)
        rows = await self._query(self._sql.holder_pid, where)
        if not rows:
            return False
        pid = rows[0][0]
        with self._state:
            mine = [(t, h) for t, h in self._leases.items() if h.session.pid == pid and h.key == where["key"]]
            for token, _ in mine:
                del self._leases[token]
        for token, held in mine:
            self._events.lost(token, "force-released by an administrator")
            try:
                await self._exec(held.session, self._sql.unlock, (held.key,))
            except psycopg.Error as exc:
                await self._bury(held.session, f"the PostgreSQL session ended: {_first_line(exc)}")
            self._unclaim(held.session, held.key)
            return True
        ((done,),) = await self._query(self._sql.terminate, (pid,))
        return bool(done)

    async def ping(self) -> None:
        await self._query(self._sql.heartbeat, ())

    def permits(self, events: LeaseEvents | None = None) -> Any:
        """Semaphores and reader-writer locks on sessions of their own (``.permits``), whose losses are reported
        to ``events`` (the permit handles')."""
        from .permits import AsyncPostgresPermits

        ctx = DriverContext(self._clock, events or self._events)
        return AsyncPostgresPermits(self._params, self._options, ctx, self._shown)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._background.drain()
        with self._state:
            sessions, self._sessions = self._sessions, []
            self._leases.clear()
        for s in sessions:
            s.dead = True
            if s.watch is not None:
                s.watch.close()
            with contextlib.suppress(Exception):  # the server drops the session's locks either way
                await s.conn.close()
        self._background.stop()
