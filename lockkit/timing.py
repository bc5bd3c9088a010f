"""Time arithmetic shared by every driver: TTL and timeout checks, drift, deadlines.

Everything here runs on a *monotonic* clock (``time.monotonic`` unless a test
injects another callable). The wall clock is never used for validity: a lease is
valid from the moment *before* its request was sent until
``t_send + ttl_effective - drift(ttl_effective)``, so a slow reply or a clock
that jumps can only shorten what we believe, never lengthen it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from .errors import ConfigError

__all__ = [
    "MAX_TTL",
    "MIN_TTL",
    "Clock",
    "deadline_after",
    "drift",
    "lease_deadline",
    "time_left",
    "validate_timeout",
    "validate_ttl",
]

Clock = Callable[[], float]
"""A monotonic clock in seconds (``time.monotonic`` by default)."""

DRIFT_FACTOR = 0.01
DRIFT_FLOOR = 0.002
MIN_TTL = 0.01
"""Below this the drift margin eats most of the lease; nothing useful fits in it."""
MAX_TTL = 365 * 24 * 3600.0
"""One year: far beyond any sane lease (use auto-renewal), well inside every backend's range."""


default_clock: Clock = time.monotonic
"""The clock of every locker unless a test injects another (the C function itself: it is read several times
per acquire + release, and a Python wrapper around it cost a frame each time)."""


def drift(ttl: float) -> float:
    """Margin for clock-rate differences and processing: 1 % of the TTL plus 2 ms (the Redlock rule)."""
    return ttl * DRIFT_FACTOR + DRIFT_FLOOR


def lease_deadline(sent_at: float, ttl: float) -> float:
    """The last monotonic instant at which a lease granted for ``ttl`` may be trusted."""
    return sent_at + ttl - drift(ttl)


def _number(value: object, what: str) -> float:
    # bool is an int subclass: ttl=True would silently mean one second.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(
            f"{what} must be a number of seconds, got {type(value).__name__} {value!r}; pass an int or float, e.g. 30"
        )
    result = float(value)
    if math.isnan(result):
        raise ConfigError(f"{what} must be a number of seconds, got NaN; pass a finite number")
    return result


def validate_ttl(value: object, what: str = "ttl") -> float:
    """Return ``value`` as float seconds if it is a usable TTL, else raise :class:`ConfigError`."""
    kind = type(value)  # exactly float or int: bool (an int subclass) and NaN (no comparison holds) go on below
    if (kind is float or kind is int) and MIN_TTL <= value <= MAX_TTL:  # type: ignore[operator]
        return float(value)  # type: ignore[arg-type]
    ttl = _number(value, what)
    if not MIN_TTL <= ttl <= MAX_TTL:
        raise ConfigError(f"{what} must be between {MIN_TTL} and {MAX_TTL:.0f} seconds, got {ttl!r}")
    return ttl


def validate_timeout(value: object, what: str = "timeout") -> float | None:
    """``None`` waits forever; otherwise a finite number of seconds ≥ 0."""
    if value is None:
        return None
    timeout = _number(value, what)
    if timeout < 0 or math.isinf(timeout):
        raise ConfigError(f"{what} must be ≥ 0 seconds (or None to wait forever), got {timeout!r}")
    return timeout


def deadline_after(clock: Clock, timeout: float | None) -> float | None:
    """Turn a relative timeout into one absolute monotonic deadline (``None`` = never)."""
    return None if timeout is None else clock() + timeout


def time_left(clock: Clock, deadline: float | None) -> float | None:
    """Seconds until ``deadline`` (never negative), or ``None`` for no deadline."""
    return None if deadline is None else max(0.0, deadline - clock())
