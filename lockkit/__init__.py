"""lockkit: one backend-neutral distributed lock.

::

    import lockkit

    locks = lockkit.connect("redis://localhost:6379/0")   # or etcd://, zookeeper://, redlock://, file://, memory://
    with locks.lock("inventory:sku-42", ttl=10) as lease:  # waits, then renews automatically while inside
        write(..., fencing_token=lease.fencing_token)

Errors (all subclasses of :class:`LockError`)::

    LockError
    ├── LockTimeout, LockNotOwned, LockLost, BackendUnavailable
    ├── ConfigError       (also ValueError)
    ├── InvalidLockName   (also ValueError)
    └── UsageError        (also TypeError)

``import lockkit`` imports no backend client; drivers load on first use of their scheme.
"""

from __future__ import annotations

# semaphores and reader-writer locks (issue 18)
from ._async.semaphore import AsyncPermit, AsyncRWLock, AsyncSemaphore
from ._sync.semaphore import Permit, RWLock, Semaphore
from .aio import AsyncLock
from .driver import Grant, Guarantees, HolderInfo, Offer, PermitInfo
from .errors import (
    BackendUnavailable,
    ConfigError,
    InvalidLockName,
    LockError,
    LockLost,
    LockNotOwned,
    LockTimeout,
    UsageError,
)
from .guarded import current_lease
from .lease import Lease, LeaseState
from .lock import Lock
from .locker import AsyncLocker, Locker, connect, connect_async, from_config, from_config_async

__version__ = "0.1.0"

__all__ = [
    "AsyncLock",
    "AsyncLocker",
    # semaphores and reader-writer locks (issue 18)
    "AsyncPermit",
    "AsyncRWLock",
    "AsyncSemaphore",
    "BackendUnavailable",
    "ConfigError",
    "Grant",
    "Guarantees",
    "HolderInfo",
    "InvalidLockName",
    "Lease",
    "LeaseState",
    "Lock",
    "LockError",
    "LockLost",
    "LockNotOwned",
    "LockTimeout",
    "Locker",
    "Offer",
    "Permit",
    "PermitInfo",
    "RWLock",
    "Semaphore",
    "UsageError",
    "__version__",
    "connect",
    "connect_async",
    "current_lease",
    "from_config",
    "from_config_async",
]
