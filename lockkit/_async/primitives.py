"""What the asyncio face does its own way, written by hand (``lockkit/_sync/primitives.py`` is its twin).

The generated blocking face imports the same names from its own ``primitives`` module, so these few
functions are all that a face has to say beyond ``await``.
"""

from __future__ import annotations

from ..driver import AsyncDriver, Driver
from ..offload import ThreadOffloadDriver
from ..renewal import async_scheduler
from .cancel_safe import finish_even_if_cancelled

__all__ = ["async_scheduler", "face_driver", "finish_even_if_cancelled"]


def face_driver(driver: Driver) -> AsyncDriver:
    """A blocking driver (a ``migrate`` backend's) as this face calls it: through worker threads."""
    return ThreadOffloadDriver(driver)
