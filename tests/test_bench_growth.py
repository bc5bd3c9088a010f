"""lockkit bench --growth and lockkit.cli.growth: the curves are produced and read back (no speed is asserted)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from lockkit.cli import bench, growth

HAS_MPL = importlib.util.find_spec("matplotlib") is not None


def _sample() -> list[growth.Growth]:
    return [
        growth.Growth(
            "redis",
            "redis://127.0.0.1:6379/0",
            0.1,
            contention=[growth.ContentionPoint(n, 400.0 / n, 450.0, 1.0 * n, 3.0 * n, 0.9, 3) for n in (1, 2, 4)],
            renewal=[growth.RenewalPoint(n, 4.5, 0.01 * n, 2 * n, 7.0, 3000.0, True) for n in (10, 100)],
            notes=["renewal curve stops at 100 locks: for the test"],
        ),
        growth.Growth("memory", "memory://x", 0.01, renewal=[growth.RenewalPoint(10, 4.5, 0.0, 20, 5.0, 2000.0, True)]),
    ]


def test_int_list_reads_comma_separated_counts_and_refuses_the_rest() -> None:
    assert bench.int_list("1,2,16") == (1, 2, 16)
    assert bench.positive_int("3") == 3
    for bad in ("1,x", "", "0", "2,-1"):
        with pytest.raises(argparse.ArgumentTypeError, match="got"):
            bench.int_list(bad)
    with pytest.raises(argparse.ArgumentTypeError, match="one whole number"):
        bench.positive_int("1,2")


def test_plot_paths_derive_two_files_from_one() -> None:
    assert growth.plot_paths("docs/images/growth.png") == (
        "docs/images/growth-contention.png",
        "docs/images/growth-renewal.png",
    )
    assert growth.plot_paths("out/growth") == ("out/growth-contention.png", "out/growth-renewal.png")
    assert growth.plot_paths("g.svg") == ("g-contention.svg", "g-renewal.svg")


def test_json_round_trip_ignores_keys_it_does_not_know() -> None:
    results = _sample()
    data = json.loads(growth.to_json(results))
    data[0]["renewal"][0]["floor_us"] = 4.2  # bench_growth.py adds the raw floor to redis:// points
    data[0]["extra"] = "ignored"
    assert growth.from_json(json.dumps(data)) == results


def test_table_shows_both_curves_and_the_notes() -> None:
    text = growth.growth_table(_sample())
    assert "## redis" in text and "## memory" in text
    assert "handoffs/s" in text and "CPU/renewal" in text
    assert "note: renewal curve stops at 100 locks" in text


@pytest.mark.skipif(not HAS_MPL, reason="needs matplotlib (lockkit[plot])")
def test_plot_growth_writes_both_pictures(tmp_path: Path) -> None:
    written = growth.plot_growth(_sample(), str(tmp_path / "g.png"), floors={"redis": [(10, 4.0), (100, 4.1)]})
    assert [Path(p).name for p in written] == ["g-contention.png", "g-renewal.png"]
    assert all(Path(p).stat().st_size > 1000 for p in written)


def test_renewal_curve_stops_where_acquiring_would_take_too_long() -> None:
    config = {"backends": {"default": {"url": "memory://growth-stop"}}}
    (result,) = growth.measure(config, procs=(), sizes=(10, 10**9), hold=0.1, max_acquire_s=1.0, rounds=5)
    assert [p.locks for p in result.renewal] == [10]
    point = result.renewal[0]
    assert point.all_held and point.renewals >= 10 and point.cpu_us_per_renewal > 0 and point.bytes_per_lock > 0
    assert any("stops at 10 locks" in note for note in result.notes)
    assert any("contention curve not measured" in note for note in result.notes)  # memory:// is per process


def test_renew_ttl_grows_only_past_ten_thousand_locks() -> None:
    assert growth.renew_ttl(10) == growth.renew_ttl(10_000) == growth.RENEW_TTL
    assert growth.renew_ttl(100_000) > growth.RENEW_TTL


def test_bench_growth_command_end_to_end(tmp_path: Path) -> None:
    args = [
        sys.executable, "-m", "lockkit.cli", "bench", "--growth", "--url", (tmp_path / "locks").as_uri(),
        "--growth-processes", "1,2", "--growth-locks", "10", "--growth-runs", "1", "--seconds", "0.5",
        "--rounds", "20", "--growth-hold", "0.2", "--json",
    ]  # fmt: skip
    if HAS_MPL:
        args += ["--plot", str(tmp_path / "g.png")]
    done = subprocess.run(args, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    (result,) = json.loads(done.stdout)
    assert [c["procs"] for c in result["contention"]] == [1, 2]
    assert result["contention"][1]["handoffs_per_s"] > 0
    assert [p["locks"] for p in result["renewal"]] == [10] and result["renewal"][0]["all_held"] is True
    if HAS_MPL:
        assert (tmp_path / "g-contention.png").stat().st_size > 1000
        assert (tmp_path / "g-renewal.png").stat().st_size > 1000


def test_bench_growth_refuses_a_bad_list() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "lockkit.cli", "bench", "--growth", "--growth-locks", "10,ten"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "comma-separated whole numbers" in done.stderr
