"""Waiters on the hubs' wake-ups (:mod:`.hub`): one per contended acquire, blocking or asyncio.

A watcher is made *before* the acquire's first attempt, so that its snapshot of the hubs predates it
(see :meth:`.hub.Hub.snapshot`). It wakes on a message for everyone (empty: look again) and on a
fair release's grant to its own waiter id (``"<waiter id> <fencing token>"``: the lock is ours); grants to
the client's other waiters are not for it. Redlock watchers have no waiter id and wake on every message.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Sequence

from ..._async.cancel_safe import wait_event
from ...driver import Cancel
from .hub import Hub, LoopThread, Snapshot

__all__ = ["AsyncWatcher", "SyncWatcher", "snapshots"]


def _grant(data: bytes, wid: bytes | None) -> int | None:
    """What a message means to waiter ``wid``: 0 = look again (for everyone), a fencing token = a grant to
    ``wid``, None = not for it."""
    if not data or wid is None:
        return 0
    named, _, fence = data.rpartition(b" ")  # the id ends with the token, which is opaque to the driver
    return int(fence) if named == wid and fence.isdigit() else None


def snapshots(targets: Sequence[tuple[Hub, bytes]]) -> list[Snapshot]:
    """What a watcher made later compares against: take it before the first attempt."""
    return [hub.snapshot(channel) for hub, channel in targets]


async def _subscribe(
    targets: Sequence[tuple[Hub, bytes]], before: list[Snapshot], wake: Callable[[bytes], None]
) -> bool:
    """Register ``wake`` on every target and wait for the server's confirmations; True if a message may have
    been missed since the snapshots (both faces: the blocking one runs this on its loop thread)."""
    missed = await asyncio.gather(
        *(hub.watch(channel, wake, seen) for (hub, channel), seen in zip(targets, before, strict=True))
    )
    return any(missed)


def _outcome(granted: int | None, woken: bool) -> str | int:
    return granted if granted is not None else "woken" if woken else "timeout"


class SyncWatcher:
    """One blocking waiter: wakes on a hub's message for it (or for everyone), a timeout, or a cancel.

    Its snapshot of the hubs must predate the first attempt: it is made before it, or given the
    :func:`snapshots` taken then (an uncontended acquire never needs the watcher itself).
    """

    def __init__(
        self,
        loop: LoopThread,
        targets: Sequence[tuple[Hub, bytes]],
        cancel: Cancel | None,
        wid: str | None = None,
        before: list[Snapshot] | None = None,
    ) -> None:
        self._loop, self._targets, self._cancel = loop, targets, cancel
        self._wid = None if wid is None else wid.encode()
        self._before = snapshots(targets) if before is None else before
        self._granted: int | None = None
        self._watching = False
        # The event and the cancel hook are made at the first watch or wait: an uncontended acquire
        # (the common case) never needs them, and they cost more than the snapshot.
        self._event: threading.Event | None = None
        self._unhook: Callable[[], None] | None = None

    def _armed(self) -> threading.Event:
        if self._event is None:
            self._event = threading.Event()
            if self._cancel is not None:
                self._unhook = self._cancel.on_cancel(self._event.set)
        return self._event

    def _message(self, data: bytes) -> None:
        event = self._event  # armed by watch() before the hub can call this
        if event is None:
            return
        meaning = _grant(data, self._wid)
        if meaning is not None:
            if meaning:
                self._granted = meaning
            event.set()

    def watch(self, confirm: bool = False) -> bool:
        """Subscribe without a round trip to the loop thread: the hub wakes us if we must look again.

        ``confirm``: wait until the server confirmed the subscriptions instead, and return whether a message
        may have been missed since the snapshot (the waiter then looks again before sleeping).
        """
        self._armed()
        self._watching = True
        if confirm:
            return self._confirmed()
        self._loop.call(self._watch_soon)  # one wake-up of the loop thread for all targets
        return False

    def _confirmed(self) -> bool:
        """Subscribe and wait for the server's confirmation, or for a cancel (then: look again, which sees it)."""
        future = asyncio.run_coroutine_threadsafe(
            _subscribe(self._targets, self._before, self._message), self._loop.loop()
        )
        done = threading.Event()
        future.add_done_callback(lambda _: done.set())
        unhook = None if self._cancel is None else self._cancel.on_cancel(done.set)
        try:
            done.wait()
        finally:
            if unhook is not None:
                unhook()
        if future.done() and not future.cancelled() and future.exception() is None:
            return future.result()
        return True

    def _watch_soon(self) -> None:
        for (hub, channel), before in zip(self._targets, self._before, strict=True):
            hub.watch_soon(channel, self._message, before)

    def wait(self, timeout: float | None) -> str | int:
        if self._cancel is not None and self._cancel.cancelled:
            return "cancelled"
        event = self._armed()
        if self._cancel is not None and self._cancel.cancelled:  # cancelled before the hook was in place
            return "cancelled"
        woken = event.wait(timeout)
        event.clear()
        if self._cancel is not None and self._cancel.cancelled:
            return "cancelled"
        granted, self._granted = self._granted, None
        return _outcome(granted, woken)

    def close(self) -> None:
        if self._unhook is not None:
            self._unhook()
        if self._watching:
            self._loop.call(self._unwatch)  # one wake-up of the loop thread for all targets

    def _unwatch(self) -> None:
        for hub, channel in self._targets:
            hub.unwatch(channel, self._message)


class AsyncWatcher:
    """One asyncio waiter: :class:`SyncWatcher`'s twin (the same arguments but the loop, the same outcomes).

    A cancel of the awaiting task arrives as CancelledError; a :class:`~lockkit.driver.Cancel` (set from
    any thread) or :meth:`interrupt` ends the current or next wait with ``"cancelled"``.
    """

    def __init__(
        self,
        targets: Sequence[tuple[Hub, bytes]],
        cancel: Cancel | None = None,
        wid: str | None = None,
        before: list[Snapshot] | None = None,
    ) -> None:
        self._targets, self._cancel = targets, cancel
        self._wid = None if wid is None else wid.encode()
        self._before = snapshots(targets) if before is None else before
        self._granted: int | None = None
        self._watching = False
        self._interrupted = False
        # Made at the first watch or wait, as in the blocking twin: most acquires never wait.
        self._event: asyncio.Event | None = None
        self._unhook: Callable[[], None] | None = None

    def _armed(self) -> asyncio.Event:
        if self._event is None:
            self._event = event = asyncio.Event()
            if self._cancel is not None:
                loop = asyncio.get_running_loop()

                def wake() -> None:  # the Cancel may be set from another thread
                    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                        loop.call_soon_threadsafe(event.set)

                self._unhook = self._cancel.on_cancel(wake)
        return self._event

    def _stopped(self) -> bool:
        return self._interrupted or (self._cancel is not None and self._cancel.cancelled)

    def _message(self, data: bytes) -> None:
        event = self._event  # armed by watch() before the hub can call this
        if event is None:
            return
        meaning = _grant(data, self._wid)
        if meaning is not None:
            if meaning:
                self._granted = meaning
            event.set()

    async def watch(self, confirm: bool = True) -> bool:
        """Subscribe and wait for the server's confirmation, whatever ``confirm`` says (awaiting it costs no
        thread hop here); True if a message may have been missed since the snapshot."""
        self._armed()
        self._watching = True
        return await _subscribe(self._targets, self._before, self._message)

    async def wait(self, timeout: float | None) -> str | int:
        if self._stopped():
            return "cancelled"
        event = self._armed()
        woken = await wait_event(event, timeout)
        event.clear()
        if self._stopped():
            return "cancelled"
        granted, self._granted = self._granted, None
        return _outcome(granted, woken)

    def interrupt(self) -> None:
        """End the current or next wait with ``"cancelled"`` (for a shielded acquire whose caller gave up)."""
        self._interrupted = True
        if self._event is not None:
            self._event.set()

    def close(self) -> None:
        if self._unhook is not None:
            self._unhook()
        if self._watching:
            for hub, channel in self._targets:
                hub.unwatch(channel, self._message)
