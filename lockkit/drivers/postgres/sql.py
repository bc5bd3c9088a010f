"""The SQL the PostgreSQL driver sends, in one place (the table name is a checked identifier, see config).

Every grant is one statement: the advisory lock call in a materialized CTE, then the upsert that bumps the
name's fencing counter only if the lock was taken, so a grant costs one round trip. A session-level advisory
lock outlives the statement's transaction, even a failed one: whoever runs these statements unlocks the key
if one fails after the lock call (see the driver's ``_undo``).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Statements"]


@dataclass(frozen=True)
class Statements:
    table: str

    @property
    def create(self) -> str:
        return (
            f"CREATE TABLE IF NOT EXISTS {self.table} ("
            " namespace text NOT NULL, name text NOT NULL, key bigint NOT NULL UNIQUE,"
            " fence bigint NOT NULL, holder text, PRIMARY KEY (namespace, name))"
        )

    @property
    def exists(self) -> str:
        return "SELECT to_regclass(%s) IS NOT NULL"

    def _grant(self, lock_call: str) -> str:
        return (
            f"WITH got AS MATERIALIZED (SELECT {lock_call} AS ok) "
            f"INSERT INTO {self.table} AS t (namespace, name, key, fence, holder) "
            "SELECT %(ns)s, %(name)s, %(key)s, 1, %(hint)s FROM got WHERE ok "
            "ON CONFLICT (namespace, name) DO UPDATE SET fence = t.fence + 1, holder = EXCLUDED.holder "
            "RETURNING fence, key"
        )

    @property
    def try_grant(self) -> str:
        """Take the lock if free, bump the fence: one row ``(fence, key)``, or none if it is held."""
        return self._grant("pg_try_advisory_lock(%(key)s)")

    @property
    def wait_grant(self) -> str:
        """Wait in the server's lock queue (bounded by ``lock_timeout``), then bump the fence."""
        return self._grant("(SELECT true FROM (SELECT pg_advisory_lock(%(key)s)) AS waited)")

    @property
    def session_info(self) -> str:
        return (
            "SELECT pg_backend_pid(), pg_is_in_recovery(), current_setting('default_transaction_read_only'),"
            " current_setting('transaction_read_only')"
        )

    heartbeat = "SELECT pg_backend_pid()"
    unlock = "SELECT pg_advisory_unlock(%s)"
    unlock_all = "SELECT pg_advisory_unlock_all()"
    set_lock_timeout = "SELECT set_config('lock_timeout', %s, false)"

    _where = (
        "locktype = 'advisory' AND objsubid = 1 AND classid = %(hi)s::oid AND objid = %(lo)s::oid "
        "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    )

    @property
    def holder(self) -> str:
        return (
            f"SELECT (SELECT count(*) FROM pg_locks WHERE {self._where} AND granted),"
            f" (SELECT count(*) FROM pg_locks WHERE {self._where} AND NOT granted), t.fence, t.holder"
            f" FROM (SELECT 1) AS one LEFT JOIN {self.table} AS t ON t.namespace = %(ns)s AND t.name = %(name)s"
        )

    @property
    def holder_pid(self) -> str:
        return f"SELECT pid FROM pg_locks WHERE {self._where} AND granted"

    @property
    def unlock_if_held(self) -> str:
        """Unlock the key only if this session holds it (a bare unlock of a lock not held logs a WARNING)."""
        return (
            f"SELECT pg_advisory_unlock(%(key)s) FROM pg_locks"
            f" WHERE {self._where} AND granted AND pid = pg_backend_pid()"
        )

    terminate = "SELECT pg_terminate_backend(%s, 5000)"
