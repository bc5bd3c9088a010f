"""The advisory lock key of a lock name: a documented 64-bit mapping that other clients can compute.

``key = the first 8 bytes of SHA-256(namespace UTF-8 || 0x00 || name UTF-8), read as a big-endian signed
64-bit integer`` — the ``bigint`` argument of ``pg_advisory_lock``. In ``pg_locks`` the key shows as
``classid`` (its high 32 bits, unsigned) and ``objid`` (its low 32 bits) with ``objsubid = 1``.

Two names could share a key (a 2^-64 chance per pair; about one in 10^10 for a million names): they would
then share one lock, which is safe (they exclude each other) but surprising. The lock table's ``UNIQUE (key)``
constraint detects it at the first acquisition of the second name, which is refused with a ``ConfigError``.
"""

from __future__ import annotations

import hashlib

__all__ = ["advisory_key", "lock_parts", "permit_key", "unsigned"]


def advisory_key(namespace: str, name: str) -> int:
    digest = hashlib.sha256(namespace.encode() + b"\x00" + name.encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def lock_parts(key: int) -> tuple[int, int]:
    """``(classid, objid)``: how ``pg_locks`` shows a ``bigint`` advisory key."""
    unsigned = key & 0xFFFF_FFFF_FFFF_FFFF
    return unsigned >> 32, unsigned & 0xFFFF_FFFF


# -- semaphores and reader-writer locks ----------------------------------------------------------------------
#
# Permits use the *two-integer* form of the advisory lock functions (``pg_advisory_lock(int, int)``), which
# ``pg_locks`` shows with ``objsubid = 2``: a key space of its own, so no lock (``bigint`` form, ``objsubid =
# 1``) can ever share a key with a permit, whatever the hash gives.

PERMIT_PARTS = ("presence", "rw")
"""The fixed parts of a name's permit keys; a semaphore's slots are ``slot:0`` … ``slot:<limit-1>``."""


def permit_key(namespace: str, name: str, part: str) -> tuple[int, int]:
    """``(key1, key2)`` of ``pg_advisory_lock(key1 int, key2 int)`` for one part of a permit name: the first 8
    bytes of SHA-256(namespace || 0x00 || name || 0x00 || part) as two big-endian signed 32-bit integers."""
    digest = hashlib.sha256(namespace.encode() + b"\x00" + name.encode() + b"\x00" + part.encode()).digest()
    return int.from_bytes(digest[:4], "big", signed=True), int.from_bytes(digest[4:8], "big", signed=True)


def unsigned(half: int) -> int:
    """How ``pg_locks`` shows one half of a two-integer key (``classid`` / ``objid`` are unsigned oids)."""
    return half & 0xFFFF_FFFF
