"""What the blocking face of the PostgreSQL driver does its own way, written by hand (``../_async/primitives.py``
is its asyncio twin, with the same names).

* :class:`StateLock`: a real lock, as the blocking driver is called from many threads;
* :class:`Background`: the clean-up of an acquire that ended early runs inline, in the caller's thread; a
  :class:`~lockkit.driver.Cancel` cancels the session's running query from the thread that fires it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any, ParamSpec

from psycopg import Connection

from ....driver import Cancel

__all__ = ["Background", "StateLock"]

P = ParamSpec("P")


class StateLock:
    def __init__(self) -> None:
        self._lock = threading.Lock()

    def __enter__(self) -> None:
        self._lock.acquire()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._lock.release()


class Background:
    def clean_up(self, step: Callable[P, None], *args: P.args, **kwargs: P.kwargs) -> None:
        """Run ``step`` now, in the caller's thread (the asyncio twin runs it in a task)."""
        step(*args, **kwargs)

    def on_cancel(self, cancel: Cancel | None, conn: Connection[Any]) -> Callable[[], None]:
        """Cancel ``conn``'s running query when ``cancel`` fires; returns the unhook."""
        if cancel is None:
            return lambda: None

        def fire() -> None:
            with contextlib.suppress(Exception):  # a connection already gone has no query left to cancel
                conn.cancel_safe(timeout=5.0)

        return cancel.on_cancel(fire)

    def drain(self) -> None:
        return None
