"""The one thread-offload adapter: an :class:`AsyncDriver` over a blocking :class:`Driver`.

Used for backends whose client has no asyncio API (kazoo, the etcd3 client) and
for the embedded drivers. Each call runs in a worker thread owned by the adapter
and answers the event loop through ``loop.call_soon_threadsafe``: one hand-off
to a thread through a ``queue.SimpleQueue`` and one wake-up of the loop, nothing
else per call (no ``concurrent.futures.Future``, no chained callbacks: about 15
µs of CPU less per call than ``ThreadPoolExecutor`` awaited through
``asyncio.wrap_future``; issue 17).

Two lanes of threads (:class:`_Lane`), each started on demand and ended after
idling: ``acquire`` calls, which may block a thread for as long as they wait,
and every other call (release, renew, holder, …), which never waits behind a
blocked acquire: however many acquires are waiting, the release that would let
them in runs at once.

Cancellation cleans up: cancelling the awaiting task fires the driver's
:class:`~lockkit.driver.Cancel`, which wakes the blocked wait so that it removes
what it queued; an acquire no thread had started is withdrawn (nothing was
sent); and if the grant raced the cancel, the lock is released at once so that a
cancelled acquire never leaves a lock held. A forked child starts with no
threads (it has none of its parent's) and starts its own on its first call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, TypeVar

from .driver import Cancel, Driver, Grant, Guarantees, HolderInfo, RenewRequest
from .errors import BackendUnavailable

__all__ = ["Offload", "ThreadOffloadDriver"]

log = logging.getLogger("lockkit")
T = TypeVar("T")

MAX_OFFLOAD_THREADS = 256
"""Threads for waiting acquires (each blocks one); more acquires than this queue for a free one."""
MAX_CALL_THREADS = 64
"""Threads for every other call (each bounded by the driver's own request timeout)."""
IDLE_SECONDS = 30.0
"""A worker thread that found nothing to do for this long ends (a burst of waiters leaves no threads behind)."""


class _Call:
    """One blocking call on its way through a lane, and who answers for its outcome.

    Two one-shot claims, each a one-item list that the worker and the event loop race to ``pop`` (atomic in
    CPython): ``start`` (the worker's, to run the call; the loop's, to withdraw it unstarted) and ``answer``
    (the worker's, to deliver the outcome to the loop; the loop's, to leave it to the worker to clean up).
    """

    __slots__ = ("answer", "args", "error", "finished", "fn", "future", "loop", "on_unclaimed", "result", "start")

    def __init__(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        loop: asyncio.AbstractEventLoop | None,
        future: asyncio.Future[Any] | None,
        on_unclaimed: Callable[[Any], None] | None = None,
    ) -> None:
        self.fn, self.args, self.loop, self.future = fn, args, loop, future
        self.on_unclaimed = on_unclaimed
        """Called in the worker with the result when nobody awaits it any more (a cancelled acquire's grant)."""
        self.start: list[bool] = [True]
        self.answer: list[bool] = [True]
        self.result: Any = None
        self.error: BaseException | None = None
        self.finished: asyncio.Future[None] | None = None
        """Set (on the loop) once a started call has returned and its unclaimed outcome was cleaned up: what a
        cancelled acquire waits for before it returns (see :meth:`_Lane.wait`)."""

    def run(self) -> None:
        try:
            self.start.pop()
        except IndexError:  # withdrawn before it started: nothing was sent
            return
        try:
            self._run()
        finally:
            finished = self.finished
            if finished is not None and self.loop is not None:
                with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                    self.loop.call_soon_threadsafe(_finish, finished)

    def _run(self) -> None:
        try:
            self.result = self.fn(*self.args)
        except BaseException as exc:  # delivered to the awaiting task (an interrupt included)
            self.error = exc
        if self.future is None:  # fire and forget (a cancelled grant's release)
            if self.error is not None:
                log.warning("lockkit: a call the offload adapter ran alone failed", exc_info=self.error)
            return
        try:
            self.answer.pop()
        except IndexError:  # the awaiting task was cancelled after the call started: ours to clean up
            self.unclaimed()
            return
        try:
            assert self.loop is not None
            self.loop.call_soon_threadsafe(self._deliver)
        except RuntimeError:  # the loop is closed: nobody will read the outcome
            self.unclaimed()

    def unclaimed(self) -> None:
        if self.error is not None:
            log.debug("lockkit: an offloaded call nobody awaits ended with %r", self.error)
        elif self.on_unclaimed is not None:
            self.on_unclaimed(self.result)

    def _deliver(self) -> None:
        future = self.future
        assert future is not None
        if future.done():  # cancelled meanwhile: the canceller read the outcome (see ThreadOffloadDriver.acquire)
            return
        if self.error is not None:
            future.set_exception(self.error)
        else:
            future.set_result(self.result)

    def fail(self, error: BaseException) -> None:
        """Answer with ``error`` instead of running (the lane closed before a thread took the call)."""
        try:
            self.start.pop()
        except IndexError:
            return
        self.error = error
        if self.future is None:  # a give-back nobody awaits: say so, its lock or permit lapses at its ttl
            log.warning("lockkit: a release of a cancelled acquire's grant was not run: %s", error)
        if self.future is not None and self.loop is not None:
            try:
                self.answer.pop()
                self.loop.call_soon_threadsafe(self._deliver)
            except (IndexError, RuntimeError):
                pass


def _finish(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


CANCEL_WAIT = 2.0
"""How long a cancelled acquire waits, at most, for its started call to end and remove what it queued (a call
stuck on an unresponsive server is left to finish on its own after that)."""

_lanes: weakref.WeakSet[_Lane] = weakref.WeakSet()


class _Lane:
    """Worker threads taking calls from one queue: started when a call finds none idle, up to ``limit``.

    ``idle`` counts the threads waiting for a call minus the calls queued for them (kept under ``_mutex``
    together with every ``put``), so a call starts a thread exactly when no waiting one is left for it.
    """

    def __init__(self, name: str, limit: int, idle_seconds: float = IDLE_SECONDS) -> None:
        self.name, self.limit, self.idle_seconds = name, limit, idle_seconds
        self._reset()
        self._closed = False
        _lanes.add(self)

    def _reset(self) -> None:
        self._mutex = threading.Lock()
        self._queue: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self.threads = 0
        self.idle = 0

    def submit(self, call: _Call) -> None:
        with self._mutex:
            if self._closed:
                raise BackendUnavailable("this backend's asyncio face is closed; open a new locker")
            self._queue.put(call)
            # Every queued call counts against ``idle``, taken by a waiting thread or not: below zero, -idle
            # calls wait for a thread (a backlog), and a thread that finishes one adds its 1 back as it takes the
            # next. (Counting only the calls a waiting thread took left ``idle`` above the threads really idle
            # after a backlog, and once those threads ended no call ever started one again.)
            self.idle -= 1
            if self.idle >= 0 or self.threads >= self.limit:
                return  # a waiting thread takes it, or every thread is busy: the first to finish does
            self.threads += 1
            self.idle += 1  # the new thread is for this call
        try:
            threading.Thread(target=self._work, name=f"lockkit-{self.name}", daemon=True).start()
        except RuntimeError as exc:  # out of threads: the call is answered with the error, never run later
            with self._mutex:
                self.threads -= 1
                self.idle -= 1  # the call stays queued (withdrawn): the thread that takes it adds this back
            call.fail(BackendUnavailable(f"lockkit could not start a worker thread ({exc}); retry later"))

    def _work(self) -> None:
        queue_, mutex = self._queue, self._mutex
        while True:
            try:
                call = queue_.get(timeout=self.idle_seconds)
            except queue.Empty:
                with mutex:
                    if queue_.empty():
                        self.idle -= 1
                        self.threads -= 1
                        return
                continue  # a call came just as we timed out: it counted on us
            if call is None:  # closed
                return
            try:
                call.run()
            except Exception:  # a failure of ours, not the call's (that one goes to its caller): keep the thread
                log.exception("lockkit: the offload adapter failed to hand a call's outcome back")
            del call
            with mutex:
                self.idle += 1

    def close(self) -> None:
        """Fail the queued calls, and end every thread once its call (if any) returns."""
        with self._mutex:
            self._closed = True
            pending: list[_Call] = []
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    pending.append(item)
            for _ in range(self.threads):
                self._queue.put(None)
        for call in pending:
            call.fail(
                BackendUnavailable(
                    "the locker was closed before this call ran; close the locker only after its calls finish"
                )
            )

    def after_fork(self) -> None:
        self._reset()  # the parent's threads do not exist here; a lock one of them held may be held for good


def _after_fork_in_child() -> None:
    for lane in list(_lanes):
        lane.after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class Offload:
    """The two lanes of one adapter and the two ways through them: :meth:`run` for a call that answers promptly,
    :meth:`wait` for an acquire (one that may block until granted, and whose grant a cancellation must give
    back). :class:`ThreadOffloadDriver` runs locks through one, :class:`lockkit.permits.OffloadPermits`
    permits through another."""

    def __init__(self, label: str, max_threads: int = MAX_OFFLOAD_THREADS) -> None:
        self._waits = _Lane(f"{label}-acquire", max_threads)
        self._calls = _Lane(label, MAX_CALL_THREADS)

    def run(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._calls.submit(_Call(fn, args, loop, future))
        return future

    async def wait(
        self, fn: Callable[..., T | None], args: tuple[Any, ...], stop: Cancel, give_back: Callable[[], object]
    ) -> T | None:
        """``fn(*args)`` in the acquire lane; ``stop`` is the Cancel among ``args`` that ends its wait, and
        ``give_back()`` (run in a worker, logged if it fails) releases what a cancelled call was granted."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T | None] = loop.create_future()
        call = _Call(fn, args, loop, future, lambda grant: self._give_back(grant, give_back))
        try:
            self._waits.submit(call)
            # Not shielded (a shield costs a future and a turn of the loop per call): a cancelled await
            # withdraws the call if no thread has started it (then nothing was sent); a started one runs on,
            # ``stop`` ends its wait, and its grant, if any, is released.
            return await future
        except asyncio.CancelledError:
            stop.cancel()
            try:
                call.start.pop()
            except IndexError:  # started: the worker answers for the grant, or has already answered
                # Made only now (an uncancelled call pays nothing for it), before the claim below: if the claim
                # is ours, the worker pops after us and reads ``finished`` after that, in its ``finally``.
                finished = call.finished = loop.create_future()
                try:
                    call.answer.pop()
                except IndexError:  # it answered (finished) already: its outcome is here to clean up
                    if call.error is None and call.result is not None:
                        try:
                            self._calls.submit(_Call(self._give_back, (call.result, give_back), None, None))
                        except BackendUnavailable:  # closed meanwhile: the cancellation still goes on
                            log.warning("lockkit: a cancelled acquire's grant was not released (the locker "
                                        "closed); it lapses at its ttl")  # fmt: skip
                else:
                    # Still running: ``stop`` ends its wait, it removes what it queued and gives back a grant
                    # that raced the cancel. Return after that, as docs/semantics.md promises ("removes whatever
                    # it queued before returning"), within CANCEL_WAIT; asyncio.wait neither cancels the future
                    # nor swallows a second cancellation of this task.
                    await asyncio.wait({finished}, timeout=CANCEL_WAIT)
            raise

    @staticmethod
    def _give_back(grant: object, give_back: Callable[[], object]) -> None:
        if grant is None:
            return
        try:
            give_back()
        except Exception:  # logged: the lock or permit then frees when its TTL passes
            log.warning("lockkit: could not give back what a cancelled acquire was granted", exc_info=True)

    def close(self) -> None:
        self._waits.close()
        self._calls.close()


class ThreadOffloadDriver:
    """Runs a blocking driver's calls in worker threads so an event loop never blocks."""

    guarantees: ClassVar[Guarantees]
    finish_inline: ClassVar[bool] = True
    """Its calls await a thread's answer and never cancel their own task: an asyncio release or renew runs in
    the caller's task until a cancellation arrives (``lockkit._async.cancel_safe``; issue 17)."""

    def __init__(self, driver: Driver, max_threads: int = MAX_OFFLOAD_THREADS) -> None:
        self.sync = driver
        self.guarantees = driver.guarantees  # type: ignore[misc]  # per instance: mirrors the wrapped class
        self._offload = Offload("offload", max_threads)
        self._run = self._offload.run

    async def acquire(
        self, name: str, token: str, ttl: float, deadline: float | None, cancel: Cancel | None = None
    ) -> Grant | None:
        # Our own signal, fired by the task's cancellation or by the caller's ``cancel``: cancelling the task
        # must not fire a Cancel the caller may share with other calls.
        stop = Cancel()
        unhook = cancel.on_cancel(stop.cancel) if cancel is not None else None
        try:
            args = (name, token, ttl, deadline, stop)
            return await self._offload.wait(self.sync.acquire, args, stop, lambda: self.sync.release(name, token))
        finally:
            if unhook is not None:
                unhook()

    async def renew(self, name: str, token: str, ttl: float) -> Grant | None:
        return await self._run(self.sync.renew, name, token, ttl)

    async def renew_many(self, requests: Sequence[RenewRequest]) -> list[Grant | Exception | None]:
        return await self._run(self.sync.renew_many, requests)

    async def release(self, name: str, token: str) -> bool:
        return await self._run(self.sync.release, name, token)

    async def holder(self, name: str) -> HolderInfo:
        return await self._run(self.sync.holder, name)

    async def force_release(self, name: str) -> bool:
        return await self._run(self.sync.force_release, name)

    async def ping(self) -> None:
        await self._run(self.sync.ping)

    async def close(self) -> None:
        try:
            await self._run(self.sync.close)
        finally:
            self._offload.close()
