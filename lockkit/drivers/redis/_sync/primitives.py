"""What the blocking face of the Redis drivers does its own way, written by hand (``../_async/primitives.py``
is its asyncio twin, with the same names).

* the connection pool, :class:`..pool.ConnectionPool` (the bytes themselves move through :mod:`.stream`);
* :class:`Background`: what runs beside the callers of a driver — the thread whose event loop runs the
  pub/sub hubs (only this face needs one), the watchers of its waiters, and the clean-up of an acquire that
  ended early, which runs inline here.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import ParamSpec, TypeVar

from ....driver import Cancel
from ..hub import Hub, LoopThread, Snapshot
from ..pool import ConnectionPool
from ..watch import SyncWatcher

__all__ = ["Background", "ConnectionPool", "pause"]

T = TypeVar("T")
P = ParamSpec("P")


def pause(seconds: float) -> None:
    """Wait a little before trying again (Sentinel: between questions while a failover is under way)."""
    time.sleep(seconds)


class Background:
    """What runs beside a blocking driver's callers: the hubs' event loop thread (started at the first
    contended acquire) and its waiters' watchers."""

    def __init__(self, name: str) -> None:
        self._loop = LoopThread(name)
        self._done = threading.Condition()
        self._later = 0  # clean-ups handed to a worker and not finished: close() waits for them

    def watcher(
        self,
        targets: Sequence[tuple[Hub, bytes]],
        cancel: Cancel | None,
        wid: str | None = None,
        before: list[Snapshot] | None = None,
    ) -> SyncWatcher:
        """A waiter on ``targets`` (see :class:`..watch.SyncWatcher`)."""
        return SyncWatcher(self._loop, targets, cancel, wid, before)

    def clean_up(self, step: Callable[P, None], *args: P.args, **kwargs: P.kwargs) -> None:
        """Run ``step(*args, **kwargs)`` now, in the caller's thread: a blocking caller that gave up waits for
        its clean-up (the asyncio twin runs it in a task)."""
        step(*args, **kwargs)

    def clean_up_later(self, step: Callable[P, None], *args: P.args, **kwargs: P.kwargs) -> None:
        """Run ``step(*args, **kwargs)`` on a thread of its own: the clean-up after an error (most often an unresponsive
        server, which the clean-up would wait out too), so that the caller hears of the error at once."""
        def run() -> None:
            try:
                step(*args, **kwargs)
            finally:
                with self._done:
                    self._later -= 1
                    self._done.notify_all()

        with self._done:
            self._later += 1
        # A thread of its own, which ends with the clean-up: they are rare (after errors), and a pool's threads
        # would stay for the life of the process.
        thread = threading.Thread(target=run, name="lockkit-redis-cleanup", daemon=True)
        try:
            thread.start()
        except RuntimeError:  # no new thread (the interpreter is shutting down): in the caller's, as before
            run()

    def listen(self, hub: Hub, channel: bytes, wake: Callable[[bytes], None]) -> None:
        """Keep ``wake`` registered on ``hub``'s ``channel`` until the hub closes (Sentinel: ``+switch-master``);
        it runs on the hubs' loop thread (started if need be), and so does ``wake``."""
        self._loop.call(hub.watch_soon, channel, wake, None)

    def shielded(
        self, attempt: Callable[[], T | None], watcher: SyncWatcher, undo: Callable[[], None]
    ) -> T | None:
        """Run ``attempt()``. The asyncio twin shields it from the caller's cancel; a blocking attempt is not
        cancelled half-way by another party (a :class:`~lockkit.driver.Cancel` ends its next wait instead),
        so ``watcher`` and ``undo`` are not needed here."""
        return attempt()

    def close(self, hubs: Sequence[Hub], wait: float = 5.0) -> None:
        """Wait (up to ``wait`` seconds) for the clean-ups still running, as the asyncio twin does — one that
        outlived its driver's close would open a connection nobody closes — then close the hubs on their loop
        thread, and stop it."""
        with self._done:
            self._done.wait_for(lambda: self._later == 0, wait)
        if self._loop.started:
            for hub in hubs:
                self._loop.run(hub.close())
        self._loop.stop()
