"""The conformance suite, both faces: :class:`ConformanceSuite` (blocking) and :class:`AsyncConformanceSuite`.

The tests are written once, as asyncio code, in ``lockkit/testing/_async/conformance.py``;
``scripts/unasync.py`` generates the blocking suite, ``lockkit/testing/_sync/conformance.py``, from it. This
module only gathers both (with the suite's limits and inputs) under the name it has always had.

Every test has the same name on both faces but one: the concurrency test is ``test_mutual_exclusion_threads``
on the blocking face and ``test_tasks_exclude_each_other`` on the asyncio face. Task cancellation
(``test_cancelled_acquire_leaves_nothing``) is asyncio-only, in ``lockkit/testing/_async/face_tests.py``.
"""

from __future__ import annotations

from ._async.conformance import AsyncConformanceSuite
from ._common import BAD_NAMES, BAD_TIMEOUTS, BAD_TTLS, HOLD_TTL, MAX_HOLD, ODD_NAMES, SLACK, WAKE_HOLD_TTL
from ._sync.conformance import ConformanceSuite

__all__ = [
    "BAD_NAMES",
    "BAD_TIMEOUTS",
    "BAD_TTLS",
    "HOLD_TTL",
    "MAX_HOLD",
    "ODD_NAMES",
    "SLACK",
    "WAKE_HOLD_TTL",
    "AsyncConformanceSuite",
    "ConformanceSuite",
]
