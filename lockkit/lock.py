"""Where :class:`Lock` has always been importable from; it is generated into ``lockkit/_sync/lock.py``."""

from __future__ import annotations

from ._sync.lock import Lock
from .lock_core import DEFAULT_TTL, LockCore, new_token

__all__ = ["DEFAULT_TTL", "Lock", "LockCore", "new_token"]
