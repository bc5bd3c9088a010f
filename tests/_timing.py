"""How long a blocking call took to fail: shared by the unresponsive-server tests (C-10, P-9, E-8).

Not a test module (no ``test_`` prefix): imported as ``tests._timing``, like the other shared helpers under
tests/. The figures feed liveness bounds with generous slack only, never speed assertions.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest


def timed(call: Callable[[], Any]) -> tuple[float, BaseException | None]:
    """Run ``call``: the seconds it took and what it raised (``None`` if it returned), for the test to judge."""
    started = time.monotonic()
    try:
        call()
    except BaseException as exc:  # the test looks at what it was
        return time.monotonic() - started, exc
    return time.monotonic() - started, None


def timed_failure(call: Callable[[], Any], expected: type[BaseException]) -> float:
    """Run ``call``, which must raise ``expected``: the seconds it took to."""
    took, exc = timed(call)
    if not isinstance(exc, expected):
        pytest.fail(f"expected {expected.__name__}, got {exc!r} after {took:.2f} s")
    return took
