"""What both faces of the conformance suite share and that involves no I/O: limits, test inputs, pure checks.

It lives outside ``_async``/``_sync`` so that there is one copy of it, not a generated twin: changing a
limit here changes it for both faces at once.
"""

from __future__ import annotations

import itertools
import uuid
from pathlib import Path
from typing import Any

import lockkit

__all__ = [
    "BAD_NAMES",
    "BAD_TIMEOUTS",
    "BAD_TTLS",
    "HOLD_TTL",
    "MAX_HOLD",
    "ODD_NAMES",
    "SLACK",
    "WAKE_HOLD_TTL",
    "fences",
    "overlaps",
    "prefix",
    "queued",
]

HOLD_TTL = 5.0
SLACK = 2.0  # liveness slack for a loaded 2-core CI machine
WAKE_HOLD_TTL = 30.0
"""The holder's TTL in the wake-up tests: a waiter's only timer (its re-check at the holder's expiry) is this far
away, so a waiter that acquires within SLACK of the release was woken by the release, not by a timer."""
MAX_HOLD = 2.5

ODD_NAMES = [
    "a",
    "a/b",
    "a b",
    "/",
    "..",
    ".",
    "zookeeper",
    "ü日本語",
    "e\u0301",  # NFD spelling of é: a different lock from the NFC one
    "\u00e9",
    "'\"]]\n{}*?[",
    "%41",
    "A",
    "tab\there",
    "x" * 480,
]

BAD_NAMES: list[Any] = ["", None, b"bytes", 42, "x" * 513, "é" * 257, "\ud800"]
BAD_TTLS: list[Any] = [0, -1, float("nan"), float("inf"), True, False, "5", None, 0.002]
BAD_TIMEOUTS: list[Any] = [-1, float("nan"), float("inf"), "1", True]


def prefix() -> str:
    """A fresh name prefix: tests never see each other's locks, even on a shared server."""
    return f"ct-{uuid.uuid4().hex[:10]}:"


def fences(locker: lockkit.Locker | lockkit.AsyncLocker) -> bool:
    """Whether the locker's (single) backend promises fencing tokens at all (Redlock does not)."""
    (guarantees,) = locker.guarantees().values()
    return bool(guarantees.fencing != "none")


def queued(info: lockkit.HolderInfo) -> bool | None:
    """Whether the server counts a waiter on the lock; None if the driver does not report waiters (Redlock)."""
    return None if info.waiters is None else info.waiters >= 1


def overlaps(log: Path) -> list[tuple[float, float]]:
    """The overlapping (end, next start) pairs in a log of ``entered left token`` lines: must be empty."""
    spans = sorted(tuple(map(float, line.split()[:2])) for line in log.read_text().splitlines())
    return [(a[1], b[0]) for a, b in itertools.pairwise(spans) if b[0] < a[1]]
