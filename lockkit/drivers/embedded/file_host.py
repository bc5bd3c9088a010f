"""Who writes a ``file://`` record: the host (stable across reboots) and the boot (whose clock it uses).

A record's expiry is on ``CLOCK_MONOTONIC``, which only processes of one running kernel share. So a
reader has to know whose clock an expiry is on before it can use it:

- the same **boot** id: the same kernel, the same clock (also containers of one host);
- the same **host** but another boot: this machine rebooted, so its holders are gone;
- another host and another boot: another machine sharing the directory; its clock means nothing here.

The boot id is the kernel's own per-boot random id: ``/proc/sys/kernel/random/boot_id`` on Linux,
``kern.bootsessionuuid`` on macOS, ``kern.boot_id`` on FreeBSD 13+ (both through ``sysctlbyname(3)``). Not the
boot *time* (``kern.boottime``): the kernel recomputes it whenever the wall clock is stepped, so two processes
of one boot could read two values, and this host's live holders would look like a previous boot's. Where no
boot id can be read it is ``unknown``, and :meth:`HostIdentity.relation` never concludes a reboot from it (see
there): the safe side is to take the record for this boot's, and an expiry further ahead than its ``ttl`` still
gives a previous boot away.

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
import ctypes
import hashlib
import logging
import os
import secrets
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ...config import default_state_dir
from ...errors import ConfigError

log = logging.getLogger("lockkit")

TEST_IDENTITY_ENV = "LOCKKIT_FILE_TEST_IDENTITY"
_MACHINE_ID_FILES = (Path("/etc/machine-id"), Path("/var/lib/dbus/machine-id"))
_BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")
_BOOT_ID_SYSCTLS = (("kern.bootsessionuuid", "text"), ("kern.boot_id", "bytes"))
"""macOS's boot session UUID (a string); FreeBSD's 16 random bytes of this boot (shown as hex)."""
UNKNOWN_BOOT = "unknown"
"""The boot id where none can be read: it tells nothing about whether two records come from one boot."""

Relation = Literal["same", "uncertain", "rebooted", "foreign"]


@dataclass(frozen=True)
class HostIdentity:
    host: str
    """Stable across reboots: ``hash(machine-id)/hostname``."""
    boot: str
    """This kernel boot: records with this boot id share this process's monotonic clock."""
    hostname: str
    """For messages only."""

    def relation(self, host: str, boot: str) -> Relation:
        """Whose clock a record written by ``host`` during ``boot`` is on, as seen from this process.

        - ``same``: this boot's clock (the same known boot id; containers of one host too);
        - ``rebooted``: this host's, from an earlier boot: its holders are gone;
        - ``uncertain``: this host's, but a boot id is unknown: read as this boot's clock. Within one boot an
          expiry is never more than its ``ttl`` ahead of the clock, so one that is must be a previous boot's;
          one that is not is respected, which after a reboot delays a takeover by at most its ``ttl``;
        - ``foreign``: another machine's: its clock means nothing here. Two hosts that both lack a boot id
          are two clocks, not one.
        """
        if boot == self.boot and boot != UNKNOWN_BOOT:
            return "same"
        if host != self.host:
            return "foreign"
        return "uncertain" if UNKNOWN_BOOT in (boot, self.boot) else "rebooted"


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
    """This boot's id: Linux's ``boot_id``, else the first boot-id sysctl there is, else :data:`UNKNOWN_BOOT`."""
    with contextlib.suppress(OSError, UnicodeDecodeError):
        value = _BOOT_ID_FILE.read_text().strip()
        if value:
            return value
    for name, kind in _BOOT_ID_SYSCTLS:
        raw = _sysctl(name)
        if kind == "text" and raw:
            with contextlib.suppress(UnicodeDecodeError):
                value = raw.split(b"\0", 1)[0].decode().strip()
                if value:
                    return value
        elif raw and raw.strip(b"\0"):
            return raw.hex()
    return UNKNOWN_BOOT


def _sysctl(name: str) -> bytes | None:
    """The raw value of sysctl ``name`` through ``sysctlbyname(3)`` (macOS, the BSDs); ``None`` without one.

    Called in-process through ``ctypes`` rather than by running ``sysctl``: no child process (forking a
    threaded program is fragile), no dependence on ``PATH``.
    """
    try:
        sysctlbyname = ctypes.CDLL(None, use_errno=True).sysctlbyname
    except (OSError, AttributeError, TypeError):
        return None  # Linux (glibc has no sysctlbyname), Windows
    sysctlbyname.argtypes = [
        ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t), ctypes.c_void_p, ctypes.c_size_t
    ]  # fmt: skip
    sysctlbyname.restype = ctypes.c_int
    key = name.encode()
    size = ctypes.c_size_t(0)
    if sysctlbyname(key, None, ctypes.byref(size), None, 0) != 0 or not 0 < size.value <= 4096:
        return None
    buf = ctypes.create_string_buffer(size.value)
    if sysctlbyname(key, buf, ctypes.byref(size), None, 0) != 0:
        return None
    return buf.raw[: size.value]


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
