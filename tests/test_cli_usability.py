"""The lockkit command as a new user meets it (issue 15): options before the subcommand, Ctrl-C, forced release
audit line, status on a session-bound backend. Run as real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import lockkit
from backends.servers import ZooKeeperServer

LOCKKIT = [sys.executable, "-m", "lockkit.cli"]


def _run(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LOCKKIT, *args], capture_output=True, text=True, timeout=60, env=env, cwd=cwd)


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "conf.toml"
    path.write_text(f'[backends.files]\nurl = "{(tmp_path / "locks").as_uri()}"\n')
    return path


def test_config_and_url_are_accepted_before_the_subcommand(config: Path, tmp_path: Path) -> None:
    before = _run("--config", str(config), "status", "job")
    assert before.returncode == 0, before.stderr
    assert "job: free on backend 'files'" in before.stdout
    url = (tmp_path / "other").as_uri()
    assert _run("--url", url, "status", "job").returncode == 0
    assert _run("--config", str(config), "status", "job", "--config", str(config)).returncode == 0  # same twice
    clash = _run("--config", str(config), "status", "job", "--config", str(tmp_path / "x.toml"))
    assert clash.returncode == 2 and "given twice" in clash.stderr
    assert _run("--config", str(config), "verify").returncode == 2  # verify has no --config: said, not ignored


def _wait_for_a_waiter(locks: lockkit.Locker, name: str, child: subprocess.Popen[str]) -> None:
    """Until the child has registered as a waiter on ``name`` (it blocks in acquire from then on)."""
    deadline = time.monotonic() + 30
    while not locks.holder(name).waiters:
        assert child.poll() is None, f"lockkit run exited early: {child.returncode}"
        assert time.monotonic() < deadline, "lockkit run never queued on the lock"
        time.sleep(0.02)


def _default_sigint() -> None:
    """In the child before exec: Ctrl-C's default action, whatever the test runner inherited. A run started in
    the background of a non-interactive shell (``cmd &``, ``nohup``) ignores SIGINT, and the ignore passes to
    every child, whose Python then installs no KeyboardInterrupt handler at all: the child waited for ever."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_while_waiting_exits_130_without_a_traceback(tmp_path: Path) -> None:
    url = (tmp_path / "locks").as_uri()
    with lockkit.connect(url) as locks, locks.lock("job", ttl=30):
        # -X faulthandler: should it hang, SIGABRT makes it print every thread's stack
        waiting = subprocess.Popen(
            [sys.executable, "-X", "faulthandler", *LOCKKIT[1:], "run", "job", "--url", url, "--", "true"],
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=_default_sigint,
        )
        try:
            _wait_for_a_waiter(locks, "job", waiting)
            waiting.send_signal(signal.SIGINT)
            try:
                _, err = waiting.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                waiting.send_signal(signal.SIGABRT)
                _, stacks = waiting.communicate(timeout=30)
                raise AssertionError(f"lockkit run did not exit on Ctrl-C; its threads:\n{stacks}") from None
        finally:
            waiting.kill()
    assert waiting.returncode == 130
    assert "Traceback" not in err
    assert "interrupted" in err


def test_force_release_names_the_user_once(tmp_path: Path) -> None:
    url = (tmp_path / "locks").as_uri()
    with lockkit.connect(url) as locks:
        locks.lock("job", ttl=30).acquire()
        env = {k: v for k, v in os.environ.items() if k not in ("USER", "LOGNAME", "LNAME", "USERNAME")}
        done = _run("release", "job", "--force", "--url", url, env=env)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "force-released" in line or "forced" in line]
    assert len(lines) == 1, done.stderr
    assert "force-released 'job'" in lines[0] and "it was held" in lines[0]
    assert not lines[0].startswith("lockkit: 0 ")  # a name (or "uid N"), not a bare uid


def test_status_on_zookeeper_says_why_there_is_no_time_left(zookeeper_server: ZooKeeperServer) -> None:
    url = zookeeper_server.url
    with lockkit.connect(url) as locks, locks.lock("cli:status", ttl=10):
        done = _run("status", "cli:status", "--url", url)
    assert done.returncode == 0, done.stderr
    assert "held on backend 'default'" in done.stdout
    assert "until its holder releases it or its session ends" in done.stdout
    assert "None" not in done.stdout


def test_a_url_given_in_code_is_not_prefixed_with_a_backend_name() -> None:
    with pytest.raises(lockkit.ConfigError) as caught:
        lockkit.connect("redis://localhost:6379/abc")
    assert not str(caught.value).startswith("<url>")
    assert "backend 'default'" not in str(caught.value)
