"""Semaphores and reader-writer locks on one Redis server: :class:`AsyncRedisPermits`, written once.

This file is the source of the blocking :class:`RedisPermits` too: ``scripts/unasync.py`` generates
``../_sync/semaphore.py`` from it. The keys and scripts are documented in :mod:`..semaphore_scripts`. It rides
on its driver's connections, pub/sub hub and background (one set per driver, shared with its locks): a waiter
subscribes to the name's wake channel before it sleeps, looks again after every message and once at the next
holder's expiry, and a queued writer also refreshes its place well within its ttl.

The Sentinel and Cluster drivers subclass it (in ``sentinel.py`` and ``cluster.py``): they change where a call
runs (:meth:`AsyncRedisPermits._send`, which also names the config epoch of the master that ran it: fences are
lifted by it), the scripts and keys (sharded pub/sub on a cluster), and may confirm a grant told by a
release's message with one more attempt, whose reply carries the epoch (:meth:`AsyncRedisPermits._by_message`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from ....driver import Cancel, Grant, PermitInfo, PermitMode, RenewRequest
from ....errors import BackendUnavailable
from ...embedded.permits import limit_mismatch
from ...epoch import composite_token
from ..calls import Call
from ..flow import checked, ms, recheck_after, waiter_id
from ..semaphore_scripts import PLAIN_SCRIPTS, PermitKeys, PermitScripts, permit_keys
from ..watch import AsyncWatcher, snapshots
from .single import ATTEMPT_WAIT

if TYPE_CHECKING:
    from .single import AsyncRedisDriver

__all__ = ["AsyncRedisPermits"]


class AsyncRedisPermits:
    """The :class:`~lockkit.driver.AsyncPermitDriver` of one :class:`AsyncRedisDriver`."""

    scripts: ClassVar[PermitScripts] = PLAIN_SCRIPTS

    def __init__(self, driver: AsyncRedisDriver) -> None:
        self._driver = driver
        self._label = driver.spec.label

    def _keys(self, name: str) -> PermitKeys:
        return permit_keys(self._driver.options.prefix, name)

    async def _send(
        self, calls: Sequence[Call], idempotent: bool, by: float | None = None
    ) -> tuple[list[Any], int, bool]:
        """The replies of ``calls``, the config epoch of the master that ran them (0: none, fences as they are)
        and whether they may have run twice (sent again after their connection broke under them). ``by``: a
        monotonic instant the replies must come by, if sooner than the node's ``timeout`` (an attempt's)."""
        return await self._driver._run(calls, idempotent, by), 0, False

    async def _renew_replies(self, calls: Sequence[Call]) -> list[tuple[Any, int] | BackendUnavailable]:
        """Each renewal's reply with its master's epoch (one pipeline here; per master on a cluster)."""
        replies, epoch, _ = await self._send(calls, True)
        return [(reply, epoch) for reply in replies]

    @staticmethod
    def _lift(epoch: int, fence: int) -> int:
        return composite_token(epoch, fence) if epoch else fence

    async def _mark(self) -> Any:
        """What :meth:`_by_message` needs to know of the time the acquire began (nothing here)."""
        return None

    def _by_message(self, mark: Any, fence: int) -> int | None:
        """The fencing token of a grant told by a release's message, or None: confirm it with one more attempt
        (it finds the token and returns its fence, with its master's epoch). Here: the message's fence as it is."""
        return fence

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
        mark = await self._mark()
        # A permit waiter queues under its waiter id, so that a release can grant it the permit directly on
        # its client's channel (as a lock's release does); readers and writers are woken on the name's channel.
        # The client's channel: <prefix>client:<id> (the hub's own), in the name's slot on a cluster.
        wid = waiter_id(hub.client_id, ttl, token) if mode == "permit" else ""
        targets = [(hub, keys.channel)] + ([(hub, keys.clients + hub.client_id.encode())] if wid else [])
        before = snapshots(targets)  # before the first attempt, so that a release in between is not missed
        listening = bool(wid) and before[1] is not None  # our client's channel is subscribed: queue at once
        replicas = driver.options.min_replicas
        wait_for = (Call(None, (), ("WAIT", replicas, ms(driver.options.replica_timeout))),) if replicas else ()

        def attempt() -> list[Call]:
            args = (token, ms(ttl), limit, mode, wid if listening else "", keys.channel)
            return [Call(self.scripts.acquire, keys.script_keys(), args), *wait_for]

        watcher: AsyncWatcher | None = None
        queued_at: float | None = None
        try:
            while True:
                sent_at = driver.clock()
                # As a lock's attempt (single.py): its reply is awaited until the deadline (at least ATTEMPT_WAIT),
                # if sooner than the node's timeout, so that acquire(timeout=T) reports a silent server by about T
                by = None if deadline is None else time.monotonic() + max(deadline - sent_at, ATTEMPT_WAIT)
                # redis:// never sends it again (a lost reply is left by _leave); Sentinel and Cluster may, on the
                # next master: the script finds its own token and returns its grant, never a second one
                replies, epoch, _ = await self._send(attempt(), False, by)
                status, value = checked(replies[0], self._label, "semaphore acquire")
                if status == 1:
                    if replicas and not (isinstance(replies[1], int) and replies[1] >= replicas):
                        await self._leave(name, token, wid)
                        raise BackendUnavailable(
                            f"redis {self._label}: only {replies[1]} of the {replicas} replicas required by "
                            f"min_replicas acknowledged the permit of {name!r} within replica_timeout; it was "
                            "released again. Retry, check the replicas' link (INFO replication), or raise "
                            "replica_timeout"
                        )
                    # granted (perhaps by a release, found here): count from before the attempt that queued us
                    since = sent_at if queued_at is None else min(sent_at, queued_at)
                    return Grant(self._lift(epoch, int(value)), ttl, since)
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
                    fence = None if replicas else self._by_message(mark, outcome)
                    if fence is None:
                        continue  # the next attempt finds our token: its reply names the epoch (and WAITs)
                    return Grant(fence, ttl, queued_at)
        except BaseException as exc:
            # An attempt or a release may have granted us a permit (its reply or message lost), or we are queued:
            # remove both now and pass the permit on. After an error (a silent server, most often) the blocking
            # face does it in the background, so that the caller hears of the error by its deadline, as a lock's
            # acquire does (single.py); after an interrupt, in the caller's thread.
            background = driver._background
            clean_up = background.clean_up_later if isinstance(exc, Exception) else background.clean_up
            clean_up(self._leave, name, token, wid)
            raise
        finally:
            if watcher is not None:
                watcher.close()

    async def _leave(self, name: str, token: str, wid: str = "") -> None:
        keys = self._keys(name)
        call = Call(self.scripts.leave, keys.script_keys(), (token, keys.channel, wid, keys.clients))
        with contextlib.suppress(Exception):  # what is left lapses on its own (holder ttl, queued place)
            await self._send([call], True)

    async def renew_permits(self, requests: Sequence[RenewRequest]) -> list[Grant | Exception | None]:
        sent_at = self._driver.clock()
        renew = self.scripts.renew
        calls = [Call(renew, self._keys(r.name).renew_keys(), (r.token, ms(r.ttl))) for r in requests]
        results: list[Grant | Exception | None] = []
        for request, got in zip(requests, await self._renew_replies(calls), strict=True):
            if isinstance(got, BackendUnavailable):
                results.append(got)
                continue
            reply, epoch = got
            try:
                fence = int(checked(reply, self._label, "semaphore renew"))
            except BackendUnavailable as exc:
                results.append(exc)
                continue
            # -1: not ours any more (it lapsed, was dropped, or the promoted master never received it): a loss
            results.append(Grant(self._lift(epoch, fence), request.ttl, sent_at) if fence >= 0 else None)
        return results

    async def release_permit(self, name: str, token: str) -> bool:
        keys = self._keys(name)
        # redis:// does not send it again on a broken connection (the error says the outcome is unknown); Sentinel
        # and Cluster do, and a retry that finds the permit gone cannot tell a release that ran from one that
        # lapsed (the lock driver's _released explains): that is an unknown outcome too, not a loss.
        call = Call(self.scripts.release, keys.script_keys(), (token, keys.channel, keys.clients))
        (reply,), _, repeated = await self._send([call], False)
        if checked(reply, self._label, "semaphore release"):
            return True
        if repeated:  # Sentinel, Cluster: sent again after the connection broke; "not ours" proves nothing
            raise BackendUnavailable(
                f"redis {self._label}: the connection broke after the release of a permit of {name!r} was sent, "
                "and the retry found it no longer ours: most likely the first attempt released it, else it had "
                "lapsed. This client does not hold it either way; do not retry the release"
            )
        return False

    async def permit_holders(self, name: str) -> PermitInfo:
        (reply,), epoch, _ = await self._send([Call(self.scripts.info, self._keys(name).script_keys())], True)
        values = [int(x) for x in checked(reply, self._label, "semaphore info")]
        limit, holders, writes, waiting, fence, queued = values
        last = self._lift(epoch, fence) if fence else None
        return PermitInfo(None if limit < 0 else limit, holders, bool(writes), waiting, last, waiting + queued)

    async def force_release_permits(self, name: str) -> int:
        keys = self._keys(name)
        (reply,), _, _ = await self._send([Call(self.scripts.clear, keys.script_keys(), (keys.channel,))], True)
        return int(checked(reply, self._label, "semaphore force release"))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._label})"
