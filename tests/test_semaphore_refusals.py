"""Backends without semaphores refuse them as data (Guarantees.semaphores) and with a clear ConfigError.

The offer is read from each driver class without connecting; the refusal is checked against real servers, on
both faces, so that it comes before any permit operation is sent.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import lockkit
from backends.servers import RedlockServers
from lockkit.driver import Offer
from lockkit.registry import builtin_schemes, load_factory

OFFERED = {"memory", "file", "redis", "rediss", "unix", "etcd", "etcds", "zookeeper"}
OFFERED |= {"redis+sentinel", "rediss+sentinel", "redis+cluster", "rediss+cluster"}  # fences lifted by the epoch


def _offer(scheme: str) -> Offer:
    try:
        return load_factory(scheme).guarantees.semaphores
    except lockkit.ConfigError as exc:  # a client package not installed
        pytest.skip(str(exc))


OFFERED |= {"postgresql", "postgres"}  # issue 18 on postgresql:// (advisory locks of their own key space)


@pytest.mark.parametrize("scheme", builtin_schemes())
def test_every_driver_declares_its_offer(scheme: str) -> None:
    offer = _offer(scheme)
    assert isinstance(offer, Offer)
    assert bool(offer) is (scheme in OFFERED)
    if scheme not in OFFERED:
        assert offer.offered in ("not yet", "never") and len(offer.why) > 30, "a refusal must say why"


def test_redlock_refuses_by_design_with_the_counterexample() -> None:
    offer = _offer("redlock")
    assert offer.offered == "never" and "limit 2 on 3" in offer.why


@pytest.mark.parametrize("scheme", ["redis+sentinel", "redis+cluster"])
def test_sentinel_and_cluster_offer_them(scheme: str) -> None:
    assert _offer(scheme).offered == "yes"



@pytest.mark.parametrize("which", ["redlock"])
def test_semaphore_refused_before_any_permit_is_sent(which: str, redlock_servers: RedlockServers) -> None:
    url = {"redlock": redlock_servers.url}[which]
    expected = r"\(never: "
    with lockkit.connect(url) as locks:
        with pytest.raises(lockkit.ConfigError, match=expected):
            locks.semaphore("refused", limit=2)
        with pytest.raises(lockkit.ConfigError, match=expected):
            locks.rwlock("refused")
        with locks.lock("refused", ttl=5) as lease:  # the backend's locks are untouched by the refusal
            assert lease.valid


@pytest.mark.parametrize("which", ["redlock"])
async def test_semaphore_refused_on_the_asyncio_face(which: str, redlock_servers: RedlockServers) -> None:
    url = {"redlock": redlock_servers.url}[which]
    async with lockkit.connect_async(url) as locks:
        with pytest.raises(lockkit.ConfigError, match="does not offer semaphores or reader-writer locks"):
            locks.semaphore("refused", limit=2)


def test_fencing_epoch_wrapper_refuses_rather_than_hand_out_unlifted_tokens() -> None:
    with lockkit.connect("memory://epoch-refusal?fencing_epoch=3") as locks, pytest.raises(
        lockkit.ConfigError, match="fencing_epoch"
    ):
        locks.semaphore("s", limit=2)


def test_docs_table_matches_the_declared_offers() -> None:
    text = (Path(__file__).resolve().parent.parent / "docs" / "semaphores.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `([a-z+]+)://` \| (yes|not yet|never) \|", text, re.M))
    rows_expected = {"memory", "file", "redis", "redis+sentinel", "redis+cluster", "redlock", "zookeeper", "etcd"}
    assert set(rows) == rows_expected | {"postgresql"}
    for scheme, offered in rows.items():
        assert _offer(scheme).offered == offered, scheme
