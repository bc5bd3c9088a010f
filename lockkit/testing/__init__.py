"""The conformance suite every lockkit driver passes, shipped so third-party drivers can run it too.

Subclass in a pytest module and provide a function-scoped ``url`` fixture::

    from lockkit.testing import AsyncConformanceSuite, ConformanceSuite

    class TestMyDriver(ConformanceSuite):
        @pytest.fixture
        def url(self, my_server):
            return my_server.url

    class TestMyDriverAsync(AsyncConformanceSuite):
        @pytest.fixture
        def url(self, my_server):
            return my_server.url

Both suites hold the same tests (the blocking one is generated from the asyncio one, see
:mod:`lockkit.testing.conformance`), plus task cancellation on the asyncio face only; run both, in two
classes, so that the driver is checked from each face. The async suite needs pytest-asyncio
(``asyncio_mode = "auto"``). A test that cannot apply to a driver is skipped by overriding it in the
subclass with a ``pytest.mark.skip`` saying why (``tests/test_conformance_embedded.py`` skips the
processes test for memory://, which is one process by definition).
"""

from .clock import FakeClock
from .conformance import AsyncConformanceSuite, ConformanceSuite
from .semaphore_conformance import AsyncSemaphoreSuite, SemaphoreSuite

__all__ = ["AsyncConformanceSuite", "AsyncSemaphoreSuite", "ConformanceSuite", "FakeClock", "SemaphoreSuite"]
