"""migrate:// at its edges (issue 12): a paused waiter (A-3), a refused stale client (A-4), a failing release, and
the end of a migration (a plain backend with ``fencing_epoch``), on real servers and processes.

Like tests/test_migrate.py, each scenario runs file:// → file:// always and Redis → etcd when those drivers are
present. A "pause" is a real SIGSTOP/SIGCONT of a child process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import lockkit
from lockkit import ConfigError, LockError, LockLost
from lockkit.cli.fencing_store import FencedStore
from lockkit.drivers.migrate import EPOCH_SHIFT

HOST = socket.gethostname()


def _redis_has_presence() -> bool:
    try:
        from lockkit.drivers.redis import RedisDriver
    except Exception:  # the redis extra is not installed
        return False
    return hasattr(RedisDriver, "announce")


KINDS = [
    "file",
    pytest.param(
        "redis-etcd",
        marks=pytest.mark.skipif(not _redis_has_presence(), reason="RedisDriver keeps no presence records yet"),
    ),
]


@dataclass
class Pair:
    old: str
    new: str
    off: Callable[[str], None]
    """``off("old")`` / ``off("new")``: switch that backend off for good (kill the server, remove the directory)."""


@pytest.fixture(params=KINDS)
def pair(request: pytest.FixtureRequest, tmp_path: Path) -> Pair:
    """Old and new backend URLs; servers of our own (function-scoped) so that a test may switch one off."""
    if request.param == "file":
        dirs = {"old": tmp_path / "old", "new": tmp_path / "new"}

        def off_dir(role: str) -> None:
            # Renamed, not deleted: a lock file opened through the old path now fails as a dead server would.
            dirs[role].rename(dirs[role].with_name(dirs[role].name + ".gone"))

        return Pair(dirs["old"].as_uri(), dirs["new"].as_uri(), off_dir)
    redis, etcd = request.getfixturevalue("fresh_redis")(), request.getfixturevalue("fresh_etcd")()
    prefix = f"m{uuid.uuid4().hex[:8]}"
    servers = {"old": redis, "new": etcd}
    return Pair(f"{redis.url}?prefix={prefix}:", f"{etcd.url}?prefix=/{prefix}/", lambda role: servers[role].kill())


def _toml(pair: Pair, phase: str, presence_ttl: float) -> str:
    return (
        'default = "main"\n'
        f'[backends.old]\nurl = "{pair.old}"\n'
        f'[backends.new]\nurl = "{pair.new}"\n'
        f'[backends.main]\nmigrate = {{ from = "old", to = "new", phase = "{phase}", presence_ttl = {presence_ttl} }}\n'
    )


@pytest.fixture
def config(tmp_path: Path, pair: Pair) -> Callable[..., Path]:
    def write(phase: str, presence_ttl: float = 1.0) -> Path:
        path = tmp_path / f"lockkit-{phase}-{presence_ttl:g}.toml"
        path.write_text(_toml(pair, phase, presence_ttl))
        return path

    return write


@pytest.fixture
def lockers() -> Iterator[Callable[[Any], lockkit.Locker]]:
    opened: list[lockkit.Locker] = []

    def open_(path: Any) -> lockkit.Locker:
        opened.append(lockkit.from_config(path) if not isinstance(path, str) else lockkit.connect(path))
        return opened[-1]

    yield open_
    for locker in opened:
        locker.close()


def _eventually(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.05)


def _can_lock(locker: lockkit.Locker, name: str) -> bool:
    try:
        lease = locker.lock(name, ttl=5).try_acquire()
    except LockError:
        return False
    return lease is not None


def _pids(fleet: dict[str, dict[str, Any]], phase: str | None = None) -> set[str]:
    return {str(r.get("pid")) for r in fleet.values() if phase is None or r.get("phase") == phase}


# -- a waiter paused past presence_ttl, granted the lock while a 'new' client holds it ---------------------


def _wait_for_lock(config: str, name: str, out: str) -> None:
    """Child: wait for ``name`` in the config's phase; write what acquire returned, and when (CLOCK_MONOTONIC)."""
    locker = lockkit.from_config(config)
    try:
        lease = locker.lock(name, ttl=10).acquire(timeout=60)
        result: dict[str, Any] = {
            "acquired": True,
            "valid": lease.valid,
            "at": time.monotonic(),
            "expires_at": lease.expires_at,
        }
    except LockError as exc:
        result = {"acquired": False, "error": f"{type(exc).__name__}: {exc}", "at": time.monotonic()}
    tmp = Path(out + ".tmp")
    tmp.write_text(json.dumps(result))
    tmp.rename(out)
    time.sleep(0.5)  # let the renewal thread run once more, as a real holder would, before closing
    locker.close()


def test_A3_old_client_paused_past_presence_ttl_cannot_overlap_new(
    pair: Pair, config: Callable[..., Path], lockers: Any, tmp_path: Path
) -> None:
    name = "a3:x"
    holder = lockers(config("old"))
    held = holder.lock(name, ttl=10)
    held.acquire()
    observer = lockers(config("both")).migrations()["main"]  # reads the fleet, never announces
    plain_old = lockers(pair.old)
    out = tmp_path / "a3-result.json"
    child = multiprocessing.get_context("spawn").Process(
        target=_wait_for_lock, args=(str(config("old")), name, str(out))
    )
    child.start()
    assert child.pid is not None
    stopped = False
    try:
        _eventually(
            lambda: str(child.pid) in _pids(observer.fleet(), "old") and (plain_old.holder(name).waiters or 0) >= 1,
            60,
            "the 'old' child announced itself and waits for the lock",
        )
        os.kill(child.pid, signal.SIGSTOP)
        stopped = True
        _eventually(lambda: str(child.pid) not in _pids(observer.fleet()), 30, "the paused child's presence expired")
        held.release()  # hands the lock to the paused child's still-open connection (or wakes it)
        holder.close()  # withdraws the holder's 'old' presence: no live 'old' client is left
        new = lockers(config("new"))
        new_lease = new.lock(name, ttl=10).acquire(timeout=10)  # sees no 'old' client, locks the new backend only
        os.kill(child.pid, signal.SIGCONT)
        stopped = False
        _eventually(out.exists, 30, "the resumed child's acquire returned")
        result = json.loads(out.read_text())
        assert new_lease.valid, "the 'new' holder lost its lock because the paused 'old' client came back"
        assert not (result["acquired"] and result["valid"]), (
            f"two valid holders of {name!r}: the resumed 'old' client got a lease valid until {result['expires_at']}"
            f" at {result['at']} while the 'new' client's lease was valid until {new_lease.expires_at}"
        )
        assert not result["acquired"], f"the resumed 'old' client's acquire returned a lease: {result}"
        error = result["error"]
        assert "'new'" in error and f"{HOST}:{os.getpid()}" in error, error
        assert "migration 'main': migration" not in error, error
        _eventually(lambda: not plain_old.holder(name).held, 15, "the uncounted grant was released on the old backend")
        assert new.lock("a3:y").try_acquire() is not None, "the 'new' client was fenced off by the resumed one"
    finally:
        if stopped:
            os.kill(child.pid, signal.SIGCONT)
        child.join(30)
        if child.is_alive():
            child.kill()
            child.join(5)


def test_A3_paused_waiter_with_no_conflicting_client_still_gets_the_lock(
    pair: Pair, config: Callable[..., Path], lockers: Any, tmp_path: Path
) -> None:
    """The other half of the A-3 decision: an uncounted grant is given back and the acquire waits on, so a waiter
    paused past presence_ttl while nobody of the conflicting phase started still ends up holding the lock."""
    name = "a3:alone"
    holder = lockers(config("old"))
    held = holder.lock(name, ttl=10)
    held.acquire()
    observer = lockers(config("both")).migrations()["main"]
    plain_old = lockers(pair.old)
    out = tmp_path / "a3-alone.json"
    child = multiprocessing.get_context("spawn").Process(
        target=_wait_for_lock, args=(str(config("old")), name, str(out))
    )
    child.start()
    assert child.pid is not None
    try:
        _eventually(lambda: (plain_old.holder(name).waiters or 0) >= 1, 60, "the 'old' child waits for the lock")
        os.kill(child.pid, signal.SIGSTOP)
        try:
            _eventually(
                lambda: str(child.pid) not in _pids(observer.fleet()), 30, "the paused child's presence expired"
            )
            held.release()
        finally:
            os.kill(child.pid, signal.SIGCONT)
        _eventually(out.exists, 30, "the resumed child's acquire returned")
        result = json.loads(out.read_text())
        assert result["acquired"] and result["valid"], result
    finally:
        child.join(30)
        if child.is_alive():
            child.kill()
            child.join(5)


def test_A3_renewal_after_fence_off_is_refused(pair: Pair, config: Callable[..., Path], lockers: Any) -> None:
    """A lease reported lost by a fence-off is never renewed again, even once the fence-off is over."""
    new = lockers(config("new"))
    lost = []
    lock = new.lock("a3:renew", ttl=20, auto_renew=False, on_lost=lambda lease: lost.append(lease.lost_reason))
    lease = lock.acquire()
    released: list[bool] = []

    def release_on_loss(_lease: lockkit.Lease) -> None:  # an on_lost that locks must not deadlock the fence-off
        with contextlib.suppress(LockError):
            other.release()
        released.append(True)

    other = new.lock("a3:renew-other", ttl=20, on_lost=release_on_loss)
    other.acquire()
    driver = new.migrations()["main"]
    # A racing 'old' client's record, written through the old backend's own presence API: the 'new' client's
    # next presence check sees it and fences itself off.
    rival = lockers(pair.old).backend_for("x").driver
    group, record = "lockkit-migrate:main", json.dumps({"phase": "old", "host": "rival", "pid": 1})
    rival.announce(group, "rival", record, 30)
    _eventually(lambda: bool(lost) and bool(released), 15, "the fence-off reported the held leases lost")
    rival.withdraw(group, "rival")
    _eventually(lambda: _can_lock(new, "a3:other"), 15, "the fence-off is over")
    left_before = lockers(pair.new).holder("a3:renew").ttl_left
    with pytest.raises(LockLost):
        driver.renew("a3:renew", lease.token, 20)
    left_after = lockers(pair.new).holder("a3:renew").ttl_left
    assert left_before is not None and left_after is not None and left_after <= left_before, "the server was renewed"
    assert "migration 'main': migration" not in (lost[0] or ""), lost


# -- a client started with a stale phase ---------------------------------------------------------------------

_STALE_CLIENT = """
import sys, time, lockkit
locker = lockkit.from_config(sys.argv[1])
with open(sys.argv[2], "w") as out:
    for i in range(3):
        try:
            locker.lock("a4:stale").try_acquire()
            out.write("ACQUIRED\\n")
        except lockkit.LockError as exc:
            kind = "ConfigError" if isinstance(exc, lockkit.ConfigError) else type(exc).__name__
            out.write(f"{kind}: {exc}".replace("\\n", " ") + "\\n")
        out.flush()
        time.sleep(0.2)
    out.write("DONE\\n")
time.sleep(120)  # stays alive (its presence, had it written one, would stay live) until the test ends it
"""


def test_A4_refused_stale_client_leaves_no_presence_record(
    pair: Pair, config: Callable[..., Path], lockers: Any, tmp_path: Path
) -> None:
    new = lockers(config("new"))
    held = new.lock("a4:held", ttl=3).acquire()  # auto-renewed: the fleet is on 'new' and working
    observer = lockers(config("both")).migrations()["main"]
    out = tmp_path / "a4-stale.txt"
    stale = subprocess.Popen([sys.executable, "-c", _STALE_CLIENT, str(config("old")), str(out)])
    try:
        _eventually(lambda: out.exists() and "DONE" in out.read_text(), 60, "the stale client tried three times")
        messages = out.read_text().splitlines()[:-1]
        assert len(messages) == 3 and "ACQUIRED" not in messages, messages
        assert str(stale.pid) not in _pids(observer.fleet()), "the refused client left a presence record"
        # The rest of the fleet keeps working, across several of its own presence checks (every ttl/3).
        other = lockers(config("new"))
        assert other.lock("a4:other").try_acquire() is not None, "a correct 'new' client was refused"
        time.sleep(1.5)
        assert held.valid, f"the 'new' holder lost its lock: {held.lost_reason}"
        assert new.lock("a4:more").try_acquire() is not None, "the 'new' client was fenced off by the stale one"
        assert str(stale.pid) not in _pids(observer.fleet())
        for message in messages:
            assert message.startswith("ConfigError: migration 'main': "), message
            assert "migration 'main': migration" not in message, message
            assert f"{HOST}:{os.getpid()} (phase 'new')" in message, message  # names the conflicting member
            assert "stop this instance" in message, message  # the right next step for a stale instance
            assert "finish rolling every instance to 'both'" not in message, message
    finally:
        stale.terminate()
        stale.wait(30)


# -- a release whose new-backend half raises (issue 12's suspicion) ---------------------------------------------


def test_release_frees_old_backend_even_when_new_backend_release_raises(
    pair: Pair, config: Callable[..., Path], lockers: Any
) -> None:
    both = lockers(config("both", presence_ttl=30))
    lock = both.lock("rel:x", ttl=30)
    lock.acquire()
    plain_old = lockers(pair.old)
    assert plain_old.holder("rel:x").held
    pair.off("new")
    with pytest.raises(LockError):
        lock.release()  # the new backend's half cannot be released: that must be reported...
    assert not plain_old.holder("rel:x").held, "the old backend's lock was left held until its TTL"  # ...and only it


# -- the end of a migration: a plain backend with fencing_epoch ---------------------------------------------------


def _end_toml(pair: Pair, epoch: str = "fencing_epoch = 1\n") -> str:
    return f'default = "new"\n[backends.new]\nurl = "{pair.new}"\n{epoch}'


def test_end_of_migration_fencing_epoch_backend_outlives_the_old_server(
    pair: Pair, config: Callable[..., Path], lockers: Any, tmp_path: Path
) -> None:
    store = FencedStore(tmp_path / "resource.db")
    tokens: list[int] = []

    def fenced_writes(locker: lockkit.Locker) -> list[bool]:
        accepted = []
        for _ in range(2):
            with locker.lock("end:resource", ttl=5) as lease:
                tokens.append(lease.fencing_token)
                accepted.append(store.write(len(tokens), lease.fencing_token, lease.token))
        return accepted

    for phase in ("old", "both", "new"):
        locker = lockers(config(phase))
        assert fenced_writes(locker) == [True, True], phase
        if phase != "new":
            locker.close()
    assert tokens[-1] >= 1 << EPOCH_SHIFT
    highest = max(tokens)

    # What `lockkit migrate status` says with only 'new' clients alive, and what the runbook says, agree.
    shown = subprocess.run(
        [sys.executable, "-m", "lockkit.cli", "migrate", "status", "--config", str(config("new"))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    assert "fencing_epoch = 1" in shown.stdout and "drop the migrate backend" in shown.stdout, shown.stdout
    runbook = (Path(__file__).parent.parent / "docs" / "migration.md").read_text()
    assert "fencing_epoch = 1" in runbook and 'keep `phase = "new"` instead' not in runbook

    # The last 'new' client goes; the old backend is switched off for good.
    locker.close()
    pair.off("old")

    end = tmp_path / "end.toml"
    end.write_text(_end_toml(pair))
    plain = lockers(end)
    before = len(tokens)
    assert fenced_writes(plain) == [True, True], "fenced writes under the plain backend were refused"
    assert all(t > highest for t in tokens[before:]), (tokens, highest)
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens), tokens
    assert plain.holder("end:resource").fencing_token in (None, tokens[-1])

    # Canary: the same backend without the option hands out tokens the storage (rightly) refuses.
    bare = tmp_path / "bare.toml"
    bare.write_text(_end_toml(pair, ""))
    with lockers(bare).lock("end:resource", ttl=5) as lease:
        assert lease.fencing_token < highest
        assert not store.write(0, lease.fencing_token, lease.token)


def test_fencing_epoch_tokens_on_both_faces(tmp_path: Path, redis_server: Any) -> None:
    prefix = f"fe{uuid.uuid4().hex[:6]}:"
    for url in (
        f"{(tmp_path / 'locks').as_uri()}?fencing_epoch=3",
        f"{redis_server.url}?prefix={prefix}&fencing_epoch=3",
    ):
        with lockkit.connect(url) as locks, locks.lock("fe:x") as lease:
            assert lease.fencing_token >> EPOCH_SHIFT == 3 and lease.fencing_token & ((1 << EPOCH_SHIFT) - 1) > 0
            assert locks.holder("fe:x").fencing_token == lease.fencing_token

        async def run(url: str) -> int:
            async with lockkit.connect_async(url) as locks, locks.lock("fe:y") as lease:
                assert (await locks.holder("fe:y")).fencing_token == lease.fencing_token
                return lease.fencing_token

        assert asyncio.run(run(url)) >> EPOCH_SHIFT == 3


@pytest.mark.parametrize("value", ['"one"', "-1", "1.5", "32768", "true", '""'])
def test_fencing_epoch_config_errors_name_the_key(tmp_path: Path, value: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(f'[backends.main]\nurl = "{(tmp_path / "l").as_uri()}"\nfencing_epoch = {value}\n')
    with pytest.raises(ConfigError, match=r"\[backends\.main\] fencing_epoch"):
        lockkit.from_config(path)
    raw = value.strip('"')
    with pytest.raises(ConfigError, match="fencing_epoch"):
        lockkit.connect(f"{(tmp_path / 'l').as_uri()}?fencing_epoch={raw}")


def test_fencing_epoch_needs_fencing_and_no_migration(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"fencing_epoch.*no fencing tokens"):
        lockkit.connect("redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3/0?fencing_epoch=1")
    path = tmp_path / "mix.toml"
    old, new = (tmp_path / "o").as_uri(), (tmp_path / "n").as_uri()
    path.write_text(
        f'default = "main"\n[backends.old]\nurl = "{old}"\n[backends.new]\nurl = "{new}"\nfencing_epoch = 1\n'
        '[backends.main]\nmigrate = { from = "old", to = "new", phase = "new" }\n'
    )
    with pytest.raises(ConfigError, match=r"migrate\.to = 'new'.*fencing_epoch"):
        lockkit.from_config(path)


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3/0", "no fencing tokens"),
        ("redis+sentinel://127.0.0.1:1,127.0.0.1:2/mymaster", "already carry an epoch of their own"),
        ("redis+cluster://127.0.0.1:1,127.0.0.1:2", "already carry an epoch of their own"),
    ],
)
def test_fencing_epoch_zero_is_refused_where_any_epoch_is(tmp_path: Path, url: str, why: str) -> None:
    """Setting the option is the mistake, whatever its value: 0 passed on the URL (a config file's key was refused)."""
    with pytest.raises(ConfigError, match=f"fencing_epoch.*{why}"):
        lockkit.connect(f"{url}?fencing_epoch=0")
    path = tmp_path / "zero.toml"
    path.write_text(f'[backends.main]\nurl = "{url}"\nfencing_epoch = 0\n')
    with pytest.raises(ConfigError, match=why):
        lockkit.from_config(path)


@pytest.mark.parametrize("scheme", ["redis+sentinel", "rediss+sentinel", "redis+cluster", "rediss+cluster"])
def test_fencing_epoch_is_refused_where_tokens_carry_their_own(tmp_path: Path, scheme: str) -> None:
    """Sentinel and Cluster lift their tokens by the master's config epoch: a second lift would overflow after the
    first failover (every grant then raised LockError). Refused at load, URL option or config key, before any
    connection (nothing listens on these ports)."""
    base = f"{scheme}://127.0.0.1:1,127.0.0.1:2/" + ("mymaster" if "sentinel" in scheme else "")
    with pytest.raises(ConfigError, match=r"fencing_epoch.*already carry an epoch of their own"):
        lockkit.connect(f"{base}?fencing_epoch=1")
    path = tmp_path / "ha.toml"
    path.write_text(f'[backends.main]\nurl = "{base}"\nfencing_epoch = 2\n')
    with pytest.raises(ConfigError, match="already carry an epoch of their own"):
        lockkit.from_config(path)


def test_leases_never_released_do_not_pile_up(tmp_path: Path, lockers: Callable[[Any], lockkit.Locker]) -> None:
    """Review finding: the migrate driver kept the token of every lease that was never released, forever."""
    from lockkit.drivers.migrate import PRUNE_AT, MigrateDriver

    pair = Pair((tmp_path / "old").as_uri(), (tmp_path / "new").as_uri(), lambda role: None)
    path = tmp_path / "lockkit.toml"
    path.write_text(_toml(pair, "new", 5.0))
    locker = lockers(path)
    for i in range(3 * PRUNE_AT):
        locker.lock(f"fire-and-forget-{i}", ttl=0.05, auto_renew=False).acquire(timeout=5)
    time.sleep(0.2)  # every one of them has ended
    locker.lock("one-more", ttl=5).acquire(timeout=5)
    driver = locker.migrations()["main"]
    assert isinstance(driver, MigrateDriver)
    assert len(driver._held) <= 2 * PRUNE_AT, len(driver._held)  # ended ones are dropped as acquires go by
