"""A fencing-checked resource, as a storage layer should build one: SQLite, for ``lockkit verify``.

``write`` accepts a change only if its fencing token is higher than any seen so far, or equal to the
highest and from the same lease (the holder writing twice). Every attempt is logged with its monotonic
time, so a checker can prove afterwards that accepted writes never went backwards and that no two leases
had writes accepted under the same token.
"""

from __future__ import annotations

import itertools
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["FencedStore", "StoreReport"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS resource (id INTEGER PRIMARY KEY CHECK (id = 1), value INTEGER NOT NULL,
    max_token INTEGER NOT NULL, last_lease TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS attempts (at REAL NOT NULL, token INTEGER NOT NULL, lease TEXT NOT NULL,
    accepted INTEGER NOT NULL);
INSERT OR IGNORE INTO resource VALUES (1, 0, -1, '');
"""


@dataclass
class StoreReport:
    value: int
    accepted: int
    rejected: int
    backwards: int
    shared_tokens: int


class FencedStore:
    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._db = sqlite3.connect(self.path, timeout=60, isolation_level=None)
        self._db.executescript(_SCHEMA)

    def read(self, token: int | None = None, lease: str = "") -> int | None:
        """The value; with a token, a *fenced* read that also bars every older token from writing.

        Registering the reader's token at read time closes the read-modify-write gap: a paused holder that
        read before a newer holder did can no longer write what it computed. ``None``: this token is stale.
        """
        if token is None:
            return int(self._db.execute("SELECT value FROM resource WHERE id = 1").fetchone()[0])
        value: int | None = None

        def fenced(max_token: int, last_lease: str) -> bool:
            nonlocal value
            if self._current(token, lease, max_token, last_lease):
                value = int(self._db.execute("SELECT value FROM resource WHERE id = 1").fetchone()[0])
                self._db.execute("UPDATE resource SET max_token = ?, last_lease = ? WHERE id = 1", (token, lease))
                return True
            return False

        self._transaction(fenced, token, lease, log=False)
        return value

    def write(self, value: int, token: int, lease: str) -> bool:
        """Store ``value`` if ``token`` is current; ``False`` (a stale holder) otherwise."""

        def fenced(max_token: int, last_lease: str) -> bool:
            if self._current(token, lease, max_token, last_lease):
                self._db.execute(
                    "UPDATE resource SET value = ?, max_token = ?, last_lease = ? WHERE id = 1", (value, token, lease)
                )
                return True
            return False

        return self._transaction(fenced, token, lease, log=True)

    @staticmethod
    def _current(token: int, lease: str, max_token: int, last_lease: str) -> bool:
        return token > max_token or (token == max_token and lease == last_lease)

    def _transaction(self, body: Callable[[int, str], bool], token: int, lease: str, log: bool) -> bool:
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            max_token, last_lease = db.execute("SELECT max_token, last_lease FROM resource WHERE id = 1").fetchone()
            ok = body(int(max_token), str(last_lease))
            if log or not ok:
                db.execute("INSERT INTO attempts VALUES (?, ?, ?, ?)", (time.monotonic(), token, lease, int(ok)))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return ok

    def report(self) -> StoreReport:
        rows = self._db.execute("SELECT token, lease, accepted FROM attempts ORDER BY rowid").fetchall()
        accepted = [(t, lease) for t, lease, ok in rows if ok]  # writes only: rejected reads are logged too
        backwards = sum(1 for (a, _), (b, _) in itertools.pairwise(accepted) if b < a)
        owners: dict[int, set[str]] = {}
        for token, lease in accepted:
            owners.setdefault(token, set()).add(lease)
        return StoreReport(
            value=int(self._db.execute("SELECT value FROM resource WHERE id = 1").fetchone()[0]),
            accepted=len(accepted),
            rejected=len(rows) - len(accepted),
            backwards=backwards,
            shared_tokens=sum(1 for leases in owners.values() if len(leases) > 1),
        )

    def close(self) -> None:
        self._db.close()
