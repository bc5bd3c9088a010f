"""A cheaper socket wait for kazoo's connection thread: one ``poll`` system call instead of an epoll set per wait.

kazoo's threading handler waits through ``selector_select`` (kazoo/handlers/utils.py), which builds an epoll
selector for every wait: ``epoll_create``, one ``epoll_ctl`` per socket, ``epoll_wait``, ``close``, and the
Python of the ``selectors`` module around them. The connection thread waits before every request it writes
(once for work, once for a writable socket) and before every reply it reads (once for work, then once per
``recv``: the length, then the body), so an acquire + release pays for some twenty of them, and they were most
of that thread's CPU (measured in docs/benchmarks.md, "ZooKeeper: the connection thread's waits").

:func:`poll_select` answers the same question with the same result lists from one ``poll`` call. ``poll`` has
no descriptor limit (kazoo left ``select.select`` for its 1024-descriptor ceiling; this keeps that), and a
socket that hung up or failed counts as readable and writable, as ``selectors`` reports it, so kazoo's next
``recv`` or ``send`` meets the error as before.
"""

from __future__ import annotations

import math
import select
from collections.abc import Sequence
from typing import Any

from kazoo.handlers.utils import fileobj_to_fd

_READ = getattr(select, "POLLIN", 1)
_WRITE = getattr(select, "POLLOUT", 4)
_BROKEN = getattr(select, "POLLERR", 8) | getattr(select, "POLLHUP", 16) | getattr(select, "POLLNVAL", 32)
"""A socket in one of these states is reported ready both ways (``selectors`` does the same): the next I/O call
on it raises, which is how kazoo learns of a dropped connection."""


def poll_select(
    rlist: Sequence[Any], wlist: Sequence[Any], xlist: Sequence[Any], timeout: float | None = None
) -> tuple[list[Any], list[Any], list[Any]]:
    """``select.select``'s contract as kazoo's ``selector_select`` keeps it, from one ``poll`` call.

    Returns the ready objects of ``rlist`` and of ``wlist`` (an object ready both ways is listed as readable
    only, as ``selector_select`` lists it) and an empty third list. Raises ``ValueError`` for a negative
    timeout and ``TypeError`` for a non-number or a closed socket (descriptor -1), as kazoo's does; an
    interrupted wait is resumed by Python itself (PEP 475).
    """
    if timeout is not None:
        if not isinstance(timeout, (int, float)):
            raise TypeError("timeout must be a number")
        if timeout < 0:
            raise ValueError("timeout must be non-negative")
    wanted: dict[int, int] = {}
    objects: dict[int, list[Any]] = {}
    for fileobjs, mask in ((rlist, _READ), (wlist, _WRITE)):
        for fileobj in fileobjs:
            fd = fileobj_to_fd(fileobj)  # kazoo's own: TypeError for a closed socket, as selector_select raises
            wanted[fd] = wanted.get(fd, 0) | mask
            objects.setdefault(fd, []).append(fileobj)
    poller = select.poll()
    for fd, mask in wanted.items():
        poller.register(fd, mask)
    # poll counts milliseconds: round up, or a wait shorter than 1 ms would return at once and spin
    ready = poller.poll(None if timeout is None else math.ceil(timeout * 1e3))
    readable: list[Any] = []
    writable: list[Any] = []
    for fd, events in ready:
        if events & (_READ | _BROKEN):
            readable.extend(objects[fd])
        elif events & _WRITE:
            writable.extend(objects[fd])
    return readable, writable, []


def use_poll(kz: Any) -> None:
    """Make ``kz``'s connection thread wait through :func:`poll_select` (its handler is its own: one per client).

    Where the platform has no ``poll`` (Windows), kazoo's own wait stays.
    """
    if hasattr(select, "poll"):
        kz.handler.select = poll_select
