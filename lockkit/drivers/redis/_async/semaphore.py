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
from ..flow import checked, ms, recheck_after
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
        targets = [(hub, keys.channel)]
        before = snapshots(targets)  # before the first attempt, so that a release in between is not missed
        call = Call(SEM_ACQUIRE, keys.script_keys(), (token, ms(ttl), limit, mode))
        watcher: AsyncWatcher | None = None
        try:
            while True:
                sent_at = driver.clock()
                (reply,) = await driver._run([call], False)  # never retried: a lost reply is left by _leave
                status, value = checked(reply, self._label, "semaphore acquire")
                if status == 1:
                    return Grant(int(value), ttl, sent_at)
                if status == -2:
                    raise limit_mismatch(name, int(value), limit)
                now = driver.clock()
                if (cancel is not None and cancel.cancelled) or (deadline is not None and now >= deadline):
                    await self._leave(name, token)
                    return None
                if watcher is None:
                    watcher = driver._background.watcher(targets, cancel, None, before)
                    await watcher.watch(True)
                    continue  # subscribed: look again before sleeping, a release may have come between
                waits = [recheck_after(int(value), ttl) if int(value) >= 0 else None]
                if deadline is not None:
                    waits.append(deadline - now)
                if mode == "write":
                    waits.append(ttl / 3)  # refresh the queued place long before it lapses
                known = [w for w in waits if w is not None]
                outcome = await watcher.wait(max(0.0005, min(known)) if known else None)
                if outcome == "cancelled":
                    await self._leave(name, token)
                    return None
        except BaseException:
            # An attempt may have been granted (its reply lost) or the writer may be queued: remove both now.
            driver._background.clean_up(self._leave, name, token)
            raise
        finally:
            if watcher is not None:
                watcher.close()

    async def _leave(self, name: str, token: str) -> None:
        keys = self._keys(name)
        with contextlib.suppress(Exception):  # what is left lapses on its own (holder ttl, queued place)
            await self._driver._run([Call(SEM_LEAVE, keys.script_keys(), (token, keys.channel))], True)

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
        (reply,) = await self._driver._run([Call(SEM_RELEASE, keys.script_keys(), (token, keys.channel))], False)
        return bool(checked(reply, self._label, "semaphore release"))

    async def permit_holders(self, name: str) -> PermitInfo:
        (reply,) = await self._driver._run([Call(SEM_INFO, self._keys(name).script_keys())], True)
        limit, holders, writes, waiting, fence = (int(x) for x in checked(reply, self._label, "semaphore info"))
        return PermitInfo(None if limit < 0 else limit, holders, bool(writes), waiting, fence or None, None)

    async def force_release_permits(self, name: str) -> int:
        keys = self._keys(name)
        (reply,) = await self._driver._run([Call(SEM_CLEAR, keys.script_keys(), (keys.channel,))], True)
        return int(checked(reply, self._label, "semaphore force release"))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._label})"
