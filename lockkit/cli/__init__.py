"""The shell-facing side of lockkit: the ``lockkit`` command (:mod:`.commands`) and what only it runs.

``bench`` and ``contention`` (the benchmark harness), ``verify`` with ``fencing_store`` (the end-to-end
mutual-exclusion check), ``demo`` (the lost-update demo). The console script is ``lockkit.cli:main``;
``python -m lockkit.cli`` runs the same.
"""

from .commands import main

__all__ = ["main"]
