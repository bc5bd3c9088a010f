"""What the asyncio face does its own way, written by hand (``lockkit/_sync/primitives.py`` is its twin).

The generated blocking face imports the same names from its own ``primitives`` module, so these few
functions are all that a face has to say beyond ``await``.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

from ..driver import AsyncDriver, Driver
from ..errors import ConfigError
from ..offload import ThreadOffloadDriver
from ..renewal import async_scheduler
from .cancel_safe import finish_even_if_cancelled

__all__ = ["Guarded", "async_scheduler", "check_guarded", "face_driver", "finish_even_if_cancelled", "pause"]

P = ParamSpec("P")
T = TypeVar("T")
Guarded = Callable[P, Awaitable[T]]
"""What this face's ``locked()`` decorates: a coroutine function."""


async def pause(seconds: float) -> None:
    """Let this face's other work run for ``seconds`` (the event loop's tasks; on the blocking face, threads)."""
    await asyncio.sleep(seconds)


def face_driver(driver: Driver) -> AsyncDriver:
    """A blocking driver (a ``migrate`` backend's) as this face calls it: through worker threads."""
    return ThreadOffloadDriver(driver)


def check_guarded(fn: Callable[..., Any]) -> None:
    """``AsyncLocker.locked`` wraps coroutine functions only: a blocking one would hold the lock for no time."""
    if not inspect.iscoroutinefunction(fn):
        raise ConfigError(
            f"AsyncLocker.locked() decorates async functions; {fn.__qualname__}() is not one: "
            "use a blocking Locker (lockkit.connect) for it"
        )
