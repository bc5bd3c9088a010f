"""The conformance tests that only the blocking face has, written by hand: none.

Every blocking test has an asyncio twin (fork included: the asyncio face runs the child's release in an
event loop of the child's own), so this mixin only keeps the two faces' suites built the same way; a test
with no asyncio meaning would go here. Its twin, ``../_async/face_tests.py``, holds task cancellation.
"""

from __future__ import annotations

__all__ = ["FaceTests"]


class FaceTests:
    """No tests of its own (see the module docstring)."""
