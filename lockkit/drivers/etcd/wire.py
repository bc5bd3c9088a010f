"""The etcd driver's per-call transactions, encoded straight to protobuf bytes (issue 17).

An acquire and a release each build a ``TxnRequest`` of several nested messages;
building them as protobuf objects and serialising them cost ~13 µs of CPU per
acquire+release, more than the rest of the driver's own work. These functions
write the same bytes directly (byte for byte what ``SerializeToString`` writes
for the message-built request: fields in number order, proto3 defaults left
out except the ``create_revision`` of a compare, which sits in a ``oneof`` and
is written even when 0; ``tests/test_etcd_wire.py`` checks every one against the
generated classes). :meth:`EtcdClient.txn_bytes` sends them.

Only the messages the hot path needs are here; everything else is built with
the generated classes (:mod:`.client`).
"""

from __future__ import annotations

__all__ = ["compare_created", "compare_range_empty", "delete", "put", "range_key", "range_newest", "txn"]

# Compare.CompareTarget.CREATE (result EQUAL is 0, the default, so it is left out)
_TARGET_CREATE = b"\x10\x01"
_DESCEND, _ASCEND, _BY_CREATE = 2, 1, 2


_ONE_BYTE = [bytes((n,)) for n in range(0x80)]


def _varint(n: int) -> bytes:
    if 0 <= n < 0x80:
        return _ONE_BYTE[n]
    if n < 0:  # int64: two's complement in ten bytes
        n += 1 << 64
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: bytes, data: bytes) -> bytes:
    """A length-delimited field (``tag``: its key byte(s), wire type 2)."""
    n = len(data)
    return tag + (_ONE_BYTE[n] if n < 0x80 else _varint(n)) + data


def compare_created(key: bytes, revision: int) -> bytes:
    """``Compare(result=EQUAL, target=CREATE, key=key, create_revision=revision)``."""
    return _TARGET_CREATE + _field(b"\x1a", key) + b"\x28" + _varint(revision)


def compare_range_empty(start: bytes, end: bytes) -> bytes:
    """``Compare(result=EQUAL, target=CREATE, key=start, range_end=end, create_revision=0)``: no key in
    ``[start, end)``."""
    return _TARGET_CREATE + _field(b"\x1a", start) + b"\x28\x00" + _field(b"\x82\x04", end)


def put(key: bytes, value: bytes, lease: int) -> bytes:
    """``RequestOp(request_put=PutRequest(key=key, value=value, lease=lease))``."""
    body = (
        _field(b"\x0a", key) + (_field(b"\x12", value) if value else b"") + (b"\x18" + _varint(lease) if lease else b"")
    )
    return _field(b"\x12", body)


def range_newest(start: bytes, end: bytes, limit: int, below: int = 0, keys_only: bool = False) -> bytes:
    """``RequestOp(request_range=RangeRequest(...))`` of the ``limit`` newest keys by create_revision in
    ``[start, end)``, created at or before ``below`` if given (``client.range_op(newest_first=True)``)."""
    body = (
        _field(b"\x0a", start)
        + _field(b"\x12", end)
        + (b"\x18" + _varint(limit) if limit else b"")
        + bytes((0x28, _DESCEND, 0x30, _BY_CREATE))
        + (b"\x40\x01" if keys_only else b"")
        + (b"\x68" + _varint(below) if below else b"")
    )
    return _field(b"\x0a", body)


def range_key(key: bytes) -> bytes:
    """``RequestOp(request_range=RangeRequest(key=key, sort_order=ASCEND, sort_target=CREATE))``
    (``client.range_op(key)``)."""
    return _field(b"\x0a", _field(b"\x0a", key) + bytes((0x28, _ASCEND, 0x30, _BY_CREATE)))


def delete(key: bytes) -> bytes:
    """``RequestOp(request_delete_range=DeleteRangeRequest(key=key))``."""
    return _field(b"\x1a", _field(b"\x0a", key))


def txn(compare: tuple[bytes, ...] = (), success: tuple[bytes, ...] = (), failure: tuple[bytes, ...] = ()) -> bytes:
    """``TxnRequest(compare=[...], success=[...], failure=[...])`` of already encoded parts."""
    out = b""
    for part in compare:
        out += _field(b"\x0a", part)
    for op in success:
        out += _field(b"\x12", op)
    for op in failure:
        out += _field(b"\x1a", op)
    return out
