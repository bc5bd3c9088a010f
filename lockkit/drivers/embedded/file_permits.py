"""``file://`` semaphores and reader-writer locks: one record file per name, beside the lock files.

Layout: ``<dir>/<sha256(name)>.sem``, ``flock()``ed for every read-modify-write, holding in the same two
checksummed slots as lock files (:mod:`.file_record`) the record
``{"name", "host", "boot", "limit", "fence", "holders": {token: [expires, writer]}, "writers": [[token,
expires], …], "waiters": [address, …]}``; the rules are :class:`~.permits.PermitTable`'s. Expiries are on
the monotonic clock of the host and boot recorded: after a reboot every holder and waiter is gone and the
fencing counter carries on. A record written by another machine (a shared directory with
``single_host=true``) is refused with :class:`~lockkit.BackendUnavailable` rather than trusted: its expiries
mean nothing here, and a semaphore has no one holder whose sighting could be timed as locks do.

Waking: a waiter registers its datagram socket (:mod:`.file_wakeup`) in ``waiters``; a release or a writer
that gives up wakes *every* registered waiter, since several permits, or every reader, may go at once. A
waiter re-checks on its own only at the next holder's expiry, and a queued writer also well within its ttl
(its place lapses unless refreshed, so a writer that died stops holding readers back).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import socket
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ...driver import Cancel, Grant, PermitInfo, PermitMode, RenewRequest
from ...errors import BackendUnavailable
from . import file_record, file_wakeup
from .permits import PermitTable

if sys.platform != "win32":
    pass

if TYPE_CHECKING:
    from .file import FileDriver

__all__ = ["FilePermits"]

MAX_PERMIT_WAITERS = 512
"""Beyond this many registered waiters a newcomer only re-checks at the next expiry (bounds the record)."""


class _Record:
    def __init__(self, table: PermitTable, waiters: list[str]) -> None:
        self.table = table
        self.waiters = waiters


class FilePermits:
    """The :class:`~lockkit.driver.PermitDriver` of one :class:`~.file.FileDriver`."""

    def __init__(self, driver: FileDriver) -> None:
        self._driver = driver
        self._clock = driver._clock
        self._id = driver._id
        self._wakeup = driver._wakeup

    def _path(self, name: str) -> str:
        return str(self._driver.directory / f"{hashlib.sha256(name.encode('utf-8')).hexdigest()}.sem")

    def _locked(self, name: str) -> contextlib.AbstractContextManager[tuple[_Record, float]]:
        path = self._path(name)
        return file_record.flocked(
            path,
            "semaphore file",
            lambda raw, _now: self._decode(name, raw, path),
            lambda record: {
                "name": name,
                "host": self._id.host,
                "boot": self._id.boot,
                **record.table.encode(),
                "waiters": record.waiters,
            },
            self._driver._options.fsync,
        )

    def _decode(self, name: str, raw: dict[str, Any] | None, path: str) -> _Record:
        if raw is None:
            return _Record(PermitTable(), [])
        if raw["name"] != name:
            raise ValueError("the record belongs to another name")
        table = PermitTable.decode(raw)
        waiters = [str(w) for w in raw.get("waiters") or []]
        relation = self._id.relation(str(raw.get("host", self._id.host)), str(raw.get("boot")))
        if relation == "rebooted":
            table.clear(0.0)  # every holder and waiter died with the previous boot; the fence carries on
            return _Record(table, [])
        if relation == "foreign" and (table.holders or table.writers):
            raise BackendUnavailable(
                f"semaphore file {path} was written by another machine ({raw.get('host')}): file:// semaphores "
                "count the holders of one host only. Use a server backend (redis://) for semaphores across machines"
            )
        return _Record(table, waiters)

    def _wake_all(self, record: _Record) -> None:
        """Wake every registered waiter (dropping the dead): several may be able to go at once."""
        try:
            sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        except OSError:
            return  # they re-check at the next expiry
        with sender:
            sender.setblocking(False)
            for address in list(record.waiters):
                if self._wakeup.send(sender, address, b"w") is file_wakeup.Sent.GONE:
                    record.waiters.remove(address)

    # -- the permit contract -------------------------------------------------------------------------

    def acquire_permit(
        self,
        name: str,
        token: str,
        ttl: float,
        deadline: float | None,
        limit: int,
        mode: PermitMode,
        cancel: Cancel | None = None,
    ) -> Grant | None:
        waiter: file_wakeup.Waiter | None = None
        address = ""
        unhook = None
        granted = False
        try:
            while True:
                sent_at = self._clock()
                with self._locked(name) as (record, now):
                    fence = record.table.take(name, token, ttl, now, limit, mode)
                    if fence is not None:
                        granted = True
                        if address in record.waiters:
                            record.waiters.remove(address)
                        return Grant(fence, ttl, sent_at)
                    hint = record.table.wait_hint(now)
                    if (
                        waiter is not None
                        and address not in record.waiters
                        and len(record.waiters) < MAX_PERMIT_WAITERS
                    ):
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
                waits = [w for w in (hint, left, ttl / 3 if mode == "write" else None) if w is not None]
                waiter.sleep(max(0.0005, min(waits)) if waits else None)
        finally:
            if unhook is not None:
                unhook()
            if waiter is not None:
                waiter.close()
            if not granted:
                self._leave(name, token, address)
            elif address:
                with self._locked(name) as (record, _):
                    if address in record.waiters:
                        record.waiters.remove(address)

    def _leave(self, name: str, token: str, address: str) -> None:
        with contextlib.suppress(BackendUnavailable), self._locked(name) as (record, now):
            if address in record.waiters:
                record.waiters.remove(address)
            queued = token in record.table.writers
            record.table.leave(token, now)
            if queued:
                self._wake_all(record)  # readers held back by this writer may go now

    def renew_permits(self, requests: Sequence[RenewRequest]) -> list[Grant | Exception | None]:
        results: list[Grant | Exception | None] = []
        for request in requests:
            try:
                sent_at = self._clock()
                with self._locked(request.name) as (record, now):
                    ok = record.table.renew(request.token, request.ttl, now)
                    results.append(Grant(record.table.fence, request.ttl, sent_at) if ok else None)
            except Exception as exc:  # kept per item: one failure must not hide the others' results
                results.append(exc)
        return results

    def release_permit(self, name: str, token: str) -> bool:
        with self._locked(name) as (record, now):
            if not record.table.release(token, now):
                return False
            self._wake_all(record)
            return True

    def force_release_permits(self, name: str) -> int:
        with self._locked(name) as (record, now):
            count = record.table.clear(now)
            self._wake_all(record)
            return count

    def permit_holders(self, name: str) -> PermitInfo:
        with self._locked(name) as (record, now):
            table = record.table
            table.prune(now)
            return PermitInfo(
                table.limit,
                len(table.holders),
                table.writer_holds(),
                len(table.writers),
                table.fence or None,
                len(record.waiters),
            )
