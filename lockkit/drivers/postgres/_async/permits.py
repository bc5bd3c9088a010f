"""``postgresql://`` semaphores and reader-writer locks: advisory locks of a key space of their own.

This file is the source of both faces: ``scripts/unasync.py`` generates ``../_sync/permits.py`` from it. The
layout is in :mod:`..permit_sql` and docs/semaphores.md ("postgresql://"); in short:

* A reader holds ``rw`` shared, a writer exclusive: PostgreSQL's lock manager queues a shared request behind
  a *waiting* exclusive one (even ``pg_try_advisory_lock_shared`` fails then), which is writer preference.
* A semaphore of limit ``N`` is ``N`` slot keys; a permit is one of them, taken with ``pg_try_advisory_lock``.
  A waiter queues in the server on the slot with the fewest waiters (a release of that slot hands it over at
  once) and looks at every slot again within :data:`SLOT_RECHECK` (a release of another slot).
* Every holder and waiter holds ``presence`` shared, so the name's row (its limit) is trusted exactly while
  somebody is present: the join resets it when nobody is, and refuses a limit that disagrees otherwise.
* ttl is enforced by the server for a stopped process: a permit session's ``idle_session_timeout`` is the
  longest ttl of its permits, and every renewal is a statement on it, so a holder paused for its ttl has its
  session ended by the server, which frees its permits. (One handle that alone stops renewing, on a session
  renewed for other names' permits, keeps its permit until released: the session is the lifetime.)
  The driver keeps permit sessions apart from lock sessions (this object has its own pool), so that setting
  never reaches a lock.
* A session holds at most one permit of a name (advisory locks are re-entrant per session: a second reader on
  one session would pass a waiting writer).
"""

from __future__ import annotations

import functools
import math
import random
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import psycopg
from psycopg import AsyncClientCursor
from psycopg import errors as pg_errors

from ....driver import Cancel, Grant, PermitInfo, PermitMode, RenewRequest
from ....errors import BackendUnavailable, ConfigError
from ...embedded.permits import limit_mismatch
from ..facts import ACL_HINT
from ..keys import permit_key
from ..permit_sql import PermitStatements
from .driver import GRANT_TRIES, MIN_ACQUIRE_BOUND, AsyncPostgresDriver, _first_line, _Held, _NoAnswer, _Retry, _Session

__all__ = ["AsyncPostgresPermits"]

SLOT_RECHECK = 0.5
"""Seconds a semaphore waiter stays queued on one slot before it tries every slot again (another slot may
have been freed meanwhile). A reader or writer, and a semaphore of limit 1, wait on their one key for their ttl
at a time instead."""


MAX_LIMIT = 1024
"""The largest semaphore on postgresql://: a permit is one of ``limit`` advisory keys, and a full semaphore is
tried key by key (one lock-manager call each) and named in every statement."""

KNOWN_NAMES = 4096
"""Names this driver has joined lately: their row exists, so the next join tries the one-statement path
first; any other name goes straight to the full join (which creates the row)."""

MIN_SERVER = 140000
"""PostgreSQL 14: the first with ``idle_session_timeout``, which is what makes a permit's ttl real."""


@functools.lru_cache(maxsize=256)
def _slot_keys(namespace: str, name: str, limit: int) -> tuple[tuple[int, int], ...]:
    return tuple(permit_key(namespace, name, f"slot:{i}") for i in range(limit))


@dataclass(frozen=True)
class _Keys:
    """The advisory keys of one name (see :mod:`..permit_sql`) and the parameters every statement takes."""

    params: dict[str, Any]
    claim: int
    """A session's claim on the name: at most one permit of a name per session."""
    slots: list[tuple[int, int]]

    @classmethod
    def of(cls, namespace: str, name: str, limit: int, extra: Sequence[tuple[int, int]] = ()) -> _Keys:
        p1, p2 = permit_key(namespace, name, "presence")
        r1, r2 = permit_key(namespace, name, "rw")
        m1, m2 = permit_key(namespace, name, "meta")
        slots = list(_slot_keys(namespace, name, limit))
        start = random.randrange(limit) if limit else 0  # spread the tries over the slots
        order = list(range(start, limit)) + list(range(start))
        params = {
            "ns": namespace,
            "name": name,
            "limit": limit,
            "p1": p1,
            "p2": p2,
            "r1": r1,
            "r2": r2,
            "m1": m1,
            "m2": m2,
            "s1": [slots[i][0] for i in order],
            "s2": [slots[i][1] for i in order],
            "idx": order,
        }
        return cls(params, (p1 << 32) | (p2 & 0xFFFF_FFFF), [*slots, *extra])

    def held_key(self, mode: str, slot: int) -> tuple[int, int]:
        return self.slots[slot] if mode == "permit" else (self.params["r1"], self.params["r2"])

    def undo_params(self, idle: str) -> dict[str, Any]:
        every = [(self.params["p1"], self.params["p2"]), (self.params["r1"], self.params["r2"]), *self.slots]
        return {"ka": [a for a, _ in every], "kb": [b for _, b in every], "idle": idle}


@dataclass(eq=False)
class _Permit(_Held):
    mode: str = "permit"
    ttl: float = 0.0
    pair: tuple[int, int] = (0, 0)
    """The key held: a slot, or ``rw``."""
    presence: tuple[int, int] = (0, 0)


def _ms(seconds: float) -> str:
    return str(max(1, math.ceil(seconds * 1000)))


class AsyncPostgresPermits(AsyncPostgresDriver):
    """The :class:`~lockkit.driver.AsyncPermitDriver` of a PostgreSQL driver: its own sessions, its own leases
    (reported lost to the permit handles' events), the lock driver's session machinery."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._psql = PermitStatements(self._options.permit_table)
        self._known: OrderedDict[str, None] = OrderedDict()
        self._pending: dict[_Session, list[float]] = {}
        """The ttls of joins in flight per session: a statement sent meanwhile on the session (a release, a
        heartbeat) must not set an idle timeout shorter than a permit about to be granted there."""

    async def _ensure_table(self, conn: Any) -> None:
        if conn.info.server_version < MIN_SERVER:
            raise ConfigError(
                f"{self._shown}: semaphores and reader-writer locks need PostgreSQL 14 or later (this server is "
                f"{conn.info.server_version}): a permit's ttl is the session's idle_session_timeout. Upgrade, or "
                "route these names to another backend"
            )
        cur = await conn.execute(self._sql.exists, (self._options.permit_table,))
        row = await cur.fetchone()
        if row is None or not row[0]:
            try:
                await conn.execute(self._psql.create)
            except pg_errors.UniqueViolation:
                pass  # another client created it at the same moment
            except pg_errors.InsufficientPrivilege:
                raise ConfigError(
                    f"{self._shown}: the permit table {self._options.permit_table} does not exist and this role may "
                    f"not create it: create it once as its owner, or grant CREATE on the schema ({ACL_HINT})"
                ) from None
        self._table_ready = True

    def _idle(self, s: _Session, ttl: float | None = None, without: str | None = None) -> str:
        """The ``idle_session_timeout`` of ``s``: the longest ttl of its permits (and ``ttl``); 0 (off) if none."""
        with self._state:
            ttls = [
                h.ttl for t, h in self._leases.items() if h.session is s and t != without and isinstance(h, _Permit)
            ]
            ttls += self._pending.get(s, [])
        if ttl is not None:
            ttls.append(ttl)
        return _ms(max(ttls)) if ttls else "0"

    async def _exec_many(self, s: _Session, sql: str, params: dict[str, Any], limit: float | None = None) -> Any:
        """Run several statements in one round trip (one implicit transaction), bounded as :meth:`_exec`'s
        statements are (:meth:`_bounded`); the cursor of the last."""

        async def run() -> Any:
            cur = AsyncClientCursor(s.conn)
            await cur.execute(sql, params)
            while cur.nextset():
                pass
            return cur

        return await self._bounded(s, run, limit)

    # -- acquire -------------------------------------------------------------------------------

    async def acquire_permit(
        self,
        name: str,
        token: str,
        ttl: float,
        deadline: float | None,
        limit: int,
        mode: PermitMode,
        cancel: Cancel | None = None,
    ) -> Grant | None:
        if mode == "permit" and limit > MAX_LIMIT:
            raise ConfigError(
                f"a semaphore on postgresql:// has at most {MAX_LIMIT} permits (one advisory key each), got "
                f"limit={limit}: use a smaller limit, or another backend"
            )
        keys = _Keys.of(self._ns, name, limit if mode == "permit" else 0)
        # The fast path's connect and join share the acquire's budget, as a lock's try does (P-9).
        until = None if deadline is None else max(deadline, self._clock() + MIN_ACQUIRE_BOUND)
        for _ in range(GRANT_TRIES):  # the fast path: any session not holding this name
            s = await self._session_for(keys.claim, limit=self._left(until, "take a permit"))
            sent_at = self._clock()
            try:
                row = await self._join(
                    s, keys, mode, ttl, join=True, leave=True, limit=self._left(until, "take a permit")
                )
            except _Retry:
                continue
            if row[1] is not None:
                return self._hold_permit(token, name, keys, mode, row, s, ttl, sent_at, joined=True)
            await self._trim(s)
            break
        else:
            raise BackendUnavailable(
                f"PostgreSQL at {self._shown}: every session tried was dead; retry once the server is up "
                "(did it restart?)"
            )
        for _ in range(GRANT_TRIES):
            if self._over(deadline, cancel):
                return None
            s = await self._session_for(keys.claim, waiting=True)  # holds nothing: it may block
            try:
                return await self._wait(s, token, name, keys, mode, ttl, deadline, cancel)
            except _Retry:
                continue  # the waiting session died (its presence went with it): join again on another
        raise BackendUnavailable(
            f"PostgreSQL at {self._shown}: every session tried was dead; retry once the server is up (did it restart?)"
        )

    def _over(self, deadline: float | None, cancel: Cancel | None) -> bool:
        return (deadline is not None and self._clock() >= deadline) or (cancel is not None and cancel.cancelled)

    async def _wait(
        self,
        s: _Session,
        token: str,
        name: str,
        keys: _Keys,
        mode: PermitMode,
        ttl: float,
        deadline: float | None,
        cancel: Cancel | None,
    ) -> Grant | None:
        """Join on the waiting session ``s`` (present from now on), then queue in the server until granted."""
        join = True
        while True:
            sent_at = self._clock()
            row = await self._join(s, keys, mode, ttl, join=join, leave=False)
            join = False
            if row[1] is not None:
                with self._state:
                    s.waiting = False
                return self._hold_permit(token, name, keys, mode, row, s, ttl, sent_at, joined=True)
            slot = row[0]
            now = self._clock()
            if self._over(deadline, cancel):
                await self._undo_and_trim(s, keys)
                return None
            # lock_timeout: a slice of the wait, counted by the server from the moment it queues us.
            piece = ttl if mode != "permit" or len(keys.slots) == 1 else SLOT_RECHECK
            if deadline is not None:
                piece = min(piece, deadline - now)
            a, b = keys.held_key(mode, slot)
            params = {**keys.params, "a": a, "b": b}
            unhook = self._background.on_cancel(cancel, s.conn)
            sent_at = self._clock()
            try:
                await self._exec(s, self._sql.set_lock_timeout, (f"{max(1, int(piece * 1000))}ms",))
                # The server ends the slice itself; the session is cut only if it is still unanswered a whole
                # timeout later (the fence bump after a grant may wait for a busy row: see test P-26).
                cur = await self._exec(s, self._psql.wait(mode), params, piece + self._options.timeout)
                got = await cur.fetchone()
            except pg_errors.LockNotAvailable:
                continue  # the slice ended: look at every slot again (still present: our place is kept)
            except pg_errors.QueryCanceled:
                self._background.clean_up(self._undo_and_trim, s, keys)  # the grant may have beaten the cancel
                return None
            except psycopg.Error as exc:
                await self._failed(s, keys, exc)
            except BaseException:
                self._background.clean_up(self._undo_and_trim, s, keys)  # cancelled: the grant may have come
                raise
            finally:
                unhook()
            assert got is not None
            with self._state:
                s.waiting = False
            return self._hold_permit(token, name, keys, mode, (slot, got[0]), s, ttl, sent_at)

    async def _join(
        self,
        s: _Session,
        keys: _Keys,
        mode: PermitMode,
        ttl: float,
        *,
        join: bool,
        leave: bool,
        limit: float | None = None,
    ) -> tuple[int, int | None]:
        """The join statement on ``s``: ``(slot, fence)`` if granted, else ``(the slot to queue on, None)``."""
        idle_now = self._idle(s)  # if nothing is granted: the timeout its other permits (and joins) need
        with self._state:
            self._pending.setdefault(s, []).append(ttl)
        params = {**keys.params, "join": join, "leave": leave, "idle": self._idle(s), "idle_now": idle_now}
        granted = False
        try:
            row = None
            if keys.params["name"] in self._known:
                cur = await self._exec(s, self._psql.fast(mode, join), params, limit)
                row = await cur.fetchone()
            if row is None or not row[1]:  # a name new to us, or another limit: the full join
                cur = await self._exec_many(s, self._psql.join(mode), params, limit)
                row = await cur.fetchone()
            granted = row is not None and bool(row[1]) and row[2] is not None
        except psycopg.Error as exc:
            await self._failed(s, keys, exc)
        except BaseException:
            self._background.clean_up(self._undo_and_trim, s, keys)  # cancelled: a grant may have come
            raise
        finally:
            if not granted:  # a grant's ttl stays pending until _hold_permit registers its lease, under one
                with self._state:  # hold of _state: another thread's _idle never misses it (sync face)
                    self._drop_pending(s, ttl)
        assert row is not None
        lim, ok, slot, fence, wait_slot = row[:5]
        if not ok:  # nothing was taken, except the presence of a waiter looking again (join=False): undo both
            await self._undo_and_trim(s, keys)
            raise limit_mismatch(keys.params["name"], int(lim), int(keys.params["limit"]))
        with self._state:
            self._known[keys.params["name"]] = None
            self._known.move_to_end(keys.params["name"])
            while len(self._known) > KNOWN_NAMES:
                self._known.popitem(last=False)
        if slot is not None:
            return int(slot), int(fence)
        if leave:
            self._unclaim(s, keys.claim)
        return (0 if wait_slot is None else int(wait_slot)), None

    async def _failed(self, s: _Session, keys: _Keys, exc: psycopg.Error) -> NoReturn:
        """A statement failed: a dead session is buried (``_Retry``: try another); anything else undoes what
        the statement may have taken (session locks outlive a failed transaction) and is raised."""
        if isinstance(exc, _NoAnswer):  # no retry on another session: the server is what does not answer
            await self._bury(s, "PostgreSQL did not answer in time: lockkit gave up the session")
            raise self._unanswered("take a permit", None) from None
        if s.conn.broken or s.conn.closed:
            await self._bury(s, f"the PostgreSQL session ended: {self._redacted(_first_line(exc))}")
            raise _Retry from None
        await self._undo_and_trim(s, keys)
        raise self._translate(exc, "take a permit") from None

    async def _undo_name(self, s: _Session, keys: _Keys) -> None:
        """Unlock every key of the name ``s`` holds, then free the claim."""
        try:
            await self._exec(s, self._psql.undo, keys.undo_params(self._idle(s)))
        except psycopg.Error as exc:
            await self._bury(
                s, f"the PostgreSQL session failed while undoing a grant: {self._redacted(_first_line(exc))}"
            )
        finally:
            self._unclaim(s, keys.claim)

    async def _undo_and_trim(self, s: _Session, keys: _Keys) -> None:
        await self._undo_name(s, keys)
        await self._trim(s)

    def _hold_permit(
        self,
        token: str,
        name: str,
        keys: _Keys,
        mode: PermitMode,
        row: tuple[int, int | None],
        s: _Session,
        ttl: float,
        sent_at: float,
        joined: bool = False,
    ) -> Grant:
        slot, fence = row
        assert fence is not None
        presence = (keys.params["p1"], keys.params["p2"])
        held = _Permit(name, keys.claim, fence, s, mode, ttl, keys.held_key(mode, slot), presence)
        with self._state:
            self._leases[token] = held
            s.deadlines[token] = sent_at + ttl
            if joined:
                self._drop_pending(s, ttl)
        return Grant(fence, ttl, sent_at)

    def _drop_pending(self, s: _Session, ttl: float) -> None:
        """Forget one join's ttl on ``s`` (the caller holds ``_state``)."""
        pending = self._pending.get(s, [])
        pending.remove(ttl)
        if not pending:
            self._pending.pop(s, None)

    # -- renew and release ---------------------------------------------------------------------

    async def renew_permits(self, requests: Sequence[RenewRequest]) -> list[Grant | Exception | None]:
        """One statement per session, whatever the number of its permits: the heartbeat, which also sets the
        session's idle timeout to its permits' longest ttl (the server ends it if no renewal comes in time)."""
        batches: dict[_Session, list[int]] = {}
        with self._state:
            for i, request in enumerate(requests):
                held = self._leases.get(request.token)
                if isinstance(held, _Permit) and held.name == request.name and not held.session.dead:
                    held.ttl = request.ttl  # the session's idle timeout follows (set by this heartbeat)
                    batches.setdefault(held.session, []).append(i)
        return await self._beat(requests, batches, lambda s: (self._psql.heartbeat, (self._idle(s),)), "permits")

    async def release_permit(self, name: str, token: str) -> bool:
        with self._state:
            held = self._leases.get(token)
            if not isinstance(held, _Permit) or held.name != name:
                return False
            s = held.session
        a, b = held.pair
        p1, p2 = held.presence
        params = {"a": a, "b": b, "p1": p1, "p2": p2, "idle": self._idle(s, without=token)}
        try:
            cur = await self._exec(s, self._psql.release(held.mode), params)
            row = await cur.fetchone()
        except psycopg.Error as exc:
            if s.conn.broken or s.conn.closed:
                await self._bury(s, f"the PostgreSQL session ended: {self._redacted(_first_line(exc))}")
                return False  # the session is gone, and its permits with it
            raise self._translate(exc, "release a permit") from None
        with self._state:
            self._leases.pop(token, None)
            s.deadlines.pop(token, None)
            s.keys.discard(held.key)
        await self._trim(s)
        return bool(row is not None and row[0])

    # -- administration ------------------------------------------------------------------------

    async def permit_holders(self, name: str) -> PermitInfo:
        keys = _Keys.of(self._ns, name, 0)
        ((lim, fence, present, rw_held, writer, writers),) = await self._query(self._psql.info, keys.params)
        if not present:
            return PermitInfo(None, 0, False, 0, int(fence) if fence else None, 0)
        holders = int(rw_held)
        if lim:
            slots = _Keys.of(self._ns, name, int(lim))
            ((holders,),) = await self._query(self._psql.slot_holders, slots.params)
        last = int(fence) if fence else None
        return PermitInfo(int(lim), int(holders), bool(writer), int(writers), last, int(present) - int(holders))

    async def force_release_permits(self, name: str) -> int:
        """Drop every holder and waiter of ``name``: the sessions present on it are terminated (which frees
        everything they held: their owners find it lost); our own querying session gives its permit back."""
        holders = (await self.permit_holders(name)).holders
        keys = _Keys.of(self._ns, name, 0)
        s = await self._session_for(None)
        try:
            try:
                cur = await self._exec(s, self._psql.present_pids, keys.params)
                pids = [int(pid) for (pid,) in await cur.fetchall()]
                for pid in pids:
                    await self._exec(s, self._psql.terminate, (pid,))
            except psycopg.Error as exc:
                if s.conn.broken or s.conn.closed:
                    await self._bury(s, f"the PostgreSQL session ended: {self._redacted(_first_line(exc))}")
                raise self._translate(exc, "force-release permits") from None
            with self._state:
                ours = [other for other in self._sessions if other.pid in pids]
                mine = [(t, h) for t, h in self._leases.items() if h.session is s and h.name == name]
                for token, _ in mine:
                    del self._leases[token]
            for other in ours:
                await self._bury(other, "force-released by an administrator")
            for token, held in mine:
                self._events.lost(token, "force-released by an administrator")
                if isinstance(held, _Permit):
                    await self._undo_name(s, _Keys.of(self._ns, name, 0, extra=[held.pair]))
        finally:
            with self._state:
                s.queries -= 1
        return holders
