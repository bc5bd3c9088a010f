"""Smoke tests for the test infrastructure in ``backends/``: servers, fixtures, fault proxy.

Fixtures come from ``backends.pytest_fixtures`` via ``pytest_plugins`` in tests/conftest.py.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator

import pytest
import redis
from kazoo.client import KazooClient
from redis.backoff import NoBackoff
from redis.retry import Retry

import backends.servers as servers_mod
from backends.proxy import Direction, FaultProxy, ProxyMode
from backends.pytest_fixtures import (
    EtcdFactory,
    ProxyFactory,
    RedisFactory,
    RedlockFactory,
    ZooKeeperFactory,
)
from backends.servers import (
    EtcdServer,
    RedisServer,
    RedlockServers,
    Server,
    ServerNotReady,
    ZooKeeperServer,
    free_port,
    redlock_url,
)

pytestmark = pytest.mark.timeout(30)


def client(port: int, timeout: float = 0.5) -> redis.Redis:
    """A redis-py client that fails fast: no retries, short socket timeouts."""
    return redis.Redis(
        host="127.0.0.1",
        port=port,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
    )


@pytest.fixture
def rclient(redis_server: RedisServer) -> Iterator[redis.Redis]:
    c = client(redis_server.port)
    try:
        yield c
    finally:
        c.close()


def etcdctl(server: EtcdServer, *args: str) -> str:
    proc = subprocess.run(
        ["etcdctl", "--dial-timeout=2s", "--command-timeout=5s", *args],
        env=server.etcdctl_env(),
        capture_output=True,
        text=True,
        timeout=15,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# ---------------------------------------------------------------------------- servers


def test_free_port_is_bindable_and_not_repeated() -> None:
    ports = {free_port() for _ in range(20)}
    assert len(ports) == 20
    assert all(1024 <= p <= 65535 for p in ports)


def test_redis_server_answers_redis_py(redis_server: RedisServer, rclient: redis.Redis) -> None:
    assert redis_server.host == "127.0.0.1"
    assert redis_server.url == f"redis://127.0.0.1:{redis_server.port}/0"
    assert redis_server.log_path.is_file()
    key = f"smoke:{uuid.uuid4()}"
    assert rclient.ping()
    assert rclient.set(key, b"v", px=5000)
    assert rclient.get(key) == b"v"
    # DEBUG is enabled for loopback clients (DEBUG SLEEP is the server-stall fault)
    assert "refcount" in repr(rclient.debug_object(key))
    assert rclient.delete(key) == 1


def test_redis_url_round_trips_through_redis_py(redis_server: RedisServer) -> None:
    c = redis.Redis.from_url(redis_server.url, socket_timeout=1)
    try:
        assert c.ping()
    finally:
        c.close()


def test_redis_password(fresh_redis: RedisFactory) -> None:
    server = fresh_redis(password="s3cret/pw")
    assert server.url == f"redis://:s3cret%2Fpw@127.0.0.1:{server.port}/0"
    anon = client(server.port)
    try:
        with pytest.raises(redis.AuthenticationError):
            anon.ping()
    finally:
        anon.close()
    authed = redis.Redis.from_url(server.url, socket_timeout=1)
    try:
        assert authed.ping()
    finally:
        authed.close()


def test_redlock_five_independent_masters(redlock_servers: RedlockServers) -> None:
    assert len(redlock_servers) == 5
    ports = [s.port for s in redlock_servers]
    assert len(set(ports)) == 5
    assert redlock_servers.url == "redlock://" + ",".join(f"127.0.0.1:{p}" for p in ports) + "/0"
    assert redlock_servers.url == redlock_url(redlock_servers.servers)
    key = f"smoke:{uuid.uuid4()}"
    clients = [client(p) for p in ports]
    try:
        clients[0].set(key, b"only-on-first", px=5000)
        assert [c.exists(key) for c in clients] == [1, 0, 0, 0, 0]  # independent masters
        clients[0].delete(key)
    finally:
        for c in clients:
            c.close()


def test_fresh_redlock_members_fail_independently(fresh_redlock: RedlockFactory) -> None:
    group = fresh_redlock(n=3)
    assert len(group) == 3
    group[0].kill()
    assert [s.running for s in group] == [False, True, True]
    assert all(s.probe() for s in group.servers[1:])


def test_zookeeper_answers_kazoo(zookeeper_server: ZooKeeperServer) -> None:
    assert zookeeper_server.url == f"zookeeper://127.0.0.1:{zookeeper_server.port}"
    assert zookeeper_server.four_letter_word("ruok") == "imok"
    chroot = f"/smoke-{uuid.uuid4().hex}"
    root = KazooClient(hosts=zookeeper_server.hosts, timeout=4.0)
    root.start(timeout=5)
    try:
        root.ensure_path(chroot)  # kazoo warns (an error here) if the chroot does not exist
        zk = KazooClient(hosts=zookeeper_server.hosts + chroot, timeout=4.0)
        zk.start(timeout=5)
        try:
            zk.create("/node", b"hello", ephemeral=True)
            data, stat = zk.get("/node")
            assert data == b"hello"
            assert stat.ephemeralOwner == zk.client_id[0]
        finally:
            zk.stop()
            zk.close()
        assert root.exists(chroot + "/node") is None  # the ephemeral node went with the session
        root.delete(chroot, recursive=True)
    finally:
        root.stop()
        root.close()


def test_etcd_answers_etcdctl(etcd_server: EtcdServer) -> None:
    assert etcd_server.url == f"etcd://127.0.0.1:{etcd_server.port}"
    assert etcd_server.version().startswith("3.")
    key = f"/smoke/{uuid.uuid4()}"
    assert etcdctl(etcd_server, "put", key, "v1").strip() == "OK"
    assert etcdctl(etcd_server, "get", key, "--print-value-only").strip() == "v1"
    assert etcdctl(etcd_server, "del", key).strip() == "1"


def test_server_failing_to_start_reports_log_tail() -> None:
    server = RedisServer(extra_args=["--no-such-option", "x"], ready_timeout=5)
    with pytest.raises(ServerNotReady) as info:
        server.start()
    message = str(info.value)
    assert "no-such-option" in message  # the log tail is part of the error
    assert "exited" in message
    assert server._workdir is None  # temp dir removed


def test_stop_reaps_process_and_deletes_temp_dir() -> None:
    server = RedisServer().start()
    pid, workdir = server.pid, server.workdir
    assert workdir.is_dir()
    server.stop()
    assert not process_exists(pid)
    assert not workdir.exists()
    server.stop()  # idempotent


def test_stop_of_paused_server_is_prompt() -> None:
    server = RedisServer().start()
    pid = server.pid
    server.pause()
    started = time.monotonic()
    server.stop()
    assert time.monotonic() - started < 3
    assert not process_exists(pid)


def test_pause_resume_redis(fresh_redis: RedisFactory) -> None:
    server: RedisServer = fresh_redis()
    c = client(server.port, timeout=0.5)
    try:
        assert c.ping()
        server.pause()
        assert server.paused
        with pytest.raises(redis.TimeoutError):
            c.ping()
        server.resume()
        assert not server.paused
        assert client_ping_eventually(c)
    finally:
        c.close()


def client_ping_eventually(c: redis.Redis, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return bool(c.ping())
        except (redis.TimeoutError, redis.ConnectionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_restart_keeps_port_and_kill_then_restart(fresh_redis: RedisFactory) -> None:
    server: RedisServer = fresh_redis()
    port, workdir, pid = server.port, server.workdir, server.pid
    server.restart()
    assert (server.port, server.workdir) == (port, workdir)
    assert server.pid != pid
    pid = server.pid
    server.kill()
    assert not server.running
    assert not process_exists(pid)
    with pytest.raises(redis.ConnectionError):
        client(port).ping()
    server.restart()
    assert server.port == port
    c = client(port)
    try:
        assert c.ping()
    finally:
        c.close()


def test_etcd_restart_keeps_data(fresh_etcd: EtcdFactory) -> None:
    server: EtcdServer = fresh_etcd(heartbeat_interval_ms=10, election_timeout_ms=100)
    etcdctl(server, "put", "/k", "persisted")
    port = server.port
    server.kill()
    server.restart(keep_data=True)
    assert server.port == port
    assert etcdctl(server, "get", "/k", "--print-value-only").strip() == "persisted"
    server.restart(keep_data=False)
    assert etcdctl(server, "get", "/k", "--print-value-only").strip() == ""


def test_zookeeper_restart_keeps_data(fresh_zookeeper: ZooKeeperFactory) -> None:
    server: ZooKeeperServer = fresh_zookeeper()
    zk = KazooClient(hosts=server.hosts, timeout=4.0)
    zk.start(timeout=5)
    try:
        zk.create("/persistent", b"x")
    finally:
        zk.stop()
        zk.close()
    port = server.port
    server.restart()
    assert server.port == port
    zk = KazooClient(hosts=server.hosts, timeout=4.0)
    zk.start(timeout=5)
    try:
        assert zk.get("/persistent")[0] == b"x"
    finally:
        zk.stop()
        zk.close()


def test_servers_run_in_their_own_session(redis_server: RedisServer) -> None:
    # a Ctrl-C sent to the test run's process group does not reach the servers
    assert os.getsid(redis_server.pid) == redis_server.pid
    assert os.getpgid(redis_server.pid) == redis_server.pid
    assert os.getpgid(0) != redis_server.pid


# ---------------------------------------------------------------------------- proxy


@pytest.fixture
def proxied(redis_server: RedisServer, fault_proxy: ProxyFactory) -> Iterator[tuple[FaultProxy, redis.Redis]]:
    proxy: FaultProxy = fault_proxy(redis_server)
    c = client(proxy.port, timeout=0.5)
    try:
        yield proxy, c
    finally:
        c.close()


def test_proxy_pass_through(proxied: tuple[FaultProxy, redis.Redis]) -> None:
    proxy, c = proxied
    assert proxy.host == "127.0.0.1"
    assert proxy.mode is ProxyMode.PASS
    assert c.ping()
    assert c.echo(b"x" * 200_000) == b"x" * 200_000  # larger than one chunk
    assert proxy.connections_total == 1
    assert proxy.connections_active == 1
    assert proxy.bytes_up > 200_000
    assert proxy.bytes_down > 200_000


def test_proxy_blackhole_times_out_then_heals(proxied: tuple[FaultProxy, redis.Redis]) -> None:
    proxy, c = proxied
    assert c.ping()
    proxy.set_mode("blackhole")
    started = time.monotonic()
    with pytest.raises(redis.TimeoutError):
        c.ping()
    assert 0.4 < time.monotonic() - started < 2.0
    assert proxy.connections_active == 1  # sockets stay open
    proxy.heal()
    fresh = client(proxy.port)
    try:
        assert fresh.ping()
    finally:
        fresh.close()


def test_proxy_blackhole_holds_bytes_until_healed(
    redis_server: RedisServer, fault_proxy: ProxyFactory
) -> None:
    proxy = fault_proxy(redis_server)
    with socket.create_connection(proxy.address, timeout=0.3) as sock:
        sock.sendall(b"PING\r\n")
        assert sock.recv(100) == b"+PONG\r\n"
        proxy.set_mode("blackhole")
        sock.sendall(b"PING\r\n")
        with pytest.raises(TimeoutError):
            sock.recv(100)
        proxy.heal()  # like TCP after a partition heals: the held request is delivered
        sock.settimeout(2)
        assert sock.recv(100) == b"+PONG\r\n"


def test_proxy_reset_gives_connection_error(proxied: tuple[FaultProxy, redis.Redis]) -> None:
    proxy, c = proxied
    assert c.ping()
    proxy.set_mode("reset")
    with pytest.raises(redis.ConnectionError):
        c.ping()  # existing connection was reset, reconnect is reset on accept
    proxy.heal()
    assert c.ping()  # redis-py reconnects


def test_proxy_reset_all_is_one_shot(proxied: tuple[FaultProxy, redis.Redis]) -> None:
    proxy, c = proxied
    assert c.ping()
    assert proxy.reset_all() == 1
    assert c.ping()  # mode is still pass: redis-py sees the dead pooled socket and reconnects
    assert proxy.connections_total == 2


@pytest.mark.parametrize(("how", "expect_rst"), [("reset_all", True), ("close_all", False)])
def test_proxy_reset_sends_rst_close_sends_fin(
    redis_server: RedisServer,
    fault_proxy: ProxyFactory,
    how: str,
    expect_rst: bool,
) -> None:
    proxy = fault_proxy(redis_server)
    with socket.create_connection(proxy.address, timeout=2) as sock:
        sock.sendall(b"PING\r\n")
        assert sock.recv(100) == b"+PONG\r\n"
        assert getattr(proxy, how)() == 1
        if expect_rst:
            with pytest.raises(ConnectionResetError):
                sock.recv(100)
        else:
            assert sock.recv(100) == b""  # orderly FIN


def test_proxy_close_mode(proxied: tuple[FaultProxy, redis.Redis]) -> None:
    proxy, c = proxied
    assert c.ping()
    proxy.set_mode(ProxyMode.CLOSE)
    with pytest.raises(redis.ConnectionError):
        c.ping()
    proxy.heal()
    assert c.ping()


def test_proxy_delay(proxied: tuple[FaultProxy, redis.Redis]) -> None:
    proxy, c = proxied
    assert c.ping()
    directions: tuple[Direction, ...] = ("up", "down", "both")
    for direction in directions:
        proxy.delay(0.2, direction)
        started = time.monotonic()
        assert c.ping()
        elapsed = time.monotonic() - started
        expected = 0.4 if direction == "both" else 0.2
        assert expected - 0.02 <= elapsed < expected + 0.25, (direction, elapsed)
    proxy.heal()
    started = time.monotonic()
    assert c.ping()
    assert time.monotonic() - started < 0.1


def test_proxy_drop_downstream_is_asymmetric(
    proxied: tuple[FaultProxy, redis.Redis],
    rclient: redis.Redis,
) -> None:
    proxy, c = proxied
    key = f"smoke:{uuid.uuid4()}"
    assert c.ping()
    proxy.set_mode("drop_downstream")
    with pytest.raises(redis.TimeoutError):
        c.set(key, b"written", px=5000)  # the request reaches the server, the reply vanishes
    assert rclient.get(key) == b"written"
    rclient.delete(key)


def test_proxy_to_dead_target_resets_client(fault_proxy: ProxyFactory) -> None:
    proxy: FaultProxy = fault_proxy("127.0.0.1", free_port())
    c = client(proxy.port)
    try:
        with pytest.raises(redis.ConnectionError):
            c.ping()
    finally:
        c.close()


def test_proxy_refuses_non_loopback_target() -> None:
    with pytest.raises(RuntimeError):
        FaultProxy("192.0.2.1", 6379)


def test_proxy_stop_closes_everything(redis_server: RedisServer) -> None:
    with FaultProxy(redis_server.host, redis_server.port) as proxy:
        c = client(proxy.port)
        assert c.ping()
        proxy.set_mode("blackhole")
    assert not proxy.running
    with pytest.raises(redis.ConnectionError):
        c.ping()
    c.close()


@pytest.mark.parametrize("kind", [RedisServer, ZooKeeperServer, EtcdServer])
def test_start_retries_on_port_race(kind: type[Server], monkeypatch: pytest.MonkeyPatch) -> None:
    real_free_port = servers_mod.free_port
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        taken_port = taken.getsockname()[1]
        handed_out = [taken_port]  # the first port handed out is already in use

        def racy_free_port(host: str = "127.0.0.1") -> int:
            return handed_out.pop() if handed_out else real_free_port(host)

        monkeypatch.setattr(servers_mod, "free_port", racy_free_port)
        server = kind()
        try:
            server.start()
            assert server.port != taken_port
            assert server.probe()
            log = server.log_path.read_text()
            assert log.count("=== lockkit: starting") == 2, log  # first attempt lost the race
            assert re.search("address already in use", log, re.IGNORECASE), log
        finally:
            server.stop()
