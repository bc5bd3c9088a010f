"""The contention harness of ``lockkit bench`` and of the repository's ``benchmarks/``: one set of rules.

N processes (default 4, ``spawn`` context) open their own connection to one lock name, take it once untimed
as a warm-up (connection, session, lease), meet at a start barrier, then each loops acquire → busy hold of
~1 ms → release for ``seconds``, recording per acquisition ``(acquired-at, pid, wait, fencing token)``.
``acquired-at`` is ``time.monotonic()``: CLOCK_MONOTONIC is system-wide on Linux, so the records of all
processes sort into one timeline. It is read after the grant and before the hold, so the next holder's
time is always later (it can only be granted after the release). From the sorted records:

* **handoffs/s**: acquisitions by a different process than the previous holder, per second of the run;
* **fairness**: fewest / most acquisitions per process (with the per-process counts);
* **waits**: p50, p99 and max of the time from calling ``acquire`` to holding the lock;
* **tokens in order**: the fencing tokens, in acquisition order, strictly increase. For ``etcd://`` and
  ``zookeeper://`` the token is the waiter's creation revision / czxid, i.e. its place in the queue,
  so this is the FIFO check; for ``redis://`` it is the fencing check. Skipped (``None``) when the
  backend declares no fencing (Redlock: ``guarantees().fencing == "none"``, ``lease.fence`` is ``None``).

The hold is a busy loop, not ``sleep``: a sleeping holder gives up its CPU and the measured hand-off would
include the scheduler's wake-up of the *holder*, which is not the lock's doing.

Spawned children unpickle the worker, the opener and its target by reference, so the opener is a
module-level callable ``opener(target, name)`` returning a :class:`Contender`, and the target is picklable:
a URL for :class:`LockkitContender`, ``(config, backend)`` for :class:`ConfigContender`. Another lock library
plugs in with an opener of its own (the repository's ``benchmarks/bench_zookeeper.py`` does this for kazoo's
``Lock``).
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import queue
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import lockkit

from ..errors import LockError
from ..urls import redact

__all__ = [
    "ACQUIRE_TIMEOUT", "ConfigContender", "Contender", "Contention", "LockkitContender", "Opener", "Record",
    "contention", "pct",
]  # fmt: skip


ACQUIRE_TIMEOUT = 30.0
"""Seconds a contender waits for the lock before the run is declared broken."""

Record = tuple[float, int, float, "int | None"]
"""One acquisition: acquired-at (CLOCK_MONOTONIC), pid, wait in seconds, fencing token (None: not checked)."""


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# --- contention harness ---------------------------------------------------------------------------------


class Contender(Protocol):
    """One process's handle on the contended lock."""

    def acquire(self, timeout: float) -> int | None:
        """Block until held; return the fencing token to check, or None when there is none to check."""

    def release(self) -> None: ...

    def close(self) -> None: ...


class _LockerContender:
    """A lockkit lock as a contender; the subclasses only say which locker and backend."""

    def __init__(self, locks: lockkit.Locker, name: str, backend: str | None = None) -> None:
        self.locks = locks
        self.lock = locks.lock(name, ttl=10, backend=backend)
        guarantees = locks.guarantees()
        self.fences = guarantees[backend or next(iter(guarantees))].fencing != "none"

    def acquire(self, timeout: float) -> int | None:
        lease = self.lock.acquire(timeout=timeout)
        return lease.fence if self.fences else None

    def release(self) -> None:
        self.lock.release()

    def close(self) -> None:
        self.locks.close()


class LockkitContender(_LockerContender):
    """The default opener: ``lockkit.connect(url).lock(name)``."""

    def __init__(self, url: str, name: str) -> None:
        super().__init__(lockkit.connect(url), name)


class ConfigContender(_LockerContender):
    """A configured backend: ``target`` is ``(config, backend)``, as :func:`lockkit.from_config` takes it."""

    def __init__(self, target: tuple[dict[str, Any], str], name: str) -> None:
        config, backend = target
        super().__init__(lockkit.from_config(config), name, backend)


Opener = Callable[[Any, str], Contender]
"""``opener(target, name)``: module-level (spawned children import it), with a picklable ``target``."""


def contender_main(
    opener: Opener,
    target: Any,
    name: str,
    seconds: float,
    hold: float,
    barrier: Any,
    out: Any,
    sleep_hold: bool = False,
) -> None:
    """Body of one contending process; puts ``(pid, records)`` or ``(pid, error text)`` on ``out``."""
    pid = os.getpid()
    records: list[Record] = []
    try:
        contender = opener(target, name)
        try:
            contender.acquire(ACQUIRE_TIMEOUT)  # warm-up, not recorded: connection, session, lease
            contender.release()
            barrier.wait(timeout=120)
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                asked = time.monotonic()
                token = contender.acquire(ACQUIRE_TIMEOUT)
                got = time.monotonic()
                if sleep_hold:
                    time.sleep(hold)
                else:
                    spin = got + hold
                    while time.monotonic() < spin:
                        pass
                contender.release()
                records.append((got, pid, got - asked, token))
        finally:
            contender.close()
    except BaseException as exc:  # report, so that the parent fails at once instead of waiting out a timeout
        barrier.abort()
        out.put((pid, f"{type(exc).__name__}: {exc}"))
        return
    out.put((pid, records))


@dataclass(frozen=True)
class Contention:
    """The summary of one contention run (see the module docstring for the definitions)."""

    label: str
    procs: int
    seconds: float
    hold_ms: float
    acquisitions: int
    handoffs: int
    handoffs_per_s: float
    fairness: float
    counts: list[int]
    """Acquisitions per process, in start order."""
    wait_p50_ms: float
    wait_p99_ms: float
    wait_max_ms: float
    tokens_in_order: bool | None
    """Fencing tokens (or the opener's queue numbers) strictly increase in acquisition order; None: not checked."""
    tokens: str = "fencing tokens"
    """What the tokens are, for the report."""

    @classmethod
    def from_records(
        cls, records: list[Record], pids: list[int], seconds: float, hold: float, label: str, tokens: str
    ) -> Contention:
        records = sorted(records)
        handoffs = sum(1 for a, b in itertools.pairwise(records) if a[1] != b[1])
        per_pid = {pid: 0 for pid in pids}
        for record in records:
            per_pid[record[1]] += 1
        counts = list(per_pid.values())
        waits = [r[2] for r in records] or [0.0]
        fences = [r[3] for r in records]
        in_order = None
        checked = [t for t in fences if t is not None]
        if records and len(checked) == len(fences):
            in_order = all(a < b for a, b in itertools.pairwise(checked))
        return cls(
            label=label,
            procs=len(pids),
            seconds=seconds,
            hold_ms=hold * 1e3,
            acquisitions=len(records),
            handoffs=handoffs,
            handoffs_per_s=handoffs / seconds,
            fairness=min(counts) / max(counts) if max(counts) else 0.0,
            counts=counts,
            wait_p50_ms=pct(waits, 0.5) * 1e3,
            wait_p99_ms=pct(waits, 0.99) * 1e3,
            wait_max_ms=max(waits) * 1e3,
            tokens_in_order=in_order,
            tokens=tokens,
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def report(self) -> str:
        """Three lines: a ``##`` heading, the figures, the token order."""
        if self.tokens_in_order is None:
            order = f"no {self.tokens} to check (the backend declares none)"
        else:
            order = f"{self.tokens} rise in acquisition order: {'yes' if self.tokens_in_order else 'NO'}"
        return (
            f"## {self.procs} processes contending on one name, ~{self.hold_ms:g} ms hold, {self.seconds:g} s: "
            f"{self.label}\n"
            f"acquisitions {self.acquisitions}, handoffs/s {self.handoffs_per_s:.0f}, "
            f"fairness {self.fairness:.2f} {self.counts}, p50 wait {self.wait_p50_ms:.1f} ms, "
            f"p99 wait {self.wait_p99_ms:.1f} ms, max wait {self.wait_max_ms:.1f} ms\n{order}"
        )


def _shown(target: Any, label: str | None) -> str:
    """How an error names the target: never a password (a URL's is masked; a config is not shown at all)."""
    if label is not None:
        return label
    return redact(target) if isinstance(target, str) else type(target).__name__


def contention(
    target: Any,
    seconds: float = 5.0,
    *,
    procs: int = 4,
    hold: float = 0.001,
    opener: Opener = LockkitContender,
    label: str | None = None,
    name: str | None = None,
    tokens: str = "fencing tokens",
    sleep_hold: bool = False,
) -> Contention:
    """Run ``procs`` spawned processes contending on one name of ``target`` (a lockkit URL by default; give
    ``label`` for any other target). ``sleep_hold``: hold by sleeping, not spinning — for semaphores, whose
    holders overlap: the work a permit guards is usually I/O (a call to a rate-limited API), and spinning
    holders would measure the cores, not the backend. A process that fails or hangs fails the run: ``LockError``
    with each process's reason."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    barrier = ctx.Barrier(procs)
    name = name or f"bench-hot-{uuid.uuid4().hex[:12]}"
    workers = [
        ctx.Process(
            target=contender_main, args=(opener, target, name, seconds, hold, barrier, out, sleep_hold), daemon=True
        )
        for _ in range(procs)
    ]
    for worker in workers:
        worker.start()
    records: list[Record] = []
    errors: list[str] = []
    try:
        for _ in workers:
            try:
                pid, got = out.get(timeout=seconds + 2 * ACQUIRE_TIMEOUT + 120)
            except queue.Empty:
                errors.append("a contending process died or hung without reporting")
                break
            if isinstance(got, str):
                errors.append(f"pid {pid}: {got}")
            else:
                records.extend(got)
    finally:
        for worker in workers:
            worker.join(timeout=30)
            if worker.is_alive():
                worker.kill()
                worker.join()
    if errors:
        raise LockError(
            f"contention on {_shown(target, label)} failed: " + "; ".join(errors) + ". Check that every process can "
            "reach the backend (lockkit check --url URL) and hold the lock, then run again"
        )
    if label is None:
        label = f"lockkit {str(target).split(':', 1)[0]}://"
    pids = [w.pid for w in workers if w.pid is not None]
    return Contention.from_records(records, pids, seconds, hold, label, tokens)
