"""What the PostgreSQL driver promises (both faces share this one object) and the messages of its refusals."""

from __future__ import annotations

from ...driver import Guarantees, Offer

__all__ = ["ACL_HINT", "GUARANTEES"]

GUARANTEES = Guarantees(
    scope="single-node",
    fifo=True,
    fencing="strict",
    survives_failover=False,
    lifetime="session",
    note=(
        "A lock is a session-level advisory lock on one PostgreSQL server, held by a session the driver owns; "
        "its ttl is the heartbeat deadline. A failover to a replica drops every advisory lock."
    ),
    semaphores=Offer("yes"),
)

ACL_HINT = (
    "the role needs CONNECT on the database, USAGE on the table's schema and SELECT, INSERT, UPDATE on the "
    "lock table, and on the permit table (lockkit_permits by default) for semaphores and reader-writer locks "
    "(CREATE on the schema too if a table does not exist yet); see docs/backends/postgres.md"
)
