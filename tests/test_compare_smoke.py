"""Smoke run of benchmarks/compare_libraries.py: lockkit next to the other lock libraries, tiny sizes.

The benchmark starts its own servers on loopback. Libraries that are not installed (the benchmark-only
ones: python-redis-lock, pottery) are left out with ``--skip``; every other implementation must have
been measured. Nothing here asserts speed.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "compare_libraries.py"

# implementation key in the benchmark -> (module it imports, row label in its tables)
LIBRARIES = {
    "redis/redis-py": ("redis", "redis-py redis.lock.Lock"),
    "redis/python-redis-lock": ("redis_lock", "python-redis-lock"),
    "redlock/pottery": ("pottery", "pottery Redlock"),
    "zookeeper/kazoo": ("kazoo", "kazoo Lock recipe"),
    "etcd/pyetcd": ("pyetcd", "pyetcd client.lock (etcd-sdk-python)"),
}
TITLES = ["Redis (one server)", "Redlock (5 independent Redis masters)", "ZooKeeper (standalone)", "etcd (single node)"]
LOCKKIT_ROWS = ["lockkit redis://", "lockkit redlock://", "lockkit zookeeper://", "lockkit etcd://"]


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_compare_libraries_quick_prints_a_table_per_backend() -> None:
    missing = [key for key, (module, _) in LIBRARIES.items() if not _installed(module)]
    cmd = [sys.executable, str(SCRIPT), "--quick", "--ops", "10", "--rounds", "1", "--contend", "0.5"]
    if missing:
        cmd += ["--skip", ",".join(missing)]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=200)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout

    tables = re.split(r"^### ", out, flags=re.MULTILINE)[1:]
    assert [t.splitlines()[0] for t in tables] == TITLES, out
    measured = [label for key, (_, label) in LIBRARIES.items() if key not in missing] + LOCKKIT_ROWS
    for label in measured:
        row = next((line for line in out.splitlines() if line.startswith(f"| {label} |")), None)
        assert row is not None, f"no row for {label}:\n{out}"
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert re.fullmatch(r"\d+\.\d+", cells[2]), f"{label} was not measured: {row}\n{out}"
    for key in missing:
        assert f"{LIBRARIES[key][1]}: skipped" in out, out
