"""What the asyncio conformance suite does its own way, written by hand (``../_sync/primitives.py`` is its twin).

The generated blocking suite imports the same names from its own ``primitives`` module, so that the tests
themselves are written once: a concurrent holder is a task here and a thread there, a wait is awaited here
and blocks there, a child process runs the worker in an event loop of its own here and directly there.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
import warnings
from asyncio import sleep
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, Generic, TypeVar

__all__ = ["Background", "Flag", "in_forked_child", "in_process", "run_blocking", "run_concurrently", "sleep"]

T = TypeVar("T")


async def run_blocking(call: Callable[..., T], *args: Any) -> T:
    """Run a blocking call (joining a process, waiting for a child) in a worker thread, off the event loop.

    The loop must keep running meanwhile: the locker's renewals and the driver's connections live on it.
    """
    return await asyncio.to_thread(call, *args)


async def run_concurrently(calls: Sequence[Callable[[], Awaitable[None]]], timeout: float) -> None:
    """Run every call at once, each in a task of its own; raise the first failure, or TimeoutError.

    Nothing is left running when this returns or raises: the other tasks are cancelled and awaited, so a
    failed test's holders cannot touch the next test's locks.
    """
    tasks = [asyncio.ensure_future(call()) for call in calls]
    try:
        done, pending = await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for task in tasks:
            task.cancel()  # a no-op on the finished ones
        await asyncio.gather(*tasks, return_exceptions=True)
    for task in tasks:  # the first failure in the order given, not in the order of completion
        error = task.exception() if task in done else None
        if error is not None:
            raise error
    if pending:
        raise TimeoutError(f"{len(pending)} of {len(tasks)} concurrent calls still ran after {timeout:g} s")


class Background(Generic[T]):
    """One call running beside the test, to look at (:meth:`done`) and collect (:meth:`result`) later.

    A task on this face, a thread on the blocking one. A task never collected is cancelled when the test's
    event loop closes.
    """

    def __init__(self, call: Callable[[], Awaitable[T]]) -> None:
        self._task: asyncio.Future[T] = asyncio.ensure_future(call())

    def done(self) -> bool:
        """Whether the call has finished (returned or raised)."""
        return self._task.done()

    async def result(self, timeout: float) -> T:
        """The call's result, or its exception; TimeoutError if it has not finished within ``timeout``."""
        try:
            return await asyncio.wait_for(self._task, timeout)
        except asyncio.TimeoutError:  # not yet the built-in TimeoutError on Python 3.10
            raise TimeoutError(f"the background call still ran after {timeout:g} s") from None


class Flag:
    """A one-way flag that any thread may set, and that the test waits for.

    ``on_lost`` callbacks run wherever the renewal machinery runs (a task, a renewal thread, a driver's own
    thread): setting a ``threading.Event`` is safe from all of them, and the wait polls it, so that nothing
    depends on which event loop, if any, the setter runs on.
    """

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self) -> None:
        self._event.set()

    async def wait(self, timeout: float) -> bool:
        """Whether the flag was set within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not self._event.is_set():
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.01)
        return True


def in_process(work: Callable[..., Coroutine[Any, Any, None]], *args: Any) -> None:
    """A child process's entry point (module-level, so that ``spawn`` pickles it by name): the asyncio worker
    runs to completion in the child's own event loop."""
    asyncio.run(work(*args))


async def in_forked_child(call: Callable[[], Coroutine[Any, Any, int]]) -> int:
    """Fork; the child runs ``call`` in a fresh event loop and exits with its result (3 if it raised). Returns
    the child's exit code.

    The parent's running loop is not the child's (asyncio keys the running loop by pid), so ``asyncio.run``
    works in the child; the child never returns into pytest.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads: the child only checks pids
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's coverage is not collected
        code = 3  # whatever the child raised: its exit code says so, and nothing unwinds into pytest
        with contextlib.suppress(BaseException):
            code = asyncio.run(call())
        os._exit(code)
    _, status = await run_blocking(os.waitpid, pid, 0)
    return os.waitstatus_to_exitcode(status)
