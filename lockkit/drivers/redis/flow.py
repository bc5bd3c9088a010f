"""The acquire loops of both Redis drivers, written once as I/O-free generators.

A flow yields *operations* and receives their results; a face (blocking or
asyncio) performs them. So the retry, waiting and quorum logic exists once and
the two faces cannot drift apart (the approach of h11; the runner, :func:`._async.drive.adrive`,
is written once too and its blocking twin generated). Operations:

* :class:`Send` — run these calls (one server: its replies; Redlock: a
  :class:`~.quorum.NodeResult` per master, sent to all in parallel);
* :class:`Watch` — subscribe to the lock's (and the client's) wake-up channel; returns ``True``
  if the flow must try again before sleeping (a release may have slipped in
  before the subscription was confirmed), ``False`` if it may sleep at once:
  the subscription was live and silent since before the last attempt, or (the
  blocking face, which does not wait for the pub/sub thread) the hub will wake
  the waiter itself once the subscription is confirmed if anything was missed;
* :class:`Wait` — sleep until a wake-up, the timeout, or a cancel: returns
  ``"woken"`` (look again), ``"timeout"``, ``"cancelled"``, or an ``int``: a
  release granted the lock to this waiter, and this is its fencing token.

Waiting is woken by the release's PUBLISH; the only timer is one re-check at
the holder's remaining TTL (returned by the failed acquire itself, so it costs
no extra round trip) plus random jitter, so contenders that lost a race do not
all retry at the same instant.

The single-node flow is *fair* (FIFO): a blocking acquire joins the lock's
waiter queue in the same script that found the lock taken, a release grants the
lock to the first live waiter and tells only that waiter (see the fair scripts
in :mod:`.scripts`), so the hand-off costs the waiter no round trip, and
a waiter that gives up leaves the queue (passing on a grant that reached it too
late). A one-shot attempt (deadline already past) never queues. Redlock stays
unqueued: per-master queues could disagree on the head and split the vote; a releaser that woke another
client's waiter pauses its next attempt instead (the ``pause`` of :func:`redlock_acquire_flow`).

A granted waiter counts its validity from before its *first* attempt: the
release set the key's TTL after that attempt queued it, so the server's expiry
is later than what the waiter assumes. A waiter that waited so long that less
than two thirds of its TTL would be left (or that must WAIT for replicas)
confirms with one more attempt instead, which finds its token and extends it.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from redis.exceptions import NoPermissionError, OutOfMemoryError, ResponseError

from ...driver import Grant, HolderInfo
from ...errors import BackendUnavailable
from ...lease import token_hint
from ...timing import Clock
from ..epoch import composite_token
from .calls import Call, bulks, script_head
from .keys import LockKeys
from .quorum import FirstAttempt, NodeResult, free_in, quorum, tally_acquire
from .scripts import (
    FAIR_ACQUIRE,
    FAIR_FORCE_RELEASE,
    FAIR_RELEASE,
    LEAVE,
    RELEASE,
    SHARDED_FAIR_FORCE_RELEASE,
    SHARDED_FAIR_RELEASE,
    SHARDED_LEAVE,
)

__all__ = [
    "WAITER_ID", "YIELD_MIN", "YIELD_ROUNDS", "Flow", "Op", "Send", "Wait", "Watch", "acquire_flow", "leave_call",
    "redlock_acquire_flow", "release_call", "waiter_id",
]  # fmt: skip

MARGIN_MS = 250
"""How long a waiter's queue entry outlives the holder's expiry (its re-check then refreshes it)."""
GRANT_FRESH = 1 / 3
"""A granted waiter that waited longer than this part of its TTL confirms with a round trip (see above)."""
MAX_QUEUE = 1000
"""Waiters beyond this many per lock are not queued: they re-check at the holder's expiry, unordered."""

SPLIT_SPREAD = 3
"""Redlock: after a split vote, retry within this many of the failed attempt's round trips (at most
retry_delay): contenders a round trip apart do not split again."""

YIELD_ROUNDS = 4
"""Redlock: a release that woke another client's waiter keeps this client's next acquire of that lock (if it
comes at once) off the masters for this many of the release's round trips (at least YIELD_MIN, at most
retry_delay), so that the woken waiter, which needs a thread wake-up and a round trip of its own, gets the
lock instead of the releaser that is already running (see docs/backends/redis.md, "Fairness")."""
YIELD_MIN = 0.001

R = TypeVar("R")
Outcome = Literal["woken", "timeout", "cancelled"] | int
"""How a :class:`Wait` ended; an ``int`` is the fencing token of a grant made to this waiter by a release."""


@dataclass(frozen=True)
class Send:
    calls: tuple[Call, ...]
    idempotent: bool
    quiet: bool = False
    """Best-effort cleanup: a failure is ignored (what it would remove expires on its own)."""


@dataclass(frozen=True)
class Watch:
    confirm: bool = False
    """Return only once the server confirmed the subscriptions (the asyncio face always does)."""


@dataclass(frozen=True)
class Wait:
    timeout: float | None


Op = Send | Watch | Wait
Flow = Generator[Op, Any, R]
_rng = random.SystemRandom()


def ms(seconds: float) -> int:
    """Seconds → whole milliseconds, rounded up so the server never holds for less than asked."""
    return max(1, math.ceil(seconds * 1000 - 1e-9))


def holder_info(reply: Any, epoch: int | None = None) -> HolderInfo:
    """The ``FAIR_HOLDER`` script's reply ``[token, pttl, fence, waiters]`` as a :class:`HolderInfo`; with
    ``epoch`` (Sentinel, Cluster: the replying master's) the fence lifted to ``epoch << 48 | fence``."""
    token, pttl, fence, waiters = reply
    if token is None:
        return HolderInfo(False, waiters=waiters)
    ttl_left = pttl / 1000 if pttl >= 0 else None
    fencing = int(fence) if fence else None
    if fencing is not None and epoch is not None:
        fencing = composite_token(epoch, fencing)
    return HolderInfo(True, token_hint(token.decode()), fencing, ttl_left, waiters)


def checked(reply: Any, label: str, what: str) -> Any:
    if isinstance(reply, ResponseError):
        raise BackendUnavailable(f"redis {label} refused the {what} script: {reply}; {refusal_advice(reply)}")
    return reply


def refusal_advice(reply: ResponseError) -> str:
    """What to do about a script the server refused, by its error: the advice for a full server is not an ACL's."""
    if isinstance(reply, OutOfMemoryError) or str(reply).startswith("OOM"):
        return (
            "the server is at its maxmemory and refuses writes: free memory or raise maxmemory (keep "
            "maxmemory-policy noeviction, so that lock keys are never evicted), then retry"
        )
    if isinstance(reply, NoPermissionError) or str(reply).startswith("NOPERM"):
        return "the user's ACL does not allow it: grant the commands and keys of docs/backends/redis.md's ACL rule"
    return "check the user's ACL and the server's log"


def recheck_after(pttl_ms: int, ttl: float) -> float:
    """When to look again if no wake-up comes: at the holder's expiry, plus jitter."""
    # pttl -1: a key without expiry (not ours): look again after a TTL
    base = ttl if pttl_ms == -1 else max(0.0, pttl_ms / 1000)
    return base + _rng.uniform(0.0005, 0.0005 + min(0.05, 0.1 * base))


def _left(clock: Clock, deadline: float | None) -> float | None:
    return None if deadline is None else deadline - clock()


WAITER_ID = re.compile(r"([A-Za-z0-9_-]+)\.([1-9][0-9]{0,14})\.([!-~]+)")
"""The waiter-id grammar of docs/interop.md, which the release's Lua (scripts._HANDOFF) parses: a client id
without ``.`` (so the first ``.`` ends it), a TTL in ms that ``SET PX`` accepts, a token without spaces (a grant
message is ``"<waiter id> <fence>"``). Other clients' ids follow it too; one that does not is never granted."""


def waiter_id(client_id: str, ttl: float, token: str) -> str:
    """``<client id>.<ttl ms>.<token>``: what a release needs to grant the lock to this waiter, and where to say so."""
    wid = f"{client_id}.{ms(ttl)}.{token}"
    # An id outside the grammar would never be granted (only woken, to take the lock itself): fail loudly.
    assert WAITER_ID.fullmatch(wid), wid
    return wid


def release_call(keys: LockKeys, token: str | None) -> Call:
    """The single-node release: grant the lock to the first live waiter, else delete it and wake everyone."""
    script = FAIR_RELEASE if token is not None else FAIR_FORCE_RELEASE
    if keys.sharded:
        script = SHARDED_FAIR_RELEASE if token is not None else SHARDED_FAIR_FORCE_RELEASE
    lock, fence, channel, queue, alive, clients = keys[:6]
    args = (token or "", channel, clients)
    owner = args[0].encode()
    data = _RELEASE_WIRE % (
        script_head(script, 4, 3), len(lock), lock, len(fence), fence, len(queue), queue, len(alive), alive,
        len(owner), owner, len(channel), channel, len(clients), clients,
    )  # fmt: skip
    return Call(script, (lock, fence, queue, alive), args, data)


def leave_call(keys: LockKeys, token: str, wid: str) -> Call:
    """Leave the queue, and pass the lock on if a release granted it to this waiter after all."""
    return Call(SHARDED_LEAVE if keys.sharded else LEAVE, keys.script_keys(), (token, keys.channel, keys.clients, wid))


def acquire_flow(
    keys: LockKeys,
    token: str,
    ttl: float,
    deadline: float | None,
    clock: Clock,
    label: str,
    wid: str,
    listening: bool,
    min_replicas: int = 0,
    replica_timeout: float = 0.1,
    confirm_grants: bool = False,
) -> Flow[Grant | None]:
    """``listening``: this client's own channel is subscribed already. A waiter joins the queue only once it is:
    a release grants the lock only to a waiter whose client listens and skips the others as crashed, so
    queueing before the subscription is confirmed would let a live waiter be skipped. Without it, the first
    attempt does not queue, and the :class:`Watch` after it confirms the subscription before the next one does.
    ``confirm_grants``: a grant by a release's message is confirmed by one more attempt (redis+cluster://, whose
    fencing tokens need the epoch the granting server reports with the attempt's reply).
    """
    will_wait = deadline is None or deadline > clock()  # only a waiter that will wait joins the queue
    lock, fence, _, queue_key, alive = keys[:5]

    def attempt(queue: bool) -> tuple[Call, ...]:
        args = (token, ms(ttl), wid if queue else "", MARGIN_MS, MAX_QUEUE)
        owner, ttl_ms, me = args[0].encode(), b"%d" % args[1], args[2].encode()
        data = _ACQUIRE_WIRE % (
            len(lock), lock, len(fence), fence, len(queue_key), queue_key, len(alive), alive, len(owner), owner,
            len(ttl_ms), ttl_ms, len(me), me,
        )  # fmt: skip
        take = Call(FAIR_ACQUIRE, (lock, fence, queue_key, alive), args, data)
        if min_replicas:
            return (take, Call(None, (), ("WAIT", min_replicas, ms(replica_timeout))))
        return (take,)

    queued = will_wait and listening
    calls = attempt(queued)
    watching = False
    first_sent: float | None = None
    while True:
        sent_at = clock()
        if first_sent is None:
            first_sent = sent_at
        replies = yield Send(calls, False)
        taken, value = checked(replies[0], label, "acquire")
        if taken:
            if min_replicas and not (isinstance(replies[1], int) and replies[1] >= min_replicas):
                yield Send((release_call(keys, token),), True)
                raise BackendUnavailable(
                    f"redis {label}: only {replies[1]} of the {min_replicas} replicas required by min_replicas "
                    "acknowledged the lock within replica_timeout; the lock was released again. Retry, check the "
                    "replicas' link (INFO replication), or raise replica_timeout"
                )
            return Grant(int(value), ttl, sent_at)
        left = _left(clock, deadline)
        if left is not None and left <= 0:
            break
        if not watching:
            watching = True
            missed = yield Watch(confirm=not queued)
            if not queued:  # this client's channel is confirmed now: join the queue, at once
                queued = True
                calls = attempt(queued)
                continue
            if missed:
                continue  # a release may have come before the subscription: try again before sleeping
        wait = recheck_after(int(value), ttl)
        outcome = yield Wait(wait if left is None else min(wait, left))
        if isinstance(outcome, int):  # a release granted us the lock, with this fencing token
            if not min_replicas and not confirm_grants and clock() - first_sent < ttl * GRANT_FRESH:
                return Grant(outcome, ttl, first_sent)
            continue  # confirm: the next attempt finds our token, extends it (and WAITs for the replicas)
        if outcome == "cancelled":
            break
    if queued:
        yield Send((leave_call(keys, token, wid),), True, quiet=True)
    return None


_FOUR_KEYS = b"$%d\r\n%b\r\n$%d\r\n%b\r\n$%d\r\n%b\r\n$%d\r\n%b\r\n"
# An acquire's and a release's RESP, each made in one formatting from its own keys and arguments (issue 17:
# encoded key by key and argument by argument they cost more than the rest of the driver's Python for them);
# the acquire's last two arguments, the same for every lock, encoded once. tests/test_redis_wire.py pins both
# to what pack() makes of their commands.
_ACQUIRE_WIRE = (
    script_head(FAIR_ACQUIRE, 4, 5).replace(b"%", b"%%") + _FOUR_KEYS + b"$%d\r\n%b\r\n" * 3
    + bulks(MARGIN_MS, MAX_QUEUE).replace(b"%", b"%%")
)  # fmt: skip
_RELEASE_WIRE = b"%b" + _FOUR_KEYS + b"$%d\r\n%b\r\n" * 3


def redlock_take(keys: LockKeys, token: str, ttl: float) -> tuple[Call, ...]:
    """A Redlock attempt: a plain SET NX PX, not a script: the fewest a master can do (a Lua call costs each
    master several times a SET, and on a machine that runs the masters too that is the client's time as well).
    How long the lock stays taken, which a failed SET does not say, comes from the undo that every failed
    attempt sends anyway."""
    return (Call(None, (), ("SET", keys.lock, token, "NX", "PX", ms(ttl))),)


def answered(result: NodeResult) -> bool:
    """A master ran the first call sent to it (its reply is not an error)."""
    replies = result.replies
    return not isinstance(replies, BaseException) and not isinstance(replies[0], BaseException)


def redlock_acquire_flow(
    keys: LockKeys,
    token: str,
    ttl: float,
    deadline: float | None,
    clock: Clock,
    masters: int,
    retry_delay: float,
    pause: float = 0.0,
    first: FirstAttempt | None = None,
) -> Flow[tuple[Grant, tuple[int | None, ...]] | None]:
    """``pause``: wait this long before the first attempt (the releaser's yield, YIELD_ROUNDS); a one-shot
    attempt (``deadline`` already past) does not wait. ``first``: the first attempt (``redlock_take``, no pause
    before it) was made already, by the driver's uncontended fast path, and failed: go on from its results."""
    assert first is None or pause <= 0, "a first attempt made elsewhere cannot have waited for the pause"
    take = redlock_take(keys, token, ttl)
    pttl = Call(None, (), ("PTTL", keys.lock))
    probe = (*take, pttl)
    """A contended attempt: the SET and the lock's PTTL, so that one that won nowhere needs no undo."""
    undo: tuple[Call, ...] = ()  # made at the first undo: most acquires never need it
    need = quorum(masters)
    watching = False
    left = _left(clock, deadline)
    waits = pause > 0 and (left is None or left > 0)  # a one-shot attempt never waits
    if waits and (yield Wait(pause if left is None else min(pause, left))) == "cancelled":
        return None
    contended = pause > 0  # a releaser that yields expects to find the lock taken
    leftover = False  # an undo did not reach every master: one may still hold our key (its nil means "ours")
    while True:
        if first is not None:  # made by the caller: the same SET, counted the same way (tally_acquire)
            sent_at, elapsed, results, tally = first
            first = None
        else:
            sent_at = clock()
            results = yield Send(probe if contended else take, False)
            elapsed = clock() - sent_at
            tally = tally_acquire(results, ttl, elapsed)
        if tally.granted:
            return Grant(0, ttl, sent_at), tally.epochs
        if contended and not leftover and tally.reached == masters and not tally.won:
            undone = results  # every master answered nil: our key is nowhere, and the PTTLs came along
        else:
            undo = undo or (Call(RELEASE, keys.script_keys(1), (token, keys.channel)), pttl)
            undone = yield Send(undo, True)  # on *all* masters: a timed-out one may have applied the SET
            leftover = not all(answered(result) for result in undone)
        contended = True
        if tally.reached < need:
            raise BackendUnavailable(
                f"redlock reached {tally.reached} of {masters} masters but needs {need}; "
                "the partial locks were removed. Check that a majority of the masters is up"
            )
        left = _left(clock, deadline)
        if left is not None and left <= 0:
            return None
        free = free_in(results, undone, ttl)
        if free <= 0 or tally.won:
            # Nobody holds a quorum (free_in 0), or we won some masters: our attempt overlapped another's,
            # perhaps a split vote (whose other keys look held, for their full TTL, until undone). Retry after
            # a random delay, and sleep through wake-ups until then: the losers' undos PUBLISH, and retrying
            # on them puts every loser back in lockstep, to split again (the first to get out of step wins,
            # which starves the rest). Spread over a few round trips, not all of retry_delay: enough for the
            # retries not to overlap, short enough not to idle the lock. A quorum that was really taken is
            # found on that retry, which then waits for its release as below.
            retry_at = clock() + _rng.uniform(0, min(retry_delay, SPLIT_SPREAD * elapsed))
            pause = retry_at - clock()
            while pause > 0:
                left = _left(clock, deadline)
                if left is not None and left <= 0:
                    break
                outcome = yield Wait(pause if left is None else min(pause, left))
                if outcome == "cancelled":
                    return None
                if outcome != "woken":  # the timeout: the delay (or the deadline) is up
                    break
                pause = retry_at - clock()
            continue
        if not watching:
            watching = True
            if (yield Watch()):
                continue
        wait = free + _rng.uniform(0.0005, 0.0005 + min(0.05, 0.1 * free))
        if (yield Wait(wait if left is None else min(wait, left))) == "cancelled":
            return None
