"""``migrate``: move a running fleet from one backend to another with no moment of double ownership.

Configured, not opened by URL::

    [backends.main]
    migrate = { from = "redis", to = "etcd", phase = "both" }   # old | both | new; optional group, presence_ttl

Phases, rolled out instance by instance: ``old`` → ``both`` → ``new``.

* ``old`` locks on the old backend only; ``new`` on the new backend only.
* ``both`` acquires the old backend's lock, then the new one's (a fixed order: no deadlock among ``both``
  clients), renews both, and releases in reverse. If the second acquire fails or times out, the first is
  released before the error reaches the caller. Losing either lease loses the lock.

Any two clients in adjacent phases contend on at least one common backend, so mutual exclusion holds during
a rolling change. ``old`` and ``new`` share no backend, so they must never run at once: every client
announces ``(phase, host, pid)`` in both backends' presence records (refreshed every ``presence_ttl/3``,
expiring after ``presence_ttl`` if the client dies), and checks them after announcing. A ``new`` client
refuses to lock while any ``old`` client is alive, and an ``old`` client while any ``new`` one is alive; since
both announce before they check, at least one of two racing clients sees the other. A client whose presence
cannot be refreshed, or that sees a conflicting client appear, stops taking locks and reports every lease it
holds as lost.

Fencing tokens stay strictly increasing across the whole roll: ``old`` returns the old backend's token as is
(epoch 0, so it interleaves with clients that never heard of the migration); ``new`` returns
``(1 << 48) | token`` of the new backend. ``both`` returns the old backend's token until the first ``new``
client has started, and the new composite after: the first ``new`` client writes a permanent *epoch* record
in the new backend before it takes any lock, and ``both`` clients read it while holding both locks, so the
switch happens at one point in the lock's history. Rolling back from ``new`` to ``both`` keeps epoch 1;
rolling back to ``old`` after the switch would make tokens go backwards (the runbook says how to reset).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal, cast

from ..driver import Cancel, Driver, DriverContext, Grant, Guarantees, HolderInfo, Presence, RenewRequest, one_renewal
from ..errors import ConfigError, LockError

log = logging.getLogger("lockkit")

EPOCH_SHIFT = 48
PHASES = ("old", "both", "new")
Phase = Literal["old", "both", "new"]
CONFLICTS: dict[str, str | None] = {"old": "new", "new": "old", "both": None}
_SCOPES = ["process", "host", "single-node", "majority", "consensus"]


def composite_token(epoch: int, token: int) -> int:
    """``(epoch << 48) | token``: the new backend's tokens rank above every old one."""
    if not 0 <= token < 1 << EPOCH_SHIFT:
        raise LockError(f"fencing token {token} does not fit in 48 bits; it cannot be combined with an epoch")
    return (epoch << EPOCH_SHIFT) | token


@dataclass(frozen=True)
class MigrateOptions:
    phase: str
    group: str
    presence_ttl: float = 15.0

    def __post_init__(self) -> None:
        if self.phase not in PHASES:
            raise ConfigError(f"migrate phase must be one of old, both, new; got {self.phase!r}")
        if not 1.0 <= self.presence_ttl <= 3600:
            raise ConfigError(f"migrate presence_ttl must be 1 to 3600 seconds, got {self.presence_ttl}")


def _presence(driver: Driver, role: str) -> Presence:
    if not isinstance(driver, Presence):
        raise ConfigError(
            f"the {role} backend's driver ({type(driver).__name__}) keeps no presence records, which a "
            "migration needs for fleet safety"
        )
    return driver


def combined_guarantees(old: Guarantees, new: Guarantees, phase: str) -> Guarantees:
    if phase == "old":
        return old
    if phase == "new":
        return new
    return Guarantees(
        scope=min(old.scope, new.scope, key=_SCOPES.index),
        fifo=old.fifo and new.fifo,
        fencing="strict" if old.fencing == new.fencing == "strict" else "best-effort",
        survives_failover=old.survives_failover and new.survives_failover,
        lifetime="ttl" if "ttl" in (old.lifetime, new.lifetime) else "session",
        server_wakeup=old.server_wakeup and new.server_wakeup,
        note="migration phase 'both': holds the old and the new backend's lock",
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
        self.member = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._group = f"lockkit-migrate:{options.group}"
        self._epoch_group = f"lockkit-migrate:{options.group}:epoch"
        self._epoch_seen = self.phase == "new"
        self._mutex = threading.Lock()
        self._fenced_off: str | None = None
        self._announced = False
        self._held: dict[str, int] = {}
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

    def _announce_and_check(self) -> None:
        for presence in self._presences:
            presence.announce(self._group, self.member, self._record(), self.options.presence_ttl)
        conflict = CONFLICTS[self.phase]
        if conflict is not None:
            others = [
                f"{r.get('host')}:{r.get('pid')}"
                for m, r in self.fleet().items()
                if m != self.member and r.get("phase") == conflict
            ]
            if others:
                raise ConfigError(
                    f"migration {self.options.group!r}: this client is in phase {self.phase!r} but "
                    f"{len(others)} client(s) in phase {conflict!r} are alive ({', '.join(sorted(others)[:5])}); "
                    "finish rolling every instance to 'both' first (lockkit migrate status shows the fleet)"
                )
        if self.phase == "new":
            self._presences[1].announce(self._epoch_group, "epoch", "1", None)

    def _ensure_announced(self) -> None:
        with self._mutex:
            if self._fenced_off:
                raise ConfigError(self._fenced_off)
            if self._announced:
                return
            self._announce_and_check()
            self._announced = True
            self._heartbeat = threading.Thread(target=self._beat, name="lockkit-migrate-presence", daemon=True)
            self._heartbeat.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.options.presence_ttl / 3):
            try:
                with self._mutex:
                    self._announce_and_check()
                    self._fenced_off = None  # a passing fault is over; leases already lost stay lost
            except LockError as exc:
                self._fence_off(f"migration {self.options.group!r}: {exc}")

    def _fence_off(self, reason: str) -> None:
        """Stop locking: our presence may lapse or a conflicting phase is alive, so overlap is possible."""
        with self._mutex:
            first = self._fenced_off is None
            self._fenced_off = reason
            held = list(self._held)
        if first:
            log.error("lockkit: %s; refusing new locks and reporting %d held lock(s) lost", reason, len(held))
        for token in held:
            self._ctx.events.lost(token, reason)

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
        self._ensure_announced()
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
        with self._mutex:
            self._held[token] = fence
        return Grant(fence, min(g.ttl for g in grants), min(g.sent_at for g in grants))

    def _release_all(self, drivers: Sequence[Driver], name: str, token: str) -> None:
        for driver in reversed(drivers):
            try:
                driver.release(name, token)
            except LockError:
                log.warning(
                    "lockkit: undoing half of a migration acquire of %r failed; it expires with its TTL",
                    name,
                    exc_info=True,
                )

    def renew(self, name: str, token: str, ttl: float) -> Grant | None:
        return one_renewal(self.renew_many([RenewRequest(name, token, ttl)]))

    def renew_many(self, requests: Sequence[RenewRequest]) -> list[Grant | Exception | None]:
        per_driver = [driver.renew_many(requests) for driver in self._order()]
        out: list[Grant | Exception | None] = []
        for i, request in enumerate(requests):
            results = [batch[i] for batch in per_driver]
            errors = [r for r in results if isinstance(r, Exception)]
            if any(r is None for r in results):
                self._release_all(
                    [d for d, r in zip(self._order(), results, strict=True) if isinstance(r, Grant)],
                    request.name,
                    request.token,
                )
                out.append(None)
            elif errors:
                out.append(errors[0])
            else:
                grants = cast(list[Grant], results)
                fence = self._held.get(request.token, grants[0].fencing_token)
                out.append(Grant(fence, min(g.ttl for g in grants), min(g.sent_at for g in grants)))
        return out

    def release(self, name: str, token: str) -> bool:
        with self._mutex:
            self._held.pop(token, None)
        results = [driver.release(name, token) for driver in reversed(self._order())]
        return all(results)

    def holder(self, name: str) -> HolderInfo:
        infos = [driver.holder(name) for driver in self._order()]
        held = [info for info in infos if info.held]
        return held[0] if held else infos[0]

    def force_release(self, name: str) -> bool:
        results = [driver.force_release(name) for driver in (self.new, self.old)]
        return any(results)

    def ping(self) -> None:
        for driver in (self.old, self.new):
            driver.ping()

    def close(self) -> None:
        self._stop.set()
        if self._announced:
            for presence in self._presences:
                try:
                    presence.withdraw(self._group, self.member)
                except LockError:
                    log.debug("lockkit: withdrawing migration presence failed", exc_info=True)
        for driver in (self.new, self.old):
            driver.close()


def next_step(fleet: dict[str, dict[str, str]], epoch_switched: bool) -> tuple[bool, str]:
    """``(safe, advice)`` for ``lockkit migrate status``, from the live clients' phases."""
    phases = [record.get("phase") for record in fleet.values()]
    old, both, new = (phases.count(p) for p in PHASES)
    if old and new:
        return False, f"UNSAFE: {old} client(s) on 'old' and {new} on 'new' at once; roll the 'new' ones back to 'both'"
    if old:
        return True, f"{old} client(s) still on 'old': roll them to 'both' (every instance), then to 'new'"
    if both and not new:
        return True, "every live client is on 'old'-free phases: roll instances to 'new' one by one"
    if both:
        return True, f"{both} client(s) still on 'both': finish rolling them to 'new'"
    if new:
        return True, "migration complete: point call sites at the new backend directly and drop the migrate backend"
    return True, "no live clients" + (" (epoch switched: tokens come from the new backend)" if epoch_switched else "")
