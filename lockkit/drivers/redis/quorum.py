"""Redlock arithmetic as pure functions: quorum, validity, when a quorum frees up, renew tallies.

No I/O and no clock of its own: callers pass elapsed times measured on the
monotonic clock from *before* the first request was sent.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from ...timing import drift

__all__ = [
    "UNREAD", "FirstAttempt", "NodeResult", "Tally", "Unread", "count_ok", "count_released", "count_repeated_misses",
    "free_in", "node_result", "others_woken", "quorum", "released_quorum", "tally_acquire", "tally_renew",
    "validity", "won_quorum",
]  # fmt: skip


class NodeResult(NamedTuple):
    """One master's answer to a fan-out: its replies in order, or the error that stopped it (a named tuple:
    immutable, and made in a third of a frozen dataclass's time, five times per fan-out)."""

    replies: Sequence[Any] | BaseException
    epoch: int
    """The master's restart count as of this answer (see NodeState.epoch)."""
    repeated: bool = False
    """These replies come from a retry after the connection broke under the sent calls: they may have run twice."""


node_result: Callable[[tuple[Sequence[Any] | BaseException, int, bool]], NodeResult] = functools.partial(
    tuple.__new__, NodeResult
)
"""``node_result((replies, epoch, repeated))``: a :class:`NodeResult` made without the Python-level ``__new__``
of a named tuple (a third cheaper; a fan-out makes one per master, two fan-outs per acquire+release)."""


class Unread(Exception):
    """A master's reply that a fan-out did not wait for: the replies of the masters before it had decided the
    outcome (a quorum won or released). It counts as "not reached", except that an acquire's lease keeps that
    master's epoch, so its renewals count there (``RENEW`` is owner-checked: it says "ours" only where our ``SET``
    took)."""


UNREAD = Unread("not read: a quorum had answered before this master")


def quorum(n: int) -> int:
    return n // 2 + 1


def won_quorum(results: Sequence[NodeResult], need: int) -> bool:
    """Whether the ``SET NX PX`` replies so far won ``need`` masters (a fan-out may stop reading then)."""
    won = 0
    for replies, _, _ in results:
        if not isinstance(replies, BaseException) and replies[0] == b"OK":
            won += 1
    return won >= need


def released_quorum(results: Sequence[NodeResult], need: int) -> bool:
    """Whether the release replies so far released ``need`` masters (a fan-out may stop reading then)."""
    return count_ok(results)[0] >= need


def validity(ttl: float, elapsed: float) -> float:
    """What is left of a lease after the round trip and the drift margin (Redlock's rule)."""
    return ttl - elapsed - drift(ttl)


class Tally(NamedTuple):
    """An acquire attempt counted (a named tuple: made on every acquire, a third of a frozen dataclass's cost)."""

    granted: bool
    won: int
    reached: int
    validity: float
    epochs: tuple[int | None, ...]
    """Per master, its epoch if we won there, else None."""


def _reply(result: NodeResult, index: int) -> Any:
    if isinstance(result.replies, BaseException):
        return result.replies
    return result.replies[index]


def tally_acquire(results: Sequence[NodeResult], ttl: float, elapsed: float) -> Tally:
    """The attempt's ``SET NX PX`` replies: ``OK`` won, nil lost (the master answered: someone holds it),
    anything else (an error, a timeout) not reached."""
    won = reached = 0
    epochs: list[int | None] = []
    # On every acquire: one pass, each reply looked at once (no helper call per master).
    for replies, epoch, _ in results:
        if isinstance(replies, BaseException):
            epochs.append(epoch if replies is UNREAD else None)
            continue
        reply = replies[0]
        if reply == b"OK":
            won += 1
            reached += 1
            epochs.append(epoch)
            continue
        if reply is None:
            reached += 1
        epochs.append(None)
    left = validity(ttl, elapsed)
    return Tally(won >= quorum(len(results)) and left > 0, won, reached, left, tuple(epochs))


class FirstAttempt(NamedTuple):
    """A Redlock acquire's first attempt, made and counted outside the acquire flow (the driver's uncontended
    fast path), which failed: the flow goes on from it (``redlock_acquire_flow(first=...)``)."""

    sent_at: float
    """When it was sent (on the driver's clock): the lease's validity counts from here."""
    elapsed: float
    results: list[NodeResult]
    tally: Tally


def free_in(attempt: Sequence[NodeResult], undo: Sequence[NodeResult], ttl: float, index: int = 1) -> float:
    """Seconds until a quorum of masters is free (0: nobody holds a quorum, a split vote or a race), from a
    failed attempt and its undo, whose ``index``-th reply per master is the lock's ``PTTL`` after our key
    was removed (the failed ``SET`` itself says only "taken", not for how long).

    A master we won is free (0); one the attempt did not reach may be held for ever (inf: it cannot make up
    the quorum); one whose ``PTTL`` did not come back counts as held for a whole ``ttl``.
    """
    free: list[float] = []
    for tried, undone in zip(attempt, undo, strict=True):
        reply = _reply(tried, 0)
        if reply == b"OK":
            free.append(0.0)
            continue
        if reply is not None:  # an error: not reached
            free.append(math.inf)
            continue
        pttl = _reply(undone, index)
        if type(pttl) is not int:
            free.append(ttl)
        else:  # -2: no key (freed since); -1: a key without expiry (not ours): look again after a ttl
            free.append(pttl / 1000 if pttl >= 0 else (ttl if pttl == -1 else 0.0))
    free.sort()
    return free[quorum(len(attempt)) - 1]


def tally_renew(
    results: Sequence[NodeResult], index: int, acquired_epochs: Sequence[int | None] | None, ttl: float, elapsed: float
) -> str:
    """``"held"`` if a quorum renewed within validity (counting only masters that did not restart since
    the acquire), ``"unreachable"`` if fewer than a quorum answered, else ``"lost"``."""
    renewed = reached = 0
    for node, result in enumerate(results):
        reply = _reply(result, index)
        if not isinstance(reply, int):
            continue
        reached += 1
        if reply < 0:  # RENEW's "not ours"
            continue
        if acquired_epochs is not None and acquired_epochs[node] != result.epoch:
            continue  # this master restarted since we won it: its "yes" may come from a reborn key
        renewed += 1
    need = quorum(len(results))
    if renewed >= need and validity(ttl, elapsed) > 0:
        return "held"
    return "unreachable" if reached < need else "lost"


def _true(reply: Any) -> bool:
    """A script's "done" (1, or RELEASE's 1 + the subscribers it woke), not its "not ours" (0, -1)."""
    return type(reply) is int and reply > 0


def count_ok(results: Sequence[NodeResult], index: int = 0) -> tuple[int, int]:
    """(masters whose reply was a true integer, masters that answered at all)."""
    ok = reached = 0
    for result in results:  # on every release: one pass, no helper call per master
        replies = result.replies
        if isinstance(replies, BaseException):
            continue
        reply = replies[index]
        if isinstance(reply, BaseException):
            continue
        reached += 1
        if type(reply) is int and reply > 0:  # _true
            ok += 1
    return ok, reached


def count_released(results: Sequence[NodeResult]) -> tuple[int, int, bool]:
    """A release's replies in one pass: :func:`count_ok`'s two counts, and whether any master's release woke
    more than one subscriber (only then can :func:`others_woken` be true: a release's reply is 1 + those woken)."""
    ok = reached = 0
    woke = False
    for replies, _, _ in results:
        if isinstance(replies, BaseException):
            continue
        reply = replies[0]
        if isinstance(reply, BaseException):
            continue
        reached += 1
        if type(reply) is int and reply > 0:  # _true
            ok += 1
            if reply > 1:
                woke = True
    return ok, reached, woke


def others_woken(results: Sequence[NodeResult], own: Callable[[int], bool], index: int = 0) -> bool:
    """Whether a release woke a subscriber other than this client's own (``own(i)``: this client is subscribed
    to the lock's channel on master ``i``, asked only of a master that woke someone) on any master: someone
    else is waiting for the lock."""
    for i, result in enumerate(results):
        replies = result.replies
        if isinstance(replies, BaseException):
            continue
        reply = replies[index]
        if type(reply) is int and reply > 1 and reply - 1 > own(i):
            return True
    return False


def count_repeated_misses(results: Sequence[NodeResult], index: int = 0) -> int:
    """Masters whose reply was false but came from a retry of calls that may have run already (see NodeResult)."""
    return sum(
        1
        for result in results
        if result.repeated and not isinstance(reply := _reply(result, index), BaseException) and not _true(reply)
    )
