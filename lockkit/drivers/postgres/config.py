"""``postgresql://`` / ``postgres://`` URL options of the PostgreSQL driver and the libpq parameters they give.

``postgresql://user:password@host:port/dbname?option=value&…`` (libpq's URL form; port 5432 by default, the
database defaults to the user's name as libpq's does). lockkit's options are :class:`PostgresOptions`; the
libpq options in :data:`LIBPQ_OPTIONS` are passed through. The password is never shown.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ...errors import ConfigError
from ...urls import BackendURL, parse_options

__all__ = ["DEFAULT_PORT", "LIBPQ_OPTIONS", "PostgresOptions", "connect_params"]

DEFAULT_PORT = 5432

LIBPQ_OPTIONS = (
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "application_name",
    "target_session_attrs",
)
"""libpq connection parameters a URL may carry as they are (everything else is refused by name)."""

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}(\.[A-Za-z_][A-Za-z0-9_]{0,62})?")


@dataclass(frozen=True)
class PostgresOptions:
    table: str = "lockkit_locks"
    """The lock table (``[schema.]name``): one row per lock name, with its advisory key and fencing counter.
    Created if missing (which needs CREATE on the schema once)."""
    permit_table: str = "lockkit_permits"
    """The table of semaphores and reader-writer locks (``[schema.]name``): one row per name with the limit its
    holders use and its fencing counter. Created if missing, like the lock table."""
    namespace: str = "lockkit"
    """Hashed into every advisory key with the name: two applications on one database with different
    namespaces never share a lock."""
    timeout: float = 5.0
    """Seconds a connection may go unanswered (connect, TCP user timeout, keepalives) before the driver counts
    it dead: the loss is then reported, as the server drops the session's locks when it notices."""
    max_sessions: int = 64
    """At most this many server sessions per driver: each blocked waiter needs one of its own; held locks share
    the others (a session holds any number of locks, never two leases of one name)."""
    sslmode: str | None = None
    sslrootcert: str | None = None
    sslcert: str | None = None
    sslkey: str | None = None
    application_name: str = "lockkit"
    target_session_attrs: str | None = None

    def __post_init__(self) -> None:
        for option in ("table", "permit_table"):
            if not _IDENTIFIER.fullmatch(getattr(self, option)):
                raise ConfigError(
                    f"{option} must be a plain SQL identifier, optionally schema-qualified (letters, digits, _): "
                    f"got {getattr(self, option)!r}"
                )
        if not self.namespace:
            raise ConfigError(
                "namespace must not be empty (hashed with each name, it keeps applications on one database apart); "
                "set ?namespace=myapp, or leave the option out for the default"
            )
        if not 0 < self.timeout <= 300:
            raise ConfigError(
                f"timeout must be above 0 and at most 300 seconds, got {self.timeout!r}; set one in that range, "
                "e.g. timeout=5 (the default)"
            )
        if not 2 <= self.max_sessions <= 10_000:
            raise ConfigError(
                f"max_sessions must be between 2 and 10000, got {self.max_sessions!r}; set one in that range"
            )


def connect_params(url: BackendURL) -> tuple[dict[str, Any], PostgresOptions]:
    """The keyword arguments of ``psycopg.connect`` for ``url`` and the driver's options; checked strictly."""
    options = parse_options(PostgresOptions, url.options, url)
    if len(url.hosts) > 1:
        raise ConfigError(
            f"give one PostgreSQL server, not a list ({url}): advisory locks live on one server, and a "
            "failover to another drops them all (see docs/backends/postgres.md)"
        )
    host, port = url.host_port(DEFAULT_PORT)[0] if url.hosts else ("localhost", DEFAULT_PORT)
    dbname = url.path.lstrip("/")
    if "/" in dbname:
        raise ConfigError(f"the URL's path is the database name, one segment: {url}; e.g. postgresql://host:5432/app")
    if url.password is not None and not url.username:
        raise ConfigError(f"a password needs a user name: {url.scheme}://USER:PASSWORD@host/db (got {url})")
    timeout = options.timeout
    params: dict[str, Any] = {
        "host": host,
        "port": port,
        "connect_timeout": max(1, round(timeout)),
        "application_name": options.application_name,
        "keepalives": 1,
        "keepalives_idle": max(1, round(timeout / 2)),
        "keepalives_interval": 1,
        "keepalives_count": 3,
        "tcp_user_timeout": int(timeout * 1000),
        # Server settings of every session, sent at connect (no round trip): a session lockkit keeps idle for
        # hours must not be ended by a role's idle_session_timeout, nor a wait cut short by statement_timeout;
        # and a fencing bump is durable before its grant is reported (synchronous_commit off could lose the last
        # bumps in a server crash, and hand out a token again).
        "options": "-c idle_session_timeout=0 -c idle_in_transaction_session_timeout=0 -c statement_timeout=0 "
        "-c lock_timeout=0 -c synchronous_commit=on",
        "autocommit": True,
    }
    if dbname:
        params["dbname"] = dbname
    if url.username:
        params["user"] = url.username
    if url.password is not None:
        params["password"] = url.password
    for name in LIBPQ_OPTIONS:
        value = getattr(options, name)
        if value is not None and name != "application_name":
            params[name] = value
    return params, options
