"""Before ``verify`` or ``demo`` spawns worker processes: the backend is one processes share, and it answers.

Found here, a mistake is one line from the controller and the CLI's exit code (2 for configuration, 1 for an
unreachable backend); found in the workers, it was a traceback per worker and a run that tested nothing.
"""

from __future__ import annotations

import lockkit

from ..driver import Guarantees

PREFLIGHT_TIMEOUT = 10.0
"""Seconds to wait for the run's own fresh name: free at once unless the backend is in trouble."""


def check_shared_backend(url: str | None, name: str, ttl: float, command: str) -> tuple[Guarantees, str]:
    """The guarantees and shown URL of the backend ``name`` goes to, after one acquire and release of it.

    Raises :class:`lockkit.ConfigError` for a bad URL or TTL, a backend that locks only one process's threads
    (the workers are separate processes), or a refused login; :class:`lockkit.BackendUnavailable` when it
    cannot be reached. The acquisition is of the run's own fresh name, so it leaves nothing new behind; a
    driver that refuses this TTL (below its minimum, say) refuses it here.
    """
    with lockkit.connect(url) as locks:
        backend = locks.backend_for(name)
        guarantees, shown = backend.guarantees, backend.shown_url
        if guarantees.scope == "process":
            raise lockkit.ConfigError(
                f"{shown} locks only the threads of one process, and {command}'s workers are separate processes: "
                "the run could show nothing but that. Use a backend that processes share (file:// on one "
                "host, or a server)"
            )
        lock = locks.lock(name, ttl=ttl)  # validates the TTL (a ConfigError naming the range)
        lock.acquire(timeout=PREFLIGHT_TIMEOUT)
        lock.release()
    return guarantees, shown
