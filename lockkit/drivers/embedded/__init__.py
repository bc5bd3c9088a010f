"""The drivers that need no server: ``memory://`` (:mod:`.memory`) and ``file://`` (:mod:`.file`)."""

from .file import FileDriver, FileOptions
from .memory import MemoryDriver

__all__ = ["FileDriver", "FileOptions", "MemoryDriver"]
