"""Compatibility: ``lockkit.drivers.redlock`` is now :mod:`lockkit.drivers.redis.redlock`.

Kept because the package ``lockkit.drivers.redis`` cannot also be named ``redlock``, and user code
imports ``RedlockDriver`` from here.
"""

from .redis.redlock import AsyncRedlockDriver, RedlockDriver

__all__ = ["AsyncRedlockDriver", "RedlockDriver"]
