"""What the blocking face does its own way, written by hand (``lockkit/_async/primitives.py`` is its twin)."""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from ..driver import Driver
from ..errors import ConfigError
from ..renewal import scheduler

__all__ = ["Guarded", "check_guarded", "face_driver", "finish_even_if_cancelled", "pause", "scheduler"]

P = ParamSpec("P")
T = TypeVar("T")
Guarded = Callable[P, T]
"""What this face's ``locked()`` decorates: a plain function."""


def pause(seconds: float) -> None:
    """Let this face's other work run for ``seconds`` (the event loop's tasks; on the blocking face, threads)."""
    time.sleep(seconds)


def face_driver(driver: Driver) -> Driver:
    """A blocking driver as this face calls it: as it is."""
    return driver


def finish_even_if_cancelled(result: T, what: str | tuple[str, str], inline: bool = False) -> T:
    """The blocking twin of :func:`lockkit._async.cancel_safe.finish_even_if_cancelled`.

    A blocking call cannot be cancelled half-way by another party: by the time this runs, the step it
    wraps has finished, so its result is simply passed on.
    """
    return result


def check_guarded(fn: Callable[..., Any]) -> None:
    """``Locker.locked`` wraps plain functions only: a coroutine function would return before its work ran."""
    if inspect.iscoroutinefunction(fn):
        raise ConfigError(
            f"Locker.locked() decorates plain functions; {fn.__qualname__}() is async: "
            "use an AsyncLocker (lockkit.connect_async) for it"
        )
