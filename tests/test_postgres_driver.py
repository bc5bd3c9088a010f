"""The postgresql:// driver's edges: URLs and options, secrets, errors that say what to do, what holder() shows."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
import traceback
import uuid
from urllib.parse import quote

import pytest

import lockkit
from backends.servers import PostgresServer
from lockkit import BackendUnavailable, ConfigError
from lockkit.drivers.postgres.keys import advisory_key, lock_parts
from lockkit.lease import token_hint

SECRET = "s3cr3t-PG"


def _chain(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))


def _name() -> str:
    return f"pd-{uuid.uuid4().hex[:10]}"


def test_key_mapping_is_the_documented_one() -> None:
    # docs/backends/postgres.md: the first 8 bytes of SHA-256(namespace 0x00 name), big-endian, signed.
    import hashlib

    digest = hashlib.sha256(b"lockkit\x00orders:42").digest()
    assert advisory_key("lockkit", "orders:42") == int.from_bytes(digest[:8], "big", signed=True)
    assert advisory_key("lockkit", "a") != advisory_key("other", "a")
    hi, lo = lock_parts(-1)
    assert (hi, lo) == (0xFFFF_FFFF, 0xFFFF_FFFF)


@pytest.mark.parametrize("scheme", ["postgresql", "postgres"])
def test_both_schemes_open_the_driver(postgres_server: PostgresServer, scheme: str) -> None:
    url = postgres_server.url.replace("postgresql://", f"{scheme}://")
    with lockkit.connect(url) as locks, locks.lock(_name(), ttl=5) as lease:
        assert lease.fenced
        (guarantees,) = locks.guarantees().values()
        assert guarantees.lifetime == "session" and guarantees.scope == "single-node"


def test_holder_shows_the_hint_fence_and_waiters(postgres_server: PostgresServer) -> None:
    name = _name()
    with lockkit.connect(postgres_server.url) as locks, lockkit.connect(postgres_server.url) as other:
        lease = locks.lock(name, ttl=5).acquire(timeout=5)
        info = other.holder(name)
        assert info.held and info.token_hint == token_hint(lease.token) and info.fencing_token == lease.fencing_token
        assert other.lock(name).try_acquire() is None

        def wait() -> None:
            with pytest.raises(lockkit.LockTimeout):
                other.lock(name).acquire(timeout=2)

        waiter = threading.Thread(target=wait)
        waiter.start()
        while other.holder(name).waiters == 0:
            time.sleep(0.01)
        assert other.holder(name).waiters == 1
        waiter.join(10)
        assert other.holder(name).waiters == 0, "a timed-out waiter is off the server's queue"
        assert locks.force_release(name) and not other.holder(name).held


@pytest.mark.parametrize(
    ("query", "match"),
    [
        ("tabel=x", "unknown option 'tabel'"),
        ("table=x;drop", "plain SQL identifier"),
        ("timeout=0", "timeout must be above 0"),
        ("max_sessions=1", "max_sessions must be between"),
        ("namespace=", "namespace must not be empty"),
    ],
)
def test_bad_options_are_refused(query: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        lockkit.connect(f"postgresql://app:{SECRET}@127.0.0.1:1/db?{query}")
    assert SECRET not in _chain(info.value)


def test_several_hosts_are_refused() -> None:
    with pytest.raises(ConfigError, match="one PostgreSQL server"):
        lockkit.connect("postgresql://127.0.0.1:1,127.0.0.1:2/db")


def test_unreachable_server_with_password(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    locks = lockkit.connect(f"postgresql://app:{SECRET}@127.0.0.1:1/db?timeout=1")  # no I/O yet
    try:
        assert SECRET not in repr(locks) and SECRET not in str(locks.describe())
        with pytest.raises(BackendUnavailable, match="Is the server running") as info:
            locks.lock(_name(), ttl=2).acquire(timeout=1)
        assert SECRET not in _chain(info.value)
    finally:
        locks.close()
    assert SECRET not in caplog.text


@pytest.mark.parametrize("char", list(":/?#@%& "))
def test_wrong_password_is_a_config_error_without_it(postgres_server: PostgresServer, char: str) -> None:
    secret = f"pa{char}ss-{SECRET}"
    url = f"postgresql://postgres:{quote(secret, safe='')}@{postgres_server.host}:{postgres_server.port}/postgres"
    with lockkit.connect(url) as locks, pytest.raises(ConfigError, match="refused the login") as info:
        locks.lock(_name(), ttl=2).acquire(timeout=2)
    assert SECRET not in _chain(info.value) and "postgres" in str(info.value)


def test_missing_psycopg_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['psycopg'] = None\n"
        "import lockkit\n"
        "try:\n    lockkit.connect('postgresql://127.0.0.1:1/db')\nexcept lockkit.ConfigError as exc:\n    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert "pip install" in out and "'lockkit[postgres]'" in out


def test_waiters_beyond_max_sessions_are_told_what_to_raise(postgres_server: PostgresServer) -> None:
    name = _name()
    few_url = postgres_server.url + "?max_sessions=2"
    with lockkit.connect(postgres_server.url) as holder, lockkit.connect(few_url) as few:
        holder.lock(name, ttl=10).acquire(timeout=5)
        errors: list[BaseException] = []

        def wait() -> None:
            try:
                few.lock(name, ttl=5).acquire(timeout=1.5)
            except lockkit.LockError as exc:
                errors.append(exc)

        threads = [threading.Thread(target=wait) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(20)
        assert any(isinstance(e, BackendUnavailable) and "max_sessions" in str(e) for e in errors), errors
        assert holder.force_release(name)


def test_sessions_left_by_a_burst_of_waiters_are_closed(postgres_server: PostgresServer) -> None:
    # Each blocked waiter needs a session of its own; once the burst is over, only a couple stay open.
    name, app = _name(), f"pd{uuid.uuid4().hex[:8]}"
    url = postgres_server.url + f"?application_name={app}"

    def sessions() -> int:
        return int(postgres_server.psql(f"SELECT count(*) FROM pg_stat_activity WHERE application_name = '{app}'"))

    with lockkit.connect(postgres_server.url) as holder, lockkit.connect(url) as waiters:
        holder.lock(name, ttl=10).acquire(timeout=5)

        def wait() -> None:
            with pytest.raises(lockkit.LockTimeout):
                waiters.lock(name, ttl=5).acquire(timeout=1.5)

        threads = [threading.Thread(target=wait) for _ in range(8)]
        for thread in threads:
            thread.start()
        peak = 0
        while any(thread.is_alive() for thread in threads):
            peak = max(peak, sessions())
            time.sleep(0.05)
        assert peak >= 8, "the waiters did not each wait on a session of their own"
        assert sessions() <= 3, "the burst's sessions stayed open"
        assert holder.force_release(name)


def test_blocking_wait_ended_by_cancel_leaves_nothing(postgres_server: PostgresServer) -> None:  # C-8
    # The blocking driver's waiter is ended from another thread by a Cancel (the server query is cancelled):
    # it returns None at once, and neither a lock nor a waiter is left on the server.
    from lockkit.driver import Cancel, DriverContext
    from lockkit.drivers.postgres.driver import PostgresDriver
    from lockkit.urls import parse_url

    name = _name()
    holder = PostgresDriver.from_url(parse_url(postgres_server.url), DriverContext())
    waiter = PostgresDriver.from_url(parse_url(postgres_server.url), DriverContext())
    try:
        assert holder.acquire(name, uuid.uuid4().hex, 5.0, None) is not None
        cancel = Cancel()
        got: list[object] = []
        thread = threading.Thread(target=lambda: got.append(waiter.acquire(name, uuid.uuid4().hex, 5.0, None, cancel)))
        thread.start()
        while holder.holder(name).waiters == 0:
            time.sleep(0.01)
        cancelled = time.monotonic()
        cancel.cancel()
        thread.join(10)
        assert got == [None] and time.monotonic() - cancelled < 2.0
        info = holder.holder(name)
        assert info.held and info.waiters == 0, "the cancelled wait is still queued"
        assert holder.force_release(name)
        assert not waiter.holder(name).held
    finally:
        holder.close()
        waiter.close()
