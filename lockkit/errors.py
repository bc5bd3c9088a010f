"""The one error tree of lockkit.

::

    LockError
    ├── LockTimeout            acquire(timeout=…) ran out before the lock was free
    ├── LockNotOwned           release of a lock the server no longer holds for this lease; release/renew
    │                          on a handle that holds none
    ├── LockLost               the lease ended (expired, renewal refused or failed, session lost) while held
    ├── BackendUnavailable     the server (or a quorum of servers) could not be reached
    ├── ConfigError            bad URL, option, TTL or config file          (also a ValueError)
    ├── InvalidLockName        empty, over-long or non-str lock name        (also a ValueError)
    └── UsageError             an API used the wrong way, e.g. ``with`` on an asyncio lock (also a TypeError)

Backend exceptions are translated at the driver boundary with ``raise … from exc``.
Messages say what to do next and never contain a secret: URLs are shown with the
password masked, and lease tokens are shown only as a short hash prefix.
"""

from __future__ import annotations

__all__ = [
    "BackendUnavailable",
    "ConfigError",
    "InvalidLockName",
    "LockError",
    "LockLost",
    "LockNotOwned",
    "LockTimeout",
    "UsageError",
]


class LockError(Exception):
    """Root of every error lockkit raises."""


class LockTimeout(LockError):
    """The lock was not acquired before the deadline."""


class LockNotOwned(LockError):
    """The lock is not held by this lease (never acquired, released, expired, or taken by another)."""


class LockLost(LockError):
    """The lease ended while its holder believed it held the lock."""


class BackendUnavailable(LockError):
    """The backend (or a quorum of its nodes) could not be reached or refused the operation."""


class ConfigError(LockError, ValueError):
    """A URL, option, TTL or configuration file is invalid."""


class InvalidLockName(LockError, ValueError):
    """A lock name is not a non-empty str of at most 512 UTF-8 bytes."""


class UsageError(LockError, TypeError):
    """An API used the wrong way: ``with`` on an asyncio handle, ``async with`` on a blocking one. Also a
    TypeError, which is what Python raised there before, so handlers written for that still catch it."""
