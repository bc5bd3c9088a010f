"""etcd driver: key mapping, URL options, the import guard (E-7), RBAC and TLS against real servers."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

import lockkit
from backends.servers import EtcdServer, free_port
from lockkit import BackendUnavailable, ConfigError
from lockkit.drivers.etcd.keys import lock_key, name_range, prefix_end

ROOT = Path(__file__).resolve().parents[1]


# -- key mapping (pure) ----------------------------------------------------------------------------

def test_prefix_names_never_share_a_range() -> None:
    a_start, a_end = name_range("/lockkit/", "a")
    ab_key = lock_key("/lockkit/", "a/b", 1, 0)
    assert not a_start <= ab_key < a_end
    assert a_start <= lock_key("/lockkit/", "a", 0xFFFFFFFFFFFFFFFF, 12345) < a_end


def test_key_layout_is_stable() -> None:
    assert lock_key("/lk/", "a b/é", 0x1F, 0) == b"/lk/a%20b%2F%C3%A9/000000000000001f-0"
    assert lock_key("/lk/", "a", -1, 12) == b"/lk/a/ffffffffffffffff-12"


def test_prefix_end() -> None:
    assert prefix_end(b"/a/") == b"/a0"
    assert prefix_end(b"a\xff") == b"b"
    assert prefix_end(b"\xff\xff") == b"\0"


# -- URL and options ---------------------------------------------------------------------------------

@pytest.mark.parametrize("url, fragment", [
    ("etcd://", "at least one host"),
    ("etcd://h:2379/path", "no path"),
    ("etcd://h:2379,h:2379", "duplicate"),
    ("etcd://h?tll=5", "unknown option"),
    ("etcd://h?timeout=0", "timeout"),
    ("etcd://h?ca=/x.pem", "etcds://"),
    ("etcds://h?ca=/nonexistent/ca.pem", "cannot read"),
    ("etcds://h?cert=/x.pem", "both cert and key"),
    ("etcd://:s3cr3t-XYZ@h", "user name"),
    ("etcd://h?prefix=", "prefix"),
])
def test_bad_urls(url: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment) as info:
        lockkit.connect(url)
    assert "s3cr3t-XYZ" not in str(info.value)


def test_custom_prefix_is_used(etcd_server: EtcdServer) -> None:
    name = f"p-{uuid.uuid4().hex[:8]}"
    with lockkit.connect(etcd_server.url + "?prefix=/myapp/locks/") as locks:
        lock = locks.lock(name, ttl=5)
        lock.acquire(timeout=5)
        out = subprocess.run(["etcdctl", "get", "--prefix", "/myapp/locks/", "--keys-only"],
                             env=etcd_server.etcdctl_env(), capture_output=True, text=True, check=True).stdout
        assert f"/myapp/locks/{name}/" in out
        lock.release()


def test_unreachable_server_is_backend_unavailable() -> None:
    with lockkit.connect(f"etcd://127.0.0.1:{free_port()}?timeout=0.5") as locks:
        with pytest.raises(BackendUnavailable):
            locks.lock("x", ttl=5).acquire(timeout=1)
        (result,) = locks.check().values()
        assert isinstance(result, BackendUnavailable)


# -- E-7: the import guard -----------------------------------------------------------------------------

BROKEN = {
    "generated code from an old protoc": "raise TypeError('Descriptors cannot be created directly.')",
    "client not installed": "raise ModuleNotFoundError(\"No module named 'pyetcd'\", name='pyetcd')",
}


@pytest.mark.parametrize("why", sorted(BROKEN))
def test_e7_broken_client_import_names_the_fix(tmp_path: Path, why: str) -> None:
    fake = tmp_path / "pyetcd"
    fake.mkdir()
    (fake / "__init__.py").write_text(BROKEN[why] + "\n")
    script = textwrap.dedent("""
        import lockkit
        try:
            lockkit.connect("etcd://127.0.0.1:2379")
        except lockkit.ConfigError as exc:
            print("ConfigError:", exc)
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ConfigError:") and "pip install" in out.stdout and "lockkit[etcd]" in out.stdout


def test_e7_client_imports_with_current_protobuf() -> None:
    from google.protobuf import __version__ as protobuf_version

    from lockkit.drivers import etcd

    assert int(protobuf_version.split(".")[0]) >= 5
    assert etcd.EtcdDriver.guarantees.scope == "consensus"


# -- RBAC ------------------------------------------------------------------------------------------------

def _ctl(server: EtcdServer, *args: str, user: str | None = None) -> None:
    argv = ["etcdctl", *(["--user", user] if user else []), *args]
    subprocess.run(argv, env=server.etcdctl_env(), capture_output=True, text=True, check=True, timeout=15)


def test_auth_role_limited_to_prefix(fresh_etcd) -> None:  # type: ignore[no-untyped-def]
    server = fresh_etcd()
    _ctl(server, "user", "add", "root:rootpw", "--interactive=false")
    _ctl(server, "role", "add", "root")
    _ctl(server, "user", "grant-role", "root", "root")
    _ctl(server, "role", "add", "lockkit")
    _ctl(server, "role", "grant-permission", "--prefix=true", "lockkit", "readwrite", "/lockkit/")
    _ctl(server, "user", "add", "lk:s3cr3t-XYZ", "--interactive=false")
    _ctl(server, "user", "grant-role", "lk", "lockkit")
    _ctl(server, "role", "add", "elsewhere")
    _ctl(server, "role", "grant-permission", "--prefix=true", "elsewhere", "readwrite", "/other/")
    _ctl(server, "user", "add", "nope:s3cr3t-XYZ", "--interactive=false")
    _ctl(server, "user", "grant-role", "nope", "elsewhere")
    _ctl(server, "auth", "enable")
    host = f"127.0.0.1:{server.port}"
    with lockkit.connect(f"etcd://lk:s3cr3t-XYZ@{host}") as locks, \
            lockkit.connect(f"etcd://lk:s3cr3t-XYZ@{host}") as other:
        lock = locks.lock("rbac", ttl=2)
        lease = lock.acquire(timeout=5)
        assert other.lock("rbac", ttl=2).try_acquire() is None
        assert lock.renew() is lease
        driver = locks._backends["default"].driver  # type: ignore[attr-defined]
        keys = driver._client.lease_keys(driver._held[lease.token].session.lease_id)  # the >128-lock renew check
        assert keys is not None and len(keys) == 1
        lock.release()
        assert other.lock("rbac", ttl=2).acquire(timeout=5).valid
        driver.announce("fleet", "me", "v", 5.0)  # presence records live under the prefix too
        assert driver.members("fleet") == {"me": "v"}
        driver.withdraw("fleet", "me")
    with lockkit.connect(f"etcd://nope:s3cr3t-XYZ@{host}") as denied:
        with pytest.raises(BackendUnavailable, match="denied") as info:
            denied.lock("rbac", ttl=2).acquire(timeout=5)
        assert "s3cr3t-XYZ" not in str(info.value) and "grant-permission" in str(info.value)
    with lockkit.connect(f"etcd://lk:wrong-pw@{host}") as wrong:
        with pytest.raises(ConfigError, match="wrong user name or password") as bad:
            wrong.lock("rbac", ttl=2).acquire(timeout=5)
        assert "wrong-pw" not in str(bad.value)


# -- TLS -------------------------------------------------------------------------------------------------

def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, check=True, timeout=60)


@pytest.fixture
def pki(tmp_path: Path) -> Path:
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=lockkit-test-ca",
             "-keyout", "ca.key", "-out", "ca.pem", cwd=tmp_path)
    (tmp_path / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for who in ("server", "client"):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={who}", "-keyout", f"{who}.key",
                 "-out", f"{who}.csr", cwd=tmp_path)
        _openssl("x509", "-req", "-in", f"{who}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-days", "1", "-extfile", "san.cnf", "-out", f"{who}.pem", cwd=tmp_path)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=other-ca",
             "-keyout", "other.key", "-out", "other.pem", cwd=tmp_path)
    return tmp_path


def test_tls_with_client_certificates(fresh_etcd, pki: Path) -> None:  # type: ignore[no-untyped-def]
    port, peer, tls_port = free_port(), free_port(), free_port()
    server = fresh_etcd(port=port, peer_port=peer, extra_args=[
        "--listen-client-urls", f"http://127.0.0.1:{port},https://127.0.0.1:{tls_port}",
        "--advertise-client-urls", f"https://127.0.0.1:{tls_port}",
        "--cert-file", str(pki / "server.pem"), "--key-file", str(pki / "server.key"),
        "--trusted-ca-file", str(pki / "ca.pem"), "--client-cert-auth",
    ])
    assert server.port == port
    base = f"etcds://127.0.0.1:{tls_port}?ca={pki / 'ca.pem'}&timeout=2"
    with lockkit.connect(f"{base}&cert={pki / 'client.pem'}&key={pki / 'client.key'}") as locks:
        lock = locks.lock("tls", ttl=2)
        lock.acquire(timeout=5)
        lock.release()
    wrong = f"etcds://127.0.0.1:{tls_port}?ca={pki / 'other.pem'}&timeout=1&cert={pki / 'client.pem'}"
    with lockkit.connect(f"{wrong}&key={pki / 'client.key'}") as wrong_ca, pytest.raises(BackendUnavailable):
        wrong_ca.lock("tls", ttl=2).acquire(timeout=2)
    with lockkit.connect(base) as no_client_cert, pytest.raises(BackendUnavailable):
        no_client_cert.lock("tls", ttl=2).acquire(timeout=2)


# -- renewal cost ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("count", [100, 300])  # one check transaction up to 128 locks, one lease read beyond
def test_renew_many_is_one_keepalive_and_one_check(etcd_server: EtcdServer, count: int) -> None:
    from lockkit.driver import DriverContext, Grant, RenewRequest
    from lockkit.drivers.etcd import EtcdDriver
    from lockkit.urls import parse_url

    driver = EtcdDriver.from_url(parse_url(etcd_server.url), DriverContext())
    base = f"rm-{uuid.uuid4().hex[:8]}"
    try:
        requests = [RenewRequest(f"{base}-{i}", uuid.uuid4().hex, 5.0) for i in range(count)]
        for r in requests:
            assert driver.acquire(r.name, r.token, r.ttl, None) is not None
        assert driver.force_release(requests[7].name)  # an operator breaks one lock
        calls: list[str] = []
        failover = driver._client.failover

        def counted(service: str, invoke: object) -> object:
            calls.append(service)
            return failover(service, invoke)  # type: ignore[arg-type]

        driver._client.failover = counted  # type: ignore[method-assign]
        results = driver.renew_many(requests)
        assert len(calls) <= 2, calls  # a keepalive (unless one was just sent) and one check
        assert results[7] is None
        assert all(isinstance(r, Grant) for i, r in enumerate(results) if i != 7)
    finally:
        driver.close()
