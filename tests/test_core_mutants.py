"""Redlock's arithmetic (lockkit/drivers/redis/quorum.py), pinned down value by value.

These are pure functions; mutmut (`make mutants`, part a) found that only the Redlock fault tests reached them,
and those cannot tell a quorum of 3 from one of 2 or a validity off by the drift. Replies are shaped as the
servers return them: the attempt's ``SET NX PX`` ``b"OK"`` or nil, the undo's ``PTTL`` an integer, RENEW an integer
(-1: not ours).
"""

from __future__ import annotations

import math

import pytest
from redis.exceptions import ResponseError

from lockkit.drivers.redis.quorum import (
    NodeResult,
    count_ok,
    count_repeated_misses,
    free_in,
    others_woken,
    quorum,
    tally_acquire,
    tally_renew,
    validity,
)
from lockkit.timing import drift


def _r(reply: object, epoch: int = 0, repeated: bool = False) -> NodeResult:
    if isinstance(reply, BaseException):
        return NodeResult(reply, epoch, repeated)
    return NodeResult([reply], epoch, repeated)


@pytest.mark.parametrize("n, need", [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3), (6, 4), (7, 4)])
def test_quorum_is_a_strict_majority(n: int, need: int) -> None:
    assert quorum(n) == need


def test_validity_subtracts_the_round_trip_and_the_drift() -> None:
    assert validity(10.0, 0.5) == pytest.approx(10.0 - 0.5 - drift(10.0))
    assert validity(1.0, 0.0) == pytest.approx(1.0 - drift(1.0))
    assert validity(1.0, 1.0) < 0


def test_tally_acquire_majority_wins() -> None:
    results = [_r(b"OK", epoch=i) for i in range(3)] + [_r(None), _r(ConnectionError("down"))]
    tally = tally_acquire(results, 10.0, 0.25)
    assert tally.granted and tally.won == 3 and tally.reached == 4
    assert tally.validity == pytest.approx(validity(10.0, 0.25))
    assert tally.epochs == (0, 1, 2, None, None)


def test_tally_acquire_minority_loses() -> None:
    results = [_r(b"OK"), _r(b"OK"), _r(None), _r(None), _r(None)]
    tally = tally_acquire(results, 4.0, 0.1)
    assert not tally.granted and tally.won == 2 and tally.reached == 5
    assert tally.epochs == (0, 0, None, None, None)


def test_tally_acquire_errors_are_not_reached_and_never_won() -> None:
    results = [_r(b"OK"), _r(ResponseError("NOPERM")), _r(TimeoutError()), _r(b"QUEUED"), _r(None)]
    tally = tally_acquire(results, 4.0, 0.1)
    assert not tally.granted and tally.won == 1 and tally.reached == 2


def _undo(*pttls: object) -> list[NodeResult]:
    return [NodeResult(p, 0) if isinstance(p, BaseException) else NodeResult([0, p], 0) for p in pttls]


def test_free_in_says_when_a_quorum_frees_up() -> None:
    attempt = [_r(b"OK"), _r(b"OK"), _r(None), _r(None), _r(None)]
    # free in: 0, 0 (won), 1.5, 4.0 (a key without expiry counts as a whole ttl), 3.0: the third is 1.5 s
    assert free_in(attempt, _undo(-2, -2, 1500, -1, 3000), 4.0) == pytest.approx(1.5)
    # a lost master whose key is gone by the undo (-2) is free; one whose PTTL did not come back: a whole ttl
    assert free_in(attempt, _undo(-2, -2, -2, 900, 700), 4.0) == 0.0
    assert free_in([_r(None)] * 5, _undo(100, TimeoutError(), 300, TimeoutError(), 200), 4.0) == pytest.approx(0.3)


def test_free_in_unreachable_masters_are_never_free() -> None:
    attempt = [_r(b"OK"), _r(TimeoutError()), _r(TimeoutError()), _r(None), _r(None)]
    # 0 (won), inf, inf (the attempt did not reach them, whatever the undo says), 0 (-2: no key), 0.5
    assert free_in(attempt, _undo(-2, -2, -2, -2, 500), 4.0) == pytest.approx(0.5)
    assert math.isinf(free_in(attempt[:3] + [_r(TimeoutError())] * 2, _undo(-2, -2, -2, -2, -2), 4.0))


def test_tally_acquire_without_validity_left_is_not_granted() -> None:
    results = [_r(b"OK") for _ in range(5)]
    assert not tally_acquire(results, 1.0, 1.0).granted
    assert tally_acquire(results, 1.0, 0.0).granted


def test_tally_renew_counts_only_masters_that_did_not_restart() -> None:
    results = [_r(0, epoch=1), _r(0, epoch=1), _r(0, epoch=2), _r(-1), _r(TimeoutError())]
    assert tally_renew(results, 0, [1, 1, 1, 0, 0], 5.0, 0.1) == "lost"  # master 2 restarted: 2 of 5
    assert tally_renew(results, 0, [1, 1, 2, 0, 0], 5.0, 0.1) == "held"
    assert tally_renew(results, 0, None, 5.0, 0.1) == "held"  # no epochs known: every yes counts
    assert tally_renew(results, 0, None, 5.0, 5.0) == "lost"  # no validity left
    unreachable = [_r(0), _r(0), _r(TimeoutError()), _r(TimeoutError()), _r(TimeoutError())]
    assert tally_renew(unreachable, 0, None, 5.0, 0.1) == "unreachable"
    refused = [_r(-1), _r(-1), _r(-1), _r(TimeoutError()), _r(TimeoutError())]
    assert tally_renew(refused, 0, None, 5.0, 0.1) == "lost"


def test_count_ok_and_repeated_misses() -> None:
    results = [_r(1), _r(0), _r(1, repeated=True), _r(0, repeated=True), _r(OSError())]
    assert count_ok(results) == (2, 4)
    assert count_repeated_misses(results) == 1
    assert count_repeated_misses([_r(OSError(), repeated=True)]) == 0


def test_tally_renew_looks_at_every_master_whatever_comes_first() -> None:
    # a master that did not answer, refused, or restarted comes first: the others still count
    first_down = [_r(TimeoutError()), _r(0), _r(0), _r(0), _r(-1)]
    assert tally_renew(first_down, 0, None, 5.0, 0.1) == "held"
    first_refused = [_r(-1), _r(0), _r(0), _r(0), _r(-1)]
    assert tally_renew(first_refused, 0, None, 5.0, 0.1) == "held"
    first_restarted = [_r(0, epoch=9), _r(0), _r(0), _r(0), _r(-1)]
    assert tally_renew(first_restarted, 0, [0, 0, 0, 0, 0], 5.0, 0.1) == "held"
    # little validity left still counts as held (Redlock's rule: anything above zero)
    assert tally_renew([_r(0)] * 5, 0, None, 5.0, 4.5) == "held"


def test_count_ok_counts_the_true_replies_not_the_others() -> None:
    assert count_ok([_r(1), _r(1), _r(0), _r(OSError())]) == (2, 3)
    assert count_repeated_misses([_r(0, repeated=True), _r(0, repeated=True), _r(1, repeated=True)]) == 2


def test_count_ok_takes_a_release_that_woke_subscribers_as_done() -> None:
    # RELEASE returns 1 + the subscribers its PUBLISH reached; 0 is "not ours"
    assert count_ok([_r(1), _r(3), _r(0), _r(b"1"), _r(-1)]) == (2, 5)
    assert count_repeated_misses([_r(2, repeated=True), _r(0, repeated=True)]) == 1


def test_others_woken_discounts_this_clients_own_subscription() -> None:
    asked: list[int] = []

    def own(i: int) -> bool:
        asked.append(i)
        return i != 1  # this client listens on the first and third masters

    assert not others_woken([_r(2), _r(1), _r(2)], own)  # only ours listened (or nobody)
    assert asked == [0, 2]  # asked only where the release woke someone
    assert others_woken([_r(2), _r(2), _r(2)], own)  # someone else on the second master
    assert others_woken([_r(3), _r(1), _r(1)], own)  # ours and another on the first
    assert not others_woken([_r(0), _r(OSError()), _r(1)], own)  # not ours, no answer: says nothing
