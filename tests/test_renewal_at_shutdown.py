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
