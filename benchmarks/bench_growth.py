"""How cost grows, per backend: the contention curve and the renewal curve (issue 17), as JSON and two pictures.

    .venv/bin/python benchmarks/bench_growth.py [--quick] [--only redis,etcd] [--json PATH] [--plot PATH]

Starts its own throw-away servers on loopback (backends/servers.py): one Redis, five Redis masters (redlock://),
one ZooKeeper, one etcd; file:// in a temporary directory; memory://. The measuring is
:mod:`lockkit.cli.growth` (what ``lockkit bench --growth`` runs on a team's own servers):

* contention: 1, 2, 4, 8, 16 processes on one name, each holding ~1 ms; handoffs/s and waits, median of
  3 runs of 1 s (memory:// is not shared between processes: skipped);
* renewal: 10 … 100,000 locks held with auto-renewal in this process; CPU per renewal (process time) and
  Python memory per lock (tracemalloc). A size is skipped where acquiring it would take longer than
  ``--max-acquire`` seconds at the rate of the size before (the note says so).

For redis:// the renewal points also carry the raw floor: the CPU per key of a redis-py pipeline of
``PEXPIRE`` over the same number of keys, from this process (``floor_us`` in the JSON, the dashed line).

Writes the JSON to ``--json`` (default benchmarks/results/growth.json) and, unless ``--no-plot``, the two
pictures ``PATH-contention.png`` and ``PATH-renewal.png`` (default docs/images/growth.png).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import tempfile
import time
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis

from backends.servers import EtcdServer, RedisServer, RedlockServers, ZooKeeperServer
from lockkit.cli import growth

ROOT = Path(__file__).resolve().parent.parent
BACKENDS = ("memory", "file", "redis", "redlock", "zookeeper", "etcd")


def raw_floor_us(port: int, n: int, rounds: int = 3) -> float:
    """CPU µs per key of a redis-py ``PEXPIRE`` pipeline over ``n`` keys (the median round of ``rounds``)."""
    client = redis.Redis(port=port)
    keys = [f"growth:floor:{uuid.uuid4().hex[:8]}:{i}" for i in range(n)]
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.set(key, "x", px=60_000)
    pipe.execute()
    times = []
    for _ in range(rounds):
        started = time.process_time()
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.pexpire(key, 60_000)
        pipe.execute()
        times.append(time.process_time() - started)
    client.delete(*keys)
    client.close()
    return sorted(times)[len(times) // 2] / n * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1, 2, 4 processes, one run; up to 1,000 locks")
    parser.add_argument("--only", default=",".join(BACKENDS), help=f"comma-separated, of {', '.join(BACKENDS)}")
    parser.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "growth.json"), dest="out")
    parser.add_argument("--plot", default=str(ROOT / "docs" / "images" / "growth.png"))
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--from-json", metavar="PATH", help="measure nothing: draw the pictures of a saved run")
    parser.add_argument("--seconds", type=float, default=1.0, help="length of one contention run (1)")
    parser.add_argument("--runs", type=int, default=3, help="contention runs per point, median (3)")
    parser.add_argument("--hold", type=float, default=4.0, help="seconds each renewal point is held (4)")
    parser.add_argument("--max-acquire", type=float, default=40.0, help="skip sizes slower to acquire (40 s)")
    args = parser.parse_args()
    only = [name for name in args.only.split(",") if name]
    unknown = sorted(set(only) - set(BACKENDS))
    if unknown:
        parser.error(f"unknown backend(s) {', '.join(unknown)}; choose from {', '.join(BACKENDS)}")
    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text())["backends"]
        for path in growth.plot_growth(growth.from_json(json.dumps(saved)), args.plot, floors=_floors(saved)):
            print(f"plot written to {path}", file=sys.stderr)
        return 0
    procs, sizes, runs = growth.PROCESSES, growth.SIZES, args.runs
    if args.quick:
        procs, sizes, runs = (1, 2, 4), (10, 100, 1000), 1
    started = time.monotonic()
    load = os.getloadavg()[0]
    results: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        urls: dict[str, str] = {}
        redis_port = None
        for name in only:
            if name == "memory":
                urls[name] = f"memory://growth-{uuid.uuid4().hex[:6]}"
            elif name == "file":
                urls[name] = Path(stack.enter_context(tempfile.TemporaryDirectory())).as_uri()
            elif name == "redis":
                server = stack.enter_context(RedisServer())
                urls[name], redis_port = server.url, server.port
            elif name == "redlock":
                urls[name] = stack.enter_context(RedlockServers(5)).url
            elif name == "zookeeper":
                urls[name] = stack.enter_context(ZooKeeperServer()).url
            elif name == "etcd":
                urls[name] = stack.enter_context(EtcdServer()).url
        for name, url in urls.items():
            print(f"== {name}", file=sys.stderr, flush=True)
            config = {"backends": {name: {"url": url}}, "default": name}
            (measured,) = growth.measure(
                config, procs=procs, sizes=sizes, seconds=args.seconds, runs=runs, hold=args.hold,
                max_acquire_s=args.max_acquire,
            )  # fmt: skip
            row = asdict(measured)
            if name == "redis" and redis_port is not None:
                for point in row["renewal"]:
                    point["floor_us"] = raw_floor_us(redis_port, point["locks"])
            results.append(row)
            print(growth.growth_table([measured]), flush=True)
    elapsed = time.monotonic() - started
    report = {
        "machine": f"{platform.platform()}; {os.cpu_count()} cores; Python {platform.python_version()}; "
        f"load average at start {load:.1f}",
        "command": " ".join(["python", "benchmarks/bench_growth.py", *sys.argv[1:]]),
        "seconds": round(elapsed),
        "backends": results,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\n{len(results)} backend(s) in {elapsed:.0f} s; JSON written to {out}", file=sys.stderr)
    if not args.no_plot:
        shown = growth.from_json(json.dumps(results))
        for path in growth.plot_growth(shown, args.plot, floors=_floors(results)):
            print(f"plot written to {path}", file=sys.stderr)
    lost = [r["backend"] for r in results if not all(p["all_held"] for p in r["renewal"])]
    if lost:
        print(f"locks were lost while renewed on: {', '.join(lost)}", file=sys.stderr)
    return 1 if lost else 0


def _floors(results: list[dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    return {
        r["backend"]: [(p["locks"], p["floor_us"]) for p in r["renewal"] if "floor_us" in p]
        for r in results
        if any("floor_us" in p for p in r["renewal"])
    }


if __name__ == "__main__":
    sys.exit(main())
