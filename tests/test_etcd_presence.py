"""etcd presence records (the ``Presence`` capability the migrate backend's fleet guard needs)."""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

import lockkit
from backends.servers import EtcdServer
from lockkit import ConfigError
from lockkit.driver import DriverContext, Presence
from lockkit.drivers.etcd import EtcdDriver
from lockkit.urls import parse_url

SLACK = 0.25
LESSOR_TICK = 0.5  # etcd revokes expired leases on a 500 ms tick


@pytest.fixture
def open_driver() -> Iterator[Callable[[str], EtcdDriver]]:
    opened: list[EtcdDriver] = []

    def open_(url: str) -> EtcdDriver:
        opened.append(EtcdDriver.from_url(parse_url(url), DriverContext()))
        return opened[-1]

    yield open_
    for driver in opened:
        driver.close()


def _group() -> str:
    return f"pg-{uuid.uuid4().hex[:8]}"


def _leases(server: EtcdServer) -> int:
    out = subprocess.run(["etcdctl", "lease", "list"], env=server.etcdctl_env(), capture_output=True, text=True,
                         check=True, timeout=15).stdout
    return sum(1 for line in out.splitlines() if line.strip() and not line.startswith("found"))


def test_announce_members_withdraw(etcd_server: EtcdServer, open_driver: Callable[[str], EtcdDriver]) -> None:
    a, b = open_driver(etcd_server.url), open_driver(etcd_server.url)
    assert isinstance(a, Presence)
    group = _group() + "/é %"
    a.announce(group, "m/1", "one", 30)
    b.announce(group, "m%2", "two", None)
    # linearizable reads: each client sees the other's earlier announce at once
    assert a.members(group) == b.members(group) == {"m/1": "one", "m%2": "two"}
    a.announce(group, "m/1", "uno", 30)  # re-announce replaces the value
    assert b.members(group) == {"m/1": "uno", "m%2": "two"}
    assert a.members(group.split("/")[0]) == {}  # "g" and "g/…" are different groups
    b.withdraw(group, "m/1")  # anyone may withdraw a record
    a.withdraw(group, "m%2")
    a.withdraw(group, "never-announced")
    assert a.members(group) == {}


def test_records_never_collide_with_locks(etcd_server: EtcdServer, open_driver: Callable[[str], EtcdDriver]) -> None:
    driver = open_driver(etcd_server.url)
    for group in (".presence", "__presence", "x"):
        driver.announce(group, "m", "v", 30)
    with lockkit.connect(etcd_server.url) as locks:
        for name in (".presence", "__presence", ".presence/x", "__presence/x/m"):
            info = locks.holder(name)
            assert not info.held and info.waiters == 0, (name, info)
            with locks.lock(name, ttl=5):
                assert driver.members("x") == {"m": "v"}
    for group in (".presence", "__presence", "x"):
        driver.withdraw(group, "m")


def test_bad_arguments_are_config_errors(etcd_server: EtcdServer, open_driver: Callable[[str], EtcdDriver]) -> None:
    driver = open_driver(etcd_server.url)
    for args in (("", "m", "v", 5.0), ("g", "", "v", 5.0), ("g", "m", "v", 0.0)):
        with pytest.raises(ConfigError):
            driver.announce(*args)


def test_record_lives_ttl_after_its_last_announce(
    fresh_etcd: Callable[..., EtcdServer], open_driver: Callable[[str], EtcdDriver]
) -> None:
    server = fresh_etcd(heartbeat_interval_ms=10, election_timeout_ms=100)  # 1 s minimum lease TTL
    writer, reader = open_driver(server.url), open_driver(server.url)
    group = _group()
    base = _leases(server)
    writer.announce(group, "w", "alive", 1.0)
    lease = writer._presence._leases[(group, "w")][0]
    for _ in range(3):  # refreshed past several TTLs: one lease, kept alive, not one per announce
        time.sleep(0.5)
        writer.announce(group, "w", "alive", 1.0)
        assert reader.members(group) == {"w": "alive"}
    assert writer._presence._leases[(group, "w")][0] == lease and _leases(server) == base + 1
    last = time.monotonic()
    writer.close()  # a crashed or closed client: no withdraw, the record expires on its own
    while reader.members(group) and time.monotonic() < last + 5:
        time.sleep(0.05)
    gone = time.monotonic() - last
    print(f"presence record gone {gone:.3f} s after the last announce (ttl 1 s)")
    assert not reader.members(group)
    assert 0.9 <= gone <= 1.0 + LESSOR_TICK + SLACK + 0.5


def test_permanent_records_and_ttl_changes(
    fresh_etcd: Callable[..., EtcdServer], open_driver: Callable[[str], EtcdDriver]
) -> None:
    server = fresh_etcd(heartbeat_interval_ms=10, election_timeout_ms=100)
    driver = open_driver(server.url)
    group = _group()
    base = _leases(server)
    driver.announce(group, "epoch", "1", 1.0)
    driver.announce(group, "epoch", "1", 3.0)  # another ttl: a new lease, the old one revoked
    assert _leases(server) == base + 1
    driver.announce(group, "epoch", "1", None)  # permanent: detached from any lease, which is revoked
    assert _leases(server) == base
    time.sleep(1.0 + LESSOR_TICK + SLACK)
    assert open_driver(server.url).members(group) == {"epoch": "1"}
    driver.announce(group, "m", "x", 1.0)
    driver.withdraw(group, "m")  # withdrawing revokes the record's lease too
    assert _leases(server) == base and driver.members(group) == {"epoch": "1"}


def test_announce_after_the_lease_expired(
    fresh_etcd: Callable[..., EtcdServer], open_driver: Callable[[str], EtcdDriver]
) -> None:
    server = fresh_etcd(heartbeat_interval_ms=10, election_timeout_ms=100)
    driver = open_driver(server.url)
    group = _group()
    driver.announce(group, "m", "v", 1.0)
    old = driver._presence._leases[(group, "m")][0]
    subprocess.run(["etcdctl", "lease", "revoke", f"{old:x}"], env=server.etcdctl_env(), check=True,
                   capture_output=True, timeout=15)  # as if we were paused past the TTL
    assert driver.members(group) == {}
    driver.announce(group, "m", "v", 1.0)
    assert driver.members(group) == {"m": "v"} and driver._presence._leases[(group, "m")][0] != old
