"""``lockkit verify`` passes a real lock under holder kills and pauses and refuses runs that could test
nothing; the fencing store keeps its rule and every attempt. Each figure failing on a planted bug:
tests/test_verify_can_fail.py.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from lockkit.cli.fencing_store import FencedStore

VERIFY = [sys.executable, "-m", "lockkit.cli", "verify", "--json"]
RUN: dict[str, Any] = {"capture_output": True, "text": True, "timeout": 120}


def test_a_real_lock_survives_kills_and_pauses(tmp_path: Path) -> None:
    url = (tmp_path / "locks").as_uri()
    done = subprocess.run(
        [*VERIFY, "--url", url, "--processes", "3", "--duration", "5", "--faults", "kill,pause", "--ttl", "0.8"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    report = json.loads(done.stdout)
    assert done.returncode == 0 and report["ok"], report
    assert report["acquisitions"] > 10 and report["overlaps"] == 0 and report["lost_updates"] == 0
    assert report["kills"] + report["pauses"] >= 1


def test_the_first_fault_comes_after_the_first_acquisition(tmp_path: Path) -> None:
    # Spawned workers take a while to import lockkit and connect: a kill drawn 0.5-1.5 x TTL after spawning
    # could hit a process that had never reached the lock, a fault test of nothing. Faults now wait for the
    # first critical section (within the room the run leaves), and the report says how many came before.
    url = (tmp_path / "locks").as_uri()
    # With a 0.1 s TTL the old controller's first kill came 50-150 ms after spawning, before any worker had
    # acquired (0 critical sections before it in 3 runs of 3).
    args = ["--url", url, "--processes", "3", "--duration", "2", "--ttl", "0.1", "--faults", "kill"]
    done = subprocess.run([*VERIFY, *args], **RUN)
    report = json.loads(done.stdout)
    assert done.returncode == 0 and report["ok"], report
    assert report["kills"] >= 1 and report["acquisitions_before_first_fault"] >= 1, report


def test_memory_is_refused_across_processes() -> None:
    # memory:// locks only the threads of one process and verify's workers are processes: the run could
    # only show that (issue 20: it printed ~945 overlaps and nothing else), so verify says so up front.
    done = subprocess.run([*VERIFY, "--url", "memory://fake", "--processes", "3", "--duration", "2"], **RUN)
    assert done.returncode == 2 and not done.stdout, done
    assert "memory://" in done.stderr and "one process" in done.stderr, done.stderr


def test_faults_need_a_duration_above_twice_the_ttl(tmp_path: Path) -> None:
    # A fault is injected only after up to 1.5 x TTL and leaves 2 x TTL for the takeover: a shorter run
    # injected none and still printed RESULT: ok. It is refused, naming the smallest duration that works.
    url = (tmp_path / "locks").as_uri()
    done = subprocess.run([*VERIFY, "--url", url, "--duration", "1", "--ttl", "0.5", "--faults", "kill"], **RUN)
    assert done.returncode == 2 and not done.stdout, done
    assert "--duration" in done.stderr and "more than 1 s" in done.stderr, done.stderr


def test_faults_just_above_twice_the_ttl_inject_one(tmp_path: Path) -> None:
    url = (tmp_path / "locks").as_uri()
    # 1 ms above the limit: the old controller only looked for room before its first fault and found none.
    args = ["--url", url, "--processes", "2", "--duration", "1.001", "--ttl", "0.5", "--faults", "pause"]
    done = subprocess.run([*VERIFY, *args], **RUN)
    report = json.loads(done.stdout)
    assert report["pauses"] >= 1, report
    assert done.returncode == 0 and report["ok"], report


def test_the_store_refuses_another_lease_with_the_current_token(tmp_path: Path) -> None:
    # The store's own rule (issue 20: the mutant accepting a different lease with the same token survived).
    store = FencedStore(tmp_path / "store.db")
    try:
        assert store.read(5, "lease-a") == 0
        assert store.write(1, 5, "lease-a", read=0)
        assert store.write(2, 5, "lease-a", read=1), "the holder may write twice under its token"
        assert store.read(5, "lease-b") is None, "another lease with the current token may not read"
        assert not store.write(3, 5, "lease-b", read=2), "another lease with the current token may not write"
        assert not store.write(3, 4, "lease-c", read=2), "an older token may not write"
        assert store.read(6, "lease-d") == 2
        assert not store.write(3, 5, "lease-a", read=2), "a fenced read by a newer token bars the older one"
        assert store.read() == 2
    finally:
        store.close()


def test_the_store_keeps_every_attempt(tmp_path: Path) -> None:
    store = FencedStore(tmp_path / "store.db")
    try:
        store.read(1, "lease-a")
        store.write(1, 1, "lease-a", read=0)
        store.read(1, "lease-b")
        store.write(7, None, "lease-c", read=1)  # unfenced: accepted whatever the token state
        history = store.history()
    finally:
        store.close()
    assert [(h.kind, h.lease, h.token, h.accepted, h.value_read, h.value_written) for h in history] == [
        ("read", "lease-a", 1, True, 0, None),
        ("write", "lease-a", 1, True, 0, 1),
        ("read", "lease-b", 1, False, 1, None),
        ("write", "lease-c", None, True, 1, 7),
    ]
    assert all(a.at <= b.at for a, b in itertools.pairwise(history))
