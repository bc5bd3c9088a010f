"""lockkit/drivers/etcd/wire.py writes, byte for byte, what the generated protobuf classes serialise.

No server is needed: each hand-encoded request is compared with the same request built from the generated
etcd messages, over keys, values, leases and revisions of every varint length (and a negative lease id),
and parsed back.
"""

from __future__ import annotations

import itertools

import pytest

from lockkit.drivers.etcd import wire
from lockkit.drivers.etcd.client import cmp_created, delete_op, range_op, rpc

KEYS = [b"/lockkit/a/0123456789abcdef-0", b"k", b"/p/" + b"x" * 200, b"/lockkit/\xc3\xa9/ffffffffffffffff-12"]
NUMBERS = [0, 1, 127, 128, 300, 16_383, 16_384, 2**31, 2**62, 7587881042133829125]
LEASES = [0, 1, 7587881042133829125, -1, -(2**63)]


@pytest.mark.parametrize(("key", "revision"), list(itertools.product(KEYS, NUMBERS)))
def test_compare_created(key: bytes, revision: int) -> None:
    assert wire.compare_created(key, revision) == cmp_created(key, revision).SerializeToString()


def test_compare_range_empty() -> None:
    for start, end in [(b"/lockkit/a/", b"/lockkit/a0"), (b"/" + b"s" * 300, b"/" + b"e" * 300)]:
        built = rpc.Compare(
            result=rpc.Compare.EQUAL, target=rpc.Compare.CREATE, key=start, range_end=end, create_revision=0
        )
        assert wire.compare_range_empty(start, end) == built.SerializeToString()


@pytest.mark.parametrize(("key", "lease"), list(itertools.product(KEYS, LEASES)))
def test_put(key: bytes, lease: int) -> None:
    for value in (b"t" * 32, b"", b"v" * 300):
        built = rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value, lease=lease))
        assert wire.put(key, value, lease) == built.SerializeToString()


@pytest.mark.parametrize(
    ("limit", "below", "keys_only"), list(itertools.product([0, 1, 2, 200], NUMBERS, [False, True]))
)
def test_range_newest(limit: int, below: int, keys_only: bool) -> None:
    start, end = b"/lockkit/name/", b"/lockkit/name0"
    built = range_op(start, end, newest_first=True, limit=limit, below=below)
    built.request_range.keys_only = keys_only
    assert wire.range_newest(start, end, limit, below, keys_only) == built.SerializeToString()


@pytest.mark.parametrize("key", KEYS)
def test_range_key_and_delete(key: bytes) -> None:
    assert wire.range_key(key) == range_op(key).SerializeToString()
    assert wire.delete(key) == delete_op(key).SerializeToString()


def test_transactions_as_the_driver_sends_them() -> None:
    key, start, end, lease = KEYS[0], b"/lockkit/a/", b"/lockkit/a0", 7587881042133829125
    acquire = wire.txn(
        (wire.compare_created(key, 0),),
        (wire.put(key, b"t" * 32, lease), wire.range_newest(start, end, 2, keys_only=True)),
        (wire.range_key(key),),
    )
    newest = range_op(start, end, newest_first=True, limit=2)
    newest.request_range.keys_only = True
    built = rpc.TxnRequest(
        compare=[cmp_created(key, 0)],
        success=[rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=b"t" * 32, lease=lease)), newest],
        failure=[range_op(key)],
    )
    assert acquire == built.SerializeToString()
    assert rpc.TxnRequest.FromString(acquire) == built
    release = wire.txn((wire.compare_created(key, 12345),), (wire.delete(key),))
    assert release == rpc.TxnRequest(compare=[cmp_created(key, 12345)], success=[delete_op(key)]).SerializeToString()
    assert wire.txn() == rpc.TxnRequest().SerializeToString() == b""


def test_name_range_fast_path_is_encode_name() -> None:
    """keys.name_range skips encode_name's byte loop for names it would keep as they are: same keys."""
    from lockkit.drivers.etcd.keys import name_range, prefix_end
    from lockkit.names import encode_name

    names = ["a", "order:42", "A-z_0~9:", "a/b", "v1.2", "a%2F", "é", "a\n", "\n", "x" * 500, " ", "{x}"]
    names += [chr(c) for c in range(1, 256)]
    for name in names:
        start, end = name_range.__wrapped__("/lockkit/", name)
        assert start == f"/lockkit/{encode_name(name)}/".encode()
        assert end == prefix_end(start)
