"""Errors that say what to do (issue 15): a refused login, a refused connection, etcd's raw gRPC statuses.

Every message is checked through the public API (``lockkit.connect(url)`` then ``acquire`` / ``check``) and
through the real CLI (``python -m lockkit.cli``), against real servers on loopback:

* a refused login is a ``ConfigError`` that names the user and never the password (ZooKeeper: a wrong
  password meets a digest ACL as ``NoAuth``, a server that refuses digest logins answers ``AUTH_FAILED``;
  etcd: a wrong password, a server without auth, a server with auth and no user in the URL);
* a refused connection is a ``BackendUnavailable`` that asks whether a server runs at host:port and whether
  the URL is right, with the password masked, promptly (ZooKeeper: about 2 s, not connect_timeout) and
  without kazoo's "Connection dropped" lines on stderr (they are at DEBUG on ``lockkit.kazoo``);
* etcd's ``UNAVAILABLE: failed to connect to all addresses`` and ``INVALID_ARGUMENT: user name is empty``
  never reach the user raw, and its permission hint names the real key prefix.

The CLI exits 2 for a ConfigError and 1 for BackendUnavailable (``status``, ``run``…); ``check`` reports each
backend's error on its FAIL line and exits 1 if any failed (docs/cli.md).
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import lockkit
from backends.servers import EtcdServer, ZooKeeperServer
from lockkit import BackendUnavailable, ConfigError, LockError

ROOT = Path(__file__).resolve().parents[1]
SECRET = "s3cr3t-XYZ"
WRONG = "wr0ng-PW-123"
RAW = ("UNAVAILABLE:", "INVALID_ARGUMENT:", "FAILED_PRECONDITION:", "PERMISSION_DENIED:")
SLACK = 1.5
"""Scheduling slack on two shared cores: liveness bounds, never speed claims."""
REFUSED_GRACE = 2.0
"""ZooKeeper: how long a first connection that every server refuses is retried (docs/backends/zookeeper.md)."""


def closed_port() -> int:
    """A loopback port nobody listens on (bound, then closed): connecting to it is refused at once."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "lockkit.cli", *args], capture_output=True, text=True, timeout=90, env=env
    )


def chain(exc: BaseException) -> str:
    """The message and repr of an error and of every error it was raised from."""
    parts: list[str] = []
    seen: BaseException | None = exc
    while seen is not None:
        parts += [str(seen), repr(seen)]
        seen = seen.__cause__ or seen.__context__
    return "\n".join(parts)


def no_secret(text: str) -> None:
    for secret in (SECRET, WRONG):
        assert secret not in text, text


def assert_clean(text: str) -> None:
    """No password, and none of etcd's raw gRPC status prefixes: what the user reads."""
    no_secret(text)
    for raw in RAW:
        assert raw not in text, text


def raised(call: object) -> tuple[float, LockError]:
    started = time.monotonic()
    try:
        call()  # type: ignore[operator]
    except LockError as exc:
        return time.monotonic() - started, exc
    raise AssertionError("no error raised")


# -- ZooKeeper: refused login ---------------------------------------------------------------------------


@pytest.fixture
def chroot() -> str:
    return f"/errors-{uuid.uuid4().hex[:8]}"


def test_zookeeper_wrong_or_missing_password_is_a_config_error_naming_the_user(
    zookeeper_server: ZooKeeperServer, chroot: str
) -> None:
    host = f"127.0.0.1:{zookeeper_server.port}"
    with lockkit.connect(f"zookeeper://app:{SECRET}@{host}{chroot}?session_timeout=2") as owner:
        lease = owner.lock("guarded", ttl=5).acquire(timeout=5)  # the chroot and its nodes now carry app's ACL
        with lockkit.connect(f"zookeeper://app:{WRONG}@{host}{chroot}") as intruder:
            took, exc = raised(lambda: intruder.lock("guarded", ttl=5).acquire(timeout=10))
            print(f"wrong password, acquire: {took:.2f} s: {exc!r}")
            assert isinstance(exc, ConfigError) and took < 3
            message = str(exc)
            assert "'app'" in message and host in message and "user:password" in message, message
            assert_clean(str(exc))
            no_secret(chain(exc))
            (checked,) = intruder.check().values()  # check reads lockkit's base node: refused as well
            assert isinstance(checked, ConfigError) and "'app'" in str(checked), checked
            assert_clean(str(checked))
            no_secret(chain(checked))
        with lockkit.connect(f"zookeeper://{host}{chroot}") as anonymous:
            _took, exc = raised(lambda: anonymous.lock("guarded", ttl=5).acquire(timeout=10))
            assert isinstance(exc, ConfigError), exc
            assert "without credentials" in str(exc) and "user:password@" in str(exc), exc
            assert_clean(str(exc))
            no_secret(chain(exc))
        assert lease.valid


@pytest.fixture(scope="module")
def zookeeper_refusing_digest() -> Iterator[ZooKeeperServer]:
    """A ZooKeeper whose digest authentication provider is off: it answers a digest login with AUTH_FAILED."""
    with ZooKeeperServer(extra_args=["-Dzookeeper.DigestAuthenticationProvider.enabled=false"]) as server:
        yield server


def test_zookeeper_auth_failed_at_connect_is_a_config_error_and_kazoo_stops_retrying(
    zookeeper_refusing_digest: ZooKeeperServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    host = f"127.0.0.1:{zookeeper_refusing_digest.port}"
    with lockkit.connect(f"zookeeper://app:{SECRET}@{host}/authfailed") as locks:
        took, exc = raised(lambda: locks.lock("x", ttl=5).acquire(timeout=10))
        print(f"AUTH_FAILED, acquire: {took:.2f} s: {exc!r}")
        assert isinstance(exc, ConfigError) and took < 3, exc
        assert "'app'" in str(exc) and host in str(exc) and "AUTH_FAILED" in str(exc), exc
        assert_clean(str(exc))
        no_secret(chain(exc))
        time.sleep(1.0)  # a session that restarted after AUTH_FAILED would fail again and again meanwhile
        (checked,) = locks.check().values()
        assert isinstance(checked, ConfigError) and "'app'" in str(checked), checked
    logged = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not [m for m in logged if "starting a new session" in m or "AUTH_FAILED" in m], logged
    assert_clean("\n".join(logged))


# -- ZooKeeper: refused connection ---------------------------------------------------------------------


def test_zookeeper_refused_connection_fails_promptly_and_names_host_port() -> None:
    port = closed_port()
    host = f"127.0.0.1:{port}"
    with lockkit.connect(f"zookeeper://app:{SECRET}@{host}/refused") as locks:  # connect_timeout: 10 s
        took, exc = raised(lambda: locks.lock("x", ttl=5).acquire(timeout=30))
        print(f"refused, acquire(timeout=30): {took:.2f} s: {exc}")
        assert isinstance(exc, BackendUnavailable), exc
        assert took <= REFUSED_GRACE + SLACK, "a refused first connection waited for connect_timeout"
        message = str(exc)
        assert f"is a zookeeper server running at {host}" in message.lower(), message
        assert "is the url right" in message.lower(), message
        assert f"zookeeper://app:***@{host}/refused" in message, message
        assert "refused" in message
        assert_clean(str(exc))
        no_secret(chain(exc))
        started = time.monotonic()
        (checked,) = locks.check().values()
        assert isinstance(checked, BackendUnavailable) and host in str(checked), checked
        assert time.monotonic() - started <= REFUSED_GRACE + SLACK
        took, exc = raised(locks.lock("x", ttl=5).try_acquire)  # try_acquire keeps its own 1 s bound
        assert isinstance(exc, BackendUnavailable) and took <= 1 + SLACK


def test_zookeeper_host_that_does_not_resolve_fails_promptly() -> None:
    with lockkit.connect("zookeeper://nosuchhost.invalid:2181") as locks:  # .invalid never resolves (RFC 6761)
        took, exc = raised(lambda: locks.lock("x", ttl=5).acquire(timeout=30))
        print(f"unresolvable host, acquire(timeout=30): {took:.2f} s: {exc}")
        assert isinstance(exc, BackendUnavailable), exc
        assert "cannot resolve nosuchhost.invalid" in str(exc) and "is the URL right" in str(exc), exc
        assert took <= REFUSED_GRACE + 2 * SLACK  # the resolver's own time included


def test_zookeeper_refused_connection_logs_kazoo_only_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    port = closed_port()
    caplog.set_level(logging.INFO)  # an application that logs INFO and up sees nothing of kazoo's retries
    with lockkit.connect(f"zookeeper://127.0.0.1:{port}?connect_timeout=1") as locks:
        raised(lambda: locks.lock("x", ttl=5).acquire(timeout=1))
    assert not [r for r in caplog.records if "Connection dropped" in r.getMessage()], caplog.text
    caplog.clear()
    caplog.set_level(logging.DEBUG, logger="lockkit")  # lockkit at DEBUG: kazoo's detail, under lockkit.kazoo
    with lockkit.connect(f"zookeeper://127.0.0.1:{port}?connect_timeout=1") as locks:
        raised(lambda: locks.lock("x", ttl=5).acquire(timeout=1))
    dropped = [r for r in caplog.records if "Connection dropped" in r.getMessage()]
    assert dropped and {r.name for r in dropped} == {"lockkit.kazoo"}, caplog.text
    assert {r.levelno for r in dropped} == {logging.DEBUG}


def test_zookeeper_debug_log_never_shows_the_password(
    zookeeper_server: ZooKeeperServer, chroot: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(1)  # everything, kazoo's own request dumps (BLATHER, level 5) included
    url = f"zookeeper://app:{SECRET}@127.0.0.1:{zookeeper_server.port}{chroot}"
    with lockkit.connect(url) as locks:
        lock = locks.lock("x", ttl=5)
        lock.acquire(timeout=5)
        lock.release()
    kazoo = [r.getMessage() for r in caplog.records if r.name == "lockkit.kazoo"]
    assert any("Auth" in m for m in kazoo), kazoo  # kazoo logs its auth request at DEBUG: shown, masked
    assert SECRET not in caplog.text


# -- ZooKeeper through the CLI ---------------------------------------------------------------------------


def test_cli_check_of_a_refused_zookeeper_is_one_line_without_kazoo_noise() -> None:
    port = closed_port()
    url = f"zookeeper://app:{SECRET}@127.0.0.1:{port}"
    started = time.monotonic()
    out = cli("check", "--url", url)
    took = time.monotonic() - started
    print(f"lockkit check, refused: {took:.2f} s\n{out.stdout}{out.stderr}")
    assert out.returncode == 1, out
    assert f"is a zookeeper server running at 127.0.0.1:{port}" in out.stdout.lower(), out.stdout
    assert "Connection dropped" not in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert_clean(out.stdout + out.stderr)
    assert took < 10, "the CLI waited for connect_timeout"  # process start and imports included
    verbose = cli("-v", "check", "--url", url)  # kazoo's detail is one flag away
    assert verbose.returncode == 1 and "Connection dropped" in verbose.stderr, verbose.stderr
    assert_clean(verbose.stdout + verbose.stderr)
    status = cli("status", "x", "--url", url)
    assert status.returncode == 1 and f"127.0.0.1:{port}" in status.stderr, status
    assert "Connection dropped" not in status.stderr and "Traceback" not in status.stderr


def test_cli_refused_zookeeper_login_exits_2_naming_the_user(zookeeper_server: ZooKeeperServer, chroot: str) -> None:
    host = f"127.0.0.1:{zookeeper_server.port}"
    with lockkit.connect(f"zookeeper://app:{SECRET}@{host}{chroot}") as owner:
        lease = owner.lock("job", ttl=5).acquire(timeout=5)
        wrong = f"zookeeper://app:{WRONG}@{host}{chroot}"
        status = cli("status", "job", "--url", wrong)
        assert status.returncode == 2, status
        assert "'app'" in status.stderr and "Traceback" not in status.stderr, status.stderr
        assert_clean(status.stdout + status.stderr)
        check = cli("check", "--url", wrong)
        assert check.returncode == 2 and "FAIL" in check.stdout and "'app'" in check.stdout, check  # fix the config
        assert_clean(check.stdout + check.stderr)
        assert lease.valid


# -- etcd: refused connection ----------------------------------------------------------------------------


def test_etcd_refused_connection_says_where_and_what_to_check() -> None:
    port = closed_port()
    host = f"127.0.0.1:{port}"
    with lockkit.connect(f"etcd://app:{SECRET}@{host}?timeout=1") as locks:
        _took, exc = raised(lambda: locks.lock("x", ttl=5).acquire(timeout=5))
        assert isinstance(exc, BackendUnavailable), exc
        message = str(exc)
        assert f"is an etcd server running at {host}" in message.lower(), message
        assert "is the url right" in message.lower(), message
        assert f"etcd://app:***@{host}" in message and "refused" in message.lower(), message
        assert_clean(message)
        (checked,) = locks.check().values()
        assert isinstance(checked, BackendUnavailable) and f"etcd server running at {host}" in str(checked).lower()
        assert_clean(str(checked))
    other = closed_port()
    with lockkit.connect(f"etcd://{host},127.0.0.1:{other}?timeout=1") as locks:
        (checked,) = locks.check().values()
        assert isinstance(checked, BackendUnavailable), checked
        assert host in str(checked) and f"127.0.0.1:{other}" in str(checked), checked
        assert_clean(str(checked))


def test_cli_check_of_a_refused_etcd() -> None:
    port = closed_port()
    out = cli("check", "--url", f"etcd://app:{SECRET}@127.0.0.1:{port}?timeout=1")
    assert out.returncode == 1, out
    assert f"is an etcd server running at 127.0.0.1:{port}" in out.stdout.lower(), out.stdout
    assert "Traceback" not in out.stderr
    assert_clean(out.stdout + out.stderr)


# -- etcd: logins ------------------------------------------------------------------------------------------


def _ctl(server: EtcdServer, *args: str, user: str | None = None) -> None:
    argv = ["etcdctl", *(["--user", user] if user else []), *args]
    subprocess.run(argv, env=server.etcdctl_env(), capture_output=True, text=True, check=True, timeout=15)


@pytest.fixture(scope="module")
def etcd_with_auth() -> Iterator[EtcdServer]:
    """etcd with auth on: ``lk`` may use ``/myapp/locks/``, ``nope`` only ``/other/``."""
    with EtcdServer() as server:
        for args in (
            ("user", "add", "root:rootpw", "--interactive=false"),
            ("role", "add", "root"),
            ("user", "grant-role", "root", "root"),
            ("role", "add", "locks"),
            ("role", "grant-permission", "--prefix=true", "locks", "readwrite", "/myapp/locks/"),
            ("user", "add", f"lk:{SECRET}", "--interactive=false"),
            ("user", "grant-role", "lk", "locks"),
            ("role", "add", "elsewhere"),
            ("role", "grant-permission", "--prefix=true", "elsewhere", "readwrite", "/other/"),
            ("user", "add", f"nope:{SECRET}", "--interactive=false"),
            ("user", "grant-role", "nope", "elsewhere"),
            ("auth", "enable"),
        ):
            _ctl(server, *args)
        yield server


def test_etcd_wrong_password_is_a_config_error_naming_the_user(etcd_with_auth: EtcdServer) -> None:
    host = f"127.0.0.1:{etcd_with_auth.port}"
    with lockkit.connect(f"etcd://lk:{WRONG}@{host}?prefix=/myapp/locks/") as locks:
        _took, exc = raised(lambda: locks.lock("x", ttl=5).acquire(timeout=5))
        assert isinstance(exc, ConfigError) and "'lk'" in str(exc) and host in str(exc), exc
        assert_clean(str(exc))
        no_secret(chain(exc))
        (checked,) = locks.check().values()
        assert isinstance(checked, ConfigError) and "'lk'" in str(checked)


def test_etcd_auth_without_a_user_says_to_put_one_in_the_url(etcd_with_auth: EtcdServer) -> None:
    host = f"127.0.0.1:{etcd_with_auth.port}"
    with lockkit.connect(f"etcd://{host}?prefix=/myapp/locks/") as locks:
        _took, exc = raised(lambda: locks.lock("x", ttl=5).acquire(timeout=5))
        assert isinstance(exc, ConfigError), exc
        assert "user:password@" in str(exc) and host in str(exc), exc
        assert_clean(str(exc))
        no_secret(chain(exc))
        (checked,) = locks.check().values()
        assert isinstance(checked, ConfigError) and "user:password@" in str(checked), checked
        assert_clean(str(checked))
    status = cli("status", "x", "--url", f"etcd://{host}")
    assert status.returncode == 2 and "user:password@" in status.stderr, status
    assert "Traceback" not in status.stderr
    assert_clean(status.stdout + status.stderr)


def test_etcd_permission_hint_names_the_real_prefix_and_user(etcd_with_auth: EtcdServer) -> None:
    host = f"127.0.0.1:{etcd_with_auth.port}"
    with lockkit.connect(f"etcd://lk:{SECRET}@{host}?prefix=/myapp/locks/") as allowed, allowed.lock("x", ttl=5):
        pass  # the role works on its prefix
    with lockkit.connect(f"etcd://nope:{SECRET}@{host}?prefix=/myapp/locks/") as denied:
        _took, exc = raised(lambda: denied.lock("x", ttl=5).acquire(timeout=5))
        assert isinstance(exc, BackendUnavailable), exc
        message = str(exc)
        assert "readwrite /myapp/locks/" in message and "PREFIX" not in message and "'nope'" in message, message
        assert "etcdctl role grant-permission --prefix=true" in message, message
        assert_clean(str(exc))
        no_secret(chain(exc))


def test_etcd_credentials_for_a_server_without_auth(etcd_server: EtcdServer) -> None:
    host = f"127.0.0.1:{etcd_server.port}"
    with lockkit.connect(f"etcd://lk:{SECRET}@{host}") as locks:
        _took, exc = raised(lambda: locks.lock("x", ttl=5).acquire(timeout=5))
        assert isinstance(exc, ConfigError), exc
        message = str(exc)
        assert "'lk'" in message and "authentication is not enabled" in message and host in message, message
        assert_clean(str(exc))
        no_secret(chain(exc))
    status = cli("status", "x", "--url", f"etcd://lk:{SECRET}@{host}")
    assert status.returncode == 2 and "'lk'" in status.stderr, status
    assert_clean(status.stdout + status.stderr)
