"""Semaphores and reader-writer locks on one Redis server: :class:`AsyncRedisPermits`, written once.

This file is the source of the blocking :class:`RedisPermits` too: ``scripts/unasync.py`` generates
``../_sync/semaphore.py`` from it. The keys and scripts are documented in :mod:`..semaphore_scripts`. It rides
on its driver's connections, pub/sub hub and background (one set per driver, shared with its locks): a waiter
subscribes to the name's wake channel before it sleeps, looks again after every message and once at the next
holder's expiry, and a queued writer also refreshes its place well within its ttl.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ....driver import Cancel, Grant, PermitInfo, PermitMode, RenewRequest
from ....errors import BackendUnavailable
from ...embedded.permits import limit_mismatch
from ..calls import Call
from ..flow import checked, ms, recheck_after, waiter_id
from ..semaphore_scripts import (
    SEM_ACQUIRE,
    SEM_CLEAR,
    SEM_INFO,
    SEM_LEAVE,
    SEM_RELEASE,
    SEM_RENEW,
    PermitKeys,
    permit_keys,
)
from ..watch import AsyncWatcher, snapshots

if TYPE_CHECKING:
    from .single import AsyncRedisDriver

__all__ = ["AsyncRedisPermits"]


class AsyncRedisPermits:
    """The :class:`~lockkit.driver.AsyncPermitDriver` of one :class:`AsyncRedisDriver`."""

    def __init__(self, driver: AsyncRedisDriver) -> None:
        self._driver = driver
        self._label = driver.spec.label

    def _keys(self, name: str) -> PermitKeys:
        return permit_keys(self._driver.options.prefix, name)

    async def acquire_permit(
        self,
        name: str,
        token: str,
        ttl: float,
        deadline: float | None,
        limit: int,
        mode: PermitMode,
        cancel: Cancel | None = None,
    ) -> Grant | None:
        if cancel is not None and cancel.cancelled:
            return None
        driver, keys = self._driver, self._keys(name)
        hub = driver._hub
        hub.own_process()
        # A permit waiter queues under its waiter id, so that a release can grant it the permit directly on
        # its client's channel (as a lock's release does); readers and writers are woken on the name's channel.
        wid = waiter_id(hub.client_id, ttl, token) if mode == "permit" else ""
        targets = [(hub, keys.channel)] + ([(hub, hub.client_channel)] if wid else [])
        before = snapshots(targets)  # before the first attempt, so that a release in between is not missed
        listening = bool(wid) and before[1] is not None  # our client's channel is subscribed: queue at once

        def attempt() -> Call:
            return Call(SEM_ACQUIRE, keys.script_keys(), (token, ms(ttl), limit, mode, wid if listening else "",
                                                          keys.channel))  # fmt: skip

        watcher: AsyncWatcher | None = None
        queued_at: float | None = None
        try:
            while True:
                sent_at = driver.clock()
                (reply,) = await driver._run([attempt()], False)  # never retried: a lost reply is left by _leave
                status, value = checked(reply, self._label, "semaphore acquire")
                if status == 1:
                    # granted directly by a release: count from before the attempt that queued us
                    return Grant(int(value), ttl, sent_at if queued_at is None else min(sent_at, queued_at))
                if status == -2:
                    raise limit_mismatch(name, int(value), limit)
                if listening and queued_at is None:
                    queued_at = sent_at
                now = driver.clock()
                if (cancel is not None and cancel.cancelled) or (deadline is not None and now >= deadline):
                    await self._leave(name, token, wid)
                    return None
                if watcher is None:
                    watcher = driver._background.watcher(targets, cancel, wid or None, before)
                    await watcher.watch(True)
                    listening = bool(wid)
                    continue  # subscribed: look again (and queue) before sleeping, a release may have come between
                waits = [recheck_after(int(value), ttl) if int(value) >= 0 else None, ttl / 3]
                if deadline is not None:
                    waits.append(deadline - now)
                known = [w for w in waits if w is not None]
                # ttl/3: a queued waiter refreshes its place (writer or permit) long before it lapses
                outcome = await watcher.wait(max(0.0005, min(known)))
                if outcome == "cancelled":
                    await self._leave(name, token, wid)
                    return None
                if isinstance(outcome, int):  # a release granted us the permit: its fencing token
                    assert queued_at is not None
                    return Grant(outcome, ttl, queued_at)
        except BaseException:
            # An attempt or a release may have granted us a permit (its reply or message lost), or we are queued:
            # remove both now and pass the permit on.
            driver._background.clean_up(self._leave, name, token, wid)
            raise
        finally:
            if watcher is not None:
                watcher.close()

    async def _leave(self, name: str, token: str, wid: str = "") -> None:
        keys = self._keys(name)
        call = Call(SEM_LEAVE, keys.script_keys(), (token, keys.channel, wid, keys.clients))
        with contextlib.suppress(Exception):  # what is left lapses on its own (holder ttl, queued place)
            await self._driver._run([call], True)

    async def renew_permits(self, requests: Sequence[RenewRequest]) -> list[Grant | Exception | None]:
        sent_at = self._driver.clock()
        calls = [Call(SEM_RENEW, self._keys(r.name).script_keys(), (r.token, ms(r.ttl))) for r in requests]
        replies = await self._driver._run(calls, True)
        results: list[Grant | Exception | None] = []
        for request, reply in zip(requests, replies, strict=False):
            try:
                fence = int(checked(reply, self._label, "semaphore renew"))
            except BackendUnavailable as exc:
                results.append(exc)
                continue
            results.append(Grant(fence, request.ttl, sent_at) if fence >= 0 else None)
        return results

    async def release_permit(self, name: str, token: str) -> bool:
        keys = self._keys(name)
        # Not retried on a broken connection: a retry that found the permit gone could not tell a release that
        # ran from one that expired (the lock driver's _released explains); the error says the outcome is unknown.
        call = Call(SEM_RELEASE, keys.script_keys(), (token, keys.channel, keys.clients))
        (reply,) = await self._driver._run([call], False)
        return bool(checked(reply, self._label, "semaphore release"))

    async def permit_holders(self, name: str) -> PermitInfo:
        (reply,) = await self._driver._run([Call(SEM_INFO, self._keys(name).script_keys())], True)
        values = [int(x) for x in checked(reply, self._label, "semaphore info")]
        limit, holders, writes, waiting, fence, queued = values
        return PermitInfo(None if limit < 0 else limit, holders, bool(writes), waiting, fence or None, waiting + queued)

    async def force_release_permits(self, name: str) -> int:
        keys = self._keys(name)
        (reply,) = await self._driver._run([Call(SEM_CLEAR, keys.script_keys(), (keys.channel,))], True)
        return int(checked(reply, self._label, "semaphore force release"))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._label})"
