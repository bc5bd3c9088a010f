"""Tests written to kill mutants of scripts/mutants.toml that survived every other test (issue 20).

Each names the mutant it kills; `python scripts/mutants.py curated --only ID` shows it die.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest

import lockkit
from backends.servers import EtcdServer
from lockkit import LockLost
from lockkit.drivers.embedded import file_record


def _etcdctl(server: EtcdServer, *args: str) -> str:
    return subprocess.run(
        ["etcdctl", *args], env=server.etcdctl_env(), capture_output=True, text=True, check=True, timeout=30
    ).stdout


@pytest.mark.parametrize("with_other_lease", [False, True], ids=["no-lease", "other-lease"])
def test_etcd_renew_refuses_a_key_that_exists_but_is_not_ours(etcd_server: EtcdServer, with_other_lease: bool) -> None:
    """Mutant etcd-renew-key-exists: renew must check that the key is *our* key (its create_revision), not that
    a key of that name exists. Here another client deletes our key and writes one of the same name and value
    (no lease, or a lease of its own): it exists, it is not ours, and renew must report the lock lost."""
    name = f"mk-{uuid.uuid4().hex[:10]}"
    with lockkit.connect(etcd_server.url) as locks:
        lock = locks.lock(name, ttl=5, auto_renew=False)
        lease = lock.acquire(timeout=5)
        keys = _etcdctl(etcd_server, "get", "--prefix", f"/lockkit/{name}/", "--keys-only").split()
        assert len(keys) == 1, keys
        (key,) = keys
        _etcdctl(etcd_server, "del", key)
        put = ["put", key, lease.token]
        if with_other_lease:
            lease_id = _etcdctl(etcd_server, "lease", "grant", "30").split()[1]
            put += [f"--lease={lease_id}"]
        _etcdctl(etcd_server, "put", *put[1:])
        try:
            with pytest.raises(LockLost):
                lock.renew()
            assert not lease.valid
        finally:
            _etcdctl(etcd_server, "del", key)


def test_file_record_with_a_flipped_byte_is_not_trusted(tmp_path: Path) -> None:
    """Mutant file-record-checksum-dropped: a slot whose payload has the right length but a flipped byte (a torn
    or rotted write) must fail its checksum, so the reader falls back to the other, older slot instead of
    trusting a record that names another holder or fence."""
    path = tmp_path / "record"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        file_record.write(fd, 0, {"holder": "a", "fence": 5}, durable=False)  # seq 1, slot 1
        file_record.write(fd, 1, {"holder": "b", "fence": 6}, durable=False)  # seq 2, slot 0
        assert file_record.read(fd) == (2, {"holder": "b", "fence": 6})
        raw = bytearray(os.pread(fd, file_record.SLOT, 0))
        at = raw.index(b'"fence":6')
        raw[at + len('"fence":')] = ord("9")  # same length, still valid JSON: only the checksum can tell
        os.pwrite(fd, bytes(raw), 0)
        assert file_record.read(fd) == (1, {"holder": "a", "fence": 5}), "a corrupted slot was trusted"
        raw = bytearray(os.pread(fd, file_record.SLOT, file_record.SLOT))
        raw[raw.index(b'"holder":"a"') + len('"holder":"')] = ord("z")
        os.pwrite(fd, bytes(raw), file_record.SLOT)
        with pytest.raises(file_record.CorruptRecord):
            file_record.read(fd)
    finally:
        os.close(fd)
