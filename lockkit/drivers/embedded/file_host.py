"""Who writes a ``file://`` record: the host (stable across reboots) and the boot (whose clock it uses).

A record's expiry is on ``CLOCK_MONOTONIC``, which only processes of one running kernel share. So a
reader has to know whose clock an expiry is on before it can use it:

- the same **boot** id: the same kernel, the same clock (also containers of one host);
- the same **host** but another boot: this machine rebooted, so its holders are gone;
- another host and another boot: another machine sharing the directory; its clock means nothing here.

The host id is derived from ``/etc/machine-id`` (or D-Bus's copy) plus the host name. It is a hash of
the machine id, not the id itself: machine-id(5) asks applications not to expose it. The name guards
against cloned images that kept one machine id, and a name that changed only makes this host's old
records look foreign, which delays a takeover but never allows two holders. Without a machine id, a
random id kept in the user's state directory stands in for it.

``LOCKKIT_FILE_TEST_IDENTITY=HOST/BOOT`` replaces both, so that a test can run a second "machine" as a
child process on one directory. It is for tests only: it is not a driver option, and lockkit logs a
warning whenever it is in effect.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import secrets
import socket
from dataclasses import dataclass
from pathlib import Path

from ...config import default_state_dir
from ...errors import ConfigError

log = logging.getLogger("lockkit")

TEST_IDENTITY_ENV = "LOCKKIT_FILE_TEST_IDENTITY"
_MACHINE_ID_FILES = (Path("/etc/machine-id"), Path("/var/lib/dbus/machine-id"))
_BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")


@dataclass(frozen=True)
class HostIdentity:
    host: str
    """Stable across reboots: ``hash(machine-id)/hostname``."""
    boot: str
    """This kernel boot: records with this boot id share this process's monotonic clock."""
    hostname: str
    """For messages only."""


def current() -> HostIdentity:
    """This process's identity, or the simulated one of ``LOCKKIT_FILE_TEST_IDENTITY``."""
    override = os.environ.get(TEST_IDENTITY_ENV)
    if override:
        host, sep, boot = override.partition("/")
        if not sep or not host or not boot:
            raise ConfigError(f"{TEST_IDENTITY_ENV} must be HOST/BOOT (for tests only), got {override!r}; unset it")
        log.warning(
            "file:// simulates host %r boot %r because %s is set (for tests only)", host, boot, TEST_IDENTITY_ENV
        )
        return HostIdentity(host, boot, host)
    hostname = socket.gethostname()
    machine = hashlib.sha256(b"lockkit file:// host\0" + _machine_id().encode()).hexdigest()[:32]
    return HostIdentity(f"{machine}/{hostname}", _boot_id(), hostname)


def _boot_id() -> str:
    try:
        return _BOOT_ID_FILE.read_text().strip() or "unknown"
    except OSError:
        return "unknown"


def _machine_id() -> str:
    for path in _MACHINE_ID_FILES:
        with contextlib.suppress(OSError):
            value = path.read_text().strip()
            if value and value != "uninitialized":
                return value
    return _state_host_id()


def _state_host_id() -> str:
    """A random id kept per user, for systems without a machine id (minimal containers)."""
    path = default_state_dir().parent / "host-id"
    with contextlib.suppress(OSError):
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            # Written aside and linked into place, so that a concurrent reader never sees an empty file and
            # the first of two racing processes wins.
            draft = path.with_name(f".host-id-{os.getpid()}-{secrets.token_hex(4)}")
            draft.write_text(secrets.token_hex(16) + "\n")
            with contextlib.suppress(FileExistsError):
                os.link(draft, path)
            draft.unlink()
        value = path.read_text().strip()
        if value:
            return value
    # Nothing to go by but the host name: two machines with one name would look like one host rebooting.
    return "no-machine-id"
