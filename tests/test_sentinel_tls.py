"""rediss+sentinel:// against a real Sentinel set that speaks only TLS to its clients' addresses.

A master, two replicas and three sentinels, each also listening for TLS with a certificate for 127.0.0.1
made at test time (backends/tls.py); replication and the sentinels' links run over TLS, so the sentinels
name the members by their TLS ports and every connection lockkit makes — to the sentinels and to the
master they name — is TLS. Failovers SIGKILL the master (by PID) and give lockkit a generous bound.
"""

from __future__ import annotations

import shutil
import ssl
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

import lockkit
from backends import tls
from backends.servers import SentinelSet
from lockkit.drivers.epoch import EPOCH_SHIFT

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is needed to make certificates")
FOLLOW = 20.0  # seconds: the sentinels' failover (~1-3 s here) plus a generous margin for a loaded machine


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("sentinel-tls")
    tls.ca(d, "ca")
    # the sentinels name members by IP address: the certificate must be valid for 127.0.0.1
    tls.server_certificate(d, "server", "DNS:localhost,IP:127.0.0.1")
    return d


@pytest.fixture
def tls_set(certs: Path) -> Iterator[SentinelSet]:
    group = SentinelSet(tls_dir=certs).start()
    try:
        yield group
    finally:
        group.stop()


def _name() -> str:
    return f"stls-{uuid.uuid4().hex[:8]}"


def _tls_client(group: SentinelSet, certs: Path) -> redis.Redis:
    host, port = group.master_address()
    return redis.Redis(host, port, ssl=True, ssl_ca_certs=str(certs / "ca.pem"), socket_timeout=2)


def test_sentinels_name_the_tls_ports(tls_set: SentinelSet, certs: Path) -> None:
    """The harness is what it says: the address the sentinels give answers TLS and only TLS."""
    host, port = tls_set.master_address()
    assert port == tls_set.tls_ports[tls_set.master()]
    assert _tls_client(tls_set, certs).ping()
    with pytest.raises(redis.ConnectionError):
        redis.Redis(host, port, socket_timeout=2).ping()  # plain RESP to a TLS port
    assert tls_set.url.startswith("rediss+sentinel://")


def test_locks_wake_and_fence_over_tls(tls_set: SentinelSet, certs: Path) -> None:
    name = _name()
    with lockkit.connect(tls_set.url) as a, lockkit.connect(tls_set.url) as b:
        holding, waiting = a.lock(name, ttl=5), b.lock(name, ttl=5)
        first = holding.acquire(timeout=5)
        got: list[lockkit.Lease] = []
        waiter = threading.Thread(target=lambda: got.append(waiting.acquire(timeout=15)))
        waiter.start()
        while not a.holder(name).waiters:
            assert waiter.is_alive()
            time.sleep(0.02)
        holding.release()
        waiter.join(20)
        assert got and got[0].valid and got[0].fencing_token > first.fencing_token
        waiting.release()
    # the keys were written on the master, over TLS
    assert _tls_client(tls_set, certs).exists(f"lockkit:{{{name}}}:fence")


def test_a_wrong_ca_is_refused_with_a_clear_error(tls_set: SentinelSet, certs: Path, tmp_path: Path) -> None:
    tls.ca(tmp_path, "ca")  # another CA, trusted by no member
    url = tls_set.url.split("?")[0] + f"?tls_ca={tmp_path / 'ca.pem'}&failover_wait=1"
    with lockkit.connect(url) as locks, pytest.raises(lockkit.LockError) as info:
        locks.lock(_name(), ttl=2).acquire(timeout=2)
    assert isinstance(info.value.__cause__, ssl.SSLError) or "certificate" in str(info.value).lower(), info.value


def test_a_held_lock_follows_the_promoted_master_over_tls(tls_set: SentinelSet) -> None:
    """SIGKILL the master while a lock is held: lockkit asks the sentinels again (over TLS), renews on the
    promoted master (TLS) and the lock is either still ours there or reported lost — never silently valid
    while the new master lacks it; a later grant's token ranks above the old one (the config-epoch)."""
    name = _name()
    lost: list[lockkit.Lease] = []
    with lockkit.connect(tls_set.url + "&failover_wait=15") as locks:
        lock = locks.lock(name, ttl=6, on_lost=lost.append)
        lease = lock.acquire(timeout=5)
        old = tls_set.master_address()
        tls_set.kill_master()
        new = tls_set.wait_for_failover(old, timeout=FOLLOW)
        assert new[1] in tls_set.tls_ports.values(), "the promoted master is named by its TLS port"
        try:
            lock.renew()
        except lockkit.LockLost:  # the grant had not reached the promoted replica: reported, as documented
            assert lost == [lease] and not lease.valid, "a lost lock must be reported through on_lost"
        else:
            assert lease.valid and not lost
            lock.release()
        after = locks.lock(name, ttl=6).acquire(timeout=FOLLOW)
        assert after.fencing_token >> EPOCH_SHIFT > lease.fencing_token >> EPOCH_SHIFT
