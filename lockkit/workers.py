"""Worker threads that keep working while the interpreter shuts down: :class:`Workers`.

The blocking renewal scheduler hands each batch of renewals to a worker, so that one slow backend never delays
another's renewals. ``concurrent.futures`` executors cannot be those workers: from the moment the main thread
returns, while non-daemon threads may still run (and hold locks that need renewing), every ``submit`` raises
``RuntimeError: cannot schedule new futures after interpreter shutdown`` — which ended the renewal thread, and
with it every renewal of the process (docs/reliability.md, C-13). These workers are daemon threads fed by a
queue: they run until the interpreter itself is gone, which is when nothing holds a lock any more.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["Workers"]

log = logging.getLogger("lockkit")


class Workers:
    """Up to ``limit`` daemon threads, started as calls arrive while every thread is busy, that never end."""

    def __init__(self, limit: int, name: str) -> None:
        self._limit, self._name = limit, name
        self._calls: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...]]] = queue.SimpleQueue()
        self._mutex = threading.Lock()
        self._threads = 0
        # Threads waiting for a call, less the calls queued since that one of them will take: a call that finds
        # one (above zero) starts no thread. Never ending threads make a miscount harmless: a queued call waits
        # at worst for a busy thread to finish, never for ever.
        self._idle = 0

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on a worker; an exception it raises is logged (the callers report their own)."""
        self._calls.put((fn, args))
        with self._mutex:
            self._idle -= 1
            if self._idle >= 0 or self._threads >= self._limit:
                return
            self._idle += 1  # this call is the new thread's first; it is not idle yet
            self._threads += 1
            number = self._threads
        try:
            threading.Thread(target=self._work, name=f"{self._name}-{number}", daemon=True).start()
        except RuntimeError:  # no thread to be had (a limit of the system, or the interpreter finalizing)
            with self._mutex:
                self._threads -= 1
            log.warning("lockkit: could not start a %s thread; running the call in this one", self._name)
            # A queued call (perhaps an earlier one) runs here, in the place of the thread counted to take it;
            # none left if a busy thread finished meanwhile and took it (never wait here: this is the caller)
            self._run_one(wait=False)

    def _work(self) -> None:
        while True:
            self._run_one()
            with self._mutex:
                self._idle += 1

    def _run_one(self, wait: bool = True) -> None:
        try:
            fn, args = self._calls.get() if wait else self._calls.get_nowait()
        except queue.Empty:
            return
        try:
            fn(*args)
        except BaseException:  # SystemExit from a user's on_lost too: it would end this thread, never to return
            log.exception("lockkit: a %s call failed", self._name)
