"""Renewal goes on while the interpreter shuts down: the main thread has returned, and a non-daemon thread
still holds a lock (a worker finishing its job). ``concurrent.futures`` executors refuse new work from that
moment (``RuntimeError: cannot schedule new futures after interpreter shutdown``), which killed the renewal
thread: the lease ran out at its ttl, unrenewed, and its ``on_lost`` came only at the release (C-13)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

HOLDER = """
import sys, threading, time
import lockkit

locks = lockkit.connect(sys.argv[1])
lost = []

def work():
    lock = locks.lock("shutdown-renewal", ttl=2, on_lost=lost.append)
    lease = lock.acquire()
    end = time.monotonic() + 4.5  # over two ttls: renewed several times after the main thread returned
    while time.monotonic() < end:
        if not lease.valid or lost:
            print("LOST", round(time.monotonic() - start, 2), flush=True)
            return
        time.sleep(0.05)
    print("HELD", flush=True)
    lock.release()

start = time.monotonic()
threading.Thread(target=work).start()  # non-daemon: the interpreter waits for it after the main thread returns
time.sleep(0.2)
"""


@pytest.mark.parametrize("kind", ["memory", "file"])
def test_c13_renewal_goes_on_after_the_main_thread_returned(kind: str, tmp_path: Path) -> None:
    url = "memory://shutdown" if kind == "memory" else (tmp_path / "locks").as_uri()
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    done = subprocess.run([sys.executable, str(script), url], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "Exception in thread" not in done.stderr, done.stderr
    assert done.stdout.strip() == "HELD", (done.stdout, done.stderr)


def test_c13_an_on_lost_that_exits_leaves_the_renewal_thread_running() -> None:
    """A user's on_lost runs on lockkit's renewal thread when a lease ends at its own deadline; a sys.exit() there
    ended that thread (it renews every lock of the process), and every other lock lapsed unrenewed."""
    import time

    import lockkit

    with lockkit.connect("memory://exit-in-on-lost") as locks:
        quitter = locks.lock("c13:quitter", ttl=0.3, auto_renew=False, on_lost=lambda lease: sys.exit(1))
        quitter.acquire()
        healthy = locks.lock("c13:healthy", ttl=1)
        lease = healthy.acquire()
        time.sleep(2.5)  # the quitter's deadline passes at 0.3 s; the healthy lock needs renewing from 0.33 s
        assert lease.valid, lease.lost_reason
        healthy.release()
