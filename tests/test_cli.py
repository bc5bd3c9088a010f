"""The lockkit command, run as a real process against the embedded file:// backend."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from backends.pytest_fixtures import RedisFactory

LOCKKIT = [sys.executable, "-m", "lockkit.cli"]
SECRET = "s3cr3t-XYZ"


@pytest.fixture
def url(tmp_path: Path) -> str:
    return (tmp_path / "locks").as_uri()


def _wait_for(path: Path, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def _child(tmp_path: Path, body: str) -> list[str]:
    return [sys.executable, "-c", body]


def test_run_excludes_a_second_run_and_exports_the_fencing_token(url: str, tmp_path: Path) -> None:
    started, go, seen = tmp_path / "started", tmp_path / "go", tmp_path / "token"
    body = (
        "import os, pathlib, time\n"
        f"pathlib.Path({str(seen)!r}).write_text(os.environ['LOCKKIT_FENCING_TOKEN'])\n"
        f"pathlib.Path({str(started)!r}).touch()\n"
        f"while not pathlib.Path({str(go)!r}).exists(): time.sleep(0.02)\n"
        "raise SystemExit(3)\n"
    )
    first = subprocess.Popen([*LOCKKIT, "run", "job", "--url", url, "--ttl", "2", "--", *_child(tmp_path, body)])
    try:
        _wait_for(started)
        second = subprocess.run(
            [*LOCKKIT, "run", "job", "--url", url, "--timeout", "0.5", "--", "true"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode == 75, second.stderr
        assert "not free within 0.5" in second.stderr
        status = subprocess.run([*LOCKKIT, "status", "job", "--url", url], capture_output=True, text=True, timeout=60)
        assert "held" in status.stdout and "fencing token 1" in status.stdout
        go.touch()
        assert first.wait(60) == 3  # the child's own exit code
    finally:
        first.kill()
        first.wait()
    assert seen.read_text() == "1"
    third = subprocess.run(
        [
            *LOCKKIT,
            "run",
            "job",
            "--url",
            url,
            "--",
            sys.executable,
            "-c",
            "import os; print(os.environ['LOCKKIT_FENCING_TOKEN'])",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert third.returncode == 0 and third.stdout.strip() == "2"


def test_run_signals_the_child_when_the_lock_is_lost(url: str, tmp_path: Path) -> None:
    started, termed = tmp_path / "started", tmp_path / "termed"
    body = (
        "import pathlib, signal, sys, time\n"
        f"signal.signal(signal.SIGTERM, lambda *a: (pathlib.Path({str(termed)!r}).touch(), sys.exit(143)))\n"
        f"pathlib.Path({str(started)!r}).touch()\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen(
        [*LOCKKIT, "run", "job", "--url", url, "--ttl", "0.6", "--", *_child(tmp_path, body)],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(started)
        forced = subprocess.run(
            [*LOCKKIT, "release", "--force", "job", "--url", url], capture_output=True, text=True, timeout=60
        )
        assert forced.returncode == 0 and "released" in forced.stdout
        assert proc.wait(30) == 70
        assert termed.exists()
        assert proc.stderr is not None and "was lost" in proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


def test_release_needs_force(url: str) -> None:
    result = subprocess.run([*LOCKKIT, "release", "job", "--url", url], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "--force" in result.stderr


def test_check_masks_passwords_and_reports_failures(tmp_path: Path) -> None:
    ok = subprocess.run(
        [*LOCKKIT, "check", "--url", (tmp_path / "l").as_uri()], capture_output=True, text=True, timeout=60
    )
    assert ok.returncode == 0 and "round trip" in ok.stdout
    bad = subprocess.run(
        [*LOCKKIT, "check", "--url", f"nosuch://u:{SECRET}@h"], capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 2 and "unknown lock backend scheme" in bad.stderr
    assert SECRET not in bad.stdout + bad.stderr


def test_bad_usage_is_clear(url: str) -> None:
    result = subprocess.run([*LOCKKIT, "run", "job", "--url", url], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "after --" in result.stderr
    result = subprocess.run(
        [*LOCKKIT, "run", "", "--url", url, "--", "true"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2 and "must not be empty" in result.stderr
    for sub in ("run", "status", "release", "check", "demo"):
        shown = subprocess.run([*LOCKKIT, sub, "--help"], capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0 and "usage" in shown.stdout


def test_demo_shows_lost_updates_without_a_lock_only(tmp_path: Path) -> None:
    env = dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"))
    result = subprocess.run(
        [*LOCKKIT, "demo", "--workers", "4", "--deductions", "200"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: line.split() for line in result.stdout.splitlines() if line.startswith(("no ", "lockkit"))}
    assert rows["lockkit"][2] == "0" and rows["lockkit"][4] == "0"  # final stock 0, no lost update


def test_run_sigkills_a_child_that_ignores_sigterm_after_a_loss(url: str, tmp_path: Path) -> None:
    """docs/cli.md: SIGTERM on loss, SIGKILL 10 s later — also when the loss comes while lockkit waits."""
    started = tmp_path / "started"
    body = (
        "import pathlib, signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"pathlib.Path({str(started)!r}).touch()\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen(
        [*LOCKKIT, "run", "trap", "--url", url, "--ttl", "0.6", "--", *_child(tmp_path, body)],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(started)
        time.sleep(0.5)  # lockkit is inside its wait for the child now: the loss must wake it there
        forced = subprocess.run(
            [*LOCKKIT, "release", "--force", "trap", "--url", url], capture_output=True, text=True, timeout=60
        )
        assert forced.returncode == 0
        lost_at = time.monotonic()
        assert proc.wait(40) == 70  # before the fix: the child's full 60 s, or this timeout
        waited = time.monotonic() - lost_at
        assert 9.0 <= waited <= 25.0, f"SIGKILL came {waited:.1f} s after the loss (10 s grace promised)"
    finally:
        proc.kill()
        proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


def test_run_whose_release_finds_the_lock_gone_exits_70(url: str) -> None:
    """The command finished, but the lock had been taken from it by then: its end may have run unlocked."""
    force = f"{' '.join(LOCKKIT)} release --force job --url {url}"
    result = subprocess.run(
        [*LOCKKIT, "run", "job", "--url", url, "--", "sh", "-c", force], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 70, result.stderr
    assert "the command finished, but 'job' was no longer ours at release" in result.stderr


def test_run_whose_release_cannot_reach_the_backend_exits_1(fresh_redis: RedisFactory) -> None:
    """docs/cli.md's exit codes: the command ran under the lock and the backend then stopped answering, so
    whether the release took is unknown: that is "the backend could not be reached" (1), not a lost lock (70,
    which this exited with before)."""
    server = fresh_redis()
    url = f"{server.url}?timeout=0.5"
    try:
        result = subprocess.run(
            [*LOCKKIT, "run", "job", "--url", url, "--", "sh", "-c", f"kill -STOP {server.pid}"],  # the server freezes
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        server.resume()
    assert result.returncode == 1, result.stderr
    assert "exited with code 0 under the lock, but the release could not reach the backend" in result.stderr
