"""``python -m backends up [redis|redlock|sentinel|cluster|zookeeper|etcd|postgres|all]...``, ``python -m backends
install``."""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType

from backends.servers import (
    EtcdServer,
    PostgresServer,
    RedisCluster,
    RedisServer,
    RedlockServers,
    SentinelSet,
    ServerError,
    ZooKeeperServer,
)

KINDS = ("redis", "redlock", "sentinel", "cluster", "zookeeper", "etcd", "postgres")
_Stoppable = (
    RedisServer | RedlockServers | SentinelSet | RedisCluster | ZooKeeperServer | EtcdServer | PostgresServer
)


def _make(kind: str) -> _Stoppable:
    factories: dict[str, Callable[[], _Stoppable]] = {
        "redis": RedisServer,
        "redlock": RedlockServers,
        "sentinel": SentinelSet,
        "zookeeper": ZooKeeperServer,
        "etcd": EtcdServer,
        "postgres": PostgresServer,
        "cluster": RedisCluster,
    }
    return factories[kind]()


def _alive(obj: _Stoppable) -> bool:
    if isinstance(obj, RedlockServers):
        return all(s.running for s in obj.servers)
    if isinstance(obj, (SentinelSet, RedisCluster)):
        return all(member.running for member in obj.members)
    return obj.running


def cmd_up(kinds: Sequence[str]) -> int:
    wanted: list[str] = []
    for kind in kinds or ["all"]:
        for k in KINDS if kind == "all" else [kind]:
            if k not in wanted:
                wanted.append(k)

    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    started: list[tuple[str, _Stoppable]] = []
    rc = 0
    try:
        for kind in wanted:
            if stop.is_set():
                break
            obj = _make(kind)
            obj.start()
            started.append((kind, obj))
            print(f"{kind} {obj.url}", flush=True)
        while not stop.wait(0.5):
            dead = [kind for kind, obj in started if not _alive(obj)]
            if dead:
                print(f"server exited unexpectedly: {', '.join(dead)}", file=sys.stderr, flush=True)
                rc = 1
                break
    except ServerError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        rc = 1
    finally:
        for _, obj in reversed(started):
            try:
                obj.stop()
            except Exception as exc:
                print(f"error stopping {obj!r}: {exc}", file=sys.stderr)
                rc = 1
    return rc


def cmd_install() -> int:
    script = Path(__file__).with_name("install.sh")
    return subprocess.call(["bash", str(script)])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m backends", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start servers on 127.0.0.1, print 'NAME URL' lines, run until Ctrl-C")
    kinds_help = f"one or more of {', '.join(KINDS)}, all (default)"
    up.add_argument("kinds", nargs="*", metavar="KIND", help=kinds_help)
    sub.add_parser("install", help="install the server packages (Debian; root)")
    args = parser.parse_args(argv)
    if args.command == "up":
        bad = [k for k in args.kinds if k not in (*KINDS, "all")]
        if bad:
            parser.error(f"unknown server kind(s): {', '.join(bad)}; choose from {', '.join(KINDS)}, all")
        return cmd_up(args.kinds)
    return cmd_install()


if __name__ == "__main__":
    sys.exit(main())
