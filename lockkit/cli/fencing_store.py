"""A fencing-checked resource, as a storage layer should build one: SQLite, for ``lockkit verify``.

The resource is one counter. A *fenced* read or write with a fencing token is accepted only if the token
is higher than any seen so far, or equal to the highest and from the same lease (the holder reading or
writing again); an *unfenced* one (no token: a backend that gives none) is always accepted.

Every attempt, accepted or not, is kept in a history with the store's monotonic time, the lease token,
the fencing token, the outcome and the values read and written. The history is the evidence ``lockkit
verify`` judges by: it recomputes fencing order, shared tokens and lost updates from it rather than
trusting the rule above (the rule prevents exactly what those figures count, so trusting it would make
them zero by construction).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = ["Attempt", "FencedStore", "StoreReport", "summarise"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS resource (id INTEGER PRIMARY KEY CHECK (id = 1), value INTEGER NOT NULL,
    max_token INTEGER NOT NULL, last_lease TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS history (seq INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL,
    kind TEXT NOT NULL, lease TEXT NOT NULL, token INTEGER, accepted INTEGER NOT NULL,
    value_read INTEGER, value_written INTEGER);
INSERT OR IGNORE INTO resource VALUES (1, 0, -1, '');
"""


@dataclass(frozen=True)
class Attempt:
    """One read or write as the store saw it, in commit order."""

    at: float
    """``time.monotonic()`` inside the store's transaction (one host: comparable with the holders' clocks)."""
    kind: Literal["read", "write"]
    lease: str
    """The holder's lease token (kept only in the run's private temporary directory)."""
    token: int | None
    """The fencing token; ``None`` for an unfenced attempt."""
    accepted: bool
    value_read: int | None
    """For a read, the value the store held; for a write, the value the holder says it read first."""
    value_written: int | None


@dataclass
class StoreReport:
    """What the history shows, recomputed from it (never from the rule that was meant to ensure it)."""

    value: int
    """The counter as it ended."""
    accepted: int
    """Writes the store acknowledged (returned ``True`` for)."""
    rejected: int
    """Attempts, reads or writes, the store refused as stale."""
    backwards: int
    """Accepted fenced writes whose token is lower than that of an earlier accepted write."""
    shared_tokens: int
    """Leases that presented a fencing token another lease had already presented, accepted or not."""


def summarise(history: list[Attempt], value: int) -> StoreReport:
    accepted = [a for a in history if a.kind == "write" and a.accepted]
    backwards, highest = 0, None
    for attempt in accepted:
        if attempt.token is None:
            continue
        if highest is not None and attempt.token < highest:
            backwards += 1
        highest = attempt.token if highest is None else max(highest, attempt.token)
    owners: dict[int, set[str]] = {}
    for attempt in history:
        if attempt.token is not None:
            owners.setdefault(attempt.token, set()).add(attempt.lease)
    return StoreReport(
        value=value,
        accepted=len(accepted),
        rejected=sum(1 for a in history if not a.accepted),
        backwards=backwards,
        shared_tokens=sum(len(leases) - 1 for leases in owners.values()),
    )


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

        def body(value: int, max_token: int, last_lease: str) -> bool:
            if token is None:
                return True
            if self._current(token, lease, max_token, last_lease):
                self._db.execute("UPDATE resource SET max_token = ?, last_lease = ? WHERE id = 1", (token, lease))
                return True
            return False

        value: int | None = None

        def record(current: int) -> tuple[int | None, int | None]:
            nonlocal value
            value = current
            return current, None

        ok = self._transaction("read", body, record, token, lease)
        return value if ok else None

    def write(self, value: int, token: int | None, lease: str, read: int | None = None) -> bool:
        """Store ``value`` if ``token`` is current (always, if ``None``); ``False`` (a stale holder) otherwise.

        ``read`` is the value the holder read before computing ``value``: kept in the history, for diagnosis.
        """

        def body(current: int, max_token: int, last_lease: str) -> bool:
            if token is None:
                self._db.execute("UPDATE resource SET value = ? WHERE id = 1", (value,))
                return True
            if self._current(token, lease, max_token, last_lease):
                self._db.execute(
                    "UPDATE resource SET value = ?, max_token = ?, last_lease = ? WHERE id = 1", (value, token, lease)
                )
                return True
            return False

        return self._transaction("write", body, lambda _current: (read, value), token, lease)

    @staticmethod
    def _current(token: int, lease: str, max_token: int, last_lease: str) -> bool:
        # Equal to the highest token is current only for the lease that brought it: two leases with one
        # token mean the backend handed out a duplicate, and letting the second through would let both
        # read-modify-write the same value.
        return token > max_token or (token == max_token and lease == last_lease)

    def _transaction(
        self,
        kind: Literal["read", "write"],
        body: Callable[[int, int, str], bool],
        values: Callable[[int], tuple[int | None, int | None]],
        token: int | None,
        lease: str,
    ) -> bool:
        db = self._db
        db.execute("BEGIN IMMEDIATE")  # one writer at a time: the history's order is the commit order
        try:
            current, max_token, last_lease = db.execute(
                "SELECT value, max_token, last_lease FROM resource WHERE id = 1"
            ).fetchone()
            ok = body(int(current), int(max_token), str(last_lease))
            value_read, value_written = values(int(current))
            db.execute(
                "INSERT INTO history (at, kind, lease, token, accepted, value_read, value_written) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (time.monotonic(), kind, lease, token, int(ok), value_read, value_written),
            )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return ok

    def history(self) -> list[Attempt]:
        """Every attempt, in commit order."""
        rows = self._db.execute(
            "SELECT at, kind, lease, token, accepted, value_read, value_written FROM history ORDER BY seq"
        ).fetchall()
        return [
            Attempt(at, kind, lease, token, bool(ok), read, written)
            for at, kind, lease, token, ok, read, written in rows
        ]

    def value(self) -> int:
        """The counter, without recording an attempt."""
        return int(self._db.execute("SELECT value FROM resource WHERE id = 1").fetchone()[0])

    def report(self) -> StoreReport:
        return summarise(self.history(), self.value())

    def close(self) -> None:
        self._db.close()
