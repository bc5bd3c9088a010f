"""A lease from a driver that declares no fencing hands out no number that passes fencing checks (issue 15)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import lockkit
from backends.servers import RedlockServers


def test_redlock_lease_has_no_fencing_token(redlock_servers: RedlockServers) -> None:
    with lockkit.connect(redlock_servers.url) as locks, locks.lock("nofence:1", ttl=5) as lease:
        assert not lease.fenced and lease.fence is None
        with pytest.raises(lockkit.ConfigError, match="hands out no fencing tokens") as caught:
            lease.fencing_token  # noqa: B018
        assert "require = [\"fencing\"]" in str(caught.value)
        assert "fencing_token=None" in repr(lease)


def test_fenced_backends_still_fence(tmp_path: Path) -> None:
    with lockkit.connect((tmp_path / "l").as_uri()) as locks, locks.lock("nofence:2", ttl=5) as lease:
        assert lease.fenced and lease.fence == lease.fencing_token >= 1


def test_lockkit_run_sets_no_token_on_redlock(redlock_servers: RedlockServers) -> None:
    script = "import os; print(repr(os.environ.get('LOCKKIT_FENCING_TOKEN')))"
    done = subprocess.run(
        [sys.executable, "-m", "lockkit.cli", "run", "nofence:3", "--url", redlock_servers.url, "--",
         sys.executable, "-c", script],
        capture_output=True, text=True, timeout=60, env={"LOCKKIT_FENCING_TOKEN": "99", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "None"  # neither a made-up 0 nor the inherited 99
