"""``migrate``: move a running fleet from one backend to another with no moment of double ownership.

Configured, not opened by URL::

    [backends.main]
    migrate = { from = "redis", to = "etcd", phase = "both" }   # old | both | new; optional group, presence_ttl

Phases, rolled out instance by instance: ``old`` → ``both`` → ``new``, and at the end a plain backend with
``fencing_epoch = 1`` (:mod:`.epoch`), which continues phase ``new``'s tokens without the old backend.

* ``old`` locks on the old backend only; ``new`` on the new backend only.
* ``both`` acquires the old backend's lock, then the new one's (a fixed order: no deadlock among ``both``
  clients), renews both, and releases in reverse (the old one even if the new one's release fails). If the
  second acquire fails or times out, the first is released before the error reaches the caller. Losing either
  lease loses the lock.

Any two clients in adjacent phases contend on at least one common backend, so mutual exclusion holds during
a rolling change. ``old`` and ``new`` share no backend, so they must never hold a lock at once. Every client
announces ``(phase, host, pid)`` in both backends' presence records (refreshed every ``presence_ttl/3``,
expiring ``presence_ttl`` after the last refresh), and reads them after announcing. A ``new`` client refuses
to lock while any ``old`` client is alive, and an ``old`` client while any ``new`` one is alive.

Why that excludes ``old`` and ``new`` (the rule the code keeps): a client in ``old`` or ``new`` trusts a lease
only while its own presence is *proven*: an announce sent at ``s`` completed, a read of the fleet after it
showed no conflicting client, and it is not yet ``s + presence_ttl`` (less the clock drift margin). Every
grant and renewal is capped to that instant, and a grant that comes back after it (a waiter paused past
``presence_ttl``, scenario A-3) does not count: it is released, the fleet is checked again, and the acquire
waits on or raises. Suppose an ``old`` client A and a ``new`` client N both held valid leases at ``t``, with
proofs (announce completed at ``cA``, read ``rA``) and (``cN``, ``rN``), both reads before ``t``. Reads and
announces are linearizable per backend; say ``rA`` came before ``rN``. A's record exists from ``cA < rA``
until at least ``sA + presence_ttl > t > rN``, so N's read saw it, and N would have refused. The other order
is symmetric.

A client never announces just to be refused: when its proof has lapsed (first start, a pause, an outage) it
reads the fleet first and refuses without writing if a conflicting client is alive, and when the read after
its announce finds one it withdraws at once (A-4). Otherwise its record would make correct clients refuse
too. A started client whose presence cannot be refreshed, or that sees a conflicting client, is *fenced
off*: it reports every lease it holds as lost, refuses their renewals for good, and refuses grants until a
later refresh proves it alone again.

Fencing tokens stay strictly increasing across the whole roll: ``old`` returns the old backend's token as is
(epoch 0, so it interleaves with clients that never heard of the migration); ``new`` returns
``(1 << 48) | token`` of the new backend. ``both`` returns the old backend's token until the first ``new``
client has started, and the new composite after: the first ``new`` client writes a permanent *epoch* record
in the new backend before it takes any lock, and ``both`` clients read it while holding both locks, so the
switch happens at one point in the lock's history. Rolling back from ``new`` to ``both`` keeps epoch 1;
rolling back to ``old`` after the switch would make tokens go backwards (the runbook says how to reset).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import socket
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, cast

from ..driver import (
    Cancel,
    Driver,
    DriverContext,
    Grant,
    Guarantees,
    HolderInfo,
    Offer,
    Presence,
    RenewRequest,
    one_renewal,
)
from ..errors import BackendUnavailable, ConfigError, LockError, LockLost
from ..timing import lease_deadline
from .epoch import EPOCH_SHIFT, composite_token

PRUNE_AT = 256
"""How many held-lease entries a migrate driver keeps before it drops the ended ones (and then twice as many)."""

__all__ = [
    "EPOCH_SHIFT",
    "PHASES",
    "FleetConflict",
    "MigrateDriver",
    "MigrateOptions",
    "combined_guarantees",
    "composite_token",
    "next_step",
]

log = logging.getLogger("lockkit")

PHASES = ("old", "both", "new")
Phase = Literal["old", "both", "new"]
CONFLICTS: dict[str, str | None] = {"old": "new", "new": "old", "both": None}
_SCOPES = ["process", "host", "single-node", "majority", "consensus"]
_SHOWN_MEMBERS = 5


class FleetConflict(ConfigError):
    """A client of the conflicting phase is alive: this one takes no locks (the message names who, and what to do)."""


@dataclass(frozen=True)
class MigrateOptions:
    phase: str
    group: str
    presence_ttl: float = 15.0

    def __post_init__(self) -> None:
        if self.phase not in PHASES:
            raise ConfigError(f"migrate phase must be one of old, both, new; got {self.phase!r}")
        if not 1.0 <= self.presence_ttl <= 3600:
            raise ConfigError(
                f"migrate presence_ttl must be 1 to 3600 seconds, got {self.presence_ttl}; "
                "set a value in that range, or leave it out for the default"
            )


def _presence(driver: Driver, role: str) -> Presence:
    if not isinstance(driver, Presence):
        raise ConfigError(
            f"the {role} backend's driver ({type(driver).__name__}) keeps no presence records, which a "
            "migration needs for fleet safety. Migrate between backends that keep them (e.g. file://, redis://, "
            "etcd://, zookeeper://)"
        )
    return driver


PERMITS_ON_ONE_SIDE = Offer(
    "not yet",
    "a migrate backend moves locks only: a permit would live on one side, and holders on the other would not "
    "count it; route semaphores and reader-writer locks to a backend entry of their own (the old backend until "
    "every client uses the new one, then the new)",
)


def combined_guarantees(old: Guarantees, new: Guarantees, phase: str) -> Guarantees:
    """The guarantees of a migration in ``phase``; permits are never offered through it (not passed through)."""
    if phase == "old":
        return dataclasses.replace(old, semaphores=PERMITS_ON_ONE_SIDE)
    if phase == "new":
        return dataclasses.replace(new, semaphores=PERMITS_ON_ONE_SIDE)
    return Guarantees(
        scope=min(old.scope, new.scope, key=_SCOPES.index),
        fifo=old.fifo and new.fifo,
        fencing="strict" if old.fencing == new.fencing == "strict" else "best-effort",
        survives_failover=old.survives_failover and new.survives_failover,
        lifetime="ttl" if "ttl" in (old.lifetime, new.lifetime) else "session",
        server_wakeup=old.server_wakeup and new.server_wakeup,
        note="migration phase 'both': holds the old and the new backend's lock",
        semaphores=PERMITS_ON_ONE_SIDE,
    )


class MigrateDriver:
    """Holds a lock on the old backend, the new one, or both, by phase (see the module docstring)."""

    guarantees: ClassVar[Guarantees]

    def __init__(self, old: Driver, new: Driver, options: MigrateOptions, ctx: DriverContext) -> None:
        self.old, self.new = old, new
        self.options = options
        self.phase = options.phase
        self._presences = [_presence(old, "old"), _presence(new, "new")]
        self.guarantees = combined_guarantees(old.guarantees, new.guarantees, self.phase)  # type: ignore[misc]
        self._ctx = ctx
        self._clock = ctx.clock
        self._conflict = CONFLICTS[self.phase]
        self.member = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._group = f"lockkit-migrate:{options.group}"
        self._epoch_group = f"lockkit-migrate:{options.group}:epoch"
        self._epoch_seen = self.phase == "new"
        self._refreshing = threading.RLock()
        """Held across a refresh's I/O (announce, fleet read, withdraw, the fence-off it leads to), so that proofs
        and fence-offs happen one at a time and in order. Reentrant: an ``on_lost`` run by a fence-off may lock."""
        self._mutex = threading.Lock()
        """Guards the fields below; never held across I/O or a callback (renewals and releases take it)."""
        self._proven_until = -math.inf
        """Our presence is proven (announced, then a fleet read without conflict) until this ``ctx.clock`` instant."""
        self._wrote = False
        """Whether we ever sent an announce (so a record of ours may exist to withdraw)."""
        self._fenced_off: tuple[type[LockError], str] | None = None
        self._generation = 0
        """Bumped by every fence-off: a lease granted under an older generation is never renewed again."""
        # token -> (fencing token, generation granted in, when its lease ends at the latest); entries whose lease
        # ended are dropped as acquires go by, so leases that are never released do not pile up.
        self._held: dict[str, tuple[int, int, float]] = {}
        self._prune_at = PRUNE_AT
        """token -> (fencing token handed out, generation it was granted under)."""
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None

    # -- fleet safety -------------------------------------------------------------------------

    def _record(self) -> str:
        return json.dumps({"phase": self.phase, "host": socket.gethostname(), "pid": os.getpid()})

    def fleet(self) -> dict[str, dict[str, str]]:
        """Live clients by member id, merged from both backends: ``{member: {phase, host, pid}}``."""
        seen: dict[str, dict[str, str]] = {}
        for presence in self._presences:
            for member, raw in presence.members(self._group).items():
                try:
                    seen[member] = json.loads(raw)
                except ValueError:
                    seen[member] = {"phase": "?", "host": "?", "pid": "?"}
        return seen

    def _check_fleet(self) -> None:
        """Raise :class:`FleetConflict` if a client of the conflicting phase is alive (one read of each backend)."""
        if self._conflict is None:
            return
        others = [r for m, r in self.fleet().items() if m != self.member and r.get("phase") == self._conflict]
        if others:
            raise self._refusal(others)
        if self.phase == "old" and self.epoch_switched():
            # No 'new' client alive, but one has run: its tokens (epoch 1) rank above every token the old backend
            # can give, so this client's would go backwards — refused, as docs/migration.md's step 3 says.
            raise FleetConflict(
                f"migration {self.options.group!r}: this client is in phase 'old' but a 'new' client has switched "
                "the fencing epoch (tokens come from the new backend since), so its tokens would rank below those "
                "already issued and this client takes no locks. Stop this instance or set its migrate phase to "
                "'both' or 'new' like the rest; to roll back past the switch, follow docs/migration.md, 'Rolling "
                "back' (the epoch record is deleted there)"
            )

    def _refusal(self, others: Sequence[Mapping[str, Any]]) -> FleetConflict:
        shown = sorted(f"{r.get('host')}:{r.get('pid')} (phase {self._conflict!r})" for r in others)
        listed = ", ".join(shown[:_SHOWN_MEMBERS]) + (
            f" and {len(shown) - _SHOWN_MEMBERS} more" if len(shown) > _SHOWN_MEMBERS else ""
        )
        if self.phase == "old":
            advice = (
                "The fleet has moved on and this instance's configuration is behind it: stop this instance, or set "
                "its migrate phase to 'both' (or 'new') like the rest and restart it"
            )
        else:
            advice = (
                "Roll those instances to 'both' first (or stop them if they are leftovers), or set this instance "
                "back to phase 'both' until they are gone"
            )
        return FleetConflict(
            f"migration {self.options.group!r}: this client is in phase {self.phase!r} but {len(others)} client(s) "
            f"in phase {self._conflict!r} are alive: {listed}; the two phases share no backend, so this client "
            f"takes no locks. {advice} (`lockkit migrate status` shows the fleet)"
        )

    def _refresh(self) -> None:
        """Prove our presence again (caller holds ``_refreshing``): announce, then read the fleet; raise if refused.

        A refused client leaves no record: it looks before writing when its proof has lapsed, and withdraws at
        once when the read after its announce finds a conflict.
        """
        with self._mutex:
            lapsed = self._clock() >= self._proven_until
        if self._conflict is not None and lapsed:
            try:
                self._check_fleet()
            except FleetConflict:
                self._withdraw()  # a record from before the lapse may still be live
                raise
        sent = self._clock()
        self._wrote = True
        for presence in self._presences:
            presence.announce(self._group, self.member, self._record(), self.options.presence_ttl)
        try:
            self._check_fleet()
        except FleetConflict:
            self._withdraw()
            raise
        if self.phase == "new":
            self._presences[1].announce(self._epoch_group, "epoch", "1", None)
        with self._mutex:
            self._proven_until = max(self._proven_until, lease_deadline(sent, self.options.presence_ttl))

    def _withdraw(self) -> None:
        """Caller holds ``_refreshing``."""
        with self._mutex:
            self._proven_until = -math.inf
        if not self._wrote:
            return
        for presence in self._presences:
            try:
                presence.withdraw(self._group, self.member)
            except Exception:  # best effort: the record then expires presence_ttl after our last announce
                log.warning("lockkit: withdrawing a migration presence record failed", exc_info=True)

    def _fenced_error(self) -> LockError | None:
        """Caller holds ``_mutex``."""
        if self._fenced_off is None:
            return None
        kind, reason = self._fenced_off
        return kind(reason)

    def _admit(self) -> int:
        """May this client take a lock now? The fence-off generation its grant must come back under."""
        with self._mutex:
            error, lapsed = self._fenced_error(), self._clock() >= self._proven_until
        if error is not None:
            raise error
        if lapsed:  # first start, or lapsed (a pause, an outage): prove it again before waiting
            with self._refreshing:
                with self._mutex:
                    lapsed = self._clock() >= self._proven_until  # another thread may have just done it
                if lapsed:
                    try:
                        self._refresh()
                    except FleetConflict as exc:
                        if self._heartbeat is not None:
                            self._fence_off(FleetConflict, str(exc))
                        raise
        with self._mutex:
            error = self._fenced_error()
            if error is None and self._heartbeat is None:
                self._heartbeat = threading.Thread(target=self._beat, name="lockkit-migrate-presence", daemon=True)
                self._heartbeat.start()
            generation = self._generation
        if error is not None:
            raise error
        return generation

    def _beat(self) -> None:
        while not self._stop.wait(self.options.presence_ttl / 3):
            with self._refreshing:
                if self._stop.is_set():
                    return
                try:
                    self._refresh()
                except FleetConflict as exc:
                    self._fence_off(FleetConflict, str(exc))
                except Exception as exc:  # any failure to refresh: a conflicting client could start unseen
                    self._fence_off(
                        BackendUnavailable,
                        f"migration {self.options.group!r}: this client's presence record could not be refreshed "
                        f"({exc}), so a client of another phase could start unseen; it takes no locks until a "
                        "refresh succeeds (check that both backends are reachable: lockkit migrate check)",
                    )
                else:
                    with self._mutex:
                        self._fenced_off = None  # proven alone again; leases reported lost stay lost

    def _fence_off(self, kind: type[LockError], reason: str) -> None:
        """Stop locking: our presence may lapse or a conflicting phase is alive, so overlap is possible."""
        with self._mutex:
            first = self._fenced_off is None
            self._fenced_off = (kind, reason)
            lost = [token for token, (_, generation, _) in self._held.items() if generation == self._generation]
            self._generation += 1
        if first:
            log.error("lockkit: %s; refusing new locks and reporting %d held lock(s) lost", reason, len(lost))
        for token in lost:  # outside _mutex: on_lost callbacks may release or renew
            self._ctx.events.lost(token, reason)

    def _not_counted(self, generation: int, sent_at: float, ttl: float) -> tuple[str, float]:
        """Why a grant or renewal sent at ``sent_at`` must not count (``""``: it counts), and its capped ttl.

        Caller holds ``_mutex``. In ``old`` and ``new`` a lease may be trusted only while our presence is
        proven (see the module docstring), so its ttl is capped at the proof's end.
        """
        if self._fenced_off is not None:
            return self._fenced_off[1], ttl
        if generation != self._generation:
            return "this client was fenced off while the request was in flight", ttl
        if self._conflict is None:
            return "", ttl
        capped = min(ttl, self._proven_until - sent_at)
        if capped <= 0 or lease_deadline(sent_at, capped) <= self._clock():
            return (
                f"migration {self.options.group!r}: this client's presence was not proven alive when the lock "
                f"came (paused or cut off for longer than presence_ttl = {self.options.presence_ttl:g} s?)",
                capped,
            )
        return "", capped

    def epoch_switched(self) -> bool:
        """Whether a ``new`` client has started (tokens come from the new backend from then on)."""
        return bool(self._presences[1].members(self._epoch_group))

    def _epoch(self) -> int:
        if not self._epoch_seen and self._presences[1].members(self._epoch_group):
            self._epoch_seen = True
        return 1 if self._epoch_seen else 0

    # -- the driver contract -------------------------------------------------------------------

    def _order(self) -> list[Driver]:
        return {"old": [self.old], "new": [self.new], "both": [self.old, self.new]}[self.phase]

    def acquire(
        self, name: str, token: str, ttl: float, deadline: float | None, cancel: Cancel | None = None
    ) -> Grant | None:
        while True:
            generation = self._admit()
            taken = self._acquire_all(name, token, ttl, deadline, cancel)
            if taken is None:
                return None
            fence, grant = taken
            with self._mutex:
                reason, capped = self._not_counted(generation, grant.sent_at, grant.ttl)
                if not reason:
                    self._forget_ended()
                    self._held[token] = (fence, generation, grant.sent_at + capped)
                    return Grant(fence, capped, grant.sent_at)
                fenced = self._fenced_error()
            # The grant does not count: give the lock back, then check the fleet again (in _admit) and wait on,
            # or raise the refusal. Counting it could let an 'old' and a 'new' client hold the name at once.
            self._release_all(self._order(), name, token)
            log.warning("lockkit: a grant of %r did not count and was released: %s", name, reason)
            if fenced is not None:
                raise fenced
            if cancel is not None and cancel.cancelled:
                return None

    def _acquire_all(
        self, name: str, token: str, ttl: float, deadline: float | None, cancel: Cancel | None
    ) -> tuple[int, Grant] | None:
        """Take the phase's locks in order: ``(fencing token, combined grant)``, or ``None`` with none held."""
        grants: list[Grant] = []
        taken: list[Driver] = []
        try:
            for driver in self._order():
                grant = driver.acquire(name, token, ttl, deadline, cancel)
                if grant is None:
                    self._release_all(taken, name, token)
                    return None
                taken.append(driver)
                grants.append(grant)
            epoch = 0 if self.phase == "old" else self._epoch()
            fence = grants[0].fencing_token if epoch == 0 else composite_token(1, grants[-1].fencing_token)
        except BaseException:
            self._release_all(taken, name, token)
            raise
        return fence, Grant(fence, min(g.ttl for g in grants), min(g.sent_at for g in grants))

    def _forget_ended(self) -> None:
        """Caller holds ``_mutex``: drop the leases whose deadline passed (their front end already reads lost)."""
        now = self._ctx.clock()
        if len(self._held) >= self._prune_at:
            self._held = {t: h for t, h in self._held.items() if h[2] > now}
            self._prune_at = 2 * len(self._held) + PRUNE_AT

    def _release_all(self, drivers: Sequence[Driver], name: str, token: str) -> None:
        for driver in reversed(drivers):
            try:
                driver.release(name, token)
            except LockError:
                log.warning(
                    "lockkit: undoing (part of) a migration acquire of %r failed; it expires with its TTL",
                    name,
                    exc_info=True,
                )

    def renew(self, name: str, token: str, ttl: float) -> Grant | None:
        return one_renewal(self.renew_many([RenewRequest(name, token, ttl)]))

    def _renewal_refused(self, token: str) -> str:
        """Caller holds ``_mutex``: why ``token``'s lease must not be renewed (``""``: it may)."""
        if self._fenced_off is not None:
            return self._fenced_off[1]
        held = self._held.get(token)
        if held is not None and held[1] != self._generation:
            return f"migration {self.options.group!r}: this client was fenced off since the lock was granted"
        return ""

    def renew_many(self, requests: Sequence[RenewRequest]) -> list[Grant | Exception | None]:
        with self._mutex:
            refused = {r.token: why for r in requests if (why := self._renewal_refused(r.token))}
            generation = self._generation
        live = [r for r in requests if r.token not in refused]
        per_driver = [driver.renew_many(live) for driver in self._order()] if live else []
        outcome: dict[str, Grant | Exception | None] = {
            token: LockLost(f"{why}; the lease is not renewed: stop the work that relied on it and acquire it again")
            for token, why in refused.items()
        }
        for i, request in enumerate(live):
            results = [batch[i] for batch in per_driver]
            errors = [r for r in results if isinstance(r, Exception)]
            if any(r is None for r in results):
                with self._mutex:
                    self._held.pop(request.token, None)
                self._release_all(
                    [d for d, r in zip(self._order(), results, strict=True) if isinstance(r, Grant)],
                    request.name,
                    request.token,
                )
                outcome[request.token] = None
            elif errors:
                outcome[request.token] = errors[0]
            else:
                grants = cast(list[Grant], results)
                sent_at, ttl = min(g.sent_at for g in grants), min(g.ttl for g in grants)
                with self._mutex:
                    held = self._held.get(request.token)
                    reason, capped = self._not_counted(held[1] if held else generation, sent_at, ttl)
                    fence = held[0] if held else grants[0].fencing_token
                    if held is not None and not reason:
                        self._held[request.token] = (held[0], held[1], sent_at + capped)
                # Not counted: the server side stays extended until its TTL, but the lease is not.
                outcome[request.token] = (
                    LockLost(
                        f"{reason}; the lease is not renewed: stop the work that relied on it and acquire it again"
                    )
                    if reason
                    else Grant(fence, capped, sent_at)
                )
        return [outcome[r.token] for r in requests]

    def release(self, name: str, token: str) -> bool:
        with self._mutex:
            self._held.pop(token, None)
        return self._each(reversed(self._order()), "release", lambda d: d.release(name, token), all)

    def _each(
        self,
        drivers: Iterable[Driver],
        action: str,
        call: Callable[[Driver], bool],
        combine: Callable[[list[bool]], bool],
    ) -> bool:
        """``call`` on every driver even when one raises (the first error is raised after all were tried).

        A release whose new-backend half fails must still free the old backend's lock: otherwise it stays held
        until its TTL although the holder is done with it.
        """
        results: list[bool] = []
        error: Exception | None = None
        for driver in drivers:
            try:
                results.append(call(driver))
            except Exception as exc:  # reported after the other backend's half is done
                log.warning("lockkit: migration %s failed on one backend; the other one is still done", action)
                error = error or exc
        if error is not None:
            raise error
        return combine(results)

    def holder(self, name: str) -> HolderInfo:
        infos = [driver.holder(name) for driver in self._order()]
        held = [info for info in infos if info.held]
        return held[0] if held else infos[0]

    def force_release(self, name: str) -> bool:
        return self._each((self.new, self.old), "force-release", lambda d: d.force_release(name), any)

    def ping(self) -> None:
        for driver in (self.old, self.new):
            driver.ping()

    def close(self) -> None:
        self._stop.set()
        heartbeat = self._heartbeat
        if heartbeat is not None and heartbeat is not threading.current_thread():
            heartbeat.join(self.options.presence_ttl)  # so that no refresh announces us again after the withdraw
        with self._refreshing:
            self._withdraw()
        for driver in (self.new, self.old):
            try:
                driver.close()
            except Exception:  # closing one backend must not leave the other's connections open
                log.warning("lockkit: closing a migration backend failed", exc_info=True)


def next_step(fleet: dict[str, dict[str, str]], epoch_switched: bool, new_backend: str = "NEW") -> tuple[bool, str]:
    """``(safe, advice)`` for ``lockkit migrate status``, from the live clients' phases.

    ``new_backend`` is the name of the backend the migration goes to, for the end-of-migration advice.
    """
    phases = [record.get("phase") for record in fleet.values()]
    old, both, new = (phases.count(p) for p in PHASES)
    finish = (
        f"set fencing_epoch = 1 on [backends.{new_backend}], point call sites at it (default/routes) and drop the "
        "migrate backend, instance by instance; switch the old backend off once no migrate client is left "
        "(docs/migration.md, step 4)"
    )
    if old and new:
        return False, f"UNSAFE: {old} client(s) on 'old' and {new} on 'new' at once; roll the 'new' ones back to 'both'"
    if old:
        return True, f"{old} client(s) still on 'old': roll them to 'both' (every instance), then to 'new'"
    if both and not new:
        return True, "every live client is on 'old'-free phases: roll instances to 'new' one by one"
    if both:
        return True, f"{both} client(s) still on 'both': finish rolling them to 'new'"
    if new:
        return True, f"migration complete: {finish}"
    if epoch_switched:
        return True, f"no live clients (epoch switched: tokens come from the new backend); to finish, {finish}"
    return True, "no live clients"
