"""A-6 over postgresql://: the model-based test (lockkit/testing/model.py) on PostgreSQL, both faces, and with
server restarts. Budget and seeds as tests/test_model.py's (``LOCKKIT_MODEL_EXAMPLES`` and friends)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis.stateful import run_state_machine_as_test

from backends.servers import PostgresServer
from lockkit.testing.model import ModelTarget, machine_for
from tests.test_model import EXAMPLES, RESTART_EXAMPLES, TIMEOUT, _bounded_shrinking, _seeded, _settings

__all__ = ["_bounded_shrinking"]  # the shrinking cap applies here too (an autouse fixture of test_model)


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("face", ["sync", "async"])
def test_model_postgres(face: str, postgres_server: PostgresServer) -> None:
    url: Callable[[Path], str] = lambda _: postgres_server.url  # noqa: E731
    target = ModelTarget(kind="postgres", face=face, url=url, children=True)
    machine = _seeded(machine_for(target), f"postgres-{face}")
    run_state_machine_as_test(machine, settings=_settings(EXAMPLES))


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("face", ["sync", "async"])
def test_model_postgres_restarts(face: str, fresh_postgres: Callable[..., PostgresServer]) -> None:
    server = fresh_postgres()
    target = ModelTarget(
        kind="postgres", face=face, url=lambda _: server.url, restart=lambda _member: server.restart(), children=False
    )
    machine = _seeded(machine_for(target), f"postgres-{face}-restart")
    run_state_machine_as_test(machine, settings=_settings(RESTART_EXAMPLES))
