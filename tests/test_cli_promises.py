"""What docs/cli.md and README.md promise of the lockkit command, checked on real processes (a docs audit).

* ``lockkit verify`` can fail: a run that could not test (nothing listening, a bad TTL, workers that died,
  no acquisition at all) is ``RESULT: FAILED`` with a non-zero exit, never ``RESULT: ok``; bad configuration
  exits 2 before any worker starts.
* ``lockkit demo`` without ``--url`` runs on the embedded ``file://`` backend whatever ``LOCKKIT_URL`` or a
  ``./lockkit.toml`` say; ``--url memory://…`` is refused as ``verify`` refuses it; configuration errors are one
  line and exit 2, without a traceback.
* ``--url`` / ``--config`` given twice with different values are a usage error (exit 2), before and after the
  subcommand.
* ``lockkit status`` says "holder not a lockkit client" for a Redis key whose value is not a lockkit token.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis

from backends.servers import RedisServer, free_port

LOCKKIT = [sys.executable, "-m", "lockkit.cli"]
RUN: dict[str, Any] = {"capture_output": True, "text": True, "timeout": 120}


def _lockkit(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LOCKKIT, *args], env=env, cwd=cwd, **RUN)


def _one_line_error(done: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


# -- 1. lockkit verify must be able to fail -------------------------------------------------------------------


def test_verify_fails_when_nothing_listens() -> None:
    # Every worker died with BackendUnavailable, 0 acquisitions, and it printed RESULT: ok, exit 0.
    url = f"redis://127.0.0.1:{free_port()}/0"
    done = _lockkit("verify", "--url", url, "--processes", "2", "--duration", "2")
    assert done.returncode == 1, done
    assert "RESULT: ok" not in done.stdout, done.stdout
    assert "could not connect" in done.stderr, done.stderr
    _one_line_error(done)  # found before any worker started: the controller's message, not one per worker


@pytest.mark.parametrize("ttl", ["0", "-1", "nan"])
def test_verify_refuses_a_bad_ttl_before_any_worker_starts(tmp_path: Path, ttl: str) -> None:
    # Every worker raised ConfigError (a traceback each), then RESULT: ok, exit 0.
    done = _lockkit("verify", "--url", (tmp_path / "locks").as_uri(), "--duration", "2", "--ttl", ttl)
    assert done.returncode == 2 and not done.stdout, done
    assert "ttl" in done.stderr, done.stderr
    _one_line_error(done)


@pytest.mark.parametrize("duration", ["0", "-3"])
def test_verify_refuses_a_duration_that_tests_nothing(tmp_path: Path, duration: str) -> None:
    done = _lockkit("verify", "--url", (tmp_path / "locks").as_uri(), "--duration", duration)
    assert done.returncode == 2 and not done.stdout, done
    assert "--duration" in done.stderr, done.stderr
    _one_line_error(done)


def test_verify_refuses_a_bad_url_in_one_line() -> None:
    done = _lockkit("verify", "--url", "nosuch://127.0.0.1:1", "--duration", "2")
    assert done.returncode == 2 and not done.stdout, done
    _one_line_error(done)


def test_verify_fails_when_its_workers_die_mid_run(tmp_path: Path) -> None:
    # The server dies (SIGKILL) while the workers contend: they fail with BackendUnavailable. That is a run
    # that stopped testing, not a pass. Before: the survivors' acquisitions were counted and RESULT: ok, exit 0.
    server = RedisServer().start()
    try:
        proc = subprocess.Popen(
            [*LOCKKIT, "verify", "--json", "--url", server.url, "--processes", "2", "--duration", "6", "--ttl", "1"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stderr is not None
        header = proc.stderr.readline()  # printed once the controller's own check of the backend has passed
        assert header.startswith("lockkit verify: 2 processes"), header
        time.sleep(1.5)  # the workers spawn and contend (if still starting, they fail to connect: the same)
        server.kill()
        out, err = proc.communicate(timeout=120)
    finally:
        server.stop()
    assert proc.returncode == 1, (out, err)
    report = json.loads(out)
    assert not report["ok"] and report["workers_failed"] >= 1, report
    assert any("BackendUnavailable" in error for error in report["worker_errors"]), report
    assert report["failures"], report


def test_verify_fails_when_no_worker_acquired(tmp_path: Path) -> None:
    # A run too short for a spawned worker to reach the lock tested nothing: FAILED, not ok with 0 acquisitions.
    done = _lockkit("verify", "--url", (tmp_path / "locks").as_uri(), "--processes", "1", "--duration", "0.001")
    assert done.returncode == 1, done
    assert "RESULT: FAILED" in done.stdout and "no worker acquired" in done.stdout, done.stdout


# -- 2. lockkit demo runs on the embedded file:// backend ------------------------------------------------------


def _demo_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"), **extra)
    env.pop("LOCKKIT_CONFIG", None)
    return env


def test_demo_without_url_ignores_the_environment_and_lockkit_toml(tmp_path: Path) -> None:
    # With LOCKKIT_URL=memory://zz the locked run "found" lost updates (exit 1); with a ./lockkit.toml whose
    # route is a mistake its workers crashed with tracebacks. docs/cli.md: demo runs on the embedded file://.
    (tmp_path / "lockkit.toml").write_text(
        'default = "a"\n\n[backends.a]\nurl = "memory://a"\n\n[routes]\n"demo:" = "a"\n'  # a prefix, no wildcard
    )
    env = _demo_env(tmp_path, LOCKKIT_URL="memory://zz")
    done = _lockkit("demo", "--workers", "2", "--deductions", "200", env=env, cwd=tmp_path)
    assert done.returncode == 0, done
    assert "every sale was counted" in done.stdout and "embedded" in done.stdout, done.stdout
    assert "Traceback" not in done.stderr, done.stderr
    assert (tmp_path / "state" / "lockkit" / "locks").is_dir()  # the embedded backend's state directory


def test_demo_refuses_memory_as_verify_does(tmp_path: Path) -> None:
    done = _lockkit("demo", "--url", "memory://x", "--workers", "2", env=_demo_env(tmp_path))
    assert done.returncode == 2 and not done.stdout, done
    assert "one process" in done.stderr, done.stderr
    _one_line_error(done)


def test_demo_with_a_bad_url_is_one_line_and_exit_2(tmp_path: Path) -> None:
    # Before: every worker printed a ConfigError traceback, then "demo worker(s) failed", exit 1.
    done = _lockkit("demo", "--url", "nosuch://127.0.0.1:1", "--workers", "2", env=_demo_env(tmp_path))
    assert done.returncode == 2 and not done.stdout, done
    _one_line_error(done)


def test_demo_with_nothing_listening_exits_1_in_one_line(tmp_path: Path) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    done = _lockkit("demo", "--url", url, "--workers", "2", env=_demo_env(tmp_path))
    assert done.returncode == 1 and not done.stdout, done
    assert "could not connect" in done.stderr, done.stderr
    _one_line_error(done)


# -- 3. --url / --config twice with different values ------------------------------------------------------------


@pytest.mark.parametrize(
    "words",
    [
        ["--url", "memory://a", "--url", "file:///tmp/lockkit-x", "routes"],
        ["routes", "--url", "memory://a", "--url", "memory://b"],
        ["status", "job", "--url", "memory://a", "--url", "memory://b"],
        ["--config", "x.toml", "--config", "y.toml", "routes"],
        ["routes", "--config", "x.toml", "--config", "y.toml"],
        ["check", "--config", "x.toml", "--config", "y.toml"],
        ["verify", "--url", "memory://a", "--url", "memory://b"],
        ["demo", "--url", "memory://a", "--url", "memory://b"],
        ["bench", "--url", "memory://a", "--url=memory://b"],
    ],
)
def test_url_or_config_twice_with_different_values_is_a_usage_error(words: list[str], tmp_path: Path) -> None:
    done = _lockkit(*words, cwd=tmp_path)
    assert done.returncode == 2, done
    assert "twice" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr


def test_the_same_url_twice_is_accepted(tmp_path: Path) -> None:
    url = (tmp_path / "locks").as_uri()
    assert _lockkit("routes", "--url", url, "--url", url).returncode == 0
    assert _lockkit("--url", url, "--url", url, "routes", "--url", url).returncode == 0


# -- 4. status marks a holder that is not a lockkit client -----------------------------------------------------


def test_status_on_redis_marks_a_holder_that_is_not_a_lockkit_client(redis_server: RedisServer) -> None:
    # cli.md: "A holder that is not a lockkit client ... is shown as such". On Redis a key set by another
    # client showed as "holder token 9d469d9c…", as if a lockkit lease held it.
    name = f"promises:{os.getpid()}:{time.monotonic_ns()}"
    raw = redis.Redis(host="127.0.0.1", port=redis_server.port)
    try:
        raw.set(f"lockkit:{{{name}}}", "some-other-client", px=30_000)
        done = _lockkit("status", name, "--url", redis_server.url)
        assert done.returncode == 0, done
        assert "holder not a lockkit client" in done.stdout and "holder token" not in done.stdout, done.stdout
        assert "some-other-client" not in done.stdout  # its value is never printed
        shown = json.loads(_lockkit("status", name, "--url", redis_server.url, "--json").stdout)
        assert shown["held"] and "some-other-client" not in json.dumps(shown), shown
    finally:
        raw.delete(f"lockkit:{{{name}}}")
        raw.close()


def test_status_on_redis_still_shows_a_lockkit_holders_hint(redis_server: RedisServer) -> None:
    import lockkit
    from lockkit.lease import token_hint

    name = f"promises:{os.getpid()}:{time.monotonic_ns()}"
    with lockkit.connect(redis_server.url) as locks, locks.lock(name, ttl=30) as lease:
        done = _lockkit("status", name, "--url", redis_server.url)
        assert f"holder token {token_hint(lease.token)}…" in done.stdout, done.stdout


def test_a_hint_says_whether_the_token_is_of_lockkits_form() -> None:
    from lockkit.lease import is_lockkit_hint, token_hint
    from lockkit.lock import new_token

    token = new_token()
    assert token_hint(token) == hashlib.sha256(token.encode()).hexdigest()[:8]  # unchanged for lockkit's own
    assert is_lockkit_hint(token_hint(token))
    for other in ("some-other-client", token.upper(), token[:-1], token + "0", "", str(uuid.uuid4())):
        hint = token_hint(other)
        assert not is_lockkit_hint(hint) and hint.endswith(hashlib.sha256(other.encode()).hexdigest()[:8]), other
    assert not is_lockkit_hint(None)  # an empty value (etcdctl lock) gives no hint at all
