"""The acquire loops of both Redis drivers, written once as I/O-free generators.

A flow yields *operations* and receives their results; a face (blocking or
asyncio) performs them. So the retry, waiting and quorum logic exists once and
the two faces cannot drift apart (the approach of httpcore and h11, minus code
generation). Operations:

* :class:`Send` — run these calls (one server: its replies; Redlock: a
  :class:`~._redis_quorum.NodeResult` per master, sent to all in parallel);
* :class:`Watch` — subscribe to the lock's wake-up channel (returns once the
  server confirmed, so no release can slip between the next attempt and the wait);
* :class:`Wait` — sleep until a wake-up, the timeout, or a cancel: returns
  ``"woken"``, ``"timeout"`` or ``"cancelled"``.

Waiting is woken by the release's PUBLISH; the only timer is one re-check at
the holder's remaining TTL (returned by the failed acquire itself, so it costs
no extra round trip) plus random jitter, so contenders that lost a race do not
all retry at the same instant.
"""

from __future__ import annotations

import math
import random
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from redis.exceptions import ResponseError

from ..driver import Grant
from ..errors import BackendUnavailable
from ..timing import Clock
from ._redis_keys import LockKeys
from ._redis_node import Call
from ._redis_quorum import NodeResult, quorum, tally_acquire
from ._redis_scripts import ACQUIRE, RELEASE

__all__ = ["Send", "Wait", "Watch", "acquire_flow", "adrive", "drive", "redlock_acquire_flow"]

R = TypeVar("R")
Outcome = Literal["woken", "timeout", "cancelled"]


@dataclass(frozen=True)
class Send:
    calls: tuple[Call, ...]
    idempotent: bool


@dataclass(frozen=True)
class Watch:
    pass


@dataclass(frozen=True)
class Wait:
    timeout: float | None


Op = Send | Watch | Wait
Flow = Generator[Op, Any, R]
_rng = random.SystemRandom()


def ms(seconds: float) -> int:
    """Seconds → whole milliseconds, rounded up so the server never holds for less than asked."""
    return max(1, math.ceil(seconds * 1000 - 1e-9))


def checked(reply: Any, label: str, what: str) -> Any:
    if isinstance(reply, ResponseError):
        raise BackendUnavailable(f"redis {label} refused the {what} script: {reply}; check the user's ACL")
    return reply


def recheck_after(pttl_ms: int, ttl: float) -> float:
    """When to look again if no wake-up comes: at the holder's expiry, plus jitter."""
    # pttl -1: a key without expiry (not ours): look again after a TTL
    base = ttl if pttl_ms == -1 else max(0.0, pttl_ms / 1000)
    return base + _rng.uniform(0.0005, 0.0005 + min(0.05, 0.1 * base))


def _left(clock: Clock, deadline: float | None) -> float | None:
    return None if deadline is None else deadline - clock()


def acquire_flow(
    keys: LockKeys,
    token: str,
    ttl: float,
    deadline: float | None,
    clock: Clock,
    label: str,
    min_replicas: int = 0,
    replica_timeout: float = 0.1,
) -> Flow[Grant | None]:
    calls: tuple[Call, ...] = (Call(ACQUIRE, (keys.lock, keys.fence), (token, ms(ttl))),)
    if min_replicas:
        calls += (Call(None, (), ("WAIT", min_replicas, ms(replica_timeout))),)
    watching = False
    while True:
        sent_at = clock()
        replies = yield Send(calls, False)
        taken, value = checked(replies[0], label, "acquire")
        if taken:
            if min_replicas and not (isinstance(replies[1], int) and replies[1] >= min_replicas):
                yield Send((Call(RELEASE, (keys.lock,), (token, keys.channel)),), True)
                raise BackendUnavailable(
                    f"redis {label}: only {replies[1]} of the {min_replicas} replicas required by min_replicas "
                    "acknowledged the lock within replica_timeout; the lock was released again"
                )
            return Grant(int(value), ttl, sent_at)
        left = _left(clock, deadline)
        if left is not None and left <= 0:
            return None
        if not watching:
            yield Watch()
            watching = True
            continue  # a release may have come before the subscription: try again before sleeping
        wait = recheck_after(int(value), ttl)
        if (yield Wait(wait if left is None else min(wait, left))) == "cancelled":
            return None


def redlock_acquire_flow(
    keys: LockKeys,
    token: str,
    ttl: float,
    deadline: float | None,
    clock: Clock,
    masters: int,
    retry_delay: float,
) -> Flow[tuple[Grant, tuple[int | None, ...]] | None]:
    take = (Call(ACQUIRE, (keys.lock,), (token, ms(ttl))),)
    undo = (Call(RELEASE, (keys.lock,), (token, keys.channel)),)
    need = quorum(masters)
    watching = False
    while True:
        sent_at = clock()
        results: list[NodeResult] = yield Send(take, False)
        tally = tally_acquire(results, ttl, clock() - sent_at)
        if tally.granted:
            return Grant(0, ttl, sent_at), tally.epochs
        yield Send(undo, True)  # on *all* masters: a timed-out one may have applied the SET
        if tally.reached < need:
            raise BackendUnavailable(
                f"redlock reached {tally.reached} of {masters} masters but needs {need}; "
                "the partial locks were removed. Check that a majority of the masters is up"
            )
        left = _left(clock, deadline)
        if left is not None and left <= 0:
            return None
        if tally.free_in <= 0:  # nobody holds a quorum (a split vote): retry after a random delay
            wait = _rng.uniform(0, retry_delay)
        elif not watching:
            yield Watch()
            watching = True
            continue
        else:
            wait = tally.free_in + _rng.uniform(0.0005, 0.0005 + min(0.05, 0.1 * tally.free_in))
        if (yield Wait(wait if left is None else min(wait, left))) == "cancelled":
            return None


def drive(flow: Flow[R], perform: Callable[[Op], Any]) -> R:
    """Run a flow with blocking I/O."""
    try:
        result: Any = None
        while True:
            try:
                op = flow.send(result)
            except StopIteration as stop:
                value: R = stop.value
                return value
            result = perform(op)
    finally:
        flow.close()


async def adrive(flow: Flow[R], perform: Callable[[Op], Awaitable[Any]]) -> R:
    """Run a flow on the event loop."""
    try:
        result: Any = None
        while True:
            try:
                op = flow.send(result)
            except StopIteration as stop:
                value: R = stop.value
                return value
            result = await perform(op)
    finally:
        flow.close()
