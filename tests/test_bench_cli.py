"""lockkit bench runs end to end (its numbers are for people; the test checks only that they are produced)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

BENCH = [
    sys.executable,
    "-m",
    "lockkit.cli",
    "bench",
    "--rounds",
    "20",
    "--seconds",
    "1",
    "--renew-locks",
    "20",
    "--renew-seconds",
    "0.5",
]


def test_bench_reports_every_measure(tmp_path: Path) -> None:
    args = [*BENCH, "--url", (tmp_path / "locks").as_uri(), "--json"]
    if importlib.util.find_spec("matplotlib"):
        args += ["--plot", str(tmp_path / "bench.png")]
    done = subprocess.run(args, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    (result,) = json.loads(done.stdout)
    assert result["uncontended_ms_p50"] > 0 and result["renewal_all_held"] is True
    assert result["handoffs_per_s"] is not None and result["fairness"] is not None
    assert result["tokens_in_order"] is True and result["contention_error"] is None
    if importlib.util.find_spec("matplotlib"):
        assert (tmp_path / "bench.png").stat().st_size > 1000


def test_bench_does_not_pretend_processes_share_memory() -> None:
    done = subprocess.run([*BENCH, "--url", "memory://bench"], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "default" in done.stdout and " - " in done.stdout
