"""What the blocking face does its own way, written by hand (``lockkit/_async/primitives.py`` is its twin)."""

from __future__ import annotations

from typing import TypeVar

from ..driver import Driver
from ..renewal import scheduler

__all__ = ["face_driver", "finish_even_if_cancelled", "scheduler"]

T = TypeVar("T")


def face_driver(driver: Driver) -> Driver:
    """A blocking driver as this face calls it: as it is."""
    return driver


def finish_even_if_cancelled(result: T, what: str) -> T:
    """The blocking twin of :func:`lockkit._async.cancel_safe.finish_even_if_cancelled`.

    A blocking call cannot be cancelled half-way by another party: by the time this runs, the step it
    wraps has finished, so its result is simply passed on.
    """
    return result
