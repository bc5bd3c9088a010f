"""ZooKeeper presence records (the ``Presence`` capability the migrate backend's fleet guard needs).

Records announced with a ttl are ephemeral nodes of the driver's session: they live as long as the
session, and disappear when it is closed or expires; ``ttl=None`` records are persistent.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import ACL

from backends.pytest_fixtures import ZooKeeperFactory
from backends.servers import ZooKeeperServer
from lockkit import ConfigError
from lockkit.driver import DriverContext, Presence
from lockkit.drivers.zookeeper import ZooKeeperDriver
from lockkit.names import encode_name
from lockkit.urls import parse_url


@pytest.fixture
def chroot() -> str:
    return f"/zp-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def open_driver(zookeeper_server: ZooKeeperServer, chroot: str) -> Iterator[Callable[..., ZooKeeperDriver]]:
    opened: list[ZooKeeperDriver] = []

    def open_(query: str = "?session_timeout=2", auth: str = "") -> ZooKeeperDriver:
        url = f"zookeeper://{auth}{zookeeper_server.hosts}{chroot}{query}"
        opened.append(ZooKeeperDriver.from_url(parse_url(url), DriverContext()))
        return opened[-1]

    yield open_
    for driver in opened:
        driver.close()


def node(chroot: str, group: str, member: str | None = None) -> str:
    path = f"{chroot}/lockkit-presence/{encode_name(group)}"
    return path if member is None else f"{path}/{encode_name(member)}"


def wait_until(predicate: Callable[[], bool], timeout: float) -> bool:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= end:
            return False
        time.sleep(0.01)
    return True


def test_announce_members_withdraw(
    open_driver: Callable[..., ZooKeeperDriver], zk_raw: KazooClient, chroot: str
) -> None:
    a, b = open_driver(), open_driver()
    assert isinstance(a, Presence)
    group = "g/é %"
    a.announce(group, "m/1", "one", 30)
    b.announce(group, "m%2", "two ü", None)
    # linearizable reads: each client sees the other's earlier announce at once
    assert a.members(group) == b.members(group) == {"m/1": "one", "m%2": "two ü"}
    a.announce(group, "m/1", "uno", 30)  # re-announce replaces the value: one node, set in place
    assert b.members(group) == {"m/1": "uno", "m%2": "two ü"}
    data, stat = zk_raw.get(node(chroot, group, "m/1"))
    assert data == b"uno" and stat.ephemeralOwner == a._session.session_id() and stat.version == 1
    assert zk_raw.get(node(chroot, group, "m%2"))[1].ephemeralOwner == 0  # ttl None: persistent
    assert a.members("g") == {} and a.members("never") == {}  # "g" and "g/…" are different groups
    b.withdraw(group, "m/1")  # anyone may withdraw a record
    a.withdraw(group, "m%2")
    a.withdraw(group, "never-announced")
    a.withdraw("no-such-group", "x")
    assert a.members(group) == b.members(group) == {}


def test_records_never_collide_with_locks(
    open_driver: Callable[..., ZooKeeperDriver], zk_raw: KazooClient, chroot: str
) -> None:
    driver = open_driver()
    driver.announce("x", "m", "v", 30)
    assert driver.acquire("x", uuid.uuid4().hex, 5, None) is not None
    assert driver.members("x") == {"m": "v"}
    assert zk_raw.get_children(f"{chroot}/lockkit-presence/x") == ["m"]
    assert len(zk_raw.get_children(f"{chroot}/lockkit/x")) == 1


def test_members_syncs_before_reading(open_driver: Callable[..., ZooKeeperDriver]) -> None:
    driver = open_driver()
    driver.announce("s", "m", "v", 30)
    kazoo = driver._session.client()
    calls: list[tuple[str, str]] = []

    def spy(method: str) -> None:
        original = getattr(kazoo, method)

        def call(path: str, *args: Any, **kwargs: Any) -> Any:
            calls.append((method, path))
            return original(path, *args, **kwargs)

        setattr(kazoo, method, call)

    for method in ("sync_async", "get_children_async", "get_async"):
        spy(method)
    assert driver.members("s") == {"m": "v"}
    group = driver._presence_group("s")
    assert calls == [("sync_async", group), ("get_children_async", group), ("get_async", f"{group}/m")], calls


def test_bad_arguments_are_config_errors(open_driver: Callable[..., ZooKeeperDriver]) -> None:
    driver = open_driver()
    for args in (("", "m", "v", 5.0), ("g", "", "v", 5.0), ("g", "m", "v", 0.0), ("g", "m", "v", float("nan"))):
        with pytest.raises(ConfigError):
            driver.announce(*args)
    with pytest.raises(ConfigError):
        driver.members("")


def test_records_live_as_long_as_the_session(
    open_driver: Callable[..., ZooKeeperDriver], zookeeper_server: ZooKeeperServer
) -> None:
    reader, closed, expired = open_driver(), open_driver(), open_driver()
    closed.announce("life", "closed", "c", 1.0)
    expired.announce("life", "expired", "e", 1.0)
    closed.announce("life", "permanent", "p", None)
    assert reader.members("life") == {"closed": "c", "expired": "e", "permanent": "p"}
    closed.close()  # closing the session deletes its ephemeral records at once
    assert reader.members("life") == {"expired": "e", "permanent": "p"}
    # a forced expiry (the kazoo test-harness trick): another client with the same session id and password
    kazoo = expired._session.client()
    old_sid = kazoo.client_id[0]
    ghost = KazooClient(hosts=zookeeper_server.hosts, client_id=kazoo.client_id, timeout=2)
    ghost.start(timeout=5)
    ghost.stop()
    ghost.close()
    assert reader.members("life") == {"permanent": "p"}, "a record outlived its session"
    # the next announce (after the driver's new session) creates the record again, in the new session
    assert wait_until(lambda: expired._session.session_id() not in (None, old_sid), 10)
    expired.announce("life", "expired", "again", 1.0)
    assert reader.members("life") == {"expired": "again", "permanent": "p"}
    reader.withdraw("life", "permanent")


def test_permanent_records_survive_and_kinds_switch(
    open_driver: Callable[..., ZooKeeperDriver], zk_raw: KazooClient, chroot: str
) -> None:
    first = open_driver()
    first.announce("epoch", "epoch", "1", None)
    first.announce("kind", "m", "session", 5.0)
    first.close()
    second = open_driver()
    assert second.members("epoch") == {"epoch": "1"}, "a permanent record died with its session"
    assert second.members("kind") == {}
    second.announce("kind", "m", "v", 5.0)
    second.announce("kind", "m", "forever", None)  # ephemeral → persistent: the node is replaced
    assert zk_raw.get(node(chroot, "kind", "m"))[1].ephemeralOwner == 0
    second.announce("kind", "m", "mine", 5.0)  # persistent → ephemeral to our session
    sid = second._session.session_id()
    assert zk_raw.get(node(chroot, "kind", "m"))[1].ephemeralOwner == sid
    # another session's record of the same member is taken over (else it would live with *their* session)
    third = open_driver()
    third.announce("kind", "m", "theirs", 5.0)
    data, stat = zk_raw.get(node(chroot, "kind", "m"))
    assert data == b"theirs" and stat.ephemeralOwner == third._session.session_id()
    third.close()
    assert second.members("kind") == {}
    second.withdraw("epoch", "epoch")


def test_records_carry_the_lock_acl(
    open_driver: Callable[..., ZooKeeperDriver], zookeeper_server: ZooKeeperServer, chroot: str, zk_raw: KazooClient
) -> None:
    driver = open_driver(auth="app:s3cr3t@")
    driver.announce("acl", "m", "v", 5.0)
    admin = KazooClient(hosts=zookeeper_server.hosts, auth_data=[("digest", "app:s3cr3t")])
    admin.start(timeout=10)
    try:
        for path in (f"{chroot}/lockkit-presence", node(chroot, "acl"), node(chroot, "acl", "m")):
            acls, _ = admin.get_acls(path)
            assert [(acl.perms, acl.id.scheme) for acl in acls] == [(31, "digest")], (path, acls)
            assert all(isinstance(acl, ACL) for acl in acls)
    finally:
        admin.stop()
        admin.close()
    with pytest.raises(NoAuthError):
        zk_raw.delete(node(chroot, "acl", "m"))  # an unauthenticated client cannot remove a member
    same = open_driver(auth="app:s3cr3t@")
    assert same.members("acl") == {"m": "v"}
    same.withdraw("acl", "m")
    assert driver.members("acl") == {}


def test_group_nodes_are_containers_that_do_not_leak(fresh_zookeeper: ZooKeeperFactory) -> None:
    server = fresh_zookeeper(extra_args=["-Dznode.container.checkIntervalMs=200"])
    driver = ZooKeeperDriver.from_url(parse_url(f"{server.url}/pleak?session_timeout=2"), DriverContext())
    checker = KazooClient(hosts=server.hosts)
    checker.start(timeout=10)
    try:
        for i in range(3):
            driver.announce(f"short-{i}", "m", "v", 5.0)
            driver.withdraw(f"short-{i}", "m")
        assert wait_until(lambda: checker.get_children("/pleak/lockkit-presence") == [], 5), "group nodes leaked"
        driver.announce("short-0", "m", "back", 5.0)  # a reaped group is created again
        assert driver.members("short-0") == {"m": "back"}
    finally:
        checker.stop()
        checker.close()
        driver.close()
