"""A small model-based (stateful) test of semaphores and reader-writer locks, blocking face, real backends.

Hypothesis drives random sequences over two clients: take a permit (``try_acquire``) of a semaphore whose
limit the example draws, take a read or write side of a reader-writer lock, release, renew, wait, and let
leases without auto-renewal run out. After every step it checks what the contract promises whatever the
sequence: at no instant more valid permit leases than the limit; a valid writer's lease is the only valid
lease of its rwlock; every grant's fencing token is above every earlier grant's of the name; a released
lease is never valid. (The lock's model, lockkit/testing/model.py, does not have these rules yet.)
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

import lockkit
from backends.servers import EtcdServer, RedisServer

TTL = {"memory": 0.6, "file": 0.6, "redis": 0.6, "etcd": 2.0, "postgres": 0.6}


def _machine(url: str, ttl: float) -> type[RuleBasedStateMachine]:
    class PermitModel(RuleBasedStateMachine):
        @initialize(limit=st.integers(1, 3))
        def open(self, limit: int) -> None:
            self.clients = [lockkit.connect(url), lockkit.connect(url)]
            tag = uuid.uuid4().hex[:8]
            self.sem, self.rw, self.limit = f"model-sem-{tag}", f"model-rw-{tag}", limit
            self.held: list[tuple[str, Any, lockkit.Lease]] = []  # (kind, handle, lease), kind: permit/read/write
            self.last_fence: dict[str, int] = {}

        def _granted(self, name: str, kind: str, handle: Any, lease: lockkit.Lease | None) -> None:
            if lease is None:
                return
            fence = lease.fencing_token
            assert fence > self.last_fence.get(name, 0), f"fence {fence} not above {self.last_fence.get(name)}"
            self.last_fence[name] = fence
            self.held.append((kind, handle, lease))

        @rule(client=st.integers(0, 1), renewing=st.booleans())
        def take_permit(self, client: int, renewing: bool) -> None:
            handle = self.clients[client].semaphore(self.sem, limit=self.limit, ttl=ttl, auto_renew=renewing)
            self._granted(self.sem, "permit", handle, handle.try_acquire())

        @rule(client=st.integers(0, 1), write=st.booleans(), renewing=st.booleans())
        def take_side(self, client: int, write: bool, renewing: bool) -> None:
            rw = self.clients[client].rwlock(self.rw, ttl=ttl, auto_renew=renewing)
            handle = rw.write() if write else rw.read()
            self._granted(self.rw, "write" if write else "read", handle, handle.try_acquire())

        @rule(data=st.data())
        def release(self, data: st.DataObject) -> None:
            if not self.held:
                return
            _, handle, lease = self.held.pop(data.draw(st.integers(0, len(self.held) - 1)))
            try:
                handle.release()
            except (lockkit.LockNotOwned, lockkit.LockLost):
                assert not lease.valid
            assert not lease.valid, "a released lease must not say valid"

        @rule(data=st.data())
        def renew(self, data: st.DataObject) -> None:
            if not self.held:
                return
            _, handle, lease = self.held[data.draw(st.integers(0, len(self.held) - 1))]
            try:
                handle.renew()
            except lockkit.LockLost:
                assert not lease.valid

        @rule(seconds=st.sampled_from([0.0, 0.05, ttl * 0.5, ttl * 1.2]))
        def wait(self, seconds: float) -> None:
            time.sleep(seconds)

        @invariant()
        def limits_hold(self) -> None:
            if not hasattr(self, "held"):
                return
            valid = [(kind, lease) for kind, _, lease in self.held if lease.valid]
            permits = sum(1 for kind, _ in valid if kind == "permit")
            assert permits <= self.limit, f"{permits} valid permits with limit {self.limit}"
            side = [kind for kind, _ in valid if kind in ("read", "write")]
            if "write" in side:
                assert len(side) == 1, f"a writer shares the rwlock: {side}"

        def teardown(self) -> None:
            for client in getattr(self, "clients", []):
                client.close()

    return PermitModel


@pytest.fixture(params=["memory", "file", "redis", "etcd", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    if request.param == "memory":
        return "memory", f"memory://model-{uuid.uuid4().hex[:8]}"
    if request.param == "file":
        return "file", (tmp_path / "locks").as_uri()
    server: RedisServer | EtcdServer = request.getfixturevalue(f"{request.param}_server")
    return request.param, server.url


def test_permit_model(backend: tuple[str, str]) -> None:
    kind, url = backend
    machine = _machine(url, TTL[kind])
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=12 if kind in ("etcd", "postgres") else 40,
            stateful_step_count=20,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
        ),
    )
