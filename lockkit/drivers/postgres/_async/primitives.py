"""What the asyncio face of the PostgreSQL driver does its own way, written by hand (``../_sync/primitives.py``
is its blocking twin, with the same names).

* :class:`StateLock`: the driver's bookkeeping is changed between awaits only, on one event loop, so this
  face needs no lock (the blocking face, called from many threads, does);
* :class:`Background`: the clean-up of an acquire that ended early (unlock what a cancelled wait may have been
  granted) runs in a task of its own here, so a cancelled caller is not held up by a round trip; and a
  :class:`~lockkit.driver.Cancel` fired from another thread cancels the session's running query.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any, ParamSpec

from psycopg import AsyncConnection

from ....driver import Cancel

__all__ = ["Background", "StateLock"]

P = ParamSpec("P")


class StateLock:
    def __enter__(self) -> None:
        return None

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None


class Background:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def clean_up(self, step: Callable[P, Coroutine[Any, Any, None]], *args: P.args, **kwargs: P.kwargs) -> None:
        """Run ``step`` in a task of its own (a cancelled caller must not wait for it); :meth:`drain` waits."""
        task = asyncio.get_running_loop().create_task(step(*args, **kwargs))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def on_cancel(self, cancel: Cancel | None, conn: AsyncConnection[Any]) -> Callable[[], None]:
        """Cancel ``conn``'s running query when ``cancel`` fires (from any thread); returns the unhook."""
        if cancel is None:
            return lambda: None
        loop = asyncio.get_running_loop()

        def fire() -> None:
            loop.call_soon_threadsafe(self.clean_up, _cancel_query, conn)

        return cancel.on_cancel(fire)

    async def drain(self) -> None:
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


async def _cancel_query(conn: AsyncConnection[Any]) -> None:
    with contextlib.suppress(Exception):  # a connection already gone has no query left to cancel
        await conn.cancel_safe(timeout=5.0)
