"""Where :class:`AsyncLock` has always been importable from; its source is ``lockkit/_async/lock.py``."""

from __future__ import annotations

from ._async.lock import AsyncLock

__all__ = ["AsyncLock"]
