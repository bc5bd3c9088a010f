"""`lockkit check`, `status`, `verify` and `bench` against real HA Redis: redis+sentinel:// and redis+cluster://.

Issue 14 asks that the shell commands work with both schemes; each is run as a user would, in a subprocess,
against the session's Sentinel set and cluster. Short runs: the figures are not judged, only that each command
does its job and says so.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from backends.servers import RedisCluster, SentinelSet

LOCKKIT = [sys.executable, "-m", "lockkit.cli"]


@pytest.fixture(params=["sentinel", "cluster"])
def ha_url(request: pytest.FixtureRequest) -> str:
    if request.param == "sentinel":
        group: SentinelSet = request.getfixturevalue("sentinel_set")
        return group.url
    cluster: RedisCluster = request.getfixturevalue("redis_cluster")
    return cluster.url


def _lockkit(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LOCKKIT, "--url", url, *args], capture_output=True, text=True, timeout=180)


def test_check_and_status(ha_url: str) -> None:
    check = _lockkit(ha_url, "check")
    assert check.returncode == 0 and check.stdout.startswith("ok"), check
    status = _lockkit(ha_url, "status", "cli-ha-job")
    assert status.returncode == 0 and "cli-ha-job: free" in status.stdout, status


def test_verify_with_kills(ha_url: str) -> None:
    done = _lockkit(ha_url, "verify", "--json", "--processes", "3", "--duration", "3", "--ttl", "1", "--faults", "kill")
    report = json.loads(done.stdout)
    assert done.returncode == 0 and report["ok"], report
    assert report["acquisitions"] > 0 and report["kills"] >= 1, report


def test_bench(ha_url: str) -> None:
    args = ["--json", "--rounds", "20", "--processes", "2", "--seconds", "1", "--renew-locks", "10"]
    done = _lockkit(ha_url, "bench", *args, "--renew-seconds", "1")
    assert done.returncode == 0, done.stderr[-2000:]
    (result,) = json.loads(done.stdout)
    assert result["uncontended_ms_p50"] > 0 and result["renewal_all_held"], result
    assert result["contention_error"] is None and result["handoffs_per_s"], result
