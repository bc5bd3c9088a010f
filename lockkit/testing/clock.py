"""A fake monotonic clock for tests: time moves only when the test moves it.

Everything in lockkit that measures time takes a :data:`lockkit.timing.Clock`, a callable returning monotonic
seconds (``lockkit.connect(url, clock=...)``, :class:`lockkit.driver.DriverContext`, :class:`lockkit.lease.Lease`,
the Redis acquire flows). Pass a :class:`FakeClock` instead of ``time.monotonic`` and validity, deadlines and
renewal schedules become exact arithmetic::

    from lockkit.lease import Lease
    from lockkit.testing import FakeClock

    clock = FakeClock(1000.0)
    lease = Lease(name="n", token="t" * 32, fencing_token=1, ttl=10, sent_at=clock(), clock=clock)
    clock.advance(9.5)
    assert lease.valid
    clock.advance(0.5)  # past sent_at + ttl - drift(ttl)
    assert not lease.valid
"""

from __future__ import annotations

import math
import threading

from ..errors import ConfigError

__all__ = ["FakeClock"]


def _seconds(value: float, what: str) -> float:
    try:
        result = float(value)
    except (TypeError, ValueError):
        result = math.nan  # told below, in the same words as NaN
    if not math.isfinite(result):
        raise ConfigError(f"{what} must be a finite number of seconds, got {value!r}; pass a float such as 1.5")
    return result


class FakeClock:
    """A :data:`lockkit.timing.Clock` that stands still until :meth:`advance` or :meth:`set` moves it.

    Calling it returns the current fake time in float seconds, as ``time.monotonic()`` would. Like a monotonic
    clock it never goes backwards: :meth:`advance` refuses a negative step and :meth:`set` an earlier instant,
    so a test cannot build a situation the real clock never produces. Any start is fine; one far from zero
    (say ``1000.0``) catches code that mistakes an instant for a duration or treats ``0`` as "unset".

    Thread-safe: the reads and moves of several threads are serialised, and a read sees either the time before
    a move or after it, never anything in between.
    """

    __slots__ = ("_mutex", "_now")

    def __init__(self, start: float = 0.0) -> None:
        self._now = _seconds(start, "start")
        self._mutex = threading.Lock()

    def __call__(self) -> float:
        """The current fake time in seconds."""
        with self._mutex:
            return self._now

    @property
    def now(self) -> float:
        """The current fake time in seconds (the same as calling the clock)."""
        return self()

    def advance(self, seconds: float) -> float:
        """Move the time forward by ``seconds`` (≥ 0) and return the new time."""
        step = _seconds(seconds, "advance()")
        if step < 0:
            raise ConfigError(f"a monotonic clock does not go back: advance({seconds!r}); pass a step of 0 or more")
        with self._mutex:
            self._now += step
            return self._now

    def set(self, now: float) -> float:
        """Move the time forward to the instant ``now`` (not before the current time) and return it."""
        target = _seconds(now, "set()")
        with self._mutex:
            if target < self._now:
                raise ConfigError(
                    f"a monotonic clock does not go back: set({now!r}) at {self._now!r}; set an instant at or "
                    "after now (the clock's now), or advance() by a step"
                )
            self._now = target
            return self._now

    def __repr__(self) -> str:
        return f"FakeClock({self():g})"
