"""A model-based (stateful, generative) test of the lock contract, over one backend and one face.

:func:`machine_for` builds a Hypothesis ``RuleBasedStateMachine`` class for a :class:`ModelTarget` (a backend
URL, the sync or async face, optionally a way to restart the server). Each example opens two or three clients
on fresh, random lock names and drives a random sequence of API calls and faults:

* acquire (``try_acquire``, ``acquire(timeout=…)``, the handle's default timeout), renew with a random ttl
  (shorter and longer than the lease's), release, close a client (and open a new one), wait, outlive a lease
  with auto-renewal off (an in-process pause);
* asyncio face: cancel an acquire, release or renew after a random number of loop iterations or a short delay;
  stall the event loop (a blocking call in async code) past a lease's deadline, auto-renewal on or off, while
  a client of the blocking face tries to take the name (lockkit's own threads keep running meanwhile);
* backends other than ``memory://``: holders in child processes (:mod:`._model_workers`) that the machine
  pauses (SIGSTOP past their ttl, then SIGCONT), kills (SIGKILL) or lets release;
* targets that can restart their server: restart it (keeping its data).

A target with ``permits=True`` draws each name as a semaphore (of limit 1 to 3, fixed for the example) or a
reader-writer lock, and every rule above then takes a permit or a side (``write`` picks it) instead of a lock;
a client may hold two permits of one name (two handles), and a *crowd* rule has every free handle try one name
at once. The checks become the permit contract's (1p, 4p, 5p below); 2, 3 and 6 stay as they are.

After every step it checks, on the one ``time.monotonic()`` clock that every process of the host shares:

1. **Mutual exclusion**: no two leases of one name were valid at one instant. Every lease's validity is
   sampled (in-process leases at every check, child holders report every 20 ms); a lease valid at two sample
   instants was valid in between (validity never comes back once gone), so two leases whose sampled intervals
   overlap were both valid at one instant.
2. **Loss is reported**: a lease that is not released is invalid and has fired ``on_lost`` once by its deadline
   plus :data:`LOSS_SLACK` (or, when that deadline fell inside a stalled event loop, by LOSS_SLACK after the
   loop ran again: an asyncio lease's on_lost comes from that loop), and by :data:`LOSS_SLACK` after it was
   first seen LOST however early (a refused renewal); ``on_lost`` never fires while the lease says valid.
3. **Fencing**: where the driver declares ``fencing="strict"``, a lease granted after another's acquire
   returned has a larger token (the server's holder info reports the same token).
4. **A valid lease is held**: while a lease says valid, the server names its token as the holder, and (where
   the server reports the time left) does not expire before the lease's deadline.
5. **Nothing stays held**: the server does not name a lease's token after its release returned; nor after its
   owner closed, died or is paused, for longer than its ttl (the session, for ZooKeeper and etcd) plus
   :data:`HOLD_SLACK`; nor, on ttl backends, past the deadline of an expired lease by more than its ttl plus
   the slack; nor a token no lease of the model knows (a cancelled acquire's) for longer than the longest ttl.
6. **Cancellation**: a cancelled async ``release`` that started ends with the lease no longer valid within
   :data:`SETTLE` seconds (it completes, or the lease is given up): never half-way.
7. **Drift and renewals**: a lease's deadline is never later than the server's expiry minus the drift margin
   (where the server reports its time left finely enough: that is how a cancelled or failed ``renew(ttl)``
   that landed is checked); a renewal that returned leaves a deadline no later than its return + its ttl −
   drift and, on ttl backends with auto-renewal off, a lease ttl no longer than it asked; LOST and RELEASED
   are final (a lease never says valid again, a renew never revives it).
8. **Owner-checked release**: a release by a stale holder never returns as if it released while another
   lease of the name stays valid throughout the call; the server's fencing token for a name never goes down.

For permits (``permit_holders`` shows counts, not tokens):

1p. **Limit and exclusion**: never more valid permits of a semaphore than its limit at one instant (the most
    sampled intervals that overlap at one point), and a valid writer's interval overlaps no other lease's of
    its rwlock.
4p. **A valid lease is held**: the server counts at least the leases still valid after it answered, flags the
    writer among them, never shows a reader beside its writer, a writer with company, more holders than the
    limit, another limit, or a fencing token below a valid holder's.
5p. **Nothing stays held**: it counts at most the leases it may still hold by the bounds of 5 (none after its
    release returned) plus the acquires that may have been granted unseen (cancelled, or raised during a
    restart) for the longest ttl.

Every check fails with an ``AssertionError`` raised from one place (:meth:`LockModel.fail`), carrying the
timeline of the example, so that Hypothesis shrinks every kind of violation as one failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import lockkit
from lockkit import BackendUnavailable, LockError, LockLost, LockNotOwned, LockTimeout
from lockkit.lease import Lease, LeaseState, token_hint
from lockkit.timing import drift

__all__ = ["HOLD_SLACK", "LOSS_SLACK", "SETTLE", "LockModel", "ModelTarget", "machine_for"]

T = TypeVar("T")

LOSS_SLACK = 1.0
"""A lost lease has fired on_lost by its deadline plus this (the renewal thread/task may be slow to wake)."""
HOLD_SLACK = 1.5
"""The server frees a closed, dead or paused owner's lock by its ttl (or session) plus this."""
SETTLE = 1.0
"""A cancelled release that started has ended (lease no longer valid) this long after the cancel."""
CALL_TIMEOUT = 60.0
"""No single call of the model waits longer than this (a hang fails the example instead of the whole run)."""
LEFTOVER_WAIT = 2.0
"""After every locker of an example closed, its event loop runs nothing of lockkit's but the renewal task by
this long (cleanups of cancelled calls included)."""
CHILD_PERIOD = 0.02
CHILD_START_TIMEOUT = 20.0

ACQUIRE_TTLS = (1.0, 2.0, 3.0)
RENEW_FACTORS = (None, 0.25, 0.5, 1.0, 1.5)
"""renew(ttl=factor × the lease's ttl), shorter and longer than it (None: the lock's own ttl)."""
WAITS = (0.3, 2.0)
OUTLIVE_MAX = 5.0
"""The longest in-process pause the outlive rule sleeps (past a deadline further out, it does nothing)."""


def _renew_ttl(factor: float | None, lease: Lease) -> float | None:
    return None if factor is None else round(max(0.2, factor * lease.ttl), 3)


@dataclass
class ModelTarget:
    """What one state machine class runs against."""

    kind: str
    """memory, file, redis, redlock, zookeeper or etcd (picks what applies: children, time-left tolerance)."""
    face: str
    """``sync`` (``lockkit.connect``) or ``async`` (``lockkit.connect_async``)."""
    url: Callable[[Path], str]
    """Called once per example with a fresh directory of its own: the URL every client of that example uses."""
    restart: Callable[[int], None] | None = None
    """Restart the server (``member`` picks one of several, e.g. a Redlock master), keeping its data."""
    children: bool = True
    """Whether holders may live in child processes (not for memory://)."""
    session_ttl: float = 0.0
    """The longest ttl a lock can really live by (ZooKeeper's session timeout); 0: the lock's own ttl."""
    permits: bool = False
    """The example's names are semaphores (of a limit drawn per name) and reader-writer locks, not locks."""
    limits: tuple[int, ...] = (0, 1, 2, 3)
    """With ``permits``: the kinds a name is drawn from, a semaphore's limit or 0 for a reader-writer lock."""

    @property
    def ttl_left_tolerance(self) -> float | None:
        """How coarse the server's reported time left is (None: it reports none we can compare)."""
        return {"etcd": 1.0, "zookeeper": None}.get(self.kind, 0.005)


def _renewal_wait(task: asyncio.Task[Any], tasks: set[asyncio.Task[Any]]) -> bool:
    """Whether ``task`` is the renewal task's own sleep: ``wait_event`` runs ``Event.wait()`` of the scheduler's
    wake-up event in a task of its own, not named ``lockkit-renewal``. The renewal task outlives the last lease
    by up to two idle ticks plus a stale wake-up (``AsyncRenewalScheduler._run``), so its sleep is still pending
    for a while after every locker closed: that is the renewal task, not a leftover (seen as a flake of
    test_model[redis-async], seed 4)."""
    coro = task.get_coro()
    frame = getattr(coro, "cr_frame", None)
    if frame is None or getattr(coro, "__qualname__", "") != "Event.wait":
        return False
    event = frame.f_locals.get("self")
    for other in tasks:
        if other.get_name() == "lockkit-renewal":
            run = getattr(other.get_coro(), "cr_frame", None)
            scheduler = run.f_locals.get("self") if run is not None else None
            if event is not None and getattr(scheduler, "_wakeup", None) is event:
                return True
    return False


class LoopThread:
    """An event loop running in its own thread for the whole example: the async renewal task keeps running
    while the machine sleeps, as it would in an application."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name="model-loop", daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = CALL_TIMEOUT) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def leftover_tasks(self, wait: float) -> list[str]:
        """Tasks other than lockkit's renewal task still pending ``wait`` s from now (after every locker closed)."""

        async def pending() -> list[asyncio.Task[Any]]:
            me = asyncio.current_task()
            tasks = asyncio.all_tasks()
            renewal = [t for t in tasks if t.get_name() == "lockkit-renewal"]
            return [t for t in tasks if t is not me and t not in renewal and not _renewal_wait(t, tasks)]

        deadline = time.monotonic() + wait
        while True:
            tasks = self.run(pending(), 10)
            if not tasks or time.monotonic() >= deadline:
                return [repr(t.get_coro()) for t in tasks]
            time.sleep(0.02)

    def close(self) -> None:
        async def drain() -> None:
            me = asyncio.current_task()
            tasks = [t for t in asyncio.all_tasks() if t is not me]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.loop.shutdown_asyncgens()

        try:
            self.run(drain(), 10)
            self.run(self.loop.shutdown_default_executor(), 10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
            self.loop.close()


class LostLog:
    """An on_lost callback that records when it fired and whether the lease said valid then."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, bool]] = []
        self._mutex = threading.Lock()

    def __call__(self, lease: Lease) -> None:
        with self._mutex:
            self.calls.append((time.monotonic(), lease.valid))


@dataclass(eq=False)
class Rec:
    """The model's record of one lease (in this process or a child's)."""

    who: str
    name: str
    hint: str
    fence: int
    t_call: float
    t_ret: float
    auto_renew: bool
    max_ttl: float
    lease: Lease | None = None
    lost: LostLog | None = None
    mode: str = "lock"
    """``lock``, or a permit's mode: ``permit`` (a semaphore's), ``read`` or ``write``."""
    first_valid: float | None = None
    last_valid: float | None = None
    released_at: float | None = None
    """The server released it: a release returned (or a cancelled release ended RELEASED)."""
    gave_up_at: float | None = None
    """The front end gave it up without knowing whether the server released it (a release that raised)."""
    ended_at: float | None = None
    """The owner closed or died: the server keeps it at most its ttl (session) from here."""
    over_at: float | None = None
    """When the lease was first seen LOST or RELEASED: both are final, it must never say valid again."""
    lost_at: float | None = None
    """When the lease was first seen LOST (a refused renewal, say, before its deadline): on_lost is due."""
    wall_offset: float = 0.0
    """The host's wall clock less the monotonic clock when the model learnt of the grant (see check_server)."""

    def observe(self, t: float, valid: bool) -> None:
        if valid:
            self.first_valid = t if self.first_valid is None else self.first_valid
            self.last_valid = t

    def describe(self) -> str:
        side = "" if self.mode == "lock" else f"/{self.mode}"
        return f"{self.who}:{self.name[-1]}{side}#{self.fence}<{self.hint}>"


class Child:
    """A holder process (:mod:`lockkit.testing._model_workers`) and what it reported."""

    def __init__(self, who: str, cfg: dict[str, Any], workdir: Path) -> None:
        self.who = who
        self.cfg = cfg
        self.err_path = workdir / f"{who}.stderr"
        env = dict(os.environ)
        root = str(Path(lockkit.__file__).resolve().parent.parent)  # the same lockkit as ours, even a worktree
        env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
        with open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "lockkit.testing._model_workers", json.dumps(cfg)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                env=env,
                close_fds=True,
            )
        assert self.proc.stdout is not None
        self._fd = self.proc.stdout.fileno()
        os.set_blocking(self._fd, False)
        self._buffer = b""
        self._closed = False
        self.rec: Rec | None = None
        self.timed_out = False
        self.errors: list[str] = []
        self.lost: list[tuple[float, bool]] = []
        self.released: str | None = None
        self.paused_at: float | None = None
        self.resumed_at: float = 0.0
        self.killed = False
        self.late_unreported: tuple[float, float] | None = None
        """(report time, deadline) of a report that says invalid past deadline + slack with no on_lost yet."""

    def read(self) -> list[list[str]]:
        lines: list[list[str]] = []
        while not self._closed:
            try:
                chunk = os.read(self._fd, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            self._buffer += chunk
        *complete, self._buffer = self._buffer.split(b"\n")
        for raw in complete:
            parts = raw.decode().split()
            if parts:
                lines.append(parts)
                self._apply(parts)
        return lines

    def _apply(self, parts: list[str]) -> None:
        kind = parts[0]
        if kind == "acq":
            t_call, t_ret, fence, ttl, hint = float(parts[1]), float(parts[2]), int(parts[3]), float(parts[4]), parts[5]
            self.rec = Rec(
                self.who,
                self.cfg["name"],
                hint,
                fence,
                t_call,
                t_ret,
                self.cfg["auto_renew"],
                max(ttl, float(self.cfg["ttl"])),
                mode=self.cfg.get("mode", "lock"),
            )
        elif kind == "timeout":
            self.timed_out = True
        elif kind == "v" and self.rec is not None:
            t, valid, deadline = float(parts[1]), parts[2] == "1", float(parts[3])
            self.rec.observe(t, valid)
            if not valid and not self.lost and t > max(deadline, self.resumed_at) + LOSS_SLACK:
                self.late_unreported = self.late_unreported or (t, deadline)
        elif kind == "lost":
            self.lost.append((float(parts[1]), parts[2] == "1"))
        elif kind == "rel":
            self.released = parts[2]
            if parts[2] == "ok" and self.rec is not None:
                self.rec.released_at = float(parts[1])
        elif kind == "error":
            self.errors.append(" ".join(parts[1:]))

    def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            self.read()
            if predicate():
                return True
            if self.proc.poll() is not None:
                self.read()
                return predicate()
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        with contextlib.suppress(BrokenPipeError, OSError):
            self.proc.stdin.write(command.encode() + b"\n")
            self.proc.stdin.flush()

    def signal(self, sig: signal.Signals) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def stderr_tail(self) -> str:
        try:
            return self.err_path.read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def reap(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        with contextlib.suppress(Exception):
            self.read()
        self._closed = True
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()


class Client:
    """One locker of the face under test, and a way to make its (sync or awaitable) calls."""

    def __init__(self, who: str, url: str, loop: LoopThread | None) -> None:
        self.who = who
        self.loop = loop
        self.locker: Any
        if loop is None:
            self.locker = lockkit.connect(url)
        else:

            async def opened() -> lockkit.AsyncLocker:
                return lockkit.connect_async(url)

            self.locker = loop.run(opened())
        self.closed = False

    def do(self, call: Callable[[], Any]) -> Any:
        """Run ``call()``; on the async face it returns a coroutine, awaited on the example's loop."""
        if self.loop is None:
            return call()
        result: Awaitable[Any] = call()

        async def awaited() -> Any:
            return await result

        return self.loop.run(awaited())

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.loop is None:
            self.locker.close()
        else:
            self.loop.run(self.locker.aclose())


@dataclass(eq=False)
class Handle:
    """The Lock (or AsyncLock) object a slot (client, name) acquired through, and its lease's record."""

    lock: Any
    rec: Rec | None = None
    extras: dict[str, Any] = field(default_factory=dict)


class LockModel(RuleBasedStateMachine):
    """The rules and checks; :func:`machine_for` binds them to a target."""

    target: ClassVar[ModelTarget]

    def __init__(self) -> None:
        super().__init__()
        self.t0 = time.monotonic()
        self.wall: Callable[[], float] = time.time
        """The host's wall clock, which Redis expires keys by (a test injects a jump)."""
        self.events: list[str] = []
        self.ready = False
        self.loop: LoopThread | None = None
        self.observer: lockkit.Locker | None = None
        self.clients: list[Client] = []
        self.names: list[str] = []
        self.recs: list[Rec] = []
        self.slots: dict[tuple[int, int, int], Handle] = {}
        """(client, name, hand) → the handle: a client may hold two permits of one name (two handles)."""
        self.specs: list[tuple[str, int]] = []
        """Per name: ``("lock", 1)``, ``("semaphore", limit)`` or ``("rwlock", 0)``."""
        self.phantoms: list[tuple[str, float]] = []
        """(name, when) of permit acquires that may have been granted unseen (cancelled, or raised while the
        server restarted): the server may count one more holder of the name for the longest ttl from then."""
        self.children: list[Child] = []
        self.unknown: dict[tuple[str, str], float] = {}
        self.workdir = Path(os.environ.get("TMPDIR", "/tmp"))
        self.own_dir: Path | None = None
        self.url = ""
        self.strict = False
        self.session_lifetime = False
        self.serial = 0
        self.restarting = False
        self.blocking_client: int | None = None
        """The index of the blocking-face client that contends while an event loop stalls (made on first use)."""
        self.server_fences: dict[str, int] = {}
        self.loop_ran_again_at = 0.0
        """When the event loop last ran again after a ``stall_loop``: an asyncio lease's on_lost comes from a task
        on that loop, so its LOSS_SLACK counts from then when its deadline fell inside the stall."""
        """Per name, the highest fencing token the server has named a holder with: it never goes down."""

    # -- set-up and tear-down ------------------------------------------------------------------------

    @initialize(
        clients=st.integers(2, 3),
        names=st.integers(1, 2),
        ttl=st.sampled_from(ACQUIRE_TTLS),
        auto_renew=st.booleans(),
        kinds=st.tuples(st.integers(0, 3), st.integers(0, 3)),
    )
    def open(self, clients: int, names: int, ttl: float, auto_renew: bool, kinds: tuple[int, int]) -> None:
        """Open the clients; the first one takes the first name, so that every example starts contended.

        On a permits target each name is a semaphore or, for limit 0, a reader-writer lock, its limit picked by
        ``kinds[i]`` from the target's ``limits``; the limit is the name's for the whole example, as every
        holder of a name must agree on it."""
        target = self.target
        self.own_dir = Path(tempfile.mkdtemp(prefix="lockkit-model-"))
        self.workdir = self.own_dir
        self.url = target.url(self.own_dir)
        self.loop = LoopThread() if target.face == "async" else None
        self.observer = lockkit.connect(self.url)
        (guarantees,) = self.observer.guarantees().values()
        self.strict = guarantees.fencing == "strict"
        self.session_lifetime = guarantees.lifetime == "session"
        tag = uuid.uuid4().hex[:12]
        self.names = [f"model-{tag}-{i}" for i in range(names)]
        if target.permits:
            drawn = [target.limits[k % len(target.limits)] for k in kinds[:names]]
            self.specs = [("rwlock", 0) if k == 0 else ("semaphore", k) for k in drawn]
        else:
            self.specs = [("lock", 1)] * names
        self.clients = [Client(f"c{i}", self.url, self.loop) for i in range(clients)]
        self.ready = True
        shown = " ".join(f"{kind}({limit})" if kind == "semaphore" else kind for kind, limit in self.specs)
        self.note(f"open {self.url} clients={clients} names={names}: {shown}")
        self.acquire(0, 0, "timeout", 5.0, ttl, auto_renew, False, 0)

    def teardown(self) -> None:
        if os.environ.get("LOCKKIT_MODEL_TRACE"):
            sys.stderr.write(f"--- {type(self).__name__} example ---\n" + "\n".join(self.events) + "\n")
        errors: list[BaseException] = []
        for child in self.children:
            try:
                child.reap()
            except BaseException as exc:
                errors.append(exc)
        for client in self.clients:
            try:
                client.close()
            except BaseException as exc:
                errors.append(exc)
        if self.observer is not None:
            self.observer.close()
        if self.loop is not None:
            leftover = [] if errors else self.loop.leftover_tasks(LEFTOVER_WAIT)
            self.loop.close()
            if leftover:
                self.fail(f"tasks still running after every locker was closed: {leftover}")
        if self.own_dir is not None:
            shutil.rmtree(self.own_dir, ignore_errors=True)
        if errors:
            raise errors[0]

    # -- helpers -------------------------------------------------------------------------------------------

    def now(self) -> float:
        return time.monotonic()

    def note(self, text: str) -> None:
        self.events.append(f"{self.now() - self.t0:8.3f}  {text}")

    def fail(self, message: str) -> None:
        timeline = "\n".join(self.events[-60:])
        raise AssertionError(f"{self.target.kind}/{self.target.face}: {message}\n--- timeline (s) ---\n{timeline}")

    def client(self, index: int) -> tuple[int, Client]:
        i = index % len(self.clients)
        return i, self.clients[i]

    def name(self, index: int) -> tuple[int, str]:
        i = index % len(self.names)
        return i, self.names[i]

    def held(self, which: int) -> tuple[Client, Handle] | None:
        """The ``which``-th slot (modulo) whose Lock has a lease (valid or not), or None if none has."""
        keys = sorted(k for k, h in self.slots.items() if h.rec is not None and h.lock.lease is not None)
        if not keys:
            return None
        key = keys[which % len(keys)]
        return self.clients[key[0]], self.slots[key]

    def call(self, client: Client, call: Callable[[], Any]) -> Any:
        """Make one API call; a ``BackendUnavailable`` is expected only while servers restart."""
        try:
            return client.do(call)
        except BackendUnavailable as exc:
            if self.target.restart is None:
                self.fail(f"{client.who}: unexpected BackendUnavailable with healthy servers: {exc}")
            raise

    def mode(self, name: int, write: bool) -> str:
        """What a handle on name ``name`` takes: ``lock``, ``permit``, or (``write`` picks) ``read``/``write``."""
        kind = self.specs[name % len(self.specs)][0]
        if kind == "rwlock":
            return "write" if write else "read"
        return "permit" if kind == "semaphore" else "lock"

    def lock(
        self, client: Client, name: int, write: bool, ttl: float, auto_renew: bool, lost: LostLog, **kw: Any
    ) -> Any:
        """A new handle of ``client`` on name index ``name``: a Lock, a semaphore permit, or one rwlock side."""
        ni, n = self.name(name)
        kind, limit = self.specs[ni]
        options: dict[str, Any] = {"ttl": ttl, "auto_renew": auto_renew, "on_lost": lost, **kw}
        if kind == "semaphore":
            return client.locker.semaphore(n, limit, **options)
        if kind == "rwlock":
            rw = client.locker.rwlock(n, **options)
            return rw.write() if write else rw.read()
        return client.locker.lock(n, **options)

    def granted(
        self, who: str, name: str, lease: Lease, lost: LostLog, t_call: float, ttl: float, mode: str = "lock"
    ) -> Rec:
        t_ret = self.now()
        rec = Rec(
            who,
            name,
            token_hint(lease.token),
            lease.fence or 0,
            t_call,
            t_ret,
            auto_renew=False,
            max_ttl=max(ttl, lease.ttl),
            lease=lease,
            lost=lost,
            mode=mode,
        )
        t = self.now()
        rec.observe(t, lease.valid)
        self.add_rec(rec)
        return rec

    def add_rec(self, rec: Rec) -> None:
        rec.wall_offset = self.wall() - self.now()
        self.note(f"GRANTED {rec.describe()} ttl≤{rec.max_ttl:g} call={rec.t_call - self.t0:.3f}")
        if self.strict:
            for other in self.recs:
                if other.name != rec.name:
                    continue
                if other.t_ret < rec.t_call and not other.fence < rec.fence:
                    self.fail(f"fencing: {rec.describe()} granted after {other.describe()} has no larger token")
                if rec.t_ret < other.t_call and not rec.fence < other.fence:
                    self.fail(f"fencing: {other.describe()} granted after {rec.describe()} has no larger token")
        self.recs.append(rec)

    def all_recs(self) -> list[Rec]:
        return self.recs + [c.rec for c in self.children if c.rec is not None and c.rec not in self.recs]

    # -- rules: the API -------------------------------------------------------------------------------------

    @rule(
        client=st.integers(0, 2),
        name=st.integers(0, 1),
        how=st.sampled_from(["try", "timeout", "lock-timeout"]),
        wait=st.sampled_from(WAITS),
        ttl=st.sampled_from(ACQUIRE_TTLS),
        auto_renew=st.booleans(),
        write=st.booleans(),
        hand=st.integers(0, 1),
    )
    def acquire(
        self, client: int, name: int, how: str, wait: float, ttl: float, auto_renew: bool, write: bool, hand: int
    ) -> None:
        """``write`` picks the side of a reader-writer lock; ``hand`` one of a client's two permit handles."""
        ci, c = self.client(client)
        ni, n = self.name(name)
        mode = self.mode(ni, write)
        key = (ci, ni, hand if mode != "lock" else 0)
        current = self.slots.get(key)
        if current is not None and current.lock.owned():
            try:
                self.call(c, lambda: current.lock.acquire(timeout=0))
            except LockTimeout:
                self.fail(f"{c.who}: re-acquiring a held Lock timed out instead of refusing (not reentrant)")
            except LockError:
                return
            self.fail(f"{c.who}: a Lock that holds {n!r} acquired it again")
        lost = LostLog()
        lock = self.lock(c, ni, write, ttl, auto_renew, lost, timeout=wait if how == "lock-timeout" else None)
        t_call = self.now()
        try:
            if how == "try":
                lease = self.call(c, lock.try_acquire)
            elif how == "timeout":
                lease = self.call(c, lambda: lock.acquire(timeout=wait))
            else:
                lease = self.call(c, lock.acquire)
        except LockTimeout:
            lease = None
        except BackendUnavailable:
            self.note(f"{c.who} acquire {n[-1]}: BackendUnavailable")
            self.phantoms.append((n, self.now()))
            return
        took = self.now() - t_call
        if lease is None:
            self.note(f"{c.who} acquire {n[-1]} {mode} ({how}): not free after {took:.3f}s")
            if how != "try" and took < wait - 0.01:
                self.fail(f"{c.who}: acquire(timeout={wait}) gave up after only {took:.3f} s")
            return
        rec = self.granted(c.who, n, lease, lost, t_call, ttl, mode)
        rec.auto_renew = auto_renew
        self.slots[key] = Handle(lock, rec)

    @rule(which=st.integers(0, 3))
    def release(self, which: int) -> None:
        found = self.held(which)
        if found is None:
            c = self.clients[0]
            lock = self.lock(c, 0, which % 2 == 1, 1.0, True, LostLog())
            try:
                self.call(c, lock.release)
            except LockNotOwned:
                return
            except (BackendUnavailable, LockError):
                return
            self.fail(f"{c.who}: release by a Lock that holds nothing did not raise LockNotOwned")
            return
        c, handle = found
        rec = handle.rec
        assert rec is not None
        lease: Lease = handle.lock.lease
        assert lease is rec.lease
        valid_before = lease.valid
        rivals = [
            r for r in self.recs
            if r.name == rec.name and r is not rec and r.mode == "lock" and r.lease is not None and r.lease.valid
        ]  # fmt: skip
        try:
            self.call(c, handle.lock.release)
            outcome = "ok"
        except LockNotOwned:
            outcome = "notowned"
        except LockError as exc:  # BackendUnavailable while restarting, or a closed locker
            outcome = f"error {type(exc).__name__}"
        t1 = self.now()
        self.note(f"{c.who} release {rec.describe()}: {outcome}")
        holders = [r for r in rivals if r.lease is not None and r.lease.valid]
        if outcome == "ok" and holders and rec.mode == "lock":
            self.fail(
                f"{rec.describe()}: its release returned as if it released {rec.name!r} while "
                f"{holders[0].describe()} held it valid throughout the call (must raise LockNotOwned)"
            )
        if outcome == "ok":
            rec.released_at = t1
            # A lease already lost by its deadline that the server still held is released and stays LOST.
            if lease.valid or lease.state not in (LeaseState.RELEASED, LeaseState.LOST):
                self.fail(f"{rec.describe()}: release returned but the lease is {lease.state} (valid={lease.valid})")
        elif outcome == "notowned":
            if lease.valid:
                self.fail(f"{rec.describe()}: release raised LockNotOwned but the lease still says valid")
            if valid_before and lease.expires_at > t1:
                self.fail(
                    f"{rec.describe()}: the server refused the release of a lease valid throughout the call "
                    f"(deadline {lease.expires_at - self.t0:.3f})"
                )
        else:
            rec.gave_up_at = t1
            if lease.valid:
                self.fail(f"{rec.describe()}: release raised ({outcome}) but the lease still says valid")

    @rule(which=st.integers(0, 3), factor=st.sampled_from(RENEW_FACTORS))
    def renew(self, which: int, factor: float | None) -> None:
        found = self.held(which)
        if found is None:
            c = self.clients[0]
            lock = self.lock(c, 0, which % 2 == 1, 1.0, True, LostLog())
            try:
                self.call(c, lambda: lock.renew(None if factor is None else 1.0))
            except LockNotOwned:
                return
            except LockError:
                return
            self.fail(f"{c.who}: renew by a Lock that holds nothing did not raise LockNotOwned")
            return
        c, handle = found
        rec = handle.rec
        assert rec is not None
        lease: Lease = handle.lock.lease
        ttl = _renew_ttl(factor, lease)
        rec.max_ttl = max(rec.max_ttl, ttl or 0.0)
        valid_before = lease.valid
        over_before = lease.state in (LeaseState.LOST, LeaseState.RELEASED)
        t0 = self.now()
        try:
            self.call(c, lambda: handle.lock.renew(ttl))
            outcome = "ok"
        except LockLost:
            outcome = "lost"
        except LockError as exc:
            outcome = f"error {type(exc).__name__}"
        t1 = self.now()
        rec.max_ttl = max(rec.max_ttl, lease.ttl)
        self.note(
            f"{c.who} renew {rec.describe()} ttl={ttl}: {outcome}, lease ttl {lease.ttl:g}, "
            f"deadline {lease.expires_at - self.t0:.3f} (sent ≥ {t0 - self.t0:.3f})"
        )
        if outcome == "ok":
            if over_before:
                self.fail(f"{rec.describe()}: renew returned on a lease already {lease.state.value} (must raise)")
            if lease.expires_at > t1 + lease.ttl - drift(lease.ttl):
                self.fail(
                    f"{rec.describe()}: renew(ttl={ttl}) returned a lease trusted until "
                    f"{lease.expires_at - self.t0:.3f}, beyond its send time + its ttl {lease.ttl:g} − drift "
                    f"(≤ {t1 + lease.ttl - drift(lease.ttl) - self.t0:.3f})"
                )
            # a ttl backend applies the ttl asked (to its resolution); a session backend reports the session's
            if ttl is not None and not self.session_lifetime and not rec.auto_renew and lease.ttl > ttl + 0.001:
                self.fail(f"{rec.describe()}: renew(ttl={ttl}) returned a lease of ttl {lease.ttl:g}, longer")
        elif outcome == "lost":
            if lease.valid:
                self.fail(f"{rec.describe()}: renew raised LockLost but the lease still says valid")
            if valid_before and lease.expires_at > t1 and lease.state is LeaseState.LOST:
                self.fail(
                    f"{rec.describe()}: the server refused the renewal of a lease that was valid throughout "
                    f"the call (deadline {lease.expires_at - self.t0:.3f}): {lease.lost_reason}"
                )

    @rule(client=st.integers(0, 2))
    def close_client(self, client: int) -> None:
        ci, c = self.client(client)
        c.close()
        t = self.now()
        self.note(f"{c.who} closed")
        for rec in self.recs:
            if rec.who != c.who or rec.lease is None:
                continue
            lease = rec.lease
            if lease.state is LeaseState.RELEASED:
                continue
            rec.ended_at = rec.ended_at or t
            if lease.valid:
                self.fail(f"{rec.describe()}: still valid after its locker was closed")
            if rec.lost is not None and not rec.lost.calls:
                self.fail(f"{rec.describe()}: closing its locker did not fire on_lost")
        self.serial += 1
        self.clients[ci] = Client(f"c{ci}.{self.serial}", self.url, c.loop)  # the same face as before
        for key in [k for k in self.slots if k[0] == ci]:
            del self.slots[key]

    @rule(seconds=st.sampled_from([0.2, 0.7, 1.5]))
    def wait(self, seconds: float) -> None:
        self.note(f"wait {seconds}s")
        time.sleep(seconds)

    @rule(which=st.integers(0, 3))
    def outlive(self, which: int) -> None:
        """An in-process pause: sleep past the deadline of a lease with auto-renewal off."""
        found = self.held(which)
        if found is None:
            return
        c, handle = found
        if handle.rec is None or handle.rec.lease is None or handle.rec.auto_renew:
            return
        lease = handle.rec.lease
        if not lease.valid:
            return
        pause = lease.expires_at - self.now() + 0.05
        if pause > OUTLIVE_MAX:
            return  # renewals with longer ttls can push a deadline far out: not worth the real time
        self.note(f"{c.who} pauses {pause:.2f}s past the deadline of {handle.rec.describe()}")
        time.sleep(max(0.0, pause))
        if lease.valid:
            self.fail(f"{handle.rec.describe()}: valid after its deadline passed with auto-renewal off")

    # -- checks -----------------------------------------------------------------------------------------------

    @invariant()
    def safe(self) -> None:
        if not self.ready:
            return
        for child in self.children:
            child.read()
            self.check_child(child)
        for rec in self.recs:
            if rec.lease is not None:
                t = self.now()
                rec.observe(t, rec.lease.valid)
                self.check_final(rec, t)
        self.check_exclusion()
        self.check_losses()
        if not self.restarting:
            for name in self.names:
                if self.target.permits:
                    self.check_permit_server(name)
                else:
                    self.check_server(name)

    def check_final(self, rec: Rec, t: float) -> None:
        """LOST and RELEASED are final: once seen, the lease never says valid again (the exclusion check's
        sampled intervals rely on it too)."""
        lease = rec.lease
        assert lease is not None
        state = lease.state
        if state is LeaseState.LOST and rec.lost_at is None:
            rec.lost_at = t
        if rec.lost_at is not None and rec.lost is not None and not rec.lost.calls and t > rec.lost_at + LOSS_SLACK:
            self.fail(
                f"{rec.describe()}: LOST since {rec.lost_at - self.t0:.3f} ({lease.lost_reason}) and on_lost has "
                f"not fired"
            )
        if rec.over_at is None:
            if state in (LeaseState.LOST, LeaseState.RELEASED):
                rec.over_at = t
            return
        if lease.valid:
            self.fail(
                f"{rec.describe()}: says valid again (state {state.value}, deadline {lease.expires_at - self.t0:.3f}) "
                f"after it was seen lost or released at {rec.over_at - self.t0:.3f}"
            )

    def check_child(self, child: Child) -> None:
        if child.errors:
            self.fail(f"{child.who} failed: {child.errors[0]}\n{child.stderr_tail()}")
        if any(valid for _, valid in child.lost):
            self.fail(f"{child.who}: on_lost fired while the lease said valid")
        if len(child.lost) > 1:
            self.fail(f"{child.who}: on_lost fired {len(child.lost)} times")
        if child.late_unreported is not None:
            at, deadline = child.late_unreported
            self.fail(
                f"{child.who}: its lease expired at {deadline - self.t0:.3f} (resumed "
                f"{child.resumed_at - self.t0:.3f}) and was still not reported lost at {at - self.t0:.3f}"
            )

    def check_exclusion(self) -> None:
        recs = [r for r in self.all_recs() if r.first_valid is not None and r.last_valid is not None]
        if self.target.permits:
            self.check_permit_exclusion(recs)
            return
        for i, a in enumerate(recs):
            for b in recs[i + 1 :]:
                if a.name != b.name:
                    continue
                assert a.first_valid is not None and a.last_valid is not None
                assert b.first_valid is not None and b.last_valid is not None
                if a.first_valid <= b.last_valid and b.first_valid <= a.last_valid:
                    self.fail(
                        f"two valid holders of {a.name!r}: {a.describe()} valid "
                        f"[{a.first_valid - self.t0:.3f}, {a.last_valid - self.t0:.3f}] and {b.describe()} valid "
                        f"[{b.first_valid - self.t0:.3f}, {b.last_valid - self.t0:.3f}]"
                    )

    @staticmethod
    def span(rec: Rec) -> tuple[float, float]:
        assert rec.first_valid is not None and rec.last_valid is not None
        return rec.first_valid, rec.last_valid

    def check_permit_exclusion(self, recs: list[Rec]) -> None:
        """At no instant more valid permits than the limit; a valid writer's lease is its rwlock's only one.

        Sampled validity intervals are inside the true ones, so overlapping samples are a real overlap; on a
        line, intervals that pairwise overlap share a point, so the sweep's maximum is a count at one instant.
        """
        for ni, name in enumerate(self.names):
            kind, limit = self.specs[ni]
            mine = [r for r in recs if r.name == name]
            if kind == "semaphore":
                edges = sorted(
                    [(self.span(r)[0], 0, r) for r in mine] + [(self.span(r)[1], 1, r) for r in mine],
                    key=lambda e: (e[0], e[1]),
                )
                live: list[Rec] = []
                for t, end, rec in edges:
                    if end:
                        live.remove(rec)
                        continue
                    live.append(rec)
                    if len(live) > limit:
                        shown = ", ".join(
                            f"{r.describe()} [{self.span(r)[0] - self.t0:.3f}, {self.span(r)[1] - self.t0:.3f}]"
                            for r in live
                        )
                        at = t - self.t0
                        self.fail(f"{len(live)} valid permits of {name!r} (limit {limit}) at {at:.3f}: {shown}")
                continue
            for writer in (r for r in mine if r.mode == "write"):
                w0, w1 = self.span(writer)
                for other in mine:
                    o0, o1 = self.span(other)
                    if other is not writer and w0 <= o1 and o0 <= w1:
                        self.fail(
                            f"a valid writer shares {name!r}: {writer.describe()} valid [{w0 - self.t0:.3f}, "
                            f"{w1 - self.t0:.3f}] and {other.describe()} valid [{o0 - self.t0:.3f}, {o1 - self.t0:.3f}]"
                        )

    def check_losses(self) -> None:
        for rec in self.recs:
            lease, lost = rec.lease, rec.lost
            if lease is None or lost is None:
                continue
            calls = list(lost.calls)
            if len(calls) > 1:
                self.fail(f"{rec.describe()}: on_lost fired {len(calls)} times")
            if calls and calls[0][1]:
                self.fail(f"{rec.describe()}: on_lost fired while the lease said valid")
            if lease.state is LeaseState.RELEASED:
                continue
            now = self.now()
            if now > lease.expires_at + LOSS_SLACK:
                if lease.valid:
                    self.fail(f"{rec.describe()}: valid after its deadline")
                if not calls and now > max(lease.expires_at, self.loop_ran_again_at) + LOSS_SLACK:
                    self.fail(
                        f"{rec.describe()}: its deadline {lease.expires_at - self.t0:.3f} passed "
                        f"{now - lease.expires_at:.3f} s ago and on_lost has not fired (state {lease.state.value})"
                    )

    def hold_bound(self, rec: Rec, now: float) -> tuple[float, str] | None:
        """Until when the server may still name ``rec``'s token as the holder (None: no bound now)."""
        bounds: list[tuple[float, str]] = []
        ttl = max(rec.max_ttl, self.target.session_ttl)
        if rec.released_at is not None:
            bounds.append((rec.released_at, "released"))
        if rec.gave_up_at is not None:
            bounds.append((rec.gave_up_at + ttl + HOLD_SLACK, "given up (its release raised)"))
        if rec.ended_at is not None:
            bounds.append((rec.ended_at + ttl + HOLD_SLACK, "its owner closed or died"))
        child = next((c for c in self.children if c.rec is rec), None)
        if child is not None and child.paused_at is not None:
            bounds.append((child.paused_at + ttl + HOLD_SLACK, "its owner is paused"))
        lease = rec.lease
        if lease is not None and not self.session_lifetime and not lease.valid:
            bounds.append((lease.expires_at + ttl + HOLD_SLACK, "it expired"))
        return min(bounds) if bounds else None

    def check_server(self, name: str) -> None:
        assert self.observer is not None
        mine = [r for r in self.recs if r.name == name and r.lease is not None and r.lease.valid]
        t1 = self.now()
        try:
            info = self.observer.holder(name)
        except BackendUnavailable as exc:
            if self.target.restart is None:
                self.fail(f"holder({name!r}) raised BackendUnavailable with healthy servers: {exc}")
            return
        t2 = self.now()
        for rec in mine:
            lease = rec.lease
            assert lease is not None
            if not lease.valid:
                continue  # it may have ended while we asked
            if not info.held or info.token_hint != rec.hint:
                held = f"<{info.token_hint}>" if info.held else "nobody"
                self.fail(f"{rec.describe()} says valid but the server says {held} holds {name!r}")
            tolerance = self.target.ttl_left_tolerance
            if tolerance is not None and info.ttl_left is not None:
                # The server answered by t2, so it expires the lock by t2 + ttl_left (± its resolution); the
                # lease counts from before the server set that expiry, less the drift margin. Where the
                # resolution is coarser than the margin (etcd's whole seconds) only the expiry itself is checked.
                # Redis counts a key's expiry on the wall clock, the lease on the monotonic one: a wall clock
                # that jumped forward since the grant (a VM's host resyncing it) expires the key that much
                # sooner on the server, which no client can see coming. That is the host's doing, not the
                # library's, so the jump is added back (a CI run failed test_model[sentinel-sync] by 3 ms so:
                # the key's expiry came 8 ms before the one its acquire could have set; tests/test_model_found.py).
                jumped = max(0.0, self.wall() - self.now() - rec.wall_offset)
                server_end = t2 + info.ttl_left + tolerance + jumped
                margin = drift(lease.ttl) if tolerance < drift(lease.ttl) else 0.0
                if lease.expires_at > server_end - margin:
                    self.fail(
                        f"{rec.describe()} trusts its lease until {lease.expires_at - self.t0:.3f} but the server "
                        f"lets it expire by {server_end - self.t0:.3f} (ttl left {info.ttl_left:.3f}), less the "
                        f"drift margin {margin:.3f}"
                    )
        if not info.held or info.token_hint is None:
            return
        known = [r for r in self.all_recs() if r.name == name and r.hint == info.token_hint]
        if not known:
            first = self.unknown.setdefault((name, info.token_hint), t1)
            longest = max([*ACQUIRE_TTLS, *[r.max_ttl for r in self.all_recs()], self.target.session_ttl])
            if t1 > first + longest + HOLD_SLACK:
                self.fail(f"{name!r} held by <{info.token_hint}>, no lease of the model, since {first - self.t0:.3f}")
            return
        rec = known[0]
        if self.strict and info.fencing_token is not None:
            last = self.server_fences.get(name)
            if last is not None and info.fencing_token < last:
                self.fail(f"the server's fencing token for {name!r} went down from {last} to {info.fencing_token}")
            self.server_fences[name] = max(last or 0, info.fencing_token)
        if self.strict and info.fencing_token is not None and info.fencing_token != rec.fence:
            self.fail(f"server reports fencing token {info.fencing_token} for {rec.describe()}")
        bound = self.hold_bound(rec, t1)
        if bound is not None and t1 > bound[0]:
            self.fail(
                f"the server still names {rec.describe()} as holder at {t1 - self.t0:.3f}, after {bound[1]} "
                f"(it had to be free by {bound[0] - self.t0:.3f})"
            )

    def check_permit_server(self, name: str) -> None:
        """What ``permit_holders`` shows (counts, not tokens) agrees with the model's leases.

        A lease still valid after the answer was valid while the server answered, so the server counts at
        least those (and a writer, alone); it counts at most the leases it may still hold by their bounds
        (:meth:`hold_bound`) plus the acquires the model may not have seen granted; never more than the limit;
        its last fencing token is at least every grant's."""
        assert self.observer is not None
        ni = self.names.index(name)
        kind, limit = self.specs[ni]
        t1 = self.now()
        try:
            info = self.observer.permit_holders(name)
        except BackendUnavailable as exc:
            if self.target.restart is None:
                self.fail(f"permit_holders({name!r}) raised BackendUnavailable with healthy servers: {exc}")
            return
        t2 = self.now()
        for child in self.children:
            child.read()
        recs = [r for r in self.all_recs() if r.name == name]
        valid = [r for r in recs if (r.lease.valid if r.lease is not None else (r.last_valid or 0.0) >= t2)]
        shown = (
            f"{name!r} ({kind}): the server counts {info.holders} holder(s) (writer={info.writer}, limit={info.limit})"
        )
        if info.limit is not None and info.limit != limit:
            self.fail(f"{shown}, but every handle of the model uses limit {limit}")
        if kind == "semaphore" and info.holders > limit:
            self.fail(f"{shown}: more than the limit")
        if kind == "rwlock" and info.writer and info.holders != 1:
            self.fail(f"{shown}: a writer is not alone")
        if len(valid) > info.holders:
            self.fail(f"{shown} while {len(valid)} lease(s) said valid: {', '.join(r.describe() for r in valid)}")
        if kind == "rwlock":
            writers = [r for r in valid if r.mode == "write"]
            readers = [r for r in valid if r.mode == "read"]
            if writers and not info.writer:
                self.fail(f"{shown} while writer {writers[0].describe()} said valid")
            if readers and info.writer:
                self.fail(f"{shown} while reader {readers[0].describe()} said valid")
        # Compared with the holders only: etcd reports the newest holder's token, not the last one handed out
        held = [r.fence for r in valid]
        if self.strict and held and (info.fencing_token is None or info.fencing_token < max(held)):
            self.fail(f"{shown}: its fencing token {info.fencing_token} is below a valid holder's {max(held)}")
        longest = max([*ACQUIRE_TTLS, *[r.max_ttl for r in self.all_recs()], self.target.session_ttl])
        may_hold = []
        for rec in recs:
            bound = self.hold_bound(rec, t1)
            if bound is None or t1 <= bound[0]:
                may_hold.append(rec)
        unseen = [at for n, at in self.phantoms if n == name and t1 <= at + longest + HOLD_SLACK]
        # Between steps no acquire of the model is waiting (a timed-out or refused one has left the queue), but
        # for the unseen ones: a waiter the server still counts would hold back the readers or permits after it.
        queued = {"waiting writer(s)": info.waiting_writers, "waiter(s)": info.waiters or 0}
        for what, count in queued.items():
            if count > len(unseen):
                self.fail(f"{shown} and {count} {what} at {t1 - self.t0:.3f}, but no acquire of the model waits")
        if info.holders > len(may_hold) + len(unseen):
            gone = [
                f"{r.describe()} ({bound[1]}, free by {bound[0] - self.t0:.3f})"
                for r in recs
                if r not in may_hold and (bound := self.hold_bound(r, t1)) is not None
            ]
            self.fail(
                f"{shown} at {t1 - self.t0:.3f}, but at most {len(may_hold)} lease(s) may still be held "
                f"({', '.join(r.describe() for r in may_hold) or 'none'}) and {len(unseen)} unseen acquire(s); "
                f"no longer held: {', '.join(gone) or 'none'}"
            )


class AsyncRules(LockModel):
    """Cancellation at a random await point (the asyncio face only)."""

    @rule(
        client=st.integers(0, 2),
        name=st.integers(0, 1),
        op=st.sampled_from(["acquire", "release", "renew"]),
        spins=st.integers(0, 3),
        delay=st.sampled_from([0.0, 0.0005, 0.003, 0.02]),
        factor=st.sampled_from(RENEW_FACTORS),
        write=st.booleans(),
    )
    def cancel(
        self, client: int, name: int, op: str, spins: int, delay: float, factor: float | None, write: bool
    ) -> None:
        ci, c = self.client(client)
        ni, n = self.name(name)
        loop = self.loop
        assert loop is not None
        if c.loop is None:
            return  # the blocking-face contender of stall_loop: nothing to cancel
        lost = LostLog()
        rec: Rec | None = None
        ttl = 2.0 if factor is None else factor * 2.0
        mode = self.mode(ni, write)
        if op == "acquire":
            lock = self.lock(c, ni, write, ttl, True, lost)
            make: Callable[[], Awaitable[Any]] = lambda: lock.acquire(timeout=3.0)  # noqa: E731
        else:
            found = self.held(client + 2 * name)
            if found is None or not found[1].lock.owned() or found[0].loop is None:
                return
            c, handle = found
            rec = handle.rec
            assert rec is not None
            lock = handle.lock
            if op == "release":
                make = lock.release
            else:
                assert rec.lease is not None
                renew_ttl = _renew_ttl(factor, rec.lease)
                rec.max_ttl = max(rec.max_ttl, renew_ttl or 0.0)
                make = lambda: lock.renew(renew_ttl)  # noqa: E731
        started: list[float] = []

        async def body() -> Any:
            started.append(self.now())
            return await make()

        async def runner() -> tuple[str, Any]:
            task = asyncio.ensure_future(body())
            for _ in range(spins):
                await asyncio.sleep(0)
            if delay:
                await asyncio.sleep(delay)
            task.cancel()
            try:
                return "done", await task
            except asyncio.CancelledError:
                return "cancelled", None
            except LockError as exc:
                return "error", exc

        t_call = self.now()
        outcome, value = loop.run(runner())
        began = "started" if started else "not started"
        what = rec.describe() if rec else n[-1]
        self.note(f"{c.who} cancel {op} {what} ({spins} spins, {delay}s): {outcome}, {began}")
        if op == "acquire":
            if outcome == "done" and value is not None:
                new = self.granted(c.who, n, value, lost, t_call, ttl, mode)
                new.auto_renew = True
                self.slots[(ci, ni, 0)] = Handle(lock, new)
            elif started:
                self.phantoms.append((n, self.now()))
            return
        assert rec is not None and rec.lease is not None
        lease = rec.lease
        if op == "release":
            if outcome == "done":
                rec.released_at = self.now()
                return
            if outcome == "error":
                if isinstance(value, LockNotOwned):
                    return
                rec.gave_up_at = self.now()
                return
            if not started:
                return
            deadline = self.now() + SETTLE
            while lease.valid and self.now() < deadline:
                time.sleep(0.01)
            if lease.valid:
                self.fail(
                    f"{rec.describe()}: a cancelled release that started left the lease valid (state "
                    f"{lease.state.value}, owned={lock.owned()}) {SETTLE} s later: it must complete or give up"
                )
            if lease.state is LeaseState.RELEASED:
                rec.released_at = self.now()
            return
        # renew: let a shielded renewal land before the checks compare the lease with the server
        if outcome == "cancelled" and started:
            time.sleep(0.3)
        rec.max_ttl = max(rec.max_ttl, lease.ttl)

    @rule(which=st.integers(0, 3), extra=st.sampled_from([0.1, 0.5]), contend=st.booleans())
    def stall_loop(self, which: int, extra: float, contend: bool) -> None:
        """Block the event loop past a lease's deadline; ``contend``: a blocking-face client tries the name
        meanwhile. The renewal task cannot run, so the lease may stay valid only if a renewal that landed in
        time (in a driver's own thread) moved its deadline, and the server then agrees: the checks say."""
        found = self.held(which)
        loop = self.loop
        if found is None or loop is None:
            return
        c, handle = found
        rec = handle.rec
        if rec is None or rec.lease is None or not rec.lease.valid:
            return
        lease = rec.lease
        pause = lease.expires_at - self.now() + extra
        if pause > OUTLIVE_MAX:
            return
        self.note(f"{c.who}'s loop stalls {pause:.2f}s past the deadline of {rec.describe()} (contend={contend})")
        unblocked = threading.Event()

        def block() -> None:
            time.sleep(pause)
            unblocked.set()

        loop.loop.call_soon_threadsafe(block)
        try:
            if contend:
                # past the server's expiry (the deadline + the drift margin), with the loop still blocked
                time.sleep(max(0.0, lease.expires_at + drift(lease.ttl) + 0.03 - self.now()))
                if self.blocking_client is None:
                    self.blocking_client = len(self.clients)
                    self.clients.append(Client(f"b{self.blocking_client}", self.url, None))
                self.acquire(self.blocking_client, self.names.index(rec.name), "try", 0.0, 2.0, True, True, 1)
        finally:
            if not unblocked.wait(pause + CALL_TIMEOUT):
                self.fail("the stalled event loop never ran again")
        self.loop_ran_again_at = self.now()
        self.note(f"{c.who}'s loop runs again")


class ChildRules(LockModel):
    """Holders in child processes: paused, killed, released (every backend but memory://)."""

    @rule(
        name=st.integers(0, 1),
        ttl=st.sampled_from(ACQUIRE_TTLS),
        auto_renew=st.booleans(),
        timeout=st.sampled_from([0.0, 1.0]),
        write=st.booleans(),
    )
    def spawn_holder(self, name: int, ttl: float, auto_renew: bool, timeout: float, write: bool) -> None:
        if sum(c.alive for c in self.children) >= 2:
            return
        ni, n = self.name(name)
        self.serial += 1
        who = f"p{self.serial}"
        cfg = {
            "url": self.url,
            "name": n,
            "ttl": ttl,
            "auto_renew": auto_renew,
            "timeout": timeout,
            "face": self.target.face,
            "period": CHILD_PERIOD,
            "mode": self.mode(ni, write),
            "limit": self.specs[ni][1],
        }
        child = Child(who, cfg, self.workdir)
        self.children.append(child)
        if not child.wait_for(
            lambda: child.rec is not None or child.timed_out or bool(child.errors), CHILD_START_TIMEOUT + timeout
        ):
            self.fail(f"{who} neither acquired nor timed out\n{child.stderr_tail()}")
        self.check_child(child)
        if child.rec is None:
            self.note(f"{who} acquire {n[-1]} (timeout {timeout}): not free")
            child.reap()
            return
        self.add_rec(child.rec)

    def holding(self, which: int) -> Child | None:
        live = [c for c in self.children if c.alive and c.rec is not None and c.released is None]
        return live[which % len(live)] if live else None

    @rule(which=st.integers(0, 1), extra=st.sampled_from([0.3, 1.0]), contend=st.booleans())
    def pause_holder(self, which: int, extra: float, contend: bool) -> None:
        child = self.holding(which)
        if child is None or child.rec is None:
            return
        rec = child.rec
        pause = max(rec.max_ttl, self.target.session_ttl) + extra
        child.signal(signal.SIGSTOP)
        child.paused_at = self.now()
        self.note(f"{child.who} SIGSTOP for {pause:.2f}s ({rec.describe()})")
        try:
            time.sleep(pause)
            if contend:
                self.acquire(0, self.names.index(rec.name), "try", 0.0, 2.0, True, True, 1)
        finally:
            child.signal(signal.SIGCONT)
            child.paused_at = None
            child.resumed_at = self.now()
            self.note(f"{child.who} SIGCONT")
        time.sleep(0.1)

    @rule(which=st.integers(0, 1))
    def kill_holder(self, which: int) -> None:
        child = self.holding(which)
        if child is None or child.rec is None:
            return
        child.signal(signal.SIGKILL)
        child.proc.wait(10)
        child.killed = True
        child.rec.ended_at = self.now()
        self.note(f"{child.who} SIGKILL ({child.rec.describe()})")
        child.read()

    @rule(which=st.integers(0, 1))
    def release_holder(self, which: int) -> None:
        child = self.holding(which)
        if child is None or child.rec is None:
            return
        child.send("release")
        if not child.wait_for(lambda: child.released is not None or bool(child.errors), CALL_TIMEOUT):
            self.fail(f"{child.who} did not answer a release\n{child.stderr_tail()}")
        self.note(f"{child.who} release {child.rec.describe()}: {child.released}")
        child.proc.wait(10)
        if child.released != "ok":
            child.rec.ended_at = self.now()


class PermitRules(LockModel):
    """A rush for one name (permits targets only): every handle that holds nothing of it tries at once, so
    that a semaphore is asked for more permits than its limit, and readers and writers meet, within a step."""

    @rule(
        name=st.integers(0, 1),
        sides=st.lists(st.booleans(), min_size=6, max_size=6),
        ttl=st.sampled_from(ACQUIRE_TTLS),
        auto_renew=st.booleans(),
    )
    def crowd(self, name: int, sides: list[bool], ttl: float, auto_renew: bool) -> None:
        ni, n = self.name(name)
        self.note(f"crowd {n[-1]}")
        for i, write in enumerate(sides):
            ci, hand = i % len(self.clients), i // len(self.clients) % 2
            current = self.slots.get((ci, ni, hand))
            if current is None or not current.lock.owned():
                self.acquire(ci, ni, "try", 0.0, ttl, auto_renew, write, hand)


class RestartRules(LockModel):
    """Restart the server (keeping its data) between any two steps."""

    @rule(member=st.integers(0, 4))
    def restart_server(self, member: int) -> None:
        restart = self.target.restart
        assert restart is not None
        self.note(f"restart server (member {member})")
        self.restarting = True
        try:
            restart(member)
        finally:
            self.restarting = False
        self.note("server back")


def machine_for(target: ModelTarget) -> type[LockModel]:
    """The state machine class for ``target``: the base rules plus the ones that apply to it."""
    bases: list[type[LockModel]] = []
    if target.face == "async":
        bases.append(AsyncRules)
    if target.children and target.kind != "memory":
        bases.append(ChildRules)
    if target.permits:
        bases.append(PermitRules)
    if target.restart is not None:
        bases.append(RestartRules)
    name = f"Model_{target.kind}_{target.face}{'_permits' if target.permits else ''}"
    name += "_restart" if target.restart else ""
    machine: type[LockModel] = type(name, (*bases, LockModel) if bases else (LockModel,), {"target": target})
    return machine
