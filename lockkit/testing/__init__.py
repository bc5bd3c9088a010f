"""The conformance suite every lockkit driver passes, shipped so third-party drivers can run it too.

Subclass in a pytest module and provide a function-scoped ``url`` fixture::

    from lockkit.testing import AsyncConformanceSuite, ConformanceSuite

    class TestMyDriver(ConformanceSuite):
        @pytest.fixture
        def url(self, my_server):
            return my_server.url

The async suite needs pytest-asyncio (``asyncio_mode = "auto"``).
"""

from .clock import FakeClock
from .conformance import AsyncConformanceSuite, ConformanceSuite

__all__ = ["AsyncConformanceSuite", "ConformanceSuite", "FakeClock"]
