"""``lockkit verify``: a self-test of a real deployment, with real processes and optional faults.

N worker processes contend on one lock name. Each, while holding the lock, does a fenced read of a
counter from a fencing-checked store (:mod:`lockkit.cli.fencing_store`), thinks for a moment, and writes the
counter + 1 with its fencing token, logging when it entered and left. With ``--faults``, the controller
SIGKILLs (then replaces) or SIGSTOPs (for 1.5 × TTL) a random worker now and then.

Each figure is measured from evidence the mechanism it checks does not control — the holders' own log of
their validity intervals and tokens, and the store's full history of attempts — never from the store's
fencing rule, which prevents exactly what the fencing figures count. Checks, each of which fails the run
(exit 1):

* **overlaps** — two holders' validity intervals (entry until the earlier of release and ``expires_at``)
  intersect (the holders' log);
* **lost updates** — the final counter differs from the number of increments the store acknowledged to
  holders (the counter against the history);
* **fencing backwards** — a holder that entered after another had left got a lower fencing token (the
  holders' log), or the store accepted a write whose token is lower than an earlier accepted one (the
  history);
* **shared fencing tokens** — distinct leases presented the same fencing token, whether the store
  accepted them or not (the history): the backend handed out a duplicate.

The fencing figures apply to backends that promise fencing tokens; on one whose guarantees say
``fencing="none"`` (Redlock) the workers read and write unfenced, the two figures are ``None`` and the
lost-update count measures exclusion alone. A backend whose scope is one process (``memory://``) is
refused: verify's workers are separate processes.

Also reported: acquisitions, handoffs, stale reads and writes the store rejected, handoff latency and the
takeover time after a holder was killed.
"""

from __future__ import annotations

import itertools
import json
import multiprocessing
import os
import random
import signal
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import lockkit

from ..timing import validate_ttl
from ..urls import redact
from .fencing_store import FencedStore, summarise
from .preflight import check_shared_backend

JOIN_GRACE = 10.0
"""Seconds past the run's end plus 4 × TTL before a worker still running counts as hung (and is killed)."""


def _worker(
    url: str | None,
    name: str,
    store_path: str,
    log_path: str,
    until: float,
    ttl: float,
    fenced: bool,
    store_class: type[FencedStore],
    errors_path: str,
) -> None:
    try:
        _contend(url, name, store_path, log_path, until, ttl, fenced, store_class)
    except lockkit.LockError as exc:
        # Said once, in the report, for the controller to judge (a run whose workers died tested less than it
        # says), rather than as one traceback per worker that a "RESULT: ok" below would contradict.
        with open(errors_path, "a", encoding="utf-8") as handle:
            handle.write(f"{type(exc).__name__}: {' '.join(str(exc).split())}\n")
        raise SystemExit(1) from None


def _contend(
    url: str | None,
    name: str,
    store_path: str,
    log_path: str,
    until: float,
    ttl: float,
    fenced: bool,
    store_class: type[FencedStore],
) -> None:
    store = store_class(store_path)
    with lockkit.connect(url) as locks:
        lock = locks.lock(name, ttl=ttl)
        while time.monotonic() < until:
            try:
                lease = lock.acquire(timeout=max(0.0, until - time.monotonic()))
            except lockkit.LockTimeout:
                break
            entered = time.monotonic()
            written = "skip"
            fence = lease.fence if fenced else None
            value = store.read(fence, lease.token)
            time.sleep(random.uniform(0, 0.003))
            if value is None:
                written = "stale"
            elif lease.valid:
                written = "ok" if store.write(value + 1, fence, lease.token, read=value) else "stale"
            left = min(time.monotonic(), lease.expires_at)
            try:
                lock.release()
                ended = "released"
            except lockkit.LockError:
                ended = "lost"
            with open(log_path, "a", encoding="utf-8") as handle:
                handle.write(f"{entered} {left} {os.getpid()} {lease.fence or 0} {written} {ended}\n")


class _Entry(NamedTuple):
    entered: float
    left: float
    pid: int
    token: int
    written: str


@dataclass
class VerifyReport:
    url: str
    processes: int
    duration: float
    faults: list[str]
    fencing: str = "strict"
    """The backend's fencing promise (its ``Guarantees.fencing``); ``none``: the fencing figures are ``None``."""
    acquisitions: int = 0
    handoffs: int = 0
    overlaps: int = 0
    lost_updates: int = 0
    stale_writes_rejected: int = 0
    """Fenced reads and writes the store refused as stale (informational: a paused holder's are expected)."""
    fencing_backwards: int | None = 0
    shared_fencing_tokens: int | None = 0
    kills: int = 0
    pauses: int = 0
    handoff_ms_p50: float | None = None
    handoff_ms_p99: float | None = None
    takeover_ms: list[float] = field(default_factory=list)
    acquisitions_before_first_fault: int | None = None
    """Critical sections finished before the first fault (``None``: no fault). Faults start only once the
    workers have acquired at least once, so that a kill or pause hits a process in the lock's queue, not one
    still importing lockkit."""
    expired_on_entry: int = 0
    """Holders whose lease had already expired when they entered (paused right after the grant): not overlaps."""
    first_overlap: list[list[float | int | str]] | None = None
    """The first two overlapping entries (entered, left, pid, fencing token, write outcome), for diagnosis."""
    workers_failed: int = 0
    """Workers that exited with an error, or did not finish and were killed (those verify SIGKILLed not counted)."""
    worker_errors: list[str] = field(default_factory=list)
    """The distinct errors the workers died of (``ConfigError: …``), at most :data:`MAX_ERRORS_SHOWN`."""
    failures: list[str] = field(default_factory=list)
    """Why the run could not test what it reports (a worker died, nothing was acquired): each fails the run."""

    @property
    def violations(self) -> bool:
        return bool(self.overlaps or self.lost_updates or self.fencing_backwards or self.shared_fencing_tokens)

    @property
    def ok(self) -> bool:
        return not (self.violations or self.failures)

    @property
    def exit_code(self) -> int:
        """1 for a violation or a run that could not test; 2 if the workers' errors were configuration."""
        if self.violations or not self.failures:
            return 0 if self.ok else 1
        return 2 if any(e.startswith("ConfigError") for e in self.worker_errors) else 1

    def as_json(self) -> str:
        return json.dumps({**asdict(self), "ok": self.ok})

    def table(self) -> str:
        if self.fencing_backwards is None or self.shared_fencing_tokens is None:
            fencing = "n/a (the backend gives no fencing tokens)"
        else:
            fencing = f"{self.fencing_backwards} / {self.shared_fencing_tokens}"
        rows = [
            ("acquisitions", self.acquisitions),
            ("handoffs", self.handoffs),
            ("overlaps", self.overlaps),
            ("lost updates", self.lost_updates),
            ("stale reads/writes rejected by fencing", self.stale_writes_rejected),
            ("fencing tokens backwards / shared", fencing),
            ("holders killed / paused", f"{self.kills} / {self.pauses}"),
            ("handoff latency p50 / p99", f"{_ms(self.handoff_ms_p50)} / {_ms(self.handoff_ms_p99)}"),
            ("takeover after kill (median)", _ms(statistics.median(self.takeover_ms) if self.takeover_ms else None)),
        ]
        width = max(len(k) for k, _ in rows)
        lines = [f"{k:<{width}}  {v}" for k, v in rows]
        lines.extend(f"worker error: {error}" for error in self.worker_errors)
        if self.violations:
            lines.append("RESULT: VIOLATIONS FOUND")
        if self.failures:
            lines.append("RESULT: FAILED (could not test: " + "; ".join(self.failures) + ")")
        if self.ok:
            lines.append("RESULT: ok")
        return "\n".join(lines)


MAX_ERRORS_SHOWN = 5


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} ms"


def _read_log(log: Path) -> list[_Entry]:
    entries = []
    for line in log.read_text().splitlines():
        fields = line.split()
        if len(fields) != 6:
            continue  # a holder SIGKILLed mid-append leaves a torn line: it never finished, so it is no entry
        entered, left, pid, token, written, _ended = fields
        entries.append(_Entry(float(entered), float(left), int(pid), int(token), written))
    entries.sort()
    return entries


def _wait_for_first_acquisition(log: Path, latest: float) -> None:
    """Until a worker has logged a critical section (the workers are up and queued on the lock) or ``latest``.

    Spawned workers take a while to import lockkit and connect; a fault injected before that tests nothing.
    Read by polling a local file every 20 ms: a controller's wait, not a lock's.
    """
    while time.monotonic() < latest and log.stat().st_size == 0:
        time.sleep(0.02)


def _backwards_grants(held: list[_Entry]) -> int:
    """Holders whose token is lower than that of a holder who had left before they entered.

    Only pairs ordered in time without doubt are compared (one left before the other entered), so an
    overlap — already reported as such — cannot pass for a token out of order, nor hide one.
    """
    by_end = sorted(held, key=lambda e: e.left)
    count, done, highest = 0, 0, None
    for entry in held:  # sorted by entry
        while done < len(by_end) and by_end[done].left <= entry.entered:
            token = by_end[done].token
            highest = token if highest is None else max(highest, token)
            done += 1
        if highest is not None and entry.token < highest:
            count += 1
    return count


def _analyse(report: VerifyReport, log: Path, store: FencedStore, kill_times: list[float]) -> None:
    entries = _read_log(log)
    report.acquisitions = len(entries)
    # A lease's validity interval in the critical section is [entered, left]. It is empty when the holder was
    # paused between the grant and ``entered`` until its lease had expired (left < entered): such a holder
    # never held a valid lease there (and did not write), so it cannot overlap anyone. Every non-empty
    # interval is checked against the latest end seen so far, not only against its neighbour.
    held = [e for e in entries if e.left > e.entered]
    report.expired_on_entry = len(entries) - len(held)
    latest: _Entry | None = None
    for entry in held:
        if latest is not None and entry.entered < latest.left:
            report.overlaps += 1
            if report.first_overlap is None:
                report.first_overlap = [list(latest), list(entry)]
        if latest is None or entry.left > latest.left:
            latest = entry
    gaps = []
    for prev, nxt in itertools.pairwise(entries):
        if nxt.pid != prev.pid:
            report.handoffs += 1
            gaps.append((nxt.entered - prev.left) * 1000)
    if gaps:
        gaps.sort()
        report.handoff_ms_p50 = statistics.median(gaps)
        report.handoff_ms_p99 = gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))]
    for killed_at in kill_times:
        later = [e.entered for e in entries if e.entered > killed_at]
        if later:
            report.takeover_ms.append((min(later) - killed_at) * 1000)
    # The base class's summary, whatever store class the workers used: a broken store's own report()
    # must not be the judge of its history.
    result = summarise(store.history(), FencedStore.value(store))
    report.lost_updates = abs(result.value - result.accepted)
    report.stale_writes_rejected = result.rejected
    if report.fencing == "none":
        report.fencing_backwards = report.shared_fencing_tokens = None
    else:
        report.fencing_backwards = _backwards_grants(held) + result.backwards
        report.shared_fencing_tokens = result.shared_tokens


def run(
    url: str | None,
    processes: int,
    duration: float,
    faults: list[str],
    ttl: float = 2.0,
    *,
    store_class: type[FencedStore] = FencedStore,
    on_start: Callable[[], None] | None = None,
) -> VerifyReport:
    """Run the self-test; raises :class:`lockkit.ConfigError` for a combination that could test nothing.

    ``on_start`` is called once the checks have passed, just before the workers are spawned (the CLI prints
    its header there, so that a refused run prints only why).

    ``store_class`` is a test hook, not an option: the test suite passes a deliberately broken store
    (:mod:`lockkit.testing._broken`) to show that the lost-update figure can fail. It must be importable
    by the spawned workers.
    """
    validate_ttl(ttl, "--ttl")  # first: the checks below compare with it
    if not duration > 0:  # also NaN
        raise lockkit.ConfigError(f"--duration must be a number of seconds above 0, got {duration:g}")
    unknown = set(faults) - {"kill", "pause"}
    if unknown:
        raise lockkit.ConfigError(f"unknown fault {sorted(unknown)[0]!r}; use kill, pause or both")
    if faults and duration <= 2 * ttl:
        # The controller keeps the last 2 x TTL free of faults for the takeover to be seen: a shorter run
        # would inject none and report a fault test that never happened.
        raise lockkit.ConfigError(
            f"--faults needs --duration above 2 × --ttl: with --ttl {ttl:g} it injects a fault only if "
            f"--duration is more than {2 * ttl:g} s (got {duration:g}): raise --duration or lower --ttl"
        )
    name = f"lockkit-verify:{os.getpid()}:{time.monotonic_ns()}"
    # A bad URL or TTL, memory://, a refused login or nothing listening: one line now, before any worker starts
    guarantees, _ = check_shared_backend(url, name, ttl, "verify")
    if on_start is not None:
        on_start()
    report = VerifyReport(redact(url) if url else "the configured default", processes, duration, faults)
    report.fencing = guarantees.fencing
    fenced = guarantees.fencing != "none"
    ctx = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="lockkit-verify-") as tmp:
        store_path, log_path, errors_path = Path(tmp) / "store.db", Path(tmp) / "log", Path(tmp) / "errors"
        log_path.write_text("")
        errors_path.write_text("")
        store = FencedStore(store_path)
        until = time.monotonic() + duration

        def spawn() -> Any:
            proc = ctx.Process(
                target=_worker,
                args=(url, name, str(store_path), str(log_path), until, ttl, fenced, store_class, str(errors_path)),
            )
            proc.start()
            return proc

        workers = [spawn() for _ in range(processes)]
        died: list[int] = []  # exit codes of workers that ended with an error (not by verify's SIGKILL)
        kill_times: list[float] = []
        rng = random.Random()
        injected = False
        if faults:
            _wait_for_first_acquisition(log_path, until - ttl * 2)
            report.acquisitions_before_first_fault = len(_read_log(log_path))
        # At least one fault (the duration check above leaves room for it), then more while 2 x TTL remain.
        while faults and (not injected or time.monotonic() < until - ttl * 2):
            window = until - ttl * 2 - time.monotonic()
            time.sleep(max(0.0, min(rng.uniform(0.5, 1.5) * ttl, window)))
            injected = True
            victim = rng.randrange(len(workers))
            if rng.choice(faults) == "kill":
                if not workers[victim].is_alive() and workers[victim].exitcode:
                    died.append(workers[victim].exitcode)  # it died on its own before this kill: judged too
                kill_times.append(time.monotonic())
                os.kill(workers[victim].pid, signal.SIGKILL)
                workers[victim].join()
                workers[victim] = spawn()  # the killed one's exit code (-9) is verify's doing, not judged
                report.kills += 1
            else:
                os.kill(workers[victim].pid, signal.SIGSTOP)
                time.sleep(ttl * 1.5)
                os.kill(workers[victim].pid, signal.SIGCONT)
                report.pauses += 1
        hung = 0
        for proc in workers:
            # Generous: a worker's last acquire gives up at the end of the run; one still running well after
            # that is stuck (and says so below), while one merely slow to start under load is not.
            proc.join(max(1.0, until - time.monotonic()) + ttl * 4 + JOIN_GRACE)
            if proc.is_alive():
                hung += 1
                proc.kill()
                proc.join()
            elif proc.exitcode != 0:
                died.append(proc.exitcode)
        _analyse(report, log_path, store, kill_times)
        _judge(report, died, hung, errors_path.read_text().splitlines())
        store.close()
    return report


def _judge(report: VerifyReport, exit_codes: list[int], hung: int, errors: list[str]) -> None:
    """What keeps the run from being a test: workers that died or hung, and a run with no acquisition at all.

    Without this, a backend nobody could reach, or a TTL every worker's driver refused, gave 0 acquisitions, 0
    violations and ``RESULT: ok``: a self-test that could not fail.
    """
    report.workers_failed = len(exit_codes) + hung
    report.worker_errors = list(dict.fromkeys(errors))[:MAX_ERRORS_SHOWN]
    if exit_codes:
        report.failures.append(
            f"{len(exit_codes)} worker(s) died (exit codes {sorted(set(exit_codes))}"
            + ("; their errors are listed above)" if errors else "; see their tracebacks on stderr)")
        )
    if hung:
        report.failures.append(
            f"{hung} worker(s) still ran {JOIN_GRACE:g} s + 4 × TTL after the run should have ended (killed)"
        )
    if report.acquisitions == 0:
        report.failures.append(
            "no worker acquired the lock: raise --duration (spawned workers take about a second to start)"
        )
