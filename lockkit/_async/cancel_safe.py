"""Small asyncio helpers that behave the same on Python 3.10 to 3.13."""

from __future__ import annotations

import asyncio
import logging
import types
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import Any, TypeVar, cast

__all__ = ["finish_even_if_cancelled", "wait_event"]

log = logging.getLogger("lockkit")
T = TypeVar("T")

What = str | tuple[str, str]
"""What a step does, for the warning if it fails after its caller was cancelled: a text, or (verb, lock name),
formatted only then (a text made per release was most of a release's string work; issue 17)."""

_unawaited: set[asyncio.Task[Any]] = set()
"""Shielded tasks whose caller was cancelled: referenced here so that the loop does not drop them."""


async def wait_event(event: asyncio.Event, timeout: float | None) -> bool:
    """Wait until ``event`` is set (True) or ``timeout`` passes (False).

    Not ``asyncio.wait_for``: before Python 3.12 it can swallow a cancellation of the caller when the event
    is set at the same moment (bpo-37658 / gh-86296), and a cancelled ``acquire`` must never carry on and
    take the lock. ``asyncio.wait`` always lets the caller's cancellation through.
    """
    if event.is_set():
        return True
    waiter = asyncio.ensure_future(event.wait())
    try:
        done, _ = await asyncio.wait({waiter}, timeout=timeout)
    finally:
        waiter.cancel()
    return bool(done)


def finish_even_if_cancelled(step: Coroutine[Any, Any, T], what: What, inline: bool = False) -> Awaitable[T]:
    """Run ``step`` to its end even if the awaiting task is cancelled meanwhile.

    For the calls that must not stop half-way: a release (or renew) abandoned between sending and reading
    the reply would leave the lease's state out of step with the server's (released there but still
    ``valid`` here, or still held there with nobody renewing it). The caller's cancellation still reaches
    the caller at once; the step goes on in a task of its own and records its outcome on the lease, and an
    error nobody is left to see is logged.

    ``inline=True`` (the driver promises that its calls never cancel the task they run in: no
    ``asyncio.timeout`` inside, nor ``asyncio.wait_for`` on Python 3.12+, which cancels the current task)
    runs ``step`` in the caller's own task and moves it to a task of its own only when a cancellation
    arrives (:func:`_inline`): no task, no shield, no extra turn of the loop on the usual path (issue 17).
    Otherwise the step runs in its own task under :func:`asyncio.shield` from the start, which lets a step
    cancel itself (its own timeout) without being taken for its caller.
    """
    if inline:
        return _inline(step, what)
    return _shielded(step, what)


async def _shielded(step: Coroutine[Any, Any, T], what: What) -> T:
    task = asyncio.ensure_future(step)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        if not task.done():
            _keep(task, what)
        raise


def _keep(task: asyncio.Task[Any], what: What) -> None:
    _unawaited.add(task)
    task.add_done_callback(lambda done: _report(done, what))


class _Guard:
    """What the caller's task waits on in place of the future the step waits on (``waited``).

    The task registers its wake-up here, which passes it on to ``waited``, so the usual wake-up costs nothing
    more than awaiting ``waited`` directly. The difference is :meth:`cancel`: a task cancels the future it
    waits on, and cancelling ``waited`` would break the step off half-way (a reply half read, a release sent
    but its outcome never recorded). The guard leaves ``waited`` alone: it takes the task's wake-up back from
    it and wakes the task now with the cancellation (:meth:`result`), and :func:`_inline` hands the step, still
    waiting for ``waited``, to a task of its own.

    Only what an ``asyncio.Task`` uses of the future it waits on is here (``_loop`` stands for ``get_loop``).
    """

    __slots__ = ("_asyncio_future_blocking", "_loop", "_message", "_wakeups", "cancelled_by_caller", "waited")

    def __init__(self, waited: Any) -> None:
        self.waited = waited
        self._asyncio_future_blocking = True  # what asyncio.Task checks to accept a yielded future
        self._loop = waited.get_loop()
        self._wakeups: tuple[tuple[Callable[..., object], Any], ...] = ()
        self.cancelled_by_caller = False

    def add_done_callback(self, fn: Callable[..., object], *, context: Any = None) -> None:
        self._wakeups += ((fn, context),)
        self.waited.add_done_callback(fn, context=context)

    def remove_done_callback(self, fn: Callable[..., object]) -> int:
        self._wakeups = tuple((f, c) for f, c in self._wakeups if f != fn)
        return int(self.waited.remove_done_callback(fn))

    def cancel(self, msg: Any = None) -> bool:
        if self.cancelled_by_caller:
            return False
        self.cancelled_by_caller, self._message = True, msg
        waited = self.waited
        if waited.done():
            # its wake-up of the task is already scheduled: refusing makes the task throw the cancellation in
            # at that wake-up instead of passing the result on, and _inline sees cancelled_by_caller
            return False
        for fn, context in self._wakeups:
            waited.remove_done_callback(fn)
            self._loop.call_soon(fn, self, context=context)
        return True

    def done(self) -> bool:
        return self.cancelled_by_caller or bool(self.waited.done())

    def cancelled(self) -> bool:
        return self.cancelled_by_caller

    def result(self) -> Any:
        if self.cancelled_by_caller:
            raise asyncio.CancelledError() if self._message is None else asyncio.CancelledError(self._message)
        return self.waited.result()

    def exception(self) -> BaseException | None:
        if self.cancelled_by_caller:
            raise asyncio.CancelledError()
        error: BaseException | None = self.waited.exception()
        return error

    def __repr__(self) -> str:
        return f"<lockkit guard of {self.waited!r}>"


@types.coroutine
def _inline(step: Coroutine[Any, Any, T], what: What) -> Generator[Any, Any, T]:
    """Drive ``step`` in the awaiting task, every future it waits on behind a :class:`_Guard`; on the caller's
    cancellation, move the step (where it stands) to a task of its own and raise the cancellation."""
    error: BaseException | None = None
    while True:
        try:
            yielded = step.send(None) if error is None else step.throw(error)
        except StopIteration as stop:
            return cast(T, stop.value)
        error = None
        if getattr(yielded, "_asyncio_future_blocking", False):
            guard = _Guard(yielded)
            try:
                yield guard
            except BaseException as exc:
                if guard.cancelled_by_caller:
                    _keep(asyncio.ensure_future(_resume(step, yielded)), what)
                    raise
                error = exc  # the future's own failure: into the step, as awaiting the future would
        else:
            # A bare ``yield`` (``asyncio.sleep(0)``): a cancellation meanwhile is thrown in here, and the step
            # can go on from where it stands. Anything else the task refuses with a RuntimeError, into the step.
            try:
                yield yielded
            except asyncio.CancelledError:
                _keep(asyncio.ensure_future(_resume(step, None)), what)
                raise
            except BaseException as exc:
                error = exc


async def _resume(step: Coroutine[Any, Any, T], waited: Any) -> T:
    return await _drive(step, waited)


@types.coroutine
def _drive(step: Coroutine[Any, Any, T], waited: Any) -> Generator[Any, Any, T]:
    """Drive ``step`` to its end in this (its own) task, first waiting for ``waited`` (a future it already
    waits on) if given. A cancellation of this task (the loop closing) is thrown into the step as usual."""
    error: BaseException | None = None
    if waited is not None and not waited.done():
        try:
            yield waited  # its _asyncio_future_blocking is still set: only the guard's was cleared
        except BaseException as exc:
            error = exc
    while True:
        try:
            yielded = step.send(None) if error is None else step.throw(error)
        except StopIteration as stop:
            return cast(T, stop.value)
        error = None
        try:
            yield yielded
        except BaseException as exc:
            error = exc


def _report(task: asyncio.Task[Any], what: What) -> None:
    _unawaited.discard(task)
    if isinstance(what, tuple):
        what = f"{what[0]} {what[1]!r}"
    if task.cancelled():
        log.warning("lockkit: %s was cancelled after its caller (the event loop is closing?)", what)
        return
    error = task.exception()
    if error is not None:
        log.warning("lockkit: %s, finished after its caller was cancelled, raised %r", what, error)
