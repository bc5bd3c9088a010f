"""Run every benchmark and regenerate the measured section of docs/benchmarks.md.

    .venv/bin/python -m benchmarks                 # all drivers, default sizes (several minutes)
    .venv/bin/python -m benchmarks --quick         # small sizes, for a smoke run
    .venv/bin/python -m benchmarks --only redis    # one driver

    .venv/bin/python -m benchmarks --only async    # the asyncio faces against asyncio floors (bench_async.py)
    .venv/bin/python -m benchmarks --only semaphores  # semaphores and rwlocks against the mutex

Each benchmark starts its own throw-away servers on loopback, measures the raw floor in the same run and
prints medians and ratios. The output replaces the text between ``<!-- measured:begin -->`` and
``<!-- measured:end -->`` in docs/benchmarks.md, together with the machine it ran on.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"
BEGIN, END = "<!-- measured:begin -->", "<!-- measured:end -->"
QUICK = {
    "async": ["--ops", "100", "--rounds", "3"],
    "redis": ["--ops", "100", "--rounds", "3", "--contend", "2", "--locks", "1000", "--hold", "4"],
    "zookeeper": ["--rounds", "300", "--many", "1000", "--hold", "4", "--contend", "2"],
    "etcd": ["--rounds", "300", "--many", "1000", "--hold", "4", "--contend", "2"],
    "growth": ["--quick", "--no-plot", "--json", os.devnull],  # the full run rewrites docs/images/growth-*.png
    "postgres": ["--rounds", "300", "--many", "1000", "--hold", "2", "--contend", "2"],
    "redis_ha": ["--ops", "100", "--rounds", "3", "--kills", "1"],  # bench_redis_ha.py: Sentinel and Cluster
    "semaphores": ["--rounds", "200", "--contend", "1", "--limits", "1,2"],  # against the mutex (issue 18)
    # the full run rewrites docs/images/semaphore-scaling.png and benchmarks/results/semaphore_scaling.json
    "semaphore_scaling": ["--limits", "1,4", "--seconds", "1", "--runs", "1", "--no-plot", "--json", os.devnull],
}
COMPARE_QUICK = ["--quick"]


def _version(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
        return (out.stdout or out.stderr).strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


def machine() -> str:
    load = os.getloadavg()
    return "\n".join(
        [
            f"- date: {time.strftime('%Y-%m-%d')}; {platform.platform()}; {os.cpu_count()} cores; "
            f"load average at start {load[0]:.1f}",
            f"- Python {platform.python_version()}; {_version(['redis-server', '--version'])}; "
            f"{_version(['etcd', '--version'])}",
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", choices=sorted(QUICK))
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    args = parser.parse_args()
    sections = [machine()]
    failed: list[str] = []
    for name in sorted(QUICK) if not args.only else [args.only]:
        cmd = [sys.executable, str(ROOT / "benchmarks" / f"bench_{name}.py"), *(QUICK[name] if args.quick else [])]
        print(f"== {name}: {' '.join(cmd[1:])}", flush=True)
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        print(done.stdout, end="")
        if done.returncode:
            print(done.stderr, file=sys.stderr)
            failed.append(name)
        shown = " ".join(["python", f"benchmarks/bench_{name}.py", *cmd[2:]])
        sections.append(f"### {name}\n\n`{shown}`\n\n```\n{done.stdout.strip()}\n```")
    if not args.only:
        cmd = [
            sys.executable,
            str(ROOT / "benchmarks" / "compare_libraries.py"),
            *(COMPARE_QUICK if args.quick else []),
        ]
        print(f"== libraries: {' '.join(cmd[1:])}", flush=True)
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        print(done.stdout, end="")
        if done.returncode:
            print(done.stderr, file=sys.stderr)
            failed.append("libraries")
        shown = " ".join(["python", "benchmarks/compare_libraries.py", *cmd[2:]])
        sections.append(
            f"### lockkit next to the libraries users would otherwise pick\n\n`{shown}`\n\n{done.stdout.strip()}"
        )
    if failed:
        print(f"benchmarks failed: {', '.join(failed)}; docs/benchmarks.md left as it was", file=sys.stderr)
        return 1
    if not args.no_write and not args.only:
        text = DOC.read_text()
        head, _, rest = text.partition(BEGIN)
        _, _, tail = rest.partition(END)
        DOC.write_text(f"{head}{BEGIN}\n" + "\n\n".join(sections) + f"\n{END}{tail}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
