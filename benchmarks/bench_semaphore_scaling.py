"""How a semaphore's throughput grows with its limit (issue 18's "with limit N, throughput scales with N").

    .venv/bin/python benchmarks/bench_semaphore_scaling.py [--only redis,etcd,file] [--limits 1,2,4,8,16]
        [--procs 16] [--hold 0.01] [--seconds 3] [--runs 3] [--json PATH] [--plot PATH | --no-plot]

``--procs`` processes contend for one semaphore of each limit; each holds its permit ``--hold`` seconds by
*sleeping* (the work a permit guards is usually I/O: a call to a rate-limited API, an export), so the
holders' CPU is not what is measured. With a perfect backend the rate is ``min(limit, procs) / hold``
acquisitions per second (drawn dashed): the measured curve follows it while the backend keeps up and bends
where the server, the clients' CPU or the hand-off latency become the bottleneck. Each point is the median
of ``--runs`` runs. Writes the JSON (default benchmarks/results/semaphore_scaling.json) and the picture
(default docs/images/semaphore-scaling.png; needs matplotlib, ``lockkit[plot]``).

Every backend is a throw-away server on loopback (file:// a temporary directory).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from backends.servers import EtcdServer, PostgresServer, RedisServer, ZooKeeperServer  # noqa: E402
from benchmarks._common import contention  # noqa: E402
from benchmarks.bench_semaphores import PermitContender  # noqa: E402

SERVERS: dict[str, Any] = {
    "redis": RedisServer,
    "etcd": EtcdServer,
    "zookeeper": ZooKeeperServer,
    "postgres": PostgresServer,
}


@contextlib.contextmanager
def backend(kind: str) -> Iterator[str]:
    """The URL of a throw-away backend of ``kind``."""
    if kind == "file":
        with tempfile.TemporaryDirectory(prefix="lockkit-sem-scaling-") as tmp:
            yield f"file://{tmp}"
        return
    server = SERVERS[kind]().start()
    try:
        yield server.url
    finally:
        server.stop()


def measure(url: str, limit: int, args: argparse.Namespace) -> dict[str, Any]:
    rates, fairness = [], []
    for _ in range(args.runs):
        run = contention(
            (url, limit),
            args.seconds,
            procs=args.procs,
            hold=args.hold,
            opener=PermitContender,
            label=f"semaphore(limit={limit})",
            sleep_hold=True,
        )
        rates.append(run.acquisitions / run.seconds)
        fairness.append(run.fairness)
    return {
        "limit": limit,
        "acquisitions_per_s": statistics.median(rates),
        "runs": rates,
        "ideal_per_s": min(limit, args.procs) / args.hold,
        "fairness": statistics.median(fairness),
    }


def plot(results: dict[str, list[dict[str, Any]]], path: str, args: argparse.Namespace) -> None:
    import matplotlib  # type: ignore[import-not-found,unused-ignore]
    import matplotlib.ticker  # type: ignore[import-not-found,unused-ignore]

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # type: ignore[import-not-found,unused-ignore]

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    limits = sorted({p["limit"] for points in results.values() for p in points})
    ax.plot(limits, [min(n, args.procs) / args.hold for n in limits], "k--", label="ideal: min(limit, procs) / hold")
    for kind, points in results.items():
        ax.plot([p["limit"] for p in points], [p["acquisitions_per_s"] for p in points], marker="o", label=kind)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda y, _: f"{y:g}"))
    ax.set_xticks(limits, [str(n) for n in limits])
    ax.set_xlabel(f"semaphore limit ({args.procs} processes, {args.hold * 1e3:g} ms sleeping hold)")
    ax.set_ylabel("acquisitions / s (log)")
    ax.set_title("semaphore throughput against its limit")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="redis,etcd,file")
    parser.add_argument("--limits", default="1,2,4,8,16")
    parser.add_argument("--procs", type=int, default=16)
    parser.add_argument("--hold", type=float, default=0.01, help="seconds each permit is held (sleeping)")
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds of each contention run")
    parser.add_argument("--runs", type=int, default=3, help="runs per point; the median is shown")
    parser.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "semaphore_scaling.json"))
    parser.add_argument("--plot", default=str(ROOT / "docs" / "images" / "semaphore-scaling.png"))
    parser.add_argument("--no-plot", action="store_true")
    args = parser.parse_args()
    limits = [int(x) for x in args.limits.split(",")]
    results: dict[str, list[dict[str, Any]]] = {}
    print(
        f"## Semaphore throughput against its limit: {args.procs} processes, {args.hold * 1e3:g} ms sleeping "
        f"hold, {args.seconds:g} s per run, median of {args.runs} (load average at start {os.getloadavg()[0]:.1f})"
    )
    print(f"{'backend':10} {'limit':>5} {'acq/s':>8} {'ideal':>7} {'of ideal':>8} {'fairness':>8}")
    for kind in args.only.split(","):
        with backend(kind) as url:
            for limit in limits:
                point = measure(url, limit, args)
                results.setdefault(kind, []).append(point)
                print(
                    f"{kind:10} {limit:5d} {point['acquisitions_per_s']:8.0f} {point['ideal_per_s']:7.0f} "
                    f"{point['acquisitions_per_s'] / point['ideal_per_s']:8.2f} {point['fairness']:8.2f}",
                    flush=True,
                )
    if args.json != os.devnull:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=1) + "\n")
    if not args.no_plot:
        plot(results, args.plot, args)
        print(f"plot written to {args.plot}", file=sys.stderr)


if __name__ == "__main__":
    main()
