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


def test_wrappers_that_do_not_pass_permits_through_declare_it(tmp_path: Path) -> None:
    """A fencing_epoch option and a migrate backend (any phase) declare permits "not yet" in their guarantees,
    which ``Locker.guarantees()`` shows, and the refusal says what to configure instead (they declared the
    wrapped driver's "yes" and then refused at the call)."""
    epoch = {"default": "e", "backends": {"e": {"url": "memory://wrapped", "fencing_epoch": 1}}}
    for phase in ("old", "both", "new"):
        migrate = {
            "default": "mig",
            "backends": {
                "a": {"url": (tmp_path / "a").as_uri()},
                "b": {"url": (tmp_path / "b").as_uri()},
                "mig": {"migrate": {"from": "a", "to": "b", "phase": phase}},
            },
        }
        for config, why in ((epoch, "without fencing_epoch"), (migrate, "moves locks only")):
            with lockkit.from_config(config) as locks:
                offer = locks.guarantees()[config["default"]].semaphores
                assert offer.offered == "not yet" and why in offer.why
                with pytest.raises(lockkit.ConfigError, match=f"not yet: .*{why}"):
                    locks.semaphore("s", limit=2).try_acquire()
                with pytest.raises(lockkit.ConfigError, match=f"not yet: .*{why}"):
                    locks.rwlock("s").write().try_acquire()
