"""What a node sends, with no I/O: calls, their RESP encoding, and the plan after a ``NOSCRIPT`` reply.

Both faces of :class:`~lockkit.drivers.redis.node.SyncNode` / ``AsyncNode`` (and the flows of :mod:`.flow`,
which build calls) share these; the nodes only move the bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from redis.exceptions import NoScriptError

from .scripts import Script

__all__ = ["Call", "bulks", "pack", "pack_calls", "reload_plan", "script_head"]


class Call(NamedTuple):
    """One command: a script by SHA with its KEYS and ARGV, or a plain command (``script=None``). A named
    tuple: immutable, and made in a third of a frozen dataclass's time (several per lock operation)."""

    script: Script | None
    keys: tuple[bytes, ...] = ()
    args: tuple[Any, ...] = ()
    wire: bytes | None = None
    """This call already RESP-encoded by its maker (a lock's acquire and release, in one formatting each):
    :func:`pack_calls` sends these bytes as they are. They must be :meth:`command`'s encoding."""

    def command(self) -> tuple[Any, ...]:
        if self.script is None:
            return self.args
        return ("EVALSHA", self.script.sha, len(self.keys), *self.keys, *self.args)


def reload_plan(calls: Sequence[Call], replies: list[Any]) -> tuple[list[int], list[tuple[Any, ...]]]:
    """Indexes of calls that got NOSCRIPT, and the commands that load their scripts and rerun them."""
    redo = [i for i, r in enumerate(replies) if isinstance(r, NoScriptError)]
    scripts: dict[str, Script] = {}
    for i in redo:
        script = calls[i].script
        if script is not None:
            scripts[script.sha] = script
    loads: list[tuple[Any, ...]] = [("SCRIPT", "LOAD", s.source) for s in scripts.values()]
    return redo, loads + [calls[i].command() for i in redo]


def _append_bulks(args: Sequence[Any], out: list[bytes]) -> None:
    """Each argument as a RESP bulk string: bytes as they are, a str UTF-8-encoded, anything else (an int) as
    its decimal text. One loop, no call per argument, ``str.encode`` for a str: twice as fast as a call and
    ``str()`` per argument (every command a lock sends comes through here)."""
    append = out.append
    for arg in args:
        kind = type(arg)
        data = arg if kind is bytes else arg.encode() if kind is str else str(arg).encode()
        append(b"$%d\r\n%b\r\n" % (len(data), data))


def pack(commands: Sequence[tuple[Any, ...]]) -> bytes:
    """RESP-encode commands of bytes/str/int arguments."""
    out: list[bytes] = []
    for args in commands:
        out.append(b"*%d\r\n" % len(args))
        _append_bulks(args, out)
    return b"".join(out)


def bulks(*args: bytes | str | int) -> bytes:
    """``args`` as RESP bulk strings, as :func:`pack_calls` encodes arguments."""
    out: list[bytes] = []
    _append_bulks(args, out)
    return b"".join(out)


_heads: dict[tuple[str, int, int], bytes] = {}


def script_head(script: Script, keys: int, args: int) -> bytes:
    """``*N EVALSHA sha numkeys``: the head of every call of ``script`` with that many keys and arguments."""
    shape = (script.sha, keys, args)
    head = _heads.get(shape)
    if head is None:
        head = _heads[shape] = b"*%d\r\n" % (3 + keys + args) + pack([("EVALSHA", script.sha, keys)])[4:]
    return head


def pack_calls(calls: Sequence[Call]) -> bytes:
    """RESP-encode calls; the constant ``EVALSHA sha numkeys`` head of each shape is encoded once (several
    times faster than redis-py's general packer, which matters for a renewal round of thousands of calls),
    and a call encoded by its maker (``wire``) is sent as it is."""
    if len(calls) == 1 and calls[0].wire is not None:
        return calls[0].wire
    out: list[bytes] = []
    for script, keys, args, wire in calls:
        if wire is not None:
            out.append(wire)
            continue
        if script is None:
            out.append(b"*%d\r\n" % len(args))
            _append_bulks(args, out)
            continue
        head = _heads.get((script.sha, len(keys), len(args)))
        out.append(head or script_head(script, len(keys), len(args)))
        _append_bulks(keys, out)
        _append_bulks(args, out)
    return b"".join(out)
