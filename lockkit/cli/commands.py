"""The ``lockkit`` command: run a command under a lock, inspect and administer locks.

Exit codes: the child's own code for ``run`` (128+N if a signal N ended it);
75 when the lock was not free within ``--timeout``; 70 when the lock was lost
while the command ran (the command got SIGTERM); 2 for bad usage or
configuration; 1 when a backend could not be reached.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

from .. import __version__
from ..config import Settings, load_file, resolve_settings
from ..driver import Guarantees
from ..errors import BackendUnavailable, ConfigError, LockError, LockTimeout
from ..lease import Lease, is_lockkit_hint
from ..lock import Lock
from ..locker import Locker
from ..names import validate_name

EXIT_LOST = 70
EXIT_TIMEOUT = 75
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 1
TERM_GRACE = 10.0

log = logging.getLogger("lockkit")


def _settings(args: argparse.Namespace) -> Settings:
    if getattr(args, "config", None):
        return load_file(args.config)
    return resolve_settings(getattr(args, "url", None))


def _locker(args: argparse.Namespace) -> Locker:
    return Locker(_settings(args), None)


class _Once(argparse.Action):
    """``--url`` / ``--config``: given twice with different values is a usage error (docs/cli.md), not "last wins".

    argparse's plain ``store`` keeps the last value, so ``--url A --url B`` would silently lock on B while the
    user read A in their own command line. The same value repeated is harmless and accepted.
    """

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: str | None = None
    ) -> None:
        earlier = getattr(namespace, self.dest, None)
        if earlier is not None and earlier != values:
            raise argparse.ArgumentError(self, "given twice with different values: give it once")
        setattr(namespace, self.dest, values)


def _add_target(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url", action=_Once, help="backend URL (default: LOCKKIT_URL, lockkit.toml, or the embedded file://)"
    )
    parser.add_argument(
        "--config", action=_Once, help="a lockkit.toml to use (default: LOCKKIT_CONFIG or ./lockkit.toml)"
    )
    parser.add_argument("--backend", help="use this configured backend instead of the name's route")


def _cmd_run(args: argparse.Namespace) -> int:
    command = list(args.command)
    if not command:
        print("lockkit run: give the command after --, e.g. lockkit run nightly -- ./job.sh", file=sys.stderr)
        return EXIT_USAGE
    lost = threading.Event()
    wake = threading.Event()  # set when the lock is lost or the command exits, whichever comes first
    child: list[subprocess.Popen[bytes]] = []

    def on_lost(lease: Lease) -> None:
        lost.set()
        wake.set()
        if child and child[0].poll() is None:
            child[0].send_signal(signal.SIGTERM)

    with _locker(args) as locks:
        try:
            lock = _run_handle(locks, args, on_lost)
        except ConfigError as exc:  # a backend without semaphores says why
            print(f"lockkit run: {exc}", file=sys.stderr)
            return EXIT_USAGE
        try:
            lease = lock.acquire(timeout=args.timeout)
        except LockTimeout as exc:
            print(f"lockkit run: {exc}", file=sys.stderr)
            return EXIT_TIMEOUT
        env = dict(os.environ, LOCKKIT_LOCK_NAME=args.name)
        env.pop("LOCKKIT_FENCING_TOKEN", None)  # never an inherited one: unset where the backend has no fencing
        if lease.fenced:
            env["LOCKKIT_FENCING_TOKEN"] = str(lease.fencing_token)
        try:
            proc = subprocess.Popen(command, env=env)
        except OSError as exc:
            lock.release()
            print(f"lockkit run: cannot start {command[0]!r}: {exc.strerror}", file=sys.stderr)
            return 127
        child.append(proc)
        if lost.is_set():
            proc.send_signal(signal.SIGTERM)
        forwarded = {
            sig: signal.signal(sig, lambda s, _f: proc.send_signal(s)) for sig in (signal.SIGINT, signal.SIGTERM)
        }
        # The command's exit is waited for on a thread so that a loss during the wait wakes this one: the
        # SIGKILL escalation must start TERM_GRACE after the loss, not only if the loss came before the wait.
        def wait_for_exit() -> None:
            proc.wait()
            wake.set()

        threading.Thread(target=wait_for_exit, name="lockkit-run-wait", daemon=True).start()
        try:
            wake.wait()
            if lost.is_set():
                try:
                    proc.wait(timeout=TERM_GRACE)
                except subprocess.TimeoutExpired:
                    proc.kill()  # it ignored SIGTERM after the lock was lost: another holder may run now
            code = proc.wait()
        finally:
            for sig, handler in forwarded.items():
                signal.signal(sig, handler)
        if lost.is_set():
            print(
                f"lockkit run: {lease.kind} {args.name!r} was lost while the command ran ({lease.lost_reason}); "
                "the command was sent SIGTERM",
                file=sys.stderr,
            )
            with contextlib.suppress(LockError):
                lock.release()
            return EXIT_LOST
        try:
            lock.release()
        except BackendUnavailable as exc:
            # The command ran under the lock (no loss was seen), but whether the release took is unknown: the
            # name stays taken until its TTL passes at the latest. Not 70: nothing says the lock was lost.
            print(
                f"lockkit run: the command exited with code {code} under the lock, but the release could not "
                f"reach the backend, so {args.name!r} may stay taken until its TTL ({args.ttl:g} s) passes: {exc}",
                file=sys.stderr,
            )
            return EXIT_UNAVAILABLE
        except LockError as exc:
            print(
                f"lockkit run: the command finished, but {args.name!r} was no longer ours at release (its end may "
                f"have run unlocked): {exc}",
                file=sys.stderr,
            )
            return EXIT_LOST
    return 128 - code if code < 0 else code


def _run_handle(locks: Locker, args: argparse.Namespace, on_lost: Callable[[Lease], None]) -> Lock:
    """The handle ``lockkit run`` holds: a lock, one permit of ``--semaphore N``, or a ``--read``/``--write`` side."""
    options: dict[str, Any] = {"backend": args.backend, "on_lost": on_lost, "max_hold": args.max_hold}
    if args.semaphore is not None:
        return locks.semaphore(args.name, limit=args.semaphore, ttl=args.ttl, **options)
    if args.read or args.write:
        rw = locks.rwlock(args.name, ttl=args.ttl, **options)
        return rw.write() if args.write else rw.read()
    return locks.lock(args.name, ttl=args.ttl, **options)


def _permit_status(locks: Locker, args: argparse.Namespace) -> int:
    """``lockkit status NAME --permits``: the holders and waiters of semaphore or rwlock NAME."""
    backend = locks.settings.route(args.name, args.backend)
    try:
        info = locks.permit_holders(args.name, backend=args.backend)
    except ConfigError as exc:
        print(f"lockkit status: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        print(json.dumps({"name": args.name, "backend": backend, "kind": "permits", **info.__dict__}))
        return 0
    if info.limit is None:
        print(f"{args.name}: no permits held or waited for on backend {backend!r}")
        return 0
    kind = "reader-writer lock" if info.limit == 0 else f"semaphore of limit {info.limit}"
    if info.writer:
        held = "held by a writer"
    else:
        held = f"{info.holders} holder(s)" + (" (readers)" if info.limit == 0 and info.holders else "")
    parts = [f"{kind} on backend {backend!r}", held]
    if info.waiting_writers:
        parts.append(f"{info.waiting_writers} writer(s) waiting")
    if info.waiters:
        parts.append(f"{info.waiters} waiting in all")
    if info.fencing_token is not None:
        parts.append(f"last fencing token {info.fencing_token}")
    print(f"{args.name}: " + ", ".join(parts))
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    with _locker(args) as locks:
        if args.permits:
            return _permit_status(locks, args)
        info = locks.holder(args.name, backend=args.backend)
        backend = locks.settings.route(args.name, args.backend)
        if args.json:
            print(json.dumps({"name": args.name, "backend": backend, **info.__dict__}))
            return 0
        if not info.held:
            print(f"{args.name}: free on backend {backend!r}" + (f" ({info.waiters} waiting)" if info.waiters else ""))
            return 0
        parts = [f"held on backend {backend!r}"]
        hint = info.token_hint
        parts.append(f"holder token {hint}…" if is_lockkit_hint(hint) else "holder not a lockkit client")
        if info.fencing_token is not None:
            parts.append(f"fencing token {info.fencing_token}")
        if info.ttl_left is not None:
            parts.append(f"{info.ttl_left:.1f}s left")
        elif locks.guarantees()[backend].lifetime == "session":
            parts.append("no TTL: held until its holder releases it or its session ends")
        else:
            parts.append("no expiry set")
        if info.waiters:
            parts.append(f"{info.waiters} waiting")
        print(f"{args.name}: " + ", ".join(parts))
    return 0


def _cmd_release(args: argparse.Namespace) -> int:
    if not args.force:
        print("lockkit release: releasing another holder's lock is an administrative act; add --force", file=sys.stderr)
        return EXIT_USAGE
    with _locker(args) as locks:
        if args.permits:
            count = locks.force_release_permits(args.name, backend=args.backend)
            print(f"{args.name}: {count} permit(s) released (their holders will find them lost at their next renewal)")
            return 0
        held = locks.force_release(args.name, backend=args.backend)
        print(
            f"{args.name}: {'released (its holder will find it lost at its next renewal)' if held else 'was not held'}"
        )
    return 0


def _cmd_routes(args: argparse.Namespace) -> int:
    from ..registry import declared_guarantees
    from ..routes import check_requirements

    settings = _settings(args)
    guarantees = declared_guarantees(settings)
    # As every other subcommand does when it opens the locker (docs/cli.md): a requirement the backend lacks is a
    # configuration error here too, not a table that looks fine.
    check_requirements(settings.routes, guarantees, f"{settings.source}: [routes]")
    if args.json:
        print(json.dumps(_routes_json(settings, guarantees, args.names)))
        return 0
    if args.names:
        for name in args.names:
            route = settings.route_for(validate_name(name))
            backend = settings.default if route is None else route.backend
            why = "the default backend: no route matches" if route is None else f"route {route.pattern!r}"
            print(f"{name} -> {backend}  ({why}; {_offered(guarantees[backend])})")
        return 0
    print(f"routes of {settings.source} (first match wins):")
    for route in settings.routes:
        need = f"  requires {', '.join(route.require)}" if route.require else ""
        print(f"  {route.pattern:<24} -> {route.backend}{need}")
    print(f"  {'(anything else)':<24} -> {settings.default}")
    print("backends:")
    for name, offered in guarantees.items():
        print(f"  {name:<12} {_offered(offered)}")
    return 0


def _offered(g: Guarantees) -> str:
    wakeup = "server wake-up" if g.server_wakeup else "polling"
    return (
        f"scope {g.scope}, fencing {g.fencing}, {'FIFO' if g.fifo else 'not FIFO'}, "
        f"{'survives failover' if g.survives_failover else 'no failover'}, lifetime {g.lifetime}, {wakeup}"
    )


def _routes_json(settings: Settings, guarantees: dict[str, Guarantees], names: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "source": settings.source,
        "default": settings.default,
        "routes": [dataclasses.asdict(route) for route in settings.routes],
        "backends": {name: dataclasses.asdict(g) for name, g in guarantees.items()},
    }
    if names:
        found = {name: settings.route_for(validate_name(name)) for name in names}
        out["names"] = {
            name: {"backend": settings.default if r is None else r.backend, "route": None if r is None else r.pattern}
            for name, r in found.items()
        }
    return out


def _cmd_check(args: argparse.Namespace) -> int:
    with _locker(args) as locks:
        shown = locks.describe()
        failed: list[LockError] = []
        for name, result in locks.check().items():
            if isinstance(result, float):
                print(f"ok    {name:<12} {shown[name]}  round trip {result * 1000:.2f} ms")
            else:
                failed.append(result)
                print(f"FAIL  {name:<12} {shown[name]}  {result}")
    if any(isinstance(error, ConfigError) for error in failed):
        return EXIT_USAGE  # a refused login or the like: the configuration is what to fix
    return EXIT_UNAVAILABLE if failed else 0


def _cmd_migrate(args: argparse.Namespace) -> int:
    from ..drivers.migrate import next_step

    with _locker(args) as locks:
        migrations = locks.migrations()
        if not migrations:
            print("lockkit migrate: no backend in this configuration uses 'migrate'", file=sys.stderr)
            return EXIT_USAGE
        unsafe = False
        for name, driver in migrations.items():
            print(f"{name}: migration {driver.options.group!r}, this configuration's phase: {driver.phase}")
            if args.action == "check":
                for role, component in (("old", driver.old), ("new", driver.new)):
                    try:
                        component.ping()
                        print(f"  ok    {role} backend reachable")
                    except LockError as exc:
                        unsafe = True
                        print(f"  FAIL  {role} backend: {exc}")
                continue
            fleet = driver.fleet()
            for phase in ("old", "both", "new"):
                members = sorted(f"{r.get('host')}:{r.get('pid')}" for r in fleet.values() if r.get("phase") == phase)
                print(f"  {phase:<5} {len(members):>3} live" + (f": {', '.join(members)}" if members else ""))
            switched = driver.epoch_switched()
            print(f"  fencing epoch: {'1 (new backend)' if switched else '0 (old backend)'}")
            migrate = locks.settings.backends[name].migrate or {}
            safe, advice = next_step(fleet, switched, migrate.get("to", "NEW"))
            unsafe |= not safe
            print(f"  next: {advice}")
    return EXIT_UNAVAILABLE if unsafe else 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from .verify import run

    faults = [f for f in (args.faults or "").split(",") if f]

    def header() -> None:
        shown = ", ".join(faults) or "none"
        print(f"lockkit verify: {args.processes} processes, {args.duration:g} s, faults: {shown}", file=sys.stderr)

    report = run(args.url, args.processes, args.duration, faults, ttl=args.ttl, on_start=header)
    print(report.as_json() if args.json else report.table())
    return report.exit_code


def _cmd_bench(args: argparse.Namespace) -> int:
    from ..config import load_file
    from . import bench

    if args.url:
        config: dict[str, Any] = {"backends": {"default": {"url": args.url}}}
    else:
        settings = resolve_settings() if not args.config else load_file(args.config)
        config = {
            "backends": {n: {"url": s.url, **s.options} for n, s in settings.backends.items() if not s.migrate},
            "default": next(n for n, s in settings.backends.items() if not s.migrate),
        }
    if args.plot:
        bench.check_plot_path(args.plot)
    if args.growth:
        return bench.growth_command(config, args)
    results = bench.run(
        config,
        rounds=args.rounds,
        processes=args.processes,
        seconds=args.seconds,
        renew_locks=args.renew_locks,
        renew_seconds=args.renew_seconds,
    )
    print(bench.to_json(results) if args.json else bench.table(results))
    if args.plot:
        bench.plot(results, args.plot)
        print(f"plot written to {args.plot}", file=sys.stderr)
    # A fencing token out of order, a lock lost while renewed, or a failed contention run is a finding, not a number
    broken = any(r.tokens_in_order is False or not r.renewal_all_held or r.contention_error for r in results)
    return 1 if broken else 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import main as demo_main

    return demo_main(args.url, args.workers, args.deductions)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lockkit", description="Distributed locks from the shell.")
    parser.add_argument("--version", action="version", version=f"lockkit {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log lockkit's debug messages to stderr")
    # Also accepted before the subcommand (lockkit --config f status x); main() hands them on.
    parser.add_argument("--url", action=_Once, dest="top_url", metavar="URL", help="backend URL, for every subcommand")
    parser.add_argument(
        "--config", action=_Once, dest="top_config", metavar="FILE", help="a lockkit.toml, for every subcommand"
    )
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    run = sub.add_parser(
        "run",
        help="hold a lock while a command runs",
        usage="lockkit run NAME [options] -- COMMAND [ARG ...]",
        description="Hold NAME while the command runs, renewing it; the child gets "
        "LOCKKIT_FENCING_TOKEN. If the lock is lost the child gets SIGTERM and lockkit exits 70.",
    )
    run.add_argument("name")
    _add_target(run)
    run.add_argument("--ttl", type=float, default=30.0, help="lease TTL in seconds, renewed every ttl/3 (default 30)")
    run.add_argument("--timeout", type=float, default=None, help="give up after this many seconds (exit 75)")
    run.add_argument("--max-hold", type=float, default=None, help="stop renewing after this many seconds")
    kind = run.add_mutually_exclusive_group()
    kind.add_argument(
        "--semaphore", type=_positive_int, metavar="N", help="hold one of N permits of semaphore NAME instead of a lock"
    )
    kind.add_argument("--read", action="store_true", help="hold the read side of reader-writer lock NAME")
    kind.add_argument("--write", action="store_true", help="hold the write side of reader-writer lock NAME")
    run.set_defaults(func=_cmd_run)

    status = sub.add_parser("status", help="show who holds a lock")
    status.add_argument("name")
    _add_target(status)
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.add_argument("--permits", action="store_true", help="show semaphore or reader-writer lock NAME instead")
    status.set_defaults(func=_cmd_status)

    release = sub.add_parser("release", help="administratively release a lock held by anyone")
    release.add_argument("name")
    release.add_argument("--force", action="store_true", help="required: you are taking someone's lock away")
    release.add_argument("--permits", action="store_true", help="release every permit of semaphore or rwlock NAME")
    _add_target(release)
    release.set_defaults(func=_cmd_release)

    routes = sub.add_parser(
        "routes",
        help="show which backend each lock name goes to, and what each backend guarantees",
        description="Without NAME: the routes in order (first match wins), the default, and each backend's "
        "guarantees. With names: the backend each name goes to and why. Nothing is connected.",
    )
    routes.add_argument("names", nargs="*", metavar="NAME")
    routes.add_argument(
        "--url", action=_Once, help="show the routes of this URL (one backend) instead of the configuration"
    )
    routes.add_argument("--config", action=_Once, help="a lockkit.toml to use")
    routes.add_argument("--json", action="store_true", help="machine-readable output")
    routes.set_defaults(func=_cmd_routes)

    check = sub.add_parser("check", help="reach every configured backend and print the round-trip time")
    check.add_argument("--url", action=_Once, help="check this URL instead of the configuration")
    check.add_argument("--config", action=_Once, help="a lockkit.toml to use")
    check.set_defaults(func=_cmd_check)

    migrate = sub.add_parser("migrate", help="watch a backend migration: live clients per phase, next safe step")
    migrate.add_argument("action", choices=["status", "check"], help="status: the fleet; check: reach both backends")
    migrate.add_argument("--config", action=_Once, help="a lockkit.toml to use")
    migrate.add_argument("--url", action=_Once, help=argparse.SUPPRESS)
    migrate.set_defaults(func=_cmd_migrate)

    verify = sub.add_parser(
        "verify",
        help="self-test a deployment: contention, fencing, faults",
        description="N processes contend on one name and write through a fencing-checked "
        "store; optionally holders are SIGKILLed or SIGSTOPped at random. Every figure is recomputed "
        "from the holders' log and the store's history of attempts. Exits 1 on any overlap, lost "
        "update, fencing token backwards or shared, and on a run that could not test (a worker died, "
        "nothing was acquired) or a backend that cannot be reached; 2 for a bad URL or --ttl, memory:// "
        "(one process only) or --faults with --duration <= 2 x --ttl (no fault could be injected).",
    )
    verify.add_argument("--url", action=_Once, help="backend to verify (default: the configured default backend)")
    verify.add_argument("--processes", type=_positive_int, default=4, help="worker processes (default 4)")
    verify.add_argument("--duration", type=float, default=10.0, help="seconds to run (default 10)")
    verify.add_argument("--faults", default="", help="comma-separated: kill, pause (needs --duration > 2 x --ttl)")
    verify.add_argument("--ttl", type=float, default=2.0, help="lease TTL of the workers (default 2)")
    verify.add_argument("--json", action="store_true", help="machine-readable output")
    verify.set_defaults(func=_cmd_verify)

    from .bench import positive_seconds_arg

    bench = sub.add_parser("bench", help="measure latency, contention and renewal cost per backend")
    bench.add_argument("--url", action=_Once, help="benchmark this URL (default: every configured backend)")
    bench.add_argument("--config", action=_Once, help="a lockkit.toml to use")
    bench.add_argument("--rounds", type=_positive_int, default=500, help="uncontended acquire+release pairs")
    bench.add_argument("--processes", type=_positive_int, default=4, help="contending processes (default 4)")
    bench.add_argument("--seconds", type=positive_seconds_arg, default=5.0, help="contention run length (default 5)")
    bench.add_argument("--renew-locks", type=_positive_int, default=1000, help="locks held for the renewal run")
    bench.add_argument("--renew-seconds", type=positive_seconds_arg, default=5.0, help="renewal run length (default 5)")
    bench.add_argument("--json", action="store_true", help="machine-readable output")
    bench.add_argument("--plot", metavar="FILE.png", help="draw latency and handoffs (needs lockkit[plot])")
    from .bench import add_growth_arguments

    add_growth_arguments(bench)
    bench.set_defaults(func=_cmd_bench)

    demo = sub.add_parser("demo", help="show lost updates without a lock, and none with lockkit")
    demo.add_argument("--url", action=_Once, help="backend to demo on (default: the embedded file:// backend)")
    demo.add_argument("--workers", type=_positive_int, default=8, help="worker processes (default 8)")
    demo.add_argument("--deductions", type=_positive_int, default=2000, help="items sold in all (default 2000)")
    demo.set_defaults(func=_cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    # Everything after the first "--" is the command for `run`, untouched by option parsing.
    command: list[str] = []
    if "--" in words:
        cut = words.index("--")
        words, command = words[:cut], words[cut + 1 :]
    parser = build_parser()
    args = parser.parse_args(words)
    args.command = command
    for option in ("url", "config"):
        given = getattr(args, "top_" + option)
        if given is None:
            continue
        if not hasattr(args, option):
            parser.error(f"lockkit {args.cmd} takes no --{option}")
        if getattr(args, option) not in (None, given):
            parser.error(f"--{option} given twice, before and after {args.cmd!r}, with different values")
        setattr(args, option, given)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, format="%(message)s")
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:  # Ctrl-C: the shell's convention, without a traceback
        print(f"lockkit {args.cmd}: interrupted", file=sys.stderr)
        return 130
    except (ConfigError, ValueError) as exc:
        print(f"lockkit {args.cmd}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BackendUnavailable as exc:
        print(f"lockkit {args.cmd}: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except LockError as exc:
        print(f"lockkit {args.cmd}: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    return code


if __name__ == "__main__":
    sys.exit(main())
