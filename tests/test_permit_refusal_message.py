"""A refused semaphore names the backends that do offer them, as this installation's drivers declare."""

from __future__ import annotations

import pytest

import lockkit
from lockkit.driver import Guarantees, Offer
from lockkit.permits import check_offered, offering_schemes
from lockkit.registry import builtin_schemes, load_factory


def test_the_refusal_lists_exactly_the_offering_schemes() -> None:
    refusing = Guarantees("single-node", True, "strict", False, "ttl", semaphores=Offer("never", "x" * 40))
    with pytest.raises(lockkit.ConfigError) as caught:
        check_offered(refusing, "orders")
    message = str(caught.value)
    offering = offering_schemes()
    assert "memory://" in offering and "redlock://" not in offering
    for scheme in builtin_schemes():
        offers = bool(load_factory(scheme).guarantees.semaphores)
        assert (f"{scheme}://" in offering) is offers, scheme
    assert f"({', '.join(offering)};" in message
    assert "'orders'" in message and "(never: " in message
