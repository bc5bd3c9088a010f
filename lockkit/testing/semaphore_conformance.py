"""The semaphore and reader-writer lock suite, both faces: :class:`SemaphoreSuite` and :class:`AsyncSemaphoreSuite`.

Written once as asyncio code in ``lockkit/testing/_async/semaphore_conformance.py``; ``scripts/unasync.py``
generates the blocking suite from it.
"""

from __future__ import annotations

from ._async.semaphore_conformance import AsyncSemaphoreSuite
from ._sync.semaphore_conformance import SemaphoreSuite

__all__ = ["AsyncSemaphoreSuite", "SemaphoreSuite"]
