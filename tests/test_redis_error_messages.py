"""Redis errors that say what to do (issue 15): a refused login is a ConfigError naming the user, never the
password, on redis:// and redlock://; a refused connection names host:port and asks whether a server runs."""

from __future__ import annotations

import socket
import subprocess
import sys
import uuid

import pytest
import redis

import lockkit
from backends.pytest_fixtures import RedisFactory
from backends.servers import RedlockServers

SECRET = "pw-" + uuid.uuid4().hex[:8]
WRONG = "wrong-" + uuid.uuid4().hex[:8]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _chain(exc: BaseException | None) -> str:
    text = ""
    while exc is not None:
        text += repr(exc) + str(exc)
        exc = exc.__cause__ or exc.__context__
    return text


def test_wrong_password_is_a_config_error_naming_the_user(fresh_redis: RedisFactory) -> None:
    server = fresh_redis()
    redis.Redis(port=server.port).execute_command("ACL", "SETUSER", "app", "on", f">{SECRET}", "~*", "&*", "+@all")
    url = f"redis://app:{WRONG}@127.0.0.1:{server.port}/0"
    with lockkit.connect(url) as locks:
        with pytest.raises(lockkit.ConfigError) as caught:
            locks.lock("x", ttl=5).acquire(timeout=2)
        message = str(caught.value)
        assert "'app'" in message and f"127.0.0.1:{server.port}" in message and "URL" in message
        assert WRONG not in _chain(caught.value) and SECRET not in _chain(caught.value)
        (checked,) = locks.check().values()
        assert isinstance(checked, lockkit.ConfigError)
    done = subprocess.run(
        [sys.executable, "-m", "lockkit.cli", "check", "--url", url], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done
    assert "'app'" in done.stdout and WRONG not in done.stdout + done.stderr


def test_redlock_wrong_password_everywhere_is_a_config_error(redlock_servers: RedlockServers) -> None:
    for server in redlock_servers:
        redis.Redis(port=server.port).execute_command(
            "ACL", "SETUSER", "lk", "on", f">{SECRET}", "~*", "&*", "+@all"
        )
    hosts = ",".join(f"127.0.0.1:{s.port}" for s in redlock_servers)
    locks = lockkit.connect(f"redlock://lk:{WRONG}@{hosts}/0")
    with locks, pytest.raises(lockkit.ConfigError) as caught:
        locks.lock("x", ttl=5).acquire(timeout=2)
    assert "refused the login" in str(caught.value) and "'lk'" in str(caught.value)
    assert WRONG not in _chain(caught.value)
    with lockkit.connect(f"redlock://lk:{SECRET}@{hosts}/0") as locks, locks.lock("x", ttl=5):
        pass  # the right password works on the same masters


def test_refused_connection_says_where_and_what_to_check() -> None:
    port = _free_port()
    locks = lockkit.connect(f"redis://app:{SECRET}@127.0.0.1:{port}/0?connect_timeout=1")
    with locks, pytest.raises(lockkit.BackendUnavailable) as caught:
        locks.lock("x", ttl=5).acquire(timeout=1)
    message = str(caught.value)
    assert f"could not connect to redis at 127.0.0.1:{port}: connection refused" in message
    assert "Is a Redis server running" in message and SECRET not in _chain(caught.value)


def test_missing_unix_socket_says_so(tmp_path: object) -> None:
    locks = lockkit.connect(f"unix://{tmp_path}/nothing.sock?db=0")
    with locks, pytest.raises(lockkit.BackendUnavailable, match="no socket file there"):
        locks.lock("x", ttl=5).acquire(timeout=1)
