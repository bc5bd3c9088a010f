"""This process's id, kept current across ``fork`` without a system call per read.

``os.getpid()`` is a system call on Linux (glibc stopped caching it in 2.25), and the hot path
asked for it about ten times per acquire + release (lease ownership, the token pool, the renewal
scheduler, the connection pool: all of them must notice a fork). ``pid`` is refreshed in the child
by an ``os.register_at_fork`` hook, which runs for ``os.fork()`` and for multiprocessing's fork.
"""

from __future__ import annotations

import os

__all__ = ["pid"]

pid = os.getpid()


def _forked() -> None:
    global pid
    pid = os.getpid()


os.register_at_fork(after_in_child=_forked)
