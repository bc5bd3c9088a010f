"""The blocking conformance worker under its historical name (``tests/test_migrate.py`` runs it directly).

The worker is generated: ``lockkit/testing/_async/workers.py`` is its source.
"""

from __future__ import annotations

from ._sync.workers import increment_under_lock

__all__ = ["increment_under_lock"]
