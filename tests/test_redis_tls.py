"""``rediss://`` against Debian's redis-server with a CA and certificates made at test time (openssl)."""

from __future__ import annotations

import shutil
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import lockkit
from backends import tls
from backends.servers import RedisServer, free_port
from lockkit import BackendUnavailable

PASSWORD = "s3cr3t-XYZ"
pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is needed to make certificates")


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tls")
    tls.ca(d, "ca")
    tls.ca(d, "other-ca")  # trusted by nobody: the "wrong CA" case
    tls.key_and_csr(d, "server", "localhost")
    # the name is "localhost" only (no IP address), so connecting to 127.0.0.1 is a host-name mismatch
    tls.sign(d, "server", "subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n")
    tls.key_and_csr(d, "client", "lockkit-client")
    tls.sign(d, "client", "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n")
    return d


def _tls_server(certs: Path, clients: str) -> tuple[RedisServer, int]:
    port = free_port()
    server = RedisServer(password=PASSWORD, extra_args=[
        "--tls-port", str(port), "--tls-cert-file", str(certs / "server.pem"),
        "--tls-key-file", str(certs / "server.key"), "--tls-ca-cert-file", str(certs / "ca.pem"),
        "--tls-auth-clients", clients,
    ])  # fmt: skip
    return server.start(), port


@pytest.fixture(scope="module")
def tls_port(certs: Path) -> Iterator[int]:
    server, port = _tls_server(certs, "no")
    yield port
    server.stop()


def url(host: str, port: int, query: str) -> str:
    return f"rediss://:{PASSWORD}@{host}:{port}/0?{query}"


def test_tls_verified_connection_locks_and_wakes_waiters(certs: Path, tls_port: int) -> None:
    target = url("localhost", tls_port, f"tls_ca={certs / 'ca.pem'}")
    name = f"tls-{uuid.uuid4().hex[:8]}"
    with lockkit.connect(target) as a, lockkit.connect(target) as b:
        lock = a.lock(name, ttl=2)
        lease = lock.acquire(timeout=2)
        assert b.holder(name).held and lease.fencing_token >= 1
        outcome: list[BaseException | None] = []

        def release() -> None:
            try:
                lock.release()
                outcome.append(None)
            except lockkit.LockError as exc:  # kept for the assertion below, not lost in a thread
                outcome.append(exc)

        releaser = threading.Timer(0.2, release)
        releaser.start()
        waiter = b.lock(name, ttl=2)
        waiter.acquire(timeout=3)  # woken through a TLS pub/sub connection
        waiter.release()
        releaser.join()
        # The release happened (the waiter got the lock). A connection that broke under it is reported as an
        # unknown outcome, never as "not ours".
        assert outcome[0] is None or isinstance(outcome[0], lockkit.BackendUnavailable), outcome[0]


def _refused(target: str, match: str) -> None:
    with lockkit.connect(target) as locks, pytest.raises(BackendUnavailable, match=match) as info:
        locks.lock(f"tls-{uuid.uuid4().hex[:8]}", ttl=1).try_acquire()
    text = f"{info.value} {info.value.__cause__}"
    assert PASSWORD not in text
    print("refused:", info.value)


def test_tls_wrong_ca_is_refused(certs: Path, tls_port: int) -> None:
    _refused(url("localhost", tls_port, f"tls_ca={certs / 'other-ca.pem'}&connect_timeout=1"), "(?i)certificate")


def test_tls_wrong_hostname_is_refused_unless_hostname_checks_are_off(certs: Path, tls_port: int) -> None:
    ca = certs / "ca.pem"
    _refused(url("127.0.0.1", tls_port, f"tls_ca={ca}&connect_timeout=1"), "(?i)hostname|match|certificate")
    with lockkit.connect(url("127.0.0.1", tls_port, f"tls_ca={ca}&tls_check_hostname=false")) as locks:
        assert locks.lock(f"tls-{uuid.uuid4().hex[:8]}", ttl=1).try_acquire() is not None


def test_tls_client_certificate(certs: Path) -> None:
    server, port = _tls_server(certs, "yes")
    try:
        ca = certs / "ca.pem"
        _refused(url("localhost", port, f"tls_ca={ca}&connect_timeout=1"), "unreachable")
        cert = f"tls_cert={certs / 'client.pem'}&tls_key={certs / 'client.key'}"
        with lockkit.connect(url("localhost", port, f"tls_ca={ca}&{cert}")) as locks:
            assert locks.lock(f"tls-{uuid.uuid4().hex[:8]}", ttl=1).try_acquire() is not None
    finally:
        server.stop()
