"""A-5: file:// on a directory two machines share.

The second machine is a real child process on the same directory whose host identity differs, in one of
two ways:

- ``namespace``: the child runs in its own user, mount and UTS namespaces with a different
  ``/proc/sys/kernel/random/boot_id``, ``/etc/machine-id`` and host name bind-mounted or set, so the driver
  reads them exactly as on another machine (needs unprivileged user namespaces; skipped without);
- ``override``: ``LOCKKIT_FILE_TEST_IDENTITY=HOST/BOOT``, the driver's test hook.

Both run on one real machine, so the test (never the driver) may compare the two processes' monotonic
times: that is how it checks that the second host's grant came after the first host's lease had ended.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import secrets
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import lockkit
from lockkit import ConfigError
from lockkit.driver import DriverContext
from lockkit.drivers.embedded import file_record
from lockkit.drivers.file import FileDriver
from lockkit.urls import parse_url

TTL = 2.0
WINDOW = TTL + max(2.0, TTL)
"""How long host 2 respects host 1's unchanged record after first seeing it: ttl plus foreign_margin(ttl)."""

CHILD = r"""
import json, os, sys, time
import lockkit
from lockkit.driver import DriverContext
from lockkit.drivers.file import FileDriver
from lockkit.urls import parse_url

mode, url, name, ttl = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])

def say(**event):
    print(json.dumps(event), flush=True)

if mode == "announce":
    FileDriver.from_url(parse_url(url), DriverContext()).announce(name, "other-host", "old", ttl)
    say(announced=True)
    sys.exit(0)
locks = lockkit.connect(url)
lease = locks.lock(name, ttl=ttl, auto_renew=(mode == "hold")).acquire(timeout=30)
say(fence=lease.fencing_token, expires=lease.expires_at)
if mode == "crash":
    os._exit(0)  # gone without releasing, as a crashed host
seen = lease.expires_at
while True:
    time.sleep(0.02)
    if not lease.valid:
        say(lost=True)
        break
    if lease.expires_at != seen:
        seen = lease.expires_at
        say(expires=seen)
time.sleep(3600)
"""

NAMESPACE_SCRIPT = (
    'mount --bind "$FAKE_BOOT" /proc/sys/kernel/random/boot_id'
    ' && { [ ! -e /etc/machine-id ] || mount --bind "$FAKE_MACHINE" /etc/machine-id; }'
    ' && hostname lockkit-other-host && exec "$@"'
)


class OtherHost:
    """Runs CHILD as another machine and collects its JSON events."""

    def __init__(self, variant: str, work: Path) -> None:
        self.variant = variant
        self.env = {k: v for k, v in os.environ.items() if k != "LOCKKIT_FILE_TEST_IDENTITY"}
        self.prefix: list[str] = []
        if variant == "override":
            self.boot = "boot-one"
            self.env["LOCKKIT_FILE_TEST_IDENTITY"] = f"host-one/{self.boot}"
        else:
            self.boot = f"fake-boot-{secrets.token_hex(8)}"
            (work / "boot_id").write_text(self.boot + "\n")
            (work / "machine-id").write_text(secrets.token_hex(16) + "\n")
            self.env.update(FAKE_BOOT=str(work / "boot_id"), FAKE_MACHINE=str(work / "machine-id"))
            self.prefix = ["unshare", "-rmu", "sh", "-c", NAMESPACE_SCRIPT, "sh"]
        self.procs: list[subprocess.Popen[str]] = []
        self.readers: list[threading.Thread] = []
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()

    def start(self, mode: str, url: str, name: str, ttl: float) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [*self.prefix, sys.executable, "-c", CHILD, mode, url, name, str(ttl)],
            stdout=subprocess.PIPE,
            text=True,
            env=self.env,
        )
        self.procs.append(proc)
        reader = threading.Thread(target=self._read, args=(proc,), daemon=True)
        reader.start()
        self.readers.append(reader)
        return proc

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.events.put(json.loads(line))

    def next_event(self, timeout: float = 30) -> dict[str, Any]:
        return self.events.get(timeout=timeout)

    def drain(self) -> list[dict[str, Any]]:
        out = []
        while not self.events.empty():
            out.append(self.events.get_nowait())
        return out

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(30)
        for reader in self.readers:
            reader.join(30)  # it reads on to the end of the pipe, then the pipe can be closed
        for proc in self.procs:
            if proc.stdout is not None:
                proc.stdout.close()


def _namespaces_work(work: Path) -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = work / "probe"
    probe.write_text("probe\n")
    done = subprocess.run(
        ["unshare", "-rmu", "sh", "-c", f'mount --bind "{probe}" /proc/sys/kernel/random/boot_id && hostname x'],
        capture_output=True,
        timeout=30,
    )
    return done.returncode == 0


@pytest.fixture(params=["namespace", "override"])
def other_host(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[OtherHost]:
    work = tmp_path / "other-host"
    work.mkdir()
    if request.param == "namespace" and not _namespaces_work(work):
        pytest.skip("unprivileged user namespaces are not available here")
    host = OtherHost(request.param, work)
    try:
        yield host
    finally:
        host.stop()


@pytest.fixture
def lock_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("LOCKKIT_FILE_TEST_IDENTITY", raising=False)  # this process is the real host
    return tmp_path / "locks"


def _driver(directory: Path) -> FileDriver:
    return FileDriver.from_url(parse_url(directory.as_uri()), DriverContext())


def _read_record(path: Path) -> dict[str, Any]:
    fd = os.open(path, os.O_RDONLY)
    try:
        record = file_record.read(fd)[1]
    finally:
        os.close(fd)
    assert record is not None
    return record


def _lock_record(directory: Path, name: str) -> dict[str, Any]:
    return _read_record(directory / f"{hashlib.sha256(name.encode()).hexdigest()}.lock")


def _token() -> str:
    return secrets.token_hex(16)


def test_A5_second_host_never_takes_a_live_lock_of_the_first(other_host: OtherHost, lock_dir: Path) -> None:
    host2 = _driver(lock_dir)
    other_host.start("hold", lock_dir.as_uri(), "x", TTL)
    held = other_host.next_event()
    assert _lock_record(lock_dir, "x")["boot"] == other_host.boot, "the simulated host identity is not in effect"

    # Host 1 keeps renewing. For twice the window, host 2 must never get the lock: every renewal is a new
    # record, so host 2's count starts again.
    watch_until = time.monotonic() + 2 * WINDOW
    while time.monotonic() < watch_until:
        grant = host2.acquire("x", _token(), TTL, 0)
        assert grant is None, f"host 2 took a lock host 1 holds (host 1 said: {other_host.drain()})"
        assert host2.holder("x").held
        time.sleep(0.2)
    events = other_host.drain()
    assert not any(e.get("lost") for e in events), events
    assert any("expires" in e for e in events), "host 1 never renewed: the test proved nothing"

    # Host 1 stops (crashes). Host 2 gets the lock, but only once host 1's last lease has ended.
    other_host.stop()
    last_written = float(_lock_record(lock_dir, "x")["expires"])  # host 1's monotonic = ours, on this machine
    last_lease = max(float(e["expires"]) for e in [held, *events, *other_host.drain()] if "expires" in e)
    grant = host2.acquire("x", _token(), TTL, time.monotonic() + 60)
    assert grant is not None, "host 2 never took over the lock of a host that stopped"
    taken_at = float(_lock_record(lock_dir, "x")["expires"]) - TTL  # the `now` host 2 took it at
    assert taken_at >= last_written >= last_lease
    assert grant.fencing_token == held["fence"] + 1


def test_A5_a_dead_hosts_record_is_taken_over_after_its_ttl_and_margin(other_host: OtherHost, lock_dir: Path) -> None:
    proc = other_host.start("crash", lock_dir.as_uri(), "x", 1.0)
    held = other_host.next_event()
    proc.wait(30)
    assert _lock_record(lock_dir, "x")["boot"] == other_host.boot, "the simulated host identity is not in effect"
    time.sleep(1.5)  # its TTL has passed on its own clock, which this host cannot read

    # No clock tells this host how old the record is: it waits out ttl + margin from its first sighting...
    assert _driver(lock_dir).acquire("x", _token(), 5, 0) is None
    time.sleep(1.0 + max(2.0, 1.0) + 0.5)
    # ...which every process of this host shares (the sighting is in the record): a new one takes it at once.
    grant = _driver(lock_dir).acquire("x", _token(), 5, 0)
    assert grant is not None and grant.fencing_token == held["fence"] + 1
    assert _lock_record(lock_dir, "x")["seen"] == {}


def test_A5_presence_of_another_host_is_neither_dropped_nor_overwritten(other_host: OtherHost, lock_dir: Path) -> None:
    here = _driver(lock_dir)
    proc = other_host.start("announce", lock_dir.as_uri(), "fleet", 60)
    other_host.next_event()
    proc.wait(30)
    path = lock_dir / f"presence-{hashlib.sha256(b'fleet').hexdigest()}.lock"
    assert _read_record(path)["other-host"]["boot"] == other_host.boot, "the simulated host identity is not in effect"

    here.announce("fleet", "this-host", "new", 60)
    assert here.members("fleet") == {"other-host": "old", "this-host": "new"}
    assert set(_read_record(path)) == {"other-host", "this-host"}


def test_A5_records_written_before_host_identities_are_read_as_this_hosts(lock_dir: Path) -> None:
    driver = _driver(lock_dir)
    path = driver._path("x")
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()

    def write_old_format(boot: str, expires: float, fence: int) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            seq = file_record.read(fd)[0]
            old = {"name": "x", "boot": boot, "token": "a" * 32, "expires": expires, "fence": fence, "waiters": []}
            file_record.write(fd, seq, old, False)
        finally:
            os.close(fd)

    # Written on this boot: its monotonic expiry is ours, as before.
    write_old_format(boot, time.monotonic() + 60, 7)
    assert driver.acquire("x", "b" * 32, 5, 0) is None
    record = _lock_record(lock_dir, "x")
    assert record["token"] == "a" * 32 and 50 < record["ttl"] <= 60, "a later reader on another host needs its ttl"
    assert record["host"] == driver._id.host

    # Written on an earlier boot of this host: the holder is gone, the fencing counter carries on.
    write_old_format("an-earlier-boot", 1e12, 7)
    grant = driver.acquire("x", "b" * 32, 5, 0)
    assert grant is not None and grant.fencing_token == 8


# -- network filesystems ----------------------------------------------------------------------------

MOUNTINFO = r"""22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
25 22 0:21 / /dev/shm rw,nosuid,nodev shared:4 - tmpfs tmpfs rw
40 22 0:45 / /mnt/share rw,relatime shared:20 - nfs4 fs1:/export rw,vers=4.2
41 40 8:2 / /mnt/share/local rw,relatime shared:21 - ext4 /dev/sda2 rw
42 22 0:46 / /mnt/with\040space rw shared:22 - cifs //fs2/share rw
43 22 0:47 / /mnt/ssh rw - fuse.sshfs me@fs3:/ rw,user_id=1000
44 22 0:48 / /run/user/1000/containers rw - fuse.fuse-overlayfs fuse-overlayfs rw
45 22 0:49 / /mnt/share rw master:9 - ext4 /dev/sdb1 rw
"""


def test_A5_mountinfo_gives_the_type_of_the_mount_that_holds_the_directory() -> None:
    from lockkit.drivers.embedded.file_fs import mount_fstype

    assert mount_fstype("/var/lib/app", MOUNTINFO) == "ext4"
    assert mount_fstype("/dev/shm/locks", MOUNTINFO) == "tmpfs"
    assert mount_fstype("/mnt/share/local/locks", MOUNTINFO) == "ext4"  # a local mount inside the share
    assert mount_fstype("/mnt/with space/locks", MOUNTINFO) == "cifs"  # octal-escaped mount point
    assert mount_fstype("/mnt/ssh/locks", MOUNTINFO) == "fuse.sshfs"
    assert mount_fstype("/mnt/sshfoo", MOUNTINFO) == "ext4"  # a prefix of a name is not a parent directory
    # /mnt/share was mounted over later (line 45): the last mount on a mount point is the one seen
    assert mount_fstype("/mnt/share/x", MOUNTINFO) == "ext4"
    assert (
        mount_fstype("/mnt/share/x", MOUNTINFO.replace("45 22 0:49 / /mnt/share rw", "45 22 0:49 / /mnt/other rw"))
        == "nfs4"
    )


def test_A5_network_and_cluster_filesystems_are_recognised() -> None:
    from lockkit.drivers.embedded.file_fs import FUSE_MAGIC, classify

    ext4, tmpfs = 0xEF53, 0x01021994
    assert classify(0x6969, None) == "nfs"
    assert classify(0x6969, "nfs4") == "nfs4"
    assert classify(0xFF534D42, "cifs") == "cifs"
    assert classify(0xFE534D42, None) == "smb2"
    assert classify(0x01021997, "9p") == "9p"
    assert classify(0x00C36400, None) == "ceph"
    assert classify(None, "nfs4") == "nfs4"  # statfs unavailable: mountinfo alone decides
    assert classify(FUSE_MAGIC, "fuse.sshfs") == "fuse.sshfs"
    assert classify(FUSE_MAGIC, "virtiofs") == "virtiofs"
    assert classify(FUSE_MAGIC, None) == "fuse"  # cannot tell where a FUSE filesystem's data lives
    assert classify(FUSE_MAGIC, "fuseblk") is None  # ntfs-3g on a local disk
    assert classify(FUSE_MAGIC, "fuse.fuse-overlayfs") is None  # a rootless container's root
    assert classify(ext4, "ext4") is None
    assert classify(tmpfs, "tmpfs") is None
    assert classify(None, None) is None


def test_A5_a_local_directory_is_accepted(tmp_path: Path) -> None:
    from lockkit.drivers.embedded.file_fs import NETWORK_MAGIC, shared_filesystem, statfs_magic

    magic = statfs_magic(str(tmp_path))
    assert magic is not None and magic not in NETWORK_MAGIC
    assert shared_filesystem(tmp_path) is None
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        assert statfs_magic(str(shm)) == 0x01021994  # TMPFS_MAGIC: statfs really reads f_type
        assert shared_filesystem(shm) is None
    with lockkit.connect((tmp_path / "locks").as_uri()) as locks, locks.lock("x"):
        pass


def test_A5_a_network_directory_is_refused_unless_single_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from lockkit.drivers.embedded import file_fs

    monkeypatch.setattr(file_fs, "shared_filesystem", lambda directory: "nfs4")
    url = (tmp_path / "locks").as_uri()
    with pytest.raises(ConfigError, match=r"network filesystem \(nfs4\).*server backend.*single_host=true"):
        lockkit.connect(url)
    with lockkit.connect(url + "?single_host=true") as locks, locks.lock("x"):
        pass


def test_A5_a_malformed_test_identity_is_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCKKIT_FILE_TEST_IDENTITY", "no-slash")
    with pytest.raises(ConfigError, match="HOST/BOOT"):
        lockkit.connect((tmp_path / "locks").as_uri())
