"""What the blocking conformance suite does its own way, written by hand (``../_async/primitives.py`` is its twin).

A concurrent holder is a thread, a wait blocks, a child process runs the worker directly.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from time import sleep
from typing import Any, Generic, TypeVar

__all__ = ["Background", "Flag", "in_forked_child", "in_process", "run_blocking", "run_concurrently", "sleep"]

T = TypeVar("T")


def run_blocking(call: Callable[..., T], *args: Any) -> T:
    """Run a blocking call: on this face, right here (the asyncio face moves it off its event loop)."""
    return call(*args)


def run_concurrently(calls: Sequence[Callable[[], None]], timeout: float) -> None:
    """Run every call at once, each in a thread of its own; raise the first failure, or TimeoutError.

    Unlike the asyncio face's tasks, a thread cannot be cancelled: on a failure this still waits (up to
    ``timeout``) for the others, and a thread still running after ``timeout`` is left behind as a daemon.
    """
    errors: list[BaseException | None] = [None] * len(calls)

    def run(index: int, call: Callable[[], None]) -> None:
        try:
            call()
        except BaseException as exc:  # reported to the test below, not as an unhandled thread exception
            errors[index] = exc

    threads = [threading.Thread(target=run, args=(i, call), daemon=True) for i, call in enumerate(calls)]
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    for error in errors:  # the first failure in the order given, not in the order of completion
        if error is not None:
            raise error
    running = sum(thread.is_alive() for thread in threads)
    if running:
        raise TimeoutError(f"{running} of {len(threads)} concurrent calls still ran after {timeout:g} s")


class Background(Generic[T]):
    """One call running beside the test, to look at (:meth:`done`) and collect (:meth:`result`) later.

    A thread on this face (a daemon: one never collected does not hold up the interpreter's exit), a task on
    the asyncio one.
    """

    _value: T  # set once the call has returned

    def __init__(self, call: Callable[[], T]) -> None:
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(call,), daemon=True)
        self._thread.start()

    def _run(self, call: Callable[[], T]) -> None:
        try:
            self._value = call()
        except BaseException as exc:  # kept for result(), not an unhandled thread exception
            self._error = exc

    def done(self) -> bool:
        """Whether the call has finished (returned or raised)."""
        return not self._thread.is_alive()

    def result(self, timeout: float) -> T:
        """The call's result, or its exception; TimeoutError if it has not finished within ``timeout``."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the background call still ran after {timeout:g} s")
        if self._error is not None:
            raise self._error
        return self._value


class Flag:
    """A one-way flag that any thread may set (``on_lost`` runs on a renewal thread), and that the test waits for."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self) -> None:
        self._event.set()

    def wait(self, timeout: float) -> bool:
        """Whether the flag was set within ``timeout`` seconds."""
        return self._event.wait(timeout)


def in_process(work: Callable[..., None], *args: Any) -> None:
    """A child process's entry point (module-level, so that ``spawn`` pickles it by name): runs the worker."""
    work(*args)


def in_forked_child(call: Callable[[], int]) -> int:
    """Fork; the child runs ``call`` and exits with its result (3 if it raised). Returns the child's exit code.

    The child never returns into pytest.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads: the child only checks pids
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's coverage is not collected
        code = 3  # whatever the child raised: its exit code says so, and nothing unwinds into pytest
        with contextlib.suppress(BaseException):
            code = call()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)
