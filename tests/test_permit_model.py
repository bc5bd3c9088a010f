"""A-6 / S-7: the model-based test of semaphores and reader-writer locks, every backend that offers them, both faces.

The machine is the lock's (:mod:`lockkit.testing.model`) with ``ModelTarget(permits=True)``: each example's
names are semaphores of a drawn limit or reader-writer locks, and every rule of the lock's model applies to
them (acquire kinds, renew with shorter and longer ttls, release, close, outliving a lease, asyncio
cancellations, child holders paused, killed or releasing, server restarts), with the permit invariants: never
more valid permits than the limit, a valid writer alone, fencing per name over every mode, what
``permit_holders`` counts agreeing with the leases, nothing held past its ttl after release, close, death or
pause.

The backends are found, not listed: every scheme of :data:`KINDS` whose driver's ``Guarantees.semaphores``
says "yes" (read from the driver class: nothing is connected), so a backend that gains permits is run here
at once. Budget: ``LOCKKIT_MODEL_EXAMPLES`` and friends, as ``tests/test_model.py`` (the default runs 4
examples × 9 steps per backend × face). ``test_model_finds_broken_permits`` shows the model fails on each
planted permit bug of :mod:`lockkit.testing._broken`.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.errors import FlakyFailure
from hypothesis.stateful import run_state_machine_as_test

from backends.servers import EtcdServer, PostgresServer, RedisServer, ZooKeeperServer
from lockkit.registry import load_factory
from lockkit.testing._broken import entry_points_txt
from lockkit.testing.model import ModelTarget, machine_for
from tests.test_model import STEPS, TIMEOUT, ZK_SESSION, _bounded_shrinking, _seeded, _settings

__all__ = ["_bounded_shrinking"]  # the shrinking cap applies here too (an autouse fixture of test_model)

PERMIT_EXAMPLES = int(os.environ.get("LOCKKIT_MODEL_EXAMPLES", "4"))
RESTART_EXAMPLES = max(1, PERMIT_EXAMPLES * 3 // 4)

KINDS = {
    "memory": "memory",
    "file": "file",
    "redis": "redis",
    "sentinel": "redis+sentinel",
    "cluster": "redis+cluster",
    "redlock": "redlock",
    "zookeeper": "zookeeper",
    "etcd": "etcd",
    "postgres": "postgresql",
}
"""Every backend the model can be bound to: kind → its URL scheme."""


def _offered(scheme: str) -> bool:
    return bool(load_factory(scheme).guarantees.semaphores)


OFFERED = [kind for kind, scheme in KINDS.items() if _offered(scheme)]
RESTARTABLE = {"redis": "async", "etcd": "sync", "zookeeper": "async", "postgres": "sync"}
"""Backends with a restart (on servers of the test's own), and the face each restarts under."""


def _url(kind: str, request: pytest.FixtureRequest) -> Callable[[Path], str]:
    if kind == "memory":
        return lambda _: f"memory://permit-model-{uuid.uuid4().hex[:12]}"
    if kind == "file":
        return lambda workdir: (workdir / "locks").as_uri()
    if kind == "zookeeper":
        zk: ZooKeeperServer = request.getfixturevalue("zookeeper_server")
        return lambda _: f"{zk.url}/permit-model-{uuid.uuid4().hex[:8]}?session_timeout={ZK_SESSION}"
    fixture = {
        "redis": "redis_server",
        "sentinel": "sentinel_set",
        "cluster": "redis_cluster",
        "redlock": "redlock_servers",
        "etcd": "etcd_server",
        "postgres": "postgres_server",
    }[kind]
    server: Any = request.getfixturevalue(fixture)
    url: str = server.url
    return lambda _: url


def test_permit_backends_are_found_from_guarantees() -> None:
    """The model runs on exactly the backends that declare permits (and at least those of issue 18's first
    landing), so a backend that gains them is covered without editing this file."""
    assert {"memory", "file", "redis", "etcd"} <= set(OFFERED)
    assert "redlock" not in OFFERED  # "never": a per-permit quorum does not bound the holders


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("face", ["sync", "async"])
@pytest.mark.parametrize("kind", OFFERED)
def test_permit_model(kind: str, face: str, request: pytest.FixtureRequest) -> None:  # A-6, S-7
    target = ModelTarget(
        kind=kind,
        face=face,
        url=_url(kind, request),
        children=kind != "memory",
        session_ttl=ZK_SESSION if kind == "zookeeper" else 0.0,
        permits=True,
    )
    machine = _seeded(machine_for(target), f"permits-{kind}-{face}")
    run_state_machine_as_test(machine, settings=_settings(PERMIT_EXAMPLES))


@pytest.fixture
def restartable(
    request: pytest.FixtureRequest,
    fresh_redis: Callable[..., RedisServer],
    fresh_etcd: Callable[..., EtcdServer],
) -> Iterator[tuple[Callable[[Path], str], Callable[[int], None]]]:
    kind: str = request.param
    if kind == "redis":
        # Redis keeps permits and their fencing counter across a restart only with persistence
        redis = fresh_redis(extra_args=["--appendonly", "yes", "--appendfsync", "always"])
        yield (lambda _: redis.url), (lambda _member: redis.restart())
    elif kind == "etcd":
        etcd = fresh_etcd()
        yield (lambda _: etcd.url), (lambda _member: etcd.restart())
    elif kind == "zookeeper":
        zk: ZooKeeperServer = request.getfixturevalue("fresh_zookeeper")()
        yield (
            (lambda _: f"{zk.url}/permit-model-{uuid.uuid4().hex[:8]}?session_timeout={ZK_SESSION}"),
            (lambda _member: zk.restart()),
        )
    else:
        pg: PostgresServer = request.getfixturevalue("fresh_postgres")()
        yield (lambda _: pg.url), (lambda _member: pg.restart())


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize(
    ("restartable", "face"),
    [(kind, face) for kind, face in RESTARTABLE.items() if kind in OFFERED],
    indirect=["restartable"],
)
def test_permit_model_restarts(
    restartable: tuple[Callable[[Path], str], Callable[[int], None]], face: str, request: pytest.FixtureRequest
) -> None:  # A-6, S-7, with server restarts
    url, restart = restartable
    kind = request.node.callspec.id.split("-")[0]
    target = ModelTarget(
        kind=kind,
        face=face,
        url=url,
        restart=restart,
        children=False,
        session_ttl=ZK_SESSION if kind == "zookeeper" else 0.0,
        permits=True,
    )
    machine = _seeded(machine_for(target), f"permits-{kind}-{face}-restart")
    run_state_machine_as_test(machine, settings=_settings(RESTART_EXAMPLES))


# -- the model can fail ----------------------------------------------------------------------------------


@pytest.fixture
def broken_schemes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Register lockkit.testing._broken's schemes for this process and its child holders, nowhere else."""
    site = tmp_path / "site"
    info = site / "lockkit_test_broken_drivers-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: lockkit-test-broken-drivers\nVersion: 0\n")
    (info / "entry_points.txt").write_text(entry_points_txt())
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p))
    monkeypatch.syspath_prepend(str(site))


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("scheme", "face", "limits", "findings"),
    [
        ("overlimitfile", "sync", (1, 2, 3), ("valid permits of", "more than the limit")),
        ("writerreadsfile", "async", (0,), ("a valid writer shares", "while writer", "while reader")),
        ("frozenpermitfile", "sync", (0, 1, 2, 3), ("fencing:", "fencing token")),
    ],
    ids=["over-limit", "writer-beside-readers", "reused-fence"],
)
def test_model_finds_broken_permits(
    scheme: str, face: str, limits: tuple[int, ...], findings: tuple[str, ...], broken_schemes: None
) -> None:  # A-6, S-7
    """Each planted permit bug fails the model with the violation it plants (over-limit, a writer beside a
    reader, a reused fencing token: seen in the leases' validity or in what the server counts), within a small
    budget (names drawn among the kinds each bug breaks) and without shrinking."""
    target = ModelTarget(
        kind="file",
        face=face,
        url=lambda workdir: (workdir / "locks").as_uri().replace("file://", f"{scheme}://", 1),
        children=False,
        permits=True,
        limits=limits,
    )
    machine = _seeded(machine_for(target), f"broken-{scheme}")
    budget = settings(
        _settings(30),
        stateful_step_count=max(STEPS, 9),
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    with pytest.raises((AssertionError, FlakyFailure)) as caught:
        run_state_machine_as_test(machine, settings=budget)
    assert any(finding in str(caught.value) for finding in findings), str(caught.value)[:2000]
