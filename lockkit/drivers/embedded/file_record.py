"""Crash-safe records for ``file://`` without renames: two checksummed slots per file, written alternately.

Replacing a file with ``rename`` is atomic but costs a data flush on ext4 (``auto_da_alloc``): about a
millisecond per lock operation, which made renewing a few hundred ``file://`` locks miss their deadlines.
Instead each record file holds two slots, and a write goes to the slot *not* holding the newest valid
record::

    offset 0 and 65536:  b"LKR1" | seq: u64 | length: u32 | sha256(payload): 32 bytes | payload (JSON)

A reader takes the valid slot with the highest ``seq``. A crash in the middle of a write can only tear
the slot being written, so the previous record survives intact. The caller holds the file's ``flock``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from ...errors import BackendUnavailable

R = TypeVar("R")

SLOT = 65536
_HEADER = struct.Struct(">4sQI32s")
_MAGIC = b"LKR1"
MAX_PAYLOAD = SLOT - _HEADER.size


class CorruptRecord(ValueError):
    """Neither slot holds a valid record although the file is not empty."""


def _parse(raw: bytes) -> tuple[int, dict[str, Any]] | None:
    if len(raw) < _HEADER.size:
        return None
    magic, seq, length, digest = _HEADER.unpack_from(raw)
    payload = raw[_HEADER.size : _HEADER.size + length]
    if magic != _MAGIC or len(payload) != length or hashlib.sha256(payload).digest() != digest:
        return None
    try:
        return seq, json.loads(payload)
    except ValueError:
        return None


def read(fd: int) -> tuple[int, dict[str, Any] | None]:
    """``(seq, record)`` of the newest valid slot; ``(0, None)`` for a new file."""
    slots = [_parse(os.pread(fd, SLOT, offset)) for offset in (0, SLOT)]
    valid = [slot for slot in slots if slot is not None]
    if not valid:
        if os.fstat(fd).st_size:
            raise CorruptRecord("no valid record slot")
        return 0, None
    return max(valid, key=lambda slot: slot[0])


def write(fd: int, seq: int, record: dict[str, Any], durable: bool) -> None:
    """Write ``record`` as number ``seq + 1`` into the slot the newest record is not in."""
    payload = json.dumps(record, separators=(",", ":")).encode("utf-8")
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"record of {len(payload)} bytes exceeds the slot size")
    nxt = seq + 1
    header = _HEADER.pack(_MAGIC, nxt, len(payload), hashlib.sha256(payload).digest())
    os.pwrite(fd, header + payload, (nxt % 2) * SLOT)
    if durable:
        os.fsync(fd)


@contextlib.contextmanager
def flocked(
    path: str,
    what: str,
    decode: Callable[[dict[str, Any] | None, float], R],
    encode: Callable[[R], dict[str, Any]],
    durable: bool,
) -> Iterator[tuple[R, float]]:
    """Hold ``path``'s flock; yield its decoded record and the monotonic now; write it back if it changed.

    The one read-modify-write of a ``file://`` record, for locks and permits alike. ``what`` names the file in
    errors ("lock file", "semaphore file"); a record that cannot be read back is reported as corrupt with the
    way out (delete the file; its fencing counter restarts).
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise BackendUnavailable(
            f"cannot open {what} {path}: {exc.strerror}; check that the lock directory exists and this user "
            "may write it"
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        now = time.monotonic()
        try:
            seq, raw = read(fd)
            record = decode(raw, now)
        except (CorruptRecord, ValueError, KeyError, TypeError) as exc:
            raise BackendUnavailable(
                f"{what} {path} is corrupt ({exc}); delete it to reset it (its fencing counter restarts)"
            ) from None
        except OSError as exc:
            raise BackendUnavailable(
                f"cannot read {what} {path}: {exc.strerror}; check that this user may read it"
            ) from None
        yield record, now
        updated = encode(record)
        if updated != raw:
            try:
                write(fd, seq, updated, durable)
            except OSError as exc:
                raise BackendUnavailable(
                    f"cannot write {what} {path}: {exc.strerror}; check free space and the permissions of the lock "
                    "directory"
                ) from None
            except ValueError as exc:  # the record outgrew its slot
                raise BackendUnavailable(
                    f"cannot write {what} {path}: {exc}; check free space and the permissions of the lock directory"
                ) from None
    finally:
        os.close(fd)  # closing drops the flock
