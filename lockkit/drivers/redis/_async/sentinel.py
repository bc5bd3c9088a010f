"""The Sentinel-managed Redis driver (``redis+sentinel://``, ``rediss+sentinel://``): :class:`AsyncSentinelDriver`.

This file is the source of the blocking :class:`SentinelDriver` too (``scripts/unasync.py`` generates
``../_sync/sentinel.py``). It is the single-node driver (:mod:`.single`) pointed at whatever master the
sentinels name, with three additions; the URL, guarantees and the failover story are documented in
:mod:`lockkit.drivers.redis.sentinel`:

* **following the master**: every call runs on the current master's node; a call that cannot have run there
  (the connection was refused or broke before it was sent, the server is no longer a master — the ROLE check
  of every fresh connection, a ``READONLY`` reply — or it is still ``LOADING``) asks the sentinels again and
  runs on the master they name, for up to ``failover_wait`` seconds (an acquire: no longer than its own
  timeout, after one attempt); so does a call whose connection broke
  after it was sent (see :meth:`AsyncSentinelDriver._attempt` for why even an acquire may go again);
* **announcements**: a pub/sub connection to a sentinel hears ``+promoted-slave`` and
  ``+failover-state-reconf-slaves`` (the sentinel running a failover names the promoted replica from then on)
  and ``+switch-master`` (every other sentinel, once it learnt); the next call asks the sentinels before it
  sends anything (a master that moved without failing is followed before it is used); so does the next call
  after that connection was re-established (an announcement may have been missed while it was down);
* **waking across a failover**: the shared pub/sub hub reconnects to the current master, re-subscribes and
  wakes every waiter, which looks again there;
* **fencing across a failover**: tokens are ``config_epoch << 48 | counter`` (:func:`..epoch.composite_token`),
  with the sentinels' config-epoch of the master that granted them;
* **semaphores and reader-writer locks** (:class:`AsyncSentinelPermits`): the scripts of ``redis://`` on the
  current master, following it as every call does, their fences lifted by the epoch of the master whose reply
  carried them (a grant told by a release's message: of the master followed when the acquire began, if it is
  still the one followed, as for locks).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from redis.exceptions import AuthenticationError, BusyLoadingError, ReadOnlyError, RedisError
from redis.exceptions import ConnectionError as RedisConnectionError

from ....driver import Cancel, DriverContext, Grant, Guarantees, HolderInfo, PermitMode, RenewRequest
from ....errors import BackendUnavailable
from ....urls import BackendURL
from ...epoch import composite_token
from ..calls import Call
from ..config import NodeSpec
from ..errors import translate
from ..flow import checked, holder_info, release_call
from ..hub import Hub, forks
from ..scripts import FAIR_HOLDER
from ..semaphore_scripts import SENTINEL_PERMITS
from ..sentinel_config import SentinelTarget, sentinel_target
from .node import AsyncNode
from .primitives import pause
from .semaphore import AsyncRedisPermits
from .sentinels import AsyncSentinels
from .single import AsyncRedisDriver

__all__ = ["GUARANTEES", "AsyncSentinelDriver", "AsyncSentinelPermits"]

log = logging.getLogger("lockkit")

SWITCH_CHANNEL = b"+switch-master"
ANNOUNCEMENTS = (b"+promoted-slave", b"+failover-state-reconf-slaves", SWITCH_CHANNEL)
"""A sentinel's events after which it may name another master. The sentinel that runs a failover names the
promoted replica from ``+promoted-slave`` (and ``+failover-state-reconf-slaves``, published in the same step)
on, but announces ``+switch-master`` only at ``+failover-end``, once the other replicas were reconfigured (~1 s
later with two replicas; more, reconfigured ``parallel-syncs`` at a time, take longer). A master demoted by
``SENTINEL FAILOVER`` stays writable meanwhile, so a client that waited for ``+switch-master`` granted on the old
master while a client asking afresh granted on the new one (docs audit F6). The other sentinels switch when the
leader's hello reaches them (~0.1 s later) and announce ``+switch-master`` then. Earlier events are no use
here: until ``+promoted-slave`` every sentinel still names the old master, so asking again would not move us."""
_CALLER_GIVES_UP: contextvars.ContextVar[float | None] = contextvars.ContextVar("lockkit_sentinel_until", default=None)
"""The monotonic time the current acquire's own deadline ends at: following a failover never keeps an acquire
past it (a context variable, so that concurrent tasks and threads each see their own)."""

GUARANTEES = Guarantees(
    scope="single-node",
    fifo=True,
    fencing="strict",
    survives_failover=False,
    lifetime="ttl",
    note="One Redis master at a time, followed across Sentinel failovers; replication is asynchronous, so a "
    "grant that had not reached the promoted replica is lost and a second client can take the lock "
    "(min_replicas=N narrows this to grants no replica acknowledged). Fencing tokens carry the sentinels' "
    "config-epoch (epoch << 48 | counter), so they stay increasing across failovers.",
    semaphores=SENTINEL_PERMITS,  # issue 18: AsyncSentinelPermits
)


class _Again(Exception):
    """The calls did not run on the master (or, ``sent``, may have run; they are safe to send again): ask the
    sentinels."""

    def __init__(self, why: BaseException, sent: bool) -> None:
        super().__init__(str(why))
        self.why, self.sent = why, sent


def _moved(replies: Sequence[Any]) -> BaseException | None:
    """A reply that says the server is a replica now: nothing of the calls was written."""
    for reply in replies:
        if isinstance(reply, ReadOnlyError):
            return reply
    return None


def _service_of(event: bytes, parts: list[str]) -> str | None:
    """The service an announcement is about. ``+switch-master``: ``<service> <old ip> <old port> <new ip> <new
    port>``; an event about a replica or a sentinel: ``<kind> <name> <ip> <port> @ <service> <ip> <port>``; about a
    master: ``master <service> <ip> <port>``."""
    if event == SWITCH_CHANNEL:
        return parts[0] if parts else None
    if "@" in parts[:-1]:
        return parts[parts.index("@") + 1]
    if len(parts) > 1 and parts[0] == "master":
        return parts[1]
    return None


class AsyncSentinelDriver(AsyncRedisDriver):
    guarantees: ClassVar[Guarantees] = GUARANTEES

    def __init__(self, target: SentinelTarget, ctx: DriverContext) -> None:
        super().__init__(target.template, target.options, ctx)
        self.target = target
        self._sentinels = AsyncSentinels(target)
        self._where: tuple[str, int, int] | None = None
        """(host, port, config epoch) of the master the current node talks to; None until first asked."""
        self._epoch = 0
        self._generation = 0
        """Bumped at every change of master: a caller that saw an older one knows someone already followed."""
        self._retired: list[AsyncNode] = []
        # A pub/sub connection to a sentinel, for its ANNOUNCEMENTS: a master that moved without failing (a manual
        # failover, or one the sentinels voted while we could still reach the old master) is followed at the next
        # call, before anything is sent to the old one. Steady state: one flag read per call, no round trip.
        self._switch_hub = Hub(target.sentinels[0])
        self._listening = False
        self._switched = False
        self._forks = forks()
        """The process ``_listening`` speaks for, as :func:`..hub.forks` counts it (see :meth:`_own_process`)."""

    @classmethod
    def from_url(cls, url: BackendURL, ctx: DriverContext) -> AsyncSentinelDriver:
        return cls(sentinel_target(url), ctx)

    # -- following the master ---------------------------------------------------------------

    async def _follow(self, seen: int) -> None:
        """Ask the sentinels; switch to the master they name if it is not the one of generation ``seen``."""
        if seen != self._generation and self._where is not None:
            return  # another caller followed already
        master = await self._sentinels.locate()
        # Listen to the sentinel that answered (it is up, and it is the one asked first next time: what it
        # announces is what the next question hears); a change takes effect at the hub's next (re)connection.
        self._switch_hub.retarget(self._sentinels.first)
        where = (master.host, master.port, master.epoch)
        if where != self._where:
            self._switch(master.host, master.port, master.epoch)
        if not self._listening:  # not only with a new master: a forked child listens afresh (see _own_process)
            self._listening = True  # first: a concurrent caller must not subscribe a second time
            try:
                await self._listen(self._sentinels.first)
            except BaseException:  # cancelled (or worse) before subscribing: the next follow listens
                self._listening = False
                raise

    def _switch(self, host: str, port: int, epoch: int) -> None:
        """Talk to the master at ``host:port`` (of config epoch ``epoch``) from now on."""
        if self._where is not None:
            log.warning(
                "lockkit: the sentinels name %s:%d as the master of %r now (config epoch %d, was %d)",
                host, port, self.target.service, epoch, self._epoch,
            )  # fmt: skip
            # Not closed here: another thread or task may be mid-call on it. Its server is gone or demoted
            # (Sentinel kills a demoted master's clients), so its connections die anyway; close() ends them.
            self._retired.append(self._node)
        spec = self.target.master(host, port)
        self.spec, self._node, self._epoch, self._where = spec, AsyncNode(spec), epoch, (host, port, epoch)
        self._generation += 1
        self._hub.retarget(spec)

    def _own_process(self) -> None:
        """In a forked child: the announcements' subscription is the parent's (its socket, and what it hears
        reaches the parent only), so the child's hub starts afresh and the next follow subscribes on a connection
        of the child's own; until then an announcement may go unheard, so that follow comes at once."""
        self._forks = forks()
        self._switch_hub.own_process()
        self._listening = False
        self._switched = True

    async def _listen(self, sentinel: NodeSpec) -> None:
        """Subscribe the ANNOUNCEMENTS the sentinel's ACL allows (one connection, once per driver). A user whose
        rule grants ``+switch-master`` only (the rule docs/backends/redis.md gave before) would have every
        announcement refused if they were subscribed together; it keeps ``+switch-master``, and is told what the
        missing channels cost. ``+switch-master`` is subscribed even if refused: the hub warns and retries."""
        refused = await self._sentinels.refused(sentinel, ANNOUNCEMENTS)
        events = [event for event in ANNOUNCEMENTS if event not in refused or event == SWITCH_CHANNEL]
        missing = [event.decode() for event in refused if event != SWITCH_CHANNEL]
        if missing:
            log.warning(
                "lockkit: sentinel %s refused this client's subscription to %s: a manual failover (SENTINEL "
                "FAILOVER) is then followed only at +switch-master, about a second after the sentinels name the new "
                "master, and two clients can hold one lock meanwhile. Allow the channels (%s) in the sentinel "
                "user's ACL rule (docs/backends/redis.md)",
                sentinel.label, ", ".join(missing), " ".join(f"&{event}" for event in missing),
            )  # fmt: skip
        for event in events:
            self._background.listen(self._switch_hub, event, self._hearer(event))

    def _hearer(self, event: bytes) -> Callable[[bytes], None]:
        """What the hub calls, on its loop, with each message of ``event``'s channel: only a flag is set, the
        next call asks the sentinels (a question costs a round trip; several announcements cost one)."""

        def heard(message: bytes) -> None:
            if not message:
                # The hub's connection to the sentinel failed or was made again (or, blocking face, first
                # subscribed): an announcement may have gone unheard, so ask once more (and, if that sentinel is
                # down, another answers and the hub is pointed at it).
                self._switched = True
                log.debug("lockkit: the sentinel pub/sub connection for %r came or went", self.target.service)
                return
            parts = message.decode(errors="replace").split()
            if _service_of(event, parts) == self.target.service:
                self._switched = True
                log.info(
                    "lockkit: a sentinel announced %s for %r: %s", event.decode(), self.target.service, " ".join(parts)
                )

        return heard

    async def _located(self) -> None:
        if self._where is None:
            await self._run_on([Call(None, (), ("PING",))])

    async def _attempt(self, node: AsyncNode, calls: Sequence[Call], by: float | None) -> list[Any]:
        try:
            pending = await node.send(calls, by=by)
        except AuthenticationError as exc:
            raise translate(node.spec, exc) from exc
        except RedisConnectionError as exc:  # refused, reset before sending, or ROLE said replica: nothing ran
            raise _Again(exc, sent=False) from exc
        except RedisError as exc:
            raise translate(node.spec, exc) from exc
        try:
            replies = await node.receive(pending, node.reply_deadline(by))
        except BusyLoadingError as exc:  # still loading its data set: it ran nothing
            raise _Again(exc, sent=False) from exc
        except RedisConnectionError as exc:
            # Sent, and the reply lost (most often: the master died under it). Every call of these drivers may
            # go again, even an acquire: the fair acquire script finds its own token and only extends it (a
            # grant that did happen is returned, never a second one), renew, release and leave are owner-checked,
            # and a repeated WAIT only waits. Unlike redis://, where there is nowhere else to go, a failover makes
            # "try once more, on the master the sentinels name now" the way to serve the caller.
            raise _Again(exc, sent=True) from exc
        except RedisError as exc:
            raise translate(node.spec, exc) from exc
        moved = _moved(replies)
        if moved is not None:
            raise _Again(moved, sent=False)
        return replies

    async def _run_on(self, calls: Sequence[Call], by: float | None = None) -> tuple[list[Any], int, bool]:
        """The replies of ``calls`` from the master, that master's config epoch, and whether the calls may have
        run twice (sent again after their connection broke under them). ``by``: as :meth:`AsyncNode.run`'s, an
        acquire attempt's deadline for each reply (a paused master is reported by then, not by ``timeout``)."""
        give_up = time.monotonic() + self.target.options.failover_wait
        caller = _CALLER_GIVES_UP.get()
        if caller is not None:
            give_up = min(give_up, caller)  # at least one attempt, even past it
        backoff = 0.05
        repeated = False
        last: BaseException | None = None
        if self._forks != forks():  # forked since the last call (a counter read, no system call)
            self._own_process()
        while True:
            if self._switched and self._where is not None:
                self._switched = False
                with contextlib.suppress(BackendUnavailable):  # the calls below find their way anyway
                    await self._follow(self._generation)
            generation = self._generation
            if self._where is not None:
                node, epoch = self._node, self._epoch
                try:
                    return await self._attempt(node, calls, by), epoch, repeated
                except _Again as again:
                    repeated = repeated or again.sent
                    last = again.why
            # Ask the sentinels even when out of time, so that the next call goes to the new master.
            try:
                await self._follow(generation)
            except BackendUnavailable as exc:  # no sentinel answered: keep trying until give_up
                last = exc
            else:
                if self._generation != generation:
                    continue  # a new master (or the first): try it at once
            if time.monotonic() >= give_up:
                raise self._gave_up(last)
            await pause(backoff)
            backoff = min(0.5, backoff * 2)

    def _gave_up(self, last: BaseException | None) -> BackendUnavailable:
        return BackendUnavailable(
            f"redis+sentinel {self.target.service!r}: no reachable master within failover_wait="
            f"{self.target.options.failover_wait:g} s or the acquire's timeout (sentinels {self.target.tried}); "
            f"last error: {last}. A failover may still be under way: retry, or raise failover_wait"
        )

    async def _run(self, calls: Sequence[Call], idempotent: bool, by: float | None = None) -> list[Any]:
        """``idempotent`` is not needed here: every call may go again (see :meth:`_attempt`). ``by`` bounds each
        reply; following a failover is bounded by the acquire's deadline too (``_CALLER_GIVES_UP``)."""
        replies, _, _ = await self._run_on(calls, by)
        return replies

    # -- fencing tokens lifted by the master's epoch -------------------------------------

    async def acquire(
        self, name: str, token: str, ttl: float, deadline: float | None, cancel: Cancel | None = None
    ) -> Grant | None:
        until = None if deadline is None else time.monotonic() + max(0.0, deadline - self.clock())
        reset = _CALLER_GIVES_UP.set(until)
        try:
            await self._located()
            generation, epoch = self._generation, self._epoch
            grant = await super().acquire(name, token, ttl, deadline, cancel)
            if grant is None:
                return None
            if self._generation == generation:
                return Grant(composite_token(epoch, grant.fencing_token), grant.ttl, grant.sent_at)
            return await self._confirm(name, token, grant)
        finally:
            _CALLER_GIVES_UP.reset(reset)

    async def _confirm(self, name: str, token: str, grant: Grant) -> Grant:
        """The master changed while we acquired: the grant came from the old one or the new one, so its token's
        epoch is unknown. Ask the current master whether it holds the lock for us, and lift its fence by its epoch
        (a guess could rank an old master's token above a new master's holder)."""
        replies, epoch, _ = await self._run_on([Call(FAIR_HOLDER, self._keys(name).script_keys())])
        held, _, fence, _ = checked(replies[0], self.spec.label, "holder")
        if held is None or held.decode() != token or not fence:
            raise BackendUnavailable(
                f"redis+sentinel {self.target.service!r}: {name!r} was granted while the master failed over, and "
                "the promoted master does not have the grant (asynchronous replication lost it); this client "
                "does not hold the lock: acquire it again"
            )
        return Grant(composite_token(epoch, int(fence)), grant.ttl, grant.sent_at)

    async def renew_many(self, requests: Sequence[RenewRequest]) -> list[Grant | Exception | None]:
        sent_at = self.clock()
        replies, epoch, _ = await self._run_on(self._renew_calls(requests))
        return self._renewed(requests, replies, sent_at, epoch)

    async def release(self, name: str, token: str) -> bool:
        replies, _, repeated = await self._run_on([release_call(self._keys(name), token)])
        return self._released(name, replies[0], repeated)

    async def holder(self, name: str) -> HolderInfo:
        replies, epoch, _ = await self._run_on([Call(FAIR_HOLDER, self._keys(name).script_keys())])
        return holder_info(checked(replies[0], self.spec.label, "holder"), epoch)

    def permits(self, events: object = None) -> Any:
        """Semaphores and reader-writer locks on the current master (issue 18)."""
        return AsyncSentinelPermits(self)

    async def close(self) -> None:
        await self._background.close([self._hub, self._switch_hub])
        await self._node.close()
        for node in self._retired:
            await node.close()
        self._retired.clear()

    def __repr__(self) -> str:
        return f"AsyncSentinelDriver({self.target.service!r} via {self.target.tried})"


class AsyncSentinelPermits(AsyncRedisPermits):
    """The permits of :class:`AsyncRedisPermits` on the master the sentinels name.

    Every call runs through :meth:`AsyncSentinelDriver._run_on`, which follows a failover and names the config
    epoch of the master that answered: a fence is lifted by that epoch, so a promoted replica that missed the
    last grants (its counter behind) still hands out tokens above them. A grant told by a release's message is
    lifted by the epoch of the master followed when the acquire began if the driver still follows that one (the
    pub/sub hub is retargeted only when the driver follows a new master, so the message came from it, as the
    lock's acquire reasons); else it is confirmed by one more attempt on the master of now, whose reply names
    the epoch. A permit the promoted master never received is not found by that attempt, nor by the next
    renewal, which reports the loss.
    """

    def __init__(self, driver: AsyncSentinelDriver) -> None:
        super().__init__(driver)
        self._sentinel = driver

    async def _send(
        self, calls: Sequence[Call], idempotent: bool, by: float | None = None
    ) -> tuple[list[Any], int, bool]:
        return await self._sentinel._run_on(calls, by)  # and by the Sentinel driver's own failover wait

    async def _mark(self) -> tuple[int, int]:
        await self._sentinel._located()
        return self._sentinel._generation, self._sentinel._epoch

    def _by_message(self, mark: Any, fence: int) -> int | None:
        generation, epoch = mark
        if self._sentinel._generation != generation:
            return None  # the master changed while we waited: the message's master (and epoch) is unknown
        return self._lift(epoch, fence)

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
        clock = self._sentinel.clock
        until = None if deadline is None else time.monotonic() + max(0.0, deadline - clock())
        reset = _CALLER_GIVES_UP.set(until)  # following a failover never keeps the acquire past its deadline
        try:
            return await super().acquire_permit(name, token, ttl, deadline, limit, mode, cancel)
        finally:
            _CALLER_GIVES_UP.reset(reset)
