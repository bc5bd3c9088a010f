"""``lockkit verify`` catches a fake lock and passes a real one under holder kills and pauses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

VERIFY = [sys.executable, "-m", "lockkit.cli", "verify", "--json"]


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


def test_a_fake_lock_is_caught() -> None:
    # memory:// locks only within one process: across processes it is exactly the "fake lock" users fear.
    done = subprocess.run(
        [*VERIFY, "--url", "memory://fake", "--processes", "3", "--duration", "5"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    report = json.loads(done.stdout)
    assert done.returncode == 1 and not report["ok"]
    assert report["overlaps"] > 0
    assert report["stale_writes_rejected"] > 0, "fencing should refuse the fake lock's stale writes"
