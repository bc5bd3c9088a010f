"""``file:///dir``: locks shared by the processes of one host (the embedded default).

Layout: one file per lock name in ``dir``, named by the SHA-256 of the name (so
any name fits a file name and two names never share one), ``flock()``ed for
every read-modify-write and holding the record
``{"name", "boot", "token", "expires", "fence", "waiters"}`` in two
checksummed slots written alternately (:mod:`._file_record`), so a crash never
leaves it half-written; ``fsync=true`` also makes the fencing counter survive
a power loss. Expiry is stored on ``CLOCK_MONOTONIC``,
which Linux keeps system-wide, together with the boot id: after a reboot every
lock is free (its holder is gone) while the fencing counter carries on.

Waking waiters: each waiter binds a Unix datagram socket in the abstract
namespace and appends its address to the record's ``waiters``; a release
sends one datagram to the first live waiter. A waiter that gives up while the
lock is free passes the wake-up on. The one re-check at the holder's expiry
lets a crashed holder's lock be taken over when its TTL passes. Linux only.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import os
import secrets
import socket
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from ..driver import Cancel, DriverContext, Grant, Guarantees, HolderInfo, RenewRequest, renew_each
from ..errors import BackendUnavailable, ConfigError
from ..lease import token_hint
from ..urls import BackendURL, parse_options
from . import _file_record
from ._slot import Slot

MAX_WAITERS = 1024
"""Beyond this many registered waiters a newcomer only re-checks at the holder's expiry (bounds the record)."""


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


@dataclass(frozen=True)
class FileOptions:
    fsync: bool = False
    """fsync every change (slower; keeps fencing counters across power loss)."""


@dataclass
class _Record:
    slot: Slot
    waiters: list[str]


class FileDriver:
    guarantees: ClassVar[Guarantees] = Guarantees(
        scope="host",
        fifo=False,
        fencing="strict",
        survives_failover=False,
        lifetime="ttl",
        note="Processes of one host; the default when nothing is configured.",
    )

    def __init__(self, directory: Path, options: FileOptions, ctx: DriverContext) -> None:
        self.directory = directory
        self._options = options
        self._clock = ctx.clock
        self._boot = _boot_id()

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
        options = parse_options(FileOptions, url.options, url)
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
        return cls(directory, options, ctx)

    # -- the record ------------------------------------------------------------------------

    def _path(self, name: str) -> Path:
        return self.directory / f"{hashlib.sha256(name.encode('utf-8')).hexdigest()}.lock"

    @contextlib.contextmanager
    def _locked(self, name: str) -> Iterator[tuple[_Record, float]]:
        """Hold the name's flock; yield its record and the monotonic now; write it back if changed."""
        path = self._path(name)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise BackendUnavailable(f"cannot open lock file {path}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                seq, raw = _file_record.read(fd)
                record = self._decode(name, raw)
            except (_file_record.CorruptRecord, ValueError, KeyError, TypeError) as exc:
                raise BackendUnavailable(
                    f"lock file {path} is corrupt ({exc}); delete it to reset this lock (its fencing counter restarts)"
                ) from None
            except OSError as exc:
                raise BackendUnavailable(f"cannot read lock file {path}: {exc.strerror}") from None
            yield record, time.monotonic()
            updated = self._encode(name, record)
            if updated != raw:
                try:
                    _file_record.write(fd, seq, updated, self._options.fsync)
                except OSError as exc:
                    raise BackendUnavailable(f"cannot write lock file {path}: {exc.strerror}") from None
        finally:
            os.close(fd)  # closing drops the flock

    def _decode(self, name: str, raw: dict[str, Any] | None) -> _Record:
        if raw is None:
            return _Record(Slot(), [])
        if raw["name"] != name:
            raise ValueError("the record belongs to another name")
        slot = Slot(raw["token"], float(raw["expires"]), int(raw["fence"]))
        waiters = [str(w) for w in raw["waiters"]]
        if raw.get("boot") != self._boot:
            slot.token, slot.expires, waiters = None, 0.0, []  # rebooted: every holder and waiter is gone
        return _Record(slot, waiters)

    def _encode(self, name: str, record: _Record) -> dict[str, Any]:
        return {
            "name": name,
            "boot": self._boot,
            "token": record.slot.token,
            "expires": record.slot.expires,
            "fence": record.slot.fence,
            "waiters": record.waiters,
        }

    # -- waking ------------------------------------------------------------------------------

    def _wake_first(self, record: _Record) -> None:
        """Send one wake-up to the first waiter still alive; drop dead addresses on the way."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
            # Never block here: we hold the name's flock, and a waiter with a full queue may be waiting for it.
            sender.setblocking(False)
            while record.waiters:
                try:
                    sender.sendto(b"w", "\0" + record.waiters[0])
                    return
                except OSError as exc:
                    if exc.errno in (errno.EAGAIN, errno.ENOBUFS):
                        return  # its queue is full: it has wake-ups pending already
                    record.waiters.pop(0)  # ECONNREFUSED: the waiter's process is gone

    # -- the driver contract ------------------------------------------------------------------

    def acquire(
        self, name: str, token: str, ttl: float, deadline: float | None, cancel: Cancel | None = None
    ) -> Grant | None:
        sock: socket.socket | None = None
        address = ""
        unhook = None
        try:
            while True:
                sent_at = self._clock()
                with self._locked(name) as (record, now):
                    fence = record.slot.take(token, ttl, now)
                    if fence is not None:
                        if address in record.waiters:
                            record.waiters.remove(address)
                        return Grant(fence, ttl, sent_at)
                    hint = record.slot.wait_hint(now)
                    if sock is not None and address not in record.waiters and len(record.waiters) < MAX_WAITERS:
                        record.waiters.append(address)
                if cancel is not None and cancel.cancelled:
                    return None
                left = None if deadline is None else deadline - self._clock()
                if left is not None and left <= 0:
                    return None
                if sock is None:
                    sock, address = self._waiter_socket()
                    if cancel is not None:
                        unhook = cancel.on_cancel(functools.partial(self._poke, address))
                    continue  # register, then re-check before sleeping: a release may have come between
                waits = [w for w in (hint, left) if w is not None]
                sock.settimeout(max(0.0005, min(waits)) if waits else None)
                with contextlib.suppress(TimeoutError):
                    sock.recv(16)
        finally:
            if unhook is not None:
                unhook()
            if sock is not None:
                sock.close()
                self._leave(name, address)

    def _waiter_socket(self) -> tuple[socket.socket, str]:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        address = f"lockkit-{os.getpid()}-{secrets.token_hex(8)}"
        sock.bind("\0" + address)
        return sock, address

    def _poke(self, address: str) -> None:
        with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
            sender.setblocking(False)
            sender.sendto(b"c", "\0" + address)

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
        """The group's live records (``{member: {value, expires, boot}}``), written back on exit."""
        path = self.directory / f"presence-{hashlib.sha256(group.encode('utf-8')).hexdigest()}.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                seq, raw = _file_record.read(fd)
            except (_file_record.CorruptRecord, OSError) as exc:
                raise BackendUnavailable(f"presence file {path} is unreadable ({exc}); delete it") from None
            now = time.monotonic()
            live = {
                m: r
                for m, r in (raw or {}).items()
                if r.get("expires") is None or (r.get("boot") == self._boot and r["expires"] > now)
            }
            yield live
            _file_record.write(fd, seq, live, self._options.fsync)
        finally:
            os.close(fd)

    def announce(self, group: str, member: str, value: str, ttl: float | None) -> None:
        with self._presence(group) as live:
            expires = None if ttl is None else time.monotonic() + ttl
            live[member] = {"value": value, "expires": expires, "boot": self._boot}

    def withdraw(self, group: str, member: str) -> None:
        with self._presence(group) as live:
            live.pop(member, None)

    def members(self, group: str) -> dict[str, str]:
        with self._presence(group) as live:
            return {m: str(r["value"]) for m, r in live.items()}

    def ping(self) -> None:
        if not os.access(self.directory, os.W_OK):
            raise BackendUnavailable(f"lock directory {self.directory} is not writable")

    def close(self) -> None:
        pass
