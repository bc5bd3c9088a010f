"""Lock names: validation and the one name→key encoding every driver shares.

A name is any non-empty ``str`` of at most 512 UTF-8 bytes. Names are compared
byte for byte: they are *not* Unicode-normalised, so NFC and NFD spellings of
the same text are two different locks (normalising would silently merge locks
that other languages' clients keep apart).

Each driver documents its own mapping, and every one is injective (two distinct
names never share a key). None stores the UTF-8 bytes as they are:

* Redis and Redlock escape exactly ``%``, ``{`` and ``}`` in the UTF-8 text
  (``%25``, ``%7B``, ``%7D``): the braces delimit the Redis Cluster hash tag;
  see ``drivers/redis/keys.py``. Every other character, ``/`` and ``.``
  included, is kept.
* etcd and ZooKeeper use :func:`encode_name` below: every UTF-8 byte outside
  ``A-Z a-z 0-9 - _ ~ :`` becomes ``%XX`` with *upper-case* hex digits (``.``,
  ``/``, space, ``%``, braces and every non-ASCII byte included), so a name
  never contains ``/`` (a path separator in both), never is ``.`` or ``..``
  (invalid ZooKeeper path components) and never starts with ``.`` (etcd's
  presence records live under ``<prefix>.presence/``). ``v1.2`` is stored as
  ``v1%2E2``: ordinary URL escapers keep ``.`` and so do not reproduce it.
  Other clients sharing a lock use the reference functions and test vectors
  of docs/interop.md. Changing this set would be a key-layout change (old and
  new clients would lock different keys for the same name), so it is fixed.
* file:// names each lock file by the SHA-256 of the UTF-8 name (any name then
  fits a file name); memory:// keys its table by the name itself.
"""

from __future__ import annotations

from .errors import InvalidLockName

__all__ = ["MAX_NAME_BYTES", "encode_name", "validate_name"]

MAX_NAME_BYTES = 512

# Kept as they are; every other byte of the UTF-8 encoding becomes %XX (upper-case hex).
# "." is *not* kept so that "." and ".." can never appear as a path component.
_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_~:")


def validate_name(name: object) -> str:
    """Return ``name`` if it is a valid lock name, else raise :class:`InvalidLockName`."""
    if not isinstance(name, str):
        bytes_like = isinstance(name, (bytes, bytearray))
        hint = "decode bytes before passing them" if bytes_like else "pass a str, e.g. f'orders:{order_id}'"
        raise InvalidLockName(f"lock name must be a str, got {type(name).__name__}; {hint}")
    if not name:
        raise InvalidLockName("lock name must not be empty; pass a name such as 'orders:42'")
    # ASCII, the common case, is one byte per character: no encode on the hot path
    size = len(name) if name.isascii() else _utf8_size(name)
    if size > MAX_NAME_BYTES:
        raise InvalidLockName(f"lock name is {size} UTF-8 bytes; the limit is {MAX_NAME_BYTES}: hash long names first")
    return name


def _utf8_size(name: str) -> int:
    try:
        return len(name.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidLockName(
            "lock name is not encodable as UTF-8 (it contains a lone surrogate); pass valid text"
        ) from exc


def encode_name(name: str) -> str:
    """Percent-encode a validated name into ``[A-Za-z0-9_~:%-]`` (injective, reversible)."""
    return "".join(chr(b) if b in _SAFE else f"%{b:02X}" for b in name.encode("utf-8"))


def decode_name(encoded: str) -> str:
    """Inverse of :func:`encode_name`."""
    out = bytearray()
    i = 0
    while i < len(encoded):
        if encoded[i] == "%":
            out.append(int(encoded[i + 1 : i + 3], 16))
            i += 3
        else:
            out.append(ord(encoded[i]))
            i += 1
    return out.decode("utf-8")
