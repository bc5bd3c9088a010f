"""Making a locker: :func:`connect`, :func:`connect_async`, :func:`from_config`, :func:`from_config_async`.

The lockers themselves are written once, in ``lockkit/_async/locker.py`` (:class:`AsyncLocker`), and the
blocking :class:`Locker` is generated from it (``lockkit/_sync/locker.py``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ._async.locker import AsyncLocker
from ._sync.locker import Locker
from .config import Settings, load_file, parse_settings, resolve_settings
from .timing import Clock

__all__ = ["AsyncLocker", "Locker", "connect", "connect_async", "from_config", "from_config_async"]


def connect(url: str | None = None, *, clock: Clock | None = None) -> Locker:
    """A blocking locker for ``url``, or from ``LOCKKIT_URL`` / ``lockkit.toml`` / the embedded default."""
    return Locker(resolve_settings(url), clock)


def connect_async(url: str | None = None, *, clock: Clock | None = None) -> AsyncLocker:
    """The asyncio twin of :func:`connect` (use it as ``async with``, or call ``aclose()``)."""
    return AsyncLocker(resolve_settings(url), clock)


def from_config(path: str | os.PathLike[str] | Mapping[str, Any], *, clock: Clock | None = None) -> Locker:
    """A blocking locker from a ``lockkit.toml`` path (or an already-parsed mapping)."""
    return Locker(_settings(path), clock)


def from_config_async(path: str | os.PathLike[str] | Mapping[str, Any], *, clock: Clock | None = None) -> AsyncLocker:
    """The asyncio twin of :func:`from_config`."""
    return AsyncLocker(_settings(path), clock)


def _settings(path: str | os.PathLike[str] | Mapping[str, Any]) -> Settings:
    if isinstance(path, Mapping):
        return parse_settings(path, "<mapping>")
    return load_file(path)
