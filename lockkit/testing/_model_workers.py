"""A holder process for the model-based test (:mod:`lockkit.testing.model`): ``python -m`` this module.

The parent passes one JSON argument ``{"url", "name", "ttl", "auto_renew", "timeout", "face", "period"}``,
optionally with ``"mode"`` (``lock``, the default; ``permit`` of a semaphore of ``"limit"``; ``read`` or
``write``, a side of a reader-writer lock). The child connects, acquires ``name`` and reports on stdout, one
line per event, every time on the system-wide ``time.monotonic()`` clock that the parent shares (Linux
``CLOCK_MONOTONIC``)::

    ready <t>                                         connected, about to acquire
    acq <t_call> <t_ret> <fence> <ttl> <hint> <exp>   acquired (``t_call`` read just before the call)
    timeout <t>                                       not acquired in time; the child exits
    v <t> <1|0> <exp>                                 every ``period`` s: ``lease.valid`` (read at or after t)
    lost <t> <valid>                                  on_lost fired (``valid``: lease.valid inside the callback)
    rel <t> ok|notowned|error                         after a ``release`` command; the child exits
    error <repr>                                      anything unexpected; the child exits 3

Commands on stdin, one per line: ``release`` (release, report, exit) and ``exit`` (close the locker without
releasing, exit). The parent pauses (SIGSTOP/SIGCONT) and kills (SIGKILL) the child at will.
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import sys
import threading
import time
from typing import Any

import lockkit
from lockkit import LockNotOwned, LockTimeout
from lockkit.lease import token_hint

_out = threading.Lock()


def _say(*parts: object) -> None:
    line = " ".join(str(p) for p in parts) + "\n"
    with _out:
        os.write(1, line.encode())


def _on_lost(lease: lockkit.Lease) -> None:
    _say("lost", repr(time.monotonic()), int(lease.valid))


def _acquired(t_call: float, lease: lockkit.Lease) -> None:
    _say(
        "acq",
        repr(t_call),
        repr(time.monotonic()),
        lease.fence or 0,
        repr(lease.ttl),
        token_hint(lease.token),
        repr(lease.expires_at),
    )


def _report(lease: lockkit.Lease) -> None:
    now = time.monotonic()
    _say("v", repr(now), int(lease.valid), repr(lease.expires_at))


def _command(timeout: float) -> str | None:
    readable, _, _ = select.select([0], [], [], timeout)
    if not readable:
        return None
    line = sys.stdin.readline()
    return line.strip() or "exit"  # EOF: the parent went away


def _handle(locks: Any, cfg: dict[str, Any]) -> Any:
    """The handle the parent asked for, on either face's locker (the methods are the same)."""
    options = {"ttl": cfg["ttl"], "auto_renew": cfg["auto_renew"], "on_lost": _on_lost}
    mode = cfg.get("mode", "lock")
    if mode == "permit":
        return locks.semaphore(cfg["name"], int(cfg["limit"]), **options)
    if mode in ("read", "write"):
        rw = locks.rwlock(cfg["name"], **options)
        return rw.write() if mode == "write" else rw.read()
    return locks.lock(cfg["name"], **options)


def _run_sync(cfg: dict[str, Any]) -> None:
    with lockkit.connect(cfg["url"]) as locks:
        lock = _handle(locks, cfg)
        _say("ready", repr(time.monotonic()))
        t_call = time.monotonic()
        try:
            lease = lock.acquire(timeout=cfg["timeout"])
        except LockTimeout:
            _say("timeout", repr(time.monotonic()))
            return
        _acquired(t_call, lease)
        while True:
            _report(lease)
            command = _command(cfg["period"])
            if command == "release":
                try:
                    lock.release()
                except lockkit.LockError as exc:
                    _say_released(exc)
                else:
                    _say_released(None)
                return
            if command is not None:
                return


def _say_released(error: lockkit.LockError | None) -> None:
    """Report a release's outcome to the parent: ok, notowned (the server no longer held our token), or error."""
    outcome = "ok" if error is None else "notowned" if isinstance(error, LockNotOwned) else "error"
    _say("rel", repr(time.monotonic()), outcome)


async def _run_async(cfg: dict[str, Any]) -> None:
    async with lockkit.connect_async(cfg["url"]) as locks:
        lock = _handle(locks, cfg)
        _say("ready", repr(time.monotonic()))
        t_call = time.monotonic()
        try:
            lease = await lock.acquire(timeout=cfg["timeout"])
        except LockTimeout:
            _say("timeout", repr(time.monotonic()))
            return
        _acquired(t_call, lease)
        loop = asyncio.get_running_loop()
        commands: asyncio.Queue[str] = asyncio.Queue()

        def readable() -> None:
            commands.put_nowait(sys.stdin.readline().strip() or "exit")

        loop.add_reader(0, readable)
        try:
            while True:
                _report(lease)
                try:
                    command = await asyncio.wait_for(commands.get(), cfg["period"])
                except asyncio.TimeoutError:
                    continue
                if command == "release":
                    try:
                        await lock.release()
                    except lockkit.LockError as exc:
                        _say_released(exc)
                    else:
                        _say_released(None)
                return
        finally:
            loop.remove_reader(0)


def main(argv: list[str]) -> int:
    cfg: dict[str, Any] = json.loads(argv[1])
    try:
        if cfg["face"] == "async":
            asyncio.run(_run_async(cfg))
        else:
            _run_sync(cfg)
    except Exception as exc:  # reported to the parent, which fails the example with it
        _say("error", repr(exc).replace("\n", " "))
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
