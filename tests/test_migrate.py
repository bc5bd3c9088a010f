"""Migrating a fleet between backends (DESIGN §5, scenario M-1), on real processes.

The pair of backends is a fixture so the same tests run file:// → file:// (always) and
Redis → etcd (the headline migration) when those drivers are present.
"""

from __future__ import annotations

import itertools
import multiprocessing
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import lockkit
from lockkit import ConfigError, LockTimeout
from lockkit.drivers.migrate import EPOCH_SHIFT, next_step
from lockkit.testing._workers import increment_under_lock

Pair = tuple[str, str]


def _redis_has_presence() -> bool:
    try:
        from lockkit.drivers.redis import RedisDriver
    except Exception:  # the redis extra is not installed
        return False
    return hasattr(RedisDriver, "announce")


@pytest.fixture(
    params=[
        "file",
        pytest.param(
            "redis-etcd",
            marks=pytest.mark.skipif(not _redis_has_presence(), reason="RedisDriver keeps no presence records yet"),
        ),
    ]
)
def pair(request: pytest.FixtureRequest, tmp_path: Path) -> Pair:
    if request.param == "file":
        return (tmp_path / "old").as_uri(), (tmp_path / "new").as_uri()
    # the servers are shared by the whole session: a fresh key prefix per test keeps presence and epoch apart
    prefix = f"m{uuid.uuid4().hex[:8]}"
    redis, etcd = request.getfixturevalue("redis_server"), request.getfixturevalue("etcd_server")
    return f"{redis.url}?prefix={prefix}:", f"{etcd.url}?prefix=/{prefix}/"


def _toml(pair: Pair, phase: str, ttl: float = 3.0) -> str:
    old, new = pair
    return (
        'default = "main"\n'
        f'[backends.old]\nurl = "{old}"\n'
        f'[backends.new]\nurl = "{new}"\n'
        f'[backends.main]\nmigrate = {{ from = "old", to = "new", phase = "{phase}", presence_ttl = {ttl} }}\n'
    )


@pytest.fixture
def config(tmp_path: Path, pair: Pair) -> Callable[[str], Path]:
    def write(phase: str) -> Path:
        path = tmp_path / f"lockkit-{phase}.toml"
        path.write_text(_toml(pair, phase))
        return path

    return write


@pytest.fixture
def lockers() -> Iterator[Callable[[Path], lockkit.Locker]]:
    opened: list[lockkit.Locker] = []

    def open_(path: Path) -> lockkit.Locker:
        opened.append(lockkit.from_config(path))
        return opened[-1]

    yield open_
    for locker in opened:
        locker.close()


def test_both_holds_both_and_releases_in_reverse(config: Callable[[str], Path], lockers: Any) -> None:
    both = lockers(config("both"))
    with both.lock("m:1", ttl=5) as lease:
        assert both.holder("m:1", backend="old").held and both.holder("m:1", backend="new").held
        assert lease.backend == "main"
    assert not both.holder("m:1", backend="old").held and not both.holder("m:1", backend="new").held


def test_failed_second_acquire_leaves_nothing_half_held(config: Callable[[str], Path], lockers: Any) -> None:
    both = lockers(config("both"))
    blocker = both.lock("m:2", backend="new", ttl=5)
    blocker.acquire()
    with pytest.raises(LockTimeout):
        both.lock("m:2", ttl=5).acquire(timeout=0.3)
    assert not both.holder("m:2", backend="old").held, "the old backend's lock was left held"
    blocker.release()


def test_adjacent_phases_exclude_each_other(config: Callable[[str], Path], lockers: Any) -> None:
    for first, second in (("old", "both"), ("both", "new")):
        a, b = lockers(config(first)), lockers(config(second))
        with a.lock(f"m:adj:{first}", ttl=5):
            assert b.lock(f"m:adj:{first}").try_acquire() is None
        a.close()
        b.close()
        time.sleep(0.05)


def test_guard_refuses_old_and_new_at_once_canary(pair: Pair, config: Callable[[str], Path], lockers: Any) -> None:
    # Canary: without the guard, an 'old' client and a 'new' client share no backend and both "hold" the lock.
    with lockkit.connect(pair[0]) as old_only, lockkit.connect(pair[1]) as new_only:
        assert old_only.lock("m:canary").try_acquire() is not None
        assert new_only.lock("m:canary").try_acquire() is not None, "canary: plain backends overlap"
    old = lockers(config("old"))
    assert old.lock("m:guard").try_acquire() is not None  # announces phase 'old'
    new = lockers(config("new"))
    with pytest.raises(ConfigError, match=r"1 client\(s\) in phase 'old' are alive"):
        new.lock("m:guard").try_acquire()
    old.close()  # withdraws its presence
    assert new.lock("m:guard2").try_acquire() is not None
    old_again = lockers(config("old"))
    with pytest.raises(ConfigError, match="in phase 'new' are alive"):
        old_again.lock("m:guard3").try_acquire()


def test_an_old_client_after_the_epoch_switch_is_refused_until_the_record_is_deleted(
    config: Callable[[str], Path], lockers: Any, pair: Pair
) -> None:
    """docs/migration.md, step 3: an 'old' instance started after the first 'new' one refuses. It refused only
    while a 'new' client was alive: once that one exited, an 'old' client locked freely, with token 7 after
    281474976710660 had been issued (fencing backwards). Rolling back past the switch deletes the record."""
    new = lockers(config("new"))
    with new.lock("m:switch") as lease:  # the first 'new' client switches the epoch
        assert lease.fencing_token >= 1 << EPOCH_SHIFT
    new.close()  # withdraws its presence: no 'new' client is alive any more
    old = lockers(config("old"))
    with pytest.raises(ConfigError, match="switched the fencing epoch"):
        old.lock("m:switch").try_acquire()
    with lockkit.connect(pair[1]) as new_only:  # the rollback of docs/migration.md: delete the epoch record
        new_only.backend_for("m:switch").driver.withdraw("lockkit-migrate:main:epoch", "epoch")
    assert lockers(config("old")).lock("m:switch").try_acquire() is not None


def test_fencing_strictly_increases_across_a_full_roll(config: Callable[[str], Path], lockers: Any) -> None:
    tokens: list[int] = []
    for phase in ("old", "both", "new", "both", "new"):
        locker = lockers(config(phase))
        for _ in range(2):
            with locker.lock("m:fence", ttl=5) as lease:
                tokens.append(lease.fencing_token)
        locker.close()
    assert all(a < b for a, b in itertools.pairwise(tokens)), tokens
    assert tokens[0] < 1 << EPOCH_SHIFT <= tokens[-1]


def test_epoch_switch_is_seen_by_both_clients(config: Callable[[str], Path], lockers: Any) -> None:
    both = lockers(config("both"))
    with both.lock("m:epoch") as lease:
        assert lease.fencing_token < 1 << EPOCH_SHIFT  # no 'new' client yet: old backend's tokens
    new = lockers(config("new"))
    assert new.lock("m:other").try_acquire() is not None  # the first 'new' client switches the epoch
    with both.lock("m:epoch") as lease:
        assert lease.fencing_token >= 1 << EPOCH_SHIFT


def test_losing_one_backend_loses_the_lock(config: Callable[[str], Path], lockers: Any, pair: Pair) -> None:
    both = lockers(config("both"))
    lost = threading.Event()
    lease = both.lock("m:loss", ttl=0.9, on_lost=lambda _l: lost.set()).acquire()
    with lockkit.connect(pair[1]) as new_only:
        assert new_only.force_release("m:loss")
    assert lost.wait(lease.ttl + 2)
    assert not lease.valid


@pytest.mark.parametrize("phases", [("old", "both"), ("both", "new")])
def test_m1_processes_in_adjacent_phases_never_overlap(
    config: Callable[[str], Path], tmp_path: Path, phases: tuple[str, str]
) -> None:
    counter, log = tmp_path / "counter", tmp_path / "log"
    counter.write_text("0")
    log.write_text("")
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(target=_increment_with_config, args=(str(config(phases[i % 2])), str(counter), str(log)))
        for i in range(4)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(120)
    assert [p.exitcode for p in procs] == [0] * 4
    assert counter.read_text() == str(4 * 6), "lost updates across migration phases"
    spans = sorted(tuple(map(float, line.split()[:2])) for line in log.read_text().splitlines())
    assert all(b[0] >= a[1] for a, b in itertools.pairwise(spans)), "two holders overlapped"
    tokens = [
        int(t) for _, t in sorted((float(line.split()[0]), line.split()[2]) for line in log.read_text().splitlines())
    ]
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens), "fencing tokens went backwards"


def _increment_with_config(config: str, counter: str, log: str) -> None:
    import os

    os.environ["LOCKKIT_CONFIG"] = config
    increment_under_lock(None, "m:counter", counter, 6, log)


@pytest.mark.parametrize(
    ("body", "fragment"),
    [('phase = "sideways"', "expected old, both or new"), ('phaze = "both"', "unknown key 'phaze'")],
)
def test_migrate_config_errors(tmp_path: Path, pair: Pair, body: str, fragment: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(
        f'default = "main"\n[backends.old]\nurl = "{pair[0]}"\n[backends.new]\nurl = "{pair[1]}"\n'
        f'[backends.main]\nmigrate = {{ from = "old", to = "new", {body} }}\n'
    )
    with pytest.raises(ConfigError, match=fragment):
        lockkit.from_config(path)


def test_migrate_must_name_another_backend(tmp_path: Path) -> None:
    path = tmp_path / "self.toml"
    path.write_text('default = "main"\n[backends.main]\nmigrate = { from = "main", to = "x", phase = "old" }\n')
    with pytest.raises(ConfigError, match="must name another"):
        lockkit.from_config(path)


def test_migrate_status_command(config: Callable[[str], Path], lockers: Any) -> None:
    old = lockers(config("old"))
    assert old.lock("m:status").try_acquire() is not None
    shown = subprocess.run(
        [sys.executable, "-m", "lockkit.cli", "migrate", "status", "--config", str(config("both"))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    assert "old     1 live" in shown.stdout and "roll them to 'both'" in shown.stdout
    checked = subprocess.run(
        [sys.executable, "-m", "lockkit.cli", "migrate", "check", "--config", str(config("both"))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0 and checked.stdout.count("reachable") == 2


def test_next_step_advice() -> None:
    assert next_step({"a": {"phase": "old"}, "b": {"phase": "new"}}, False)[0] is False
    assert "roll them to 'both'" in next_step({"a": {"phase": "old"}, "b": {"phase": "both"}}, False)[1]
    assert "complete" in next_step({"a": {"phase": "new"}}, True)[1]
