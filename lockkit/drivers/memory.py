"""Compatibility: ``lockkit.drivers.memory`` is now :mod:`lockkit.drivers.embedded.memory`.

Kept because the package holding it is ``embedded`` (memory and file), and user code imports
``MemoryDriver`` from here.
"""

from .embedded.memory import MemoryDriver

__all__ = ["MemoryDriver"]
