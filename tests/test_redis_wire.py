"""The bytes the single-node Redis driver sends for a lock, encoded by the calls' makers (issue 17).

An acquire and its release are each encoded in one formatting where they are made (``Call.wire``,
:mod:`lockkit.drivers.redis.flow`), and :func:`~lockkit.drivers.redis.calls.pack_calls` sends those bytes as
they are: every such call must be, byte for byte, what the general encoder makes of its command, and carry
its own lock's keys and no other's.
"""

from __future__ import annotations

import time

import pytest
import redis

import lockkit
from backends.servers import RedisServer
from lockkit.drivers.redis.calls import Call, pack, pack_calls
from lockkit.drivers.redis.flow import acquire_flow, leave_call, release_call
from lockkit.drivers.redis.keys import cluster_lock_keys, lock_keys

NAMES = ["plain", "a/b.c", "{tag}", "100%", "}{", "naïve ☃", "%7B", "x" * 300, ""]
TOKEN = "0123456789abcdef" * 2
WID = f"client-1.10000.{TOKEN}"


def _hot_calls(keys: object, listening: bool) -> list[Call]:
    flow = acquire_flow(keys, TOKEN, 10, time.monotonic() + 10, time.monotonic, "t", WID, listening)  # type: ignore[arg-type]
    calls = [*flow.send(None).calls]
    flow.close()
    return [*calls, release_call(keys, TOKEN), release_call(keys, None), leave_call(keys, TOKEN, WID)]  # type: ignore[arg-type]


@pytest.mark.parametrize("make_keys", [lock_keys, cluster_lock_keys])
@pytest.mark.parametrize("name", NAMES)
def test_pre_encoded_calls_are_their_commands_encoding(make_keys: object, name: str) -> None:
    keys = make_keys("pre:", name)  # type: ignore[operator]
    for listening in (True, False):
        calls = _hot_calls(keys, listening)
        for call in calls:
            assert pack_calls([call]) == pack([call.command()]), call
        # mixed with calls the general encoder makes, in one payload
        ping = Call(None, (), ("PING",))
        assert pack_calls([ping, *calls, ping]) == pack([ping.command(), *(c.command() for c in calls), ("PING",)])


def test_each_name_gets_its_own_encoding_in_turn() -> None:
    """Names seen in turn, again and again, each encode their own keys."""
    names = [f"order-{i}" for i in range(50)]
    for _ in range(3):
        for name in names:
            keys = lock_keys("lockkit:", name)
            for call in _hot_calls(keys, True):
                assert pack_calls([call]) == pack([call.command()])
                assert keys.lock in pack_calls([call])
                assert all(other.encode() + b"}" not in pack_calls([call]) for other in names if other != name)


def test_two_names_held_at_once_are_two_locks_on_the_server(redis_server: RedisServer) -> None:
    """On a real server: the second name's acquire takes its own key (not the first name's, still held), and
    each release frees only its own lock."""
    raw = redis.Redis(host=redis_server.host, port=redis_server.port)
    with lockkit.connect(redis_server.url) as locks:
        first, second = locks.lock("wire-first", ttl=10), locks.lock("wire-second", ttl=10)
        assert first.acquire(timeout=0) and second.acquire(timeout=0)
        held = {k for k in raw.keys("lockkit:{wire-*}") if not k.endswith(b":fence")}
        assert held == {b"lockkit:{wire-first}", b"lockkit:{wire-second}"}
        second.release()
        assert raw.exists("lockkit:{wire-first}") and not raw.exists("lockkit:{wire-second}")
        again = locks.lock("wire-second", ttl=10)
        assert again.acquire(timeout=0)  # free again, while the first stays held
        with pytest.raises(lockkit.LockTimeout):
            locks.lock("wire-first", ttl=10).acquire(timeout=0)
        first.release()
        assert not raw.exists("lockkit:{wire-first}") and raw.exists("lockkit:{wire-second}")
        again.release()
