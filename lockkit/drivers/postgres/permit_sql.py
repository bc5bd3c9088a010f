"""The SQL of PostgreSQL semaphores and reader-writer locks (the permit table is a checked identifier).

Keys are the two-integer advisory keys of :func:`..keys.permit_key` (``objsubid = 2`` in ``pg_locks``). Per
name: ``presence`` (held *shared* by every holder and waiter of the name, for as long as it holds or waits),
``rw`` (a reader-writer lock: shared for readers, exclusive for writers) and ``slot:i`` (a semaphore's ``i``-th
permit, exclusive), plus ``meta`` (a transaction-level lock that serialises the joins of one name).

The row of a name carries the limit its holders use (0: a reader-writer lock) and its fencing counter. The
limit is only trusted while ``presence`` has holders: a row outlives its holders (a killed client's session
ends and takes its advisory locks, never the row), so the join resets the limit when nobody is present.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PermitStatements"]

_DB = "database = (SELECT oid FROM pg_database WHERE datname = current_database())"


def _match(table: str, a: str, b: str) -> str:
    """``pg_locks`` rows (of ``table``) on the two-integer key ``(a, b)`` (SQL expressions, signed ints)."""
    return (
        f"{table}.locktype = 'advisory' AND {table}.objsubid = 2 AND {table}.classid = ({a}::bigint & 4294967295)::oid"
        f" AND {table}.objid = ({b}::bigint & 4294967295)::oid AND {table}.{_DB}"
    )


_PRESENCE = _match("pg_locks", "%(p1)s", "%(p2)s")
_RW = _match("pg_locks", "%(r1)s", "%(r2)s")
_SLOTS = "unnest(%(s1)s::int[], %(s2)s::int[], %(idx)s::int[]) WITH ORDINALITY AS u(a, b, i, o)"


@dataclass(frozen=True)
class PermitStatements:
    table: str

    @property
    def create(self) -> str:
        return (
            f"CREATE TABLE IF NOT EXISTS {self.table} ("
            " namespace text NOT NULL, name text NOT NULL, lim integer NOT NULL, fence bigint NOT NULL,"
            " PRIMARY KEY (namespace, name))"
        )

    @staticmethod
    def _attempt(mode: str) -> tuple[str, str]:
        """The SQL of one try for a permit (the slot granted, or NULL) and of the slot to wait for."""
        if mode == "permit":
            attempt = f"(SELECT u.i FROM {_SLOTS} WHERE pg_try_advisory_lock(u.a, u.b) LIMIT 1)"
            wait_for = (
                f"(SELECT u.i FROM {_SLOTS} LEFT JOIN pg_locks AS l ON {_match('l', 'u.a', 'u.b')} AND NOT l.granted"
                " GROUP BY u.i, u.o ORDER BY count(l.pid), u.o LIMIT 1)"
            )
            return attempt, wait_for
        call = "pg_try_advisory_lock_shared" if mode == "read" else "pg_try_advisory_lock"
        return f"(CASE WHEN {call}(%(r1)s, %(r2)s) THEN 0 END)", "0"

    def fast(self, mode: str, take: bool) -> str:
        """The common case in one statement: take ``presence`` (when ``take``), *then* lock the name's row and
        read its limit; if it agrees, try the permit and bump the fence. If the row is missing or its limit
        disagrees, ``presence`` is given back (``ok`` false) and the caller runs :meth:`join`.

        Why this is enough without the ``meta`` lock: a join that resets the limit locks the row *before* it
        counts who is present. Either our ``presence`` came before that count (the reset is refused), or our row
        lock comes after the reset's, waits for its commit and reads the new limit (READ COMMITTED re-reads
        the latest version of a row it locks). Row lock before the try, so the grants of a name are serialised
        with their fence bumps. Same row shape as :meth:`join`.
        """
        attempt, wait_for = self._attempt(mode)
        present = "(SELECT true FROM (SELECT pg_advisory_lock_shared(%(p1)s, %(p2)s)) AS x)" if take else "true"
        give_back = "true" if take else "false"
        return (
            # lock_timeout back to 0 first (a waiting session keeps the slice of its last wait): the row lock
            # below waits for the other grants of the name, which a stale slice of 1 ms must not cut short.
            f"WITH pres AS MATERIALIZED (SELECT {present} AS j, set_config('lock_timeout', '0', false) AS t),"
            f" cur AS MATERIALIZED (SELECT t.lim FROM {self.table} AS t"
            " WHERE t.namespace = %(ns)s AND t.name = %(name)s FOR NO KEY UPDATE),"
            " ok AS MATERIALIZED (SELECT (SELECT lim FROM cur) AS lim, j FROM pres WHERE t IS NOT NULL),"
            " got AS MATERIALIZED (SELECT lim, coalesce(lim = %(limit)s, false) AS ok,"
            f" CASE WHEN lim = %(limit)s AND j THEN {attempt} END AS slot FROM ok),"
            f" fin AS MATERIALIZED (SELECT lim, ok, slot, CASE WHEN {give_back} AND slot IS NULL AND"
            " (NOT ok OR %(leave)s) THEN pg_advisory_unlock_shared(%(p1)s, %(p2)s) END AS gone FROM got),"
            f" bump AS (UPDATE {self.table} AS t SET fence = t.fence + 1 FROM fin"
            " WHERE t.namespace = %(ns)s AND t.name = %(name)s AND fin.slot IS NOT NULL RETURNING t.fence)"
            " SELECT fin.lim, fin.ok, fin.slot, (SELECT fence FROM bump),"
            f" CASE WHEN fin.ok AND fin.slot IS NULL AND NOT %(leave)s THEN {wait_for} END, fin.gone IS NULL,"
            " set_config('idle_session_timeout', CASE WHEN fin.slot IS NOT NULL OR (fin.ok AND NOT %(leave)s)"
            " THEN %(idle)s ELSE %(idle_now)s END, false)"
            " FROM fin"
        )

    def join(self, mode: str) -> str:
        """Join the name and try for a permit, in one round trip (several statements, one transaction): the
        path of a first use of a name, or of a limit that disagrees with the row's (:meth:`fast` failed).

        Under the name's ``meta`` transaction lock: make sure the row exists and lock it; take the requested
        limit if nobody is present; then, if the limit agrees, take ``presence`` (when ``join``), try the permit, give
        ``presence`` back if nothing was granted and the caller will not wait (``leave``), bump the fence if
        granted. Each statement after the first takes a new snapshot, so it sees every join serialised before
        it. One row: the limit in force, whether it agrees, the slot granted (or NULL), its fence, the slot to
        wait for (fewest waiters first), and whether the lock calls ran. Client-side parameters (several
        statements): only ints, bools, text and int arrays are passed.
        """
        attempt, wait_for = self._attempt(mode)
        row = "namespace = %(ns)s AND name = %(name)s"
        return (
            "SELECT set_config('lock_timeout', '0', false), pg_advisory_xact_lock(%(m1)s, %(m2)s);"
            f" INSERT INTO {self.table} (namespace, name, lim, fence) VALUES (%(ns)s, %(name)s, %(limit)s, 0)"
            " ON CONFLICT DO NOTHING;"
            # The row lock before the count of who is present (see fast()): in a statement of its own, as an
            # UPDATE could count (its uncorrelated subquery) before it waits for the row.
            f" SELECT 1 FROM {self.table} WHERE {row} FOR UPDATE;"
            f" UPDATE {self.table} SET lim = %(limit)s WHERE {row} AND lim <> %(limit)s"
            f" AND NOT EXISTS (SELECT 1 FROM pg_locks WHERE {_PRESENCE});"
            f" WITH ok AS MATERIALIZED (SELECT lim, lim = %(limit)s AS ok FROM {self.table} WHERE {row}),"
            " joined AS MATERIALIZED (SELECT lim, ok, CASE WHEN ok AND %(join)s THEN"
            " (SELECT true FROM (SELECT pg_advisory_lock_shared(%(p1)s, %(p2)s)) AS j) END AS j FROM ok),"
            f" got AS MATERIALIZED (SELECT lim, ok, CASE WHEN ok AND (j OR NOT %(join)s) THEN {attempt} END AS slot"
            " FROM joined),"
            " fin AS MATERIALIZED (SELECT lim, ok, slot, CASE WHEN ok AND slot IS NULL AND %(leave)s THEN"
            " pg_advisory_unlock_shared(%(p1)s, %(p2)s) END AS gone FROM got),"
            f" bump AS (UPDATE {self.table} AS t SET fence = t.fence + 1 FROM fin"
            " WHERE t.namespace = %(ns)s AND t.name = %(name)s AND fin.slot IS NOT NULL RETURNING t.fence)"
            " SELECT fin.lim, fin.ok, fin.slot, (SELECT fence FROM bump),"
            f" CASE WHEN fin.ok AND fin.slot IS NULL AND NOT %(leave)s THEN {wait_for} END, fin.gone IS NULL,"
            " set_config('idle_session_timeout', CASE WHEN fin.slot IS NOT NULL OR (fin.ok AND NOT %(leave)s)"
            " THEN %(idle)s ELSE %(idle_now)s END, false)"
            " FROM fin"
        )

    def wait(self, mode: str) -> str:
        """Wait in the server's queue of one key (bounded by ``lock_timeout``), then bump the fence: the
        grant and its token in one statement, as for locks. Once the key is granted, ``lock_timeout`` goes back
        to 0 before the row is locked: a slice that ran out while the row was busy with another grant would fail
        the statement with the key held, and a retry would take it a second time (advisory locks are
        re-entrant), leaving one count held for ever."""
        call = "pg_advisory_lock_shared" if mode == "read" else "pg_advisory_lock"
        return (
            f"WITH got AS MATERIALIZED (SELECT true AS ok FROM (SELECT {call}(%(a)s, %(b)s)) AS w),"
            " reset AS MATERIALIZED (SELECT set_config('lock_timeout', '0', false) AS t FROM got)"
            f" UPDATE {self.table} AS t SET fence = t.fence + 1 FROM reset"
            " WHERE t.namespace = %(ns)s AND t.name = %(name)s RETURNING t.fence"
        )

    def release(self, mode: str) -> str:
        """Give the permit back, then ``presence`` (in this order: a holder is always present)."""
        call = "pg_advisory_unlock_shared" if mode == "read" else "pg_advisory_unlock"
        return (
            f"SELECT {call}(%(a)s, %(b)s), pg_advisory_unlock_shared(%(p1)s, %(p2)s),"
            " set_config('idle_session_timeout', %(idle)s, false)"
        )

    undo = (
        "SELECT (SELECT count(CASE WHEN l.mode = 'ShareLock' THEN pg_advisory_unlock_shared(u.a, u.b)"
        " ELSE pg_advisory_unlock(u.a, u.b) END)"
        " FROM unnest(%(ka)s::int[], %(kb)s::int[]) AS u(a, b) JOIN pg_locks AS l"
        f" ON {_match('l', 'u.a', 'u.b')} AND l.granted AND l.pid = pg_backend_pid()),"
        " set_config('idle_session_timeout', %(idle)s, false)"
    )
    """Unlock every key of the name this session holds (an acquire that failed, timed out or was cancelled).
    A session holds one permit of a name at most, so nothing of another permit is undone."""

    heartbeat = "SELECT pg_backend_pid(), set_config('idle_session_timeout', %s, false)"

    @property
    def info(self) -> str:
        return (
            f"SELECT t.lim, t.fence, (SELECT count(*) FROM pg_locks WHERE {_PRESENCE} AND granted),"
            f" (SELECT count(*) FROM pg_locks WHERE {_RW} AND granted),"
            f" (SELECT count(*) FROM pg_locks WHERE {_RW} AND granted AND mode = 'ExclusiveLock'),"
            f" (SELECT count(*) FROM pg_locks WHERE {_RW} AND NOT granted AND mode = 'ExclusiveLock')"
            f" FROM (SELECT 1) AS one LEFT JOIN {self.table} AS t ON t.namespace = %(ns)s AND t.name = %(name)s"
        )

    slot_holders = (
        f"SELECT count(*) FROM {_SLOTS} JOIN pg_locks AS l ON {_match('l', 'u.a', 'u.b')} AND l.granted"
    )

    present_pids = (
        f"SELECT p.pid FROM pg_locks AS p WHERE {_match('p', '%(p1)s', '%(p2)s')} AND p.granted"
        " AND p.pid <> pg_backend_pid() GROUP BY p.pid"
        " ORDER BY bool_or(EXISTS (SELECT 1 FROM pg_locks AS w WHERE w.pid = p.pid AND NOT w.granted)) DESC"
    )
    """The sessions present on a name, the waiting ones (blocked on a lock) first: a force release terminates
    them in this order, each to its end, so that no waiter is granted by a holder's end and then terminated (a
    lease that was gone at once: tests/test_permit_force_release.py)."""

    terminate = "SELECT pg_terminate_backend(%s, 5000)"
