"""``file:///dir``: locks shared by the processes of one host (the embedded default).

Layout: one file per lock name in ``dir``, named by the SHA-256 of the name (so
any name fits a file name and two names never share one), ``flock()``ed for
every read-modify-write and holding the record
``{"name", "token", "expires", "ttl", "host", "hostname", "boot", "fence", "waiters", "seen"}``
in two checksummed slots written alternately (:mod:`.file_record`), so a crash never
leaves it half-written; ``fsync=true`` also makes the fencing counter survive
a power loss. Expiry is stored on the monotonic clock (``time.monotonic()``),
which Linux, macOS and the BSDs keep system-wide, together with the identity of
the holder's host and boot (:mod:`.file_host`): after a reboot every lock is
free (its holder is gone) while the fencing counter carries on.

One host only. A directory on a network filesystem is refused (:mod:`.file_fs`)
unless ``single_host=true``. Should another machine's record turn up anyway, its
monotonic expiry means nothing here, and no other clock is trusted either: the
record counts as held until this host has seen it unchanged for its ``ttl`` plus
:func:`foreign_margin`, timed on this host's monotonic clock. The first sighting
is kept in the record's ``seen`` (per host and boot), so every process of this
host counts from the same instant. Records written before host identities were
stored are read as this host's, as before.

Waking waiters: each waiter binds a Unix datagram socket (in Linux's abstract
namespace, or a socket file: :mod:`.file_wakeup`, option ``wakeup``) and
appends its address to the record's ``waiters``; a release sends one datagram
to the first live waiter. A waiter that gives up while the lock is free passes
the wake-up on. The one re-check at the holder's expiry lets a crashed
holder's lock be taken over when its TTL passes. Linux, macOS and the BSDs;
not Windows (no ``flock``, no Unix datagram sockets): a ``ConfigError``.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import secrets
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ...driver import Cancel, DriverContext, Grant, Guarantees, HolderInfo, Offer, RenewRequest, renew_each
from ...errors import BackendUnavailable, ConfigError
from ...lease import token_hint
from ...urls import BackendURL, parse_options
from . import file_fs, file_host, file_record, file_wakeup
from .slot import Slot

if sys.platform != "win32":  # importable everywhere (the registry lists every driver); from_url refuses Windows
    import fcntl

MAX_WAITERS = 1024
"""Beyond this many registered waiters a newcomer only re-checks at the holder's expiry (bounds the record)."""

MAX_WAITER_BYTES = 40960
"""The same bound on the addresses' total length (socket file paths are longer than abstract names): the whole
record has to fit one slot of :mod:`.file_record`, with the name and the other hosts' sightings."""

UNCERTAIN_SLACK = 1.0
"""How far beyond ``now + ttl`` an expiry of an unknown boot may be before it counts as a previous boot's: the
invariant is exact, the slack allows for a monotonic clock a little out of step between CPUs."""

FOREIGN_POLL = 1.0
"""How often a waiter re-checks a lock another host holds: that host's release cannot wake us."""


def foreign_margin(ttl: float) -> float:
    """What another host's record is respected for beyond its ``ttl``, counted from our first sighting.

    The sighting comes after the write, so the holder's lease ended at most ``ttl`` later; the margin covers
    two clocks ticking at slightly different rates and a network filesystem showing the write late.
    """
    return max(2.0, ttl)


@dataclass(frozen=True)
class FileOptions:
    fsync: bool = False
    """fsync every change (slower; keeps fencing counters across power loss)."""
    single_host: bool = False
    """Accept a directory on a network filesystem: the user vouches that only this host ever uses it."""
    wakeup: str = "auto"
    """How releases wake waiters (:mod:`.file_wakeup`): ``abstract`` sockets (Linux), socket ``files`` in the
    lock directory (everywhere), or ``auto``: the abstract namespace on Linux, socket files elsewhere."""

    def __post_init__(self) -> None:
        if self.wakeup not in file_wakeup.MODES:
            raise ConfigError(
                f"wakeup must be one of {', '.join(file_wakeup.MODES)}, not {self.wakeup!r}; "
                "leave it out for auto, the right one for this platform"
            )


@dataclass(frozen=True)
class _Holder:
    """The holder's fields exactly as read, rewritten verbatim while nobody changes the holder."""

    expires: float
    ttl: float
    host: str
    hostname: str
    boot: str


@dataclass
class _Record:
    slot: Slot
    waiters: list[str]
    ttl: float = 0.0
    """The validity the holder's last take or renew gave it: what another host waits out."""
    read: _Holder | None = None
    effective: tuple[str | None, float] = (None, 0.0)
    """``(token, expires)`` as decoded (on this host's clock); a difference at write time means a new holder."""
    seen: dict[str, list[Any]] = field(default_factory=dict)
    """``{host: [boot, monotonic, fingerprint]}``: when each other host first saw this holder."""


class FileDriver:
    guarantees: ClassVar[Guarantees] = Guarantees(
        scope="host",
        fifo=False,
        fencing="strict",
        survives_failover=False,
        lifetime="ttl",
        note="Processes of one host; the default when nothing is configured.",
        semaphores=Offer("yes"),
    )

    def __init__(self, directory: Path, options: FileOptions, ctx: DriverContext) -> None:
        self.directory = directory
        self._options = options
        self._clock = ctx.clock
        self._id = file_host.current()
        self._wakeup = file_wakeup.Wakeup(directory, file_wakeup.resolve_mode(options.wakeup))
        # (group, member) -> (its record's mark, when this process first saw it): other hosts' presence records
        self._sightings: dict[tuple[str, str], tuple[str, float]] = {}

    @classmethod
    def from_url(cls, url: BackendURL, ctx: DriverContext) -> FileDriver:
        if url.username or url.password or any(port is not None for _, port in url.hosts):
            raise ConfigError(f"file:// takes a directory path, e.g. file:///var/lib/app/locks, not {url}")
        host = url.hosts[0][0] if url.hosts else ""
        if host not in ("", "localhost", ".", ".."):
            raise ConfigError(f"file:// paths are local: use file:///absolute/path or file://./relative, not {url}")
        raw = url.path if host in ("", "localhost") else host + url.path
        if not raw or raw == "/":
            raise ConfigError(f"file:// needs a directory path, e.g. file:///tmp/locks; got {url}")
        if "\0" in raw:  # from %00: the file system takes no NUL, and pathlib refused it with a bare ValueError
            raise ConfigError(f"the file:// directory path of {str(url)!r} contains a NUL character (%00); remove it")
        options = parse_options(FileOptions, url.options, url)
        file_wakeup.resolve_mode(options.wakeup)  # Windows, or wakeup=abstract off Linux: say so before any file
        directory = Path(raw)
        try:
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            probe = directory / f".probe-{os.getpid()}-{secrets.token_hex(4)}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise ConfigError(
                f"lock directory {directory} is not writable ({exc.strerror}); fix its permissions "
                "or point file:// elsewhere"
            ) from None
        shared = None if options.single_host else file_fs.shared_filesystem(directory)
        if shared is not None:
            raise ConfigError(
                f"lock directory {directory} is on a network filesystem ({shared}): file:// locks only the "
                "processes of one host, and a directory that several machines mount gives each of them the "
                "lock. For locks across machines use a server backend (redis://, etcd://, zookeeper://); "
                "otherwise put the directory on a local disk, or add ?single_host=true to the URL if only "
                "this host ever uses it"
            )
        return cls(directory, options, ctx)

    # -- the record ------------------------------------------------------------------------

    def _path(self, name: str) -> Path:
        return self.directory / f"{hashlib.sha256(name.encode('utf-8')).hexdigest()}.lock"

    def _locked(self, name: str) -> contextlib.AbstractContextManager[tuple[_Record, float]]:
        """Hold the name's flock; yield its record and the monotonic now; write it back if changed."""
        return file_record.flocked(
            str(self._path(name)),
            "lock file",
            lambda raw, now: self._decode(name, raw, now),
            lambda record: self._encode(name, record),
            self._options.fsync,
        )

    def _decode(self, name: str, raw: dict[str, Any] | None, now: float) -> _Record:
        if raw is None:
            return _Record(Slot(), [])
        if raw["name"] != name:
            raise ValueError("the record belongs to another name")
        slot = Slot(raw["token"], float(raw["expires"]), int(raw["fence"]))
        waiters = [str(w) for w in raw["waiters"]]
        # A record without a host was written before hosts were recorded, under the one-host rule: ours.
        host, boot = str(raw.get("host", self._id.host)), str(raw.get("boot"))
        relation = self._id.relation(host, boot)
        if relation == "rebooted":
            slot.token, slot.expires = None, 0.0  # this host rebooted: every holder and waiter is gone
            return _Record(slot, [])
        if slot.token is None:
            return _Record(slot, waiters)
        foreign = relation == "foreign"
        ttl = raw.get("ttl")
        if ttl is None:
            if foreign:
                raise ValueError("another host's record has no ttl")
            ttl = max(0.0, slot.expires - now)  # an older record of ours: what it has left is all it needs
        elif relation == "uncertain" and slot.expires > now + float(ttl) + UNCERTAIN_SLACK:
            # No boot id to compare, but on one boot's clock an expiry is never more than its ttl ahead: this
            # one is on an earlier boot's clock, so this host rebooted since (file_host.HostIdentity.relation).
            slot.token, slot.expires = None, 0.0
            return _Record(slot, waiters)
        read = _Holder(slot.expires, float(ttl), host, str(raw.get("hostname", "")), boot)
        seen = {str(h): list(s) for h, s in (raw.get("seen") or {}).items()}
        if foreign:
            # Its expiry is on another machine's monotonic clock: count on ours, from our first sighting.
            mark = f"{boot}|{slot.expires!r}|{token_hint(slot.token)}"
            seen = {h: s for h, s in seen.items() if len(s) == 3 and s[2] == mark}  # sightings of older holders
            sighting = seen.get(self._id.host)
            if sighting is None or sighting[0] != self._id.boot:
                sighting = seen[self._id.host] = [self._id.boot, now, mark]
            slot.expires = float(sighting[1]) + read.ttl + foreign_margin(read.ttl)
        return _Record(slot, waiters, read.ttl, read, (slot.token, slot.expires), seen)

    def _encode(self, name: str, record: _Record) -> dict[str, Any]:
        slot, read = record.slot, record.read
        if read is not None and (slot.token, slot.expires) == record.effective:
            # The same holder: its fields stay as it wrote them (another host's expiry is on its own clock).
            holder = {"expires": read.expires, "ttl": read.ttl, "host": read.host, "hostname": read.hostname}
            boot, seen = read.boot, record.seen
        else:
            holder = {"expires": slot.expires, "ttl": record.ttl, "host": self._id.host, "hostname": self._id.hostname}
            boot, seen = self._id.boot, {}
        return {
            "name": name,
            "boot": boot,
            "token": slot.token,
            **holder,
            "fence": slot.fence,
            "waiters": record.waiters,
            "seen": seen,
        }

    # -- waking ------------------------------------------------------------------------------

    def _wake_first(self, record: _Record) -> None:
        """Send one wake-up to the first waiter still alive; drop dead addresses on the way."""
        self._wakeup.wake_first(record.waiters)

    @staticmethod
    def _room_for(waiters: list[str], address: str) -> bool:
        if len(waiters) >= MAX_WAITERS:
            return False
        return sum(len(w) + 3 for w in waiters) + len(address) + 3 <= MAX_WAITER_BYTES  # 3: quotes and comma

    # -- the driver contract ------------------------------------------------------------------

    def acquire(
        self, name: str, token: str, ttl: float, deadline: float | None, cancel: Cancel | None = None
    ) -> Grant | None:
        waiter: file_wakeup.Waiter | None = None
        address = ""
        unhook = None
        try:
            while True:
                sent_at = self._clock()
                with self._locked(name) as (record, now):
                    fence = record.slot.take(token, ttl, now)
                    if fence is not None:
                        record.ttl = ttl
                        if address in record.waiters:
                            record.waiters.remove(address)
                        return Grant(fence, ttl, sent_at)
                    hint = record.slot.wait_hint(now)
                    if hint is not None and record.read is not None and record.read.host != self._id.host:
                        # Another machine (or a container with its own network namespace): its release
                        # cannot reach our socket, so look again now and then.
                        hint = min(hint, FOREIGN_POLL)
                    if waiter is not None and address not in record.waiters and self._room_for(record.waiters, address):
                        record.waiters.append(address)
                if cancel is not None and cancel.cancelled:
                    return None
                left = None if deadline is None else deadline - self._clock()
                if left is not None and left <= 0:
                    return None
                if waiter is None:
                    waiter = self._wakeup.waiter()
                    address = waiter.address
                    if cancel is not None:
                        unhook = cancel.on_cancel(functools.partial(self._wakeup.poke, address))
                    continue  # register, then re-check before sleeping: a release may have come between
                waits = [w for w in (hint, left) if w is not None]
                waiter.sleep(max(0.0005, min(waits)) if waits else None)
        finally:
            if unhook is not None:
                unhook()
            if waiter is not None:
                waiter.close()
                self._leave(name, address)

    def _leave(self, name: str, address: str) -> None:
        with self._locked(name) as (record, now):
            if address in record.waiters:
                record.waiters.remove(address)
            if record.slot.holder(now) is None:
                self._wake_first(record)  # we may have swallowed the wake-up meant for the lock being free

    def renew(self, name: str, token: str, ttl: float) -> Grant | None:
        sent_at = self._clock()
        with self._locked(name) as (record, now):
            if not record.slot.renew(token, ttl, now):
                return None
            record.ttl = ttl
            return Grant(record.slot.fence, ttl, sent_at)

    def renew_many(self, requests: Sequence[RenewRequest]) -> list[Grant | Exception | None]:
        return renew_each(self, requests)

    def _release(self, name: str, token: str | None) -> bool:
        with self._locked(name) as (record, now):
            if not record.slot.release(token, now):
                return False
            self._wake_first(record)
            return True

    def release(self, name: str, token: str) -> bool:
        return self._release(name, token)

    def force_release(self, name: str) -> bool:
        return self._release(name, None)

    def holder(self, name: str) -> HolderInfo:
        with self._locked(name) as (record, now):
            token = record.slot.holder(now)
            if token is None:
                return HolderInfo(False, waiters=len(record.waiters))
            return HolderInfo(
                True, token_hint(token), record.slot.fence, record.slot.expires - now, len(record.waiters)
            )

    # -- presence (migrate:// fleet safety): one JSON map per group, replaced under the group's flock --

    @contextlib.contextmanager
    def _presence(self, group: str) -> Iterator[dict[str, Any]]:
        """The group's live records (``{member: {value, expires, ttl, boot, host}}``), written back on exit."""
        path = self.directory / f"presence-{hashlib.sha256(group.encode('utf-8')).hexdigest()}.lock"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:  # the driver contract: only LockError subclasses leave a driver
            raise BackendUnavailable(
                f"cannot open presence file {path}: {exc.strerror}; check that the lock directory exists and is "
                "writable"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                seq, raw = file_record.read(fd)
            except (file_record.CorruptRecord, OSError) as exc:
                raise BackendUnavailable(f"presence file {path} is unreadable ({exc}); delete it") from None
            now = time.monotonic()
            try:
                live = {m: r for m, r in (raw or {}).items() if self._present(group, m, r, now)}
            except (TypeError, ValueError, AttributeError) as exc:  # checksummed but not what this version writes
                raise BackendUnavailable(
                    f"presence file {path} holds a record this version cannot read ({exc}); delete it"
                ) from None
            self._sightings = {k: t for k, t in self._sightings.items() if k[0] != group or k[1] in live}
            yield live
            try:
                file_record.write(fd, seq, live, self._options.fsync)
            except OSError as exc:
                raise BackendUnavailable(
                    f"cannot write presence file {path}: {exc.strerror}; check free space and the permissions of "
                    "the lock directory"
                ) from None
            except ValueError as exc:  # more members than one record slot holds
                raise BackendUnavailable(
                    f"presence file {path} cannot hold this group any more ({exc}); use fewer members per group, "
                    "or a server backend for the migration's presence records"
                ) from None
        finally:
            os.close(fd)

    def _present(self, group: str, member: str, record: dict[str, Any], now: float) -> bool:
        """Whether a presence record is alive; another machine's counts from our first sighting, as locks do."""
        expires = record.get("expires")
        if expires is None:
            return True
        boot = str(record.get("boot"))
        relation = self._id.relation(str(record.get("host", self._id.host)), boot)
        if relation == "same":
            return float(expires) > now
        if relation == "rebooted":
            return False  # this host rebooted: the member is gone
        ttl = float(record.get("ttl") or 0.0)
        if relation == "uncertain":  # as for locks: beyond its ttl ahead, it is an earlier boot's
            return now < float(expires) <= now + ttl + UNCERTAIN_SLACK
        mark = f"{boot}|{expires!r}"
        seen = self._sightings.get((group, member))
        if seen is None or seen[0] != mark:
            seen = self._sightings[(group, member)] = (mark, now)  # a new beat: count from here
        return now < seen[1] + ttl + foreign_margin(ttl)

    def announce(self, group: str, member: str, value: str, ttl: float | None) -> None:
        with self._presence(group) as live:
            expires = None if ttl is None else time.monotonic() + ttl
            live[member] = {
                "value": value,
                "expires": expires,
                "ttl": ttl,
                "boot": self._id.boot,
                "host": self._id.host,
            }

    def withdraw(self, group: str, member: str) -> None:
        with self._presence(group) as live:
            live.pop(member, None)

    def members(self, group: str) -> dict[str, str]:
        with self._presence(group) as live:
            return {m: str(r["value"]) for m, r in live.items()}

    def permits(self, events: object = None) -> Any:
        """Semaphores and reader-writer locks (:mod:`.file_permits`), one ``.sem`` file per name."""
        from .file_permits import FilePermits

        return FilePermits(self)

    def ping(self) -> None:
        if not os.access(self.directory, os.W_OK):
            raise BackendUnavailable(
                f"lock directory {self.directory} is not writable; fix its permissions or point file:// elsewhere"
            )

    def close(self) -> None:
        pass
