"""A-6: the model's drift and renewal checks can fail: a planted driver bug they, and only they, catch.

``LateSentAtFileDriver`` is file:// with one lie: every grant (acquire and renew) says it was sent 3.5 ms later
than it was, so each lease trusts 3.5 ms past what the front end may (send time + ttl − drift): a "fake lock"
by less than the drift margin, which the model's older check (deadline ≤ the server's expiry) let through.
The model must find it through a renewal's bound (return + ttl − drift) or the server's time left less drift.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.errors import FlakyFailure
from hypothesis.stateful import run_state_machine_as_test

from lockkit.driver import Cancel, Grant
from lockkit.drivers.embedded.file import FileDriver
from lockkit.testing.model import ModelTarget, machine_for
from tests.test_model import _bounded_shrinking, _seeded, _settings

__all__ = ["LateSentAtFileDriver", "_bounded_shrinking"]

LIE = 0.0035
"""Seconds the planted driver moves every grant's send time forward: less than the smallest drift margin the
model meets (4 ms, for the shortest renewal ttl 0.2 s), so the model's older checks (deadline ≤ return + ttl,
≤ the server's expiry + 5 ms) let it through."""


class LateSentAtFileDriver(FileDriver):
    """Excludes and fences correctly, but reports each grant's send time ``LIE`` seconds late."""

    def acquire(
        self, name: str, token: str, ttl: float, deadline: float | None, cancel: Cancel | None = None
    ) -> Grant | None:
        grant = super().acquire(name, token, ttl, deadline, cancel)
        return None if grant is None else grant._replace(sent_at=grant.sent_at + LIE)

    def renew(self, name: str, token: str, ttl: float) -> Grant | None:
        grant = super().renew(name, token, ttl)
        return None if grant is None else grant._replace(sent_at=grant.sent_at + LIE)


@pytest.fixture
def late_scheme(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Register ``latesentfile://`` for this process only (an entry point, as a third-party driver would)."""
    site = tmp_path / "site"
    info = site / "lockkit_test_model_can_fail-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: lockkit-test-model-can-fail\nVersion: 0\n")
    (info / "entry_points.txt").write_text(
        f"[lockkit.drivers]\nlatesentfile = {__name__}:{LateSentAtFileDriver.__qualname__}\n"
    )
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p))
    monkeypatch.syspath_prepend(str(site))
    return "latesentfile"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("face", ["sync", "async"])
def test_model_finds_a_deadline_past_the_drift_margin(face: str, late_scheme: str) -> None:
    target = ModelTarget(
        kind="file",
        face=face,
        url=lambda workdir: (workdir / "locks").as_uri().replace("file://", f"{late_scheme}://", 1),
        children=False,
    )
    machine = _seeded(machine_for(target), f"late-sent-{face}")
    budget = settings(_settings(20), stateful_step_count=9, phases=[Phase.generate],
                      suppress_health_check=list(HealthCheck))  # fmt: skip
    with pytest.raises((AssertionError, FlakyFailure)) as caught:
        run_state_machine_as_test(machine, settings=budget)
    found = str(caught.value)
    assert "drift margin" in found or "− drift" in found, found[:2000]
