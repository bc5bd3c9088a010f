"""``memory://[space]``: a lock shared by the threads and asyncio tasks of one process.

Every locker that opens the same space (``memory://`` is the space ``""``)
shares its locks. It keeps the whole contract, fencing tokens and expiry
included, so that an application's tests can run against it without a server.
Waiters sleep on a condition variable of their lock name, woken by release
and re-checking once at the holder's expiry. Asyncio tasks wait in threads
(see :mod:`lockkit.offload`).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from ...driver import (
    Cancel,
    DriverContext,
    Grant,
    Guarantees,
    HolderInfo,
    Offer,
    PermitInfo,
    PermitMode,
    RenewRequest,
    renew_each,
)
from ...errors import ConfigError
from ...lease import token_hint
from ...urls import BackendURL, parse_options
from .permits import PermitTable
from .slot import Slot


class _Space:
    def __init__(self) -> None:
        self.mutex = threading.Lock()
        self.slots: dict[str, Slot] = {}
        self.conditions: dict[str, threading.Condition] = {}
        self.waiting: dict[str, int] = {}
        self.presence: dict[str, dict[str, tuple[str, float | None]]] = {}
        # semaphores and reader-writer locks: their own key space (a lock and a semaphore of one name are unrelated)
        self.permits: dict[str, PermitTable] = {}
        self.permit_conditions: dict[str, threading.Condition] = {}
        self.permit_waiting: dict[str, int] = {}

    def permit_condition(self, name: str) -> threading.Condition:
        found = self.permit_conditions.get(name)
        if found is None:
            found = self.permit_conditions[name] = threading.Condition(self.mutex)
        return found

    def condition(self, name: str) -> threading.Condition:
        found = self.conditions.get(name)
        if found is None:
            found = self.conditions[name] = threading.Condition(self.mutex)
        return found


_spaces: dict[str, _Space] = {}
_spaces_guard = threading.Lock()


def _space(name: str) -> _Space:
    with _spaces_guard:
        found = _spaces.get(name)
        if found is None:
            found = _spaces[name] = _Space()
        return found


@dataclass(frozen=True)
class _NoOptions:
    """memory:// takes no options."""


class MemoryDriver:
    guarantees: ClassVar[Guarantees] = Guarantees(
        scope="process",
        fifo=False,
        fencing="strict",
        survives_failover=False,
        lifetime="ttl",
        note="Only threads and tasks of one process; for tests and single-process tools.",
        semaphores=Offer("yes"),
    )

    def __init__(self, space: str, ctx: DriverContext) -> None:
        self._space = _space(space)
        self._clock = ctx.clock

    @classmethod
    def from_url(cls, url: BackendURL, ctx: DriverContext) -> MemoryDriver:
        if url.username or url.password or len(url.hosts) > 1 or (url.hosts and url.hosts[0][1] is not None):
            raise ConfigError(f"memory:// takes only an optional space name, e.g. memory://tests, not {url}")
        parse_options(_NoOptions, url.options, url)
        space = (url.hosts[0][0] if url.hosts else "") + url.path
        return cls(space, ctx)

    def acquire(
        self, name: str, token: str, ttl: float, deadline: float | None, cancel: Cancel | None = None
    ) -> Grant | None:
        space = self._space
        condition = space.condition(name)
        unhook = cancel.on_cancel(lambda: self._notify(name)) if cancel else None
        try:
            with space.mutex:
                slot = space.slots.setdefault(name, Slot())
                space.waiting[name] = space.waiting.get(name, 0) + 1
                try:
                    while True:
                        sent_at = self._clock()
                        fence = slot.take(token, ttl, sent_at)
                        if fence is not None:
                            return Grant(fence, ttl, sent_at)
                        if cancel is not None and cancel.cancelled:
                            return None
                        now = self._clock()
                        if deadline is not None and now >= deadline:
                            return None
                        waits = [
                            w
                            for w in (slot.wait_hint(now), None if deadline is None else deadline - now)
                            if w is not None
                        ]
                        condition.wait(min(waits) if waits else None)
                finally:
                    space.waiting[name] -= 1
        finally:
            if unhook:
                unhook()

    def _notify(self, name: str) -> None:
        with self._space.mutex:
            self._space.condition(name).notify_all()

    def renew(self, name: str, token: str, ttl: float) -> Grant | None:
        with self._space.mutex:
            slot = self._space.slots.get(name)
            sent_at = self._clock()
            if slot is None or not slot.renew(token, ttl, sent_at):
                return None
            return Grant(slot.fence, ttl, sent_at)

    def renew_many(self, requests: Sequence[RenewRequest]) -> list[Grant | Exception | None]:
        return renew_each(self, requests)

    def _release(self, name: str, token: str | None) -> bool:
        with self._space.mutex:
            slot = self._space.slots.get(name)
            if slot is None or not slot.release(token, self._clock()):
                return False
            self._space.condition(name).notify_all()
            return True

    def release(self, name: str, token: str) -> bool:
        return self._release(name, token)

    def force_release(self, name: str) -> bool:
        return self._release(name, None)

    def holder(self, name: str) -> HolderInfo:
        with self._space.mutex:
            slot = self._space.slots.get(name)
            now = self._clock()
            token = slot.holder(now) if slot else None
            waiters = self._space.waiting.get(name, 0)
            if slot is None or token is None:
                return HolderInfo(False, waiters=waiters)
            return HolderInfo(True, token_hint(token), slot.fence, slot.expires - now, waiters)

    def announce(self, group: str, member: str, value: str, ttl: float | None) -> None:
        expires = None if ttl is None else self._clock() + ttl
        with self._space.mutex:
            self._space.presence.setdefault(group, {})[member] = (value, expires)

    def withdraw(self, group: str, member: str) -> None:
        with self._space.mutex:
            self._space.presence.get(group, {}).pop(member, None)

    def members(self, group: str) -> dict[str, str]:
        now = self._clock()
        with self._space.mutex:
            records = self._space.presence.get(group, {})
            return {m: v for m, (v, exp) in records.items() if exp is None or exp > now}

    # -- semaphores and reader-writer locks (lockkit.driver.PermitDriver) ---------------------------

    def permits(self, events: object = None) -> MemoryDriver:
        return self

    def acquire_permit(
        self,
        name: str,
        token: str,
        ttl: float,
        deadline: float | None,
        limit: int,
        mode: PermitMode,
        cancel: Cancel | None = None,
    ) -> Grant | None:
        space = self._space
        condition = space.permit_condition(name)
        unhook = cancel.on_cancel(lambda: self._notify_permits(name)) if cancel else None
        try:
            with space.mutex:
                table = space.permits.setdefault(name, PermitTable())
                space.permit_waiting[name] = space.permit_waiting.get(name, 0) + 1
                try:
                    while True:
                        sent_at = self._clock()
                        fence = table.take(name, token, ttl, sent_at, limit, mode)
                        if fence is not None:
                            return Grant(fence, ttl, sent_at)
                        now = self._clock()
                        if (cancel is not None and cancel.cancelled) or (deadline is not None and now >= deadline):
                            table.leave(token, now)
                            condition.notify_all()  # readers held back by this writer may go now
                            return None
                        # A queued writer refreshes its place well within its ttl; the one re-check otherwise is
                        # at the next holder's expiry.
                        waits = [table.wait_hint(now), None if deadline is None else deadline - now]
                        if mode == "write":
                            waits.append(ttl / 3)
                        known = [w for w in waits if w is not None]
                        condition.wait(max(0.0005, min(known)) if known else None)
                finally:
                    space.permit_waiting[name] -= 1
        finally:
            if unhook:
                unhook()

    def _notify_permits(self, name: str) -> None:
        with self._space.mutex:
            self._space.permit_condition(name).notify_all()

    def renew_permits(self, requests: Sequence[RenewRequest]) -> list[Grant | Exception | None]:
        results: list[Grant | Exception | None] = []
        with self._space.mutex:
            for request in requests:
                table = self._space.permits.get(request.name)
                sent_at = self._clock()
                if table is None or not table.renew(request.token, request.ttl, sent_at):
                    results.append(None)
                else:
                    results.append(Grant(table.fence, request.ttl, sent_at))
        return results

    def release_permit(self, name: str, token: str) -> bool:
        with self._space.mutex:
            table = self._space.permits.get(name)
            if table is None or not table.release(token, self._clock()):
                return False
            self._space.permit_condition(name).notify_all()
            return True

    def force_release_permits(self, name: str) -> int:
        with self._space.mutex:
            table = self._space.permits.get(name)
            count = 0 if table is None else table.clear(self._clock())
            self._space.permit_condition(name).notify_all()
            return count

    def permit_holders(self, name: str) -> PermitInfo:
        with self._space.mutex:
            table = self._space.permits.get(name) or PermitTable()
            table.prune(self._clock())
            return PermitInfo(
                table.limit,
                len(table.holders),
                table.writer_holds(),
                len(table.writers),
                table.fence or None,
                self._space.permit_waiting.get(name, 0),
            )

    def ping(self) -> None:
        pass

    def close(self) -> None:
        pass
