"""Compatibility: ``lockkit.drivers.file`` is now :mod:`lockkit.drivers.embedded.file`.

Kept because the package holding it is ``embedded`` (memory and file), and user code imports
``FileDriver`` from here.
"""

from .embedded.file import FileDriver, FileOptions

__all__ = ["FileDriver", "FileOptions"]
