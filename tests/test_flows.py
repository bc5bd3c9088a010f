"""The Redis acquire flows (lockkit/drivers/redis/flow.py) driven directly: no server, no threads, no sleeping.

A flow is a generator of operations (:class:`Send`, :class:`Watch`, :class:`Wait`); a face performs them. Here a
:class:`Script` performs them instead: it checks each operation against the next scripted step, moves the
:class:`~lockkit.testing.FakeClock` by the time the step says the operation took (a round trip, a sleep), and
answers with the step's canned reply. So every branch of the retry, queueing, hand-off and quorum logic is
reachable with exact times, and the tests can say which script each request ran and when validity starts.

Replies are shaped as the Lua scripts return them (see lockkit/drivers/redis/scripts.py): FAIR_ACQUIRE
``[1, fence]`` (taken) or ``[0, ms until the holder lapses]``; WAIT the number of replicas that acknowledged; for
Redlock one :class:`NodeResult` per master (its attempt a plain ``SET NX PX``: ``b"OK"`` or nil). Nothing here
depends on the position of a key inside ``KEYS``; the ARGV checks only ask whether a value (the token, the waiter
id) is among the arguments.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from redis.exceptions import ResponseError

from lockkit.driver import Grant
from lockkit.drivers.redis._async.drive import adrive
from lockkit.drivers.redis._sync.drive import drive
from lockkit.drivers.redis.flow import (
    GRANT_FRESH,
    SPLIT_SPREAD,
    Flow,
    Op,
    Send,
    Wait,
    Watch,
    acquire_flow,
    ms,
    redlock_acquire_flow,
    waiter_id,
)
from lockkit.drivers.redis.keys import LockKeys, lock_keys
from lockkit.drivers.redis.quorum import NodeResult, quorum, validity
from lockkit.drivers.redis.scripts import FAIR_ACQUIRE, FAIR_RELEASE, LEAVE, RELEASE
from lockkit.errors import BackendUnavailable
from lockkit.lease import Lease
from lockkit.testing import FakeClock
from lockkit.timing import drift, lease_deadline

START = 1000.0
TTL = 10.0
TOKEN = "t" * 32
KEYS: LockKeys = lock_keys("lockkit:", "flows")
WID = waiter_id("client-1", TTL, TOKEN)


# -- the scripted perform ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One expected operation: its type, the reply to give, and how long it takes on the fake clock."""

    kind: type[Send] | type[Watch] | type[Wait]
    reply: Any = None
    takes: float = 0.0


@dataclass
class Script:
    """A ``perform`` that answers the flow's operations from a list of steps, in order, and records them."""

    clock: FakeClock
    steps: list[Step]
    ops: list[Op] = field(default_factory=list)
    started: list[float] = field(default_factory=list)
    """The clock when each operation began (a Send's send time)."""

    def __call__(self, op: Op) -> Any:
        assert len(self.ops) < len(self.steps), f"unscripted operation #{len(self.ops)}: {op!r}"
        step = self.steps[len(self.ops)]
        assert isinstance(op, step.kind), f"operation #{len(self.ops)} is {op!r}, the script expected {step.kind}"
        self.ops.append(op)
        self.started.append(self.clock())
        self.clock.advance(step.takes)
        return step.reply

    async def aperform(self, op: Op) -> Any:
        await asyncio.sleep(0)  # a real suspension point, as the asyncio face has
        return self(op)

    @property
    def sends(self) -> list[Send]:
        return [op for op in self.ops if isinstance(op, Send)]

    def kinds(self) -> list[str]:
        return [type(op).__name__ for op in self.ops]

    def done(self) -> None:
        assert len(self.ops) == len(self.steps), f"only {len(self.ops)} of {len(self.steps)} steps were used"


Runner = Callable[[Flow[Any], Script], Any]


def _run_sync(flow: Flow[Any], script: Script) -> Any:
    return drive(flow, script)


def _run_async(flow: Flow[Any], script: Script) -> Any:
    return asyncio.run(adrive(flow, script.aperform))


@pytest.fixture(params=[_run_sync, _run_async], ids=["drive", "adrive"])
def run(request: pytest.FixtureRequest) -> Runner:
    """Run a flow to its end with the blocking driver or the asyncio one: both must give the same outcome."""
    runner: Runner = request.param
    return runner


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


def _single(
    clock: FakeClock,
    *,
    deadline: float | None = None,
    listening: bool = True,
    min_replicas: int = 0,
    replica_timeout: float = 0.1,
) -> Flow[Grant | None]:
    label = "127.0.0.1:6379"
    return acquire_flow(KEYS, TOKEN, TTL, deadline, clock, label, WID, listening, min_replicas, replica_timeout)


def _taken(fence: int) -> list[Any]:
    return [[1, fence]]


def _held(pttl_ms: int) -> list[Any]:
    return [[0, pttl_ms]]


def _queued(send: Send) -> bool:
    """Whether this attempt asks to join the waiter queue (its ARGV carries the waiter id)."""
    (take, *_rest) = send.calls
    assert take.script is FAIR_ACQUIRE
    return WID in take.args


# -- FakeClock --------------------------------------------------------------------------------------------------


def test_fake_clock_moves_only_when_told_and_never_back() -> None:
    clock = FakeClock(5.0)
    assert clock() == clock.now == 5.0
    assert clock.advance(0.25) == 5.25 and clock() == 5.25
    assert clock.set(7.0) == 7.0 and clock() == 7.0
    assert clock.advance(0) == 7.0 and clock.set(7.0) == 7.0
    with pytest.raises(ValueError, match="does not go back"):
        clock.advance(-0.001)
    with pytest.raises(ValueError, match="does not go back"):
        clock.set(6.999)
    with pytest.raises(ValueError, match="finite"):
        clock.advance(float("nan"))
    with pytest.raises(ValueError, match="finite"):
        FakeClock(float("inf"))
    assert clock() == 7.0 and repr(clock) == "FakeClock(7)"
    assert FakeClock()() == 0.0


def test_fake_clock_loses_no_advance_across_threads() -> None:
    clock = FakeClock(0.0)

    def tick() -> None:
        for _ in range(2000):
            clock.advance(0.5)  # halves are exact in binary: the sum is exact whatever the order

    threads = [threading.Thread(target=tick) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert clock() == 4 * 2000 * 0.5


# -- single node: the uncontended grant and validity from the send ---------------------------------------------


def test_uncontended_grant_is_one_fair_acquire_counted_from_its_send(clock: FakeClock, run: Runner) -> None:
    script = Script(clock, [Step(Send, _taken(7), takes=0.3)])
    grant = run(_single(clock), script)
    script.done()
    assert grant == Grant(fencing_token=7, ttl=TTL, sent_at=START)  # before the send, not at the reply (+0.3)
    (send,) = script.sends
    assert not send.idempotent and not send.quiet  # an acquire must not be retried blindly
    (take,) = send.calls  # no WAIT without min_replicas
    assert take.script is FAIR_ACQUIRE
    assert TOKEN in take.args and ms(TTL) in take.args


def test_a_slow_reply_shortens_the_lease_and_never_lengthens_it(clock: FakeClock, run: Runner) -> None:
    """The server applied the SET somewhere in the 4 s round trip: only the send time is known to precede it."""
    script = Script(clock, [Step(Send, _taken(3), takes=4.0)])
    grant = run(_single(clock), script)
    assert clock() == START + 4.0 and grant.sent_at == START
    lease = Lease(name="flows", token=TOKEN, fencing_token=3, ttl=grant.ttl, sent_at=grant.sent_at, clock=clock)
    assert lease.expires_at == pytest.approx(lease_deadline(START, TTL))
    assert lease.remaining() == pytest.approx(TTL - drift(TTL) - 4.0)
    clock.set(lease.expires_at)
    assert not lease.valid


# -- single node: waiting -----------------------------------------------------------------------------------------


def test_held_lock_watches_waits_until_woken_then_is_granted(clock: FakeClock, run: Runner) -> None:
    script = Script(
        clock,
        [
            Step(Send, _held(2000), takes=0.01),
            Step(Watch, False),  # the subscription was live and silent: sleep at once
            Step(Wait, "woken", takes=1.2),  # the holder's release published
            Step(Send, _taken(8), takes=0.01),
        ],
    )
    grant = run(_single(clock), script)
    script.done()
    assert script.kinds() == ["Send", "Watch", "Wait", "Send"]
    watch = script.ops[1]
    assert isinstance(watch, Watch) and not watch.confirm  # already listening: no need to wait for the confirm
    wait = script.ops[2]
    assert isinstance(wait, Wait) and wait.timeout is not None
    assert 2.0 < wait.timeout <= 2.0 + 0.0505  # the holder's PTTL plus a little jitter, as the one timer
    first, second = script.sends
    assert _queued(first) and _queued(second)  # a listening waiter queues with its first attempt
    # validity counts from the send of the attempt that won, after the wait, not from the first attempt
    assert grant == Grant(8, TTL, script.started[3]) and grant.sent_at == pytest.approx(START + 1.21)


def test_a_missed_wake_up_tries_again_before_sleeping(clock: FakeClock, run: Runner) -> None:
    script = Script(clock, [Step(Send, _held(5000)), Step(Watch, True), Step(Send, _taken(2))])
    assert run(_single(clock), script) == Grant(2, TTL, START)
    script.done()
    assert script.kinds() == ["Send", "Watch", "Send"]  # no Wait: the release may have come before the subscription


def test_a_holder_without_expiry_is_rechecked_after_one_ttl(clock: FakeClock, run: Runner) -> None:
    deadline = START + 60
    leave = Step(Send, [1], takes=0.02)
    script = Script(clock, [Step(Send, _held(-1)), Step(Watch, False), Step(Wait, "cancelled"), leave])
    assert run(_single(clock, deadline=deadline), script) is None
    wait = script.ops[2]
    assert isinstance(wait, Wait) and wait.timeout is not None and TTL < wait.timeout <= TTL + 0.0505


def test_the_wait_never_outlasts_the_deadline(clock: FakeClock, run: Runner) -> None:
    script = Script(
        clock,
        [Step(Send, _held(9000), takes=0.5), Step(Watch, False), Step(Wait, "woken"), Step(Send, _taken(4))],
    )
    run(_single(clock, deadline=START + 2.0), script)
    wait = script.ops[2]
    assert isinstance(wait, Wait) and wait.timeout == pytest.approx(1.5)  # what is left, not the holder's 9 s


def test_deadline_passing_returns_none_after_leaving_the_queue(clock: FakeClock, run: Runner) -> None:
    script = Script(
        clock,
        [
            Step(Send, _held(5000), takes=0.1),
            Step(Watch, False),
            Step(Wait, "timeout", takes=0.9),  # slept until the deadline
            Step(Send, _held(4000), takes=0.1),  # one last look at the deadline
            Step(Send, [1]),  # leave
        ],
    )
    assert run(_single(clock, deadline=START + 1.0), script) is None
    script.done()
    leave = script.sends[-1]
    assert leave.idempotent and leave.quiet  # best effort: the entry expires on its own anyway
    (call,) = leave.calls
    assert call.script is LEAVE and TOKEN in call.args and WID in call.args


def test_a_cancelled_wait_leaves_at_once_without_another_attempt(clock: FakeClock, run: Runner) -> None:
    script = Script(clock, [Step(Send, _held(5000)), Step(Watch, False), Step(Wait, "cancelled"), Step(Send, [1])])
    assert run(_single(clock), script) is None  # no deadline: only the cancel ends it
    script.done()
    assert [send.calls[0].script for send in script.sends] == [FAIR_ACQUIRE, LEAVE]


def test_a_one_shot_attempt_never_queues_watches_or_leaves(clock: FakeClock, run: Runner) -> None:
    script = Script(clock, [Step(Send, _held(5000))])
    assert run(_single(clock, deadline=START), script) is None  # try_acquire: the deadline is now
    script.done()
    assert not _queued(script.sends[0])


def test_a_waiter_not_yet_listening_confirms_its_subscription_before_queueing(clock: FakeClock, run: Runner) -> None:
    """A release grants only to waiters whose client listens: queueing before that could skip a live waiter."""
    script = Script(
        clock,
        [
            Step(Send, _held(3000), takes=0.1),
            Step(Watch, False, takes=0.05),
            Step(Send, _held(2900), takes=0.1),  # at once, queued this time
            Step(Wait, "woken"),
            Step(Send, _taken(5)),
        ],
    )
    grant = run(_single(clock, listening=False), script)
    script.done()
    assert script.kinds() == ["Send", "Watch", "Send", "Wait", "Send"]
    watch = script.ops[1]
    assert isinstance(watch, Watch) and watch.confirm
    assert [_queued(send) for send in script.sends] == [False, True, True]
    assert grant == Grant(5, TTL, script.started[4])


# -- single node: a release hands the lock to this waiter ---------------------------------------------------------


def test_a_fresh_hand_off_is_granted_without_a_round_trip_counted_from_the_first_send(
    clock: FakeClock, run: Runner
) -> None:
    """The release set the key's TTL after the waiter's first attempt queued it: validity from that attempt."""
    script = Script(
        clock,
        [
            Step(Send, _held(3000), takes=0.1),
            Step(Watch, False, takes=0.05),
            Step(Send, _held(2900), takes=0.1),
            Step(Wait, 42, takes=TTL * GRANT_FRESH - 0.5),  # granted while waiting, in good time
        ],
    )
    grant = run(_single(clock, listening=False), script)
    script.done()
    assert grant == Grant(42, TTL, START)  # the first send, not the second (queued) one, not the grant's arrival


def test_a_stale_hand_off_confirms_with_one_more_attempt(clock: FakeClock, run: Runner) -> None:
    script = Script(
        clock,
        [
            Step(Send, _held(8000)),
            Step(Watch, False),
            Step(Wait, 42, takes=TTL * GRANT_FRESH + 0.1),  # so late that under 2/3 of the TTL would be left
            Step(Send, _taken(42), takes=0.01),  # the attempt finds our token and extends it
        ],
    )
    grant = run(_single(clock), script)
    script.done()
    confirm = script.sends[-1]
    assert confirm.calls[0].script is FAIR_ACQUIRE
    assert grant == Grant(42, TTL, script.started[3]) and grant.sent_at > START + TTL * GRANT_FRESH


# -- single node: errors and min_replicas -----------------------------------------------------------------------


def test_a_refused_script_is_backend_unavailable_naming_the_acl(clock: FakeClock, run: Runner) -> None:
    script = Script(clock, [Step(Send, [ResponseError("NOPERM this user has no permissions to run 'evalsha'")])])
    with pytest.raises(BackendUnavailable, match=r"127\.0\.0\.1:6379 refused the acquire script.*NOPERM.*ACL"):
        run(_single(clock), script)
    script.done()


def test_an_error_after_waiting_surfaces_too(clock: FakeClock, run: Runner) -> None:
    script = Script(
        clock, [Step(Send, _held(100)), Step(Watch, False), Step(Wait, "woken"), Step(Send, [ResponseError("NOPERM")])]
    )
    with pytest.raises(BackendUnavailable, match="acquire"):
        run(_single(clock), script)
    script.done()  # no leave from the flow: the face's own clean-up owns that (see single.py)


def test_an_error_raised_by_perform_propagates_and_closes_the_flow(clock: FakeClock) -> None:
    """The I/O failed mid-wait: the driver re-raises it and closes the generator; the queue entry is the face's
    to leave (single.py's clean-up), never sent by a flow that is already finished."""
    flow = _single(clock)
    script = Script(clock, [Step(Send, _held(5000)), Step(Watch, False)])

    def perform(op: Op) -> Any:
        if isinstance(op, Wait):
            raise ConnectionError("connection reset under the wait")
        return script(op)

    with pytest.raises(ConnectionError, match="reset"):
        drive(flow, perform)
    script.done()
    with pytest.raises(StopIteration):  # closed: nothing more can come out of it
        flow.send(None)


def test_min_replicas_sends_wait_with_the_acquire_and_grants_when_enough_ack(clock: FakeClock, run: Runner) -> None:
    script = Script(clock, [Step(Send, [[1, 11], 2], takes=0.08)])
    grant = run(_single(clock, min_replicas=2, replica_timeout=0.25), script)
    assert grant == Grant(11, TTL, START)
    (send,) = script.sends
    take, wait = send.calls
    assert take.script is FAIR_ACQUIRE
    assert wait.script is None and wait.args == ("WAIT", 2, 250)


@pytest.mark.parametrize("acks", [1, 0, ResponseError("NOPERM wait")], ids=["one", "none", "refused"])
def test_too_few_replica_acks_release_the_lock_and_raise(clock: FakeClock, run: Runner, acks: object) -> None:
    script = Script(clock, [Step(Send, [[1, 11], acks]), Step(Send, [1])])
    with pytest.raises(BackendUnavailable, match=r"of the 2 replicas required by min_replicas.*released again"):
        run(_single(clock, min_replicas=2), script)
    script.done()
    release = script.sends[-1]
    assert release.idempotent
    (call,) = release.calls
    assert call.script is FAIR_RELEASE and TOKEN in call.args


def test_min_replicas_always_confirms_a_hand_off(clock: FakeClock, run: Runner) -> None:
    """A hand-off is the releaser's write: this waiter must WAIT for the replicas itself, however fresh."""
    script = Script(
        clock,
        [Step(Send, [[0, 2000], 2]), Step(Watch, False), Step(Wait, 42, takes=0.01), Step(Send, [[1, 42], 2])],
    )
    grant = run(_single(clock, min_replicas=2), script)
    script.done()
    assert grant == Grant(42, TTL, script.started[3])
    assert [len(send.calls) for send in script.sends] == [2, 2]  # both attempts carry the WAIT


# -- Redlock ----------------------------------------------------------------------------------------------------

MASTERS = 5
RETRY_DELAY = 0.2


def _redlock(clock: FakeClock, deadline: float | None = None) -> Flow[tuple[Grant, tuple[int | None, ...]] | None]:
    return redlock_acquire_flow(KEYS, TOKEN, TTL, deadline, clock, MASTERS, RETRY_DELAY)


def _won(epoch: int = 0) -> NodeResult:
    return NodeResult([b"OK"], epoch)


def _lost(epoch: int = 0) -> NodeResult:
    """SET NX's nil: the master answered, someone holds the key (for how long, the undo's PTTL says)."""
    return NodeResult([None], epoch)


def _undo(*pttls: int | None) -> list[NodeResult]:
    """The undo's replies per master: RELEASE (1: our key was there; 0: not), then the lock's PTTL after it
    (-2: no key); None: the master did not answer."""
    return [NodeResult(TimeoutError("down"), 0) if p is None else NodeResult([0, p], 0) for p in pttls]


def _down() -> NodeResult:
    return NodeResult(TimeoutError("master timed out"), 0)


def _released() -> list[NodeResult]:
    """Every master's undo replies when the undo found our key there (and then no key)."""
    return [NodeResult([1, -2], 0)] * MASTERS


def _not_ours(pttl_ms: int = 5000) -> list[NodeResult]:
    """Every master's undo replies when the undo found nothing of ours: another holder's key, ``pttl_ms`` left."""
    return [NodeResult([0, pttl_ms], 0)] * MASTERS


def _undone(script: Script) -> bool:
    """The flow's second Send is the undo: RELEASE of our token, then the lock's PTTL (sent to every master)."""
    undo = script.sends[1]
    release, pttl = undo.calls
    return undo.idempotent and release.script is RELEASE and TOKEN in release.args and pttl.args[0] == "PTTL"


def test_redlock_majority_grants_with_the_epochs_of_the_masters_won(clock: FakeClock, run: Runner) -> None:
    results = [_won(3), _won(4), _won(5), _lost(), _down()]
    script = Script(clock, [Step(Send, results, takes=0.05)])
    grant, epochs = run(_redlock(clock), script)
    script.done()
    assert grant == Grant(0, TTL, START)  # no fencing token; validity from before the send
    assert epochs == (3, 4, 5, None, None)
    (send,) = script.sends
    (take,) = send.calls
    # a plain SET NX PX (no script), never retried
    assert take.script is None and not send.idempotent
    assert take.args == ("SET", KEYS.lock, TOKEN, "NX", "PX", ms(TTL))


def test_redlock_minority_of_grants_is_undone_everywhere(clock: FakeClock, run: Runner) -> None:
    results = [_won(), _won(), _lost(), _lost(), _lost()]
    script = Script(clock, [Step(Send, results), Step(Send, _released())])
    assert run(_redlock(clock, deadline=START), script) is None  # one shot: give up after the undo
    script.done()
    assert _undone(script)


def test_redlock_without_a_quorum_of_answers_undoes_then_raises(clock: FakeClock, run: Runner) -> None:
    """Two grants and three failures: the masters that failed may have applied the SET, so undo on all."""
    results = [_won(), _won(), _down(), _down(), NodeResult(ConnectionError("reset"), 0)]
    script = Script(clock, [Step(Send, results), Step(Send, _released())])
    with pytest.raises(BackendUnavailable, match=f"reached 2 of {MASTERS} masters but needs {quorum(MASTERS)}"):
        run(_redlock(clock), script)
    script.done()
    assert _undone(script)


def test_redlock_refused_scripts_count_as_unreached(clock: FakeClock, run: Runner) -> None:
    results = [NodeResult([ResponseError("NOPERM")], 0)] * MASTERS  # the ACL refuses SET
    script = Script(clock, [Step(Send, results), Step(Send, _released())])
    with pytest.raises(BackendUnavailable, match=f"reached 0 of {MASTERS}"):
        run(_redlock(clock), script)
    assert _undone(script)


@pytest.mark.parametrize("spare", [0.01, -0.01], ids=["validity-left", "validity-eaten"])
def test_redlock_grant_needs_validity_left_after_the_round_trip(clock: FakeClock, run: Runner, spare: float) -> None:
    """Granted iff ttl − elapsed − drift(ttl) > 0, elapsed measured from before the send to after the replies."""
    elapsed = TTL - drift(TTL) - spare
    assert (validity(TTL, elapsed) > 0) is (spare > 0)
    steps = [Step(Send, [_won()] * MASTERS, takes=elapsed)]
    if spare < 0:  # every master said yes, but too late to use: undone, and a one-shot gives up
        steps.append(Step(Send, _released()))
    script = Script(clock, steps)
    result = run(_redlock(clock, deadline=START), script)
    script.done()
    if spare > 0:
        grant, _epochs = result
        assert grant.sent_at == START  # what is left: lease_deadline(START, TTL) - (START + elapsed) = spare
        assert lease_deadline(grant.sent_at, grant.ttl) - clock() == pytest.approx(spare)
    else:
        assert result is None and _undone(script)


def test_redlock_too_late_everywhere_retries_after_a_random_delay(clock: FakeClock, run: Runner) -> None:
    """All masters granted but the validity was gone: nobody else holds them, so no Watch, only a short delay."""
    script = Script(
        clock,
        [
            Step(Send, [_won()] * MASTERS, takes=TTL),
            Step(Send, _released()),
            Step(Wait, "timeout", takes=0.1),
            Step(Send, [_won()] * MASTERS, takes=0.01),
        ],
    )
    grant, _epochs = run(_redlock(clock), script)
    script.done()
    assert script.kinds() == ["Send", "Send", "Wait", "Send"]
    wait = script.ops[2]
    assert isinstance(wait, Wait) and wait.timeout is not None and 0 <= wait.timeout <= RETRY_DELAY
    assert grant.sent_at == script.started[3] == pytest.approx(START + TTL + 0.1)


def test_redlock_held_by_a_quorum_waits_for_the_wake_up_then_wins(clock: FakeClock, run: Runner) -> None:
    held = [_lost(), _lost(), _lost(), _lost(), _down()]
    script = Script(
        clock,
        [
            Step(Send, held, takes=0.02),
            Step(Send, _undo(1000, 1500, 2000, 2500, None)),  # nothing of ours; the holder's keys' PTTLs
            Step(Watch, False),
            Step(Wait, "woken", takes=0.7),
            Step(Send, [_won(), _won(), _won(), _lost(), _down()], takes=0.02),
        ],
    )
    grant, epochs = run(_redlock(clock), script)
    script.done()
    assert _undone(script)
    wait = script.ops[3]
    # a quorum (3 of 5) is free once the third-soonest holder lapses: 2.0 s; plus jitter
    assert isinstance(wait, Wait) and wait.timeout is not None and 2.0 < wait.timeout <= 2.0 + 0.0505
    assert grant == Grant(0, TTL, script.started[4]) and epochs == (0, 0, 0, None, None)


def test_redlock_split_vote_backs_off_through_wake_ups_then_retries(clock: FakeClock, run: Runner) -> None:
    """Won 2 of 5, the rest held by keys that look alive for their whole TTL: a split vote (or a race), not a
    quorum to wait for. No Watch; a random pause within SPLIT_SPREAD round trips; the other losers' undos wake
    us during it, and we sleep on until it is over instead of retrying in step with them."""
    split = [_won(), _won(), _lost(), _lost(), _lost()]
    script = Script(
        clock,
        [
            Step(Send, split, takes=0.004),
            Step(Send, _undo(-2, -2, 9000, 9000, 9500)),
            Step(Wait, "woken"),  # another loser's undo PUBLISHed: not a reason to retry now
            Step(Wait, "timeout", takes=1.0),
            Step(Send, [_won()] * MASTERS, takes=0.004),
        ],
    )
    grant, _epochs = run(_redlock(clock), script)
    script.done()
    assert _undone(script) and script.kinds() == ["Send", "Send", "Wait", "Wait", "Send"]
    first, second = script.ops[2], script.ops[3]
    assert isinstance(first, Wait) and isinstance(second, Wait)
    assert first.timeout is not None and 0 <= first.timeout <= min(RETRY_DELAY, SPLIT_SPREAD * 0.004)
    assert second.timeout == pytest.approx(first.timeout)  # the rest of the same pause (no time passed)
    assert grant.sent_at == script.started[4]


def test_redlock_deadline_passing_returns_none_after_the_undo(clock: FakeClock, run: Runner) -> None:
    held = [_lost()] * MASTERS
    undo = _not_ours()
    script = Script(
        clock,
        [
            Step(Send, held, takes=0.1),
            Step(Send, undo),
            Step(Watch, False),
            Step(Wait, "timeout", takes=0.4),
            Step(Send, [_lost_probe(5000)] * MASTERS, takes=0.1),
        ],
    )
    assert run(_redlock(clock, deadline=START + 0.5), script) is None
    script.done()
    wait = script.ops[3]
    assert isinstance(wait, Wait) and wait.timeout == pytest.approx(0.4)  # capped at what was left
    # the first attempt a plain SET, undone; the retry SET + PTTL, which won nowhere: no undo
    assert [[c.args[0] if c.script is None else c.script for c in send.calls] for send in script.sends] == [
        ["SET"], [RELEASE, "PTTL"], ["SET", "PTTL"]
    ]


def _lost_probe(pttl_ms: int) -> NodeResult:
    """A contended attempt's replies on a master someone else holds: SET's nil, then the lock's PTTL."""
    return NodeResult([None, pttl_ms], 0)


def test_redlock_retry_that_won_nowhere_needs_no_undo_but_one_that_won_somewhere_does(
    clock: FakeClock, run: Runner
) -> None:
    script = Script(
        clock,
        [
            Step(Send, [_lost()] * MASTERS),
            Step(Send, _not_ours(3000)),
            Step(Watch, False),
            Step(Wait, "woken"),
            Step(Send, [_lost_probe(2000)] * MASTERS),  # every master answered nil: nothing to undo
            Step(Wait, "woken"),
            # won 1, one master down (it may have applied the SET): undone on every master
            Step(Send, [NodeResult([b"OK", -2], 0)] + [_lost_probe(2000)] * 3 + [_down()]),
            Step(Send, [NodeResult([1, -2], 0), *_not_ours(2000)[1:]], takes=0.001),
            # a race, not a held quorum: a random pause of at most 3 round trips (0 here: no time passed)
            Step(Send, [NodeResult([b"OK", 10_000], 0)] * MASTERS),
        ],
    )
    grant, _epochs = run(_redlock(clock), script)
    script.done()
    assert script.kinds() == ["Send", "Send", "Watch", "Wait", "Send", "Wait", "Send", "Send", "Send"]
    wait = script.ops[5]  # from the probe's own PTTLs: a quorum frees in 2 s (plus jitter)
    assert isinstance(wait, Wait) and wait.timeout is not None and 2.0 < wait.timeout <= 2.0 + 0.0505
    undo = script.sends[4]  # after the first attempt, its undo, the probe, the attempt that won one
    assert undo.idempotent and undo.calls[0].script is RELEASE
    assert grant.sent_at == script.started[8]


def test_redlock_cancel_during_the_wait_gives_up(clock: FakeClock, run: Runner) -> None:
    script = Script(
        clock,
        [Step(Send, [_lost()] * MASTERS), Step(Send, _not_ours()), Step(Watch, False), Step(Wait, "cancelled")],
    )
    assert run(_redlock(clock), script) is None
    script.done()


def test_redlock_missed_wake_up_retries_before_waiting(clock: FakeClock, run: Runner) -> None:
    script = Script(
        clock,
        [
            Step(Send, [_lost()] * MASTERS),
            Step(Send, _not_ours()),
            Step(Watch, True),
            Step(Send, [_won()] * MASTERS),
        ],
    )
    grant, _epochs = run(_redlock(clock), script)
    script.done()
    assert script.kinds() == ["Send", "Send", "Watch", "Send"] and grant.sent_at == START


def test_redlock_pause_waits_before_the_first_attempt(clock: FakeClock, run: Runner) -> None:
    """The releaser's yield (flow.YIELD_ROUNDS): the first attempt goes out only after the pause."""
    flow = redlock_acquire_flow(KEYS, TOKEN, TTL, None, clock, MASTERS, RETRY_DELAY, pause=0.004)
    script = Script(clock, [Step(Wait, "timeout", takes=0.004), Step(Send, [NodeResult([b"OK", 10_000], 0)] * 5)])
    grant, _epochs = run(flow, script)
    script.done()
    wait = script.ops[0]
    assert isinstance(wait, Wait) and wait.timeout == pytest.approx(0.004)
    assert [c.args[0] for c in script.sends[0].calls] == ["SET", "PTTL"]  # it expects the lock taken
    assert grant.sent_at == pytest.approx(START + 0.004)  # validity counted from the attempt, after the pause


def test_redlock_pause_is_capped_by_the_deadline_and_skipped_by_a_one_shot(clock: FakeClock, run: Runner) -> None:
    capped = redlock_acquire_flow(KEYS, TOKEN, TTL, START + 0.001, clock, MASTERS, RETRY_DELAY, pause=0.004)
    script = Script(clock, [Step(Wait, "timeout", takes=0.001), Step(Send, [_won()] * MASTERS)])
    run(capped, script)
    wait = script.ops[0]
    assert isinstance(wait, Wait) and wait.timeout == pytest.approx(0.001)
    one_shot = redlock_acquire_flow(KEYS, TOKEN, TTL, START, clock, MASTERS, RETRY_DELAY, pause=0.004)
    script = Script(clock, [Step(Send, [_won()] * MASTERS)])
    run(one_shot, script)
    assert script.kinds() == ["Send"]


def test_redlock_cancel_during_the_pause_gives_up(clock: FakeClock, run: Runner) -> None:
    flow = redlock_acquire_flow(KEYS, TOKEN, TTL, None, clock, MASTERS, RETRY_DELAY, pause=0.004)
    script = Script(clock, [Step(Wait, "cancelled")])
    assert run(flow, script) is None
    script.done()


def test_redlock_retry_after_an_undo_that_missed_a_master_is_undone_again(clock: FakeClock, run: Runner) -> None:
    """An undo that did not reach a master may have left our key there, and that master then answers the next
    SET NX with nil like any held master: so that retry is undone too, even though it won nowhere."""
    script = Script(
        clock,
        [
            Step(Send, [_down(), _lost(), _lost(), _lost(), _lost()]),  # the first master may have applied it
            Step(Send, [_down(), *_not_ours(3000)[1:]]),  # and the undo misses it too
            Step(Watch, False),
            Step(Wait, "woken"),
            Step(Send, [_lost_probe(3000)] * MASTERS),  # nil everywhere, the first master's maybe our own key
            Step(Send, [NodeResult([1, -2], 0), *_not_ours(3000)[1:]]),  # undone: it was
            Step(Wait, "woken"),
            Step(Send, [_lost_probe(3000)] * MASTERS),  # now nothing of ours is left anywhere: no undo
            Step(Wait, "cancelled"),
        ],
    )
    assert run(_redlock(clock), script) is None
    script.done()
    assert script.kinds() == ["Send", "Send", "Watch", "Wait", "Send", "Send", "Wait", "Send", "Wait"]
    assert script.sends[3].calls[0].script is RELEASE


def test_redlock_retry_that_won_a_minority_is_undone_even_with_every_master_answering(
    clock: FakeClock, run: Runner
) -> None:
    won_two = [NodeResult([b"OK", 10_000], 0)] * 2 + [_lost_probe(3000)] * 3
    script = Script(
        clock,
        [
            Step(Send, [_lost()] * MASTERS),
            Step(Send, _not_ours(3000)),
            Step(Watch, False),
            Step(Wait, "woken"),
            Step(Send, won_two, takes=0.001),
            Step(Send, [NodeResult([1, -2], 0)] * 2 + _not_ours(3000)[2:]),  # the minority grant, released
            Step(Wait, "cancelled"),
        ],
    )
    assert run(_redlock(clock), script) is None
    script.done()
    undo = script.sends[3]
    assert undo.idempotent and undo.calls[0].script is RELEASE and TOKEN in undo.calls[0].args
