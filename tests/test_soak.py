"""K-1: the lost-update workload under random holder kills and pauses, on every driver.

Each driver runs ``lockkit verify`` (N processes, a fencing-checked store, overlap / lost-update / fencing
checkers) for ``LOCKKIT_SOAK_SECONDS`` (default 20 s in CI; set it to 600 for the nightly-length soak).
On a violation the JSON report is printed, so the failing history can be read from the test output.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SECONDS = float(os.environ.get("LOCKKIT_SOAK_SECONDS", "20"))
DRIVERS = ["file", "redis", "redlock", "cluster", "zookeeper", "etcd", "postgres"]


@pytest.fixture(params=DRIVERS)
def soak_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "file":
        return (tmp_path / "locks").as_uri()
    server = request.getfixturevalue(
        {
            "redis": "redis_server",
            "redlock": "redlock_servers",
            "sentinel": "sentinel_set",
            "cluster": "redis_cluster",
            "zookeeper": "zookeeper_server",
            "etcd": "etcd_server",
            "postgres": "postgres_server",
        }[request.param]
    )
    url: str = server.url
    if request.param == "zookeeper":
        url += "?session_timeout=2"  # the lock's lifetime: a killed holder's lock frees within it
    return url


@pytest.mark.timeout(SECONDS * 4 + 120)
def test_k1_soak_with_holder_kills_and_pauses(soak_url: str) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "lockkit.cli",
            "verify",
            "--json",
            "--url",
            soak_url,
            "--processes",
            "4",
            "--duration",
            str(SECONDS),
            "--faults",
            "kill,pause",
            "--ttl",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=SECONDS * 4 + 60,
    )
    assert done.stdout, done.stderr[-3000:]
    report = json.loads(done.stdout)
    print(json.dumps(report, indent=2))
    assert report["ok"], f"violations: {report}"
    assert report["acquisitions"] >= 10 and report["kills"] + report["pauses"] >= 1
