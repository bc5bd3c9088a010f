"""Every figure ``lockkit verify`` reports can fail: each is shown non-zero on a planted bug.

The broken drivers of :mod:`lockkit.testing._broken` are registered for these tests only, through the
ordinary ``lockkit.drivers`` entry-point group: a ``.dist-info`` directory on ``PYTHONPATH``, which the
``lockkit verify`` subprocess and its spawned workers inherit. Runs are short (a few seconds, no faults
unless the check needs them) and never assert speed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lockkit.cli import verify
from lockkit.testing._broken import SameTokenFencedStore, entry_points_txt

VERIFY = [sys.executable, "-m", "lockkit.cli", "verify"]


@pytest.fixture
def broken_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Register the broken schemes for this test's subprocesses (and this process), nowhere else."""
    site = tmp_path / "site"
    info = site / "lockkit_test_broken_drivers-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: lockkit-test-broken-drivers\nVersion: 0\n")
    (info / "entry_points.txt").write_text(entry_points_txt())
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    monkeypatch.setenv("PYTHONPATH", path)  # spawned verify workers inherit it
    monkeypatch.syspath_prepend(str(site))  # for verify.run() called in this process
    return dict(os.environ)


def _verify(env: dict[str, str], url: str, *extra: str) -> tuple[int, dict[str, Any], str]:
    done = subprocess.run(
        [*VERIFY, "--json", "--url", url, "--processes", "3", "--duration", "3", "--ttl", "1", *extra],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.stdout, done.stderr[-3000:]
    return done.returncode, json.loads(done.stdout), done.stderr


def test_frozen_fencing_tokens_are_reported_as_shared(broken_env: dict[str, str], tmp_path: Path) -> None:
    code, report, _ = _verify(broken_env, f"frozenfile://{tmp_path}/locks")
    assert report["shared_fencing_tokens"] > 0, report
    assert code == 1 and not report["ok"], report


def test_frozen_fencing_tokens_fail_the_table(broken_env: dict[str, str], tmp_path: Path) -> None:
    done = subprocess.run(
        [*VERIFY, "--url", f"frozenfile://{tmp_path}/locks", "--processes", "2", "--duration", "2", "--ttl", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        env=broken_env,
    )
    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    assert "RESULT: VIOLATIONS FOUND" in done.stdout and "RESULT: ok" not in done.stdout


def test_backwards_fencing_tokens_are_reported(broken_env: dict[str, str], tmp_path: Path) -> None:
    code, report, _ = _verify(broken_env, f"backwardsfile://{tmp_path}/locks")
    assert report["fencing_backwards"] > 0, report
    assert code == 1 and not report["ok"], report


def test_frozen_tokens_under_kills_and_pauses_are_not_ok(broken_env: dict[str, str], tmp_path: Path) -> None:
    # The run of issue 20: file:// tokens frozen at 1 with --faults kill,pause printed "RESULT: ok".
    code, report, _ = _verify(broken_env, f"frozenfile://{tmp_path}/locks", "--duration", "4", "--faults", "kill,pause")
    assert report["kills"] + report["pauses"] >= 1, report
    assert report["shared_fencing_tokens"] > 0 and code == 1 and not report["ok"], report


def test_a_lock_that_does_not_exclude_is_caught(broken_env: dict[str, str], tmp_path: Path) -> None:
    code, report, _ = _verify(broken_env, f"sharedfile://{tmp_path}/locks")
    assert report["overlaps"] > 0, report
    assert code == 1 and not report["ok"], report


def test_lost_updates_are_reported_when_the_store_lets_a_shared_token_through(
    broken_env: dict[str, str], tmp_path: Path
) -> None:
    # With the store's own rule broken (a different lease with the current token is accepted: the
    # fencing_store.py mutant of issue 20) and a lock that neither excludes nor fences, two holders
    # read the same counter and both increments are acknowledged: only the counter can tell.
    report = verify.run(f"frozensharedfile://{tmp_path}/locks", 3, 3.0, [], ttl=1.0, store_class=SameTokenFencedStore)
    assert report.lost_updates > 0, report
    assert not report.ok


def test_lost_updates_are_reported_on_a_backend_without_fencing(broken_env: dict[str, str], tmp_path: Path) -> None:
    # Without fencing tokens the store cannot refuse anyone, so the counter measures exclusion directly.
    code, report, _ = _verify(broken_env, f"nofencesharedfile://{tmp_path}/locks")
    assert report["lost_updates"] > 0, report
    assert report["fencing_backwards"] is None and report["shared_fencing_tokens"] is None, report
    assert code == 1 and not report["ok"], report


def test_a_correct_lock_without_fencing_passes(broken_env: dict[str, str], tmp_path: Path) -> None:
    # The contrast to the test above (a Redlock-like backend): its tokens are all 0 by contract, which is
    # neither "shared" nor "backwards", and every holder's increment lands.
    code, report, _ = _verify(broken_env, f"nofencefile://{tmp_path}/locks", "--duration", "4", "--faults", "kill")
    assert code == 0 and report["ok"], report
    assert report["lost_updates"] == 0 and report["stale_writes_rejected"] == 0, report
    assert report["acquisitions"] > 10, report
