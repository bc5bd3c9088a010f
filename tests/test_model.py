"""A-6: the model-based test. Random sequences of API calls and faults, every backend, both faces.

The machine (rules and invariants) is :mod:`lockkit.testing.model`; this module binds it to the real servers
of ``backends/``. ``test_model`` runs it over the shared servers for every backend × face;
``test_model_restarts`` adds server restarts (keeping data) on servers of its own, with a smaller budget.

Budget (each test stays under the 120 s per-test timeout; the whole file ~100 s on 2 cores by default):

    LOCKKIT_MODEL_EXAMPLES=<n>   examples per backend × face (default 4; restart tests: half of it, ≥ 1)
    LOCKKIT_MODEL_STEPS=<n>      steps per example (default 9; restart tests: the same)
    LOCKKIT_MODEL_SEED=<n>       mixed into each test's fixed seed (default 0), to explore other sequences
    LOCKKIT_MODEL_SHRINK_SECONDS=<s>  how long Hypothesis may shrink a failure (default 40; every replay runs
                                 in real time, and an unshrunk failure still prints its whole sequence)

e.g. ``LOCKKIT_MODEL_EXAMPLES=50 LOCKKIT_MODEL_STEPS=20 .venv/bin/python -m pytest tests/test_model.py``; with
either variable set the per-test timeout grows with the budget. Runs are seeded (``@seed``, no example
database) so a failure reproduces with the same variables, as far as real time lets it.
"""

from __future__ import annotations

import os
import uuid
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis.stateful import run_state_machine_as_test

from backends.servers import EtcdServer, RedisCluster, RedisServer, RedlockServers, SentinelSet, ZooKeeperServer
from lockkit.testing.model import ModelTarget, machine_for

EXAMPLES = int(os.environ.get("LOCKKIT_MODEL_EXAMPLES", "4"))
STEPS = int(os.environ.get("LOCKKIT_MODEL_STEPS", "9"))
SEED = int(os.environ.get("LOCKKIT_MODEL_SEED", "0"))
SHRINK_SECONDS = int(os.environ.get("LOCKKIT_MODEL_SHRINK_SECONDS", "40"))
RESTART_EXAMPLES = max(1, EXAMPLES // 2)
ZK_SESSION = 2.0  # seconds: a ZooKeeper lock's ttl is its session's timeout

_custom = any(f"LOCKKIT_MODEL_{v}" in os.environ for v in ("EXAMPLES", "STEPS", "SHRINK_SECONDS"))
# About 3 s per step at worst (a pause past a ttl, a restart); the default budget keeps the 120 s timeout.
TIMEOUT = max(120, 30 + 3 * EXAMPLES * STEPS + SHRINK_SECONDS) if _custom else 120


@pytest.fixture(autouse=True)
def _bounded_shrinking(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every replay of a failing sequence sleeps in real time: cap the shrinking (Hypothesis' default is 300 s)
    so that a failure is reported, with its sequence, well inside the per-test timeout."""
    from hypothesis.internal.conjecture import engine

    monkeypatch.setattr(engine, "MAX_SHRINKING_SECONDS", SHRINK_SECONDS)


# postgresql:// is bound in tests/test_postgres_model.py. Sentinel and Cluster have no restart rule: restarting a
# master is a failover (R-6 and S-20 cover it), not a restart that keeps data.
KINDS = ["memory", "file", "redis", "redlock", "sentinel", "cluster", "zookeeper", "etcd"]
FACES = ["sync", "async"]


def _settings(examples: int) -> settings:
    return settings(
        max_examples=examples,
        stateful_step_count=STEPS,
        deadline=None,
        database=None,
        derandomize=False,  # a fixed @seed per test instead: each backend × face explores its own sequences
        print_blob=False,
        phases=[Phase.explicit, Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )


def _seeded(machine: type[Any], label: str) -> type[Any]:
    seeded: type[Any] = seed(zlib.crc32(label.encode()) ^ SEED)(machine)
    return seeded


def _url(kind: str, request: pytest.FixtureRequest) -> Callable[[Path], str]:
    if kind == "memory":
        return lambda _: f"memory://model-{uuid.uuid4().hex[:12]}"
    if kind == "file":
        return lambda workdir: (workdir / "locks").as_uri()
    if kind == "redis":
        redis: RedisServer = request.getfixturevalue("redis_server")
        return lambda _: redis.url
    if kind == "redlock":
        redlock: RedlockServers = request.getfixturevalue("redlock_servers")
        return lambda _: redlock.url
    if kind == "sentinel":
        sentinels: SentinelSet = request.getfixturevalue("sentinel_set")
        return lambda _: sentinels.url
    if kind == "cluster":
        cluster: RedisCluster = request.getfixturevalue("redis_cluster")
        return lambda _: cluster.url
    if kind == "zookeeper":
        zk: ZooKeeperServer = request.getfixturevalue("zookeeper_server")
        return lambda _: f"{zk.url}/model-{uuid.uuid4().hex[:8]}?session_timeout={ZK_SESSION}"
    etcd: EtcdServer = request.getfixturevalue("etcd_server")
    return lambda _: etcd.url


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("face", FACES)
@pytest.mark.parametrize("kind", KINDS)
def test_model(kind: str, face: str, request: pytest.FixtureRequest) -> None:
    target = ModelTarget(
        kind=kind,
        face=face,
        url=_url(kind, request),
        children=kind != "memory",
        session_ttl=ZK_SESSION if kind == "zookeeper" else 0.0,
    )
    machine = _seeded(machine_for(target), f"{kind}-{face}")
    run_state_machine_as_test(machine, settings=_settings(EXAMPLES))


# Redis and Redlock keep their locks and fencing counters across a restart only with persistence: without it a
# restart forgets a held lock (documented for redis://, where fencing tokens can also go backwards).
_AOF = ["--appendonly", "yes", "--appendfsync", "always"]


@pytest.fixture
def restartable(
    request: pytest.FixtureRequest,
    fresh_redis: Callable[..., RedisServer],
    fresh_redlock: Callable[..., RedlockServers],
    fresh_zookeeper: Callable[..., ZooKeeperServer],
    fresh_etcd: Callable[..., EtcdServer],
) -> Iterator[tuple[Callable[[Path], str], Callable[[int], None]]]:
    kind: str = request.param
    if kind == "redis":
        redis = fresh_redis(extra_args=_AOF)
        yield (lambda _: redis.url), (lambda _member: redis.restart())
    elif kind == "redlock":
        group = fresh_redlock(n=5, extra_args=_AOF)
        yield (lambda _: group.url), (lambda member: group[member % len(group)].restart())
    elif kind == "zookeeper":
        zk = fresh_zookeeper()
        yield (
            (lambda _: f"{zk.url}/model-{uuid.uuid4().hex[:8]}?session_timeout={ZK_SESSION}"),
            (lambda _member: zk.restart()),
        )
    else:
        etcd = fresh_etcd()
        yield (lambda _: etcd.url), (lambda _member: etcd.restart())


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize(
    ("restartable", "face"),
    [("redis", "async"), ("redlock", "sync"), ("zookeeper", "async"), ("etcd", "sync")],
    indirect=["restartable"],
)
def test_model_restarts(
    restartable: tuple[Callable[[Path], str], Callable[[int], None]], face: str, request: pytest.FixtureRequest
) -> None:  # A-6, with server restarts
    url, restart = restartable
    kind = request.node.callspec.id.split("-")[0]
    target = ModelTarget(
        kind=kind,
        face=face,
        url=url,
        restart=restart,
        children=False,
        session_ttl=ZK_SESSION if kind == "zookeeper" else 0.0,
    )
    machine = _seeded(machine_for(target), f"{kind}-{face}-restart")
    run_state_machine_as_test(machine, settings=_settings(RESTART_EXAMPLES))
